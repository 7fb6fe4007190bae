//! A refused row is set aside, not a wall (issue 30, item 4), on every backend: the server
//! names each row it cannot take and applies nothing; the client keeps those changes in
//! `rs_client_rejected` with the reason, sends the rest in the same sync, and an app that
//! fixes a row re-queues it with one call. A table the server does not synchronize is
//! set aside the same way, and `untrack` keeps what the table had not uploaded.

#[macro_use]
mod backends;

use std::path::Path;

use backends::{options, Backend, MARIADB_CHECKED, POSTGRES_CHECKED, SQLITE_CHECKED};
use rowsync_client::Client;
use serde_json::json;

/// The client's `items`, with no check of its own: the server's refuses negative
/// quantities.
const CLIENT_ITEMS: &str =
    "CREATE TABLE items (id TEXT PRIMARY KEY, owner TEXT NOT NULL, body TEXT, quantity INTEGER)";

fn client(dir: &Path, name: &str) -> Client {
    let mut client = Client::open(dir.join(format!("{name}.db"))).unwrap();
    client.connection().execute_batch(CLIENT_ITEMS).unwrap();
    client.track("items").unwrap();
    client
}

fn write(client: &Client, sql: &str) {
    client.connection().execute_batch(sql).unwrap();
}

fn ids(rows: &[(String, String, Option<String>)]) -> Vec<&str> {
    rows.iter().map(|(id, _, _)| id.as_str()).collect()
}

/// One bad insert and one bad update among good rows: the good ones land in the same
/// sync, the bad ones are kept with the server's reason, later syncs go on, and a fixed
/// row re-queued reaches the server.
async fn a_refused_row_is_set_aside(backend: Backend) {
    let address = backend.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let mut phone = client(dir.path(), "phone");
    write(
        &phone,
        "INSERT INTO items VALUES ('i1', 'alice', 'good', 1)",
    );
    phone.sync(&options(address, "alice")).await.unwrap();
    write(
        &phone,
        "INSERT INTO items VALUES ('i2', 'alice', 'bad', -1);
         INSERT INTO items VALUES ('i3', 'alice', 'good', 3);
         UPDATE items SET quantity = -5, body = 'bad edit' WHERE id = 'i1';",
    );
    let report = phone.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(report.rows_rejected, 2, "{report:?}");
    assert_eq!(ids(&backend.items().await), ["i1", "i3"]);
    let rejected = phone.rejected_rows().unwrap();
    let summary: Vec<_> = rejected
        .iter()
        .map(|row| (row.operation.as_str(), row.key.clone(), row.code))
        .collect();
    assert_eq!(
        summary,
        [
            ("insert", json!({"id": "i2"}), 9),
            ("update", json!({"id": "i1"}), 9),
        ],
        "{rejected:?}"
    );
    assert_eq!(
        rejected[0].client_row.as_ref().unwrap()["quantity"],
        json!(-1)
    );
    assert_eq!(rejected[1].old_row.as_ref().unwrap()["body"], json!("good"));
    assert!(!rejected[0].reason.is_empty());

    // Not a wall: the next change goes up.
    write(
        &phone,
        "INSERT INTO items VALUES ('i4', 'alice', 'later', 4)",
    );
    let report = phone.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(
        (report.rows_uploaded, report.rows_rejected),
        (1, 0),
        "{report:?}"
    );

    // Fixed and re-queued, both reach the server; the set-aside list empties.
    write(
        &phone,
        "UPDATE items SET quantity = 2 WHERE id = 'i2';
         UPDATE items SET quantity = 5 WHERE id = 'i1';",
    );
    for row in &rejected {
        assert!(phone.requeue_rejected(row.id).unwrap());
    }
    let report = phone.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(
        (report.rows_rejected, report.conflicts),
        (0, 0),
        "{report:?}"
    );
    assert!(phone.rejected_rows().unwrap().is_empty());
    let server = backend.items().await;
    assert_eq!(ids(&server), ["i1", "i2", "i3", "i4"]);
    assert_eq!(server[0].2.as_deref(), Some("bad edit"));
}

/// An app that tracks a table the server does not synchronize: that table's rows are
/// set aside with the reason, every other table's rows go up; `untrack` then keeps what
/// the table logged since, and syncs stay clean.
async fn a_table_the_server_does_not_synchronize_is_set_aside(backend: Backend) {
    let address = backend.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let mut phone = client(dir.path(), "phone");
    write(
        &phone,
        "CREATE TABLE todo (id INTEGER PRIMARY KEY, title TEXT)",
    );
    phone.track("todo").unwrap();
    write(
        &phone,
        "INSERT INTO todo VALUES (1, 'buy milk');
         INSERT INTO items VALUES ('i1', 'alice', 'good', 1);",
    );
    let report = phone.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(report.rows_rejected, 1, "{report:?}");
    assert_eq!(ids(&backend.items().await), ["i1"]);
    let rejected = phone.rejected_rows().unwrap();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!((rejected[0].table.as_str(), rejected[0].code), ("todo", 7));
    assert!(
        rejected[0].reason.contains("not synchronized"),
        "{}",
        rejected[0].reason
    );

    write(&phone, "INSERT INTO todo VALUES (2, 'call bob')");
    assert_eq!(phone.untrack("todo").unwrap(), 1);
    write(&phone, "INSERT INTO todo VALUES (3, 'not tracked')");
    let rejected = phone.rejected_rows().unwrap();
    assert_eq!(rejected.len(), 2, "{rejected:?}");
    assert!(
        rejected[1].reason.contains("untracked"),
        "{}",
        rejected[1].reason
    );
    write(
        &phone,
        "INSERT INTO items VALUES ('i2', 'alice', 'good', 2)",
    );
    let report = phone.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(
        (report.rows_uploaded, report.rows_rejected),
        (1, 0),
        "{report:?}"
    );
    assert_eq!(ids(&backend.items().await), ["i1", "i2"]);
}

/// An upload first sent with a script version the server refuses (it does not have
/// it, or no longer) goes up with the version the app asks for next, not resent with
/// the refused one for ever.
async fn an_upload_refused_for_its_version_goes_with_the_next(backend: Backend) {
    let address = backend.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let mut phone = client(dir.path(), "phone");
    write(
        &phone,
        "INSERT INTO items VALUES ('i1', 'alice', 'good', 1)",
    );
    let wrong = rowsync_client::SyncOptions {
        script_version: "v9".into(),
        ..options(address, "alice")
    };
    let refused = phone.sync(&wrong).await.unwrap_err();
    assert!(refused.to_string().contains("v9"), "{refused}");
    write(
        &phone,
        "INSERT INTO items VALUES ('i2', 'alice', 'later', 2)",
    );
    let report = phone.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(report.rows_uploaded, 2, "{report:?}");
    assert_eq!(ids(&backend.items().await), ["i1", "i2"]);
}

on_backends!(a_refused_row_is_set_aside:
    sqlite_a_refused_row_is_set_aside => Backend::sqlite(&SQLITE_CHECKED),
    postgres_a_refused_row_is_set_aside => Backend::postgres(&POSTGRES_CHECKED),
    mariadb_a_refused_row_is_set_aside => Backend::mysql(&MARIADB_CHECKED),
);

on_every_backend!(
    a_table_the_server_does_not_synchronize_is_set_aside,
    an_upload_refused_for_its_version_goes_with_the_next,
);
