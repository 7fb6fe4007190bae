//! Partitioned consolidated tables (issue 31, items 2 and 5): rows that leave a
//! PostgreSQL partitioned table by any road (a cross-partition update, a delete aimed
//! at a partition, TRUNCATE, DETACH PARTITION, DROP TABLE of a partition, in
//! partitions made after `init` too) leave the devices at their next sync; and a user
//! name that does not fit the partition column is an error naming user, table and
//! column, on every backend.

#[macro_use]
mod backends;

use std::path::Path;

use backends::{options, Backend};
use rowsync_client::Client;
use rowsync_server::ServerConfig;

type Payment = (String, i64, String, Option<String>);

const PAYMENTS: [&str; 4] = [
    "CREATE TABLE items (paid_at date, id int, owner text NOT NULL, body text, \
     PRIMARY KEY (paid_at, id)) PARTITION BY RANGE (paid_at)",
    "CREATE TABLE items_2026_10 PARTITION OF items FOR VALUES FROM ('2026-10-01') TO ('2026-11-01')",
    "CREATE TABLE items_2026_11 PARTITION OF items FOR VALUES FROM ('2026-11-01') TO ('2026-12-01')",
    "CREATE TABLE items_2026_12 PARTITION OF items FOR VALUES FROM ('2026-12-01') TO ('2027-01-01')",
];

fn device(dir: &Path, name: &str) -> Client {
    let mut client = Client::open(dir.join(format!("{name}.db"))).unwrap();
    client
        .connection()
        .execute_batch(
            "CREATE TABLE items (paid_at TEXT, id INTEGER, owner TEXT NOT NULL, body TEXT, \
             PRIMARY KEY (paid_at, id))",
        )
        .unwrap();
    client.track("items").unwrap();
    client
}

fn device_rows(client: &Client) -> Vec<Payment> {
    let mut statement = client
        .connection()
        .prepare("SELECT paid_at, id, owner, body FROM items ORDER BY paid_at, id")
        .unwrap();
    let rows = statement
        .query_map([], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })
        .unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

async fn server_rows(backend: &Backend, owner: &str) -> Vec<Payment> {
    match backend {
        Backend::Postgres(url) => {
            let client = rowsync_testkit::connect(url).await;
            let rows = client
                .query(
                    "SELECT paid_at::text, id::bigint, owner, body FROM items WHERE owner = $1 \
                     ORDER BY paid_at, id",
                    &[&owner],
                )
                .await
                .unwrap();
            rows.iter()
                .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
                .collect()
        }
        Backend::Mysql(url) => {
            use mysql_async::prelude::Queryable;
            let mut connection = mysql_async::Conn::from_url(url).await.unwrap();
            connection
                .exec(
                    "SELECT CAST(paid_at AS CHAR), id, owner, body FROM items WHERE owner = ? \
                     ORDER BY paid_at, id",
                    (owner,),
                )
                .await
                .unwrap()
        }
        Backend::Sqlite(_) => unreachable!("SQLite has no partitioned tables"),
    }
}

/// Runs `sql` on the server, syncs both of alice's devices and checks each holds
/// exactly alice's rows of the server, row by row.
async fn after(
    backend: &Backend,
    devices: &mut [Client; 2],
    address: std::net::SocketAddr,
    sql: &str,
) {
    backend.execute(sql).await.unwrap();
    let expected = server_rows(backend, "alice").await;
    for client in devices.iter_mut() {
        let report = client.sync(&options(address, "alice")).await.unwrap();
        assert_eq!(report.conflicts, 0, "after {sql}: {report:?}");
        assert_eq!(device_rows(client), expected, "after {sql}");
    }
}

/// A payments table partitioned by month, two devices of alice: each way rows leave a
/// partition reaches both devices.
#[tokio::test]
async fn rows_leaving_partitions_leave_the_devices() {
    let backend = Backend::postgres(&PAYMENTS).await;
    let address = backend.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let mut devices = [device(dir.path(), "phone"), device(dir.path(), "laptop")];
    let steps = [
        "INSERT INTO items VALUES ('2026-10-05', 1, 'alice', 'a'), ('2026-10-06', 2, 'alice', 'b'), \
         ('2026-11-05', 3, 'alice', 'c'), ('2026-11-06', 4, 'alice', 'd'), \
         ('2026-12-05', 5, 'alice', 'e'), ('2026-12-06', 6, 'bob', 'f')",
        // A date corrected across months: the row moves to another partition.
        "UPDATE items SET paid_at = '2026-12-07' WHERE id = 3",
        // A retention job's delete aimed at a partition.
        "DELETE FROM items_2026_11 WHERE id = 4",
        "TRUNCATE items_2026_12",
        // A partition made after init, then a delete and a truncate aimed at it.
        "CREATE TABLE items_2027_01 PARTITION OF items FOR VALUES FROM ('2027-01-01') TO ('2027-02-01'); \
         INSERT INTO items VALUES ('2027-01-05', 7, 'alice', 'g'), ('2027-01-06', 8, 'alice', 'h'), \
         ('2027-01-07', 9, 'alice', 'i')",
        "DELETE FROM items_2027_01 WHERE id = 7",
        "UPDATE items SET paid_at = '2026-11-20' WHERE id = 8",
        "TRUNCATE items_2027_01",
        "ALTER TABLE items DETACH PARTITION items_2026_10",
        "DROP TABLE items_2026_11",
        "INSERT INTO items VALUES ('2026-12-10', 10, 'alice', 'j'), ('2027-01-10', 11, 'alice', 'k')",
        "TRUNCATE items",
    ];
    for sql in steps {
        after(&backend, &mut devices, address, sql).await;
    }
    assert!(device_rows(&devices[0]).is_empty());
}

/// MariaDB fires row triggers on a partitioned table whichever partition a row is in
/// or moves to: rows moved across partitions, and deleted from one partition by name,
/// leave the devices (its partition maintenance, which fires none, is documented as
/// untracked in docs/system-tables.md).
#[tokio::test]
async fn mariadb_rows_leaving_partitions_leave_the_devices() {
    let backend = Backend::mysql(&["CREATE TABLE items (paid_at DATE, id INT, \
         owner VARCHAR(64) NOT NULL, body TEXT, PRIMARY KEY (paid_at, id)) \
         PARTITION BY RANGE COLUMNS (paid_at) (\
         PARTITION p2026_10 VALUES LESS THAN ('2026-11-01'), \
         PARTITION p2026_11 VALUES LESS THAN ('2026-12-01'), \
         PARTITION pmax VALUES LESS THAN (MAXVALUE))"])
    .await;
    let address = backend.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let mut devices = [device(dir.path(), "phone"), device(dir.path(), "laptop")];
    let steps = [
        "INSERT INTO items VALUES ('2026-10-05', 1, 'alice', 'a'), ('2026-10-06', 2, 'alice', 'b'), \
         ('2026-11-05', 3, 'alice', 'c'), ('2026-12-05', 4, 'bob', 'd')",
        "UPDATE items SET paid_at = '2026-11-07' WHERE id = 1",
        "DELETE FROM items PARTITION (p2026_10) WHERE id = 2",
    ];
    for sql in steps {
        after(&backend, &mut devices, address, sql).await;
    }
    assert_eq!(device_rows(&devices[0]).len(), 2);
}

/// A partition dropped where its name is not in the statement cannot leave tombstones:
/// the drop is refused, saying to detach it first.
#[tokio::test]
async fn a_partition_dropped_unseen_is_refused() {
    let backend = Backend::postgres(&PAYMENTS).await;
    backend.serve().await;
    let refused = backend
        .execute("DO $$ BEGIN EXECUTE 'DROP TABLE items_' || '2026_11'; END $$")
        .await
        .unwrap_err();
    assert!(refused.contains("DETACH PARTITION"), "{refused}");
    backend
        .execute("ALTER TABLE items DETACH PARTITION items_2026_11; DROP TABLE items_2026_11")
        .await
        .unwrap();
}

/// Only a superuser may create the event triggers that follow partitions: a first
/// `init` of a partitioned table by another role is refused saying so, and a
/// superuser's passes.
#[tokio::test]
async fn a_first_partitioned_table_needs_a_superuser() {
    let backend = Backend::postgres(&PAYMENTS).await;
    let Backend::Postgres(url) = &backend else {
        unreachable!()
    };
    let database = url.rsplit('/').next().unwrap();
    let role = format!("{database}_owner");
    backend
        .execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT ALL ON SCHEMA public TO {role}; \
             ALTER TABLE items OWNER TO {role}; ALTER TABLE items_2026_10 OWNER TO {role}; \
             ALTER TABLE items_2026_11 OWNER TO {role}; ALTER TABLE items_2026_12 OWNER TO {role}"
        ))
        .await
        .unwrap();
    let (scheme, rest) = url.split_once("://").unwrap();
    let (_, place) = rest.split_once('@').unwrap();
    let as_role = Backend::Postgres(format!("{scheme}://{role}@{place}"));
    let refused = as_role
        .serve_by(ServerConfig::default(), "owner")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("is partitioned") && refused.contains("superuser"),
        "{refused}"
    );
    backend.serve().await;
}

/// A plain table truncated: its rows leave the devices.
#[tokio::test]
async fn a_truncated_table_leaves_the_devices() {
    let backend = Backend::postgres(&[
        "CREATE TABLE items (paid_at date, id int, owner text NOT NULL, body text, \
         PRIMARY KEY (paid_at, id))",
    ])
    .await;
    let address = backend.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let mut devices = [device(dir.path(), "phone"), device(dir.path(), "laptop")];
    after(
        &backend,
        &mut devices,
        address,
        "INSERT INTO items VALUES ('2026-10-05', 1, 'alice', 'a'), ('2026-10-06', 2, 'bob', 'b')",
    )
    .await;
    after(&backend, &mut devices, address, "TRUNCATE items").await;
    assert!(device_rows(&devices[1]).is_empty());
}

/// Items partitioned by an integer `store` column, while user names are text: `init`
/// says so when it knows the users, and a sync of a user whose name is no store is an
/// error naming user, table and column, never an empty download.
async fn a_user_name_that_is_no_partition_value_is_an_error(backend: Backend) {
    let address = backend
        .serve_by(ServerConfig::default(), "store")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut client = Client::open(dir.path().join("phone.db")).unwrap();
    client
        .connection()
        .execute_batch(
            "CREATE TABLE items (id TEXT PRIMARY KEY, store INTEGER NOT NULL, body TEXT)",
        )
        .unwrap();
    client.track("items").unwrap();
    let error = client
        .sync(&options(address, "alice"))
        .await
        .unwrap_err()
        .to_string();
    for word in ["alice", "items", "store"] {
        assert!(error.contains(word), "{word} not in: {error}");
    }
    let again = backend.serve_by(ServerConfig::default(), "store").await;
    let error = again.unwrap_err().to_string();
    for word in ["alice", "items", "store"] {
        assert!(error.contains(word), "init, {word} not in: {error}");
    }
}

on_backends!(a_user_name_that_is_no_partition_value_is_an_error:
    postgres_a_user_name_that_is_no_partition_value_is_an_error => Backend::postgres(&[
        "CREATE TABLE items (id text PRIMARY KEY, store int NOT NULL, body text)",
        "INSERT INTO items VALUES ('a', 1, 'store one')",
    ]),
    mariadb_a_user_name_that_is_no_partition_value_is_an_error => Backend::mysql(&[
        "CREATE TABLE items (id VARCHAR(64) PRIMARY KEY, store INT NOT NULL, body TEXT)",
        "INSERT INTO items VALUES ('a', 0, 'store zero')",
    ]),
    sqlite_a_user_name_that_is_no_partition_value_is_an_error => Backend::sqlite(&[
        "CREATE TABLE items (id TEXT PRIMARY KEY, store INTEGER NOT NULL, body TEXT)",
        "INSERT INTO items VALUES ('a', 0, 'store zero')",
    ]),
);
