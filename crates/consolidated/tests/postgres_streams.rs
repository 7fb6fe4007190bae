//! Apply streams on PostgreSQL (issue 20): a large upload written by several
//! transactions committed together; a stream that waits for a lock a sibling holds makes
//! every stream abort and the upload land on one stream; prepared transactions left by a
//! crash resolved from the decision the database recorded. Real throwaway PostgreSQL
//! (`rowsync-testkit`, started with `max_prepared_transactions`).

use std::sync::Arc;

use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::{
    sync_and_collect, ApplyStreamSettings, Consolidated, ConsolidatedConnection, SyncRequest,
    TableInit,
};
use rowsync_protocol::{TableUpload, Value};
use tokio_postgres::Client;

const NOTES: &str = "CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, body TEXT)";

fn settings(lock_timeout_ms: u64) -> ApplyStreamSettings {
    ApplyStreamSettings {
        streams_max: 4,
        rows_per_stream_min: 100,
        lock_timeout_ms,
    }
}

/// A database with `notes` (and `extra` SQL) initialized for user `ann`.
async fn database(
    prefix: &str,
    extra: &str,
    streams: ApplyStreamSettings,
) -> (PostgresConsolidated, Client) {
    let (url, client) =
        rowsync_testkit::fresh_database_with(prefix, &format!("{NOTES}; {extra}")).await;
    let backend = PostgresConsolidated::with_apply_streams(&url, streams);
    let mut admin = backend.connect().await.unwrap();
    admin.install_system_tables().await.unwrap();
    admin
        .init_table(&TableInit {
            table: "notes".into(),
            partition_column: "owner".into(),
            script_version: Some("v1".into()),
            based_on: None,
        })
        .await
        .unwrap();
    (backend, client)
}

fn inserts(ids: std::ops::RangeInclusive<i64>) -> SyncRequest {
    SyncRequest {
        client_id: "ann-1".into(),
        user: "ann".into(),
        script_version: "v1".into(),
        last_download_watermark: 0,
        upload_sequence: 1,
        tables: vec![TableUpload {
            table: "notes".into(),
            columns: vec!["id".into(), "owner".into(), "body".into()],
            key_columns: vec!["id".into()],
            inserts: ids
                .map(|id| {
                    vec![
                        Value::Int(id),
                        Value::Text("ann".into()),
                        Value::Text(format!("b{id}")),
                    ]
                })
                .collect(),
            updates: Vec::new(),
            deletes: Vec::new(),
        }],
        auth_parameters: Vec::new(),
        client_ids_per_user_max: None,
        transfer_id: None,
        check_identity: false,
        refused_rows_max: 0,
        key_ranges: None,
        sync_tables: Default::default(),
    }
}

async fn count(client: &Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

const PREPARED: &str = "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()";
/// Transactions that wrote the table's rows (each row carries its writer's id).
const WRITERS: &str = "SELECT count(DISTINCT rs_xid) FROM notes";

#[tokio::test]
async fn a_large_upload_is_written_by_several_transactions_committed_together() {
    let (backend, client) = database("streams_used", "", settings(10_000)).await;
    let mut connection = backend.connect().await.unwrap();
    let outcome = sync_and_collect(&mut connection, Arc::new(inserts(1..=1000)))
        .await
        .unwrap();
    assert_eq!(outcome.summary.rows_uploaded, 1000);
    assert_eq!(count(&client, "SELECT count(*) FROM notes").await, 1000);
    assert_eq!(
        count(&client, WRITERS).await,
        4,
        "the sync's transaction and three streams"
    );
    assert_eq!(count(&client, PREPARED).await, 0, "nothing left prepared");
    // The decision stays until cleanup (no round trip on the sync's path).
    let decisions = "SELECT count(*) FROM rs_stream_decision";
    assert_eq!(count(&client, decisions).await, 1);
    connection.cleanup().await.unwrap();
    assert_eq!(count(&client, decisions).await, 0);
    // Below the threshold: one stream.
    let small = SyncRequest {
        client_id: "ann-2".into(),
        ..inserts(2001..=2050)
    };
    sync_and_collect(&mut connection, Arc::new(small))
        .await
        .unwrap();
    assert_eq!(
        count(
            &client,
            "SELECT count(DISTINCT rs_xid) FROM notes WHERE id > 2000"
        )
        .await,
        1
    );
}

/// Every statement on `notes` bumps one shared counter row: streams inserting at once
/// wait for each other, and one that waits for a prepared sibling would wait forever.
/// The lock timeout ends the wait, every stream aborts, and the upload lands on one
/// stream with the counter right.
#[tokio::test]
async fn a_stream_waiting_for_a_sibling_aborts_all_and_the_upload_lands_on_one_stream() {
    // `applications` counts the statements that ran, rolled back or not (a sequence is
    // not transactional): more than one shows the streams ran before the fallback.
    let counter = "CREATE TABLE counter (n BIGINT NOT NULL); INSERT INTO counter VALUES (0);
        CREATE SEQUENCE applications;
        CREATE FUNCTION bump() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM nextval('applications'); UPDATE counter SET n = n + (SELECT count(*) FROM fresh); RETURN NULL; END $$;
        CREATE TRIGGER bump AFTER INSERT ON notes REFERENCING NEW TABLE AS fresh
            FOR EACH STATEMENT EXECUTE FUNCTION bump();";
    let (backend, client) = database("streams_fallback", counter, settings(200)).await;
    let mut connection = backend.connect().await.unwrap();
    let outcome = sync_and_collect(&mut connection, Arc::new(inserts(1..=1000)))
        .await
        .unwrap();
    assert_eq!(outcome.summary.rows_uploaded, 1000);
    assert_eq!(count(&client, "SELECT count(*) FROM notes").await, 1000);
    assert_eq!(
        count(&client, "SELECT n FROM counter").await,
        1000,
        "each row counted once"
    );
    assert_eq!(count(&client, WRITERS).await, 1, "applied on one stream");
    assert_eq!(
        count(&client, PREPARED).await,
        0,
        "every stream rolled back"
    );
    let statements = count(&client, "SELECT last_value FROM applications").await;
    assert!(
        statements > 2,
        "the streams ran first ({statements} statements)"
    );
    // Exactly once: the same upload again changes nothing.
    let again = sync_and_collect(&mut connection, Arc::new(inserts(1..=1000)))
        .await
        .unwrap();
    assert!(again.summary.upload_already_applied);
    assert_eq!(count(&client, "SELECT n FROM counter").await, 1000);
}

/// Issue 31: a large upload of two tables, one referencing the other, stays on one
/// stream (a row and the row it references hashed to two streams' transactions would not
/// see each other) and lands parents first, though the child's table comes first.
#[tokio::test]
async fn a_large_upload_of_tables_linked_by_a_foreign_key_lands_on_one_stream() {
    let links = "CREATE TABLE links (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, \
             note_id INTEGER NOT NULL REFERENCES notes (id));
        CREATE SEQUENCE applications;
        CREATE FUNCTION counted() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM nextval('applications'); RETURN NULL; END $$;
        CREATE TRIGGER counted BEFORE INSERT ON links FOR EACH STATEMENT EXECUTE FUNCTION counted();";
    let (backend, client) = database("streams_linked", links, settings(10_000)).await;
    let mut connection = backend.connect().await.unwrap();
    connection
        .init_table(&TableInit::new("links", "owner", "v1"))
        .await
        .unwrap();
    let mut request = inserts(1..=600);
    let link_rows = (1..=600)
        .map(|id| {
            vec![
                Value::Int(5000 + id),
                Value::Text("ann".into()),
                Value::Int(id),
            ]
        })
        .collect();
    request.tables.insert(
        0,
        TableUpload {
            table: "links".into(),
            columns: vec!["id".into(), "owner".into(), "note_id".into()],
            key_columns: vec!["id".into()],
            inserts: link_rows,
            updates: Vec::new(),
            deletes: Vec::new(),
        },
    );
    let outcome = sync_and_collect(&mut connection, Arc::new(request))
        .await
        .unwrap();
    assert_eq!(outcome.summary.rows_uploaded, 1200);
    assert_eq!(count(&client, "SELECT count(*) FROM links").await, 600);
    assert_eq!(count(&client, WRITERS).await, 1, "one transaction");
    let decisions = "SELECT count(*) FROM rs_stream_decision";
    assert_eq!(count(&client, decisions).await, 0, "no streams committed");
    let applications = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM applications";
    assert_eq!(
        count(&client, applications).await,
        1,
        "one insert statement on links: no stream ran and fell back"
    );
}

/// Two groups left prepared as a crashed server leaves them: one whose decision the
/// sync's transaction recorded (committed), one without (rolled back, and recorded so
/// a sync still running could not commit it afterwards).
#[tokio::test]
async fn a_starting_server_commits_decided_groups_and_rolls_back_the_others() {
    let (backend, client) = database("streams_recover", "", settings(10_000)).await;
    for (group, id) in [("rowsync-decided", 1), ("rowsync-undecided", 2)] {
        for stream in 0..2 {
            let row = id * 10 + stream;
            client
                .batch_execute(&format!(
                    "BEGIN; INSERT INTO notes VALUES ({row}, 'ann', 'x'); \
                     PREPARE TRANSACTION '{group}-{stream}'"
                ))
                .await
                .unwrap();
        }
    }
    client
        .batch_execute(
            "INSERT INTO rs_stream_decision (group_id, committed) VALUES ('rowsync-decided', true)",
        )
        .await
        .unwrap();
    assert_eq!(count(&client, PREPARED).await, 4);
    let mut starting = backend.connect().await.unwrap();
    assert_eq!(starting.resolve_prepared_streams().await.unwrap(), 4);
    assert_eq!(count(&client, PREPARED).await, 0);
    let ids: Vec<i32> = client
        .query("SELECT id FROM notes ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(ids, vec![10, 11], "the decided group only");
    let decisions: Vec<(String, bool)> = client
        .query("SELECT group_id, committed FROM rs_stream_decision", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        decisions,
        vec![("rowsync-undecided".to_string(), false)],
        "the rollback stays recorded; the finished commit is forgotten"
    );
    // A sync still holding that group can no longer decide to commit it.
    let recorded = client
        .execute(
            "INSERT INTO rs_stream_decision (group_id, committed) VALUES ('rowsync-undecided', true) \
             ON CONFLICT (group_id) DO NOTHING",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(recorded, 0);
}
