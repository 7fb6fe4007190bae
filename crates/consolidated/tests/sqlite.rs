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
