//! The worked example of issue 31 (docs/types.md, "A worked example"): a DVD-rental
//! store's schema as PostgreSQL users write it, nobody here designed it for rowsync:
//! serial keys, a `last_update` trigger, a range-partitioned `payment` keyed
//! `(payment_date, payment_id)`, an enum, a `text[]`, `numeric(5,2)`, and foreign keys
//! payment → rental → customer (child tables sort first). Two devices of one store
//! insert and edit offline, twice over, while the back office inserts and moves a
//! payment to another month; at the end both devices and the server hold the same rows,
//! compared row by row, with no conflict and nothing set aside.

use std::net::SocketAddr;

use rowsync_client::{Client, SyncOptions};
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::{
    key_range_script, Consolidated, ConsolidatedConnection, KeyRangeInit, TableInit,
};
use rowsync_server::{auth, ServerConfig};
use rusqlite::types::ValueRef;

const SERVER_SCHEMA: &str = "
CREATE FUNCTION last_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.last_update = now(); RETURN NEW; END $$;
CREATE TYPE mpaa_rating AS ENUM ('G', 'PG', 'PG-13', 'R', 'NC-17');
CREATE TABLE customer (customer_id serial PRIMARY KEY, owner text NOT NULL,
    first_name text NOT NULL, last_name text NOT NULL, email text,
    active boolean NOT NULL DEFAULT true, last_update timestamptz NOT NULL DEFAULT now());
CREATE TABLE film (film_id serial PRIMARY KEY, owner text NOT NULL, title text NOT NULL,
    rating mpaa_rating DEFAULT 'G', special_features text[],
    last_update timestamptz NOT NULL DEFAULT now());
CREATE TABLE rental (rental_id serial PRIMARY KEY, owner text NOT NULL,
    rental_date timestamptz NOT NULL, customer_id int NOT NULL REFERENCES customer,
    film_id int NOT NULL REFERENCES film, return_date timestamptz,
    last_update timestamptz NOT NULL DEFAULT now());
CREATE TABLE payment (payment_id serial, owner text NOT NULL,
    customer_id int NOT NULL REFERENCES customer, rental_id int NOT NULL REFERENCES rental,
    amount numeric(5,2) NOT NULL, payment_date timestamptz NOT NULL,
    PRIMARY KEY (payment_date, payment_id)) PARTITION BY RANGE (payment_date);
CREATE TABLE payment_p2026_10 PARTITION OF payment FOR VALUES FROM ('2026-10-01') TO ('2026-11-01');
CREATE TABLE payment_p2026_11 PARTITION OF payment FOR VALUES FROM ('2026-11-01') TO ('2026-12-01');
CREATE TRIGGER last_updated BEFORE UPDATE ON customer FOR EACH ROW EXECUTE FUNCTION last_updated();
CREATE TRIGGER last_updated BEFORE UPDATE ON film FOR EACH ROW EXECUTE FUNCTION last_updated();
CREATE TRIGGER last_updated BEFORE UPDATE ON rental FOR EACH ROW EXECUTE FUNCTION last_updated();
INSERT INTO customer (owner, first_name, last_name, email) VALUES
    ('alice', 'MARY', 'SMITH', 'mary.smith@example.org'),
    ('alice', 'PATRICIA', 'JOHNSON', NULL);
INSERT INTO film (owner, title, rating, special_features)
    VALUES ('alice', 'ACADEMY DINOSAUR', 'PG', '{Deleted Scenes,Behind the Scenes}');
INSERT INTO rental (owner, rental_date, customer_id, film_id)
    VALUES ('alice', '2026-10-14 09:00:00+00', 1, 1);
INSERT INTO payment (owner, customer_id, rental_id, amount, payment_date)
    VALUES ('alice', 1, 1, 2.99, '2026-10-15 10:00:00+00');
";

/// The device's tables, declared as docs/types.md says (decimals and timestamps TEXT).
const DEVICE_SCHEMA: &str = "
CREATE TABLE customer (customer_id INTEGER PRIMARY KEY, owner TEXT NOT NULL,
    first_name TEXT NOT NULL, last_name TEXT NOT NULL, email TEXT,
    active INTEGER NOT NULL DEFAULT 1,
    last_update TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f000', 'now')));
CREATE TABLE film (film_id INTEGER PRIMARY KEY, owner TEXT NOT NULL, title TEXT NOT NULL,
    rating TEXT, special_features TEXT,
    last_update TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f000', 'now')));
CREATE TABLE rental (rental_id INTEGER PRIMARY KEY, owner TEXT NOT NULL,
    rental_date TEXT NOT NULL, customer_id INTEGER NOT NULL REFERENCES customer,
    film_id INTEGER NOT NULL REFERENCES film, return_date TEXT,
    last_update TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f000', 'now')));
CREATE TABLE payment (payment_id INTEGER NOT NULL, owner TEXT NOT NULL,
    customer_id INTEGER NOT NULL REFERENCES customer, rental_id INTEGER NOT NULL REFERENCES rental,
    amount TEXT NOT NULL, payment_date TEXT NOT NULL, PRIMARY KEY (payment_date, payment_id));
";

const TABLES: [&str; 4] = ["customer", "film", "payment", "rental"];

/// Each table's rows as the device stores them, and the same rendered by PostgreSQL.
const DEVICE_ROWS: [&str; 4] = [
    "SELECT customer_id, owner, first_name, last_name, email, active, last_update FROM customer ORDER BY 1",
    "SELECT film_id, owner, title, rating, special_features, last_update FROM film ORDER BY 1",
    "SELECT payment_id, owner, customer_id, rental_id, amount, payment_date FROM payment ORDER BY 1",
    "SELECT rental_id, owner, rental_date, customer_id, film_id, return_date, last_update FROM rental ORDER BY 1",
];
const UTC: &str = "AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')";
fn server_rows_sql() -> [String; 4] {
    [
        format!("SELECT customer_id, owner, first_name, last_name, email, active::int, to_char(last_update {UTC} FROM customer ORDER BY 1"),
        format!("SELECT film_id, owner, title, rating::text, to_json(special_features)::text, to_char(last_update {UTC} FROM film ORDER BY 1"),
        format!("SELECT payment_id, owner, customer_id, rental_id, amount::text, to_char(payment_date {UTC} FROM payment ORDER BY 1"),
        format!("SELECT rental_id, owner, to_char(rental_date {UTC}, customer_id, film_id, to_char(return_date {UTC}, to_char(last_update {UTC} FROM rental ORDER BY 1"),
    ]
}

async fn serve(url: &str) -> SocketAddr {
    let backend = PostgresConsolidated::new(url);
    let mut connection = backend.connect().await.unwrap();
    connection.install_system_tables().await.unwrap();
    for table in TABLES {
        let init = TableInit::new(table, "owner", "v1");
        connection.init_table(&init).await.unwrap();
    }
    for (table, column) in [
        ("customer", None),
        ("film", None),
        ("rental", None),
        ("payment", Some("payment_id")),
    ] {
        let init = KeyRangeInit {
            table: table.into(),
            column: column.map(str::to_string),
            script_version: "v1".into(),
            range_keys: 100,
        };
        connection.init_key_ranges(&init).await.unwrap();
        connection
            .set_script(&key_range_script(&init))
            .await
            .unwrap();
    }
    let hash = auth::hash_password("alice-password").unwrap();
    connection.set_user("alice", &hash).await.unwrap();
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

fn device(dir: &std::path::Path, name: &str) -> Client {
    let mut client = Client::open(dir.join(format!("{name}.db"))).unwrap();
    client.connection().execute_batch(DEVICE_SCHEMA).unwrap();
    for table in TABLES {
        client.track(table).unwrap();
    }
    client
}

async fn sync(client: &mut Client, options: &SyncOptions) {
    let report = client.sync(options).await.unwrap();
    assert_eq!(
        (report.conflicts, report.rows_rejected),
        (0, 0),
        "{report:?}"
    );
}

fn run(client: &Client, sql: &str) {
    client.connection().execute_batch(sql).unwrap();
}

/// Round one: each device inserts a customer, a rental and (the phone) a payment with
/// keys from its ranges, and edits rows the other does not touch.
fn first_offline_edits(phone: &mut Client, counter: &mut Client) {
    let (customer, rental, payment) = (
        phone.next_key("customer").unwrap(),
        phone.next_key("rental").unwrap(),
        phone.next_key("payment").unwrap(),
    );
    run(phone, &format!(
        "INSERT INTO customer (customer_id, owner, first_name, last_name) VALUES ({customer}, 'alice', 'LINDA', 'WILLIAMS');
         INSERT INTO rental (rental_id, owner, rental_date, customer_id, film_id)
             VALUES ({rental}, 'alice', '2026-11-20 09:30:00.000000', {customer}, 1);
         INSERT INTO payment VALUES ({payment}, 'alice', {customer}, {rental}, '4.99', '2026-11-20 09:31:00.000000');
         UPDATE customer SET email = 'mary@example.org' WHERE customer_id = 1;"
    ));
    let (customer, rental) = (
        counter.next_key("customer").unwrap(),
        counter.next_key("rental").unwrap(),
    );
    run(
        counter,
        &format!(
            "INSERT INTO customer (customer_id, owner, first_name, last_name, email)
             VALUES ({customer}, 'alice', 'BARBARA', 'JONES', 'barbara@example.org');
         INSERT INTO rental (rental_id, owner, rental_date, customer_id, film_id)
             VALUES ({rental}, 'alice', '2026-11-21 15:00:00.000000', 2, 1);
         UPDATE rental SET return_date = '2026-11-22 10:00:00.000000' WHERE rental_id = 1;
         UPDATE film SET special_features = '[\"Trailers\",\"Commentaries\"]' WHERE film_id = 1;"
        ),
    );
}

/// Round two: the same rows edited again (the trigger rewrote last_update: the device
/// must hold the server's value to edit without a conflict).
fn second_offline_edits(phone: &Client, counter: &Client) {
    run(
        phone,
        "UPDATE customer SET email = 'mary.s@example.org' WHERE customer_id = 1;
         UPDATE film SET rating = 'PG-13' WHERE film_id = 1;",
    );
    run(
        counter,
        "UPDATE rental SET return_date = '2026-11-23 11:00:00.000000' WHERE rental_id = 1;",
    );
}

#[tokio::test]
async fn a_rental_store_schema_ends_equal_on_both_devices_and_the_server() {
    let (url, server) = rowsync_testkit::fresh_database_with("worked", SERVER_SCHEMA).await;
    let address = serve(&url).await;
    let alice = SyncOptions::new(format!("tcp://{address}"), "alice", "alice-password");
    let dir = tempfile::tempdir().unwrap();
    let (mut phone, mut counter) = (device(dir.path(), "phone"), device(dir.path(), "counter"));
    sync(&mut phone, &alice).await;
    sync(&mut counter, &alice).await;

    first_offline_edits(&mut phone, &mut counter);
    // Meanwhile the back office: a customer by the sequence, and a payment moved to
    // another month (another partition, another key).
    server
        .batch_execute(
            "INSERT INTO customer (owner, first_name, last_name) VALUES ('alice', 'SUSAN', 'WILSON');
             UPDATE payment SET payment_date = '2026-11-02 08:00:00+00' WHERE payment_id = 1;",
        )
        .await
        .unwrap();
    sync(&mut phone, &alice).await;
    sync(&mut counter, &alice).await;
    sync(&mut phone, &alice).await;

    second_offline_edits(&phone, &counter);
    sync(&mut phone, &alice).await;
    sync(&mut counter, &alice).await;
    sync(&mut phone, &alice).await;

    assert_devices_match_server(&server, &phone, &counter).await;
}

/// Both devices hold the server's rows, compared row by row, with 5 customers (2
/// seeded, 1 per device, 1 from the back office), and keep no conflict and no refused
/// row.
async fn assert_devices_match_server(
    server: &tokio_postgres::Client,
    phone: &Client,
    counter: &Client,
) {
    for (table, (device_sql, server_sql)) in
        TABLES.iter().zip(DEVICE_ROWS.iter().zip(server_rows_sql()))
    {
        let on_server = server_rows(server, &server_sql).await;
        assert_eq!(
            device_rows(phone, device_sql),
            on_server,
            "{table}: phone and server"
        );
        assert_eq!(
            device_rows(counter, device_sql),
            on_server,
            "{table}: counter and server"
        );
    }
    let customers = server_rows(server, "SELECT count(*) FROM customer").await;
    assert_eq!(
        customers,
        [["5"]],
        "2 seeded, 1 per device, 1 from the back office"
    );
    for client in [phone, counter] {
        let kept: i64 = client
            .connection()
            .query_row("SELECT (SELECT count(*) FROM rs_client_conflict) + (SELECT count(*) FROM rs_client_rejected)", [], |row| row.get(0))
            .unwrap();
        assert_eq!(kept, 0);
    }
}

/// The same store, its devices syncing some tables at a time (protocol 9): the phone's
/// first sync takes the catalogue first, then each device syncs a table and, through
/// the foreign keys, its parents; the back office writes in between. Every table ends
/// equal on both devices and the server, row by row, with no conflict.
#[tokio::test]
async fn the_rental_store_ends_equal_when_devices_sync_some_tables_at_a_time() {
    let (url, server) = rowsync_testkit::fresh_database_with("worked_some", SERVER_SCHEMA).await;
    let address = serve(&url).await;
    let alice = SyncOptions::new(format!("tcp://{address}"), "alice", "alice-password");
    let only = |tables: &[&str]| SyncOptions {
        tables: tables.iter().map(|table| table.to_string()).collect(),
        ..alice.clone()
    };
    let dir = tempfile::tempdir().unwrap();
    let (mut phone, mut counter) = (device(dir.path(), "phone"), device(dir.path(), "counter"));
    let catalogue_first = SyncOptions {
        priorities: vec![vec!["film".into()]],
        ..alice.clone()
    };
    sync(&mut phone, &catalogue_first).await;
    sync(&mut counter, &only(&["rental"])).await;
    let count = |client: &Client, table: &str| -> i64 {
        let sql = format!("SELECT count(*) FROM {table}");
        client
            .connection()
            .query_row(&sql, [], |row| row.get(0))
            .unwrap()
    };
    // A rental's customer and film came with it (the device's foreign keys); its
    // payments, which reference it, did not.
    let counted = ["rental", "customer", "film", "payment"].map(|table| count(&counter, table));
    assert_eq!(counted, [1, 2, 1, 0]);
    sync(&mut counter, &only(&["payment"])).await;

    first_offline_edits(&mut phone, &mut counter);
    server
        .batch_execute(
            "INSERT INTO customer (owner, first_name, last_name) VALUES ('alice', 'SUSAN', 'WILSON');
             UPDATE payment SET payment_date = '2026-11-02 08:00:00+00' WHERE payment_id = 1;
             UPDATE customer SET email = 'patricia@example.org' WHERE customer_id = 2;",
        )
        .await
        .unwrap();
    sync(&mut phone, &only(&["customer"])).await;
    sync(&mut counter, &only(&["film"])).await;
    sync(&mut phone, &only(&["payment"])).await;
    sync(&mut counter, &alice).await;

    second_offline_edits(&phone, &counter);
    sync(&mut phone, &only(&["film"])).await;
    sync(&mut counter, &only(&["rental"])).await;
    sync(&mut phone, &catalogue_first).await;
    sync(&mut counter, &alice).await;
    assert_devices_match_server(&server, &phone, &counter).await;
}

fn device_rows(client: &Client, sql: &str) -> Vec<Vec<String>> {
    let mut statement = client.connection().prepare(sql).unwrap();
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

/// Rows as PostgreSQL's text output gives them (NULL as "NULL").
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
