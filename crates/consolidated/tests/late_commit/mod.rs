//! The late-commit guarantees every backend must keep beyond the shared suite, written
//! once over [`Database`]: no row is missed when transactions commit out of order, and
//! one sync per client at a time across connections. Each backend's test file
//! implements [`Database`] and instantiates the tests with [`late_commit_tests!`].
//!
//! The property test interleaves writers that hold transactions open, commit in random
//! order, and clients that sync between their steps, from a seed; after every sync, the
//! client's copy must equal the committed state of its partition when the sync began.
//! Seeds: `ROWSYNC_LATE_COMMIT_SEEDS` (default 8; thousands for a long run), or replay
//! one with `ROWSYNC_LATE_COMMIT_SEED=n`. Steps per seed: `ROWSYNC_LATE_COMMIT_STEPS`
//! (default 60).

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rowsync_consolidated::{
    sync_and_collect, ConsolidatedConnection, SyncError, SyncRequest, TableInit,
};
use rowsync_protocol::{Row, TableUpload, Value};

const USERS: [&str; 2] = ["u0", "u1"];

/// The table every test uses, partitioned by `owner`.
pub const ITEMS_DDL: &str =
    "CREATE TABLE items (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, value INTEGER NOT NULL)";

/// One backend's database under test, made with `items` created and initialised.
pub trait Database: Sized {
    type Sql: Sql;
    type Backend: ConsolidatedConnection;
    /// A fresh database with [`ITEMS_DDL`] created and `init_table` run on it.
    fn fresh() -> impl Future<Output = Self>;
    /// A plain connection, for writers and the reader.
    fn connect(&self) -> impl Future<Output = Self::Sql>;
    /// A sync connection of the backend.
    fn backend(&self) -> impl Future<Output = Self::Backend>;
    /// Statements that, run on a connection, open a transaction holding the lock that
    /// a sync of client `c1` takes.
    const HOLD_C1_SYNC_LOCK: &'static str;
}

/// A plain connection to the database.
pub trait Sql {
    /// Runs one or more statements; panics on failure.
    fn execute(&mut self, sql: &str) -> impl Future<Output = ()>;
    /// `SELECT id, owner, value FROM items WHERE owner = user`, as protocol values.
    fn items_of(&mut self, user: &str) -> impl Future<Output = Vec<Row>>;
    /// Every id in `items`.
    fn ids(&mut self) -> impl Future<Output = Vec<i64>>;
    /// `SELECT id, grp, value FROM gitems` of the groups `user` is a member of now
    /// (`GROUPS_DDL`), as protocol values, by id.
    fn group_items_of(&mut self, user: &str) -> impl Future<Output = Vec<Row>>;
}

/// Rows in groups, and which users are members of which groups (`GROUP_RULES`).
pub const GROUPS_DDL: &str = "
CREATE TABLE gitems (id INTEGER PRIMARY KEY, grp VARCHAR(16) NOT NULL, value INTEGER NOT NULL);
CREATE TABLE gmember (user_name VARCHAR(16) NOT NULL, grp VARCHAR(16) NOT NULL, PRIMARY KEY (user_name, grp))";

pub const GROUP_RULES: &str = r#"
[groups.g]
table = "gmember"
user_column = "user_name"
group_column = "grp"

[tables.gitems]
rule = "group"
column = "grp"
group = "g"
"#;

const GROUPS: [&str; 3] = ["g0", "g1", "g2"];

/// The `items` table's initialisation, the same on every backend.
pub fn items_init() -> TableInit {
    TableInit {
        table: "items".into(),
        partition_column: "owner".into(),
        script_version: Some("v1".into()),
        based_on: None,
    }
}

/// Defines the late-commit tests for one [`Database`].
macro_rules! late_commit_tests {
    ($database:ty) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_row_committed_late_is_downloaded_by_the_next_sync() {
            late_commit::a_row_committed_late_is_downloaded_by_the_next_sync::<$database>().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn late_commits_are_never_missed_property() {
            late_commit::late_commits_are_never_missed_property::<$database>().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn late_commits_and_membership_changes_are_never_missed_property() {
            late_commit::late_membership_changes_are_never_missed_property::<$database>().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_second_concurrent_sync_of_one_client_is_refused_and_changes_nothing() {
            late_commit::a_second_concurrent_sync_of_one_client_is_refused::<$database>().await;
        }
    };
}

/// A simulated client: its copy of its partition, kept by applying downloads.
pub struct Replica {
    pub client_id: String,
    pub user: &'static str,
    /// The table whose downloads it applies.
    pub table: &'static str,
    pub rows: BTreeMap<i64, Row>,
    pub watermark: i64,
    pub upload_sequence: u64,
}

impl Replica {
    pub fn new(client_id: &str, user: &'static str) -> Replica {
        Replica {
            client_id: client_id.into(),
            user,
            table: "items",
            rows: BTreeMap::new(),
            watermark: 0,
            upload_sequence: 0,
        }
    }

    pub fn request(&mut self, tables: Vec<TableUpload>) -> Arc<SyncRequest> {
        self.upload_sequence += 1;
        Arc::new(SyncRequest {
            client_id: self.client_id.clone(),
            user: self.user.into(),
            script_version: "v1".into(),
            last_download_watermark: self.watermark,
            upload_sequence: self.upload_sequence,
            tables,
            auth_parameters: Vec::new(),
            client_ids_per_user_max: None,
            transfer_id: None,
            check_identity: false,
            refused_rows_max: 0,
            key_ranges: None,
            sync_tables: Default::default(),
        })
    }

    pub async fn sync(&mut self, backend: &mut impl ConsolidatedConnection) {
        let request = self.request(vec![]);
        let outcome = sync_and_collect(backend, request).await.unwrap();
        for download in outcome.downloads {
            if download.table != self.table {
                continue;
            }
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
pub async fn committed(reader: &mut impl Sql, user: &str) -> BTreeMap<i64, Row> {
    reader
        .items_of(user)
        .await
        .into_iter()
        .map(|values| {
            let Value::Int(id) = values[0] else {
                panic!("integer key")
            };
            (id, values)
        })
        .collect()
}

pub async fn a_row_committed_late_is_downloaded_by_the_next_sync<D: Database>() {
    let database = D::fresh().await;
    let mut backend = database.backend().await;
    let mut slow = database.connect().await;
    let mut fast = database.connect().await;
    let mut replica = Replica::new("c1", "u0");

    slow.execute("BEGIN; INSERT INTO items VALUES (1, 'u0', 1)")
        .await;
    fast.execute("INSERT INTO items VALUES (2, 'u0', 2)").await;
    replica.sync(&mut backend).await;
    assert_eq!(replica.rows.keys().copied().collect::<Vec<_>>(), vec![2]);
    fast.execute("INSERT INTO items VALUES (3, 'u0', 3)").await;
    replica.sync(&mut backend).await;
    replica.sync(&mut backend).await;
    assert_eq!(replica.rows.keys().copied().collect::<Vec<_>>(), vec![2, 3]);

    // Row 1 was written before rows 2 and 3 but commits after the syncs that saw them.
    slow.execute("COMMIT").await;
    replica.sync(&mut backend).await;
    assert_eq!(
        replica.rows.keys().copied().collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
}

pub async fn late_commits_are_never_missed_property<D: Database>() {
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
    let database = D::fresh().await;
    for seed in seeds {
        run_seed(&database, seed, steps).await;
    }
}

/// One writer connection: idle, or inside a transaction with uncommitted changes.
struct Writer<S> {
    sql: S,
    open: bool,
    /// Ids this writer created (committed or not); writers never touch each other's
    /// rows, so a held transaction never blocks the test.
    ids: Vec<i64>,
}

async fn run_seed<D: Database>(database: &D, seed: u64, steps: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut reader = database.connect().await;
    reader.execute("DELETE FROM items").await;
    let mut backend = database.backend().await;
    let mut writers = Vec::new();
    for _ in 0..3 {
        writers.push(Writer {
            sql: database.connect().await,
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
                    writer.sql.execute("BEGIN").await;
                    writer.open = true;
                }
                let owner = USERS[rng.gen_range(0..USERS.len())];
                let sql = random_change(&mut rng, writer, &mut next_id, owner, step);
                trace.push(format!("step {step}: writer {w}: {sql}"));
                writer.sql.execute(&sql).await;
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
                    writer.sql.execute(end).await;
                    writer.open = false;
                    if end == "ROLLBACK" {
                        // Forget ids that never existed (the rollback undid their inserts).
                        let existing = reader.ids().await;
                        writer.ids.retain(|id| existing.contains(id));
                    }
                }
            }
            _ => {
                let r = rng.gen_range(0..replicas.len());
                let replica = &mut replicas[r];
                let expected = committed(&mut reader, replica.user).await;
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
            writer.sql.execute("COMMIT").await;
        }
    }
    for (r, replica) in replicas.iter_mut().enumerate() {
        replica.sync(&mut backend).await;
        assert_eq!(
            replica.rows,
            committed(&mut reader, replica.user).await,
            "seed {seed}: replica {r} after all commits\n{}",
            trace.join("\n")
        );
    }
}

/// Everything but the transactions' ends: in `gitems` a writer inserts, updates (moving
/// rows between groups) and deletes its own rows; in `gmember` it adds and removes the
/// memberships it owns (user and group numbers summing to its number, modulo 3), so no
/// two writers wait for each other. Replicas sync between steps, and sometimes lose a
/// download (their client never applied it).
pub async fn late_membership_changes_are_never_missed_property<D: Database>() {
    let seeds =
        std::env::var("ROWSYNC_LATE_COMMIT_SEEDS").map_or(8, |n| n.parse().expect("a count"));
    let steps: usize =
        std::env::var("ROWSYNC_LATE_COMMIT_STEPS").map_or(60, |n| n.parse().expect("a count"));
    let database = D::fresh().await;
    database.connect().await.execute(GROUPS_DDL).await;
    let rules = rowsync_consolidated::rules::RuleSet::parse(GROUP_RULES).unwrap();
    database
        .backend()
        .await
        .init_rule_table(&TableInit::new("gitems", "", "v1"), &rules)
        .await
        .unwrap();
    for seed in 0..seeds {
        run_membership_seed(&database, seed, steps).await;
    }
}

async fn run_membership_seed<D: Database>(database: &D, seed: u64, steps: usize) {
    let mut rng = StdRng::seed_from_u64(seed + 1000);
    let mut reader = database.connect().await;
    reader
        .execute("DELETE FROM gitems; DELETE FROM gmember")
        .await;
    let mut backend = database.backend().await;
    let mut writers = Vec::new();
    for _ in 0..3 {
        writers.push(Writer {
            sql: database.connect().await,
            open: false,
            ids: Vec::new(),
        });
    }
    let mut replicas = [
        Replica::new(&format!("m{seed}-a"), USERS[0]),
        Replica::new(&format!("m{seed}-b"), USERS[0]),
        Replica::new(&format!("m{seed}-c"), USERS[1]),
    ];
    for replica in &mut replicas {
        replica.table = "gitems";
    }
    let mut next_id = (seed as i64) * 1_000_000;
    let mut trace = Vec::new();
    let mut memberships = vec![std::collections::BTreeSet::new(); writers.len()];
    for step in 0..steps {
        let w = rng.gen_range(0..writers.len());
        match rng.gen_range(0..12) {
            0..=5 => {
                let writer = &mut writers[w];
                if !writer.open {
                    writer.sql.execute("BEGIN").await;
                    writer.open = true;
                }
                let sql = if rng.gen_range(0..3) == 0 {
                    membership_change(&mut rng, w, &mut memberships[w])
                } else {
                    let group = GROUPS[rng.gen_range(0..GROUPS.len())];
                    random_change(&mut rng, writer, &mut next_id, group, step)
                        .replace("items", "gitems")
                        .replace("owner", "grp")
                };
                trace.push(format!("step {step}: writer {w}: {sql}"));
                writer.sql.execute(&sql).await;
            }
            6..=7 => {
                let writer = &mut writers[w];
                if writer.open {
                    trace.push(format!("step {step}: writer {w}: COMMIT"));
                    writer.sql.execute("COMMIT").await;
                    writer.open = false;
                }
            }
            action => {
                let r = rng.gen_range(0..replicas.len());
                let replica = &mut replicas[r];
                let expected = group_committed(&mut reader, replica.user).await;
                if action == 8 {
                    // A download its client never applies.
                    let kept = (replica.rows.clone(), replica.watermark);
                    replica.sync(&mut backend).await;
                    (replica.rows, replica.watermark) = kept;
                    trace.push(format!("step {step}: replica {r} lost a download"));
                    continue;
                }
                replica.sync(&mut backend).await;
                trace.push(format!(
                    "step {step}: replica {r} synced to {}",
                    replica.watermark
                ));
                assert_eq!(
                    replica.rows, expected,
                    "seed {seed}, step {step}: replica {r} differs from its groups' committed rows\n{}",
                    trace.join("\n")
                );
            }
        }
    }
    for writer in &mut writers {
        if writer.open {
            writer.sql.execute("COMMIT").await;
        }
    }
    for (r, replica) in replicas.iter_mut().enumerate() {
        replica.sync(&mut backend).await;
        assert_eq!(
            replica.rows,
            group_committed(&mut reader, replica.user).await,
            "seed {seed}: replica {r} after all commits\n{}",
            trace.join("\n")
        );
    }
}

/// Adds or removes one of writer `w`'s memberships (`held`: those it has, committed or
/// not). Only an existing row is deleted and only a missing one inserted: InnoDB's gap
/// locks on a missing key would make another writer wait.
fn membership_change(
    rng: &mut StdRng,
    w: usize,
    held: &mut std::collections::BTreeSet<(usize, usize)>,
) -> String {
    let (u, g) = loop {
        let (u, g) = (
            rng.gen_range(0..USERS.len()),
            rng.gen_range(0..GROUPS.len()),
        );
        if (u + g) % 3 == w {
            break (u, g);
        }
    };
    let (user, group) = (USERS[u], GROUPS[g]);
    if held.remove(&(u, g)) {
        format!("DELETE FROM gmember WHERE user_name = '{user}' AND grp = '{group}'")
    } else {
        held.insert((u, g));
        format!("INSERT INTO gmember VALUES ('{user}', '{group}')")
    }
}

async fn group_committed(reader: &mut impl Sql, user: &str) -> BTreeMap<i64, Row> {
    reader
        .group_items_of(user)
        .await
        .into_iter()
        .map(|values| {
            let Value::Int(id) = values[0] else {
                panic!("integer key")
            };
            (id, values)
        })
        .collect()
}

/// An insert, update or delete of one of the writer's own rows.
fn random_change<S>(
    rng: &mut StdRng,
    writer: &mut Writer<S>,
    next_id: &mut i64,
    owner: &str,
    step: usize,
) -> String {
    match (rng.gen_range(0..4), writer.ids.is_empty()) {
        (0 | 1, _) | (_, true) => {
            *next_id += 1;
            writer.ids.push(*next_id);
            format!("INSERT INTO items VALUES ({next_id}, '{owner}', {step})")
        }
        (2, false) => {
            let id = writer.ids[rng.gen_range(0..writer.ids.len())];
            format!("UPDATE items SET value = {step}, owner = '{owner}' WHERE id = {id}")
        }
        _ => {
            let id = writer.ids.swap_remove(rng.gen_range(0..writer.ids.len()));
            format!("DELETE FROM items WHERE id = {id}")
        }
    }
}

pub async fn a_second_concurrent_sync_of_one_client_is_refused<D: Database>() {
    let database = D::fresh().await;
    let mut backend = database.backend().await;
    // Another connection (as another server process would) is syncing client c1.
    let mut other = database.connect().await;
    other.execute(D::HOLD_C1_SYNC_LOCK).await;
    let mut replica = Replica::new("c1", "u0");
    let upload = TableUpload {
        table: "items".into(),
        columns: vec!["id".into(), "owner".into(), "value".into()],
        key_columns: vec!["id".into()],
        inserts: vec![vec![Value::Int(7), "u0".into(), Value::Int(7)]],
        ..TableUpload::default()
    };
    let refused = sync_and_collect(&mut backend, replica.request(vec![upload.clone()])).await;
    match refused {
        Err(SyncError::AlreadySynchronizing { client_id }) => assert_eq!(client_id, "c1"),
        other => panic!("expected already synchronizing, got {other:?}"),
    }
    let mut reader = database.connect().await;
    assert!(
        committed(&mut reader, "u0").await.is_empty(),
        "nothing was applied"
    );
    // Another client is not affected, and c1 succeeds once the other sync ended.
    let mut neighbour = Replica::new("c2", "u0");
    neighbour.sync(&mut backend).await;
    other.execute("ROLLBACK").await;
    replica.upload_sequence -= 1;
    sync_and_collect(&mut backend, replica.request(vec![upload]))
        .await
        .unwrap();
    assert_eq!(committed(&mut reader, "u0").await.len(), 1);
}
