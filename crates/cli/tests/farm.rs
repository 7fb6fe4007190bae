//! A highly available farm under load (issue 38, docs/operations.md "Running a farm"):
//! PostgreSQL made highly available by pg_auto_failover (synchronous replication,
//! automatic failover), three `rowsync serve --ha` processes behind HAProxy, and clients
//! syncing continuously through it, each row's id naming who wrote it. The faults: the
//! primary PostgreSQL node lost (failover), the standby lost and back, a server cut
//! from the database for 10 s (toxiproxy), a server killed with SIGKILL, a server
//! drained with SIGTERM. After them every row a client wrote is on the server exactly
//! once, nothing conflicted, and every client holds what the server holds. The
//! unavailability after each fault (to the first sync through the farm that succeeds)
//! is printed.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rowsync_client::{Client, SyncOptions};
use rowsync_testkit::farm::{Backend, HaProxy, PgFarm};
use support::{add_user, free_port, rowsync, run_ok, NOTES_DDL};

/// Clients syncing at once through the load balancer.
const CLIENTS: i64 = 3;

/// A `rowsync serve --ha` process of the farm, killed when dropped.
struct FarmServer {
    child: Child,
    backend: Backend,
}

impl Drop for FarmServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(url: &str) -> FarmServer {
    let backend = Backend {
        tcp_port: free_port(),
        http_port: free_port(),
        admin_port: free_port(),
    };
    let listen = |port: u16| format!("127.0.0.1:{port}");
    let mut child = rowsync()
        .args(["serve", "--db", url, "--ha", "--workers", "2"])
        .args(["--listen", &listen(backend.tcp_port)])
        .args(["--http-listen", &listen(backend.http_port)])
        .args(["--admin-listen", &listen(backend.admin_port)])
        .args(["--farm-workers-max", "6", "--drain-timeout-seconds", "10"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut banner = String::new();
    while !banner.starts_with("rowsync serving") {
        banner.clear();
        assert!(stderr.read_line(&mut banner).unwrap() > 0, "no banner");
    }
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    FarmServer { child, backend }
}

/// What the clients did: the ids each wrote, when each sync that succeeded began and
/// ended, conflicts seen.
#[derive(Default)]
struct Ledger {
    written: Vec<i64>,
    successes: Vec<(Instant, Instant)>,
    failures: u64,
    conflicts: u64,
}

fn device(dir: &Path, n: i64) -> Client {
    let mut client = Client::open(dir.join(format!("device-{n}.db"))).unwrap();
    client.connection().execute_batch(NOTES_DDL).unwrap();
    client.track("notes").unwrap();
    client
}

/// Client `n` writes a row and syncs, again and again, until `stop`; its row ids are
/// `n * 1_000_000 + k`.
async fn keep_syncing(
    mut client: Client,
    n: i64,
    options: SyncOptions,
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
) -> Client {
    let mut k = 0;
    while !stop.load(Ordering::Acquire) {
        k += 1;
        let id = n * 1_000_000 + k;
        client
            .connection()
            .execute(
                "INSERT INTO notes (id, owner, body) VALUES (?1, 'alice', ?2)",
                rusqlite::params![id, format!("device {n}, row {k}")],
            )
            .unwrap();
        ledger.lock().unwrap().written.push(id);
        let began = Instant::now();
        let synced = client.sync(&options).await;
        let failed = {
            let mut ledger = ledger.lock().unwrap();
            match synced {
                Ok(report) => {
                    ledger.successes.push((began, Instant::now()));
                    ledger.conflicts += report.conflicts;
                    false
                }
                Err(_) => {
                    ledger.failures += 1;
                    true
                }
            }
        };
        if failed {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    client
}

/// Seconds from `fault` to the end of the first sync through the farm that began after
/// it and succeeded, waiting up to a minute for one.
async fn unavailability(ledger: &Mutex<Ledger>, fault: Instant) -> f64 {
    for _ in 0..600 {
        let first = ledger
            .lock()
            .unwrap()
            .successes
            .iter()
            .filter(|(began, _)| *began > fault)
            .map(|(_, ended)| *ended)
            .min();
        if let Some(first) = first {
            return (first - fault).as_secs_f64();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no sync succeeded within a minute of the fault");
}

/// Seconds from `fault` until a write straight to the database (through the same
/// multi-host URL, no rowsync) succeeds: the failover tool's own unavailability.
async fn database_unavailability(url: String, fault: Instant) -> f64 {
    for _ in 0..1200 {
        if let Ok((client, connection)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await
        {
            tokio::spawn(connection);
            if client
                .batch_execute("INSERT INTO farm_probe DEFAULT VALUES")
                .await
                .is_ok()
            {
                return fault.elapsed().as_secs_f64();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the database took no write within a minute of the fault");
}

/// Whether the server whose admin endpoint is on `port` answers `/readyz` with 200
/// within `seconds`.
fn readiness_within(port: u16, seconds: u64) -> bool {
    use std::io::{Read, Write};
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let request = "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
            let mut answer = String::new();
            if stream.write_all(request.as_bytes()).is_ok()
                && stream.read_to_string(&mut answer).is_ok()
                && answer.starts_with("HTTP/1.1 200")
            {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// "median, max" of `seconds`, to two decimals.
fn median_and_max(seconds: &mut [f64]) -> String {
    seconds.sort_by(f64::total_cmp);
    format!(
        "{:.2}, {:.2}",
        seconds[seconds.len() / 2],
        seconds[seconds.len() - 1]
    )
}

/// Syncs until one succeeds (the farm may still be settling).
async fn sync_until_ok(client: &mut Client, options: &SyncOptions) {
    let mut last = String::new();
    for _ in 0..50 {
        match client.sync(options).await {
            Ok(report) => {
                assert_eq!(report.conflicts, 0, "{report:?}");
                return;
            }
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no sync succeeded: {last}");
}

fn device_ids(client: &Client) -> Vec<i64> {
    let connection = client.connection();
    let mut statement = connection
        .prepare("SELECT id FROM notes ORDER BY id")
        .unwrap();
    statement
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_farm_loses_nothing_through_failover_kill_and_drain() {
    let mut farm = tokio::task::spawn_blocking(PgFarm::start)
        .await
        .unwrap()
        .unwrap_or_else(|error| panic!("starting the PostgreSQL farm: {error}"));
    let url = farm.url();
    rowsync_testkit::connect(&url)
        .await
        .batch_execute(&format!(
            "{NOTES_DDL}; CREATE TABLE farm_probe (id bigserial PRIMARY KEY)"
        ))
        .await
        .unwrap();
    run_ok(
        &[
            "init",
            "--db",
            &url,
            "--table",
            "notes",
            "--partition-column",
            "owner",
        ],
        "",
    );
    add_user(Path::new(&url), "alice", "alice-password");
    // The third server reaches the database through a proxy per node, to be cut off.
    let toxiproxy = rowsync_testkit::link::Toxiproxy::start().unwrap();
    let links = farm
        .node_addresses()
        .map(|node| toxiproxy.proxy(node).unwrap());
    let cut_url = farm.url_through([links[0].addr(), links[1].addr()]);
    let mut servers: Vec<FarmServer> = [&url, &url, &cut_url]
        .into_iter()
        .map(|url| start_server(url))
        .collect();
    let backends: Vec<Backend> = servers.iter().map(|server| server.backend).collect();
    let proxy = HaProxy::start(&backends).unwrap();
    let options = SyncOptions {
        timeout: Duration::from_secs(10),
        ..SyncOptions::new(
            format!("tcp://127.0.0.1:{}", proxy.tcp_port),
            "alice",
            "alice-password",
        )
    };

    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (1..=CLIENTS)
        .map(|n| {
            tokio::spawn(keep_syncing(
                device(dir.path(), n),
                n,
                options.clone(),
                Arc::clone(&ledger),
                Arc::clone(&stop),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;

    // One failover in CI; ROWSYNC_FARM_FAILOVERS=100 for the soak by hand.
    let rounds: usize = std::env::var("ROWSYNC_FARM_FAILOVERS")
        .ok()
        .and_then(|rounds| rounds.parse().ok())
        .unwrap_or(1);
    let (mut failovers, mut databases) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let primary = farm.primary().expect("a primary");
        let fault = Instant::now();
        farm.kill_node(primary);
        let database = tokio::spawn(database_unavailability(url.clone(), fault));
        failovers.push(unavailability(&ledger, fault).await);
        databases.push(database.await.unwrap());
        farm = tokio::task::spawn_blocking(move || farm.rejoin(primary).map(|()| farm))
            .await
            .unwrap()
            .unwrap_or_else(|error| panic!("the lost node rejoining: {error}"));
    }
    let (failover, database) = (
        median_and_max(&mut failovers),
        median_and_max(&mut databases),
    );

    // The standby lost, then back: the primary stops waiting for it and goes on alone.
    let standby = 1 - farm.primary().expect("a primary");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fault = Instant::now();
    farm.kill_node(standby);
    let standby_lost = unavailability(&ledger, fault).await;
    farm = tokio::task::spawn_blocking(move || farm.rejoin(standby).map(|()| farm))
        .await
        .unwrap()
        .unwrap_or_else(|error| panic!("the standby rejoining: {error}"));

    // The third server cut from the database for 10 s: its readiness fails, HAProxy
    // sends syncs elsewhere; then it reconnects on its own.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fault = Instant::now();
    for link in &links {
        for direction in rowsync_testkit::link::Direction::BOTH {
            link.cut_after(direction, 0).unwrap();
        }
    }
    let cut_off = unavailability(&ledger, fault).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    for link in &links {
        link.clear().unwrap();
    }
    let cut_server = servers[2].backend.admin_port;
    let ready_again = tokio::task::spawn_blocking(move || readiness_within(cut_server, 10))
        .await
        .unwrap();
    assert!(ready_again, "the cut server is ready again within 10 s");

    tokio::time::sleep(Duration::from_secs(2)).await;
    let fault = Instant::now();
    servers[0].child.kill().unwrap();
    let killed = unavailability(&ledger, fault).await;

    tokio::time::sleep(Duration::from_secs(2)).await;
    let fault = Instant::now();
    // SAFETY: kill has no preconditions; the pid is our child's.
    unsafe { libc::kill(servers[1].child.id() as i32, libc::SIGTERM) };
    let drained = unavailability(&ledger, fault).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    stop.store(true, Ordering::Release);
    let mut clients = Vec::new();
    for task in load {
        clients.push(task.await.unwrap());
    }
    // Twice: the first round sends what each wrote, the second brings the others'.
    for _ in 0..2 {
        for client in &mut clients {
            sync_until_ok(client, &options).await;
        }
    }
    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    let mut written = ledger.written.clone();
    written.sort_unstable();
    let server = rowsync_testkit::connect(&url).await;
    let on_server: Vec<i64> = server
        .query("SELECT id FROM notes ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get::<_, i32>(0).into())
        .collect();
    assert_eq!(on_server, written, "every row written, once");
    assert_eq!(ledger.conflicts, 0);
    for client in &clients {
        assert_eq!(device_ids(client), written, "each device holds every row");
    }
    eprintln!(
        "farm: {} rows from {CLIENTS} clients, {} syncs ok, {} failed; unavailable after \
         the primary's loss (median, max of {rounds}) {failover} s (the database itself \
         {database} s), the standby's loss {standby_lost:.2} s, a server cut from the \
         database for 10 s {cut_off:.2} s, a server's SIGKILL {killed:.2} s, a server's \
         drain {drained:.2} s",
        written.len(),
        ledger.successes.len(),
        ledger.failures
    );
    drop(proxy);
    drop(servers);
    drop(farm);
}

/// After a failover every pooled connection of a server is to a database that is gone.
/// The next syncs must not fail on them: a closed connection is left in the pool and
/// a new one made (here the database ends the server's connections itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_replaces_pooled_connections_the_database_closed() {
    let (url, admin) = support::postgres_notes("closed_pool", "erin-password").await;
    let server = support::serve(Path::new(&url), &[]);
    let dir = tempfile::tempdir().unwrap();
    let options = SyncOptions::new(server.address.clone(), "erin", "erin-password");
    let mut client = support::client(dir.path(), "erin");
    client.sync(&options).await.unwrap();
    let ended = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    assert!(
        ended.len() >= 2,
        "the server's worker and login connections"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        client.sync(&options).await.unwrap();
    }
}
