//! Commands that refuse typos (issue 36, item 4), each refusal with its exact message:
//! a `--db` naming a missing SQLite file (nothing is created), a URL of a scheme rowsync
//! does not read, a database server that refuses connections, and `rowsync sync` before
//! `rowsync init`. No message shows a URL's password.

mod support;

use std::io::Write;
use std::process::{Output, Stdio};

use support::rowsync;

const SECRET: &str = "s3cret-Pw";

/// Runs `rowsync ARGS` with `stdin`, which must fail; its standard error.
fn refused(args: &[&str], stdin: &str) -> String {
    let output = run(args, stdin);
    assert!(!output.status.success(), "{args:?} succeeded");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        !stderr.contains(SECRET),
        "{args:?} showed the password: {stderr}"
    );
    assert!(!stderr.contains("backtrace"), "{stderr}");
    stderr
}

fn run(args: &[&str], stdin: &str) -> Output {
    let mut child = rowsync()
        .args(args)
        .env_remove("ROWSYNC_PASSWORD")
        .env_remove("PGPASSWORD")
        .env_remove("PGPASSFILE")
        .env_remove("MYSQL_PWD")
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

#[test]
fn a_missing_sqlite_file_is_refused_by_every_command_and_not_made() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("typo-central.db");
    let db = db.to_str().unwrap();
    let expected = format!(
        "error: there is no SQLite database {db} (a typo?): give the path of an existing \
         file, or make the database: create its tables (sqlite3 {db} \"CREATE TABLE ...\") \
         and run `rowsync init --db {db} --table TABLE --partition-column COLUMN`\n"
    );
    let commands: [&[&str]; 11] = [
        &["init", "--table", "notes", "--partition-column", "owner"],
        &["user", "add", "--name", "erin"],
        &["user", "list"],
        &["user", "remove", "--name", "erin"],
        &["serve", "--listen", "127.0.0.1:0"],
        &["script", "list"],
        &["version", "list"],
        &["version", "add", "v2"],
        &["keys", "--table", "notes"],
        &["cleanup"],
        &["profile", "--version", "v1", "--plans"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.extend(["--db", db]);
        assert_eq!(refused(&args, "a-password\n"), expected, "{command:?}");
        assert!(!std::path::Path::new(db).exists(), "{command:?} made {db}");
    }
}

#[test]
fn init_create_makes_the_file_and_takes_it_back_when_init_fails() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("new.db");
    let args = [
        "init",
        "--create",
        "--db",
        db.to_str().unwrap(),
        "--table",
        "notes",
        "--partition-column",
        "owner",
    ];
    let said = refused(&args, "");
    assert!(said.contains("\"notes\" does not exist"), "{said}");
    assert!(!db.exists(), "a failed init --create left {}", db.display());
}

#[test]
fn an_unknown_scheme_is_refused_naming_the_schemes_rowsync_reads() {
    let said = refused(
        &[
            "user",
            "list",
            "--db",
            &format!("postgress://app:{SECRET}@127.0.0.1/app"),
        ],
        "",
    );
    assert_eq!(
        said,
        "error: --db postgress://app:********@127.0.0.1/app: rowsync does not read \
         postgress:// URLs; it reads postgres:// (or postgresql://), mysql:// (or \
         mariadb://) URLs and SQLite file paths; did you mean postgres://?\n"
    );
    let said = refused(
        &[
            "serve",
            "--db",
            &format!("mysq://root:{SECRET}@127.0.0.1/app"),
        ],
        "",
    );
    assert!(said.ends_with("; did you mean mysql://?\n"), "{said}");
}

#[test]
fn a_refused_connection_names_the_host_and_port() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for (scheme, server) in [("postgres", "PostgreSQL"), ("mysql", "MySQL or MariaDB")] {
        let url = format!("{scheme}://app:{SECRET}@127.0.0.1:{port}/app");
        let said = refused(&["version", "list", "--db", &url], "");
        let expected = format!(
            "error: nothing accepts connections at 127.0.0.1:{port}, the {server} server of \
             --db: is it running, and listening on that host and port?: "
        );
        assert!(said.starts_with(&expected), "{said}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_before_init_says_to_run_init_and_only_after_the_login() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("central.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE notes (id TEXT PRIMARY KEY, owner TEXT NOT NULL, body TEXT)")
        .unwrap();
    support::add_user(&db, "erin", "erin-secret");
    let server = support::serve(&db, &[]);
    let client = dir.path().join("erin-phone.db");
    rusqlite::Connection::open(&client)
        .unwrap()
        .execute_batch("CREATE TABLE notes (id TEXT PRIMARY KEY, owner TEXT NOT NULL, body TEXT)")
        .unwrap();
    let sync = |user: &str, password: &str| {
        let output = run(
            &[
                "sync",
                "--db",
                client.to_str().unwrap(),
                "--server",
                &server.address,
                "--user",
                user,
                "--password-stdin",
                "--track",
                "notes",
            ],
            &format!("{password}\n"),
        );
        assert_eq!(output.status.code(), Some(4), "{output:?}");
        String::from_utf8(output.stderr).unwrap()
    };
    assert_eq!(
        sync("erin", "erin-secret"),
        "rowsync sync: refused: the server refused the sync: UnknownScriptVersion (code 6): \
         the server synchronizes no table yet: run `rowsync init` (or `rowsync rules \
         apply`) on its database (script version \"v1\" does not exist)\n"
    );
    let login_refused = "rowsync sync: refused: the server refused the sync: \
                         AuthenticationFailed (code 3): authentication failed: unknown user \
                         or wrong password\n";
    assert_eq!(sync("mallory", "guess"), login_refused);
    assert_eq!(sync("erin", "wrong"), login_refused);
}
