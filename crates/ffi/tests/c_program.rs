//! A C program written against include/rowsync.h only, compiled with `cc` and linked
//! with librowsync.a, syncs a client database with a real server: it downloads the
//! server's rows, uploads a change the application made, and sees another client's.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

#[path = "../../client/tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{TestServer, ORDERS_DDL, PASSWORD, USER};

/// The directory cargo puts librowsync.a in: the test binary's parent's parent.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn compile(dir: &Path) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let library = library_dir().join("librowsync.a");
    // `cargo test` builds the crate as an rlib only; scripts/test builds the library.
    let built = std::fs::metadata(&library).and_then(|m| m.modified());
    let source = std::fs::metadata(crate_dir.join("src/lib.rs")).and_then(|m| m.modified());
    assert!(
        matches!((built, source), (Ok(built), Ok(source)) if built >= source),
        "{} is missing or older than src/lib.rs: run `cargo build -p rowsync-ffi` first",
        library.display()
    );
    let program = dir.join("sync");
    let output = Command::new("cc")
        .arg(crate_dir.join("tests/c/sync.c"))
        .arg("-std=c99")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg("-o")
        .arg(&program)
        .arg(&library)
        .args(["-lpthread", "-ldl", "-lm"])
        .output()
        .expect("running cc (is a C compiler installed?)");
    assert!(
        output.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    program
}

/// What one run of the C program printed.
struct CRun {
    report: serde_json::Value,
    progress_calls: u64,
    kept_conflicts: serde_json::Value,
    rejected_rows: serde_json::Value,
    /// The lines after the rejected rows (with an extra table).
    rest: Vec<String>,
}

/// Runs the C program on one database.
async fn run_c(program: &Path, db: &Path, server: &TestServer) -> CRun {
    run_c_with(program, db, server, &[]).await
}

/// Runs the C program with `extra` arguments (an extra table to track).
async fn run_c_with(program: &Path, db: &Path, server: &TestServer, extra: &[&str]) -> CRun {
    let output = tokio::process::Command::new(program)
        .arg(db)
        .arg(format!("tcp://{}", server.address))
        .args([USER, PASSWORD, "orders"])
        .args(extra)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "the C program failed ({:?}): {}{stdout}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let mut lines = stdout.lines();
    let report = serde_json::from_str(lines.next().unwrap()).unwrap();
    let progress_calls = lines
        .next()
        .and_then(|line| line.strip_prefix("progress_calls="))
        .and_then(|n| n.parse().ok())
        .unwrap();
    let kept_conflicts = serde_json::from_str(lines.next().unwrap()).unwrap();
    let rejected_rows = serde_json::from_str(lines.next().unwrap()).unwrap();
    CRun {
        report,
        progress_calls,
        kept_conflicts,
        rejected_rows,
        rest: lines.map(str::to_owned).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_c_program_syncs_both_ways_with_a_real_server() {
    let server = TestServer::start(3).await;
    let program = compile(server.dir.path());
    let db = server.client_path("c-app");
    // The table holds a row before it is tracked: the application's own, whose key the
    // server has already. It goes up, loses, and is kept.
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(&format!(
            "{ORDERS_DDL}; INSERT INTO orders VALUES ('seed-0', 'alice', 'c-local', 99)"
        ))
        .unwrap();

    let first = run_c(&program, &db, &server).await;
    let report = &first.report;
    assert_eq!(report["rows_downloaded"], 3, "{report}");
    assert_eq!(
        (&report["conflicts"], &report["conflicts_kept"]),
        (&1.into(), &1.into())
    );
    assert!(
        first.progress_calls >= 1,
        "the progress callback was called"
    );
    let kept = &first.kept_conflicts[0];
    assert_eq!(kept["key"], serde_json::json!({"id": "seed-0"}), "{kept}");
    assert_eq!(kept["client_row"]["item"], "c-local", "{kept}");
    assert_eq!(kept["server_row"]["item"], "seed", "{kept}");

    // The application changes its database with SQLite directly; a Rust client adds a
    // row of its own on the server.
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(
            "UPDATE orders SET quantity = 42 WHERE id = 'seed-1';
             INSERT INTO orders VALUES ('from-c', 'alice', 'written in C', 7);",
        )
        .unwrap();
    // A copy of the file (the C program closed it, so it is whole): it sends the same
    // changes again after the original, as another client.
    let copy = db.with_file_name("copy.db");
    std::fs::copy(&db, &copy).unwrap();
    let mut other = server.client("rust-app");
    other.sync(&server.options()).await.unwrap();
    other
        .connection()
        .execute(
            "INSERT INTO orders VALUES ('from-rust', 'alice', 'rust', 1)",
            [],
        )
        .unwrap();
    other.sync(&server.options()).await.unwrap();

    let second = run_c(&program, &db, &server).await;
    let report = &second.report;
    assert_eq!(
        second.kept_conflicts, first.kept_conflicts,
        "kept until removed"
    );
    assert_eq!(report["rows_uploaded"], 2, "{report}");
    assert_eq!(report["conflicts"], 0, "{report}");
    assert_eq!(
        report["rows_downloaded"], 1,
        "the Rust client's row: {report}"
    );
    assert_eq!(report["identity"], serde_json::Value::Null, "{report}");
    let local = support::orders(&rusqlite::Connection::open(&db).unwrap());
    assert_eq!(server.consolidated_orders(), local);
    assert!(local
        .iter()
        .any(|row| row[0] == rowsync_protocol::Value::Text("from-rust".into())));

    let copied = run_c(&program, &copy, &server).await;
    assert_eq!(copied.report["identity"], "copied", "{}", copied.report);
    let local = support::orders(&rusqlite::Connection::open(&copy).unwrap());
    assert_eq!(server.consolidated_orders(), local);

    // A table the server does not synchronize: its row is set aside with the reason,
    // the rest goes up; untracked and removed through the C API.
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(
            "CREATE TABLE todo (id INTEGER PRIMARY KEY, title TEXT);
             INSERT INTO todo VALUES (1, 'from C');
             INSERT INTO orders VALUES ('c-more', 'alice', 'more', 2);",
        )
        .unwrap();
    let refused = run_c_with(&program, &db, &server, &["todo"]).await;
    assert_eq!(refused.report["rows_rejected"], 1, "{}", refused.report);
    assert_eq!(refused.report["rows_uploaded"], 1, "{}", refused.report);
    let rejected = &refused.rejected_rows[0];
    assert_eq!(rejected["table"], "todo", "{rejected}");
    assert_eq!(rejected["client_row"]["title"], "from C", "{rejected}");
    assert_eq!(refused.rest, ["untracked=0", "removed=1"]);
    server.stop().await;
}

#[test]
fn errors_come_back_as_statuses_with_a_message() {
    use rowsync::*;
    use std::ffi::{CStr, CString};
    let dir = tempfile::tempdir().unwrap();
    let path = CString::new(dir.path().join("c.db").to_str().unwrap()).unwrap();
    let mut client = std::ptr::null_mut();
    unsafe {
        assert_eq!(
            rowsync_open(path.as_ptr(), std::ptr::null(), &mut client),
            rowsync_status::ROWSYNC_OK
        );
        let table = CString::new("missing").unwrap();
        assert_eq!(
            rowsync_track(client, table.as_ptr()),
            rowsync_status::ROWSYNC_ERROR
        );
        let message = CStr::from_ptr(rowsync_last_error())
            .to_string_lossy()
            .to_string();
        assert!(message.contains("does not exist"), "{message}");
        assert_eq!(
            rowsync_track(std::ptr::null_mut(), table.as_ptr()),
            rowsync_status::ROWSYNC_INVALID_ARGUMENT
        );
        let mut options = std::ptr::null_mut();
        let url = CString::new("tcp://127.0.0.1:1").unwrap();
        assert_eq!(
            rowsync_options_new(url.as_ptr(), &mut options),
            rowsync_status::ROWSYNC_OK
        );
        let name = CString::new("compression").unwrap();
        let bad = CString::new("lz4").unwrap();
        assert_eq!(
            rowsync_options_set(options, name.as_ptr(), bad.as_ptr()),
            rowsync_status::ROWSYNC_INVALID_ARGUMENT
        );
        rowsync_options_set_timeout_ms(options, 2000);
        let mut report = std::ptr::null_mut();
        let status = rowsync_sync(client, options, None, std::ptr::null_mut(), &mut report);
        assert_eq!(
            status,
            rowsync_status::ROWSYNC_ERROR,
            "nothing listens on port 1"
        );
        assert_eq!(rowsync_last_server_code(), -1, "not the server's answer");
        assert!(report.is_null());
        rowsync_options_free(options);
        rowsync_close(client);
    }
}

/// A refusal names the server's code, so that an app (the Kotlin library) tells a wrong
/// password from an unknown version without reading the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_names_the_servers_code() {
    use rowsync::*;
    use std::ffi::CString;
    let server = TestServer::start(0).await;
    let db = server.client_path("refused");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(ORDERS_DDL)
        .unwrap();
    let path = CString::new(db.to_str().unwrap()).unwrap();
    let url = CString::new(format!("tcp://{}", server.address)).unwrap();
    let set = |options, name: &str, value: &str| {
        let (name, value) = (CString::new(name).unwrap(), CString::new(value).unwrap());
        assert_eq!(
            unsafe { rowsync_options_set(options, name.as_ptr(), value.as_ptr()) },
            rowsync_status::ROWSYNC_OK
        );
    };
    let refusal = move |password: &str, version: &str| {
        let mut client = std::ptr::null_mut();
        let mut options = std::ptr::null_mut();
        let mut report = std::ptr::null_mut();
        unsafe {
            assert_eq!(
                rowsync_open(path.as_ptr(), std::ptr::null(), &mut client),
                rowsync_status::ROWSYNC_OK
            );
            assert_eq!(
                rowsync_options_new(url.as_ptr(), &mut options),
                rowsync_status::ROWSYNC_OK
            );
            set(options, "user", USER);
            set(options, "password", password);
            set(options, "version", version);
            let status = rowsync_sync(client, options, None, std::ptr::null_mut(), &mut report);
            let code = rowsync_last_server_code();
            rowsync_options_free(options);
            rowsync_close(client);
            (status, code)
        }
    };
    let unknown = refusal.clone();
    let wrong_password = tokio::task::spawn_blocking(move || refusal("not-the-password", "v1"));
    assert_eq!(
        wrong_password.await.unwrap(),
        (rowsync_status::ROWSYNC_REFUSED, 3),
        "AuthenticationFailed"
    );
    let unknown_version = tokio::task::spawn_blocking(move || unknown(PASSWORD, "v9"));
    assert_eq!(
        unknown_version.await.unwrap(),
        (rowsync_status::ROWSYNC_REFUSED, 6),
        "UnknownScriptVersion"
    );
    server.stop().await;
}
