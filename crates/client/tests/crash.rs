//! Crash safety in every durability mode: a child process writes to a client database
//! and syncs with a real server until it is killed (SIGKILL) at a random moment, while
//! it writes or while it syncs. Then, whatever the mode:
//! - the file is a sound SQLite database whose tables and change log agree (a logged
//!   insert or update has its row, a logged delete has none);
//! - no sync the child finished met a conflict (an acknowledged upload sent again as
//!   new would: its old images no longer match the server's rows);
//! - the client, reopened in the same mode, syncs once without a conflict and then holds
//!   exactly the server's rows (it may lose its last transactions, never diverge).
//!
//! `ROWSYNC_CRASH_SEEDS=n` runs n seeds per mode (default [`SEEDS_DEFAULT`]);
//! `ROWSYNC_CRASH_SEED=n` runs that seed alone. A seed fixes the child's writes and the
//! kill delay; where the kill lands in the child's work depends on timing as well.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rowsync_client::{Client, ClientOptions, Durability, SyncOptions};
use support::{orders, TestServer, ORDERS_DDL};

/// Seeds per mode in a default (CI) run.
const SEEDS_DEFAULT: u64 = 3;
/// The child is killed this long after it starts, at random within the range.
const KILL_DELAY_MS_MIN: u64 = 30;
const KILL_DELAY_MS_MAX: u64 = 900;
/// Distinct row ids each child writes (few, so rows are updated and deleted often).
const CHILD_IDS: u32 = 40;
/// The chance that the child's next step is a sync rather than a write transaction (a
/// sync takes far longer than a write, so kills land in both about as often).
const SYNC_PROBABILITY: f64 = 0.05;
/// Statements in one of the child's transactions, at most.
const STATEMENTS_PER_TRANSACTION_MAX: u32 = 5;

const CHILD_ENV: &str = "ROWSYNC_CRASH_CHILD";

/// What the child needs, passed in its environment.
struct ChildSetup {
    db: PathBuf,
    durability: Durability,
    address: String,
    seed: u64,
    journal: PathBuf,
}

/// The child's role: run only when the crash test re-executes this binary.
#[test]
fn crash_child_process() {
    let Ok(db) = std::env::var(CHILD_ENV) else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap();
    let setup = ChildSetup {
        db: PathBuf::from(db),
        durability: Durability::parse(&var("ROWSYNC_CRASH_MODE")).unwrap(),
        address: var("ROWSYNC_CRASH_ADDRESS"),
        seed: var("ROWSYNC_CRASH_CHILD_SEED").parse().unwrap(),
        journal: PathBuf::from(var("ROWSYNC_CRASH_JOURNAL")),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(child_loop(&setup));
}

/// Writes and syncs until killed; notes each sync's start and outcome in the journal.
async fn child_loop(setup: &ChildSetup) {
    let mut rng = StdRng::seed_from_u64(setup.seed);
    let mut client = open(&setup.db, setup.durability);
    let options = SyncOptions::new(
        format!("tcp://{}", setup.address),
        support::USER,
        support::PASSWORD,
    );
    let mut journal = std::fs::File::create(&setup.journal).unwrap();
    loop {
        if rng.gen_bool(SYNC_PROBABILITY) {
            writeln!(journal, "sync").unwrap();
            let report = client.sync(&options).await.unwrap();
            writeln!(journal, "synced conflicts={}", report.conflicts).unwrap();
        } else {
            write_transaction(client.connection(), &mut rng, setup.seed);
        }
    }
}

/// One transaction of inserts, updates and deletes on the child's own ids, each
/// statement choosing by whether the row exists (so the log's collapse is exercised
/// without `OR REPLACE`, and its operations match the rows exactly).
fn write_transaction(connection: &rusqlite::Connection, rng: &mut StdRng, seed: u64) {
    let transaction = connection.unchecked_transaction().unwrap();
    for _ in 0..rng.gen_range(1..=STATEMENTS_PER_TRANSACTION_MAX) {
        let id = format!("s{seed}-{}", rng.gen_range(0..CHILD_IDS));
        let exists: bool = transaction
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM orders WHERE id = ?1)",
                [&id],
                |row| row.get(0),
            )
            .unwrap();
        let statement = match (exists, rng.gen_bool(0.3)) {
            (false, _) => "INSERT INTO orders VALUES (?1, 'alice', 'written', 0)",
            (true, false) => "UPDATE orders SET quantity = quantity + 1 WHERE id = ?1",
            (true, true) => "DELETE FROM orders WHERE id = ?1",
        };
        transaction.execute(statement, [&id]).unwrap();
    }
    transaction.commit().unwrap();
}

fn open(path: &Path, durability: Durability) -> Client {
    let mut client = Client::open_with(path, &ClientOptions::new(durability)).unwrap();
    let create = ORDERS_DDL.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS");
    client.connection().execute_batch(&create).unwrap();
    client.track("orders").unwrap();
    client
}

/// Runs the child against `server` and kills it; returns whether it was syncing.
async fn run_and_kill(server: &TestServer, durability: Durability, seed: u64) -> bool {
    let db = server.client_path(&format!("{}-{seed}", durability.name()));
    let journal = db.with_extension("journal.txt");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "crash_child_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &db)
        .env("ROWSYNC_CRASH_MODE", durability.name())
        .env("ROWSYNC_CRASH_ADDRESS", server.address.to_string())
        .env("ROWSYNC_CRASH_CHILD_SEED", seed.to_string())
        .env("ROWSYNC_CRASH_JOURNAL", &journal)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let delay = StdRng::seed_from_u64(seed).gen_range(KILL_DELAY_MS_MIN..=KILL_DELAY_MS_MAX);
    tokio::time::sleep(Duration::from_millis(delay)).await;
    if let Some(status) = child.try_wait().unwrap() {
        let output = child.wait_with_output().unwrap();
        panic!(
            "seed {seed}: the child ended by itself ({status}): {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let journal = std::fs::read_to_string(&journal).unwrap_or_default();
    for line in journal.lines().filter(|line| line.starts_with("synced")) {
        assert_eq!(line, "synced conflicts=0", "seed {seed} ({durability:?})");
    }
    journal.lines().last() == Some("sync")
}

/// The checks after a crash (see the top of the file).
async fn check_recovery(server: &TestServer, durability: Durability, seed: u64) {
    let db = server.client_path(&format!("{}-{seed}", durability.name()));
    if db.exists() {
        check_file(&db, seed);
    }
    let mut client = open(&db, durability);
    // A change made after the crash, before the first sync: it must reach the server
    // even if the upload the crash interrupted is resent under the same sequence.
    let recovered = format!("recovered-{}-{seed}", durability.name());
    client
        .connection()
        .execute(
            "INSERT INTO orders VALUES (?1, 'alice', 'after', 0)",
            [&recovered],
        )
        .unwrap();
    let report = client.sync(&server.options()).await.unwrap();
    assert_eq!(
        report.conflicts, 0,
        "seed {seed} ({durability:?}): {report:?}"
    );
    let on_server = server
        .consolidated_orders()
        .iter()
        .any(|row| row.first() == Some(&rowsync_protocol::Value::Text(recovered.clone())));
    assert!(
        on_server,
        "seed {seed} ({durability:?}): the change made after the crash was lost"
    );
    assert_eq!(
        orders(client.connection()),
        server.consolidated_orders(),
        "seed {seed} ({durability:?}): the client and the server differ after its sync"
    );
}

/// The file is sound and its change log agrees with its table.
fn check_file(db: &Path, seed: u64) {
    let connection = rusqlite::Connection::open(db).unwrap();
    let integrity: String = connection
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(integrity, "ok", "seed {seed}");
    let has_log: bool = connection
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'rs_log_orders')",
            [],
            |row| row.get(0),
        )
        .unwrap();
    if !has_log {
        return;
    }
    let disagreeing: i64 = connection
        .query_row(
            "SELECT count(*) FROM rs_log_orders AS l LEFT JOIN orders AS t ON t.id = l.id
             WHERE (l.rs_op IN ('I', 'U')) <> (t.id IS NOT NULL)",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(
        disagreeing, 0,
        "seed {seed}: log entries that disagree with the table"
    );
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("ROWSYNC_CRASH_SEED") {
        return vec![seed.parse().expect("ROWSYNC_CRASH_SEED is a number")];
    }
    let count = std::env::var("ROWSYNC_CRASH_SEEDS")
        .map(|n| n.parse().expect("ROWSYNC_CRASH_SEEDS is a number"))
        .unwrap_or(SEEDS_DEFAULT);
    (1..=count).collect()
}

async fn crash_in_mode(durability: Durability) {
    let server = TestServer::start(0).await;
    let (mut while_syncing, seeds) = (0, seeds());
    for &seed in &seeds {
        while_syncing += usize::from(run_and_kill(&server, durability, seed).await);
        check_recovery(&server, durability, seed).await;
    }
    println!(
        "{durability:?}: {} seeds passed, {while_syncing} killed while syncing, {} while writing",
        seeds.len(),
        seeds.len() - while_syncing
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_full_mode_converges() {
    crash_in_mode(Durability::Full).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_normal_mode_converges() {
    crash_in_mode(Durability::Normal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_off_mode_converges() {
    crash_in_mode(Durability::Off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_memory_mode_loses_the_last_writes_and_converges() {
    crash_in_mode(Durability::Memory).await;
}
