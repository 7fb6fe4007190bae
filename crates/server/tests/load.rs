//! The server under load: many clients above the connection limit, a cache limit far
//! below the data in flight, silent and slow connections, the metrics endpoint.

mod support;

use std::sync::Arc;
use std::time::Duration;

use rowsync_client::{ClientError, SyncOptions, SyncReport};
use rowsync_protocol::{encode_frame, ErrorCode, FrameDecoder, Message, Value};
use rowsync_server::metrics::{Outcome, PHASES};
use rowsync_server::ServerConfig;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_above_the_connection_limit_all_finish_after_retries() {
    let server = Arc::new(
        TestServer::start_with(ServerConfig {
            connections_max: 3,
            workers: 2,
            busy_retry_after_ms: 20,
            busy_retry_after_ms_max: 300,
            ..ServerConfig::default()
        })
        .await,
    );
    const CLIENTS: usize = 40;
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..CLIENTS {
        let server = Arc::clone(&server);
        tasks.spawn(async move {
            let user = USERS[index % 2];
            let mut client = server.client(&format!("c{index}"));
            client
                .connection()
                .execute(
                    "INSERT INTO orders VALUES (?1, ?2, 'load', ?3)",
                    rusqlite::params![format!("load-{index}"), user, index as i64],
                )
                .unwrap();
            client.sync(&server.options(user)).await
        });
    }
    let mut reports: Vec<SyncReport> = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        reports.push(joined.unwrap().expect("every client finishes"));
    }
    assert_eq!(reports.len(), CLIENTS);
    let retries: u32 = reports.iter().map(|report| report.busy_retries).sum();
    assert!(retries > 0, "40 clients over 3 slots: some were told busy");
    assert_eq!(
        server.metrics.syncs_ended(Outcome::busy),
        u64::from(retries)
    );
    assert!(reports.iter().all(|report| report.rows_uploaded == 1));
    let loaded = server
        .consolidated_orders(None)
        .iter()
        .filter(|row| row[2] == Value::Text("load".into()))
        .count();
    assert_eq!(loaded, CLIENTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_far_below_the_data_in_flight_spills_and_every_sync_is_correct() {
    let cache_bytes_max = 32 * 1024;
    let server = Arc::new(
        TestServer::start_with(ServerConfig {
            cache_bytes_max,
            workers: 1,
            ..ServerConfig::default()
        })
        .await,
    );
    const CLIENTS: usize = 8;
    const ROWS: usize = 300;
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..CLIENTS {
        let server = Arc::clone(&server);
        tasks.spawn(async move {
            let mut client = server.client(&format!("big{index}"));
            let connection = client.connection();
            for row in 0..ROWS {
                connection
                    .execute(
                        "INSERT INTO orders VALUES (?1, 'alice', ?2, ?3)",
                        rusqlite::params![
                            format!("big-{index}-{row}"),
                            "an item name long enough to make rows of some size".repeat(2),
                            row as i64
                        ],
                    )
                    .unwrap();
            }
            let report = client.sync(&server.options("alice")).await.unwrap();
            (report, client_orders(&client).len())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (report, held) = joined.unwrap();
        assert_eq!(report.rows_uploaded, ROWS as u64);
        // Each client holds its own rows plus whatever alice had when it synced.
        assert!(held >= ROWS + 2, "{held}");
    }
    assert_eq!(
        server.consolidated_orders(Some("alice")).len(),
        2 + CLIENTS * ROWS
    );
    // A late client downloads everything, through the spill.
    let mut late = server.client("late");
    let report = late.sync(&server.options("alice")).await.unwrap();
    assert_eq!(report.rows_downloaded as usize, 2 + CLIENTS * ROWS);
    let text = server.metrics.encode();
    let spilled: f64 = metric(&text, "rowsync_spilled_bytes_total");
    assert!(spilled > 0.0, "{text}");
    assert_eq!(metric(&text, "rowsync_cache_bytes"), 0.0, "all released");
    assert_eq!(
        metric(&text, "rowsync_cache_bytes_max"),
        cache_bytes_max as f64
    );
}

/// The value of an unlabelled metric in Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} in\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Reads the server's answer until it closes: the messages it sent.
async fn answer(mut stream: TcpStream) -> Vec<Message> {
    let mut bytes = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut bytes)).await;
    let mut decoder = FrameDecoder::new(1 << 20);
    decoder.feed(&bytes);
    let mut messages = Vec::new();
    while let Ok(Some(message)) = decoder.next_message() {
        messages.push(message);
    }
    messages
}

fn timed_out(messages: &[Message], part: &str) {
    match messages {
        [Message::Error(error)] => {
            assert_eq!(error.error_code(), Some(ErrorCode::Timeout), "{error}");
            assert!(error.message.contains(part), "{}", error.message);
        }
        other => panic!("expected a timeout error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_slow_connections_are_closed_and_free_their_slot() {
    let server = TestServer::start_with(ServerConfig {
        connections_max: 1,
        header_read_timeout: Duration::from_millis(300),
        upload_timeout: Duration::from_millis(900),
        ..ServerConfig::default()
    })
    .await;
    // Silent: closed after the header timeout.
    let silent = TcpStream::connect(server.address).await.unwrap();
    timed_out(&answer(silent).await, "the hello did not arrive");

    // Slow: a whole hello, then one byte of the upload every 100 ms.
    let mut slow = TcpStream::connect(server.address).await.unwrap();
    let hello = support::hello_frame("alice");
    slow.write_all(&hello).await.unwrap();
    let upload = encode_frame(&Message::EndUpload(rowsync_protocol::EndUpload {
        upload_sequence: 1,
    }));
    let dribble = tokio::spawn(async move {
        for byte in upload.iter().take(upload.len() - 1) {
            if slow.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        slow
    });
    let slow = dribble.await.unwrap();
    timed_out(
        &answer(slow).await,
        "the upload did not arrive within the upload timeout",
    );

    // The only slot is free again.
    let mut client = server.client("after");
    let mut options = server.options("alice");
    options.busy_retry = rowsync_client::BusyRetry::Never;
    assert_eq!(client.sync(&options).await.unwrap().rows_downloaded, 2);
    assert!(!matches!(
        client.sync(&options).await,
        Err(ClientError::Busy { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_endpoint_serves_metrics_with_every_phase() {
    let server = TestServer::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = listener.local_addr().unwrap();
    let metrics = Arc::clone(&server.metrics);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(rowsync_server::admin::serve_admin(
        listener,
        metrics,
        async {
            let _ = stopped.await;
        },
    ));
    let mut client = server.client("measured");
    client.sync(&server.options("bob")).await.unwrap();
    let get = |path: &'static str| async move {
        let mut stream = TcpStream::connect(admin).await.unwrap();
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    };
    let response = get("/metrics").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.contains("rowsync_syncs_total{outcome=\"ok\"} 1"),
        "{response}"
    );
    assert!(
        response.contains("rowsync_rows_downloaded_total 2"),
        "{response}"
    );
    for phase in PHASES {
        assert!(
            response.contains(&format!(
                "rowsync_sync_phase_seconds_count{{phase=\"{phase}\"}} 1"
            )),
            "{phase} in {response}"
        );
    }
    assert!(get("/other").await.starts_with("HTTP/1.1 404"));
    let _ = stop.send(());
    serving.await.unwrap().unwrap();
}

/// Issue 15, finding 5: silent connections (cheap to open, each held until the header
/// timeout) took every slot, and clients that said hello at once were answered busy.
/// Now beyond `hello_pending_connections_max` connections waiting for their hello, the
/// oldest past `hello_pending_grace` are answered busy, so the other slots stay for syncs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_hold_at_most_their_own_limit_of_slots() {
    let (connections_max, pending_max, silent_count) = (24, 4, 20);
    let server = TestServer::start_with(ServerConfig {
        connections_max,
        hello_pending_connections_max: pending_max,
        hello_pending_grace: Duration::from_millis(200),
        // No timeout closes them during the test: only eviction can.
        header_read_timeout: Duration::from_secs(3600),
        ..ServerConfig::default()
    })
    .await;
    let metrics = &server.metrics;
    let registered =
        || metrics.connections_awaiting_hello.get() as u64 + metrics.hello_pending_evictions.get();
    let mut silent = Vec::new();
    for opened in 1..=silent_count {
        silent.push(TcpStream::connect(server.address).await.unwrap());
        // Each registers before the next connects, so the oldest are the first ones.
        while registered() < opened {
            tokio::task::yield_now().await;
        }
    }
    let evicted = (silent_count - pending_max as u64) as usize;
    // Each is told when its grace ends, oldest first, until the limit is reached.
    let waited = tokio::time::Instant::now();
    while metrics.hello_pending_evictions.get() < evicted as u64 {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "evictions: {}",
            metrics.hello_pending_evictions.get()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(metrics.connections_awaiting_hello.get(), pending_max as i64);
    assert_eq!(metrics.hello_pending_evictions.get(), evicted as u64);
    // Told busy (no room), so a real client that was merely slow retries.
    for stream in silent.drain(..evicted) {
        let answered = answer(stream).await;
        assert!(
            matches!(answered[..], [Message::Busy { .. }]),
            "{answered:?}"
        );
    }
    assert_eq!(metrics.syncs_ended(Outcome::busy), evicted as u64);

    let mut client = server.client("legitimate");
    let mut options = server.options("alice");
    options.busy_retry = rowsync_client::BusyRetry::Never;
    let report = client.sync(&options).await.expect("a slot for a sync");
    assert_eq!(report.rows_downloaded, 2);
    // The client's own connection took the place of one more silent one.
    assert_eq!(metrics.syncs_ended(Outcome::busy), evicted as u64 + 1);
    drop(silent);
}

/// The paper-size bench's 1,000 clients connecting at once failed 164 syncs: more than
/// `hello_pending_connections_max` connections were accepted before the server read
/// their hellos, and the oldest were closed with a timeout error although their hello
/// had arrived. Now bytes already there win over the eviction, and an evicted
/// connection is answered busy, so its client comes back. (No grace here, so that
/// evictions happen.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_clients_beyond_the_hello_limit_all_sync() {
    const CLIENTS: usize = 100;
    let server = Arc::new(
        TestServer::start_with(ServerConfig {
            connections_max: 256,
            hello_pending_connections_max: 2,
            hello_pending_grace: Duration::ZERO,
            ..ServerConfig::default()
        })
        .await,
    );
    for round in 0..5 {
        let options = server.options("alice");
        sync_a_burst(&server, CLIENTS, &format!("burst-{round}"), options).await;
        if server.metrics.hello_pending_evictions.get() > 0 {
            return;
        }
    }
    panic!("five bursts of {CLIENTS} clients never had more than 2 hellos pending");
}

/// `count` new clients named `{name}-{index}` sync at once with `options`; each must
/// succeed and download the server's two rows.
async fn sync_a_burst(server: &TestServer, count: usize, name: &str, options: SyncOptions) {
    let clients: Vec<_> = (0..count)
        .map(|index| server.client(&format!("{name}-{index}")))
        .collect();
    let start = Arc::new(tokio::sync::Barrier::new(count));
    let mut tasks = tokio::task::JoinSet::new();
    for mut client in clients {
        let (options, start) = (options.clone(), Arc::clone(&start));
        tasks.spawn(async move {
            start.wait().await;
            client.sync(&options).await
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let report = joined
            .unwrap()
            .expect("every client of the burst syncs, none turned away");
        assert_eq!(report.rows_downloaded, 2);
    }
}

/// Standard-size Test 4 answered 1,360-3,382 clients busy per sync type at 1,000
/// simultaneous clients: hundreds were accepted before their hellos could be read on
/// two cores, the oldest beyond the limit were evicted at once, and each came back
/// only after the retry hint. With the grace, a burst far beyond the limit is left time
/// to say hello: nobody is evicted, nobody answered busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_beyond_the_hello_limit_is_left_its_grace() {
    const CLIENTS: usize = 100;
    let server = Arc::new(
        TestServer::start_with(ServerConfig {
            connections_max: 256,
            hello_pending_connections_max: 2,
            ..ServerConfig::default()
        })
        .await,
    );
    let mut options = server.options("alice");
    options.busy_retry = rowsync_client::BusyRetry::Never;
    sync_a_burst(&server, CLIENTS, "graced", options).await;
    assert_eq!(server.metrics.hello_pending_evictions.get(), 0);
    assert_eq!(server.metrics.syncs_ended(Outcome::busy), 0);
}

/// Issue 15, finding 5, measured: the share of a legitimate client's syncs answered
/// busy while 1,000 silent connections are held open (each re-opened when the server
/// closes it, at most 100 a second, as in the finding) against 1,000 slots; once with
/// no limit of their own (as before: `hello_pending_connections_max` = the slots) and
/// once with the default limit, side by side in one run.
/// `cargo test -p rowsync-server --test load -- --ignored --nocapture busy_share`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement under 1,000 silent connections, run by hand"]
async fn busy_share_under_1000_silent_connections() {
    const SLOTS: usize = 1000;
    for (label, pending_max) in [("no own limit", SLOTS), ("default limit", 256)] {
        let (busy, syncs) = busy_share_with(SLOTS, pending_max).await;
        println!(
            "{label} (hello_pending_connections_max {pending_max}): {busy} of {syncs} syncs answered busy ({:.0}%)",
            100.0 * busy as f64 / syncs as f64
        );
    }
}

/// 1,000 silent connections held against `slots`, then 100 syncs of one client that
/// never retries: how many were answered busy.
async fn busy_share_with(slots: usize, pending_max: usize) -> (usize, usize) {
    const SILENT: usize = 1000;
    const SYNCS: usize = 100;
    let server = TestServer::start_with(ServerConfig {
        connections_max: slots,
        hello_pending_connections_max: pending_max,
        ..ServerConfig::default()
    })
    .await;
    let address = server.address;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut attackers = tokio::task::JoinSet::new();
    for index in 0..SILENT {
        let mut stopped = stopped.clone();
        attackers.spawn(async move {
            // Spread over the first 10 s.
            tokio::time::sleep(Duration::from_millis(10 * index as u64)).await;
            while !*stopped.borrow() {
                // Each task opens at most one connection per 10 s: 100 a second in all.
                let next = tokio::time::Instant::now() + Duration::from_secs(10);
                if let Ok(mut stream) = TcpStream::connect(address).await {
                    let mut sink = [0u8; 64];
                    tokio::select! {
                        _ = stream.read(&mut sink) => {}
                        _ = stopped.changed() => break,
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => {}
                    _ = stopped.changed() => break,
                }
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(12)).await;
    let mut client = server.client("legitimate");
    let mut options = server.options("alice");
    options.busy_retry = rowsync_client::BusyRetry::Never;
    let mut busy = 0;
    for _ in 0..SYNCS {
        match client.sync(&options).await {
            Ok(_) => {}
            Err(ClientError::Busy { .. }) => busy += 1,
            Err(other) => panic!("a sync failed otherwise: {other}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(true).unwrap();
    while attackers.join_next().await.is_some() {}
    (busy, SYNCS)
}

/// Issue 15, finding 10: 475 failed logins in 15 s from one address were answered at
/// full speed, each costing an argon2 check. After `login_failures_per_address_max`
/// failures in the window, logins from the address are refused unchecked (code 3),
/// even with the right password, until the window ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_from_one_address_are_throttled() {
    let failures_max = 3;
    let server = TestServer::start_with(ServerConfig {
        login_failures_per_address_max: failures_max,
        login_failures_per_user_max: 1000,
        login_failure_window: Duration::from_secs(3600),
        ..ServerConfig::default()
    })
    .await;
    let mut client = server.client("guesser");
    let refusal = |error: ClientError| match error {
        ClientError::Server(refusal) => {
            assert_eq!(refusal.error_code(), Some(ErrorCode::AuthenticationFailed));
            refusal.message
        }
        other => panic!("expected a refusal, got {other}"),
    };
    let mut wrong = server.options("alice");
    wrong.password = "guess".into();
    for _ in 0..failures_max {
        let message = refusal(client.sync(&wrong).await.unwrap_err());
        assert!(message.contains("wrong password"), "{message}");
    }
    assert_eq!(server.metrics.logins_throttled.get(), 0);
    // The right password now: refused unchecked, for the address.
    let message = refusal(client.sync(&server.options("alice")).await.unwrap_err());
    assert!(
        message.contains("too many failed logins for this address"),
        "{message}"
    );
    assert_eq!(server.metrics.logins_throttled.get(), 1);
}

/// Issue 38, item 3: two servers of one database throttle as one. Each counts two of
/// four refused logins from one address; once they shared their counts
/// (`rs_login_failure`, every `farm_share_interval`), the right password is
/// refused unchecked on both. Counted alone, neither would reach the limit of four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_of_one_database_throttle_as_one() {
    let config = ServerConfig {
        login_failures_per_address_max: 4,
        login_failures_per_user_max: 1000,
        login_failure_window: Duration::from_secs(3600),
        farm_share_interval: Duration::from_millis(50),
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(config.clone()).await;
    let (other, stop) = second_server(&server, config).await;
    let mut client = server.client("guesser");
    let right = [server.options("alice"), server.options_via(other, "alice")];
    let wrong = right.clone().map(|options| SyncOptions {
        password: "guess".into(),
        ..options
    });
    for options in [&wrong[0], &wrong[1], &wrong[0], &wrong[1]] {
        let refused = client.sync(options).await.unwrap_err().to_string();
        assert!(refused.contains("wrong password"), "{refused}");
    }
    for options in &right {
        let mut refused = String::new();
        // Until both servers shared: a login that passes meanwhile resets nothing the
        // address is counted by.
        for _ in 0..100 {
            match client.sync(options).await {
                Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(error) => {
                    refused = error.to_string();
                    break;
                }
            }
        }
        assert!(
            refused.contains("too many failed logins for this address"),
            "via {}: {refused}",
            options.address
        );
    }
    let _ = stop.send(());
}

/// Issue 38, item 3: a farm's worker budget is split between the servers alive. Two
/// servers of one database with `farm_workers_max` 4 run 2 workers each; when one
/// stops, the other takes the whole budget again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_farm_splits_its_worker_budget_between_the_servers_alive() {
    let config = ServerConfig {
        workers: 4,
        farm_workers_max: Some(4),
        farm_share_interval: Duration::from_millis(50),
        worker_adjust_interval: Duration::from_millis(100),
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(config.clone()).await;
    let workers = || server.metrics.workers.get();
    let until = |wanted: i64| async move {
        for _ in 0..100 {
            if workers() == wanted {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the server runs {} workers, not {wanted}", workers());
    };
    until(4).await;
    let (_, stop) = second_server(&server, config).await;
    until(2).await;
    let _ = stop.send(());
    until(4).await;
}

/// A raw sync (hello, then an empty upload) from `source`, a loopback address other
/// than 127.0.0.1: the refusal's message, or "" when the login was accepted.
async fn login_from(server: &TestServer, source: [u8; 4], user: &str, password: &str) -> String {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(std::net::SocketAddr::from((source, 0)))
        .unwrap();
    let mut stream = socket.connect(server.address).await.unwrap();
    let hello = Message::Hello(rowsync_protocol::Hello {
        protocol_version: 2,
        client_id: format!("raw-{user}-{}-{}", source[2], source[3]),
        user: user.into(),
        password: password.into(),
        script_version: "v1".into(),
        last_download_watermark: 0,
        token: String::new(),
        auth_parameters: Vec::new(),
        download_ack: false,
        tables: Default::default(),
    });
    let end = Message::EndUpload(rowsync_protocol::EndUpload { upload_sequence: 1 });
    let mut frames = encode_frame(&hello);
    frames.extend(encode_frame(&end));
    stream.write_all(&frames).await.unwrap();
    let mut decoder = FrameDecoder::new(1 << 20);
    let mut buffer = vec![0u8; 4096];
    loop {
        let read = stream.read(&mut buffer).await.unwrap_or(0);
        assert!(read > 0, "the server closed without an answer");
        decoder.feed(&buffer[..read]);
        match decoder.next_message().unwrap() {
            Some(Message::Error(error)) => {
                assert_eq!(error.error_code(), Some(ErrorCode::AuthenticationFailed));
                return error.message;
            }
            // Accepted: the download begins.
            Some(_) => return "".into(),
            None => {}
        }
    }
}

/// Issue 32, item 3: eleven wrong passwords for bob from one address locked bob out from
/// every address, and 580 guesses over 20 addresses went unthrottled by user. Now the
/// pair (address, user) is throttled, the user's count only at addresses that failed,
/// and bob logs in from an address that has not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_lock_out_the_pair_not_the_user_everywhere() {
    let server = TestServer::start_with(ServerConfig {
        login_failures_per_address_max: 30,
        login_failures_per_address_user_max: 3,
        login_failures_per_user_max: 5,
        login_failure_window: Duration::from_secs(3600),
        ..ServerConfig::default()
    })
    .await;
    let right = password("bob");
    for _ in 0..3 {
        let refused = login_from(&server, [127, 0, 3, 1], "bob", "guess").await;
        assert!(refused.contains("wrong password"), "{refused}");
    }
    let refused = login_from(&server, [127, 0, 3, 1], "bob", &right).await;
    assert!(refused.contains("too many failed logins"), "{refused}");
    // Another user from the same address, and bob from a clean address, log in.
    assert_eq!(
        login_from(&server, [127, 0, 3, 1], "alice", &password("alice")).await,
        ""
    );
    assert_eq!(login_from(&server, [127, 0, 3, 2], "bob", &right).await, "");
    // Guesses for alice spread over many addresses: past her count, every address that
    // guessed is refused unchecked, while one that never failed still logs her in.
    for n in 0..20u8 {
        login_from(&server, [127, 0, 4, n], "alice", "guess").await;
    }
    let refused = login_from(&server, [127, 0, 4, 0], "alice", &password("alice")).await;
    assert!(refused.contains("too many failed logins"), "{refused}");
    assert_eq!(
        login_from(&server, [127, 0, 4, 200], "alice", &password("alice")).await,
        ""
    );
    assert!(server.metrics.logins_throttled.get() >= 2);
}

/// An h2c connection that sent one `GET /` (answered 405) and stays open: its request
/// sender and the task driving it (which ends when the server closes the connection).
async fn idle_h2c(
    server: &TestServer,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let stream = TcpStream::connect(server.http_address).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let driving = tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = hyper::Request::get(format!("http://{}/", server.http_address))
        .body(http_body_util::Empty::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 405);
    (sender, driving)
}

/// Issue 32, item 2: 1,024 h2c connections that each sent one `GET /` and stayed open
/// made every HTTP sync get 503 for a minute. Connections without a request in
/// progress are bounded like silent TCP connections: beyond
/// `hello_pending_connections_max`, the oldest past the grace is closed, so a sync
/// finds a connection permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http_connections_do_not_lock_out_http_syncs() {
    let server = TestServer::start_with(ServerConfig {
        connections_max: 8,
        hello_pending_connections_max: 2,
        hello_pending_grace: Duration::from_millis(200),
        http_idle_timeout: Duration::from_secs(600),
        ..ServerConfig::default()
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(idle_h2c(&server).await);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    for via in [Via::H2c, Via::Http] {
        let mut options = server.options_over("alice", via, rowsync_client::Compression::None);
        options.busy_retry = rowsync_client::BusyRetry::Never;
        let mut client = server.client(&format!("past-idle-{via:?}"));
        client
            .sync(&options)
            .await
            .expect("a sync past idle connections");
    }
    let closed = idle
        .iter()
        .filter(|(_, driving)| driving.is_finished())
        .count();
    assert!(closed >= 6, "{closed} of the 8 idle connections closed");
}

/// Issue 32, item 2: an HTTP/2 connection had no idle limit after its first request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_closed_after_the_idle_timeout() {
    let server = TestServer::start_with(ServerConfig {
        http_idle_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    })
    .await;
    let (_sender, driving) = idle_h2c(&server).await;
    tokio::time::timeout(Duration::from_secs(5), driving)
        .await
        .expect("the server closed the idle connection")
        .unwrap();
}

/// Issue 32, item 2, the figures: 1,024 h2c connections each send one `GET /` and stay
/// open against a server with the default limits; then HTTP syncs are tried every
/// 100 ms. Prints how long until the first succeeded and how many syncs were answered
/// busy. Run by hand: `cargo test -p rowsync-server --test load -- --ignored
/// --nocapture idle_h2c_figures`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints figures; run by hand"]
async fn idle_h2c_figures() {
    let server = TestServer::start().await;
    let mut idle = Vec::new();
    for _ in 0..1024 {
        idle.push(idle_h2c(&server).await);
    }
    let started = std::time::Instant::now();
    let mut busy = 0;
    let mut options = server.options_over("alice", Via::H2c, rowsync_client::Compression::None);
    options.busy_retry = rowsync_client::BusyRetry::Never;
    let mut client = server.client("after-idle");
    let outcome = loop {
        match client.sync(&options).await {
            Ok(_) => break "synced",
            Err(ClientError::Busy { .. }) => busy += 1,
            Err(error) => panic!("{error}"),
        }
        if started.elapsed() > Duration::from_secs(70) {
            break "still busy";
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let open = idle
        .iter()
        .filter(|(_, driving)| !driving.is_finished())
        .count();
    eprintln!(
        "{outcome} after {:.1} s, {busy} syncs answered busy; {open} of 1024 idle connections open",
        started.elapsed().as_secs_f64()
    );
}

/// zstd decoders share `zstd_decoders_bytes_max`: while three connections hold all its
/// room (their hello in, their upload stalled), the next zstd client's stream waits for
/// room instead of getting a decoder, and syncs once one of them leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_decoders_wait_for_room_within_their_budget() {
    use rowsync_protocol::{zstd_decoder_bytes, Compression, Outbound};
    // Room for three decoders of the client library's 2 MiB window, not four.
    let budget = rowsync_server::decoders::zstd_decoder_bytes_max();
    let one = zstd_decoder_bytes(2 * 1024 * 1024).div_ceil(1024) * 1024;
    assert_eq!(budget / one, 3);
    let server = Arc::new(
        TestServer::start_with(ServerConfig {
            zstd_decoders_bytes_max: budget as usize,
            ..ServerConfig::default()
        })
        .await,
    );
    let reserved = || server.metrics.zstd_decoders_bytes.get() as u64;
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let mut outbound = Outbound::new(Compression::Zstd, false).unwrap();
        let mut bytes = outbound.take_preamble().unwrap().to_vec();
        bytes.extend(
            outbound
                .compressor()
                .compress(&hello_frame("alice"))
                .unwrap(),
        );
        bytes.extend(outbound.compressor().flush().unwrap());
        let mut stream = TcpStream::connect(server.address).await.unwrap();
        stream.write_all(&bytes).await.unwrap();
        stalled.push(stream);
    }
    let started = std::time::Instant::now();
    while reserved() < 3 * one {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}",
            reserved()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let syncing = {
        let server = Arc::clone(&server);
        tokio::spawn(async move {
            let mut client = server.client("waits");
            let options = server.options_over("alice", Via::Tcp, Compression::Zstd);
            client.sync(&options).await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!syncing.is_finished(), "no room: the fourth stream waits");
    assert_eq!(reserved(), 3 * one, "and holds no decoder");
    drop(stalled.pop());
    let report = syncing
        .await
        .unwrap()
        .expect("syncs once a decoder's room is free");
    assert_eq!(report.busy_retries, 0);
    drop(stalled);
    let started = std::time::Instant::now();
    while reserved() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}",
            reserved()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
