//! The references for empty syncs, measured in the same run over as many connections
//! as the server has database workers: `pgbench`'s transactions per second for one
//! single-row `UPDATE` by primary key (issue goal: empty syncs at least half of it),
//! and for a transaction of an empty sync's own statements one after the other
//! ([`EMPTY_SYNC_SCRIPT`]). An empty sync is a handful of statements in one
//! transaction, each a round trip unless pipelined; on a machine where the clients,
//! the server, PostgreSQL and `pgbench` share the cores, the second reference is what
//! PostgreSQL alone does for the same work, the fair one for the sync's own cost.

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

/// An empty sync's statements on the bench's scripts, as `pgbench` runs them (each a
/// round trip, prepared): `BEGIN`, the client's lock, its subscription read,
/// `begin_synchronization`'s timing row, the delete cursor and the download cursor of
/// one table (each finding nothing), the subscription recorded,
/// `end_synchronization`'s timing row, `COMMIT`. Rows of [`PGBENCH_TABLE`] stand in
/// for the subscription and the timing row, a key no row has (`:none`) for the cursors.
pub const EMPTY_SYNC_SCRIPT: &str = "\\set id random(1, 100000)
\\set none :id + 100000
BEGIN;
SELECT pg_try_advisory_xact_lock(7262, :id);
SELECT v FROM bench_pgbench WHERE id = :id;
UPDATE bench_pgbench SET v = v + 1 WHERE id = :id;
SELECT id FROM bench_pgbench WHERE id = :none;
SELECT id, v FROM bench_pgbench WHERE id = :none;
UPDATE bench_pgbench SET v = v + 1 WHERE id = :id;
UPDATE bench_pgbench SET v = v + 1 WHERE id = :id;
COMMIT;
";

/// Runs `pgbench` for `seconds` with `connections` clients, each transaction one
/// `UPDATE` of a random row of [`PGBENCH_TABLE`] (made afresh here).
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
    let script = format!(
        "\\set id random(1, {PGBENCH_ROWS})\nUPDATE {PGBENCH_TABLE} SET v = v + 1 WHERE id = :id;\n"
    );
    run_script(
        url,
        connections,
        seconds,
        &work_dir.join("single-row-update.sql"),
        &script,
    )
    .await
}

/// Runs `pgbench` for `seconds` with `connections` clients, each transaction an empty
/// sync's statements ([`EMPTY_SYNC_SCRIPT`]); after [`single_row_update`], which makes
/// the table.
pub async fn empty_sync_statements(
    url: &str,
    connections: usize,
    seconds: u32,
    work_dir: &Path,
) -> Result<PgbenchReference> {
    let path = work_dir.join("empty-sync-statements.sql");
    run_script(url, connections, seconds, &path, EMPTY_SYNC_SCRIPT).await
}

async fn run_script(
    url: &str,
    connections: usize,
    seconds: u32,
    path: &Path,
    script: &str,
) -> Result<PgbenchReference> {
    std::fs::write(path, script)?;
    let program = pgbench_program();
    let output = tokio::process::Command::new(&program)
        .args(["--no-vacuum", "--protocol=prepared"])
        .arg(format!("--client={connections}"))
        .arg(format!("--jobs={connections}"))
        .arg(format!("--time={seconds}"))
        .arg("--file")
        .arg(path)
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

    #[test]
    fn the_empty_sync_script_draws_keys_of_the_table_and_runs_nine_statements() {
        assert!(EMPTY_SYNC_SCRIPT.contains(&format!("random(1, {PGBENCH_ROWS})")));
        assert!(EMPTY_SYNC_SCRIPT.contains(&format!("set none :id + {PGBENCH_ROWS}")));
        assert!(EMPTY_SYNC_SCRIPT.contains(PGBENCH_TABLE));
        assert_eq!(EMPTY_SYNC_SCRIPT.matches(";\n").count(), 9);
    }
}
