//! Syncs of some tables and tables by priority (protocol v9, docs/client.md), against
//! a `rowsync serve` process on the store chain of docs/rules.md: a device syncs the
//! film catalogue alone, then its customers alone, each table from its own watermark;
//! a new device gets the catalogue committed before the rest arrives.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

mod support;

use std::path::Path;
use std::sync::{Arc, Mutex};

use rowsync_client::{Client, SyncOptions};
use support::{add_user, run_ok, serve, STORE_CHAIN, STORE_CHAIN_RULES};

/// The store chain served from `dir`, with mike (store 1) as a user; the central
/// database's path.
fn store_chain(dir: &Path) -> std::path::PathBuf {
    let central = dir.join("central.db");
    rusqlite::Connection::open(&central)
        .unwrap()
        .execute_batch(&format!(
            "{STORE_CHAIN}; CREATE INDEX rental_customer_id ON rental (customer_id);
             INSERT INTO customer VALUES (3, 1, 'BARBARA', NULL), (4, 1, 'SUSAN', NULL);"
        ))
        .unwrap();
    let rules = dir.join("rules.toml");
    std::fs::write(&rules, STORE_CHAIN_RULES).unwrap();
    let db = central.to_str().unwrap();
    run_ok(
        &[
            "rules",
            "apply",
            "--db",
            db,
            "--file",
            rules.to_str().unwrap(),
        ],
        "",
    );
    add_user(&central, "mike", "mike-password");
    central
}

/// A device of mike's with the client tables `rowsync schema` makes, all tracked.
fn device(central: &Path, name: &str) -> (Client, std::path::PathBuf) {
    let path = central.with_file_name(format!("{name}.db"));
    run_ok(
        &[
            "schema",
            "--db",
            central.to_str().unwrap(),
            "--client-db",
            path.to_str().unwrap(),
        ],
        "",
    );
    let mut client = Client::open(&path).unwrap();
    for table in ["customer", "film", "rental"] {
        client.track(table).unwrap();
    }
    (client, path)
}

fn rows(path: &Path, sql: &str) -> Vec<(i64, String)> {
    let connection = rusqlite::Connection::open(path).unwrap();
    let mut statement = connection.prepare(sql).unwrap();
    statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn customers(path: &Path) -> Vec<(i64, String)> {
    rows(path, "SELECT customer_id, name FROM customer ORDER BY 1")
}

fn films(path: &Path) -> Vec<(i64, String)> {
    rows(path, "SELECT film_id, title FROM film ORDER BY 1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_syncs_some_tables_each_from_its_own_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let central = store_chain(dir.path());
    let server = serve(&central, &[]);
    let (mut client, device) = device(&central, "mike");
    let options = SyncOptions::new(&server.address, "mike", "mike-password");
    let films_only = SyncOptions {
        tables: vec!["film".into()],
        ..options.clone()
    };
    client.sync(&films_only).await.unwrap();
    assert_eq!(films(&device), [(1, "ACADEMY DINOSAUR".to_string())]);
    assert_eq!(customers(&device), [], "a sync of film brings no customer");

    let office = rusqlite::Connection::open(&central).unwrap();
    office
        .execute_batch(
            "UPDATE film SET title = 'ACE GOLDFINGER' WHERE film_id = 1;
             UPDATE customer SET name = 'BARBRA' WHERE customer_id = 3;",
        )
        .unwrap();
    let customers_only = SyncOptions {
        tables: vec!["customer".into()],
        ..options.clone()
    };
    client.sync(&customers_only).await.unwrap();
    assert_eq!(
        customers(&device),
        [
            (1, "MARY".to_string()),
            (3, "BARBRA".to_string()),
            (4, "SUSAN".to_string())
        ]
    );
    assert_eq!(films(&device), [(1, "ACADEMY DINOSAUR".to_string())]);

    // Customer 3 changed on the server before this device's customer sync brought it:
    // judged by the customer table's watermark, its delete is no conflict.
    client
        .connection()
        .execute("DELETE FROM customer WHERE customer_id = 3", [])
        .unwrap();
    let report = client.sync(&options).await.unwrap();
    assert_eq!(report.conflicts, 0, "{report:?}");
    assert_eq!(films(&device), [(1, "ACE GOLDFINGER".to_string())]);
    let left: i64 = office
        .query_row(
            "SELECT count(*) FROM customer WHERE customer_id = 3",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(left, 0, "the device's delete reached the server");

    // An upload outside the tables synced stays for a sync that covers its table. The
    // row holds a DECIMAL the central SQLite keeps as a REAL: the client's column has
    // the same affinity (`rowsync schema`), so the row goes up unchanged.
    client
        .connection()
        .execute(
            "UPDATE customer SET name = 'MARIE' WHERE customer_id = 1",
            [],
        )
        .unwrap();
    let report = client.sync(&films_only).await.unwrap();
    assert_eq!(report.rows_uploaded, 0, "{report:?}");
    let report = client.sync(&options).await.unwrap();
    assert_eq!(
        (report.rows_uploaded, report.rows_rejected),
        (1, 0),
        "{report:?}"
    );
    let name: String = office
        .query_row(
            "SELECT name FROM customer WHERE customer_id = 1",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(name, "MARIE");

    let unknown = SyncOptions {
        tables: vec!["payment".into()],
        ..options.clone()
    };
    let error = client.sync(&unknown).await.unwrap_err().to_string();
    assert!(
        error.contains("\"payment\"") && error.contains("not tracked"),
        "{error}"
    );

    // The same refusal with an upload in flight (its sync failed): the option is refused
    // before the upload is sent again, so the sync that reports it is the next good one.
    client
        .connection()
        .execute("UPDATE customer SET name = 'MAY' WHERE customer_id = 1", [])
        .unwrap();
    let unreachable = SyncOptions {
        address: "tcp://127.0.0.1:1".into(),
        ..options.clone()
    };
    client.sync(&unreachable).await.unwrap_err();
    let error = client.sync(&unknown).await.unwrap_err().to_string();
    assert!(error.contains("not tracked"), "{error}");
    let name: String = office
        .query_row(
            "SELECT name FROM customer WHERE customer_id = 1",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(name, "MARIE", "a refused sync sent nothing");
    let report = client.sync(&options).await.unwrap();
    assert_eq!(report.rows_uploaded, 1, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_sync_commits_the_catalogue_before_the_rest_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let central = store_chain(dir.path());
    let server = serve(&central, &[]);
    let (mut client, device) = device(&central, "mike");
    let options = SyncOptions {
        priorities: vec![vec!["film".into()]],
        ..SyncOptions::new(&server.address, "mike", "mike-password")
    };
    // What another connection to the device sees while the download is applied.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_by_progress = Arc::clone(&seen);
    let watched = device.clone();
    let report = client
        .sync_with_progress(&options, &mut |progress| {
            if progress.rows_downloaded > 0 {
                let reader = rusqlite::Connection::open(&watched).unwrap();
                let count = |table: &str| -> i64 {
                    reader
                        .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
                            row.get(0)
                        })
                        .unwrap()
                };
                seen_by_progress
                    .lock()
                    .unwrap()
                    .push((count("film"), count("customer")));
            }
        })
        .await
        .unwrap();
    assert_eq!(report.rounds, 2, "{report:?}");
    assert_eq!(report.rows_downloaded, 1 + 3 + 1, "{report:?}");
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.contains(&(1, 0)),
        "the film was committed while the customers arrived: {seen:?}"
    );
    assert_eq!(films(&device).len(), 1);
    assert_eq!(customers(&device).len(), 3);
}

#[test]
fn rowsync_sync_takes_tables_and_priorities() {
    let dir = tempfile::tempdir().unwrap();
    let central = store_chain(dir.path());
    let server = serve(&central, &[]);
    let (client, device) = device(&central, "mike");
    drop(client);
    let sync = |extra: &[&str]| {
        let mut args = vec![
            "sync",
            "--db",
            device.to_str().unwrap(),
            "--server",
            &server.address,
            "--user",
            "mike",
            "--password-stdin",
        ];
        args.extend_from_slice(extra);
        run_ok(&args, "mike-password\n")
    };
    sync(&["--tables", "film"]);
    assert_eq!(films(&device).len(), 1);
    assert_eq!(customers(&device), []);
    sync(&["--priority", "customer,rental"]);
    assert_eq!(customers(&device).len(), 3);
}
