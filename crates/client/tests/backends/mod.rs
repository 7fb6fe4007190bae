//! The consolidated databases client tests run against: an `items` table partitioned by
//! its `owner` column on SQLite, PostgreSQL or MariaDB (throwaway servers from the
//! testkit), users alice and bob, and a real `rowsync` server on a free loopback port.
//! `on_every_backend!` makes a scenario's test per backend on that table;
//! `on_backends!` one per backend named with its own schema.

#![allow(dead_code, unused_macros)]

use std::net::SocketAddr;

use rowsync_client::SyncOptions;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_server::{auth, ServerConfig};
use tokio::net::TcpListener;

pub const CLIENT_DDL: &str =
    "CREATE TABLE items (id TEXT PRIMARY KEY, owner TEXT NOT NULL, body TEXT, quantity INTEGER)";
pub const USERS: [&str; 2] = ["alice", "bob"];
pub const POSTGRES_ITEMS: &str =
    "CREATE TABLE items (id text PRIMARY KEY, owner text NOT NULL, body text, quantity bigint)";
pub const MARIADB_ITEMS: &str = "CREATE TABLE items (id VARCHAR(64) PRIMARY KEY, \
     owner VARCHAR(64) NOT NULL, body TEXT, quantity BIGINT)";

/// `items` whose quantity may not be negative: a row the server refuses.
pub const SQLITE_CHECKED: [&str; 1] = ["CREATE TABLE items (id TEXT PRIMARY KEY, \
     owner TEXT NOT NULL, body TEXT, quantity INTEGER CHECK (quantity >= 0))"];
pub const POSTGRES_CHECKED: [&str; 1] = ["CREATE TABLE items (id text PRIMARY KEY, \
     owner text NOT NULL, body text, quantity bigint CHECK (quantity >= 0))"];
pub const MARIADB_CHECKED: [&str; 1] = ["CREATE TABLE items (id VARCHAR(64) PRIMARY KEY, \
     owner VARCHAR(64) NOT NULL, body TEXT, quantity BIGINT CHECK (quantity >= 0))"];

pub fn password(user: &str) -> String {
    format!("{user}-password")
}

/// The consolidated database under test.
pub enum Backend {
    Sqlite(tempfile::TempDir),
    Postgres(String),
    Mysql(String),
}

impl Backend {
    /// `statements` make the consolidated database's tables (the `items` table of
    /// `CLIENT_DDL` by default: see the constructors' callers).
    pub async fn sqlite(statements: &[&str]) -> Backend {
        let dir = tempfile::tempdir().unwrap();
        let connection = rusqlite::Connection::open(dir.path().join("consolidated.db")).unwrap();
        for statement in statements {
            connection.execute_batch(statement).unwrap();
        }
        Backend::Sqlite(dir)
    }

    pub async fn postgres(statements: &[&str]) -> Backend {
        let (url, client) = rowsync_testkit::fresh_database_with("client", "SELECT 1").await;
        for statement in statements {
            client.batch_execute(statement).await.unwrap();
        }
        Backend::Postgres(url)
    }

    pub async fn mysql(statements: &[&str]) -> Backend {
        use mysql_async::prelude::Queryable;
        let url = rowsync_testkit::fresh_mysql_database("client").await;
        let mut connection = mysql_async::Conn::from_url(&url).await.unwrap();
        for statement in statements {
            connection.query_drop(*statement).await.unwrap();
        }
        Backend::Mysql(url)
    }

    /// Starts a server on this database with `items` initialized and both users set.
    pub async fn serve(&self) -> SocketAddr {
        self.serve_with(ServerConfig::default()).await
    }

    pub async fn serve_with(&self, config: ServerConfig) -> SocketAddr {
        self.serve_by(config, "owner").await.unwrap()
    }

    /// A server with `items` partitioned by `partition_column`, or `init`'s error.
    pub async fn serve_by(
        &self,
        config: ServerConfig,
        partition_column: &str,
    ) -> Result<SocketAddr, rowsync_consolidated::DbError> {
        self.serve_until(config, partition_column, std::future::pending())
            .await
    }

    /// A server that stops when `stop` is sent (or dropped).
    pub async fn serve_stoppable(&self) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let address = self.serve_until(ServerConfig::default(), "owner", shutdown);
        (address.await.unwrap(), stop)
    }

    async fn serve_until(
        &self,
        config: ServerConfig,
        partition_column: &str,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<SocketAddr, rowsync_consolidated::DbError> {
        let until = Until {
            config,
            partition_column,
            shutdown,
        };
        match self {
            Backend::Sqlite(dir) => {
                let path = dir.path().join("consolidated.db");
                let backend = rowsync_consolidated::sqlite::SqliteConsolidated::new(&path);
                serve(backend, until).await
            }
            Backend::Postgres(url) => {
                let backend = rowsync_consolidated::postgres::PostgresConsolidated::new(url);
                serve(backend, until).await
            }
            Backend::Mysql(url) => {
                let backend = rowsync_consolidated::mysql::MysqlConsolidated::new(url).unwrap();
                serve(backend, until).await
            }
        }
    }

    /// Runs `sql` (statements) on the consolidated database.
    pub async fn execute(&self, sql: &str) -> Result<(), String> {
        match self {
            Backend::Sqlite(dir) => {
                let connection =
                    rusqlite::Connection::open(dir.path().join("consolidated.db")).unwrap();
                connection.execute_batch(sql).map_err(|e| e.to_string())
            }
            Backend::Postgres(url) => {
                let client = rowsync_testkit::connect(url).await;
                client.batch_execute(sql).await.map_err(|e| {
                    let db = e.as_db_error();
                    format!(
                        "{e}: {:?} {:?}",
                        db.map(|d| d.message()),
                        db.and_then(|d| d.hint())
                    )
                })
            }
            Backend::Mysql(url) => {
                use mysql_async::prelude::Queryable;
                let mut connection = mysql_async::Conn::from_url(url).await.unwrap();
                connection.query_drop(sql).await.map_err(|e| e.to_string())
            }
        }
    }

    /// The consolidated database's `items` rows as (id, owner, body), by id.
    pub async fn items(&self) -> Vec<(String, String, Option<String>)> {
        let sql = "SELECT id, owner, body FROM items ORDER BY id";
        match self {
            Backend::Sqlite(dir) => {
                let connection =
                    rusqlite::Connection::open(dir.path().join("consolidated.db")).unwrap();
                let mut statement = connection.prepare(sql).unwrap();
                let rows = statement
                    .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
                    .unwrap();
                rows.collect::<Result<_, _>>().unwrap()
            }
            Backend::Postgres(url) => {
                let client = rowsync_testkit::connect(url).await;
                let rows = client.query(sql, &[]).await.unwrap();
                rows.iter()
                    .map(|row| (row.get(0), row.get(1), row.get(2)))
                    .collect()
            }
            Backend::Mysql(url) => {
                use mysql_async::prelude::Queryable;
                let mut connection = mysql_async::Conn::from_url(url).await.unwrap();
                connection.query(sql).await.unwrap()
            }
        }
    }
}

/// How a test server runs: its settings, `items`' partition column, and until when.
pub struct Until<'a, S> {
    pub config: ServerConfig,
    pub partition_column: &'a str,
    pub shutdown: S,
}

pub async fn serve<B: Consolidated, S>(
    backend: B,
    until: Until<'_, S>,
) -> Result<SocketAddr, rowsync_consolidated::DbError>
where
    S: std::future::Future<Output = ()> + Send + 'static,
{
    let Until {
        config,
        partition_column,
        shutdown,
    } = until;
    let mut connection = backend.connect().await.unwrap();
    connection.install_system_tables().await.unwrap();
    connection
        .init_table(&TableInit::new("items", partition_column, "v1"))
        .await?;
    for user in USERS {
        let hash = auth::hash_password(&password(user)).unwrap();
        connection.set_user(user, &hash).await.unwrap();
    }
    drop(connection);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        rowsync_server::serve(listener, backend, config, shutdown)
            .await
            .unwrap();
    });
    Ok(address)
}

pub fn options(address: SocketAddr, user: &str) -> SyncOptions {
    SyncOptions::new(format!("tcp://{address}"), user, password(user))
}

/// A test per backend for each scenario, on the `items` table of each backend.
macro_rules! on_every_backend {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $test() {
                super::$test(crate::backends::Backend::sqlite(&[crate::backends::CLIENT_DDL]).await).await;
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $test() {
                super::$test(crate::backends::Backend::postgres(&[crate::backends::POSTGRES_ITEMS]).await).await;
            })*
        }
        mod mariadb {
            $(#[tokio::test]
            async fn $test() {
                super::$test(crate::backends::Backend::mysql(&[crate::backends::MARIADB_ITEMS]).await).await;
            })*
        }
    };
}

/// One test per backend of a scenario: `test_name => the backend it runs on`.
macro_rules! on_backends {
    ($scenario:ident: $($test:ident => $backend:expr),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $test() {
                $scenario($backend.await).await;
            }
        )+
    };
}
