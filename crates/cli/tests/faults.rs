//! The fault matrix: a real `rowsync serve` child process (the `rowsync-failpoints`
//! binary, built with the `failpoints` feature) is stopped at each step of a sync and of
//! cleanup, killed there with SIGKILL, and restarted; the client retries. On SQLite and on
//! PostgreSQL, every run must end as the same workload ends without faults: the same
//! consolidated rows, the same rows written to the consolidated table (an audit trigger
//! records each written body, every body being unique, so an upload applied twice shows
//! twice), and every client holding exactly its partition.
//!
//! A seed drives the workload (writes on clients and on the server, which client syncs,
//! the order of the points); each seed passes every point once. Seeds:
//! `ROWSYNC_FAULT_SEEDS` (default 2; hundreds for a long run), or replay one with
//! `ROWSYNC_FAULT_SEED=n`.
//!
//! The binary: `ROWSYNC_FAILPOINTS_BIN`, or `rowsync-failpoints` beside the `rowsync`
//! binary cargo built for this test (scripts/test builds it with
//! `cargo build --workspace --features rowsync-cli/failpoints --bin rowsync-failpoints`).

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rowsync_client::{Client, ClientError, SyncOptions};
use rowsync_protocol::ErrorCode;
use tokio::sync::mpsc;

const NOTES: &str = "CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, body TEXT)";
const PASSWORD: &str = "a-long-password-for-faults";
const USERS: [&str; 2] = ["erin", "frank"];
const CLIENTS: [(&str, usize); 3] = [("erin-a", 0), ("erin-b", 0), ("frank-a", 1)];
/// Keys each user's rows take: few, so clients and server meet on the same rows.
const KEYS_PER_USER: i64 = 10;
/// A hang guard, not a timing assertion: a point must be reached, a retry must succeed.
const WAIT: Duration = Duration::from_secs(120);
/// Retries of a sync after the restart (PostgreSQL may not yet have noticed the killed
/// server's connection, whose transaction still holds the client's lock).
const RETRIES_MAX: u32 = 200;

/// Where a run stops the server: a point of a sync or of cleanup.
const SYNC_POINTS: [&str; 8] = [
    "after_hello",
    "mid_upload",
    "before_apply",
    "mid_apply",
    "after_commit",
    "mid_download",
    "before_ack",
    "after_ack",
];
const CLEANUP_POINT: &str = "mid_cleanup";

fn failpoints_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ROWSYNC_FAILPOINTS_BIN") {
        return PathBuf::from(path);
    }
    let beside = Path::new(env!("CARGO_BIN_EXE_rowsync")).with_file_name("rowsync-failpoints");
    assert!(
        beside.is_file(),
        "{} is missing: build it with `cargo build --workspace --features \
         rowsync-cli/failpoints --bin rowsync-failpoints` (scripts/test does), or set \
         ROWSYNC_FAILPOINTS_BIN",
        beside.display()
    );
    beside
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("ROWSYNC_FAULT_SEED") {
        return vec![seed.parse().expect("ROWSYNC_FAULT_SEED is a number")];
    }
    let count: u64 = std::env::var("ROWSYNC_FAULT_SEEDS")
        .ok()
        .map(|count| count.parse().expect("ROWSYNC_FAULT_SEEDS is a number"))
        .unwrap_or(2);
    (0..count).collect()
}

type Rows = Vec<(i64, String, Option<String>)>;

/// The consolidated database, reached by the test directly for its own writes and reads.
enum Consolidated {
    Sqlite(PathBuf),
    Postgres(String, tokio_postgres::Client),
}

impl Consolidated {
    async fn sqlite(dir: &Path) -> Consolidated {
        let path = dir.join("consolidated.db");
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(&format!(
                "{NOTES};
                 CREATE TABLE audit (id INTEGER, body TEXT);
                 CREATE TRIGGER audit_insert AFTER INSERT ON notes
                     BEGIN INSERT INTO audit VALUES (NEW.id, NEW.body); END;
                 CREATE TRIGGER audit_update AFTER UPDATE ON notes WHEN NEW.body IS NOT OLD.body
                     BEGIN INSERT INTO audit VALUES (NEW.id, NEW.body); END;"
            ))
            .unwrap();
        Consolidated::Sqlite(path)
    }

    async fn postgres() -> Consolidated {
        let url = rowsync_testkit::fresh_database("faults").await;
        let client = rowsync_testkit::connect(&url).await;
        client
            .batch_execute(&format!(
                "{NOTES};
                 CREATE TABLE audit (id INTEGER, body TEXT);
                 CREATE FUNCTION audit_note() RETURNS trigger LANGUAGE plpgsql AS $$
                     BEGIN INSERT INTO audit VALUES (NEW.id, NEW.body); RETURN NULL; END $$;
                 CREATE TRIGGER audit_insert AFTER INSERT ON notes
                     FOR EACH ROW EXECUTE FUNCTION audit_note();
                 CREATE TRIGGER audit_update AFTER UPDATE ON notes FOR EACH ROW
                     WHEN (OLD.body IS DISTINCT FROM NEW.body) EXECUTE FUNCTION audit_note();"
            ))
            .await
            .unwrap();
        Consolidated::Postgres(url, client)
    }

    fn db_argument(&self) -> String {
        match self {
            Consolidated::Sqlite(path) => path.display().to_string(),
            Consolidated::Postgres(url, _) => url.clone(),
        }
    }

    async fn execute(&self, sql: &str) {
        match self {
            Consolidated::Sqlite(path) => {
                let connection = rusqlite::Connection::open(path).unwrap();
                connection.busy_timeout(WAIT).unwrap();
                connection.execute_batch(sql).unwrap();
            }
            Consolidated::Postgres(_, client) => client.batch_execute(sql).await.unwrap(),
        }
    }

    async fn rows(&self, sql: &str) -> Rows {
        match self {
            Consolidated::Sqlite(path) => {
                let connection = rusqlite::Connection::open(path).unwrap();
                connection.busy_timeout(WAIT).unwrap();
                sqlite_rows(&connection, sql)
            }
            Consolidated::Postgres(_, client) => client
                .query(sql, &[])
                .await
                .unwrap()
                .iter()
                .map(|row| {
                    (
                        i64::from(row.get::<_, i32>(0)),
                        row.get::<_, String>(1),
                        row.get::<_, Option<String>>(2),
                    )
                })
                .collect(),
        }
    }

    async fn notes(&self) -> Rows {
        self.rows("SELECT id, owner, body FROM notes ORDER BY id")
            .await
    }

    /// Every body written to `notes`, with its key, sorted.
    async fn audit(&self) -> Rows {
        self.rows("SELECT id, '' AS owner, body FROM audit ORDER BY id, body")
            .await
    }
}

fn sqlite_rows(connection: &rusqlite::Connection, sql: &str) -> Rows {
    let mut statement = connection.prepare(sql).unwrap();
    let rows = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

/// The binary, told to stop nowhere unless the caller says where.
fn command(binary: &Path) -> Command {
    let mut command = Command::new(binary);
    command.env_remove("ROWSYNC_FAILPOINT");
    command
}

fn run_ok(binary: &Path, args: &[&str], stdin: Option<&str>) {
    support::run_command_ok(command(binary), args, stdin);
}

/// A child process, killed (SIGKILL) when dropped; its stderr lines arrive on `lines`.
struct Process {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Process {
    fn spawn(mut command: Command) -> (Process, String) {
        let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut first = String::new();
        stderr.read_line(&mut first).unwrap();
        let (sender, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in stderr.lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        (Process { child, lines }, first)
    }

    /// Waits for the process to say it stopped at `point`.
    async fn reached(&mut self, point: &str) -> Result<(), String> {
        let wanted = format!("rowsync failpoint {point} reached");
        loop {
            match self.lines.recv().await {
                Some(line) if line.contains(&wanted) => return Ok(()),
                Some(_) => continue,
                None => return Err(format!("the process ended before reaching {point}")),
            }
        }
    }

    /// A real `kill -9`: `Child::kill` sends SIGKILL on Unix.
    fn kill_9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `rowsync serve` child, stopping at `failpoint` if one is given; its address.
fn serve(binary: &Path, db: &str, failpoint: Option<&str>) -> (Process, String) {
    serve_with(binary, db, failpoint, &[])
}

/// [`serve`] with more arguments.
fn serve_with(
    binary: &Path,
    db: &str,
    failpoint: Option<&str>,
    extra: &[&str],
) -> (Process, String) {
    let mut command = command(binary);
    command
        .args([
            "serve",
            "--db",
            db,
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "2",
        ])
        .args(["--cleanup-interval-seconds", "100000"])
        .args(extra);
    if let Some(point) = failpoint {
        command.env("ROWSYNC_FAILPOINT", point);
    }
    let (process, banner) = Process::spawn(command);
    assert!(banner.starts_with("rowsync serving"), "{banner}");
    let address = banner
        .split_whitespace()
        .find(|word| word.starts_with("tcp://"))
        .unwrap_or_else(|| panic!("no tcp endpoint in {banner}"))
        .to_string();
    (process, address)
}

/// One client database and how it syncs.
struct Replica {
    client: Client,
    user: usize,
    _dir: tempfile::TempDir,
}

impl Replica {
    fn open(client_id: &str, user: usize) -> Replica {
        let dir = tempfile::tempdir().unwrap();
        let mut client =
            Client::open_with_id(dir.path().join("client.db"), Some(client_id)).unwrap();
        client.connection().execute_batch(NOTES).unwrap();
        client.track("notes").unwrap();
        Replica {
            client,
            user,
            _dir: dir,
        }
    }

    fn options(&self, address: &str, download_ack: bool) -> SyncOptions {
        let mut options = SyncOptions::new(address, USERS[self.user], PASSWORD);
        options.download_ack = download_ack;
        options.timeout = WAIT;
        options
    }

    fn rows(&self) -> Rows {
        sqlite_rows(
            self.client.connection(),
            "SELECT id, owner, body FROM notes ORDER BY id",
        )
    }

    /// Syncs, retrying while the server says a sync of this client is still running.
    async fn sync(&mut self, address: &str, download_ack: bool) {
        let options = self.options(address, download_ack);
        for _ in 0..RETRIES_MAX {
            match self.client.sync(&options).await {
                Ok(_) => return,
                Err(error) if error.server_code() == Some(ErrorCode::AlreadySynchronizing) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => panic!("sync of {}: {error}", self.client.client_id()),
            }
        }
        panic!("client {} still refused", self.client.client_id());
    }
}

/// What a run wrote and synced, step by step, from its seed.
struct Workload {
    rng: StdRng,
    bodies: u64,
}

impl Workload {
    fn body(&mut self, tag: &str) -> String {
        self.bodies += 1;
        format!("{tag}-{}", self.bodies)
    }

    fn key(&mut self, user: usize) -> i64 {
        user as i64 * 100 + self.rng.gen_range(1..=KEYS_PER_USER)
    }

    /// An insert, update or delete on the client, in its own partition.
    fn write_on_client(&mut self, replica: &Replica) {
        let id = self.key(replica.user);
        let body = self.body(replica.client.client_id());
        let connection = replica.client.connection();
        let present: bool = connection
            .query_row("SELECT count(*) FROM notes WHERE id = ?1", [id], |row| {
                row.get::<_, i64>(0)
            })
            .unwrap()
            > 0;
        if !present {
            connection
                .execute(
                    "INSERT INTO notes VALUES (?1, ?2, ?3)",
                    rusqlite::params![id, USERS[replica.user], body],
                )
                .unwrap();
        } else if self.rng.gen_bool(0.7) {
            connection
                .execute(
                    "UPDATE notes SET body = ?2 WHERE id = ?1",
                    rusqlite::params![id, body],
                )
                .unwrap();
        } else {
            connection
                .execute("DELETE FROM notes WHERE id = ?1", [id])
                .unwrap();
        }
    }

    /// An upsert or delete of a row of `user` (any user's if none), written on the
    /// server directly; `upsert` leaves no choice of a delete.
    async fn write_on_server(
        &mut self,
        consolidated: &Consolidated,
        user: Option<usize>,
        upsert: bool,
    ) {
        let user = user.unwrap_or_else(|| self.rng.gen_range(0..USERS.len()));
        let id = self.key(user);
        let sql = if !upsert && self.rng.gen_bool(0.25) {
            format!("DELETE FROM notes WHERE id = {id}")
        } else {
            let body = self.body("server");
            format!(
                "INSERT INTO notes (id, owner, body) VALUES ({id}, '{}', '{body}') \
                 ON CONFLICT (id) DO UPDATE SET body = excluded.body",
                USERS[user]
            )
        };
        consolidated.execute(&sql).await;
    }
}

/// What a run ends with.
#[derive(Debug, PartialEq)]
struct Outcome {
    notes: Rows,
    audit: Rows,
    clients: Vec<Rows>,
}

/// Runs the seed's workload on `consolidated`, stopping and killing the server at every
/// point when `faults` is set; returns the end state after every client synced twice.
async fn run(seed: u64, consolidated: &Consolidated, faults: bool) -> Outcome {
    let binary = failpoints_binary();
    let db = consolidated.db_argument();
    run_ok(
        &binary,
        &[
            "init",
            "--db",
            &db,
            "--table",
            "notes",
            "--partition-column",
            "owner",
        ],
        None,
    );
    for user in USERS {
        run_ok(
            &binary,
            &["user", "add", "--db", &db, "--name", user],
            Some(PASSWORD),
        );
    }
    let mut replicas: Vec<Replica> = CLIENTS
        .iter()
        .map(|(id, user)| Replica::open(&format!("{id}-{seed}"), *user))
        .collect();
    let mut workload = Workload {
        rng: StdRng::seed_from_u64(seed),
        bodies: 0,
    };
    let mut points: Vec<&str> = SYNC_POINTS.to_vec();
    points.push(CLEANUP_POINT);
    points.shuffle(&mut workload.rng);
    let (mut server, mut address) = serve(&binary, &db, None);
    for point in points {
        for _ in 0..workload.rng.gen_range(0..3) {
            workload.write_on_server(consolidated, None, false).await;
        }
        let chosen = workload.rng.gen_range(0..replicas.len());
        // Something to download, so the server stops with part of it sent.
        workload
            .write_on_server(consolidated, Some(replicas[chosen].user), true)
            .await;
        // Something to upload: writes that cancel out (an insert deleted again) leave none.
        for _ in 0..workload.rng.gen_range(1..4) {
            workload.write_on_client(&replicas[chosen]);
        }
        while !replicas[chosen].client.has_pending_changes().unwrap() {
            workload.write_on_client(&replicas[chosen]);
        }
        let download_ack = point.ends_with("_ack");
        if point == CLEANUP_POINT {
            if faults {
                cleanup_killed(&binary, &db).await;
            }
            run_ok(&binary, &["cleanup", "--db", &db], None);
            replicas[chosen].sync(&address, download_ack).await;
        } else if faults {
            server.kill_9();
            let replica = &mut replicas[chosen];
            let (stopping, stopping_address) = serve(&binary, &db, Some(point));
            sync_killed(replica, stopping, &stopping_address, point, download_ack).await;
            (server, address) = serve(&binary, &db, None);
            replica.sync(&address, download_ack).await;
        } else {
            replicas[chosen].sync(&address, download_ack).await;
        }
        let other = workload.rng.gen_range(0..replicas.len());
        replicas[other].sync(&address, false).await;
    }
    for _ in 0..2 {
        for replica in &mut replicas {
            replica.sync(&address, false).await;
        }
    }
    drop(server);
    end_state(seed, consolidated, &replicas).await
}

/// The end state, once every client holds exactly its partition and no body was written
/// twice.
async fn end_state(seed: u64, consolidated: &Consolidated, replicas: &[Replica]) -> Outcome {
    let notes = consolidated.notes().await;
    let clients: Vec<Rows> = replicas.iter().map(Replica::rows).collect();
    for (replica, rows) in replicas.iter().zip(&clients) {
        let partition: Rows = notes
            .iter()
            .filter(|(_, owner, _)| owner == USERS[replica.user])
            .cloned()
            .collect();
        assert_eq!(
            rows,
            &partition,
            "seed {seed}: client {} does not hold its partition",
            replica.client.client_id()
        );
    }
    let audit = consolidated.audit().await;
    let mut bodies: BTreeMap<&Option<String>, usize> = BTreeMap::new();
    for (_, _, body) in &audit {
        *bodies.entry(body).or_default() += 1;
    }
    for (body, count) in bodies {
        assert_eq!(count, 1, "seed {seed}: {body:?} was written {count} times");
    }
    Outcome {
        notes,
        audit,
        clients,
    }
}

/// Starts a sync against a server that stops at `point`, kills the server there, and
/// checks the sync failed.
async fn sync_killed(
    replica: &mut Replica,
    mut stopping: Process,
    address: &str,
    point: &str,
    download_ack: bool,
) {
    let options = replica.options(address, download_ack);
    let client = &mut replica.client;
    let sync = client.sync(&options);
    tokio::pin!(sync);
    let reached = tokio::time::timeout(WAIT, async {
        tokio::select! {
            reached = stopping.reached(point) => reached,
            ended = &mut sync => Err(format!("the sync ended before {point}: {ended:?}")),
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{point} not reached"));
    reached.unwrap();
    stopping.kill_9();
    let ended: Result<_, ClientError> = tokio::time::timeout(WAIT, sync)
        .await
        .unwrap_or_else(|_| panic!("the client hangs after the kill at {point}"));
    assert!(
        ended.is_err(),
        "a sync whose server was killed at {point} reported success"
    );
}

/// Runs `rowsync cleanup` stopping mid-way (tombstones of one table deleted, not
/// committed) and kills it there.
async fn cleanup_killed(binary: &Path, db: &str) {
    let mut command = command(binary);
    command
        .args(["cleanup", "--db", db])
        .env("ROWSYNC_FAILPOINT", CLEANUP_POINT);
    let (mut cleanup, first) = Process::spawn(command);
    if !first.contains(&format!("failpoint {CLEANUP_POINT} reached")) {
        tokio::time::timeout(WAIT, cleanup.reached(CLEANUP_POINT))
            .await
            .expect("cleanup reaches its point")
            .unwrap();
    }
    cleanup.kill_9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_point_of_a_sync_survives_kill_9_on_sqlite() {
    for seed in seeds() {
        let faulty_dir = tempfile::tempdir().unwrap();
        let reference_dir = tempfile::tempdir().unwrap();
        let faulty = run(seed, &Consolidated::sqlite(faulty_dir.path()).await, true).await;
        let reference = run(
            seed,
            &Consolidated::sqlite(reference_dir.path()).await,
            false,
        )
        .await;
        assert_eq!(faulty, reference, "seed {seed}: faults changed the outcome");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_point_of_a_sync_survives_kill_9_on_postgres() {
    for seed in seeds() {
        let faulty = run(seed, &Consolidated::postgres().await, true).await;
        let reference = run(seed, &Consolidated::postgres().await, false).await;
        assert_eq!(faulty, reference, "seed {seed}: faults changed the outcome");
    }
}

/// Apply streams (issue 20): a server killed with its streams prepared (before the
/// decision) or decided (before `COMMIT PREPARED`); the next server to start resolves
/// them from the decision recorded: rolled back, the client's retry applies the upload;
/// committed, the retry finds it applied. Either way every row lands exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_streams_killed_between_prepare_and_commit_are_resolved_at_start() {
    const ROWS: i64 = 400;
    let streams = ["--apply-streams-max", "4", "--apply-stream-rows-min", "100"];
    for (point, committed) in [("streams_prepared", false), ("streams_decided", true)] {
        let consolidated = Consolidated::postgres().await;
        let Consolidated::Postgres(db, client) = &consolidated else {
            unreachable!()
        };
        let binary = failpoints_binary();
        run_ok(
            &binary,
            &[
                "init",
                "--db",
                db,
                "--table",
                "notes",
                "--partition-column",
                "owner",
            ],
            None,
        );
        run_ok(
            &binary,
            &["user", "add", "--db", db, "--name", USERS[0]],
            Some(PASSWORD),
        );
        let mut replica = Replica::open("streams-a", 0);
        for id in 1..=ROWS {
            replica
                .client
                .connection()
                .execute(
                    "INSERT INTO notes VALUES (?1, ?2, ?3)",
                    rusqlite::params![id, USERS[0], format!("body-{id}")],
                )
                .unwrap();
        }
        let prepared = "SELECT count(*) FROM pg_prepared_xacts \
             WHERE gid LIKE 'rowsync-%' AND database = current_database()";
        let count = |sql: &'static str| async move {
            client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0)
        };
        let (stopping, address) = serve_with(&binary, db, Some(point), &streams);
        sync_killed(&mut replica, stopping, &address, point, false).await;
        assert_eq!(
            count(prepared).await,
            3,
            "{point}: three streams beside the sync's own"
        );
        // The stopped server's connection may not be gone yet: its rows are invisible
        // until the recovery commits the streams, or absent for good.
        let (server, address) = serve_with(&binary, db, None, &streams);
        assert_eq!(count(prepared).await, 0, "{point}: resolved at start");
        let landed = count("SELECT count(*) FROM notes").await;
        let expected = if committed { ROWS } else { 0 };
        assert_eq!(landed, expected, "{point}: the decision recorded decides");
        replica.sync(&address, false).await;
        drop(server);
        assert_eq!(count("SELECT count(*) FROM notes").await, ROWS, "{point}");
        let audit = consolidated.audit().await;
        assert_eq!(
            audit.len() as i64,
            ROWS,
            "{point}: every row written exactly once"
        );
        assert_eq!(count(prepared).await, 0, "{point}: nothing left prepared");
    }
}
