//! `rowsync sync` against a real `rowsync serve`: rows move both ways, and the exit
//! status says synced, conflict, refused, busy or error.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

const NOTES: &str = "CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, body TEXT)";

fn rowsync() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rowsync"))
}

fn run(args: &[&str], stdin: &str) -> Output {
    let mut child = rowsync()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// A server process, stopped when dropped (a failing test must not leave it running).
struct Server(Child);

impl Server {
    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A consolidated database with erin's notes 1 and 2, user erin, and `rowsync serve`
/// on a free port; returns the server process and its address.
fn serve(dir: &Path, max_connections: Option<&str>) -> (Server, String) {
    let db = dir.join("central.db");
    let db = db.to_str().unwrap();
    rusqlite::Connection::open(db)
        .unwrap()
        .execute_batch(&format!(
            "{NOTES}; INSERT INTO notes VALUES (1, 'erin', 'one'), (2, 'erin', 'two');"
        ))
        .unwrap();
    ok(run(
        &[
            "init",
            "--db",
            db,
            "--table",
            "notes",
            "--partition-column",
            "owner",
        ],
        "",
    ));
    ok(run(
        &["user", "add", "--db", db, "--name", "erin"],
        "erin-secret\n",
    ));
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--db", db];
    if let Some(max) = max_connections {
        args.extend(["--max-connections", max]);
    }
    let server = rowsync()
        .args(&args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    let mut server = Server(server);
    BufReader::new(server.0.stderr.take().unwrap())
        .read_line(&mut banner)
        .unwrap();
    assert!(banner.starts_with("rowsync serving"), "{banner}");
    let address = banner.trim().rsplit(' ').next().unwrap().to_string();
    (server, address)
}

fn sync(client: &Path, address: &str, password: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "sync",
        "--db",
        client.to_str().unwrap(),
        "--server",
        address,
        "--user",
        "erin",
        "--password-stdin",
    ];
    args.extend(extra);
    run(&args, &format!("{password}\n"))
}

fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)))
}

#[test]
fn sync_moves_rows_both_ways_and_the_exit_status_tells_the_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, address) = serve(dir.path(), None);
    let first = dir.path().join("first.db");
    let second = dir.path().join("second.db");
    for client in [&first, &second] {
        rusqlite::Connection::open(client)
            .unwrap()
            .execute_batch(NOTES)
            .unwrap();
    }

    let output = sync(
        &first,
        &address,
        "erin-secret",
        &["--track", "notes", "--json"],
    );
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let report = json(&output);
    assert_eq!(report["outcome"], "synced");
    assert_eq!(report["rows_downloaded"], 2);
    let text = ok(sync(
        &second,
        &address,
        "erin-secret",
        &["--track", "notes", "--compression", "zstd"],
    ));
    assert!(text.contains("downloaded 2 rows"), "{text}");

    // A change from the shell goes up and reaches the other client.
    rusqlite::Connection::open(&first)
        .unwrap()
        .execute_batch("INSERT INTO notes VALUES (3, 'erin', 'three'); UPDATE notes SET body = 'uno' WHERE id = 1;")
        .unwrap();
    let report = json(&sync(&first, &address, "erin-secret", &["--json"]));
    assert_eq!(
        (
            report["rows_uploaded"].as_u64(),
            report["conflicts"].as_u64()
        ),
        (Some(2), Some(0))
    );
    // The second client changes note 1 from an image the server no longer has.
    rusqlite::Connection::open(&second)
        .unwrap()
        .execute("UPDATE notes SET body = 'eins' WHERE id = 1", [])
        .unwrap();
    let output = sync(&second, &address, "erin-secret", &["--json"]);
    assert_eq!(output.status.code(), Some(5), "conflict: {output:?}");
    let report = json(&output);
    assert_eq!(report["outcome"], "conflict");
    assert_eq!(report["conflicted_rows"][0]["table"], "notes");
    assert_eq!(
        report["conflicted_rows"][0]["key"][0]["value"], 1,
        "{report}"
    );
    // The losing edit is kept in the client database, in its own value forms.
    let kept = &report["kept_conflicts"][0];
    assert_eq!(
        (&kept["operation"], &kept["key"]["id"]),
        (&"update".into(), &1.into())
    );
    assert_eq!(kept["client_row"]["body"], "eins", "{report}");
    assert_eq!(kept["server_row"]["body"], "uno", "{report}");
    let bodies: Vec<String> = rusqlite::Connection::open(&second)
        .unwrap()
        .prepare("SELECT body FROM notes ORDER BY id")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        bodies,
        ["uno", "two", "three"],
        "the server's rows won and arrived"
    );

    // A table the server does not synchronize: set aside, listed, then untracked.
    rusqlite::Connection::open(&first)
        .unwrap()
        .execute_batch("CREATE TABLE todo (id INTEGER PRIMARY KEY, title TEXT); INSERT INTO notes VALUES (4, 'erin', 'four');")
        .unwrap();
    let report = json(&sync(
        &first,
        &address,
        "erin-secret",
        &["--track", "todo", "--json"],
    ));
    assert_eq!(report["rejected_rows"], serde_json::json!([]), "{report}");
    rusqlite::Connection::open(&first)
        .unwrap()
        .execute_batch("INSERT INTO todo VALUES (1, 'buy milk'); INSERT INTO notes VALUES (5, 'erin', 'five');")
        .unwrap();
    let output = sync(&first, &address, "erin-secret", &["--json"]);
    assert_eq!(output.status.code(), Some(6), "rejected: {output:?}");
    let report = json(&output);
    assert_eq!(report["outcome"], "rejected");
    assert_eq!(
        (
            report["rows_uploaded"].as_u64(),
            report["rows_rejected"].as_u64()
        ),
        (Some(1), Some(1)),
        "{report}"
    );
    let rejected = &report["rejected_rows"][0];
    assert_eq!(
        (&rejected["table"], &rejected["key"]["id"]),
        (&"todo".into(), &1.into()),
        "{report}"
    );
    let text = ok(sync(
        &first,
        &address,
        "erin-secret",
        &["--untrack", "todo"],
    ));
    assert!(text.contains("not synchronized"), "{text}");

    // A client that logged in holds a session token, which logs it in whatever password
    // it sends (protocol 8): without it, the password decides.
    rusqlite::Connection::open(&second)
        .unwrap()
        .execute("DELETE FROM rs_client_login", [])
        .unwrap();
    let output = sync(&second, &address, "wrong", &["--json"]);
    assert_eq!(output.status.code(), Some(4), "refused: {output:?}");
    assert_eq!(json(&output)["outcome"], "refused");
    let output = sync(&second, &address, "erin-secret", &["--version", "v9"]);
    assert_eq!(output.status.code(), Some(4), "unknown script version");
    assert!(String::from_utf8_lossy(&output.stderr).contains("refused"));

    server.stop();
    let output = sync(
        &second,
        &address,
        "erin-secret",
        &["--timeout-seconds", "5"],
    );
    assert_eq!(output.status.code(), Some(1), "no server: {output:?}");
}

#[test]
fn rows_held_before_tracking_go_up_unless_they_came_from_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, address) = serve(dir.path(), None);
    let shipped = dir.path().join("shipped.db");
    let own = dir.path().join("own.db");
    // A copy of the server's rows, as an app might ship pre-synced.
    let copy = "INSERT INTO notes VALUES (1, 'erin', 'one'), (2, 'erin', 'two')";
    for (client, rows) in [
        (&shipped, copy),
        (&own, "INSERT INTO notes VALUES (7, 'erin', 'mine')"),
    ] {
        rusqlite::Connection::open(client)
            .unwrap()
            .execute_batch(&format!("{NOTES}; {rows}"))
            .unwrap();
    }
    let tracking = ["--track", "notes", "--json", "--existing-rows"];
    let report = json(&sync(
        &shipped,
        &address,
        "erin-secret",
        &[&tracking[..], &["from-server"]].concat(),
    ));
    assert_eq!(
        (&report["outcome"], &report["rows_uploaded"]),
        (&"synced".into(), &0.into()),
        "{report}"
    );
    let report = json(&sync(
        &own,
        &address,
        "erin-secret",
        &[&tracking[..], &["upload"]].concat(),
    ));
    assert_eq!(
        (&report["rows_uploaded"], &report["conflicts"]),
        (&1.into(), &0.into()),
        "{report}"
    );
    let output = sync(
        &own,
        &address,
        "erin-secret",
        &[&tracking[..], &["maybe"]].concat(),
    );
    assert_eq!(output.status.code(), Some(2), "a usage error: {output:?}");
    let report = json(&sync(&shipped, &address, "erin-secret", &["--json"]));
    assert_eq!(
        report["rows_downloaded"], 1,
        "note 7 from the other client: {report}"
    );
    server.stop();
}

#[test]
fn sync_says_busy_when_the_server_stays_at_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, address) = serve(dir.path(), Some("1"));
    // A connection that says nothing holds the only slot.
    let _held = std::net::TcpStream::connect(address.trim_start_matches("tcp://")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let client = dir.path().join("client.db");
    rusqlite::Connection::open(&client)
        .unwrap()
        .execute_batch(NOTES)
        .unwrap();
    let output = sync(
        &client,
        &address,
        "erin-secret",
        &["--track", "notes", "--busy-retries", "0", "--json"],
    );
    server.stop();
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert_eq!(json(&output)["outcome"], "busy");
}

#[test]
fn sync_needs_a_password_or_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(
        &[
            "sync",
            "--db",
            dir.path().join("c.db").to_str().unwrap(),
            "--server",
            "tcp://127.0.0.1:1",
        ],
        "",
    );
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--password-stdin or --token"));
}
