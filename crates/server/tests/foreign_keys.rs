//! End to end, issue 31 item 3: tables linked by a foreign key whose names sort child
//! first (`payment` references `rental`), changed offline on a real client and synced
//! through the real server into a SQLite consolidated file that enforces the key.

mod support;

use rowsync_client::Client;
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_protocol::Value;
use rusqlite::Connection;
use support::*;

const STORE_DDL: &str = "
    CREATE TABLE rental (rental_id INTEGER PRIMARY KEY, rep TEXT NOT NULL, item TEXT);
    CREATE TABLE payment (payment_id INTEGER PRIMARY KEY, rep TEXT NOT NULL,
        rental_id INTEGER NOT NULL REFERENCES rental (rental_id), amount INTEGER);";

const RENTALS: &str = "SELECT rental_id, rep, item FROM rental ORDER BY rental_id";
const PAYMENTS: &str = "SELECT payment_id, rep, rental_id, amount FROM payment ORDER BY payment_id";

fn rows(connection: &Connection, sql: &str) -> Vec<Vec<Value>> {
    let mut statement = connection.prepare(sql).unwrap();
    let width = statement.column_count();
    statement
        .query_map([], |row| {
            (0..width).map(|i| row.get::<_, Value>(i)).collect()
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Both tables as a client or the consolidated file holds them.
fn store(connection: &Connection) -> (Vec<Vec<Value>>, Vec<Vec<Value>>) {
    (rows(connection, RENTALS), rows(connection, PAYMENTS))
}

/// `rental` and `payment` created and initialized in the running server's database.
async fn add_rental_store(server: &TestServer) {
    server.consolidated().execute_batch(STORE_DDL).unwrap();
    let backend = SqliteConsolidated::new(&server.consolidated_path);
    let mut admin = backend.connect().await.unwrap();
    for table in ["payment", "rental"] {
        admin
            .init_table(&TableInit::new(table, "rep", "v1"))
            .await
            .unwrap();
    }
}

/// A device with the store's tables tracked, the key declared there too: the client
/// orders its upload by it, and its SQLite (bundled, `SQLITE_DEFAULT_FOREIGN_KEYS=1`)
/// enforces it.
fn device(server: &TestServer, name: &str) -> Client {
    let mut client = server.client(name);
    client.connection().execute_batch(STORE_DDL).unwrap();
    client.track("payment").unwrap();
    client.track("rental").unwrap();
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rental_and_its_payment_made_offline_sync_and_are_deleted_together() {
    let server = TestServer::start().await;
    add_rental_store(&server).await;
    let options = server.options("alice");
    let mut phone = device(&server, "alice-phone");
    phone.sync(&options).await.unwrap();

    phone
        .connection()
        .execute_batch(
            "INSERT INTO rental VALUES (10, 'alice', 'dvd');
             INSERT INTO payment VALUES (1, 'alice', 10, 5);",
        )
        .unwrap();
    let report = phone.sync(&options).await.unwrap();
    assert_eq!((report.rows_uploaded, report.conflicts), (2, 0));
    assert!(
        !phone.has_pending_changes().unwrap(),
        "the device is not stuck"
    );
    let consolidated = server.consolidated();
    let made = (
        vec![vec![Value::Int(10), "alice".into(), "dvd".into()]],
        vec![vec![
            Value::Int(1),
            "alice".into(),
            Value::Int(10),
            Value::Int(5),
        ]],
    );
    assert_eq!(store(&consolidated), made);
    assert_eq!(store(phone.connection()), made);

    phone
        .connection()
        .execute_batch("DELETE FROM payment WHERE payment_id = 1; DELETE FROM rental;")
        .unwrap();
    let report = phone.sync(&options).await.unwrap();
    assert_eq!((report.rows_uploaded, report.conflicts), (2, 0));
    assert_eq!(store(&consolidated), (vec![], vec![]));
    assert_eq!(store(phone.connection()), (vec![], vec![]));
    let again = phone.sync(&options).await.unwrap();
    assert_eq!((again.rows_uploaded, again.rows_downloaded), (0, 0));
    server.stop().await;
}

/// A second device receives the rental and its payment in one download, which comes in
/// table-name order (payment first), on a device that enforces foreign keys (the
/// bundled SQLite does by default): the download's transaction checks them at its
/// commit (`defer_foreign_keys`), so it applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_device_receives_a_rental_and_its_payment_in_one_download() {
    let server = TestServer::start().await;
    add_rental_store(&server).await;
    let options = server.options("alice");
    let mut phone = device(&server, "alice-phone");
    let mut laptop = device(&server, "alice-laptop");
    phone
        .connection()
        .execute_batch(
            "INSERT INTO rental VALUES (10, 'alice', 'dvd');
             INSERT INTO payment VALUES (1, 'alice', 10, 5);",
        )
        .unwrap();
    phone.sync(&options).await.unwrap();
    laptop.sync(&options).await.unwrap();
    assert_eq!(store(laptop.connection()), store(phone.connection()));
    phone
        .connection()
        .execute_batch("DELETE FROM payment; DELETE FROM rental;")
        .unwrap();
    phone.sync(&options).await.unwrap();
    laptop.sync(&options).await.unwrap();
    assert_eq!(store(laptop.connection()), (vec![], vec![]));
    server.stop().await;
}
