//! What one `rowsync-bench timing` run measured: every figure the report prints, as written
//! to `results.json`.

use serde::{Deserialize, Serialize};

pub use super::cpu::CpuUsage;

/// The four timed sync types, in the paper's order (download, update, delete, insert).
pub const SYNC_TYPES: [&str; 4] = ["download", "update", "delete", "insert"];

/// One sync type measured once at one test point (all its sets).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Phase {
    /// One of [`SYNC_TYPES`].
    pub sync_type: String,
    /// The paper's total server time: the sum over sets of (last server end - first
    /// server start), from the timestamps the server's scripts recorded.
    pub total_server_seconds: f64,
    /// Sum over sets of (last client end - first client start).
    pub total_client_seconds: f64,
    /// Client sync time (client end - client start) over every sync of the phase.
    pub client_seconds_median: f64,
    pub client_seconds_p99: f64,
    pub syncs: u64,
    /// Rows moved (uploaded operations, or downloaded rows).
    pub rows: u64,
    /// Bytes on the wire, both directions, every sync of the phase.
    pub wire_bytes: u64,
    /// Busy answers the clients retried.
    pub busy_retries: u64,
    /// CPU seconds (user + system) the server process used during the phase.
    pub server_cpu_seconds: f64,
    /// Whose CPU the phase's timed sets used, gate to gate (None in results written
    /// before it was measured).
    #[serde(default)]
    pub cpu: Option<CpuUsage>,
}

impl Phase {
    pub fn syncs_per_second(&self) -> f64 {
        self.syncs as f64 / self.total_server_seconds.max(f64::MIN_POSITIVE)
    }
    pub fn rows_per_second(&self) -> f64 {
        self.rows as f64 / self.total_server_seconds.max(f64::MIN_POSITIVE)
    }
    pub fn megabytes_per_second(&self) -> f64 {
        self.wire_bytes as f64 / 1e6 / self.total_server_seconds.max(f64::MIN_POSITIVE)
    }
}

/// One test point: the varied parameter at one value, run `runs.len()` times.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Point {
    /// The varied parameter's value as the first column prints it ("8", "auto 2-16",
    /// "TLS:ECC + zlib").
    pub label: String,
    /// The same value as a number, for plots with a numeric axis (None: categorical).
    pub x: Option<f64>,
    pub clients: usize,
    pub rows_per_sync: usize,
    pub sets: usize,
    /// Database workers: fixed count, or the controller's range.
    pub workers: String,
    pub connections_max: usize,
    /// "server hint" or a fixed delay in seconds.
    pub retry: String,
    pub transport: String,
    /// Each run's phases, in [`SYNC_TYPES`] order (a phase a test skips is absent).
    pub runs: Vec<Vec<Phase>>,
    /// The limit reference (PostgreSQL's bulk path, same rows, same concurrency):
    /// seconds per sync type in [`SYNC_TYPES`] order.
    pub limit_seconds: Option<[f64; 4]>,
    /// Whose CPU the limit used, per sync type, in the run whose time is in
    /// `limit_seconds` (None in results written before it was measured).
    #[serde(default)]
    pub limit_cpu: Option<[CpuUsage; 4]>,
    /// Peak resident memory of the server process over the point, in bytes (of every
    /// server, summed, in a farm).
    pub server_peak_rss_bytes: u64,
    /// Syncs each server behind HAProxy completed in the point's last run (Test 6);
    /// empty where the clients reach one server directly.
    #[serde(default)]
    pub syncs_per_server: Vec<u64>,
}

impl Point {
    /// The best (smallest) total server time over the runs, per sync type; None for a
    /// type not measured.
    pub fn best_seconds(&self) -> [Option<f64>; 4] {
        let mut best = [None; 4];
        for (slot, name) in best.iter_mut().zip(SYNC_TYPES) {
            *slot = self
                .runs
                .iter()
                .filter_map(|run| run.iter().find(|p| p.sync_type == name))
                .map(|p| p.total_server_seconds)
                .min_by(f64::total_cmp);
        }
        best
    }

    /// The run whose phase of `sync_type` had the best total server time.
    pub fn best_phase(&self, sync_type: &str) -> Option<&Phase> {
        self.runs
            .iter()
            .filter_map(|run| run.iter().find(|p| p.sync_type == sync_type))
            .min_by(|a, b| a.total_server_seconds.total_cmp(&b.total_server_seconds))
    }

    /// Relative standard deviation of the total server time over the runs, in percent,
    /// per sync type (None with fewer than two runs).
    pub fn rsd_percent(&self) -> [Option<f64>; 4] {
        let mut rsd = [None; 4];
        for (slot, name) in rsd.iter_mut().zip(SYNC_TYPES) {
            let times: Vec<f64> = self
                .runs
                .iter()
                .filter_map(|run| run.iter().find(|p| p.sync_type == name))
                .map(|p| p.total_server_seconds)
                .collect();
            if times.len() >= 2 {
                let n = times.len() as f64;
                let mean = times.iter().sum::<f64>() / n;
                let variance = times.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / (n - 1.0);
                *slot = Some(100.0 * variance.sqrt() / mean);
            }
        }
        rsd
    }

    /// Busy retries summed over the runs' phases of each sync type, from the best run.
    pub fn busy_retries(&self) -> [Option<u64>; 4] {
        let mut retries = [None; 4];
        for (slot, name) in retries.iter_mut().zip(SYNC_TYPES) {
            *slot = self.best_phase(name).map(|p| p.busy_retries);
        }
        retries
    }

    /// Efficiency per sync type: limit time / rowsync's best total server time.
    pub fn efficiency(&self) -> [Option<f64>; 4] {
        let best = self.best_seconds();
        let mut efficiency = [None; 4];
        if let Some(limit) = self.limit_seconds {
            for i in 0..4 {
                efficiency[i] = best[i].map(|b| limit[i] / b.max(f64::MIN_POSITIVE));
            }
        }
        efficiency
    }

    /// The fair second reference, per sync type: the limit's CPU (PostgreSQL and the
    /// process driving it) over rowsync's (the server and PostgreSQL) in the best run,
    /// the clients' CPU left out. None where either was not measured (PostgreSQL on
    /// another machine, or an older results file).
    pub fn cpu_efficiency(&self) -> [Option<f64>; 4] {
        let Some(limit) = self.limit_cpu else {
            return [None; 4];
        };
        std::array::from_fn(|i| {
            let limit = limit[i].limit_work_seconds()?;
            let rowsync = self.best_phase(SYNC_TYPES[i])?.cpu?.work_seconds()?;
            (limit > 0.0 && rowsync > 0.0).then(|| limit / rowsync)
        })
    }
}

/// One of the paper's five tests as run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TestResult {
    /// 1 to 5, the paper's numbering.
    pub test: u8,
    pub title: String,
    /// Header of the first column: the varied parameter ("DB workers", "Retry delay (s)").
    pub parameter: String,
    pub points: Vec<Point>,
    /// The row-script reference: the test's base point run through one-statement-per-row
    /// scripts (uploads only; the download cursor is one query in both models).
    pub row_scripts: Option<Point>,
    /// What did not run and why, and anything a reader must know.
    pub notes: Vec<String>,
}

/// A whole run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BenchRun {
    /// quick, standard or paper.
    pub size: String,
    /// sqlite or verify.
    pub client_mode: String,
    /// Bytes per row on rowsync's wire (uploaded insert, uncompressed).
    pub wire_bytes_per_row: f64,
    /// Local time the run started, RFC 3339.
    pub started: String,
    pub machine: String,
    pub tests: Vec<TestResult>,
}
