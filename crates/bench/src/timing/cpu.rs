//! Whose CPU a timed section used: the server process, PostgreSQL (every process of the
//! postmaster, when it runs on this machine), the bench's own process (the simulated
//! clients, or the limit's driver), and the machine as a whole.
//!
//! The wall-time efficiency puts rowsync, its clients and PostgreSQL on the same two
//! cores, while the limit runs with no clients at all. The CPU efficiency is the fair
//! second reference the issue asks for: what the limit's work cost the machine
//! (PostgreSQL plus the process driving it) over what a sync's work cost it (the server
//! plus PostgreSQL), the clients' own CPU left out as the paper left it on ten other
//! machines. Both are reported; neither replaces the other.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

/// Linux reports CPU time in clock ticks of `sysconf(_SC_CLK_TCK)`, 100 on every
/// mainstream architecture (the unit of `/proc/*/stat` and `/proc/stat` times).
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;
const NANOSECONDS_PER_SECOND: f64 = 1e9;

/// CPU seconds used during one timed section, by whom.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuUsage {
    /// The `rowsync serve` processes, and HAProxy in front of them where one runs (0 for
    /// the limit, which has no server).
    pub server_seconds: f64,
    /// Every PostgreSQL process (backends, background workers, postmaster); None when the
    /// database does not run on this machine.
    pub database_seconds: Option<f64>,
    /// The bench's own process: the simulated clients during a sync phase, the driver of
    /// the bulk statements during the limit.
    pub bench_seconds: f64,
    /// Every core of the machine: busy time (all but idle and iowait), summed.
    pub machine_busy_seconds: f64,
    /// Wall time of the section (as measured around it, gate to gate).
    pub wall_seconds: f64,
}

impl CpuUsage {
    /// The work's own CPU: the server's and the database's (None without the database).
    pub fn work_seconds(&self) -> Option<f64> {
        self.database_seconds.map(|db| db + self.server_seconds)
    }

    /// For the limit, whose driver plays the server's part: the database's CPU plus the
    /// driver's.
    pub fn limit_work_seconds(&self) -> Option<f64> {
        self.database_seconds.map(|db| db + self.bench_seconds)
    }

    pub fn add(&mut self, other: &CpuUsage) {
        self.server_seconds += other.server_seconds;
        self.database_seconds = match (self.database_seconds, other.database_seconds) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        self.bench_seconds += other.bench_seconds;
        self.machine_busy_seconds += other.machine_busy_seconds;
        self.wall_seconds += other.wall_seconds;
    }

    /// A sum to add sections to: zero, with the database measured.
    pub fn zero(database_measured: bool) -> CpuUsage {
        CpuUsage {
            database_seconds: database_measured.then_some(0.0),
            ..CpuUsage::default()
        }
    }
}

/// The CPU counters at one instant.
#[derive(Debug, Clone)]
pub struct Reading {
    at: std::time::Instant,
    server: f64,
    database: Option<Tree>,
    bench: f64,
    machine_busy: f64,
}

impl Reading {
    pub fn since(&self, earlier: &Reading) -> CpuUsage {
        CpuUsage {
            server_seconds: self.server - earlier.server,
            database_seconds: match (&self.database, &earlier.database) {
                (Some(now), Some(then)) => Some(now.since(then)),
                _ => None,
            },
            bench_seconds: self.bench - earlier.bench,
            machine_busy_seconds: self.machine_busy - earlier.machine_busy,
            wall_seconds: self.at.duration_since(earlier.at).as_secs_f64(),
        }
    }
}

/// A process and its children at one instant: its own time, its reaped children's
/// (from its stat, in ticks), and each living child's (see `living_child_seconds`).
#[derive(Debug, Clone, Default)]
struct Tree {
    own: f64,
    reaped: f64,
    living: HashMap<u32, f64>,
}

impl Tree {
    /// CPU used between `earlier` and now. A child that ended in between moved its
    /// whole life's time into `reaped`; what `earlier` had counted of it is taken off
    /// that, never below nothing (its ticks are coarser than its nanoseconds were).
    fn since(&self, earlier: &Tree) -> f64 {
        let mut seconds = self.own - earlier.own;
        let mut counted_of_ended = 0.0;
        for (pid, then) in &earlier.living {
            match self.living.get(pid) {
                Some(now) => seconds += (now - then).max(0.0),
                None => counted_of_ended += then,
            }
        }
        for (pid, now) in &self.living {
            if !earlier.living.contains_key(pid) {
                seconds += now;
            }
        }
        seconds + (self.reaped - earlier.reaped - counted_of_ended).max(0.0)
    }
}

/// Reads the counters; knows the postmaster when PostgreSQL runs here.
#[derive(Debug, Clone)]
pub struct Meter {
    postmaster: Option<u32>,
}

impl Meter {
    /// Finds the postmaster behind `admin`'s connection: the parent of its backend
    /// process, if the connection is local (a Unix socket or loopback) and that process
    /// is visible here as a PostgreSQL process. Otherwise database CPU is not measured.
    pub async fn new(admin: &Client) -> Result<Meter> {
        let row = admin
            .query_one(
                "SELECT pg_backend_pid(), COALESCE(host(inet_server_addr()), '')",
                &[],
            )
            .await?;
        let (backend, address): (i32, String) = (row.get(0), row.get(1));
        let local = address.is_empty() || address == "::1" || address.starts_with("127.");
        let postmaster = if local {
            postmaster_of(Path::new("/proc"), backend as u32)
        } else {
            None
        };
        Ok(Meter { postmaster })
    }

    /// A meter that measures no database (its CPU is then reported as not measured).
    pub fn without_database() -> Meter {
        Meter { postmaster: None }
    }

    pub fn measures_database(&self) -> bool {
        self.postmaster.is_some()
    }

    /// The counters now; `servers` are the serving processes' pids (none for the limit).
    pub fn read(&self, servers: &[u32]) -> Result<Reading> {
        let proc = Path::new("/proc");
        let mut server = 0.0;
        for &pid in servers {
            server += process_seconds(&read_stat(proc, pid)?)?;
        }
        let database = match self.postmaster {
            Some(pid) => Some(tree(proc, pid)?),
            None => None,
        };
        let bench = process_seconds(&read_stat(proc, std::process::id())?)?;
        let machine_busy = machine_busy_seconds(
            &std::fs::read_to_string(proc.join("stat")).context("reading /proc/stat")?,
        )?;
        Ok(Reading {
            at: std::time::Instant::now(),
            server,
            database,
            bench,
            machine_busy,
        })
    }
}

/// The parent of `backend`, if both are PostgreSQL processes visible under `proc`.
fn postmaster_of(proc: &Path, backend: u32) -> Option<u32> {
    // A backend's title ("postgres: user db …") or the postmaster's program path.
    let is_postgres = |pid: u32| {
        let Ok(cmdline) = std::fs::read(proc.join(pid.to_string()).join("cmdline")) else {
            return false;
        };
        let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let name = program.rsplit(|b| *b == b'/').next().unwrap_or_default();
        program.starts_with(b"postgres") || name == b"postgres" || name == b"postmaster"
    };
    let stat = read_stat(proc, backend).ok()?;
    let parent = stat_fields(&stat).ok()?.get(1)?.parse().ok()?;
    (is_postgres(backend) && is_postgres(parent)).then_some(parent)
}

fn read_stat(proc: &Path, pid: u32) -> Result<String> {
    std::fs::read_to_string(proc.join(pid.to_string()).join("stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))
}

/// The fields of a `/proc/<pid>/stat` line after the command name (which is in
/// parentheses and may hold spaces): index 0 is the state, 1 the parent, 11 and 12
/// utime and stime, 13 and 14 the reaped children's cutime and cstime.
fn stat_fields(stat: &str) -> Result<Vec<&str>> {
    let (_, after) = stat
        .rsplit_once(')')
        .context("a /proc stat line without its command name")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    if fields.len() < 15 {
        bail!("a /proc stat line of {} fields", fields.len());
    }
    Ok(fields)
}

fn ticks(fields: &[&str], range: std::ops::Range<usize>) -> Result<f64> {
    let mut sum = 0.0;
    for field in &fields[range] {
        sum += field
            .parse::<u64>()
            .with_context(|| format!("a /proc stat time that is not a number: {field:?}"))?
            as f64;
    }
    Ok(sum / CLOCK_TICKS_PER_SECOND)
}

/// utime + stime of a process (all its threads), in seconds.
fn process_seconds(stat: &str) -> Result<f64> {
    ticks(&stat_fields(stat)?, 11..13)
}

/// A process and its living children (see [`Tree`]).
fn tree(proc: &Path, root: u32) -> Result<Tree> {
    let stat = read_stat(proc, root)?;
    let fields = stat_fields(&stat)?;
    let mut tree = Tree {
        own: ticks(&fields, 11..13)?,
        reaped: ticks(&fields, 13..15)?,
        living: HashMap::new(),
    };
    for (pid, stat) in children(proc, root)? {
        if let Ok(seconds) = living_child_seconds(proc, pid, &stat) {
            tree.living.insert(pid, seconds);
        }
    }
    Ok(tree)
}

/// A child's CPU: from `schedstat`, in nanoseconds, for a single-threaded child such
/// as PostgreSQL's; else its stat's ticks.
fn living_child_seconds(proc: &Path, pid: u32, stat: &str) -> Result<f64> {
    let dir = proc.join(pid.to_string());
    let threads = std::fs::read_dir(dir.join("task"))?.count();
    if threads == 1 {
        if let Ok(schedstat) = std::fs::read_to_string(dir.join("schedstat")) {
            if let Some(Ok(nanoseconds)) =
                schedstat.split_whitespace().next().map(str::parse::<u64>)
            {
                return Ok(nanoseconds as f64 / NANOSECONDS_PER_SECOND);
            }
        }
    }
    process_seconds(stat)
}

/// The processes under `proc` whose parent is `root`, each with its stat line. A
/// process that ends while this reads is left out.
fn children(proc: &Path, root: u32) -> Result<Vec<(u32, String)>> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir(proc).context("listing /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = read_stat(proc, pid) else {
            continue;
        };
        let parent = stat_fields(&stat)
            .ok()
            .and_then(|f| f.get(1).and_then(|p| p.parse::<u32>().ok()));
        if parent == Some(root) {
            children.push((pid, stat));
        }
    }
    Ok(children)
}

/// Busy seconds over every core since boot, from `/proc/stat`'s first line (user, nice,
/// system, idle, iowait, irq, softirq, steal, ...): everything but idle and iowait.
/// Steal is time another guest had, not this machine's work, so it is left out too.
fn machine_busy_seconds(stat: &str) -> Result<f64> {
    let line = stat
        .lines()
        .find(|line| line.starts_with("cpu "))
        .context("no cpu line in /proc/stat")?;
    let values = line
        .split_whitespace()
        .skip(1)
        .map(|v| {
            v.parse::<u64>()
                .with_context(|| format!("a /proc/stat value {v:?}"))
        })
        .collect::<Result<Vec<u64>>>()?;
    if values.len() < 8 {
        bail!("a /proc/stat cpu line of {} values", values.len());
    }
    let busy = values[0] + values[1] + values[2] + values[5] + values[6];
    Ok(busy as f64 / CLOCK_TICKS_PER_SECOND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_spaces_in_its_name_gives_its_times() {
        let stat = "42 (rowsync (serve) x) S 7 42 42 0 -1 4194560 1 0 0 0 250 50 30 20 20 0 9 0";
        assert_eq!(stat_fields(stat).unwrap()[1], "7");
        assert!((process_seconds(stat).unwrap() - 3.0).abs() < 1e-9);
        assert!(process_seconds("42 (x) S 7").is_err());
    }

    #[test]
    fn machine_busy_leaves_out_idle_iowait_and_steal() {
        let stat = "cpu  100 200 300 4000 500 60 70 800 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        // user 100 + nice 200 + system 300 + irq 60 + softirq 70 = 730 ticks.
        assert!((machine_busy_seconds(stat).unwrap() - 7.3).abs() < 1e-9);
        assert!(machine_busy_seconds("cpu0 1 2 3\n").is_err());
    }

    #[test]
    fn a_process_tree_counts_reaped_and_living_children_once() {
        let proc = tempfile::tempdir().unwrap();
        let write = |pid: u32, stat: &str, schedstat: Option<&str>| {
            let dir = proc.path().join(pid.to_string());
            std::fs::create_dir_all(dir.join("task").join(pid.to_string())).unwrap();
            std::fs::write(dir.join("stat"), stat).unwrap();
            if let Some(s) = schedstat {
                std::fs::write(dir.join("schedstat"), s).unwrap();
            }
        };
        // The root: 1 s of its own, 2 s of reaped children (cutime + cstime).
        write(10, "10 (postgres) S 1 0 0 0 0 0 0 0 0 0 60 40 150 50", None);
        // A living child: 0.5 s by schedstat (its stat's ticks are ignored).
        write(
            11,
            "11 (postgres) S 10 0 0 0 0 0 0 0 0 0 99 99 0 0",
            Some("500000000 7 3\n"),
        );
        // A living child without schedstat: 0.25 s from its stat.
        write(12, "12 (postgres) S 10 0 0 0 0 0 0 0 0 0 20 5 0 0", None);
        // Not a child.
        write(
            13,
            "13 (other) S 1 0 0 0 0 0 0 0 0 0 700 0 0 0",
            Some("9000000000 0 0\n"),
        );
        let before = tree(proc.path(), 10).unwrap();
        assert!((before.own - 1.0).abs() < 1e-9 && (before.reaped - 2.0).abs() < 1e-9);
        assert_eq!(before.living.len(), 2, "{before:?}");
        assert!((before.living[&11] - 0.5).abs() < 1e-9);
        assert!((before.living[&12] - 0.25).abs() < 1e-9);

        // Then 11 ran 0.2 s more and ended: its whole 0.7 s moved into the root's
        // reaped time (in ticks). 12 ran 0.1 s more; 14 started and ran 0.05 s.
        std::fs::remove_dir_all(proc.path().join("11")).unwrap();
        write(10, "10 (postgres) S 1 0 0 0 0 0 0 0 0 0 60 40 220 50", None);
        write(12, "12 (postgres) S 10 0 0 0 0 0 0 0 0 0 30 5 0 0", None);
        write(
            14,
            "14 (postgres) S 10 0 0 0 0 0 0 0 0 0 0 0 0 0",
            Some("50000000 0 0\n"),
        );
        let after = tree(proc.path(), 10).unwrap();
        let used = after.since(&before);
        assert!((used - 0.35).abs() < 1e-9, "0.2 + 0.1 + 0.05, not {used}");

        // A child whose ticks, when it ended, came to less than the nanoseconds counted
        // of it earlier: the difference is not taken off the other processes' time.
        let mut coarse = before.clone();
        coarse.living.insert(11, 0.705);
        let used = after.since(&coarse);
        assert!(
            (used - 0.15).abs() < 1e-9,
            "never below the others, not {used}"
        );
    }

    #[test]
    fn this_process_uses_cpu_that_the_meter_sees() {
        let meter = Meter::without_database();
        let before = meter.read(&[]).unwrap();
        // Spins until the meter sees 0.3 s of this process's CPU (on a busy machine
        // that takes longer than 0.3 s of wall time), or gives up after 30 s.
        let mut x = 0u64;
        let start = std::time::Instant::now();
        let usage = loop {
            for _ in 0..1_000_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            let usage = meter.read(&[]).unwrap().since(&before);
            if usage.bench_seconds >= 0.3 || start.elapsed().as_secs() >= 30 {
                break usage;
            }
        };
        std::hint::black_box(x);
        assert!(usage.bench_seconds >= 0.3, "{usage:?}");
        assert!(
            usage.machine_busy_seconds >= usage.bench_seconds - 0.05,
            "{usage:?}"
        );
        assert_eq!(usage.database_seconds, None);
        // Not compared with the CPU: the test harness's other threads count in this
        // process's CPU too.
        assert!(usage.wall_seconds > 0.0, "{usage:?}");
    }
}
