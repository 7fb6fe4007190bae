//! PostgreSQL guarantees beyond the shared suite: no row is missed when transactions
//! commit out of order, and one sync per client at a time across connections.
//!
//! The late-commit property test interleaves writers that hold transactions open, commit
//! in random order, and clients that sync between their steps, from a seed; after every
//! sync, the client's copy must equal the committed state of its partition when the sync
//! began. Seeds: `ROWSYNC_LATE_COMMIT_SEEDS` (default 8; thousands for a long run), or
//! replay one with `ROWSYNC_LATE_COMMIT_SEED=n`. Steps per seed:
//! `ROWSYNC_LATE_COMMIT_STEPS` (default 60).

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rowsync_consolidated::postgres::value::Read;
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::{
    synchronize_collect, Consolidated, ConsolidatedConnection, SyncError, SyncRequest, TableInit,
};
use rowsync_protocol::{Row, TableUpload, Value};
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
            script_version: Some("v1".into()),
            based_on: None,
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
