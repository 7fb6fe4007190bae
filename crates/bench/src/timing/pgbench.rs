//! The reference for empty syncs: `pgbench`'s transactions per second for one
//! single-row `UPDATE` by primary key, over as many connections as the server has
//! database workers, measured in the same run. An empty sync is a handful of such
//! statements in one transaction, so its rate is judged against this one (issue goal:
//! at least half of it).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{bail, Context, Result};
use tokio_postgres::Client;

/// Rows of the table the reference updates at random.
pub const PGBENCH_ROWS: i64 = 100_000;

/// The reference's table, dropped and recreated by every run.
pub const PGBENCH_TABLE: &str = "bench_pgbench";

/// What `pgbench` measured.
#[derive(Debug, Clone, Copy)]
pub struct PgbenchReference {
    pub connections: usize,
    pub seconds: u32,
    pub transactions_per_second: f64,
}

/// Runs `pgbench` for `seconds` with `connections` clients, each transaction one
/// `UPDATE` of a random row of [`PGBENCH_TABLE`].
pub async fn single_row_update(
    admin: &Client,
    url: &str,
    connections: usize,
    seconds: u32,
    work_dir: &Path,
) -> Result<PgbenchReference> {
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {PGBENCH_TABLE};
             CREATE TABLE {PGBENCH_TABLE} (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0);
             INSERT INTO {PGBENCH_TABLE} (id) SELECT generate_series(1, {PGBENCH_ROWS});
             ANALYZE {PGBENCH_TABLE};"
        ))
        .await?;
    let script = work_dir.join("single-row-update.sql");
    std::fs::write(
        &script,
        format!(
            "\\set id random(1, {PGBENCH_ROWS})\nUPDATE {PGBENCH_TABLE} SET v = v + 1 WHERE id = :id;\n"
        ),
    )?;
    let program = pgbench_program();
    let output = tokio::process::Command::new(&program)
        .args(["--no-vacuum", "--protocol=prepared"])
        .arg(format!("--client={connections}"))
        .arg(format!("--jobs={connections}"))
        .arg(format!("--time={seconds}"))
        .arg("--file")
        .arg(&script)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {} (install postgresql-15)", program.display()))?;
    if !output.status.success() {
        bail!(
            "pgbench failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ok(PgbenchReference {
        connections,
        seconds,
        transactions_per_second: parse_tps(&stdout)?,
    })
}

/// `pgbench` next to the PostgreSQL server programs (`ROWSYNC_PG_BINDIR`, Debian's
/// versioned directory), else from `PATH`.
fn pgbench_program() -> PathBuf {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(dir) = std::env::var("ROWSYNC_PG_BINDIR") {
        candidates.push(PathBuf::from(dir).join("pgbench"));
    }
    for version in ["17", "16", "15", "14"] {
        candidates.push(PathBuf::from(format!(
            "/usr/lib/postgresql/{version}/bin/pgbench"
        )));
    }
    candidates
        .into_iter()
        .find(|path| path.exists())
        .unwrap_or_else(|| PathBuf::from("pgbench"))
}

/// The rate from `pgbench`'s summary: `tps = 1234.5 (without initial connection time)`.
fn parse_tps(summary: &str) -> Result<f64> {
    summary
        .lines()
        .filter_map(|line| line.trim().strip_prefix("tps = "))
        .filter_map(|rest| rest.split_whitespace().next())
        .find_map(|number| number.parse::<f64>().ok())
        .with_context(|| format!("no tps line in pgbench's output: {summary}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tps_is_read_from_the_summary() {
        let summary = "transaction type: single-row-update.sql\nnumber of clients: 4\n\
                       latency average = 0.512 ms\n\
                       initial connection time = 6.213 ms\n\
                       tps = 7812.345678 (without initial connection time)\n";
        assert_eq!(parse_tps(summary).unwrap(), 7812.345678);
        assert!(parse_tps("pgbench: error: connection refused\n").is_err());
    }
}
