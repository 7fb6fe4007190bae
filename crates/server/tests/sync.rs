//! End-to-end syncs over real TCP between real SQLite client files and a server on a
//! real SQLite consolidated file.

mod support;

use rowsync_client::transport;
use rowsync_client::{BusyRetry, ClientError, CompletedSync, SessionEvent};
use rowsync_protocol::{
    encode_frame, Conflicts, ErrorCode, Hello, Message, RowUpdate, TableUpload, Value,
    FRAME_BYTES_MAX_DEFAULT,
};
use rowsync_server::ServerConfig;
use support::*;

fn row(id: &str, rep: &str, item: &str, quantity: i64) -> Vec<Value> {
    vec![id.into(), rep.into(), item.into(), Value::Int(quantity)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_sync_downloads_exactly_the_users_partition() {
    let server = TestServer::start().await;
    let mut alice = server.client("alice-1");
    let report = alice.sync(&server.options("alice")).await.unwrap();
    assert_eq!(report.rows_downloaded, 2);
    assert_eq!(
        client_orders(&alice),
        server.consolidated_orders(Some("alice"))
    );
    assert!(client_orders(&alice)
        .iter()
        .all(|row| row[1] == Value::from("alice")));
    // Nothing changed: the next sync moves nothing.
    let again = alice.sync(&server.options("alice")).await.unwrap();
    assert_eq!((again.rows_uploaded, again.rows_downloaded), (0, 0));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserts_updates_and_deletes_flow_both_ways() {
    let server = TestServer::start().await;
    let options = server.options("alice");
    let mut phone = server.client("alice-phone");
    let mut laptop = server.client("alice-laptop");
    phone.sync(&options).await.unwrap();
    laptop.sync(&options).await.unwrap();

    // Client to server.
    let db = phone.connection();
    db.execute(
        "INSERT INTO orders VALUES ('alice-new', 'alice', 'lamp', 3)",
        [],
    )
    .unwrap();
    db.execute(
        "UPDATE orders SET quantity = 42 WHERE id = 'alice-seed-0'",
        [],
    )
    .unwrap();
    db.execute("DELETE FROM orders WHERE id = 'alice-seed-1'", [])
        .unwrap();
    let report = phone.sync(&options).await.unwrap();
    assert_eq!((report.rows_uploaded, report.conflicts), (3, 0));
    assert_eq!(
        report.rows_downloaded, 0,
        "the client's own changes are not echoed back"
    );
    let expected = vec![
        row("alice-new", "alice", "lamp", 3),
        row("alice-seed-0", "alice", "seed", 42),
    ];
    assert_eq!(server.consolidated_orders(Some("alice")), expected);

    // Server to client (another device of the same user, and changes made on the server).
    let office = server.consolidated();
    office
        .execute(
            "INSERT INTO orders VALUES ('office-1', 'alice', 'desk', 1)",
            [],
        )
        .unwrap();
    office
        .execute(
            "UPDATE orders SET item = 'lamp (blue)' WHERE id = 'alice-new'",
            [],
        )
        .unwrap();
    let report = laptop.sync(&options).await.unwrap();
    assert_eq!(report.rows_downloaded, 4, "3 upserts and 1 delete");
    assert_eq!(
        client_orders(&laptop),
        server.consolidated_orders(Some("alice"))
    );
    office
        .execute("DELETE FROM orders WHERE id = 'office-1'", [])
        .unwrap();
    phone.sync(&options).await.unwrap();
    laptop.sync(&options).await.unwrap();
    for device in [&phone, &laptop] {
        assert_eq!(
            client_orders(device),
            server.consolidated_orders(Some("alice"))
        );
        assert!(
            !device.has_pending_changes().unwrap(),
            "downloads are not recorded as local changes"
        );
    }
    server.stop().await;
}

/// One raw sync of `client_id` speaking `protocol_version`: an update of alice's first
/// row from an image the server never had.
async fn stale_update(
    server: &TestServer,
    client_id: &str,
    protocol_version: u16,
) -> CompletedSync {
    let current = server.consolidated_orders(Some("alice"))[0].clone();
    let mut stale = current.clone();
    stale[3] = Value::Int(-1);
    let mut changed = current.clone();
    changed[3] = Value::Int(7);
    let upload = encode_frame(&Message::Upload(TableUpload {
        table: "orders".into(),
        columns: ["id", "rep", "item", "quantity"].map(String::from).to_vec(),
        key_columns: vec!["id".into()],
        updates: vec![RowUpdate {
            old: stale,
            new: changed,
        }],
        ..TableUpload::default()
    }));
    let options = server.options("alice");
    let event = transport::exchange(transport::Exchange {
        address: &options.address,
        transport: &options.transport,
        hello: Hello {
            protocol_version,
            client_id: client_id.into(),
            user: "alice".into(),
            password: password("alice"),
            script_version: "v1".into(),
            last_download_watermark: 0,
            token: String::new(),
            auth_parameters: Vec::new(),
            download_ack: false,
            tables: Default::default(),
        },
        upload_frames: &[upload],
        upload_sequence: 1,
        frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
        timeout: std::time::Duration::from_secs(30),
        acknowledge: None,
        transfer: None,
        download_resume: None,
        key_ranges: &[],
    })
    .await
    .unwrap();
    let SessionEvent::Complete(completed) = event else {
        panic!("expected a completed sync, got {event:?}");
    };
    completed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_keys_are_named_to_version_2_clients_only() {
    let server = TestServer::start().await;
    let key = server.consolidated_orders(Some("alice"))[0][0].clone();
    let old = stale_update(&server, "speaks-1", 1).await;
    assert_eq!(old.end.summary.conflicts, 1);
    assert!(old.conflicts.is_empty(), "a version 1 client: {old:?}");
    let new = stale_update(&server, "speaks-2", 2).await;
    assert_eq!(new.end.summary.conflicts, 1);
    assert_eq!(
        new.conflicts,
        vec![Conflicts {
            table: "orders".into(),
            key_columns: vec!["id".into()],
            keys: vec![vec![key.clone()]],
        }]
    );
    let answered: Vec<&Vec<Value>> = new
        .downloads
        .iter()
        .flat_map(|download| &download.upserts)
        .filter(|row| row[0] == key)
        .collect();
    assert_eq!(
        answered,
        vec![&server.consolidated_orders(Some("alice"))[0]],
        "the server's row follows"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_update_is_resolved_server_wins() {
    let server = TestServer::start().await;
    let options = server.options("alice");
    let mut alice = server.client("alice-1");
    alice.sync(&options).await.unwrap();
    server
        .consolidated()
        .execute(
            "UPDATE orders SET quantity = 500 WHERE id = 'alice-seed-0'",
            [],
        )
        .unwrap();
    alice
        .connection()
        .execute(
            "UPDATE orders SET quantity = 7, item = 'mine' WHERE id = 'alice-seed-0'",
            [],
        )
        .unwrap();
    let report = alice.sync(&options).await.unwrap();
    assert_eq!(report.conflicts, 1);
    let server_row = row("alice-seed-0", "alice", "seed", 500);
    assert_eq!(
        server.consolidated_orders(Some("alice"))[0],
        server_row,
        "the client's change was not applied"
    );
    assert_eq!(
        client_orders(&alice)[0],
        server_row,
        "the client received the server's row"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_read_or_write_another_partition() {
    let server = TestServer::start().await;
    let options = server.options("alice");
    let mut alice = server.client("alice-1");
    alice.sync(&options).await.unwrap();
    let bob_before = server.consolidated_orders(Some("bob"));
    let db = rusqlite::Connection::open(server.dir.path().join("alice-1.db")).unwrap();
    // A row claiming bob's partition, a row reusing bob's key, and (after planting bob's
    // row locally without tracking) an update and a delete of bob's rows.
    db.execute(
        "INSERT INTO orders VALUES ('alice-forged', 'bob', 'forged', 1)",
        [],
    )
    .unwrap();
    db.execute(
        "INSERT INTO orders VALUES ('bob-seed-0', 'alice', 'stolen key', 1)",
        [],
    )
    .unwrap();
    db.execute(
        "UPDATE orders SET quantity = 99 WHERE id = 'bob-seed-0'",
        [],
    )
    .unwrap();
    db.execute(
        "UPDATE orders SET rep = 'bob' WHERE id = 'alice-seed-0'",
        [],
    )
    .unwrap();
    let report = alice.sync(&options).await.unwrap();
    assert_eq!(
        report.conflicts, 3,
        "forged insert, stolen key, partition move"
    );
    assert_eq!(
        server.consolidated_orders(Some("bob")),
        bob_before,
        "bob's rows are untouched"
    );
    assert_eq!(
        server.consolidated_orders(Some("alice")),
        vec![
            row("alice-seed-0", "alice", "seed", 0),
            row("alice-seed-1", "alice", "seed", 1)
        ]
    );
    assert_eq!(
        client_orders(&alice),
        server.consolidated_orders(Some("alice")),
        "foreign rows were removed"
    );

    // A delete of bob's key: bob's row stays.
    db.execute(
        "INSERT INTO orders VALUES ('bob-seed-1', 'alice', 'x', 1)",
        [],
    )
    .unwrap();
    alice.sync(&options).await.unwrap();
    db.execute("DELETE FROM orders WHERE id = 'bob-seed-1'", [])
        .unwrap();
    alice.sync(&options).await.unwrap();
    assert_eq!(server.consolidated_orders(Some("bob")), bob_before);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_after_commit_then_retry_applies_nothing_twice() {
    let server = TestServer::start().await;
    // Count every row change the consolidated database sees.
    server
        .consolidated()
        .execute_batch(
            "CREATE TABLE audit (n INTEGER NOT NULL);
             CREATE TRIGGER audit_insert AFTER INSERT ON orders BEGIN INSERT INTO audit VALUES (1); END;
             CREATE TRIGGER audit_update AFTER UPDATE ON orders BEGIN INSERT INTO audit VALUES (1); END;",
        )
        .unwrap();
    let proxy = Proxy::start(server.address, Disturbance::CutReply, 1).await;
    let options = server.options_via(proxy.address, "alice");
    let mut alice = server.client("alice-1");
    alice
        .connection()
        .execute("INSERT INTO orders VALUES ('a-1', 'alice', 'x', 1)", [])
        .unwrap();
    alice
        .connection()
        .execute("INSERT INTO orders VALUES ('a-2', 'alice', 'y', 2)", [])
        .unwrap();
    let error = alice.sync(&options).await.unwrap_err();
    assert!(
        matches!(error, ClientError::Protocol(_) | ClientError::Io(_)),
        "{error}"
    );
    assert_eq!(
        server.consolidated_orders(Some("alice")).len(),
        4,
        "the first attempt committed"
    );

    // Changes made before the retry go up after the retried upload, in a second round.
    alice
        .connection()
        .execute("UPDATE orders SET quantity = 3 WHERE id = 'a-1'", [])
        .unwrap();
    let report = alice.sync(&options).await.unwrap();
    // The first round continues the download the server held for the cut reply
    // (protocol v4; the client had none of it), so the upload is not sent again; had
    // nothing been held, it would go again and be answered as applied already. Either
    // way it lands once, as the audit shows.
    assert_eq!(report.rounds, 2);
    assert_eq!(report.conflicts, 0, "a double application would conflict");
    let audit: i64 = server
        .consolidated()
        .query_row("SELECT count(*) FROM audit", [], |r| r.get(0))
        .unwrap();
    assert_eq!(audit, 3, "two inserts once, one update once");
    assert_eq!(
        client_orders(&alice),
        server.consolidated_orders(Some("alice"))
    );
    assert_eq!(
        server.consolidated_orders(Some("alice"))[0],
        row("a-1", "alice", "x", 3)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_made_while_a_sync_is_in_flight_go_up_next_time() {
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.address, Disturbance::HoldReply, 1).await;
    let options = server.options_via(proxy.address, "alice");
    let mut alice = server.client("alice-1");
    let path = server.dir.path().join("alice-1.db");
    alice
        .connection()
        .execute("INSERT INTO orders VALUES ('a-1', 'alice', 'x', 1)", [])
        .unwrap();
    let reply_seen = std::sync::Arc::clone(&proxy.reply_seen);
    let sync = tokio::spawn(async move {
        let report = alice.sync(&options).await;
        (alice, report)
    });
    reply_seen.notified().await; // the server committed; its reply is held
    let other = rusqlite::Connection::open(&path).unwrap();
    other
        .execute("UPDATE orders SET quantity = 2 WHERE id = 'a-1'", [])
        .unwrap();
    other
        .execute("INSERT INTO orders VALUES ('a-2', 'alice', 'late', 5)", [])
        .unwrap();
    proxy.release();
    let (mut alice, report) = sync.await.unwrap();
    assert_eq!(report.unwrap().rows_uploaded, 1);
    assert!(alice.has_pending_changes().unwrap());
    assert_eq!(
        client_orders(&alice)[0],
        row("a-1", "alice", "x", 2),
        "the download did not overwrite the local change"
    );
    let report = alice
        .sync(&server.options_via(proxy.address, "alice"))
        .await
        .unwrap();
    assert_eq!((report.rows_uploaded, report.conflicts), (2, 0));
    assert_eq!(
        client_orders(&alice),
        server.consolidated_orders(Some("alice"))
    );
    assert_eq!(server.consolidated_orders(Some("alice")).len(), 4);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_and_unknown_user_get_the_same_refusal() {
    let server = TestServer::start().await;
    let before = server.snapshot();
    let mut client = server.client("c");
    client
        .connection()
        .execute("INSERT INTO orders VALUES ('x', 'alice', 'x', 1)", [])
        .unwrap();
    let mut wrong = server.options("alice");
    wrong.password = "guess".into();
    let mut unknown = server.options("mallory");
    unknown.password = "guess".into();
    let mut refusals = Vec::new();
    for options in [wrong, unknown] {
        match client.sync(&options).await {
            Err(ClientError::Server(error)) => refusals.push(error),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    assert_eq!(refusals[0], refusals[1]);
    assert_eq!(
        refusals[0].error_code(),
        Some(ErrorCode::AuthenticationFailed)
    );
    assert_eq!(server.snapshot(), before, "nothing changed");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_script_version_is_refused_by_name() {
    let server = TestServer::start().await;
    let mut client = server.client("c");
    let mut options = server.options("alice");
    options.script_version = "v9".into();
    let Err(ClientError::Server(error)) = client.sync(&options).await else {
        panic!("expected a refusal")
    };
    assert_eq!(error.error_code(), Some(ErrorCode::UnknownScriptVersion));
    assert!(error.message.contains("\"v9\""), "{}", error.message);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_the_connection_limit_clients_get_busy_then_succeed() {
    let config = ServerConfig {
        connections_max: 1,
        busy_retry_after_ms: 25,
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(config).await;
    // A silent connection holds the only slot.
    let squatter = tokio::net::TcpStream::connect(server.address)
        .await
        .unwrap();
    let mut client = server.client("c");
    let mut options = server.options("alice");
    options.busy_retry = BusyRetry::Never;
    let error = client.sync(&options).await.unwrap_err();
    let ClientError::Busy { retry_after_ms } = error else {
        panic!("expected busy, got {error}")
    };
    assert_eq!(retry_after_ms, 25);
    // By default the client retries after the hint (plus jitter) until a slot is free.
    options.busy_retry = BusyRetry::default();
    let release = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        drop(squatter);
    });
    let report = client.sync(&options).await.unwrap();
    release.await.unwrap();
    assert_eq!(report.rows_downloaded, 2);
    assert!(report.busy_retries >= 1, "{report:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_far_larger_than_the_spool_memory_spills_and_arrives_whole() {
    let config = ServerConfig {
        download_spool_memory_bytes_max: 4 * 1024,
        download_message_bytes_max: 2 * 1024,
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(config).await;
    let office = server.consolidated();
    office
        .execute_batch(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000)
             INSERT INTO orders SELECT 'bulk-' || i, 'alice', 'an item of ordinary length ' || i, i FROM n",
        )
        .unwrap();
    let mut alice = server.client("alice-1");
    let report = alice.sync(&server.options("alice")).await.unwrap();
    assert_eq!(report.rows_downloaded, 5002);
    assert_eq!(
        client_orders(&alice),
        server.consolidated_orders(Some("alice"))
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_above_its_limit_is_refused_and_the_upload_rolled_back() {
    let config = ServerConfig {
        download_bytes_max: 40,
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(config).await;
    let before = server.snapshot();
    let mut alice = server.client("alice-1");
    alice
        .connection()
        .execute("INSERT INTO orders VALUES ('a-1', 'alice', 'x', 1)", [])
        .unwrap();
    let Err(ClientError::Server(error)) = alice.sync(&server.options("alice")).await else {
        panic!("expected a refusal")
    };
    assert!(
        error.message.contains("exceeds the limit of 40 bytes"),
        "{}",
        error.message
    );
    assert_eq!(server.snapshot(), before, "nothing of the upload stayed");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_or_replace_on_the_client_uploads_as_an_update() {
    let server = TestServer::start().await;
    let options = server.options("alice");
    let mut alice = server.client("alice-1");
    alice.sync(&options).await.unwrap();
    alice
        .connection()
        .execute(
            "INSERT OR REPLACE INTO orders VALUES ('alice-seed-0', 'alice', 'replaced', 9)",
            [],
        )
        .unwrap();
    let report = alice.sync(&options).await.unwrap();
    assert_eq!(
        (report.rows_uploaded, report.conflicts),
        (1, 0),
        "{report:?}"
    );
    assert_eq!(
        server.consolidated_orders(Some("alice"))[0],
        row("alice-seed-0", "alice", "replaced", 9)
    );
    assert_eq!(
        client_orders(&alice),
        server.consolidated_orders(Some("alice"))
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_rows_travel_in_frames_under_the_limit_and_larger_values_in_pieces() {
    let server = TestServer::start().await;
    let options = server.options("alice");
    let mut alice = server.client("alice-1");
    let db = alice.connection();
    db.execute(
        "INSERT INTO orders VALUES ('a-1', 'alice', ?1, 1)",
        [&"x".repeat(900_000)],
    )
    .unwrap();
    db.execute(
        "INSERT INTO orders VALUES ('a-2', 'alice', ?1, 2)",
        [&"y".repeat(3_500_000)],
    )
    .unwrap();
    let report = alice.sync(&options).await.unwrap();
    assert_eq!((report.rows_uploaded, report.conflicts), (2, 0));
    assert_eq!(
        client_orders(&alice),
        server.consolidated_orders(Some("alice"))
    );

    // Larger than a frame: the text travels in pieces (protocol v2), both ways.
    alice
        .connection()
        .execute(
            "INSERT INTO orders VALUES ('a-3', 'alice', ?1, 3)",
            [&"z".repeat(5_000_000)],
        )
        .unwrap();
    let report = alice.sync(&options).await.unwrap();
    assert_eq!((report.rows_uploaded, report.conflicts), (1, 0));
    let mut other = server.client("alice-2");
    other.sync(&options).await.unwrap();
    assert_eq!(
        client_orders(&other),
        server.consolidated_orders(Some("alice"))
    );
    assert!(client_orders(&other).contains(&row("a-3", "alice", &"z".repeat(5_000_000), 3)));
    server.stop().await;
}

/// Issue 16: a value larger than a frame travels in pieces both ways, and the server
/// holds no more of it in memory than the cache allows: counted by the cache's peak,
/// with the rest spilled to temporary files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_larger_than_a_frame_stays_within_the_cache_both_ways() {
    let cache_bytes_max = 2 * 1024 * 1024;
    let config = ServerConfig {
        cache_bytes_max,
        upload_spool_memory_bytes_max: 1024 * 1024,
        download_spool_memory_bytes_max: 1024 * 1024,
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(config).await;
    let item: String = (0..3_500_000u32)
        .map(|n| char::from_u32(0x20 + n % 0x2000).unwrap_or('✓'))
        .collect();
    assert!(item.len() > 2 * rowsync_protocol::FRAME_BYTES_MAX_DEFAULT);
    let mut writer = server.client("alice-writer");
    writer
        .connection()
        .execute(
            "INSERT INTO orders VALUES ('large', 'alice', ?1, 1)",
            [&item],
        )
        .unwrap();
    writer.sync(&server.options("alice")).await.unwrap();
    let mut reader = server.client("alice-reader");
    reader.sync(&server.options("alice")).await.unwrap();
    assert_eq!(
        client_orders(&reader),
        server.consolidated_orders(Some("alice"))
    );
    assert!(client_orders(&reader).contains(&row("large", "alice", &item, 1)));
    let peak = server.metrics.cache_bytes_peak.get() as usize;
    assert!(peak <= cache_bytes_max, "cache peak {peak}");
    let spilled = server.metrics.spilled_bytes.get() as usize;
    // Up and down, the value's bytes beyond what the cache holds went to disk.
    assert!(
        spilled >= 2 * (item.len() - cache_bytes_max),
        "spilled {spilled}"
    );
    assert_eq!(server.metrics.cache_bytes.get(), 0, "all released");
    server.stop().await;
}
