//! Keys for rows made offline (issue 31, item 4), on every backend: two devices insert
//! rows offline with keys from the ranges the server handed them, the back office
//! inserts with the table's own generator meanwhile, and every row reaches the server
//! with its key, with no conflict and no duplicate key; a device running low on keys
//! is handed a new range at its next sync.

#[macro_use]
mod backends;

use std::path::Path;

use backends::{options, Backend};
use rowsync_client::{Client, ClientError};
use rowsync_consolidated::{
    key_range_script, Consolidated, ConsolidatedConnection, KeyRangeInit, KeySpace,
};

const CLIENT_ITEMS: &str =
    "CREATE TABLE items (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, body TEXT)";
const RANGE_KEYS: i64 = 10;

fn device(dir: &Path, name: &str) -> Client {
    let mut client = Client::open(dir.join(format!("{name}.db"))).unwrap();
    client.connection().execute_batch(CLIENT_ITEMS).unwrap();
    client.track("items").unwrap();
    client
}

/// Inserts `count` rows with keys from the device's ranges; returns the keys.
fn insert_offline(client: &mut Client, owner: &str, count: usize) -> Vec<i64> {
    (0..count)
        .map(|n| {
            let key = client.next_key("items").unwrap();
            client
                .connection()
                .execute(
                    "INSERT INTO items (id, owner, body) VALUES (?1, ?2, ?3)",
                    rusqlite::params![key, owner, format!("made offline {n}")],
                )
                .unwrap();
            key
        })
        .collect()
}

async fn two_devices_insert_offline_without_a_collision(backend: Backend) {
    let address = backend.serve().await;
    backend
        .execute(
            "INSERT INTO items (owner, body) VALUES ('alice', 'office 1'), ('bob', 'office 2')",
        )
        .await
        .unwrap();
    let space = key_ranges(&backend).await;
    assert!(
        space.space_start > 2 && space.space_end > space.space_start,
        "{space:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let (mut phone, mut laptop) = (device(dir.path(), "phone"), device(dir.path(), "laptop"));
    assert!(matches!(
        phone.next_key("items"),
        Err(ClientError::NoKeys { .. })
    ));
    let (alice, bob) = (options(address, "alice"), options(address, "bob"));
    // At once: on PostgreSQL and MariaDB one sync meets the other's range and retries.
    let (first, second) = tokio::join!(phone.sync(&alice), laptop.sync(&bob));
    first.unwrap();
    second.unwrap();

    let phone_keys = insert_offline(&mut phone, "alice", 7);
    let laptop_keys = insert_offline(&mut laptop, "bob", 3);
    let all_keys: std::collections::BTreeSet<i64> =
        phone_keys.iter().chain(&laptop_keys).copied().collect();
    assert_eq!(all_keys.len(), 10, "{phone_keys:?} {laptop_keys:?}");
    assert!(all_keys
        .iter()
        .all(|key| (space.space_start..space.space_end).contains(key)));
    backend
        .execute("INSERT INTO items (owner, body) VALUES ('alice', 'office 3')")
        .await
        .expect("the back office's insert takes a key no device was handed");

    for (client, user) in [(&mut phone, &alice), (&mut laptop, &bob)] {
        let report = client.sync(user).await.unwrap();
        assert_eq!(report.conflicts, 0, "{report:?}");
    }
    phone.sync(&alice).await.unwrap();
    laptop.sync(&bob).await.unwrap();
    let server = server_rows(&backend).await;
    assert_eq!(server.len(), 13, "{server:?}");
    for key in &all_keys {
        assert!(
            server.iter().any(|(id, ..)| id == key),
            "key {key} missing: {server:?}"
        );
    }
    let office: Vec<i64> = server
        .iter()
        .filter(|(.., body)| body == "office 3")
        .map(|(id, ..)| *id)
        .collect();
    assert!(office[0] >= space.space_end, "{office:?} {space:?}");
    assert_eq!(local_rows(&phone), rows_of(&server, "alice"));
    assert_eq!(local_rows(&laptop), rows_of(&server, "bob"));

    // The phone had 3 keys left of 10: it was handed a new range, and has 13.
    let more: Vec<i64> = (0..13).map(|_| phone.next_key("items").unwrap()).collect();
    assert!(more.iter().all(|key| !all_keys.contains(key)), "{more:?}");
    assert!(matches!(
        phone.next_key("items"),
        Err(ClientError::NoKeys { .. })
    ));
}

on_backends!(two_devices_insert_offline_without_a_collision:
    sqlite_two_devices_insert_offline_without_a_collision => Backend::sqlite(&[
        "CREATE TABLE items (id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL, body TEXT)",
    ]),
    postgres_two_devices_insert_offline_without_a_collision => Backend::postgres(&[
        "CREATE TABLE items (id serial PRIMARY KEY, owner text NOT NULL, body text)",
    ]),
    mariadb_two_devices_insert_offline_without_a_collision => Backend::mysql(&[
        "CREATE TABLE items (id INT AUTO_INCREMENT PRIMARY KEY, owner VARCHAR(64) NOT NULL, body TEXT)",
    ]),
);

/// What `rowsync keys --table items --range-keys 10` does.
async fn key_ranges(backend: &Backend) -> KeySpace {
    match backend {
        Backend::Sqlite(dir) => {
            let path = dir.path().join("consolidated.db");
            set_up(rowsync_consolidated::sqlite::SqliteConsolidated::new(&path)).await
        }
        Backend::Postgres(url) => {
            set_up(rowsync_consolidated::postgres::PostgresConsolidated::new(
                url,
            ))
            .await
        }
        Backend::Mysql(url) => {
            set_up(rowsync_consolidated::mysql::MysqlConsolidated::new(url).unwrap()).await
        }
    }
}

async fn set_up<B: Consolidated>(backend: B) -> KeySpace {
    let mut connection = backend.connect().await.unwrap();
    let init = KeyRangeInit {
        table: "items".into(),
        column: None,
        script_version: "v1".into(),
        range_keys: RANGE_KEYS,
    };
    let space = connection.init_key_ranges(&init).await.unwrap();
    connection
        .set_script(&key_range_script(&init))
        .await
        .unwrap();
    let again = connection.init_key_ranges(&init).await.unwrap();
    assert_eq!(
        (again.space_start, again.space_end),
        (space.space_start, space.space_end)
    );
    space
}

/// The server's `items` as (id, owner, body), by id.
async fn server_rows(backend: &Backend) -> Vec<(i64, String, String)> {
    let sql = "SELECT id, owner, body FROM items ORDER BY id";
    match backend {
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
                .map(|row| (i64::from(row.get::<_, i32>(0)), row.get(1), row.get(2)))
                .collect()
        }
        Backend::Mysql(url) => {
            use mysql_async::prelude::Queryable;
            let mut connection = mysql_async::Conn::from_url(url).await.unwrap();
            connection.query(sql).await.unwrap()
        }
    }
}

fn rows_of(server: &[(i64, String, String)], owner: &str) -> Vec<(i64, String)> {
    server
        .iter()
        .filter(|(_, row_owner, _)| row_owner == owner)
        .map(|(id, _, body)| (*id, body.clone()))
        .collect()
}

fn local_rows(client: &Client) -> Vec<(i64, String)> {
    let mut statement = client
        .connection()
        .prepare("SELECT id, body FROM items ORDER BY id")
        .unwrap();
    let rows = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}
