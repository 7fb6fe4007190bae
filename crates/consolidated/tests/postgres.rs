//! The conformance suite against the PostgreSQL backend: a throwaway cluster (see
//! `rowsync-testkit`), a fresh database per test.

mod conformance;

use conformance::{Factory, RawSql};
use rowsync_consolidated::postgres::value::Read;
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_protocol::Value;
use tokio_postgres::{Client, NoTls};

struct PostgresFactory;

struct PostgresSql {
    client: Client,
    /// Held for the whole test: see `rowsync_testkit::exclusive`.
    _exclusive: tokio::sync::OwnedMutexGuard<()>,
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|error| panic!("connecting to {url}: {error}"));
    tokio::spawn(connection);
    client
}

impl Factory for PostgresFactory {
    type Backend = PostgresConsolidated;
    type Sql = PostgresSql;

    async fn create() -> (PostgresConsolidated, PostgresSql) {
        let exclusive = rowsync_testkit::exclusive().await;
        let url = rowsync_testkit::fresh_database("conformance").await;
        (
            PostgresConsolidated::new(&url),
            PostgresSql {
                client: connect(&url).await,
                _exclusive: exclusive,
            },
        )
    }
}

impl RawSql for PostgresSql {
    async fn execute(&mut self, sql: &str) {
        self.client
            .batch_execute(sql)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error:?}"));
    }

    async fn query_rows(&mut self, sql: &str) -> Vec<Vec<Value>> {
        let rows = self
            .client
            .query(sql, &[])
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error:?}"));
        rows.iter()
            .map(|row| (0..row.len()).map(|i| row.get::<_, Read>(i).0).collect())
            .collect()
    }
}

conformance::conformance_suite!(PostgresFactory);
