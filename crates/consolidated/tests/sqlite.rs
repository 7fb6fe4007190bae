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
