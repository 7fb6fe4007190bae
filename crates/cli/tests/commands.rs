//! The `rowsync` binary itself: init, user add, serve, then a real client sync.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use rowsync_client::{Client, ClientError, SyncOptions};

fn rowsync() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rowsync"))
}

const NOTES: &str = "CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, body TEXT);
     INSERT INTO notes VALUES (1, 'erin', 'hello'), (2, 'frank', 'not yours');";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_user_add_and_serve_work_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("consolidated.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(NOTES)
        .unwrap();
    command_line_scenario(db.to_str().unwrap(), &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_user_add_and_serve_work_from_the_command_line_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _) = rowsync_testkit::fresh_database_with("commands", NOTES).await;
    command_line_scenario(&url, &dir).await;
}

/// `notes` exists in `db` (a SQLite path or a postgres:// URL) with a row of erin's and
/// one of frank's: init, add erin, serve, and sync a client as erin.
async fn command_line_scenario(db: &str, dir: &tempfile::TempDir) {
    let init = rowsync()
        .args(["init", "--db", db])
        .args(["--table", "notes", "--partition-column", "owner"])
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );

    let refused = rowsync()
        .args(["init", "--db", db])
        .args(["--table", "notes", "--partition-column", "nobody"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("has no column \"nobody\""));

    script_and_version_commands(db);

    let mut add = rowsync()
        .args(["user", "add", "--db", db])
        .args(["--name", "erin"])
        .env_remove("ROWSYNC_PASSWORD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    add.stdin
        .take()
        .unwrap()
        .write_all(b"erin-secret\n")
        .unwrap();
    assert!(add.wait().unwrap().success());

    let mut serve = rowsync()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "2",
            "--db",
            db,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(serve.stderr.take().unwrap());
    let mut banner = String::new();
    stderr.read_line(&mut banner).unwrap();
    // Close the log pipe: a server whose log reader went away must keep serving.
    drop(stderr);
    let address = banner.trim().rsplit(' ').next().unwrap().to_string();
    assert!(banner.starts_with("rowsync serving"), "{banner}");

    let mut client = Client::open(dir.path().join("erin.db")).unwrap();
    client
        .connection()
        .execute_batch(
            "CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, body TEXT)",
        )
        .unwrap();
    client.track("notes").unwrap();
    let report = client
        .sync(&SyncOptions::new(&address, "erin", "erin-secret"))
        .await;
    // Another client database: `client` logged in and holds a session token, which
    // would log it in whatever its password (protocol 8).
    let mut stranger = Client::open(dir.path().join("stranger.db")).unwrap();
    let wrong = stranger
        .sync(&SyncOptions::new(&address, "erin", "erin-secreT"))
        .await;
    let user_admin = user_administration(db, &address, &mut client).await;
    serve.kill().unwrap();
    serve.wait().unwrap();
    user_admin.unwrap();

    assert_eq!(report.unwrap().rows_downloaded, 1);
    let body: String = client
        .connection()
        .query_row("SELECT body FROM notes", [], |row| row.get(0))
        .unwrap();
    assert_eq!(body, "hello");
    // The refusal arrives even though logging it hits a broken pipe.
    assert!(matches!(wrong, Err(ClientError::Server(_))), "{wrong:?}");
}

/// `rowsync user list | disable | enable | set-password | remove` against a server
/// that runs: a disabled or removed user is refused as a wrong password is.
async fn user_administration(db: &str, address: &str, client: &mut Client) -> Result<(), String> {
    let login_code = |result: Result<rowsync_client::SyncReport, ClientError>| match result {
        Err(error) => error.server_code(),
        Ok(report) => panic!("a sync that should be refused went through: {report:?}"),
    };
    // A client that logged in holds a session token, which logs it in whatever password
    // it sends (protocol 8): without it, the password decides.
    client
        .connection()
        .execute("DELETE FROM rs_client_login", [])
        .map_err(|error| error.to_string())?;
    let wrong_password = login_code(
        client
            .sync(&SyncOptions::new(address, "erin", "not-erins"))
            .await,
    );
    let erin = SyncOptions::new(address, "erin", "erin-secret");
    run_ok(&["user", "disable", "--db", db, "--name", "erin"], None);
    assert!(run_ok(&["user", "list", "--db", db], None).starts_with("erin\tdisabled\t"));
    assert_eq!(login_code(client.sync(&erin).await), wrong_password);
    run_ok(&["user", "enable", "--db", db, "--name", "erin"], None);
    client
        .sync(&erin)
        .await
        .map_err(|error| error.to_string())?;

    let set = ["user", "set-password", "--db", db, "--name", "erin"];
    run_ok(&set, Some("erin-new-secret\n"));
    assert_eq!(login_code(client.sync(&erin).await), wrong_password);
    let renewed = SyncOptions::new(address, "erin", "erin-new-secret");
    client
        .sync(&renewed)
        .await
        .map_err(|error| error.to_string())?;
    let nobody = run_refused(&["user", "set-password", "--db", db, "--name", "nobody"]);
    assert!(
        nobody.contains("no user \"nobody\"") && nobody.contains("user add"),
        "{nobody}"
    );

    run_ok(&["user", "remove", "--db", db, "--name", "erin"], None);
    assert_eq!(login_code(client.sync(&renewed).await), wrong_password);
    let again = run_refused(&["user", "remove", "--db", db, "--name", "erin"]);
    assert!(again.contains("no user \"erin\""), "{again}");
    assert_eq!(run_ok(&["user", "list", "--db", db], None), "");
    Ok(())
}

fn run_ok(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = rowsync()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn run_refused(args: &[&str]) -> String {
    let mut child = rowsync()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A script on stdin, for the commands that read one.
    let _ = child.stdin.take().unwrap().write_all(b"SELECT 1");
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success(), "{args:?} succeeded");
    String::from_utf8(output.stderr).unwrap()
}

/// `rowsync version` and `rowsync script` on a database where `init` ran for notes.
fn script_and_version_commands(db: &str) {
    let listed = run_ok(&["script", "list", "--db", db, "--version", "v1"], None);
    assert!(listed.contains("v1\tnotes\tupload_insert"), "{listed}");
    let cursor = run_ok(
        &[
            "script",
            "show",
            "--db",
            db,
            "--version",
            "v1",
            "--table",
            "notes",
            "--event",
            "download_cursor",
        ],
        None,
    );
    assert!(cursor.starts_with("SELECT"), "{cursor}");

    run_ok(
        &[
            "version",
            "add",
            "--db",
            db,
            "v2",
            "--description",
            "second",
        ],
        None,
    );
    let versions = run_ok(&["version", "list", "--db", db], None);
    assert_eq!(versions, "v1\t\nv2\tsecond\n");

    let set = [
        "script",
        "set",
        "--db",
        db,
        "--version",
        "v2",
        "--event",
        "begin_synchronization",
    ];
    run_ok(&set, Some("SELECT 1\n"));
    let shown = run_ok(
        &[
            "script",
            "show",
            "--db",
            db,
            "--version",
            "v2",
            "--event",
            "begin_synchronization",
        ],
        None,
    );
    assert_eq!(shown, "SELECT 1\n");
    let error = run_refused(&[
        "script",
        "set",
        "--db",
        db,
        "--version",
        "v2",
        "--event",
        "bogus",
    ]);
    assert!(
        error.contains("\"bogus\" is not a connection event"),
        "{error}"
    );
    let error = run_refused(&[
        "script",
        "set",
        "--db",
        db,
        "--version",
        "v9",
        "--event",
        "end_upload",
    ]);
    assert!(
        error.contains("script version \"v9\" does not exist"),
        "{error}"
    );
    let remove = [
        "script",
        "remove",
        "--db",
        db,
        "--version",
        "v2",
        "--event",
        "begin_synchronization",
    ];
    run_ok(&remove, None);
    let error = run_refused(&remove);
    assert!(
        error.contains("has no begin_synchronization script"),
        "{error}"
    );
}

/// `rowsync cert`, then `rowsync serve` with TLS and HTTPS endpoints: clients verify the
/// certificate against the CA written by `cert` and sync over both, compressed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cert_and_serve_over_tls_and_https_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("consolidated.db");
    let db = db.to_str().unwrap();
    rusqlite::Connection::open(db)
        .unwrap()
        .execute_batch(NOTES)
        .unwrap();
    let init = rowsync()
        .args(["init", "--db", db])
        .args(["--table", "notes", "--partition-column", "owner"])
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
    let added = rowsync()
        .args(["user", "add", "--db", db, "--name", "erin"])
        .env("ROWSYNC_PASSWORD", "erin-secret")
        .output()
        .unwrap();
    assert!(added.status.success(), "{added:?}");
    let pki = dir.path().join("pki");
    let cert = rowsync()
        .args(["cert", "--dir", pki.to_str().unwrap(), "--rsa"])
        .output()
        .unwrap();
    assert!(cert.status.success(), "{cert:?}");
    assert!(String::from_utf8_lossy(&cert.stdout).contains("ca.pem"));

    // TLS without a certificate is refused up front, by name.
    let refused = rowsync()
        .args(["serve", "--db", db, "--listen", "127.0.0.1:0"])
        .args(["--tls-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--tls-listen needs --cert and --key"),
        "{refused:?}"
    );

    let mut serve = rowsync()
        .args(["serve", "--db", db, "--listen", "127.0.0.1:0"])
        .args([
            "--tls-listen",
            "127.0.0.1:0",
            "--https-listen",
            "127.0.0.1:0",
        ])
        .arg("--cert")
        .arg(pki.join("server.pem"))
        .arg("--key")
        .arg(pki.join("server-key.pem"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(serve.stderr.take().unwrap());
    let mut banner = String::new();
    stderr.read_line(&mut banner).unwrap();
    drop(stderr);
    let url = |scheme: &str| {
        banner
            .split_whitespace()
            .find(|word| word.starts_with(&format!("{scheme}://")))
            .unwrap_or_else(|| panic!("no {scheme} endpoint in {banner}"))
            .to_string()
    };
    let mut client = Client::open(dir.path().join("erin.db")).unwrap();
    client
        .connection()
        .execute_batch(
            "CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, body TEXT)",
        )
        .unwrap();
    client.track("notes").unwrap();
    let mut results = Vec::new();
    for (address, compression) in [
        (url("tls"), rowsync_client::Compression::Zlib),
        (
            format!("{}/sync", url("https")),
            rowsync_client::Compression::Zstd,
        ),
    ] {
        let mut options = SyncOptions::new(address, "erin", "erin-secret");
        options.transport.compression = compression;
        options.transport.tls.ca_file = Some(pki.join("ca.pem"));
        results.push(client.sync(&options).await);
    }
    serve.kill().unwrap();
    serve.wait().unwrap();
    let downloaded: Vec<u64> = results
        .into_iter()
        .map(|result| result.unwrap().rows_downloaded)
        .collect();
    assert_eq!(downloaded, vec![1, 0]);
}

/// A command whose output is cut short (`rowsync script show ... | head -1`) exits
/// quietly, as `ls | head` does: no panic, no "Broken pipe" message.
#[test]
fn a_closed_output_ends_a_listing_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("consolidated.db");
    support::init_notes(&db);
    let db = db.to_str().unwrap();
    // A script far longer than a pipe holds (64 KiB), so the reader's close is met.
    let long_script = format!("SELECT 1\n{}", "-- a comment line\n".repeat(20_000));
    rusqlite::Connection::open(db)
        .unwrap()
        .execute(
            "UPDATE rs_script SET script = ?1 WHERE table_name = 'notes' AND event = 'download_cursor'",
            [long_script],
        )
        .unwrap();
    let mut list = rowsync()
        .args(["script", "show", "--db", db, "--version", "v1"])
        .args(["--table", "notes", "--event", "download_cursor"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read one line, then close the pipe: the rest of the listing meets a closed output.
    let mut first = String::new();
    BufReader::new(list.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    drop(list.stdout.take());
    let done = list.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(!first.is_empty());
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{stderr}"
    );
}

/// A refusal is its message, not a backtrace, even with RUST_BACKTRACE set.
#[test]
fn a_refusal_prints_its_message_without_a_backtrace() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("consolidated.db");
    support::init_notes(&db);
    let refused = rowsync()
        .args(["init", "--db", db.to_str().unwrap()])
        .args(["--table", "notes", "--partition-column", "nobody"])
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("has no column \"nobody\""), "{stderr}");
    assert!(
        !stderr.contains("backtrace") && !stderr.contains(" at "),
        "{stderr}"
    );
}
