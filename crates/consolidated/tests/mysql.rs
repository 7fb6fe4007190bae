//! The conformance suite against the MySQL backend, on a throwaway MariaDB server (see
//! `rowsync-testkit`), a fresh database per test.

mod conformance;

use conformance::{CastType, Factory, RawSql};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use rowsync_consolidated::mysql::value::read_row;
use rowsync_consolidated::mysql::MysqlConsolidated;
use rowsync_protocol::Value;

struct MysqlFactory;

struct MysqlSql {
    connection: Conn,
}

/// A plain session set up as rowsync's are (quoting, concatenation, UTC).
async fn connect(url: &str) -> Conn {
    let mut connection = Conn::from_url(url)
        .await
        .unwrap_or_else(|error| panic!("connecting to {url}: {error}"));
    connection
        .query_drop(
            "SET SESSION sql_mode = 'ANSI_QUOTES,PIPES_AS_CONCAT,STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION', time_zone = '+00:00'",
        )
        .await
        .expect("session settings");
    connection
}

impl Factory for MysqlFactory {
    type Backend = MysqlConsolidated;
    type Sql = MysqlSql;

    /// MySQL and MariaDB cast to `SIGNED` and `CHAR`, not `INTEGER`, `BIGINT` or `TEXT`.
    fn cast(expression: &str, to: CastType) -> String {
        let name = match to {
            CastType::Integer | CastType::BigInt => "SIGNED",
            CastType::Text => "CHAR",
        };
        format!("CAST({expression} AS {name})")
    }

    /// The standard recursive count, from an unsigned anchor so that the column is wide
    /// enough never to overflow first, with MariaDB's recursion limit (1,000 by default)
    /// lifted for the statement (a killed `SLEEP()` alone answers 1, no error).
    fn endless_query() -> &'static str {
        "SET STATEMENT max_recursive_iterations = 4294967295 FOR \
         WITH RECURSIVE c(x) AS (SELECT CAST(1 AS UNSIGNED) UNION ALL SELECT x + 1 FROM c) \
         SELECT count(*) FROM c"
    }

    fn widen_to_bigint(table: &str, columns: &[&str]) -> Option<String> {
        let changes: Vec<String> = columns
            .iter()
            .map(|column| format!("MODIFY {column} BIGINT"))
            .collect();
        Some(format!("ALTER TABLE {table} {}", changes.join(", ")))
    }

    async fn create() -> (MysqlConsolidated, MysqlSql) {
        let url = rowsync_testkit::fresh_mysql_database("conformance").await;
        (
            MysqlConsolidated::new(&url).expect("a mysql URL"),
            MysqlSql {
                connection: connect(&url).await,
            },
        )
    }
}

impl RawSql for MysqlSql {
    async fn execute(&mut self, sql: &str) {
        self.connection
            .query_drop(sql)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error:?}"));
    }

    async fn query_rows(&mut self, sql: &str) -> Vec<Vec<Value>> {
        let rows: Vec<mysql_async::Row> = self
            .connection
            .query(sql)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error:?}"));
        rows.into_iter()
            .map(|row| read_row(row).unwrap_or_else(|error| panic!("{sql}: {error}")))
            .collect()
    }
}

conformance::conformance_suite!(MysqlFactory);

/// InnoDB checks each row's foreign keys as it is written and cannot defer them: a cycle
/// between synchronized tables is refused at `init`, naming its keys and the way out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_of_foreign_keys_is_refused_at_init() {
    conformance::a_cycle_of_keys_that_cannot_wait_is_refused_at_init::<MysqlFactory>(
        &[
            "CREATE TABLE store (store_id INTEGER PRIMARY KEY, rep TEXT NOT NULL, manager_id INTEGER)",
            "CREATE TABLE staff (staff_id INTEGER PRIMARY KEY, rep TEXT NOT NULL, store_id INTEGER, \
             CONSTRAINT staff_store_fkey FOREIGN KEY (store_id) REFERENCES store (store_id))",
            "ALTER TABLE store ADD CONSTRAINT store_manager_fkey \
             FOREIGN KEY (manager_id) REFERENCES staff (staff_id)",
        ],
        &[
            r#"tables ["staff", "store"] reference each other in a cycle of foreign keys"#,
            r#""staff_store_fkey" of "staff""#,
            r#""store_manager_fkey" of "store""#,
            "cannot defer them",
            "ALTER TABLE `store` DROP FOREIGN KEY `store_manager_fkey`;",
        ],
    )
    .await;
}

/// Issue 16: `point` (which rowsync does not carry) is refused at `init` by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_of_a_type_rowsync_cannot_carry_is_refused_at_init_by_name() {
    conformance::a_column_of_a_type_rowsync_cannot_carry_is_refused_at_init_by_name::<MysqlFactory>()
        .await;
}
