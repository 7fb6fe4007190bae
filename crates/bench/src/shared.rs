//! Shared rows read once (issue 34): many clients each doing a first sync of the same
//! `shared` table, with every sync reading it from PostgreSQL and with the rows read
//! once and served from `SharedDownloads`, side by side in one run, alternating, on the
//! consolidated layer itself (the syncs run in this process, as server workers would;
//! the wire is the same for both and left out). It reports wall time, this process's
//! CPU (the server's part), PostgreSQL's CPU and the ratios.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::rules::RuleSet;
use rowsync_consolidated::shared_download::SharedDownloads;
use rowsync_consolidated::{
    sync_and_collect_shared, Consolidated, ConsolidatedConnection, SyncRequest, TableInit,
};

use crate::timing::cpu::{CpuUsage, Meter};

/// How many clients, how many rows, how many syncs at once.
#[derive(Debug, Clone)]
pub struct SharedOptions {
    pub clients: usize,
    pub rows: usize,
    pub concurrency: usize,
    /// Rounds of the two configurations, alternated (the machine is shared and noisy).
    pub rounds: usize,
}

/// One configuration's totals over its rounds.
#[derive(Debug, Clone, Copy)]
pub struct SharedMeasurement {
    pub label: &'static str,
    pub usage: CpuUsage,
    pub database_reads: u64,
}

const TABLE_DDL: &str = "DROP TABLE IF EXISTS bench_film CASCADE;
CREATE TABLE bench_film (film_id integer PRIMARY KEY, title text NOT NULL,
    description text, rental_rate numeric(4,2) NOT NULL, length integer)";

pub async fn run(
    url: &str,
    options: &SharedOptions,
    out: &mut impl Write,
) -> Result<Vec<SharedMeasurement>> {
    let admin = crate::apply::connect(url).await?;
    admin.batch_execute(TABLE_DDL).await?;
    admin
        .execute(
            "INSERT INTO bench_film SELECT i, 'FILM ' || i, repeat('a story of ', 8) || i, \
             (i % 5) + 0.99, 60 + i % 120 FROM generate_series(1, $1::int) AS i",
            &[&i32::try_from(options.rows).context("--rows")?],
        )
        .await?;
    let backend = PostgresConsolidated::new(url);
    let mut connection = backend.connect().await?;
    connection.install_system_tables().await?;
    let rules = RuleSet::parse("[tables.bench_film]\nrule = \"shared\"\n")?;
    connection
        .init_rule_table(&TableInit::new("bench_film", "", "bench_shared"), &rules)
        .await?;
    let meter = Meter::new(&admin).await?;
    let mut measured = [
        SharedMeasurement {
            label: "read by every sync",
            usage: CpuUsage::zero(meter.measures_database()),
            database_reads: 0,
        },
        SharedMeasurement {
            label: "read once, served kept",
            usage: CpuUsage::zero(meter.measures_database()),
            database_reads: 0,
        },
    ];
    for round in 0..options.rounds {
        for (index, entry) in measured.iter_mut().enumerate() {
            let shared = (index == 1)
                .then(|| SharedDownloads::new(64 * 1024 * 1024, Duration::from_secs(10)));
            let before = meter.read(&[])?;
            let prefix = format!("r{round}c{index}");
            first_syncs(&backend, options, &prefix, shared.clone()).await?;
            entry.usage.add(&meter.read(&[])?.since(&before));
            entry.database_reads += match &shared {
                Some(shared) => shared.misses.load(std::sync::atomic::Ordering::Relaxed),
                None => 2 * options.clients as u64,
            };
        }
    }
    report(out, options, &measured)?;
    Ok(measured.to_vec())
}

/// `options.clients` first syncs, `options.concurrency` at once, each checked whole.
async fn first_syncs(
    backend: &PostgresConsolidated,
    options: &SharedOptions,
    prefix: &str,
    shared: Option<Arc<SharedDownloads>>,
) -> Result<()> {
    let per_task = options.clients.div_ceil(options.concurrency.max(1));
    let mut tasks = Vec::new();
    for task in 0..options.concurrency.max(1) {
        let (backend, shared, rows) = (backend.clone(), shared.clone(), options.rows);
        let count = per_task.min(options.clients.saturating_sub(task * per_task));
        let prefix = format!("{prefix}t{task}");
        tasks.push(tokio::spawn(async move {
            let mut connection = backend.connect().await?;
            for client in 0..count {
                let request = Arc::new(first_sync(&format!("{prefix}-{client}")));
                let outcome =
                    sync_and_collect_shared(&mut connection, request, shared.clone()).await?;
                let got: usize = outcome.downloads.iter().map(|d| d.upserts.len()).sum();
                if got != rows {
                    bail!("a first sync downloaded {got} rows of {rows}");
                }
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

fn first_sync(client_id: &str) -> SyncRequest {
    SyncRequest {
        client_id: client_id.into(),
        user: client_id.into(),
        script_version: "bench_shared".into(),
        last_download_watermark: 0,
        upload_sequence: 1,
        tables: Vec::new(),
        auth_parameters: Vec::new(),
        client_ids_per_user_max: None,
        transfer_id: None,
        check_identity: false,
        refused_rows_max: 0,
        key_ranges: None,
        sync_tables: Default::default(),
    }
}

fn report(
    out: &mut impl Write,
    options: &SharedOptions,
    measured: &[SharedMeasurement; 2],
) -> Result<()> {
    writeln!(
        out,
        "{} clients, each a first sync of the same {}-row shared table, {} at once, {} round(s) each, alternated",
        options.clients, options.rows, options.concurrency, options.rounds
    )?;
    writeln!(
        out,
        "{:<24} {:>9} {:>12} {:>14} {:>15}",
        "", "wall s", "server CPU s", "PostgreSQL CPU s", "cursors read"
    )?;
    for entry in measured {
        let database = entry
            .usage
            .database_seconds
            .map_or("n/a".to_string(), |s| format!("{s:.2}"));
        writeln!(
            out,
            "{:<24} {:>9.2} {:>12.2} {:>14} {:>15}",
            entry.label,
            entry.usage.wall_seconds,
            entry.usage.bench_seconds,
            database,
            entry.database_reads
        )?;
    }
    let (old, new) = (&measured[0].usage, &measured[1].usage);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let database_ratio = match (old.database_seconds, new.database_seconds) {
        (Some(a), Some(b)) => format!("{:.1}x", ratio(a, b)),
        _ => "n/a".into(),
    };
    writeln!(
        out,
        "read once against read by every sync: wall {:.1}x, server CPU {:.1}x, PostgreSQL CPU {database_ratio} less",
        ratio(old.wall_seconds, new.wall_seconds),
        ratio(old.bench_seconds, new.bench_seconds)
    )?;
    Ok(())
}
