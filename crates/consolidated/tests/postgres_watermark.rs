//! PostgreSQL guarantees beyond the shared suite: no row is missed when transactions
//! commit out of order, one sync per client at a time across connections, and cleanup
//! never makes a sync wait yet keeps every tombstone a sync in flight needs (checked by
//! the lock waits `pg_locks` shows, not by timing).
//!
//! The late-commit property test interleaves writers that hold transactions open, commit
//! in random order, and clients that sync between their steps, from a seed; after every
//! sync, the client's copy must equal the committed state of its partition when the sync
//! began. Seeds: `ROWSYNC_LATE_COMMIT_SEEDS` (default 8; thousands for a long run), or
//! replay one with `ROWSYNC_LATE_COMMIT_SEED=n`. Steps per seed:
//! `ROWSYNC_LATE_COMMIT_STEPS` (default 60).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rowsync_consolidated::postgres::value::Read;
use rowsync_consolidated::postgres::{PostgresConnection, PostgresConsolidated};
use rowsync_consolidated::{
    synchronize_collect, Consolidated, ConsolidatedConnection, ScriptEntry, SyncError, SyncRequest,
    TableInit,
};
use rowsync_protocol::{Row, TableUpload, Value};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

const USERS: [&str; 2] = ["u0", "u1"];

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// A fresh database with `items` partitioned by `owner`; returns its URL.
async fn fresh_items_database() -> String {
    let url = rowsync_testkit::fresh_database("watermark").await;
    connect(&url)
        .await
        .batch_execute("CREATE TABLE items (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, value INTEGER NOT NULL)")
        .await
        .unwrap();
    let mut connection = PostgresConsolidated::new(&url).connect().await.unwrap();
    connection
        .init_table(&TableInit {
            table: "items".into(),
            partition_column: "owner".into(),
            script_version: "v1".into(),
        })
        .await
        .unwrap();
    url
}

/// A simulated client: its copy of its partition, kept by applying downloads.
struct Replica {
    client_id: String,
    user: &'static str,
    rows: BTreeMap<i64, Row>,
    watermark: i64,
    upload_sequence: u64,
}

impl Replica {
    fn new(client_id: &str, user: &'static str) -> Replica {
        Replica {
            client_id: client_id.into(),
            user,
            rows: BTreeMap::new(),
            watermark: 0,
            upload_sequence: 0,
        }
    }

    fn request(&mut self, tables: Vec<TableUpload>) -> Arc<SyncRequest> {
        self.upload_sequence += 1;
        Arc::new(SyncRequest {
            client_id: self.client_id.clone(),
            user: self.user.into(),
            script_version: "v1".into(),
            last_download_watermark: self.watermark,
            upload_sequence: self.upload_sequence,
            tables,
            auth_parameters: Vec::new(),
        })
    }

    async fn sync(&mut self, backend: &mut impl ConsolidatedConnection) {
        let request = self.request(vec![]);
        let outcome = synchronize_collect(backend, request).await.unwrap();
        for download in outcome.downloads {
            for key in download.deletes {
                let Value::Int(id) = key[0] else {
                    panic!("integer key")
                };
                self.rows.remove(&id);
            }
            for row in download.upserts {
                let Value::Int(id) = row[0] else {
                    panic!("integer key")
                };
                self.rows.insert(id, row);
            }
        }
        self.watermark = outcome.watermark;
    }
}

/// The committed rows of one partition, as an autocommit reader sees them now.
async fn committed(reader: &Client, user: &str) -> BTreeMap<i64, Row> {
    reader
        .query(
            "SELECT id, owner, value FROM items WHERE owner = $1 ORDER BY id",
            &[&user],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| {
            let values: Row = (0..3).map(|i| row.get::<_, Read>(i).0).collect();
            let Value::Int(id) = values[0] else {
                panic!("integer key")
            };
            (id, values)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_late_is_downloaded_by_the_next_sync() {
    let url = fresh_items_database().await;
    let mut backend = PostgresConsolidated::new(&url).connect().await.unwrap();
    let slow = connect(&url).await;
    let fast = connect(&url).await;
    let mut replica = Replica::new("c1", "u0");

    slow.batch_execute("BEGIN; INSERT INTO items VALUES (1, 'u0', 1)")
        .await
        .unwrap();
    fast.batch_execute("INSERT INTO items VALUES (2, 'u0', 2)")
        .await
        .unwrap();
    replica.sync(&mut backend).await;
    assert_eq!(replica.rows.keys().copied().collect::<Vec<_>>(), vec![2]);
    fast.batch_execute("INSERT INTO items VALUES (3, 'u0', 3)")
        .await
        .unwrap();
    replica.sync(&mut backend).await;
    replica.sync(&mut backend).await;
    assert_eq!(replica.rows.keys().copied().collect::<Vec<_>>(), vec![2, 3]);

    // Row 1 was written before rows 2 and 3 but commits after the syncs that saw them.
    slow.batch_execute("COMMIT").await.unwrap();
    replica.sync(&mut backend).await;
    assert_eq!(
        replica.rows.keys().copied().collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_commits_are_never_missed_property() {
    let seeds: Vec<u64> = match std::env::var("ROWSYNC_LATE_COMMIT_SEED") {
        Ok(seed) => vec![seed.parse().expect("a seed number")],
        Err(_) => {
            let count = std::env::var("ROWSYNC_LATE_COMMIT_SEEDS")
                .map_or(8, |n| n.parse().expect("a count"));
            (0..count).collect()
        }
    };
    let steps: usize =
        std::env::var("ROWSYNC_LATE_COMMIT_STEPS").map_or(60, |n| n.parse().expect("a count"));
    let url = fresh_items_database().await;
    for seed in seeds {
        run_seed(&url, seed, steps).await;
    }
}

/// One writer connection: idle, or inside a transaction with uncommitted changes.
struct Writer {
    client: Client,
    open: bool,
    /// Ids this writer created (committed or not); writers never touch each other's
    /// rows, so a held transaction never blocks the test.
    ids: Vec<i64>,
}

async fn run_seed(url: &str, seed: u64, steps: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let reader = connect(url).await;
    reader.batch_execute("DELETE FROM items").await.unwrap();
    let mut backend = PostgresConsolidated::new(url).connect().await.unwrap();
    let mut writers = Vec::new();
    for _ in 0..3 {
        writers.push(Writer {
            client: connect(url).await,
            open: false,
            ids: Vec::new(),
        });
    }
    let mut replicas = [
        Replica::new(&format!("s{seed}-a"), USERS[0]),
        Replica::new(&format!("s{seed}-b"), USERS[0]),
        Replica::new(&format!("s{seed}-c"), USERS[1]),
    ];
    let mut next_id = (seed as i64) * 1_000_000;
    let mut trace = Vec::new();
    for step in 0..steps {
        let action = rng.gen_range(0..10);
        let w = rng.gen_range(0..writers.len());
        match action {
            // A change, in a transaction that may stay open across later steps.
            0..=4 => {
                let writer = &mut writers[w];
                if !writer.open {
                    writer.client.batch_execute("BEGIN").await.unwrap();
                    writer.open = true;
                }
                let owner = USERS[rng.gen_range(0..USERS.len())];
                let sql = match (rng.gen_range(0..4), writer.ids.is_empty()) {
                    (0 | 1, _) | (_, true) => {
                        next_id += 1;
                        writer.ids.push(next_id);
                        format!("INSERT INTO items VALUES ({next_id}, '{owner}', {step})")
                    }
                    (2, false) => {
                        let id = writer.ids[rng.gen_range(0..writer.ids.len())];
                        format!(
                            "UPDATE items SET value = {step}, owner = '{owner}' WHERE id = {id}"
                        )
                    }
                    _ => {
                        let id = writer.ids.swap_remove(rng.gen_range(0..writer.ids.len()));
                        format!("DELETE FROM items WHERE id = {id}")
                    }
                };
                trace.push(format!("step {step}: writer {w}: {sql}"));
                writer.client.batch_execute(&sql).await.unwrap();
            }
            5..=6 => {
                let writer = &mut writers[w];
                if writer.open {
                    let end = if rng.gen_range(0..5) == 0 {
                        "ROLLBACK"
                    } else {
                        "COMMIT"
                    };
                    trace.push(format!("step {step}: writer {w}: {end}"));
                    writer.client.batch_execute(end).await.unwrap();
                    writer.open = false;
                    if end == "ROLLBACK" {
                        // Forget ids that never existed (the rollback undid their inserts).
                        let existing = committed_ids(&reader).await;
                        writer.ids.retain(|id| existing.contains(id));
                    }
                }
            }
            _ => {
                let r = rng.gen_range(0..replicas.len());
                let replica = &mut replicas[r];
                let expected = committed(&reader, replica.user).await;
                replica.sync(&mut backend).await;
                trace.push(format!(
                    "step {step}: replica {r} synced to watermark {}",
                    replica.watermark
                ));
                assert_eq!(
                    replica.rows, expected,
                    "seed {seed}, step {step}: replica {r} differs from the committed partition at sync time\n{}",
                    trace.join("\n")
                );
            }
        }
    }
    for writer in &mut writers {
        if writer.open {
            writer.client.batch_execute("COMMIT").await.unwrap();
        }
    }
    for (r, replica) in replicas.iter_mut().enumerate() {
        replica.sync(&mut backend).await;
        assert_eq!(
            replica.rows,
            committed(&reader, replica.user).await,
            "seed {seed}: replica {r} after all commits\n{}",
            trace.join("\n")
        );
    }
}

async fn committed_ids(reader: &Client) -> Vec<i64> {
    reader
        .query("SELECT id::bigint FROM items", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_concurrent_sync_of_one_client_is_refused_and_changes_nothing() {
    let url = fresh_items_database().await;
    let mut backend = PostgresConsolidated::new(&url).connect().await.unwrap();
    // Another connection (as another server process would) is syncing client c1.
    let other = connect(&url).await;
    other
        .batch_execute("BEGIN; SELECT pg_advisory_xact_lock(7262, hashtext('c1'))")
        .await
        .unwrap();
    let mut replica = Replica::new("c1", "u0");
    let upload = TableUpload {
        table: "items".into(),
        columns: vec!["id".into(), "owner".into(), "value".into()],
        key_columns: vec!["id".into()],
        inserts: vec![vec![Value::Int(7), "u0".into(), Value::Int(7)]],
        ..TableUpload::default()
    };
    let refused = synchronize_collect(&mut backend, replica.request(vec![upload.clone()])).await;
    match refused {
        Err(SyncError::AlreadySynchronizing { client_id }) => assert_eq!(client_id, "c1"),
        other => panic!("expected already synchronizing, got {other:?}"),
    }
    let reader = connect(&url).await;
    assert!(
        committed(&reader, "u0").await.is_empty(),
        "nothing was applied"
    );
    // Another client is not affected, and c1 succeeds once the other sync ended.
    let mut neighbour = Replica::new("c2", "u0");
    neighbour.sync(&mut backend).await;
    other.batch_execute("ROLLBACK").await.unwrap();
    replica.upload_sequence -= 1;
    synchronize_collect(&mut backend, replica.request(vec![upload]))
        .await
        .unwrap();
    assert_eq!(committed(&reader, "u0").await.len(), 1);
}

/// Syncs of client ids starting with `held` stop in `end_synchronization` (download read,
/// subscription written, transaction open) until the returned connection releases
/// advisory lock 4242.
async fn hold_syncs_at_their_end(url: &str) -> Client {
    let mut admin = PostgresConsolidated::new(url).connect().await.unwrap();
    admin
        .set_script(&ScriptEntry {
            script_version: "v1".into(),
            table: String::new(),
            event: "end_synchronization".into(),
            script: "SELECT count(*) FROM (SELECT pg_advisory_xact_lock_shared(4242) \
                     WHERE :client_id LIKE 'held%') AS held"
                .into(),
        })
        .await
        .unwrap();
    let holder = connect(url).await;
    holder
        .batch_execute("SELECT pg_advisory_lock(4242)")
        .await
        .unwrap();
    holder
}

/// A backend connection and its server process id.
async fn connection_with_pid(url: &str) -> (PostgresConnection, i32) {
    let mut connection = PostgresConsolidated::new(url).connect().await.unwrap();
    let pid = connection
        .client()
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    (connection, pid)
}

async fn lock_waits(observer: &Client, pid: i32) -> i64 {
    observer
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted",
            &[&pid],
        )
        .await
        .unwrap()
        .get(0)
}

/// Until the task ended or backend `pid` waits for a lock.
async fn until_ended_or_waiting<T>(observer: &Client, pid: i32, task: &JoinHandle<T>) {
    while !task.is_finished() && lock_waits(observer, pid).await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs `work` (on the connection of backend `pid`) to its end, failing as soon as that
/// backend waits for a lock.
async fn without_lock_waits<T: Send + 'static>(
    observer: &Client,
    pid: i32,
    what: &str,
    work: impl Future<Output = T> + Send + 'static,
) -> T {
    let task = tokio::spawn(work);
    until_ended_or_waiting(observer, pid, &task).await;
    assert!(task.is_finished(), "{what} waits for a lock");
    task.await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_makes_no_sync_wait_while_a_long_sync_runs() {
    let url = fresh_items_database().await;
    let holder = hold_syncs_at_their_end(&url).await;
    let observer = connect(&url).await;
    let mut backend = PostgresConsolidated::new(&url).connect().await.unwrap();
    let mut short = Replica::new("short", "u0");
    short.sync(&mut backend).await;
    connect(&url)
        .await
        .batch_execute("INSERT INTO items VALUES (1, 'u0', 1); DELETE FROM items WHERE id = 1")
        .await
        .unwrap();

    // A long sync holds its transaction open.
    let (mut long_connection, long_pid) = connection_with_pid(&url).await;
    let long_request = Replica::new("held-long", "u1").request(vec![]);
    let long =
        tokio::spawn(async move { synchronize_collect(&mut long_connection, long_request).await });
    until_ended_or_waiting(&observer, long_pid, &long).await;
    assert_eq!(
        lock_waits(&observer, long_pid).await,
        1,
        "the long sync is held"
    );

    // Cleanup starts, then a 1-row sync runs to its end while the long one is still open.
    let (mut cleaner, cleaner_pid) = connection_with_pid(&url).await;
    let cleanup = tokio::spawn(async move { cleaner.cleanup().await });
    until_ended_or_waiting(&observer, cleaner_pid, &cleanup).await;
    let (mut syncer, syncer_pid) = connection_with_pid(&url).await;
    let request = short.request(vec![TableUpload {
        table: "items".into(),
        columns: vec!["id".into(), "owner".into(), "value".into()],
        key_columns: vec!["id".into()],
        inserts: vec![vec![Value::Int(2), "u0".into(), Value::Int(2)]],
        ..TableUpload::default()
    }]);
    let outcome = without_lock_waits(&observer, syncer_pid, "the 1-row sync", async move {
        synchronize_collect(&mut syncer, request).await
    })
    .await;
    assert!(outcome.is_ok(), "{:?}", outcome.err());
    assert!(!long.is_finished(), "the long sync has not committed yet");
    assert!(
        cleanup.is_finished(),
        "cleanup did not wait for the long sync either"
    );
    cleanup.await.unwrap().unwrap();
    let reader = connect(&url).await;
    assert_eq!(
        committed(&reader, "u0").await.keys().collect::<Vec<_>>(),
        [&2]
    );

    holder
        .batch_execute("SELECT pg_advisory_unlock(4242)")
        .await
        .unwrap();
    long.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_keeps_the_tombstones_a_first_sync_in_flight_needs() {
    let url = fresh_items_database().await;
    let holder = hold_syncs_at_their_end(&url).await;
    let observer = connect(&url).await;
    let mut backend = PostgresConsolidated::new(&url).connect().await.unwrap();
    let deleter = connect(&url).await;
    deleter
        .batch_execute("INSERT INTO items VALUES (1, 'u0', 1)")
        .await
        .unwrap();
    let mut other = Replica::new("other", "u1");
    other.sync(&mut backend).await;

    // A transaction deletes row 1 and stays open while a new client's first sync reads
    // the row and takes its watermark (at or below the deleter's id).
    deleter
        .batch_execute("BEGIN; DELETE FROM items WHERE id = 1")
        .await
        .unwrap();
    let (mut first_connection, first_pid) = connection_with_pid(&url).await;
    let mut fresh = Replica::new("held-new", "u0");
    let first = tokio::spawn(async move {
        fresh.sync(&mut first_connection).await;
        (fresh, first_connection)
    });
    until_ended_or_waiting(&observer, first_pid, &first).await;
    assert_eq!(
        lock_waits(&observer, first_pid).await,
        1,
        "the first sync is held"
    );
    deleter.batch_execute("COMMIT").await.unwrap();
    // Every committed subscription has passed the delete; only the sync in flight needs
    // its tombstone.
    other.sync(&mut backend).await;
    other.sync(&mut backend).await;

    let (mut cleaner, cleaner_pid) = connection_with_pid(&url).await;
    without_lock_waits(&observer, cleaner_pid, "cleanup", async move {
        cleaner.cleanup().await.unwrap()
    })
    .await;
    let reader = connect(&url).await;
    let tombstones: i64 = reader
        .query_one("SELECT count(*) FROM rs_tombstone_items WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        tombstones, 1,
        "the first sync in flight needs the tombstone"
    );

    holder
        .batch_execute("SELECT pg_advisory_unlock(4242)")
        .await
        .unwrap();
    let (mut fresh, mut first_connection) = first.await.unwrap();
    assert_eq!(fresh.rows.keys().collect::<Vec<_>>(), [&1]);
    fresh.sync(&mut first_connection).await;
    assert!(fresh.rows.is_empty(), "the delete reached the new client");
}

/// The figure for the hardening note, by hand (it takes 30 s):
/// `cargo test -p rowsync-consolidated --test postgres_watermark -- --ignored --nocapture
/// a_one_row_sync_during_cleanup_with_a_30_second_sync_running`. Prints how long a 1-row
/// sync takes once cleanup started while another sync holds its transaction for 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a 30 s measurement, run by hand"]
async fn a_one_row_sync_during_cleanup_with_a_30_second_sync_running() {
    let url = fresh_items_database().await;
    let holder = hold_syncs_at_their_end(&url).await;
    let observer = connect(&url).await;
    let mut backend = PostgresConsolidated::new(&url).connect().await.unwrap();
    let mut short = Replica::new("short", "u0");
    short.sync(&mut backend).await;
    let (mut long_connection, long_pid) = connection_with_pid(&url).await;
    let long_request = Replica::new("held-long", "u1").request(vec![]);
    let long_started = std::time::Instant::now();
    let long =
        tokio::spawn(async move { synchronize_collect(&mut long_connection, long_request).await });
    until_ended_or_waiting(&observer, long_pid, &long).await;
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        holder
            .batch_execute("SELECT pg_advisory_unlock(4242)")
            .await
            .unwrap();
    });
    let (mut cleaner, cleaner_pid) = connection_with_pid(&url).await;
    let cleanup = tokio::spawn(async move { cleaner.cleanup().await });
    until_ended_or_waiting(&observer, cleaner_pid, &cleanup).await;
    let request = short.request(vec![TableUpload {
        table: "items".into(),
        columns: vec!["id".into(), "owner".into(), "value".into()],
        key_columns: vec!["id".into()],
        inserts: vec![vec![Value::Int(2), "u0".into(), Value::Int(2)]],
        ..TableUpload::default()
    }]);
    let started = std::time::Instant::now();
    synchronize_collect(&mut backend, request).await.unwrap();
    let one_row = started.elapsed();
    long.await.unwrap().unwrap();
    let long_time = long_started.elapsed();
    cleanup.await.unwrap().unwrap();
    release.await.unwrap();
    println!(
        "1-row sync during cleanup: {:.3} s (the long sync ran {:.1} s)",
        one_row.as_secs_f64(),
        long_time.as_secs_f64()
    );
}
