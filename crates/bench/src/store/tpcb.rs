//! The seed's TPC-B-like transaction on the client store: branches, tellers, accounts
//! and a history; each transaction adds a random amount to one account, reads its
//! balance, adds it to a teller and its branch and appends a history row.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rusqlite::{params, Connection};
use serde::Serialize;

use super::upload::{discard_logs, UploadServer};
use super::{Mode, StoreOptions};

/// Rows of each table.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Scale {
    pub branches: u64,
    pub tellers: u64,
    pub accounts: u64,
}

/// TPC-B's row padding: every row is about 100 bytes.
const FILLER: &str =
    "rowsync-bench-store-tpcb-filler-rowsync-bench-store-tpcb-filler-rowsync-bench-store";
/// The largest amount a transaction adds or takes (TPC-B's delta).
const DELTA_MAX: i64 = 99_999;
const TABLES: [(&str, &str); 4] = [
    ("branches", "CREATE TABLE branches (bid INTEGER PRIMARY KEY, owner TEXT NOT NULL, bbalance INTEGER NOT NULL, filler TEXT)"),
    ("tellers", "CREATE TABLE tellers (tid INTEGER PRIMARY KEY, owner TEXT NOT NULL, bid INTEGER NOT NULL, tbalance INTEGER NOT NULL, filler TEXT)"),
    ("accounts", "CREATE TABLE accounts (aid INTEGER PRIMARY KEY, owner TEXT NOT NULL, bid INTEGER NOT NULL, abalance INTEGER NOT NULL, filler TEXT)"),
    ("history", "CREATE TABLE history (hid INTEGER PRIMARY KEY, owner TEXT NOT NULL, tid INTEGER NOT NULL, bid INTEGER NOT NULL, aid INTEGER NOT NULL, delta INTEGER NOT NULL, mtime INTEGER NOT NULL, filler TEXT)"),
];

/// One thread count of one mode and table kind.
#[derive(Debug, Clone, Serialize)]
pub struct TpcbPoint {
    pub mode: Mode,
    pub tracked: bool,
    pub threads: usize,
    /// Transactions per second, one per repeat.
    pub tps: Vec<f64>,
    /// The sync after the transactions (single-threaded tracked runs), per repeat.
    pub upload_ms: Vec<f64>,
}

pub async fn run_mode(options: &StoreOptions, mode: Mode, tracked: bool) -> Result<Vec<TpcbPoint>> {
    let mut points = Vec::new();
    for &threads in options
        .size
        .tpcb_threads
        .iter()
        .filter(|&&t| mode.threads_allowed(t))
    {
        let mut point = TpcbPoint {
            mode,
            tracked,
            threads,
            tps: Vec::new(),
            upload_ms: Vec::new(),
        };
        for _ in 0..options.size.repeat {
            let (tps, upload) = run_once(options, mode, tracked, threads).await?;
            eprintln!(
                "bench-store: TPC-B {} {threads} threads: {tps:.0} TPS",
                mode.label()
            );
            point.tps.push(tps);
            point
                .upload_ms
                .extend(upload.map(|d| d.as_secs_f64() * 1e3));
        }
        points.push(point);
    }
    Ok(points)
}

async fn run_once(
    options: &StoreOptions,
    mode: Mode,
    tracked: bool,
    threads: usize,
) -> Result<(f64, Option<Duration>)> {
    let directory = mode.directory(&options.directory)?;
    let path = directory.path().join("tpcb.db");
    let mut client = mode.open(&path)?;
    let names: Vec<&str> = TABLES.iter().map(|(name, _)| *name).collect();
    for (name, ddl) in TABLES {
        client.connection().execute_batch(ddl)?;
        if tracked {
            client.track(name)?;
        }
    }
    load(client.connection(), options.size.tpcb_scale)?;
    let server = match tracked && threads == 1 {
        true => Some(UploadServer::start(&TABLES).await?),
        false => None,
    };
    match &server {
        Some(server) => drop(server.sync(&mut client).await?),
        None if tracked => discard_logs(&client, &names)?,
        None => {}
    }
    let transactions = options.size.tpcb_transactions;
    let scale = options.size.tpcb_scale;
    let elapsed = match threads {
        1 => run_transactions(client.connection(), scale, transactions, 0)?,
        _ => run_threads(mode, &path, scale, transactions, threads)?,
    };
    let upload = match &server {
        Some(server) => Some(server.sync(&mut client).await?),
        None => None,
    };
    if let Some(server) = server {
        server.stop().await?;
    }
    Ok((transactions as f64 / elapsed.as_secs_f64(), upload))
}

fn load(connection: &Connection, scale: Scale) -> Result<()> {
    let transaction = connection.unchecked_transaction()?;
    let tables = [
        (
            "INSERT INTO branches VALUES (?1, 'bench', 0, ?2)",
            scale.branches,
        ),
        (
            "INSERT INTO tellers VALUES (?1, 'bench', ?1 % ?3, 0, ?2)",
            scale.tellers,
        ),
        (
            "INSERT INTO accounts VALUES (?1, 'bench', ?1 % ?3, 0, ?2)",
            scale.accounts,
        ),
    ];
    for (sql, rows) in tables {
        let mut insert = transaction.prepare(sql)?;
        for id in 0..rows {
            match sql.contains("?3") {
                true => insert.execute(params![id as i64, FILLER, scale.branches as i64])?,
                false => insert.execute(params![id as i64, FILLER])?,
            };
        }
    }
    transaction.commit()?;
    Ok(())
}

fn run_threads(
    mode: Mode,
    path: &Path,
    scale: Scale,
    transactions: usize,
    threads: usize,
) -> Result<Duration> {
    let connections: Vec<Connection> = (0..threads)
        .map(|_| mode.connect(path))
        .collect::<Result<_>>()?;
    let share = transactions.div_ceil(threads);
    let started = Instant::now();
    std::thread::scope(|scope| {
        let workers: Vec<_> = connections
            .into_iter()
            .enumerate()
            .map(|(index, connection)| {
                let count = share.min(transactions - (share * index).min(transactions));
                scope.spawn(move || run_transactions(&connection, scale, count, index as u64))
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|worker| worker.join().expect("a bench thread panicked").map(drop))
    })?;
    Ok(started.elapsed())
}

fn run_transactions(
    connection: &Connection,
    scale: Scale,
    count: usize,
    stream: u64,
) -> Result<Duration> {
    let mut rng = StdRng::seed_from_u64(stream);
    let started = Instant::now();
    for _ in 0..count {
        transaction(connection, scale, &mut rng)?;
    }
    Ok(started.elapsed())
}

fn transaction(connection: &Connection, scale: Scale, rng: &mut StdRng) -> Result<()> {
    let aid = rng.gen_range(0..scale.accounts) as i64;
    let tid = rng.gen_range(0..scale.tellers) as i64;
    let bid = tid % scale.branches as i64;
    let delta = rng.gen_range(-DELTA_MAX..=DELTA_MAX);
    connection.execute_batch("BEGIN IMMEDIATE")?;
    let statements = [
        (
            "UPDATE accounts SET abalance = abalance + ?1 WHERE aid = ?2",
            aid,
        ),
        (
            "UPDATE tellers SET tbalance = tbalance + ?1 WHERE tid = ?2",
            tid,
        ),
        (
            "UPDATE branches SET bbalance = bbalance + ?1 WHERE bid = ?2",
            bid,
        ),
    ];
    for (sql, id) in statements {
        connection
            .prepare_cached(sql)?
            .execute(params![delta, id])?;
    }
    let _balance: i64 = connection
        .prepare_cached("SELECT abalance FROM accounts WHERE aid = ?1")?
        .query_row([aid], |row| row.get(0))?;
    connection
        .prepare_cached(
            "INSERT INTO history (owner, tid, bid, aid, delta, mtime, filler)
             VALUES ('bench', ?1, ?2, ?3, ?4, unixepoch(), ?5)",
        )?
        .execute(params![tid, bid, aid, delta, FILLER])?;
    connection.execute_batch("COMMIT")?;
    Ok(())
}
