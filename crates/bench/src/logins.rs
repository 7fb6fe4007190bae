//! Password logins with and without session tokens (issue 36): clients, each a real
//! client database, syncing by password again and again, all at once, against two
//! servers in this process on one SQLite consolidated database: one that hands out no
//! session tokens (every sync pays the argon2id check) and one that does (only a
//! client's first login pays it). The two run in alternated rounds in one run, and the
//! report gives each one's syncs per second, this process's CPU per sync, and the ratios.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rowsync_cli::local_server::LocalServer;
use rowsync_client::{Client, SyncOptions};
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_server::ServerConfig;

use crate::timing::cpu::{CpuUsage, Meter};

const PASSWORD: &str = "bench-logins-password";
const TABLE_DDL: &str = "CREATE TABLE notes (id TEXT PRIMARY KEY, owner TEXT NOT NULL, body TEXT)";

#[derive(Debug, Clone)]
pub struct LoginsOptions {
    /// Clients, each with a user of its own.
    pub clients: usize,
    /// Syncs each client makes per round (after one first sync that is not counted).
    pub syncs_per_client: usize,
    /// Rounds of the two servers, alternated.
    pub rounds: usize,
}

/// One server's totals over its rounds.
#[derive(Debug, Clone, Copy)]
pub struct LoginsMeasurement {
    pub label: &'static str,
    pub syncs: u64,
    pub usage: CpuUsage,
}

impl LoginsMeasurement {
    pub fn syncs_per_second(&self) -> f64 {
        self.syncs as f64 / self.usage.wall_seconds.max(f64::EPSILON)
    }
}

pub async fn run(options: &LoginsOptions, out: &mut impl Write) -> Result<[LoginsMeasurement; 2]> {
    let dir = tempfile::tempdir().context("a temporary directory")?;
    let backend = consolidated(dir.path(), options.clients).await?;
    let servers = [
        ("password every sync", Duration::ZERO),
        ("session tokens", Duration::from_secs(3600)),
    ];
    let mut measured = servers.map(|(label, _)| LoginsMeasurement {
        label,
        syncs: 0,
        usage: CpuUsage::zero(false),
    });
    let mut running = Vec::new();
    for (_, lifetime) in servers {
        let config = ServerConfig {
            session_token_lifetime: lifetime,
            ..ServerConfig::default()
        };
        running.push(LocalServer::start(backend.clone(), config).await?);
    }
    let meter = Meter::without_database();
    let mut clients = Vec::new();
    for (index, server) in running.iter().enumerate() {
        let opened = open_clients(
            dir.path(),
            &format!("s{index}"),
            &server.address,
            options.clients,
        )?;
        // The first syncs (downloads, registration, the first token) are not counted.
        clients.push(sync_all(opened, 1).await?);
    }
    for _ in 0..options.rounds {
        for (index, entry) in measured.iter_mut().enumerate() {
            let before = meter.read(&[])?;
            let started = Instant::now();
            let round = std::mem::take(&mut clients[index]);
            clients[index] = sync_all(round, options.syncs_per_client).await?;
            let mut usage = meter.read(&[])?.since(&before);
            usage.wall_seconds = started.elapsed().as_secs_f64();
            entry.usage.add(&usage);
            entry.syncs += (options.clients * options.syncs_per_client) as u64;
        }
    }
    for server in running {
        server.stop().await?;
    }
    report(out, options, &measured)?;
    Ok(measured)
}

/// A consolidated database with `notes` (one owner per row) and `users` users.
async fn consolidated(dir: &Path, users: usize) -> Result<SqliteConsolidated> {
    let path = dir.join("consolidated.db");
    rusqlite::Connection::open(&path)?.execute_batch(TABLE_DDL)?;
    let backend = SqliteConsolidated::new(&path);
    let mut connection = backend.connect().await?;
    connection.install_system_tables().await?;
    connection
        .init_table(&TableInit::new("notes", "owner", "v1"))
        .await?;
    // One hash for every user: each login still checks it in full.
    let hash = rowsync_server::auth::hash_password(PASSWORD)
        .map_err(|error| anyhow::anyhow!("hashing the password: {error}"))?;
    for user in 0..users {
        connection.set_user(&user_name(user), &hash).await?;
    }
    Ok(backend)
}

fn user_name(index: usize) -> String {
    format!("user{index}")
}

struct BenchClient {
    client: Client,
    options: SyncOptions,
}

fn open_clients(dir: &Path, prefix: &str, address: &str, count: usize) -> Result<Vec<BenchClient>> {
    (0..count)
        .map(|index| {
            let mut client = Client::open(dir.join(format!("{prefix}-{index}.db")))?;
            client.connection().execute_batch(TABLE_DDL)?;
            client.track("notes")?;
            let options = SyncOptions::new(address.to_string(), user_name(index), PASSWORD);
            Ok(BenchClient { client, options })
        })
        .collect()
}

/// Every client makes `syncs` syncs, one after the other, all clients at once.
async fn sync_all(clients: Vec<BenchClient>, syncs: usize) -> Result<Vec<BenchClient>> {
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut bench| {
            tokio::spawn(async move {
                for _ in 0..syncs {
                    bench.client.sync(&bench.options).await?;
                }
                anyhow::Ok(bench)
            })
        })
        .collect();
    let mut done = Vec::with_capacity(tasks.len());
    for task in tasks {
        done.push(task.await??);
    }
    Ok(done)
}

fn report(
    out: &mut impl Write,
    options: &LoginsOptions,
    measured: &[LoginsMeasurement; 2],
) -> Result<()> {
    writeln!(
        out,
        "{} clients syncing by password at once, {} syncs each per round, {} round(s) per server, alternated",
        options.clients, options.syncs_per_client, options.rounds
    )?;
    writeln!(
        out,
        "{:<22} {:>8} {:>9} {:>10} {:>14}",
        "", "syncs", "wall s", "syncs/s", "CPU ms/sync"
    )?;
    for entry in measured {
        if entry.syncs == 0 {
            bail!("no syncs measured");
        }
        writeln!(
            out,
            "{:<22} {:>8} {:>9.2} {:>10.1} {:>14.2}",
            entry.label,
            entry.syncs,
            entry.usage.wall_seconds,
            entry.syncs_per_second(),
            1000.0 * entry.usage.bench_seconds / entry.syncs as f64
        )?;
    }
    let (old, new) = (&measured[0], &measured[1]);
    writeln!(
        out,
        "session tokens against a password check every sync: {:.1}x the syncs per second, {:.1}x less CPU per sync (server and clients, one process)",
        new.syncs_per_second() / old.syncs_per_second(),
        old.usage.bench_seconds / new.usage.bench_seconds.max(f64::EPSILON)
    )?;
    Ok(())
}
