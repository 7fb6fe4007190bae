//! The seed's key-value workload on the client store: phases insert, fetch, update,
//! delete and reinsert, each over batches of [`BATCH_RECORDS`] consecutive keys, one
//! transaction per batch, timed from its first batch to its last.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rusqlite::Connection;
use serde::Serialize;

use super::upload::{discard_logs, UploadServer};
use super::{Mode, StoreOptions, BATCH_RECORDS};

/// Bytes of a key and of a value, as in the seed.
pub const KEY_BYTES: usize = 64;
pub const VALUE_BYTES: usize = 64;
const TABLE: &str = "kv";
const DDL: &str =
    "CREATE TABLE kv (k BLOB PRIMARY KEY, owner TEXT NOT NULL, v BLOB NOT NULL) WITHOUT ROWID";
/// Fixes the random batches, so every mode does the same work.
const WORKLOAD_SEED: u64 = 11_205;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Phase {
    Insert,
    Fetch,
    Update,
    Delete,
    Reinsert,
}

impl Phase {
    pub const ALL: [Phase; 5] = [
        Phase::Insert,
        Phase::Fetch,
        Phase::Update,
        Phase::Delete,
        Phase::Reinsert,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Insert => "insert",
            Phase::Fetch => "fetch",
            Phase::Update => "update",
            Phase::Delete => "delete",
            Phase::Reinsert => "reinsert",
        }
    }

    fn writes(self) -> bool {
        self != Phase::Fetch
    }
}

/// One phase of one run.
#[derive(Debug, Clone, Serialize)]
pub struct KvPoint {
    pub mode: Mode,
    pub tracked: bool,
    pub threads: usize,
    pub phase: Phase,
    /// Records per second, one per repeat.
    pub records_per_second: Vec<f64>,
    /// The sync after the phase (single-threaded tracked runs), per repeat.
    pub upload_ms: Vec<f64>,
}

/// The batches of each phase: numbers `b` standing for keys `b*10 .. b*10+9`.
struct Plan {
    batches: usize,
    rng: StdRng,
}

impl Plan {
    fn batches(&mut self, phase: Phase) -> Vec<u64> {
        let all = 0..self.batches as u64;
        match phase {
            // Every batch once, in random order.
            Phase::Insert | Phase::Delete | Phase::Reinsert => {
                let mut order: Vec<u64> = all.collect();
                order.shuffle(&mut self.rng);
                order
            }
            // As many random batches, with repeats.
            Phase::Fetch | Phase::Update => (0..self.batches)
                .map(|_| self.rng.gen_range(all.clone()))
                .collect(),
        }
    }
}

pub fn key(record: u64) -> [u8; KEY_BYTES] {
    let mut key = [0u8; KEY_BYTES];
    key[KEY_BYTES - 8..].copy_from_slice(&record.to_be_bytes());
    key
}

fn value(record: u64, phase: Phase) -> [u8; VALUE_BYTES] {
    let mut value = [phase as u8; VALUE_BYTES];
    value[..8].copy_from_slice(&record.to_le_bytes());
    value
}

/// All phases of one mode and table kind, at every thread count and repeat.
pub async fn run_mode(options: &StoreOptions, mode: Mode, tracked: bool) -> Result<Vec<KvPoint>> {
    let mut points: Vec<KvPoint> = Vec::new();
    for &threads in options
        .size
        .threads
        .iter()
        .filter(|&&t| mode.threads_allowed(t))
    {
        for _ in 0..options.size.repeat {
            let with_upload = tracked && threads == 1;
            let run = run_once(options, mode, tracked, threads, with_upload).await?;
            let kind = if tracked { "tracked" } else { "untracked" };
            eprintln!(
                "bench-store: kv {} {kind} {threads} threads done",
                mode.label()
            );
            for (phase, rate, upload) in run {
                let found = points
                    .iter()
                    .position(|p| p.threads == threads && p.phase == phase);
                let index = found.unwrap_or_else(|| {
                    points.push(KvPoint {
                        mode,
                        tracked,
                        threads,
                        phase,
                        records_per_second: Vec::new(),
                        upload_ms: Vec::new(),
                    });
                    points.len() - 1
                });
                let point = &mut points[index];
                point.records_per_second.push(rate);
                point
                    .upload_ms
                    .extend(upload.map(|d| d.as_secs_f64() * 1e3));
            }
        }
    }
    Ok(points)
}

type PhaseRun = (Phase, f64, Option<Duration>);

async fn run_once(
    options: &StoreOptions,
    mode: Mode,
    tracked: bool,
    threads: usize,
    with_upload: bool,
) -> Result<Vec<PhaseRun>> {
    let directory = mode.directory(&options.directory)?;
    let path = directory.path().join("kv.db");
    let mut client = mode.open(&path)?;
    client.connection().execute_batch(DDL)?;
    if tracked {
        client.track(TABLE)?;
    }
    let server = match with_upload {
        true => Some(UploadServer::start(&[(TABLE, DDL)]).await?),
        false => None,
    };
    if let Some(server) = &server {
        server.sync(&mut client).await?;
    }
    let records = options.size.records;
    let mut plan = Plan {
        batches: records / BATCH_RECORDS,
        rng: StdRng::seed_from_u64(WORKLOAD_SEED),
    };
    let mut phases = Vec::new();
    for phase in Phase::ALL {
        let batches = plan.batches(phase);
        let elapsed = match threads {
            1 => run_batches(client.connection(), phase, &batches)?,
            _ => run_threads(mode, &path, phase, &batches, threads)?,
        };
        check_count(client.connection(), phase, records)?;
        let rate = (batches.len() * BATCH_RECORDS) as f64 / elapsed.as_secs_f64();
        let upload = match (&server, tracked && phase.writes()) {
            (Some(server), true) => Some(
                server
                    .sync(&mut client)
                    .await
                    .with_context(|| format!("the sync after {}", phase.name()))?,
            ),
            (None, true) => {
                discard_logs(&client, &[TABLE])?;
                None
            }
            (_, false) => None,
        };
        phases.push((phase, rate, upload));
    }
    if let Some(server) = server {
        server.stop().await?;
    }
    Ok(phases)
}

/// The phase's batches split among `threads`, each on its own connection; returns the
/// time from the first thread's start to the last one's end.
fn run_threads(
    mode: Mode,
    path: &Path,
    phase: Phase,
    batches: &[u64],
    threads: usize,
) -> Result<Duration> {
    let connections: Vec<Connection> = (0..threads)
        .map(|_| mode.connect(path))
        .collect::<Result<_>>()?;
    let share = batches.len().div_ceil(threads);
    let started = Instant::now();
    std::thread::scope(|scope| {
        let workers: Vec<_> = connections
            .into_iter()
            .zip(batches.chunks(share))
            .map(|(connection, chunk)| scope.spawn(move || run_batches(&connection, phase, chunk)))
            .collect();
        workers
            .into_iter()
            .try_for_each(|worker| worker.join().expect("a bench thread panicked").map(drop))
    })?;
    Ok(started.elapsed())
}

fn run_batches(connection: &Connection, phase: Phase, batches: &[u64]) -> Result<Duration> {
    let started = Instant::now();
    for &batch in batches {
        run_batch(connection, phase, batch)
            .with_context(|| format!("{} of batch {batch}", phase.name()))?;
    }
    Ok(started.elapsed())
}

/// One batch in one transaction (a write transaction takes the write lock first).
fn run_batch(connection: &Connection, phase: Phase, batch: u64) -> Result<()> {
    connection.execute_batch(if phase.writes() {
        "BEGIN IMMEDIATE"
    } else {
        "BEGIN"
    })?;
    let sql = match phase {
        Phase::Insert | Phase::Reinsert => "INSERT INTO kv (k, owner, v) VALUES (?1, 'bench', ?2)",
        Phase::Update => "UPDATE kv SET v = ?2 WHERE k = ?1",
        Phase::Delete => "DELETE FROM kv WHERE k = ?1",
        Phase::Fetch => "SELECT v FROM kv WHERE k = ?1",
    };
    let mut statement = connection.prepare_cached(sql)?;
    let first = batch * BATCH_RECORDS as u64;
    for record in first..first + BATCH_RECORDS as u64 {
        let changed = match phase {
            Phase::Fetch => {
                let found: Vec<u8> = statement.query_row([&key(record)[..]], |row| row.get(0))?;
                usize::from(found.len() == VALUE_BYTES)
            }
            Phase::Delete => statement.execute([&key(record)[..]])?,
            _ => statement.execute([&key(record)[..], &value(record, phase)[..]])?,
        };
        if changed != 1 {
            bail!("record {record} was not found or not written");
        }
    }
    drop(statement);
    connection.execute_batch("COMMIT")?;
    Ok(())
}

fn check_count(connection: &Connection, phase: Phase, records: usize) -> Result<()> {
    let count: i64 = connection.query_row("SELECT count(*) FROM kv", [], |row| row.get(0))?;
    let expected = if phase == Phase::Delete { 0 } else { records };
    if count as usize != expected {
        bail!(
            "after {} the table holds {count} records, not {expected}",
            phase.name()
        );
    }
    Ok(())
}
