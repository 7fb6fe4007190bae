//! PostgreSQL keeps the late-commit guarantees (`late_commit`): no row is missed when
//! transactions commit out of order (transaction ids and snapshots), and one sync per
//! client at a time across connections (an advisory lock).

#[macro_use]
mod late_commit;

use late_commit::{Database, Sql, ITEMS_DDL};
use rowsync_consolidated::postgres::value::Read;
use rowsync_consolidated::postgres::{PostgresConnection, PostgresConsolidated};
use rowsync_consolidated::{Consolidated, ConsolidatedConnection};
use rowsync_protocol::Row;
use tokio_postgres::{Client, NoTls};

struct Postgres {
    url: String,
}

impl Sql for Client {
    async fn execute(&mut self, sql: &str) {
        self.batch_execute(sql)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }

    async fn items_of(&mut self, user: &str) -> Vec<Row> {
        self.query(
            "SELECT id, owner, value FROM items WHERE owner = $1 ORDER BY id",
            &[&user],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (0..3).map(|i| row.get::<_, Read>(i).0).collect())
        .collect()
    }

    async fn ids(&mut self) -> Vec<i64> {
        self.query("SELECT id::bigint FROM items", &[])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    }
}

impl Database for Postgres {
    type Sql = Client;
    type Backend = PostgresConnection;
    const HOLD_C1_SYNC_LOCK: &'static str =
        "BEGIN; SELECT pg_advisory_xact_lock(7262, hashtext('c1'))";

    async fn fresh() -> Postgres {
        let database = Postgres {
            url: rowsync_testkit::fresh_database("watermark").await,
        };
        Sql::execute(&mut database.connect().await, ITEMS_DDL).await;
        let mut backend = database.backend().await;
        backend
            .init_table(&late_commit::items_init())
            .await
            .unwrap();
        database
    }

    async fn connect(&self) -> Client {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }

    async fn backend(&self) -> PostgresConnection {
        PostgresConsolidated::new(&self.url)
            .connect()
            .await
            .unwrap()
    }
}

late_commit_tests!(Postgres);
