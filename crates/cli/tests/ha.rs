//! `rowsync serve --ha` (issue 38) warns at start when its database would let a failover
//! lose acknowledged syncs: PostgreSQL without a synchronous standby (none named, or
//! none replicating now), or another database, whose failover is not checked.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// What `rowsync serve --ha` prints before it serves.
fn start_lines(db: &str, ha: bool) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rowsync"));
    command.args(["serve", "--db", db, "--listen", "127.0.0.1:0"]);
    if ha {
        command.arg("--ha");
    }
    let mut server = command.stderr(Stdio::piped()).spawn().unwrap();
    let mut printed = String::new();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        printed.push_str(&line);
        printed.push('\n');
        if line.starts_with("rowsync serving") {
            break;
        }
    }
    server.kill().unwrap();
    server.wait().unwrap();
    printed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_warns_without_a_synchronous_standby() {
    let cluster = rowsync_testkit::PgCluster::start().unwrap();
    let url = cluster.url("postgres");
    let printed = start_lines(&url, true);
    assert!(
        printed.contains("--ha, but the database replicates to no synchronous standby"),
        "{printed}"
    );
    assert!(
        !start_lines(&url, false).contains("warning"),
        "only with --ha"
    );

    let admin = rowsync_testkit::connect(&url).await;
    for statement in [
        "ALTER SYSTEM SET synchronous_standby_names = 'standby_b'",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(statement).await.unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let printed = start_lines(&url, true);
    assert!(
        printed.contains("no standby of synchronous_standby_names = 'standby_b' is replicating"),
        "{printed}"
    );
}

#[test]
fn ha_on_sqlite_says_the_failover_is_not_checked() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("central.db");
    rusqlite::Connection::open(&db).unwrap();
    let printed = start_lines(db.to_str().unwrap(), true);
    assert!(
        printed.contains("on SQLite the farm's failover is not checked"),
        "{printed}"
    );
}
