//! A real server for client tests: a SQLite consolidated database with `orders`
//! partitioned by `rep`, user alice, the `rowsync` server on a free loopback port.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use rowsync_client::{Client, SyncOptions};
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_protocol::Value;
use rowsync_server::{auth, ServerConfig};
use rusqlite::Connection;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub const ORDERS_DDL: &str = "CREATE TABLE orders (id TEXT PRIMARY KEY, rep TEXT NOT NULL, item TEXT NOT NULL, quantity INTEGER NOT NULL)";
pub const USER: &str = "alice";
pub const PASSWORD: &str = "alice-password";

pub struct TestServer {
    pub address: SocketAddr,
    pub dir: tempfile::TempDir,
    pub consolidated_path: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    /// `seed` rows of alice's partition: ids `seed-0`, `seed-1`, ... with quantity n.
    pub async fn start(seed: usize) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let consolidated_path = dir.path().join("consolidated.db");
        {
            let connection = Connection::open(&consolidated_path).unwrap();
            connection.execute_batch(ORDERS_DDL).unwrap();
            let transaction = connection.unchecked_transaction().unwrap();
            {
                let mut insert = transaction
                    .prepare("INSERT INTO orders VALUES (?1, ?2, 'seed', ?3)")
                    .unwrap();
                for n in 0..seed {
                    insert
                        .execute(rusqlite::params![format!("seed-{n}"), USER, n as i64])
                        .unwrap();
                }
            }
            transaction.commit().unwrap();
        }
        let backend = SqliteConsolidated::new(&consolidated_path);
        let mut connection = backend.connect().await.unwrap();
        connection.install_system_tables().await.unwrap();
        connection
            .init_table(&TableInit {
                table: "orders".into(),
                partition_column: "rep".into(),
                script_version: Some("v1".into()),
                based_on: None,
            })
            .await
            .unwrap();
        let hash = auth::hash_password(PASSWORD).unwrap();
        connection.set_user(USER, &hash).await.unwrap();
        drop(connection);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            rowsync_server::serve(listener, backend, ServerConfig::default(), async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        TestServer {
            address,
            dir,
            consolidated_path,
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    pub fn options(&self) -> SyncOptions {
        SyncOptions::new(format!("tcp://{}", self.address), USER, PASSWORD)
    }

    pub fn client_path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.db"))
    }

    /// A new client database with `orders` created and tracked.
    pub fn client(&self, name: &str) -> Client {
        let mut client = Client::open(self.client_path(name)).unwrap();
        client.connection().execute_batch(ORDERS_DDL).unwrap();
        client.track("orders").unwrap();
        client
    }

    /// Alice's orders in the consolidated database, by id.
    pub fn consolidated_orders(&self) -> Vec<Vec<Value>> {
        orders(&Connection::open(&self.consolidated_path).unwrap())
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.handle.take() {
            handle.await.unwrap();
        }
    }
}

/// Every orders row of a database, by id.
pub fn orders(connection: &Connection) -> Vec<Vec<Value>> {
    let mut statement = connection
        .prepare("SELECT id, rep, item, quantity FROM orders WHERE rep = 'alice' ORDER BY id")
        .unwrap();
    statement
        .query_map([], |row| (0..4).map(|i| row.get::<_, Value>(i)).collect())
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}
