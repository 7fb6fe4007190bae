//! Sync rules end to end (issue 34, docs/rules.md): a store chain whose staff log in
//! by name and see their store's customers, and through them rentals and payments
//! (parent rules, two levels), with a film catalogue everyone reads, only the office
//! writes, and whose server-only `tsvector` column stays on the server. Staff write
//! offline on two devices; a write outside what the user may write is not applied
//! and is kept on the device; a staff member moving to another store gets the new
//! store's rows (though none changed) and loses the old store's; a customer moving to
//! another store moves with its rentals and payments. After each round every device
//! holds exactly what its user may see, compared row by row with the server.

use std::net::SocketAddr;

use rowsync_client::{Client, SyncOptions};
use rowsync_consolidated::mysql::MysqlConsolidated;
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::rules::RuleSet;
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_server::{auth, ServerConfig};
use rusqlite::types::ValueRef;

const SERVER_SCHEMA: &str = "
CREATE TABLE store (store_id serial PRIMARY KEY, name text NOT NULL);
CREATE TABLE staff (username text PRIMARY KEY, store_id int REFERENCES store);
CREATE TABLE customer (customer_id serial PRIMARY KEY, store_id int NOT NULL REFERENCES store,
    first_name text NOT NULL, last_name text NOT NULL);
CREATE TABLE film (film_id serial PRIMARY KEY, title text NOT NULL, fulltext tsvector);
CREATE TABLE rental (rental_id serial PRIMARY KEY,
    customer_id int NOT NULL REFERENCES customer ON DELETE CASCADE,
    film_id int NOT NULL REFERENCES film, rental_date timestamptz NOT NULL);
CREATE TABLE payment (payment_id serial PRIMARY KEY,
    rental_id int NOT NULL REFERENCES rental ON DELETE CASCADE, amount numeric(5,2) NOT NULL);
INSERT INTO store (name) VALUES ('Lethbridge'), ('Woodridge');
INSERT INTO staff VALUES ('mike', 1), ('jon', 2), ('office', NULL);
INSERT INTO customer (store_id, first_name, last_name) VALUES
    (1, 'MARY', 'SMITH'), (1, 'PATRICIA', 'JOHNSON'), (2, 'LINDA', 'WILLIAMS');
INSERT INTO film (title, fulltext) VALUES ('ACADEMY DINOSAUR', to_tsvector('academy dinosaur')),
    ('ACE GOLDFINGER', to_tsvector('ace goldfinger'));
INSERT INTO rental (customer_id, film_id, rental_date) VALUES
    (1, 1, '2026-10-14 09:00:00+00'), (3, 2, '2026-10-15 09:00:00+00');
INSERT INTO payment (rental_id, amount) VALUES (1, 2.99), (2, 4.99);
-- Device-made keys start far above the server's.
SELECT setval('customer_customer_id_seq', 100000), setval('rental_rental_id_seq', 100000);
";

const SQLITE_SCHEMA: &str = "
CREATE TABLE store (store_id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE staff (username TEXT PRIMARY KEY, store_id INTEGER REFERENCES store);
CREATE TABLE customer (customer_id INTEGER PRIMARY KEY, store_id INTEGER NOT NULL REFERENCES store,
    first_name TEXT NOT NULL, last_name TEXT NOT NULL);
CREATE TABLE film (film_id INTEGER PRIMARY KEY, title TEXT NOT NULL, fulltext BLOB);
CREATE TABLE rental (rental_id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customer ON DELETE CASCADE,
    film_id INTEGER NOT NULL REFERENCES film, rental_date TEXT NOT NULL);
CREATE TABLE payment (payment_id INTEGER PRIMARY KEY,
    rental_id INTEGER NOT NULL REFERENCES rental ON DELETE CASCADE, amount TEXT NOT NULL);
INSERT INTO store (name) VALUES ('Lethbridge'), ('Woodridge');
INSERT INTO staff VALUES ('mike', 1), ('jon', 2), ('office', NULL);
INSERT INTO customer (store_id, first_name, last_name) VALUES
    (1, 'MARY', 'SMITH'), (1, 'PATRICIA', 'JOHNSON'), (2, 'LINDA', 'WILLIAMS');
INSERT INTO film (title, fulltext) VALUES ('ACADEMY DINOSAUR', x'01'), ('ACE GOLDFINGER', x'02');
INSERT INTO rental (customer_id, film_id, rental_date) VALUES
    (1, 1, '2026-10-14 09:00:00.000000'), (3, 2, '2026-10-15 09:00:00.000000');
INSERT INTO payment (rental_id, amount) VALUES (1, '2.99'), (2, '4.99');
";

const MARIADB_SCHEMA: &str = "
CREATE TABLE store (store_id INT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(64) NOT NULL);
CREATE TABLE staff (username VARCHAR(64) PRIMARY KEY, store_id INT, FOREIGN KEY (store_id) REFERENCES store (store_id));
CREATE TABLE customer (customer_id INT AUTO_INCREMENT PRIMARY KEY, store_id INT NOT NULL,
    first_name VARCHAR(64) NOT NULL, last_name VARCHAR(64) NOT NULL,
    FOREIGN KEY (store_id) REFERENCES store (store_id));
CREATE TABLE film (film_id INT AUTO_INCREMENT PRIMARY KEY, title VARCHAR(64) NOT NULL, `fulltext` TEXT);
CREATE TABLE rental (rental_id INT AUTO_INCREMENT PRIMARY KEY, customer_id INT NOT NULL,
    film_id INT NOT NULL, rental_date DATETIME(6) NOT NULL,
    FOREIGN KEY (customer_id) REFERENCES customer (customer_id) ON DELETE CASCADE,
    FOREIGN KEY (film_id) REFERENCES film (film_id));
CREATE TABLE payment (payment_id INT AUTO_INCREMENT PRIMARY KEY, rental_id INT NOT NULL,
    amount DECIMAL(5,2) NOT NULL, FOREIGN KEY (rental_id) REFERENCES rental (rental_id) ON DELETE CASCADE);
INSERT INTO store (name) VALUES ('Lethbridge'), ('Woodridge');
INSERT INTO staff VALUES ('mike', 1), ('jon', 2), ('office', NULL);
INSERT INTO customer (store_id, first_name, last_name) VALUES
    (1, 'MARY', 'SMITH'), (1, 'PATRICIA', 'JOHNSON'), (2, 'LINDA', 'WILLIAMS');
INSERT INTO film (title, `fulltext`) VALUES ('ACADEMY DINOSAUR', 'academy dinosaur'), ('ACE GOLDFINGER', 'ace goldfinger');
INSERT INTO rental (customer_id, film_id, rental_date) VALUES
    (1, 1, '2026-10-14 09:00:00'), (3, 2, '2026-10-15 09:00:00');
INSERT INTO payment (rental_id, amount) VALUES (1, 2.99), (2, 4.99);
";

const RULES: &str = r#"
[groups.store]
table = "staff"
user_column = "username"
group_column = "store_id"

[tables.store]
rule = "group"
column = "store_id"
group = "store"

[tables.customer]
rule = "group"
column = "store_id"
group = "store"

[tables.rental]
rule = "parent"
parent = "customer"

[tables.payment]
rule = "parent"
parent = "rental"

[tables.film]
rule = "shared"
writers = ["office"]
exclude_columns = ["fulltext"]
"#;

const DEVICE_SCHEMA: &str = "
CREATE TABLE store (store_id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE customer (customer_id INTEGER PRIMARY KEY, store_id INTEGER NOT NULL,
    first_name TEXT NOT NULL, last_name TEXT NOT NULL);
CREATE TABLE film (film_id INTEGER PRIMARY KEY, title TEXT NOT NULL);
CREATE TABLE rental (rental_id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL,
    film_id INTEGER NOT NULL, rental_date TEXT NOT NULL);
CREATE TABLE payment (payment_id INTEGER PRIMARY KEY, rental_id INTEGER NOT NULL,
    amount TEXT NOT NULL);
";

const TABLES: [&str; 5] = ["store", "customer", "film", "rental", "payment"];

/// What a user may see of each table, on the device and on the server.
fn device_rows_sql(table: &str) -> String {
    match table {
        "store" => "SELECT store_id, name FROM store ORDER BY 1".into(),
        "customer" => {
            "SELECT customer_id, store_id, first_name, last_name FROM customer ORDER BY 1".into()
        }
        "film" => "SELECT film_id, title FROM film ORDER BY 1".into(),
        "rental" => {
            "SELECT rental_id, customer_id, film_id, rental_date FROM rental ORDER BY 1".into()
        }
        _ => "SELECT payment_id, rental_id, amount FROM payment ORDER BY 1".into(),
    }
}

/// The consolidated database of a test, and how it renders rows as the device does.
enum Central {
    Postgres(tokio_postgres::Client),
    Sqlite(std::path::PathBuf),
    Mariadb(String),
}

impl Central {
    async fn rows(&self, sql: &str) -> Vec<Vec<String>> {
        match self {
            Central::Postgres(server) => server_rows(server, sql).await,
            Central::Sqlite(path) => {
                let connection = rusqlite::Connection::open(path).unwrap();
                connection
                    .busy_timeout(std::time::Duration::from_secs(10))
                    .unwrap();
                sqlite_rows(&connection, sql)
            }
            Central::Mariadb(url) => mariadb_rows(url, sql).await,
        }
    }

    async fn execute(&self, sql: &str) {
        match self {
            Central::Postgres(server) => server.batch_execute(sql).await.unwrap(),
            Central::Sqlite(path) => {
                let connection = rusqlite::Connection::open(path).unwrap();
                connection
                    .busy_timeout(std::time::Duration::from_secs(10))
                    .unwrap();
                connection.execute_batch(sql).unwrap();
            }
            Central::Mariadb(url) => {
                use mysql_async::prelude::Queryable;
                let mut connection = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
                connection.query_drop(sql).await.unwrap();
            }
        }
    }

    /// The back office writes the film's column the devices do not have.
    fn clear_server_only_column(&self) -> &'static str {
        match self {
            Central::Mariadb(_) => "UPDATE film SET `fulltext` = NULL WHERE film_id = 1",
            _ => "UPDATE film SET fulltext = NULL WHERE film_id = 1",
        }
    }

    fn rows_sql(&self, table: &str, user: &str) -> String {
        let stores = format!("(SELECT store_id FROM staff WHERE username = '{user}')");
        let customers = format!("(SELECT customer_id FROM customer WHERE store_id IN {stores})");
        let rentals = format!("(SELECT rental_id FROM rental WHERE customer_id IN {customers})");
        let (time, amount) = match self {
            Central::Postgres(_) => (
                "to_char(rental_date AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')",
                "amount::text",
            ),
            Central::Sqlite(_) => ("rental_date", "amount"),
            Central::Mariadb(_) => (
                "DATE_FORMAT(rental_date, '%Y-%m-%d %H:%i:%s.%f')",
                "CAST(amount AS CHAR)",
            ),
        };
        match table {
            "store" => format!("SELECT store_id, name FROM store WHERE store_id IN {stores} ORDER BY 1"),
            "customer" => format!("SELECT customer_id, store_id, first_name, last_name FROM customer WHERE store_id IN {stores} ORDER BY 1"),
            "film" => "SELECT film_id, title FROM film ORDER BY 1".into(),
            "rental" => format!("SELECT rental_id, customer_id, film_id, {time} FROM rental WHERE customer_id IN {customers} ORDER BY 1"),
            _ => format!("SELECT payment_id, rental_id, {amount} FROM payment WHERE rental_id IN {rentals} ORDER BY 1"),
        }
    }
}

async fn serve<B: Consolidated>(backend: B) -> SocketAddr {
    let mut connection = backend.connect().await.unwrap();
    connection.install_system_tables().await.unwrap();
    let rules = RuleSet::parse(RULES).unwrap();
    for table in TABLES {
        let init = TableInit::new(table, "", "v1");
        connection.init_rule_table(&init, &rules).await.unwrap();
    }
    for user in ["mike", "jon", "office"] {
        let hash = auth::hash_password(&format!("{user}-password")).unwrap();
        connection.set_user(user, &hash).await.unwrap();
    }
    drop(connection);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let config = ServerConfig::default();
        rowsync_server::serve(listener, backend, config, std::future::pending())
            .await
            .unwrap();
    });
    address
}

struct Device {
    client: Client,
    user: &'static str,
    options: SyncOptions,
}

impl Device {
    fn open(dir: &std::path::Path, address: SocketAddr, user: &'static str) -> Device {
        let mut client = Client::open(dir.join(format!("{user}.db"))).unwrap();
        client.connection().execute_batch(DEVICE_SCHEMA).unwrap();
        for table in TABLES {
            client.track(table).unwrap();
        }
        let options =
            SyncOptions::new(format!("tcp://{address}"), user, format!("{user}-password"));
        Device {
            client,
            user,
            options,
        }
    }

    async fn sync(&mut self) -> rowsync_client::SyncReport {
        self.client.sync(&self.options).await.unwrap()
    }

    fn run(&self, sql: &str) {
        self.client.connection().execute_batch(sql).unwrap();
    }

    fn kept_conflicts(&self) -> Vec<(String, String)> {
        self.client
            .kept_conflicts()
            .unwrap()
            .into_iter()
            .map(|kept| (kept.table, kept.operation))
            .collect()
    }

    /// The device holds exactly what its user may see.
    async fn assert_sees_its_rows(&self, server: &Central, round: &str) {
        for table in TABLES {
            let expected = server.rows(&server.rows_sql(table, self.user)).await;
            assert_eq!(
                device_rows(&self.client, &device_rows_sql(table)),
                expected,
                "{round}: {table} on {}'s device",
                self.user
            );
        }
    }
}

#[tokio::test]
async fn staff_see_their_store_and_move_with_their_rows_on_postgres() {
    let (url, server) = rowsync_testkit::fresh_database_with("rules", SERVER_SCHEMA).await;
    let address = serve(PostgresConsolidated::new(&url)).await;
    let dir = tempfile::tempdir().unwrap();
    store_chain(address, &Central::Postgres(server), dir.path()).await;
}

#[tokio::test]
async fn staff_see_their_store_and_move_with_their_rows_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("central.db");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(SQLITE_SCHEMA)
        .unwrap();
    let address = serve(SqliteConsolidated::new(&path)).await;
    store_chain(address, &Central::Sqlite(path), dir.path()).await;
}

#[tokio::test]
async fn staff_see_their_store_and_move_with_their_rows_on_mariadb() {
    let url = rowsync_testkit::fresh_mysql_database("rules").await;
    let central = Central::Mariadb(url.clone());
    central.execute(MARIADB_SCHEMA).await;
    let address = serve(MysqlConsolidated::new(&url).unwrap()).await;
    let dir = tempfile::tempdir().unwrap();
    store_chain(address, &central, dir.path()).await;
}

async fn store_chain(address: SocketAddr, server: &Central, dir: &std::path::Path) {
    let mut mike = Device::open(dir, address, "mike");
    let mut jon = Device::open(dir, address, "jon");
    let mut office = Device::open(dir, address, "office");
    for device in [&mut mike, &mut jon, &mut office] {
        device.sync().await;
        device.assert_sees_its_rows(server, "first sync").await;
    }
    assert_eq!(count(&mike.client, "customer"), 2);
    assert_eq!(count(&jon.client, "customer"), 1);

    // Offline: each writes its store's rows; mike also writes a customer of jon's store
    // and a film title, neither of which he may write.
    mike.run(
        "INSERT INTO customer VALUES (200001, 1, 'BARBARA', 'JONES');
         INSERT INTO rental VALUES (200001, 200001, 1, '2026-11-20 09:30:00.000000');
         INSERT INTO payment VALUES (200001, 200001, '1.99');
         INSERT INTO customer VALUES (200002, 2, 'PLANTED', 'ROW');
         UPDATE film SET title = 'MIKES TITLE' WHERE film_id = 1;
         UPDATE customer SET last_name = 'SMYTHE' WHERE customer_id = 1;",
    );
    jon.run("INSERT INTO customer VALUES (300001, 2, 'SUSAN', 'WILSON');");
    office.run("UPDATE film SET title = 'ACADEMY DINOSAURS' WHERE film_id = 1;");
    office.sync().await;
    let report = mike.sync().await;
    assert_eq!(report.conflicts, 2, "{report:?}");
    let mut kept = mike.kept_conflicts();
    kept.sort();
    assert_eq!(
        kept,
        [
            ("customer".to_string(), "insert".to_string()),
            ("film".to_string(), "update".to_string())
        ]
    );
    jon.sync().await;
    mike.sync().await;
    for device in [&mike, &jon, &office] {
        device.assert_sees_its_rows(server, "offline writes").await;
    }
    let planted = server
        .rows("SELECT count(*) FROM customer WHERE customer_id = 200002")
        .await;
    assert_eq!(planted, [["0"]]);

    // Mike moves to jon's store; a customer of mike's old store moves to jon's store
    // too; the server-only column is written by the back office.
    server
        .execute(
            "UPDATE staff SET store_id = 2 WHERE username = 'mike';
             UPDATE customer SET store_id = 2 WHERE customer_id = 2;
             UPDATE film SET title = title WHERE film_id = 1;",
        )
        .await;
    server.execute(server.clear_server_only_column()).await;
    for device in [&mut mike, &mut jon, &mut office] {
        device.sync().await;
        device.assert_sees_its_rows(server, "after the move").await;
    }
    assert_eq!(
        count(&mike.client, "customer"),
        3,
        "store 2: 3, 2 and 300001"
    );
    assert_eq!(count(&mike.client, "payment"), 1);

    // A customer of store 2 with its rental and payment moves to store 1.
    server
        .execute("UPDATE customer SET store_id = 1 WHERE customer_id = 3;")
        .await;
    for device in [&mut mike, &mut jon, &mut office] {
        device.sync().await;
        device
            .assert_sees_its_rows(server, "customer moved out")
            .await;
    }
    assert_eq!(count(&jon.client, "rental"), 0);
}

fn count(client: &Client, table: &str) -> i64 {
    client
        .connection()
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
            row.get(0)
        })
        .unwrap()
}

fn device_rows(client: &Client, sql: &str) -> Vec<Vec<String>> {
    sqlite_rows(client.connection(), sql)
}

fn sqlite_rows(connection: &rusqlite::Connection, sql: &str) -> Vec<Vec<String>> {
    let mut statement = connection.prepare(sql).unwrap();
    let columns = statement.column_count();
    let rows = statement
        .query_map([], |row| {
            (0..columns)
                .map(|index| {
                    Ok(match row.get_ref(index)? {
                        ValueRef::Null => "NULL".to_string(),
                        ValueRef::Integer(value) => value.to_string(),
                        ValueRef::Real(value) => value.to_string(),
                        ValueRef::Text(text) => String::from_utf8_lossy(text).into_owned(),
                        ValueRef::Blob(bytes) => format!("{bytes:?}"),
                    })
                })
                .collect()
        })
        .unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

async fn mariadb_rows(url: &str, sql: &str) -> Vec<Vec<String>> {
    use mysql_async::prelude::Queryable;
    let mut connection = mysql_async::Conn::from_url(url).await.unwrap();
    let rows: Vec<mysql_async::Row> = connection.query(sql).await.unwrap();
    rows.into_iter()
        .map(|row| {
            row.unwrap()
                .into_iter()
                .map(|value| match value {
                    mysql_async::Value::NULL => "NULL".to_string(),
                    mysql_async::Value::Bytes(bytes) => {
                        String::from_utf8_lossy(&bytes).into_owned()
                    }
                    mysql_async::Value::Int(number) => number.to_string(),
                    mysql_async::Value::UInt(number) => number.to_string(),
                    other => format!("{other:?}"),
                })
                .collect()
        })
        .collect()
}

async fn server_rows(server: &tokio_postgres::Client, sql: &str) -> Vec<Vec<String>> {
    let messages = server.simple_query(sql).await.unwrap();
    messages
        .iter()
        .filter_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|index| row.get(index).unwrap_or("NULL").to_string())
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}
