//! A client that goes away while its sync runs in the database does not keep the
//! database busy: the server cancels the statement and frees the worker. Here the
//! statement is a `begin_synchronization` script waiting for a lock the test holds; in
//! the field, the re-check of a large upload applied before, or any long statement,
//! takes the same path. Checked on a real `rowsync serve` with one worker over
//! PostgreSQL, by what `pg_stat_activity` shows.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use rowsync_client::{Client, SyncOptions};

use support::NOTES_DDL as NOTES;
const PASSWORD: &str = "a-long-password-for-gone";
/// The statement a held sync waits in.
const HELD: &str = "SELECT count(*) FROM (SELECT pg_advisory_xact_lock_shared(4243) \
                    WHERE :client_id LIKE 'held%') AS held";
/// A hang guard for conditions awaited, not a timing assertion.
const WAIT: Duration = Duration::from_secs(60);

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Statements of held syncs running in the database now.
async fn held_statements(observer: &tokio_postgres::Client) -> i64 {
    observer
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
             AND query LIKE '%pg_advisory_xact_lock_shared(4243)%' AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Until `wanted` statements of held syncs run in the database.
async fn until_held(observer: &tokio_postgres::Client, wanted: i64, what: &str) {
    let waited = tokio::time::timeout(WAIT, async {
        while held_statements(observer).await != wanted {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "never: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_whose_client_left_is_cancelled_in_the_database_and_frees_its_worker() {
    let (url, observer) = support::postgres_notes("gone", PASSWORD).await;
    let mut child = support::rowsync()
        .args([
            "serve",
            "--db",
            &url,
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut banner)
        .unwrap();
    let _server = Server(child);
    let address = banner
        .split_whitespace()
        .find(|word| word.starts_with("tcp://"))
        .unwrap_or_else(|| panic!("no tcp endpoint in {banner}"))
        .to_string();
    let options = SyncOptions::new(&address, "erin", PASSWORD);

    // A client syncs a row; then the script holds its syncs, and it syncs again.
    let dir = tempfile::tempdir().unwrap();
    let mut held = Client::open_with_id(dir.path().join("held.db"), Some("held-1")).unwrap();
    held.connection().execute_batch(NOTES).unwrap();
    held.track("notes").unwrap();
    held.connection()
        .execute_batch("INSERT INTO notes VALUES (1, 'erin', 'kept')")
        .unwrap();
    held.sync(&options).await.unwrap();
    observer
        .batch_execute(&format!(
            "INSERT INTO rs_script (script_version, table_name, event, script) \
             VALUES ('v1', '', 'begin_synchronization', '{}'); SELECT pg_advisory_lock(4243)",
            HELD.replace('\'', "''")
        ))
        .await
        .unwrap();
    let held_options = options.clone();
    let sync = tokio::spawn(async move { held.sync(&held_options).await });
    until_held(&observer, 1, "the held sync waits in the database").await;

    // The client goes away: its connection closes with the task.
    sync.abort();
    let _ = sync.await;
    until_held(&observer, 0, "the held statement is cancelled").await;

    // The only worker serves the next client while the lock is still held.
    let mut next = Client::open_with_id(dir.path().join("next.db"), Some("next-1")).unwrap();
    next.connection().execute_batch(NOTES).unwrap();
    next.track("notes").unwrap();
    let report = tokio::time::timeout(WAIT, next.sync(&options))
        .await
        .expect("the worker is free")
        .unwrap();
    assert_eq!(report.rows_downloaded, 1);
}
