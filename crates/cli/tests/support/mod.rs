//! What the monitor and replay tests share: a consolidated SQLite database with `notes`,
//! users, a `rowsync serve` process, and client syncs.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use rowsync_client::{Client, SyncOptions, SyncReport};

pub fn rowsync() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rowsync"))
}

/// Runs `rowsync ARGS` with `stdin`, which must succeed; its standard output.
pub fn run_ok(args: &[&str], stdin: &str) -> String {
    run_command_ok(rowsync(), args, Some(stdin))
}

/// Runs `command ARGS`, with `stdin` if given, which must succeed; its standard output.
pub fn run_command_ok(mut command: Command, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        // Written and closed before waiting; without input, waiting closes it.
        let mut input = child.stdin.take().unwrap();
        input.write_all(text.as_bytes()).unwrap();
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The `notes` table of the consolidated databases (and of the clients) these tests use.
/// A store chain (docs/rules.md): staff of two stores, their customers and rentals, a
/// shared film catalogue.
pub const STORE_CHAIN: &str = "
CREATE TABLE store (store_id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE staff (username TEXT PRIMARY KEY, store_id INTEGER REFERENCES store);
CREATE TABLE customer (customer_id INTEGER PRIMARY KEY, store_id INTEGER NOT NULL REFERENCES store,
    name TEXT NOT NULL, balance DECIMAL(8,2));
CREATE TABLE film (film_id INTEGER PRIMARY KEY, title TEXT NOT NULL, cover BLOB, notes TEXT);
CREATE TABLE rental (rental_id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customer);
INSERT INTO store VALUES (1, 'Lethbridge'), (2, 'Woodridge');
INSERT INTO staff VALUES ('mike', 1), ('jon', 2);
INSERT INTO customer VALUES (1, 1, 'MARY', '1.50'), (2, 2, 'LINDA', NULL);
INSERT INTO film VALUES (1, 'ACADEMY DINOSAUR', x'00', 'office only');
INSERT INTO rental VALUES (1, 1), (2, 2);
";

/// The store chain's rule file.
pub const STORE_CHAIN_RULES: &str = r#"
[groups.store]
table = "staff"
user_column = "username"
group_column = "store_id"

[tables.customer]
rule = "group"
column = "store_id"
group = "store"

[tables.film]
rule = "shared"
exclude_columns = ["notes"]

[tables.rental]
rule = "parent"
parent = "customer"
"#;

pub const NOTES_DDL: &str =
    "CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, body TEXT)";

/// A consolidated database with `notes`, one row of erin's and one of frank's, set up
/// for sync by `rowsync init`.
pub fn init_notes(db: &Path) {
    let connection = rusqlite::Connection::open(db).unwrap();
    connection.execute_batch(NOTES_DDL).unwrap();
    connection
        .execute_batch("INSERT INTO notes VALUES (1, 'erin', 'hello'), (2, 'frank', 'hi frank')")
        .unwrap();
    init_notes_table(db.to_str().unwrap());
}

fn init_notes_table(db: &str) {
    let init = [
        "init",
        "--db",
        db,
        "--table",
        "notes",
        "--partition-column",
        "owner",
    ];
    run_ok(&init, "");
}

/// A fresh PostgreSQL database with an empty `notes`, set up by `rowsync init`, and
/// user erin with `password`: its URL and a connection to it.
pub async fn postgres_notes(prefix: &str, password: &str) -> (String, tokio_postgres::Client) {
    let (url, client) = rowsync_testkit::fresh_database_with(prefix, NOTES_DDL).await;
    init_notes_table(&url);
    add_user(Path::new(&url), "erin", password);
    (url, client)
}

/// A free loopback port (free when asked: a test binds it soon after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn add_user(db: &Path, name: &str, password: &str) {
    let db = db.to_str().unwrap();
    run_ok(
        &["user", "add", "--db", db, "--name", name],
        &format!("{password}\n"),
    );
}

/// A `rowsync serve` process, killed when dropped.
pub struct Server {
    child: Child,
    /// tcp://host:port
    pub address: String,
    /// host:port of the admin endpoint, when asked for.
    pub admin: Option<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serves `db` on a free port, with `extra` arguments.
pub fn serve(db: &Path, extra: &[&str]) -> Server {
    let mut child = rowsync()
        .args(["serve", "--listen", "127.0.0.1:0", "--workers", "2", "--db"])
        .arg(db)
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut banner = String::new();
    stderr.read_line(&mut banner).unwrap();
    assert!(banner.starts_with("rowsync serving"), "{banner}");
    let address = banner.trim().rsplit(' ').next().unwrap().to_string();
    let mut admin = None;
    if extra.contains(&"--admin-listen") {
        loop {
            let mut line = String::new();
            assert!(stderr.read_line(&mut line).unwrap() > 0, "no admin banner");
            if let Some(rest) = line.strip_prefix("rowsync metrics on http://") {
                admin = Some(rest.split('/').next().unwrap().to_string());
                break;
            }
        }
    }
    // The log goes on to a reader that drains it, so the server never blocks on it.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    Server {
        child,
        address,
        admin,
    }
}

/// Opens (or creates) `user`'s client database in `dir`, tracking `notes`.
pub fn client(dir: &Path, user: &str) -> Client {
    let mut client = Client::open(dir.join(format!("{user}.db"))).unwrap();
    client
        .connection()
        .execute_batch(
            "CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, body TEXT)",
        )
        .unwrap();
    client.track("notes").unwrap();
    client
}

/// One sync of `user`'s client database in `dir`.
pub async fn sync_client(
    dir: &tempfile::TempDir,
    user: &str,
    address: &str,
    password: &str,
) -> SyncReport {
    let mut client = client(dir.path(), user);
    client
        .sync(&SyncOptions::new(address, user, password))
        .await
        .unwrap()
}

/// A markdown page's fenced blocks of one language (```` ```sh ````), in order.
pub fn fenced_blocks(markdown: &str, language: &str) -> Vec<String> {
    let opening = format!("```{language}");
    let mut found = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_end()) {
            (None, text) if text == opening => current = Some(String::new()),
            (Some(_), "```") => found.extend(current.take()),
            (Some(block), text) => {
                block.push_str(text);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    found
}
