//! No write lost at the client's edge (issue 30), on every backend: rows a table held
//! before it was tracked are uploaded, and the losing side of every conflict is kept in
//! the client database with the server's winning row, never silently dropped.
//!
//! Each test runs on a SQLite, a PostgreSQL and a MariaDB consolidated database, with a
//! table partitioned by its `owner` column and two users, through a real server.

#[macro_use]
mod backends;

use std::path::Path;

use backends::{options, Backend, CLIENT_DDL};
use rowsync_client::{Client, ExistingRows, KeptConflict};
use serde_json::json;

/// A client database with `items` created; `before_tracking` runs before `track`.
fn client(dir: &Path, name: &str, before_tracking: &str, existing: ExistingRows) -> Client {
    let mut client = Client::open(dir.join(format!("{name}.db"))).unwrap();
    client.connection().execute_batch(CLIENT_DDL).unwrap();
    client.connection().execute_batch(before_tracking).unwrap();
    client.track_with("items", existing).unwrap();
    client
}

/// A client's `items` rows as (id, owner, body), by id.
fn local_items(client: &Client) -> Vec<(String, String, Option<String>)> {
    let mut statement = client
        .connection()
        .prepare("SELECT id, owner, body FROM items ORDER BY id")
        .unwrap();
    let rows = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

fn row(id: &str, owner: &str, body: &str) -> (String, String, Option<String>) {
    (id.into(), owner.into(), Some(body.into()))
}

/// Rows a table held when first tracked reach the server; those that came from the
/// server are not uploaded again, and their later edits go up without a conflict.
async fn existing_rows_are_uploaded(backend: Backend) {
    let address = backend.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let mut phone = client(
        dir.path(),
        "phone",
        "INSERT INTO items VALUES ('p1', 'alice', 'before tracking', 1)",
        ExistingRows::Upload,
    );
    let report = phone.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(
        (report.rows_uploaded, report.conflicts),
        (1, 0),
        "{report:?}"
    );
    assert_eq!(
        backend.items().await,
        [row("p1", "alice", "before tracking")]
    );
    phone
        .connection()
        .execute_batch("UPDATE items SET body = 'edited' WHERE id = 'p1'")
        .unwrap();
    let report = phone.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(
        (report.rows_uploaded, report.conflicts),
        (1, 0),
        "{report:?}"
    );
    assert_eq!(backend.items().await, [row("p1", "alice", "edited")]);

    // A copy of the server's row shipped with the app: not uploaded; edits of it are.
    let mut laptop = client(
        dir.path(),
        "laptop",
        "INSERT INTO items VALUES ('p1', 'alice', 'edited', 1)",
        ExistingRows::FromServer,
    );
    let report = laptop.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(
        (report.rows_uploaded, report.conflicts),
        (0, 0),
        "{report:?}"
    );
    laptop
        .connection()
        .execute_batch("UPDATE items SET body = 'from the laptop' WHERE id = 'p1'")
        .unwrap();
    let report = laptop.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(
        (report.rows_uploaded, report.conflicts),
        (1, 0),
        "{report:?}"
    );
    assert_eq!(
        backend.items().await,
        [row("p1", "alice", "from the laptop")]
    );
    assert!(laptop.kept_conflicts().unwrap().is_empty());
}

/// Every losing change is kept with the server's row: two devices inserting the same new
/// key, a key that exists in another user's partition, an update of a row the server
/// does not have.
async fn losing_sides_of_conflicts_are_kept(backend: Backend) {
    let address = backend.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let (alice, bob) = (options(address, "alice"), options(address, "bob"));
    let mut first = client(dir.path(), "first", "", ExistingRows::Upload);
    let mut second = client(dir.path(), "second", "", ExistingRows::Upload);
    first.sync(&alice).await.unwrap();
    second.sync(&alice).await.unwrap();
    let insert = "INSERT INTO items VALUES ('k1', 'alice', ?1, 1)";
    first.connection().execute(insert, ["first's"]).unwrap();
    second.connection().execute(insert, ["second's"]).unwrap();
    first.sync(&alice).await.unwrap();
    let report = second.sync(&alice).await.unwrap();
    assert_eq!(
        (report.conflicts, report.conflicts_kept),
        (1, 1),
        "{report:?}"
    );
    assert_eq!(local_items(&second), [row("k1", "alice", "first's")]);
    let kept = second.kept_conflicts().unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let expected_client = json!({"id": "k1", "owner": "alice", "body": "second's", "quantity": 1});
    assert_kept(&kept[0], "insert", Some(expected_client));
    let server_row = kept[0].server_row.as_ref().expect("the server's row");
    assert_eq!(server_row["body"], json!("first's"), "{server_row}");

    // Bob's new row takes a key alice's partition holds: the server keeps alice's row
    // (bob may not see it), bob's device loses its row, and keeps it here.
    let mut tablet = client(dir.path(), "tablet", "", ExistingRows::Upload);
    tablet
        .connection()
        .execute_batch("INSERT INTO items VALUES ('k1', 'bob', 'bob''s', 2)")
        .unwrap();
    let report = tablet.sync(&bob).await.unwrap();
    assert_eq!(
        (report.conflicts, report.conflicts_kept),
        (1, 1),
        "{report:?}"
    );
    let kept = tablet.kept_conflicts().unwrap();
    let expected_client = json!({"id": "k1", "owner": "bob", "body": "bob's", "quantity": 2});
    assert_kept(&kept[0], "insert", Some(expected_client));
    assert_eq!(kept[0].server_row, None, "{kept:?}");

    // An update of a row the server never had (the device believed it came from there).
    let mut laptop = client(
        dir.path(),
        "laptop",
        "INSERT INTO items VALUES ('ghost', 'alice', 'old', 3)",
        ExistingRows::FromServer,
    );
    laptop
        .connection()
        .execute_batch("UPDATE items SET body = 'new' WHERE id = 'ghost'")
        .unwrap();
    let report = laptop.sync(&alice).await.unwrap();
    assert_eq!(
        (report.conflicts, report.conflicts_kept),
        (1, 1),
        "{report:?}"
    );
    let kept = laptop.kept_conflicts().unwrap();
    let expected_client = json!({"id": "ghost", "owner": "alice", "body": "new", "quantity": 3});
    assert_kept(&kept[0], "update", Some(expected_client));
    assert_eq!(kept[0].server_row, None);

    // Kept until the application removes it.
    assert!(laptop.remove_kept_conflict(kept[0].id).unwrap());
    assert!(laptop.kept_conflicts().unwrap().is_empty());
    assert!(!laptop.remove_kept_conflict(kept[0].id).unwrap());
    let report = laptop.sync(&alice).await.unwrap();
    assert_eq!(report.conflicts_kept, 0);
    assert_eq!(backend.items().await, [row("k1", "alice", "first's")]);
}

fn assert_kept(kept: &KeptConflict, operation: &str, client_row: Option<serde_json::Value>) {
    assert_eq!(kept.table, "items", "{kept:?}");
    assert_eq!(kept.operation, operation, "{kept:?}");
    let id = client_row.as_ref().map(|row| row["id"].clone());
    assert_eq!(Some(kept.key["id"].clone()), id, "{kept:?}");
    assert_eq!(kept.client_row, client_row, "{kept:?}");
}

/// A device whose `items` refuse a body of 'bad' (so a download can fail to apply),
/// holding the rows `rows_sql` writes before it is tracked.
fn checked_device(dir: &Path, rows_sql: &str) -> Client {
    let mut phone = Client::open(dir.join("phone.db")).unwrap();
    phone
        .connection()
        .execute_batch(
            "CREATE TABLE items (id TEXT PRIMARY KEY, owner TEXT NOT NULL, \
             body TEXT CHECK (body <> 'bad'), quantity INTEGER)",
        )
        .unwrap();
    phone.connection().execute_batch(rows_sql).unwrap();
    phone.track("items").unwrap();
    phone
}

/// A losing change whose download the device did not apply (cut, or here: a row of it
/// breaks the device's own CHECK): the upload is resent, answered as applied before,
/// and its loss is still kept, not taken silently by the download.
async fn a_conflict_of_an_upload_applied_before_is_kept(backend: Backend) {
    let address = backend.serve().await;
    let alice = options(address, "alice");
    let dir = tempfile::tempdir().unwrap();
    let mut other = client(
        dir.path(),
        "other",
        "INSERT INTO items VALUES ('k1', 'alice', 'theirs', 1); \
         INSERT INTO items VALUES ('x1', 'alice', 'bad', 1);",
        ExistingRows::Upload,
    );
    other.sync(&alice).await.unwrap();
    let mut phone = checked_device(
        dir.path(),
        "INSERT INTO items VALUES ('k1', 'alice', 'mine', 2)",
    );
    assert!(
        phone.sync(&alice).await.is_err(),
        "the download breaks the CHECK"
    );
    other
        .connection()
        .execute_batch("UPDATE items SET body = 'good' WHERE id = 'x1'")
        .unwrap();
    other.sync(&alice).await.unwrap();

    let report = phone.sync(&alice).await.unwrap();
    assert!(report.upload_already_applied, "{report:?}");
    assert_eq!(local_items(&phone)[0], row("k1", "alice", "theirs"));
    let kept = phone.kept_conflicts().unwrap();
    let expected_client = json!({"id": "k1", "owner": "alice", "body": "mine", "quantity": 2});
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_kept(&kept[0], "insert", Some(expected_client));
}

/// A device deletes a row another device changed after the first last downloaded it:
/// the change is not lost to the delete; the delete is the losing side, kept, and the
/// row comes back to the device.
async fn a_delete_of_a_row_changed_since_is_a_conflict(backend: Backend) {
    let address = backend.serve().await;
    let alice = options(address, "alice");
    let dir = tempfile::tempdir().unwrap();
    let mut first = client(dir.path(), "first", "", ExistingRows::Upload);
    let mut second = client(dir.path(), "second", "", ExistingRows::Upload);
    first
        .connection()
        .execute_batch("INSERT INTO items VALUES ('k1', 'alice', 'one', 1)")
        .unwrap();
    first.sync(&alice).await.unwrap();
    second.sync(&alice).await.unwrap();
    first
        .connection()
        .execute_batch("UPDATE items SET body = 'changed' WHERE id = 'k1'")
        .unwrap();
    first.sync(&alice).await.unwrap();
    second
        .connection()
        .execute_batch("DELETE FROM items WHERE id = 'k1'")
        .unwrap();
    let report = second.sync(&alice).await.unwrap();
    assert_eq!(
        (report.conflicts, report.conflicts_kept),
        (1, 1),
        "{report:?}"
    );
    assert_eq!(backend.items().await, [row("k1", "alice", "changed")]);
    assert_eq!(local_items(&second), [row("k1", "alice", "changed")]);
    let kept = second.kept_conflicts().unwrap();
    assert_eq!(kept[0].operation, "delete", "{kept:?}");

    // Seen now, the row can be deleted.
    second
        .connection()
        .execute_batch("DELETE FROM items WHERE id = 'k1'")
        .unwrap();
    let report = second.sync(&alice).await.unwrap();
    assert_eq!(report.conflicts, 0, "{report:?}");
    assert!(backend.items().await.is_empty());
}

/// A delete made while the device had an upload to send again: the resend's download
/// brings the row another device changed meanwhile, which the device's pending delete
/// never saw. The delete loses and is kept; the change stays on the server.
async fn a_pending_delete_of_a_row_changed_since_is_kept(backend: Backend) {
    let address = backend.serve().await;
    let alice = options(address, "alice");
    let dir = tempfile::tempdir().unwrap();
    let mut other = client(
        dir.path(),
        "other",
        "INSERT INTO items VALUES ('k1', 'alice', 'one', 1)",
        ExistingRows::Upload,
    );
    other.sync(&alice).await.unwrap();
    let mut phone = checked_device(dir.path(), "");
    phone.sync(&alice).await.unwrap();
    let write = |client: &Client, sql: &str| client.connection().execute_batch(sql).unwrap();
    write(&other, "INSERT INTO items VALUES ('x1', 'alice', 'bad', 1)");
    other.sync(&alice).await.unwrap();
    write(
        &phone,
        "INSERT INTO items VALUES ('p1', 'alice', 'mine', 1)",
    );
    assert!(
        phone.sync(&alice).await.is_err(),
        "the download breaks the CHECK"
    );
    write(
        &other,
        "UPDATE items SET body = 'good' WHERE id = 'x1'; \
         UPDATE items SET body = 'changed' WHERE id = 'k1';",
    );
    other.sync(&alice).await.unwrap();

    write(&phone, "DELETE FROM items WHERE id = 'k1'");
    let report = phone.sync(&alice).await.unwrap();
    assert!(report.upload_already_applied, "{report:?}");
    let server = backend.items().await;
    assert_eq!(server[0], row("k1", "alice", "changed"), "{server:?}");
    assert_eq!(local_items(&phone)[0], row("k1", "alice", "changed"));
    let kept = phone.kept_conflicts().unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        (kept[0].operation.as_str(), &kept[0].key),
        ("delete", &json!({"id": "k1"}))
    );
    assert_eq!(
        kept[0].server_row.as_ref().unwrap()["body"],
        json!("changed")
    );
}

on_every_backend!(
    a_pending_delete_of_a_row_changed_since_is_kept,
    a_delete_of_a_row_changed_since_is_a_conflict,
    existing_rows_are_uploaded,
    losing_sides_of_conflicts_are_kept,
    a_conflict_of_an_upload_applied_before_is_kept,
);

/// The device's copy of `items` in a schema whose server changes rows as they are
/// written: a `last_update` stamped by a trigger, a price kept at two decimals.
const STAMPED_CLIENT_DDL: &str = "CREATE TABLE items (id TEXT PRIMARY KEY, owner TEXT NOT NULL, \
     body TEXT, price TEXT, last_update TEXT)";

/// Rows the server stores otherwise than the device sent them come back in the same
/// sync (issue 31, item 1): a device editing the same row twice loses neither edit, and
/// ends holding exactly the server's row.
async fn rows_the_server_changes_come_back(backend: Backend) {
    let address = backend.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let alice = options(address, "alice");
    let open = |name: &str| {
        let mut client = Client::open(dir.path().join(format!("{name}.db"))).unwrap();
        client
            .connection()
            .execute_batch(STAMPED_CLIENT_DDL)
            .unwrap();
        client.track("items").unwrap();
        client
    };
    let mut phone = open("phone");
    phone
        .connection()
        .execute_batch(
            "INSERT INTO items VALUES ('i1', 'alice', 'first', '5', '2026-01-01 00:00:00')",
        )
        .unwrap();
    let report = phone.sync(&alice).await.unwrap();
    assert_eq!(report.conflicts, 0, "{report:?}");
    for body in ["second", "third", "fourth"] {
        phone
            .connection()
            .execute("UPDATE items SET body = ?1 WHERE id = 'i1'", [body])
            .unwrap();
        let report = phone.sync(&alice).await.unwrap();
        assert_eq!(
            (report.rows_uploaded, report.conflicts),
            (1, 0),
            "editing to {body:?}: {:?}",
            report.conflicted_rows
        );
    }
    assert_eq!(backend.items().await, [row("i1", "alice", "fourth")]);
    // A new device gets the server's rows: the phone holds exactly the same.
    let mut laptop = open("laptop");
    laptop.sync(&alice).await.unwrap();
    let phone_rows = stamped_items(&phone);
    assert_eq!(phone_rows, stamped_items(&laptop));
    let sent_stamp = rusqlite::types::Value::Text("2026-01-01 00:00:00".into());
    assert_ne!(
        phone_rows[0][4], sent_stamp,
        "the server's stamp: {phone_rows:?}"
    );
    assert!(phone.kept_conflicts().unwrap().is_empty());
}

fn stamped_items(client: &Client) -> Vec<Vec<rusqlite::types::Value>> {
    let mut statement = client
        .connection()
        .prepare("SELECT id, owner, body, price, last_update FROM items ORDER BY id")
        .unwrap();
    let rows = statement
        .query_map([], |row| (0..5).map(|i| row.get(i)).collect())
        .unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

/// As the DVD-rental sample: a BEFORE UPDATE trigger sets last_update = now().
const POSTGRES_STAMPED: [&str; 3] = [
    "CREATE TABLE items (id text PRIMARY KEY, owner text NOT NULL, body text, \
     price numeric(5,2), last_update timestamptz NOT NULL DEFAULT now())",
    "CREATE FUNCTION last_updated() RETURNS trigger LANGUAGE plpgsql AS $$ \
     BEGIN NEW.last_update = clock_timestamp(); RETURN NEW; END $$",
    "CREATE TRIGGER last_updated BEFORE UPDATE ON items FOR EACH ROW \
     EXECUTE FUNCTION last_updated()",
];

/// As the Sakila sample: last_update ON UPDATE CURRENT_TIMESTAMP.
const MARIADB_STAMPED: [&str; 1] = ["CREATE TABLE items (id VARCHAR(64) PRIMARY KEY, \
     owner VARCHAR(64) NOT NULL, body TEXT, price DECIMAL(5,2), last_update TIMESTAMP(6) \
     NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6))"];

const SQLITE_STAMPED: [&str; 2] = [
    "CREATE TABLE items (id TEXT PRIMARY KEY, owner TEXT NOT NULL, body TEXT, \
     price TEXT, last_update TEXT)",
    "CREATE TRIGGER last_updated AFTER UPDATE OF body ON items BEGIN \
     UPDATE items SET last_update = strftime('%Y-%m-%d %H:%M:%f', 'now') WHERE id = NEW.id; \
     END",
];

on_backends!(rows_the_server_changes_come_back:
    postgres_rows_the_server_changes_come_back => Backend::postgres(&POSTGRES_STAMPED),
    mariadb_rows_the_server_changes_come_back => Backend::mysql(&MARIADB_STAMPED),
    sqlite_rows_the_server_changes_come_back => Backend::sqlite(&SQLITE_STAMPED),
);

/// A key the device writes in another form than its column stores (a timestamp
/// without its fraction): the device ends holding the server's row once, in the
/// server's form, not its own row beside it (issue 31, item 1).
async fn a_key_written_in_another_form_ends_as_one_row(backend: Backend) {
    let address = backend.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let alice = options(address, "alice");
    let open = |name: &str| {
        let mut client = Client::open(dir.path().join(format!("{name}.db"))).unwrap();
        client
            .connection()
            .execute_batch(
                "CREATE TABLE items (paid_at TEXT, id INTEGER, owner TEXT NOT NULL, \
                 amount TEXT, PRIMARY KEY (paid_at, id))",
            )
            .unwrap();
        client.track("items").unwrap();
        client
    };
    let mut phone = open("phone");
    phone
        .connection()
        .execute_batch("INSERT INTO items VALUES ('2026-11-27 09:01:00', 2, 'alice', '5')")
        .unwrap();
    let report = phone.sync(&alice).await.unwrap();
    assert_eq!(report.conflicts, 0, "{report:?}");
    let rows = |client: &Client| -> Vec<(String, i64, String)> {
        let mut statement = client
            .connection()
            .prepare("SELECT paid_at, id, amount FROM items ORDER BY paid_at, id")
            .unwrap();
        let rows = statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
            .unwrap();
        rows.collect::<Result<_, _>>().unwrap()
    };
    let mut laptop = open("laptop");
    laptop.sync(&alice).await.unwrap();
    assert_eq!(rows(&phone), rows(&laptop), "one row, the server's");
    phone
        .connection()
        .execute_batch("UPDATE items SET amount = '6.00'")
        .unwrap();
    let report = phone.sync(&alice).await.unwrap();
    assert_eq!(
        (report.rows_uploaded, report.conflicts),
        (1, 0),
        "{report:?}"
    );
    laptop.sync(&alice).await.unwrap();
    assert_eq!(rows(&phone), rows(&laptop));
    assert_eq!(rows(&phone).len(), 1);
}

on_backends!(a_key_written_in_another_form_ends_as_one_row:
    postgres_a_key_written_in_another_form_ends_as_one_row => Backend::postgres(&[
        "CREATE TABLE items (paid_at timestamptz, id int, owner text NOT NULL, \
         amount numeric(5,2), PRIMARY KEY (paid_at, id))",
    ]),
    mariadb_a_key_written_in_another_form_ends_as_one_row => Backend::mysql(&[
        "CREATE TABLE items (paid_at DATETIME(6), id INT, owner VARCHAR(64) NOT NULL, \
         amount DECIMAL(5,2), PRIMARY KEY (paid_at, id))",
    ]),
);
