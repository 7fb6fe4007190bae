//! A C app that links SQLite itself and librowsync built without its own SQLite
//! (`--no-default-features --features system-sqlite-compat`, which scripts/test copies
//! to target/debug/system-sqlite/) writes one client database from both in one
//! process, each side opening and closing connections while the other's stay open
//! (tests/c/shared_sqlite.c). One SQLite library: every row reaches the server and the
//! file is sound. (Linked with the default librowsync.so, which carries a SQLite of its
//! own, the same program stops at its third write, "database disk image is malformed":
//! docs/client.md section 11.)

#[path = "../../client/tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use rowsync_protocol::Value;
use support::{TestServer, ORDERS_DDL, PASSWORD, USER};

const ROUNDS: usize = 3;

/// Where scripts/test puts librowsync built against the system's SQLite.
fn system_sqlite_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let debug = exe.parent().and_then(Path::parent).unwrap();
    debug.join("system-sqlite")
}

/// The program linked with librowsync.`kind` ("a" or "so") of that build and -lsqlite3.
fn compile(dir: &Path, kind: &str) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let library_dir = system_sqlite_dir();
    let library = library_dir.join(format!("librowsync.{kind}"));
    let built = std::fs::metadata(&library).and_then(|m| m.modified());
    let source = std::fs::metadata(crate_dir.join("src/lib.rs")).and_then(|m| m.modified());
    assert!(
        matches!((built, source), (Ok(built), Ok(source)) if built >= source),
        "{} is missing or older than src/lib.rs: run scripts/test, or `cargo build -p \
         rowsync-ffi --no-default-features --features system-sqlite-compat` and copy \
         target/debug/librowsync.{{a,so}} to {}",
        library.display(),
        library_dir.display()
    );
    let program = dir.join(format!("shared_sqlite_{kind}"));
    let mut cc = Command::new("cc");
    cc.arg(crate_dir.join("tests/c/shared_sqlite.c"))
        .args(["-std=c99", "-Wall", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg("-o")
        .arg(&program)
        .arg(&library);
    if kind == "so" {
        cc.arg(format!("-Wl,-rpath,{}", library_dir.display()));
    }
    let output = cc
        .args(["-lsqlite3", "-lpthread", "-ldl", "-lm"])
        .output()
        .expect("running cc (is a C compiler installed?)");
    assert!(
        output.status.success(),
        "cc failed (is libsqlite3-dev installed?): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    program
}

async fn run(kind: &str) {
    let server = TestServer::start(ROUNDS).await;
    let program = compile(server.dir.path(), kind);
    let db = server.client_path(&format!("c-app-{kind}"));
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(ORDERS_DDL)
        .unwrap();

    let output = tokio::process::Command::new(&program)
        .arg(&db)
        .arg(format!("tcp://{}", server.address))
        .args([USER, PASSWORD, &ROUNDS.to_string()])
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
    let mut written: Vec<&str> = stdout.lines().collect();
    assert_eq!(written.pop(), Some("integrity=ok;"), "{stdout}");
    assert_eq!(written.len(), ROUNDS * 4, "{stdout}");

    let local = support::orders(&rusqlite::Connection::open(&db).unwrap());
    let on_server = server.consolidated_orders();
    assert_eq!(on_server, local);
    for id in &written {
        assert!(
            on_server
                .iter()
                .any(|row| row[0] == Value::Text(id.to_string())),
            "{id} is not on the server"
        );
    }
    assert_eq!(on_server.len(), ROUNDS + written.len());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_and_the_static_library_share_its_sqlite() {
    run("a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_and_the_shared_library_share_its_sqlite() {
    run("so").await;
}
