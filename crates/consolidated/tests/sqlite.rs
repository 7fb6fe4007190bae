//! The conformance suite against the SQLite backend, on a fresh file per test.

mod conformance;

use conformance::{Factory, RawSql};
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_protocol::Value;
use tempfile::TempDir;

struct SqliteFactory;

/// A plain connection to the consolidated file; owns the directory holding it.
struct SqliteSql {
    connection: rusqlite::Connection,
    _directory: TempDir,
}

impl Factory for SqliteFactory {
    type Backend = SqliteConsolidated;
    type Sql = SqliteSql;

    async fn create() -> (SqliteConsolidated, SqliteSql) {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let backend = SqliteConsolidated::new(directory.path().join("consolidated.db"));
        let connection = backend.open_blocking().expect("open the consolidated file");
        let sql = SqliteSql {
            connection,
            _directory: directory,
        };
        (backend, sql)
    }
}

impl RawSql for SqliteSql {
    async fn execute(&mut self, sql: &str) {
        self.connection
            .execute_batch(sql)
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }

    async fn query_rows(&mut self, sql: &str) -> Vec<Vec<Value>> {
        let mut statement = self
            .connection
            .prepare(sql)
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
        let width = statement.column_count();
        statement
            .query_map([], |row| {
                (0..width).map(|i| row.get::<_, Value>(i)).collect()
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .unwrap_or_else(|error| panic!("{sql}: {error}"))
    }
}

conformance::conformance_suite!(SqliteFactory);

/// A cycle of foreign keys (SQLite resolves `REFERENCES` lazily, so the first table may
/// name the second before it exists): `PRAGMA defer_foreign_keys` lets every key wait for
/// the sync's commit, so `init` accepts any cycle and the rows go up together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_of_foreign_keys_is_deferred_for_the_sync() {
    conformance::a_cycle_of_deferrable_keys_syncs_in_one_transaction::<SqliteFactory>(&[
        "CREATE TABLE store (store_id INTEGER PRIMARY KEY, rep TEXT NOT NULL, manager_id INTEGER, \
         FOREIGN KEY (manager_id) REFERENCES staff (staff_id))",
        "CREATE TABLE staff (staff_id INTEGER PRIMARY KEY, rep TEXT NOT NULL, store_id INTEGER, \
         FOREIGN KEY (store_id) REFERENCES store (store_id))",
    ])
    .await;
}

/// Every statement text the logging backends ran, across this test binary.
fn statement_log() -> &'static std::sync::Mutex<Vec<String>> {
    static LOG: std::sync::OnceLock<std::sync::Mutex<Vec<String>>> = std::sync::OnceLock::new();
    LOG.get_or_init(Default::default)
}

/// Like [`SqliteFactory`], with every statement's text logged.
struct LoggingSqliteFactory;

impl Factory for LoggingSqliteFactory {
    type Backend = SqliteConsolidated;
    type Sql = SqliteSql;

    async fn create() -> (SqliteConsolidated, SqliteSql) {
        let (backend, sql) = SqliteFactory::create().await;
        let backend = backend.with_statement_log(std::sync::Arc::new(|text: &str| {
            statement_log().lock().unwrap().push(text.to_string())
        }));
        (backend, sql)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_parameters_never_appear_in_a_statement_text() {
    conformance::hostile_values_in_every_parameter_are_data_not_sql::<LoggingSqliteFactory>().await;
    let log = statement_log().lock().unwrap().clone();
    assert!(
        log.iter()
            .any(|text| text.contains("INSERT INTO orders (id, rep, item")),
        "the log holds the row scripts' statements ({} statements)",
        log.len()
    );
    for payload in conformance::PAYLOADS {
        for text in &log {
            assert!(
                !text.contains(payload),
                "a hostile value appears in a statement's text: {text}"
            );
        }
    }
}

/// VM steps of every statement the step-counting backends ran, across this test binary,
/// in all and in the statements over the scratch deletes.
fn steps() -> &'static [std::sync::atomic::AtomicU64; 2] {
    static STEPS: [std::sync::atomic::AtomicU64; 2] = [
        std::sync::atomic::AtomicU64::new(0),
        std::sync::atomic::AtomicU64::new(0),
    ];
    &STEPS
}

/// Like [`SqliteFactory`], counting every statement's virtual-machine steps.
struct StepCountingSqliteFactory;

impl Factory for StepCountingSqliteFactory {
    type Backend = SqliteConsolidated;
    type Sql = SqliteSql;

    async fn create() -> (SqliteConsolidated, SqliteSql) {
        let (backend, sql) = SqliteFactory::create().await;
        let backend = backend.with_statement_steps(std::sync::Arc::new(|text: &str, count| {
            use std::sync::atomic::Ordering::Relaxed;
            steps()[0].fetch_add(count, Relaxed);
            if text.contains("rs_stage_delete_orders") {
                steps()[1].fetch_add(count, Relaxed);
            }
        }));
        (backend, sql)
    }
}

/// The steps (all, over the scratch deletes) of a sync deleting `rows` rows of a table
/// of `rows + 1`, with `script` as `upload_delete` when given.
async fn steps_deleting(rows: i64, script: Option<&str>) -> [u64; 2] {
    use std::sync::atomic::Ordering::Relaxed;
    let before = [steps()[0].load(Relaxed), steps()[1].load(Relaxed)];
    conformance::deletes_in_one_sync::<StepCountingSqliteFactory>(rows, script).await;
    [
        steps()[0].load(Relaxed) - before[0],
        steps()[1].load(Relaxed) - before[1],
    ]
}

/// The `upload_delete` script of `orders` as `init` wrote it before 2026-11-24: an
/// `EXISTS` over the scratch keys for each row of the table.
const DELETE_SCRIPT_BEFORE: &str = "DELETE FROM \"orders\" WHERE \"rep\" = :user AND EXISTS (SELECT 1 FROM {upload} AS u WHERE u.\"id\" = \"orders\".\"id\")";

/// Deleting N rows through one sync costs work in proportion to N (counted in SQLite's
/// virtual-machine steps, not timed): four times the rows, about four times the steps.
/// Before the fix the scratch keys were scanned once per table row, N² (16 times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_rows_through_a_sync_takes_steps_in_proportion_to_the_rows() {
    for script in [None, Some(DELETE_SCRIPT_BEFORE)] {
        let small = steps_deleting(500, script).await;
        let large = steps_deleting(2_000, script).await;
        let growth = |i: usize| large[i] as f64 / small[i] as f64;
        eprintln!(
            "delete script {}: steps 500 rows {small:?}, 2,000 rows {large:?}; growth x{:.2} in all, x{:.2} over the scratch deletes",
            if script.is_some() { "as before" } else { "default" },
            growth(0),
            growth(1)
        );
        assert!(
            growth(0) < 6.0 && growth(1) < 6.0,
            "four times the rows took x{:.1} the steps (x{:.1} over the scratch deletes): not linear",
            growth(0),
            growth(1)
        );
    }
}

/// Held transfers are held and released by many connections at once (one per syncing
/// client): none of them fails with "database is locked". Releasing reads the held row
/// before deleting it; in a deferred transaction a commit by another connection between
/// the two makes the delete fail at once (SQLite's stale snapshot; no busy timeout
/// waits for it), which is how a release once failed on a real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_transfers_held_and_released_at_once_by_many_connections_all_succeed() {
    use rowsync_consolidated::{Consolidated, ConsolidatedConnection, Direction, HeldTransfer};
    const CONNECTIONS: usize = 6;
    const ROUNDS: usize = 60;
    let (backend, _sql) = SqliteFactory::create().await;
    backend
        .connect()
        .await
        .unwrap()
        .install_system_tables()
        .await
        .unwrap();
    let tasks = (0..CONNECTIONS).map(|task| {
        let backend = backend.clone();
        tokio::spawn(async move {
            let mut connection = backend.connect().await.unwrap();
            let bytes = vec![task as u8; 4096];
            for round in 0..ROUNDS {
                let held = HeldTransfer {
                    client_id: format!("client-{task}"),
                    user: "u".into(),
                    transfer_id: format!("transfer-{round}"),
                    length: bytes.len() as u64,
                    sha256: vec![0; 32],
                    created_unix_ms: 1,
                };
                let direction = Direction::ALL[round % 2];
                let held_now = connection
                    .hold_transfer(direction, &held, &bytes, u64::MAX)
                    .await
                    .unwrap_or_else(|error| panic!("hold, task {task} round {round}: {error}"));
                assert!(held_now);
                let released = connection
                    .release_held_transfer(direction, &held.client_id, &held.transfer_id)
                    .await
                    .unwrap_or_else(|error| panic!("release, task {task} round {round}: {error}"));
                assert!(
                    released,
                    "task {task} round {round}: the held row was found"
                );
            }
        })
    });
    for task in futures_util::future::join_all(tasks).await {
        task.expect("a task that held and released");
    }
}
