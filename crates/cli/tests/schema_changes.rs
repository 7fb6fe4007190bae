//! The schema-change procedure of docs/schema-changes.md, end to end, against one
//! `rowsync serve` process that is never restarted: a column added while a client has
//! an upload in flight and changes pending, old and new clients syncing the same table
//! at once, a new table, a dropped column.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

use rowsync_client::{Client, SyncOptions};
use rowsync_consolidated::mysql::MysqlConsolidated;
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection};
use rowsync_protocol::Value;

const NOTES: &str = "CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, body TEXT)";

fn rowsync(args: &[&str], stdin: &str) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rowsync"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "rowsync {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn init(db: &str, table: &str) -> String {
    rowsync(
        &[
            "init",
            "--db",
            db,
            "--table",
            table,
            "--partition-column",
            "owner",
        ],
        "",
    )
}

/// The server process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(db: &str) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rowsync"))
        .args(["serve", "--db", db, "--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    stderr.read_line(&mut banner).unwrap();
    assert!(banner.starts_with("rowsync serving"), "{banner}");
    // Keep reading so the server never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let address = banner.trim().rsplit(' ').next().unwrap().to_string();
    (Server(child), address)
}

fn show(value: &Value) -> String {
    match value {
        Value::Null => "NULL".into(),
        Value::Int(number) => number.to_string(),
        Value::Text(text) => text.clone(),
        other => format!("{other:?}"),
    }
}

fn rows_of(rows: Vec<Vec<Value>>) -> Vec<String> {
    rows.iter()
        .map(|row| row.iter().map(show).collect::<Vec<_>>().join("|"))
        .collect()
}

async fn central_rows<B: Consolidated>(central: &B, sql: &str) -> Vec<String> {
    let mut connection = central.connect().await.unwrap();
    rows_of(connection.query_sql(sql).await.unwrap())
}

async fn central_execute<B: Consolidated>(central: &B, sql: &str) {
    let mut connection = central.connect().await.unwrap();
    connection
        .execute_sql(sql)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

fn client_rows(client: &Client, sql: &str) -> Vec<String> {
    let mut statement = client.connection().prepare(sql).unwrap();
    let width = statement.column_count();
    let rows = statement
        .query_map([], |row| {
            (0..width).map(|i| row.get::<_, Value>(i)).collect()
        })
        .unwrap()
        .collect::<Result<Vec<Vec<Value>>, _>>()
        .unwrap();
    rows_of(rows)
}

fn execute(client: &Client, sql: &str) {
    client
        .connection()
        .execute_batch(sql)
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

fn options(address: &str, version: &str) -> SyncOptions {
    let mut options = SyncOptions::new(address, "erin", "erin-secret");
    options.script_version = version.into();
    options
}

/// A loopback address nothing listens on.
fn dead_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    address
}

fn new_client(dir: &std::path::Path, name: &str) -> Client {
    let mut client = Client::open(dir.join(format!("{name}.db"))).unwrap();
    execute(&client, NOTES);
    client.track("notes").unwrap();
    client
}

/// `notes` exists in `db` with erin's note 1; `central` reaches the same database.
async fn schema_change_scenario<B: Consolidated>(db: &str, central: B) {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        init(db, "notes").contains("created"),
        "a fresh database gets v1"
    );
    rowsync(
        &["user", "add", "--db", db, "--name", "erin"],
        "erin-secret\n",
    );
    let (_server, address) = serve(db);
    let mut old = new_client(dir.path(), "old");
    let mut new = new_client(dir.path(), "new");
    old.sync(&options(&address, "v1")).await.unwrap();
    new.sync(&options(&address, "v1")).await.unwrap();

    // The client to be upgraded has an upload in flight (sent, never answered) and a
    // change pending when the server's table changes.
    execute(&new, "UPDATE notes SET body = 'one, edited' WHERE id = 1");
    assert!(new.sync(&options(&dead_address(), "v1")).await.is_err());
    execute(
        &new,
        "INSERT INTO notes (id, owner, body) VALUES (2, 'erin', 'two')",
    );

    central_execute(
        &central,
        "ALTER TABLE notes ADD COLUMN priority INTEGER DEFAULT 0",
    )
    .await;
    let added = init(db, "notes");
    assert!(
        added.contains("script version v2 created as a copy of v1"),
        "{added}"
    );

    // The old client keeps syncing v1: its insert takes the column's default.
    execute(
        &old,
        "INSERT INTO notes (id, owner, body) VALUES (3, 'erin', 'three')",
    );
    old.sync(&options(&address, "v1")).await.unwrap();

    // The upgraded client: its table gains the column, tracking migrates, it moves to v2.
    execute(
        &new,
        "ALTER TABLE notes ADD COLUMN priority INTEGER DEFAULT 0",
    );
    new.track("notes").unwrap();
    execute(&new, "UPDATE notes SET priority = 7 WHERE id = 2");
    let report = new.sync(&options(&address, "v2")).await.unwrap();
    assert_eq!(report.rounds, 2, "the in-flight upload went first, with v1");
    let all = "SELECT id, body, priority FROM notes ORDER BY id";
    assert_eq!(
        central_rows(&central, all).await,
        ["1|one, edited|0", "2|two|7", "3|three|0"]
    );
    assert_eq!(
        client_rows(&new, all),
        ["1|one, edited|0", "2|two|7", "3|three|0"]
    );
    old.sync(&options(&address, "v1")).await.unwrap();
    assert_eq!(
        client_rows(&old, "SELECT id, body FROM notes ORDER BY id"),
        ["1|one, edited", "2|two", "3|three"]
    );

    // Both edit at once: each change reaches the other, the column only the new one.
    execute(&old, "UPDATE notes SET body = 'three, by old' WHERE id = 3");
    execute(&new, "UPDATE notes SET priority = 9 WHERE id = 1");
    old.sync(&options(&address, "v1")).await.unwrap();
    new.sync(&options(&address, "v2")).await.unwrap();
    old.sync(&options(&address, "v1")).await.unwrap();
    assert_eq!(
        client_rows(&new, all),
        ["1|one, edited|9", "2|two|7", "3|three, by old|0"]
    );

    // A new table, and a column dropped: v1 and v2 lose it, their clients keep syncing.
    central_execute(
        &central,
        "CREATE TABLE tags (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, label TEXT);
         INSERT INTO tags (id, owner, label) VALUES (1, 'erin', 'red')",
    )
    .await;
    let tags = init(db, "tags");
    assert!(
        tags.contains("script version v3 created as a copy of v2"),
        "{tags}"
    );
    central_execute(&central, "ALTER TABLE notes DROP COLUMN body").await;
    let dropped = init(db, "notes");
    assert!(dropped.contains("by script version v3"), "{dropped}");
    assert!(
        dropped.contains("v1: default scripts of notes rewritten"),
        "{dropped}"
    );
    assert!(
        dropped.contains("v2: default scripts of notes rewritten"),
        "{dropped}"
    );

    execute(
        &old,
        "INSERT INTO notes (id, owner, body) VALUES (4, 'erin', 'four')",
    );
    old.sync(&options(&address, "v1")).await.unwrap();
    new.alter_tracked_table("notes", "ALTER TABLE notes DROP COLUMN body")
        .unwrap();
    execute(
        &new,
        "CREATE TABLE tags (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, label TEXT)",
    );
    new.track("tags").unwrap();
    execute(
        &new,
        "INSERT INTO tags (id, owner, label) VALUES (2, 'erin', 'blue')",
    );
    // A version the client has not used before brings its rows in full once.
    new.sync(&options(&address, "v3")).await.unwrap();
    assert_eq!(
        client_rows(&new, "SELECT id, priority FROM notes ORDER BY id"),
        ["1|9", "2|7", "3|0", "4|0"]
    );
    execute(&new, "UPDATE notes SET priority = 1 WHERE id = 4");
    new.sync(&options(&address, "v3")).await.unwrap();
    assert_eq!(
        central_rows(&central, "SELECT id, priority FROM notes ORDER BY id").await,
        ["1|9", "2|7", "3|0", "4|1"]
    );
    assert_eq!(
        central_rows(&central, "SELECT id, label FROM tags ORDER BY id").await,
        ["1|red", "2|blue"]
    );
    assert_eq!(
        client_rows(&new, "SELECT id, label FROM tags ORDER BY id"),
        ["1|red", "2|blue"]
    );
    old.sync(&options(&address, "v1")).await.unwrap();
    assert_eq!(
        client_rows(&old, "SELECT id FROM notes ORDER BY id"),
        ["1", "2", "3", "4"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_changes_on_a_running_sqlite_server() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("central.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(&format!(
            "{NOTES}; INSERT INTO notes VALUES (1, 'erin', 'one')"
        ))
        .unwrap();
    schema_change_scenario(db.to_str().unwrap(), SqliteConsolidated::new(&db)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_changes_on_a_running_postgres_server() {
    let url = rowsync_testkit::fresh_database("schema_changes").await;
    let central = PostgresConsolidated::new(&url);
    central_execute(
        &central,
        &format!("{NOTES}; INSERT INTO notes VALUES (1, 'erin', 'one')"),
    )
    .await;
    schema_change_scenario(&url, central).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_changes_on_a_running_mariadb_server() {
    let url = rowsync_testkit::fresh_mysql_database("schema_changes").await;
    let central = MysqlConsolidated::new(&url).unwrap();
    central_execute(&central, NOTES).await;
    central_execute(&central, "INSERT INTO notes VALUES (1, 'erin', 'one')").await;
    schema_change_scenario(&url, central).await;
}
