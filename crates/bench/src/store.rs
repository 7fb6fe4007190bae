//! `rowsync-bench store`: the Berkeley DB 11gR2 performance overview's study, run on
//! rowsync's client store (docs/benchmarks.md, "bench-store").
//!
//! The key-value workload ([`kv`]): 64-byte keys and values, records written as batches
//! of [`BATCH_RECORDS`] consecutive keys (one transaction each), then random batches
//! fetched, updated, every batch deleted and the whole set inserted again, each phase
//! timed from its first operation to its last. It runs in each durability mode, on a
//! table that rowsync tracks and on one it does not (the price of change tracking), at
//! several thread counts; after each phase of a single-threaded tracked run the client
//! syncs with a server in this process (the upload that phase produced, timed). The
//! TPC-B-like transaction ([`tpcb`]) runs in each mode at its thread counts. [`report`]
//! prints the tables beside the seed's published figures ([`seed`]) and draws a plot
//! per table.

pub mod kv;
pub mod report;
pub mod seed;
pub mod tpcb;
mod upload;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rowsync_client::{Client, ClientOptions, Durability};
use serde::Serialize;

/// Consecutive keys per batch, as in the seed.
pub const BATCH_RECORDS: usize = 10;
/// Where a RAM disk (tmpfs) is looked for, for the seed's RAMDISK row.
pub const RAM_DISK_DIRECTORY: &str = "/dev/shm";

/// How much to run.
#[derive(Debug, Clone, Serialize)]
pub struct StoreSize {
    pub name: String,
    /// Records of the key-value workload (a multiple of [`BATCH_RECORDS`]).
    pub records: usize,
    /// Thread counts of the key-value workload.
    pub threads: Vec<usize>,
    pub tpcb_threads: Vec<usize>,
    pub tpcb_scale: tpcb::Scale,
    /// TPC-B-like transactions per point, shared among its threads.
    pub tpcb_transactions: usize,
    /// Runs per point (the tables give the mean and the standard deviation).
    pub repeat: usize,
}

impl StoreSize {
    /// CI: every mode, table, phase and a second thread, in seconds.
    pub fn quick() -> StoreSize {
        StoreSize {
            name: "quick".into(),
            records: 2_000,
            threads: vec![1, 2],
            tpcb_threads: vec![1, 2],
            tpcb_scale: tpcb::Scale {
                branches: 10,
                tellers: 100,
                accounts: 1_000,
            },
            tpcb_transactions: 200,
            repeat: 1,
        }
    }

    /// The seed's sizes: 576,000 records, threads 1-16, TPC-B at 1,000 branches.
    pub fn full() -> StoreSize {
        StoreSize {
            name: "full".into(),
            records: 576_000,
            threads: vec![1, 2, 3, 4, 8, 12, 16],
            tpcb_threads: vec![1, 2, 3, 4, 5, 10],
            tpcb_scale: tpcb::Scale {
                branches: 1_000,
                tellers: 10_000,
                accounts: 100_000,
            },
            tpcb_transactions: 20_000,
            repeat: 1,
        }
    }

    pub fn parse(name: &str) -> Result<StoreSize> {
        match name {
            "quick" => Ok(StoreSize::quick()),
            "full" => Ok(StoreSize::full()),
            other => bail!("unknown size {other:?}: quick or full"),
        }
    }

    pub fn check(&self) -> Result<()> {
        if self.records == 0 || !self.records.is_multiple_of(BATCH_RECORDS) {
            bail!("records must be a positive multiple of {BATCH_RECORDS}");
        }
        if self.repeat == 0 || self.tpcb_transactions == 0 {
            bail!("repeat and TPC-B transactions must be at least 1");
        }
        if self
            .threads
            .iter()
            .chain(&self.tpcb_threads)
            .any(|&t| t == 0)
        {
            bail!("thread counts must be at least 1");
        }
        Ok(())
    }
}

/// A store configuration measured: a durability mode, on disk or on a RAM disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mode {
    #[serde(serialize_with = "serialize_durability")]
    pub durability: Durability,
    pub ram_disk: bool,
}

fn serialize_durability<S: serde::Serializer>(d: &Durability, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(d.name())
}

impl Mode {
    /// The four modes on disk, then full on a RAM disk when there is one.
    pub fn all() -> Vec<Mode> {
        let mut modes: Vec<Mode> = Durability::ALL
            .into_iter()
            .map(|durability| Mode {
                durability,
                ram_disk: false,
            })
            .collect();
        if Path::new(RAM_DISK_DIRECTORY).is_dir() {
            modes.push(Mode {
                durability: Durability::Full,
                ram_disk: true,
            });
        }
        modes
    }

    pub fn label(&self) -> String {
        match self.ram_disk {
            true => format!("{} (RAM disk)", self.durability.name()),
            false => self.durability.name().to_string(),
        }
    }

    /// One connection reaches an in-memory database: it runs single-threaded.
    pub fn threads_allowed(&self, threads: usize) -> bool {
        threads == 1 || self.durability != Durability::Memory
    }

    /// A fresh directory for this mode's database files.
    pub fn directory(&self, base: &Path) -> Result<tempfile::TempDir> {
        let parent = if self.ram_disk {
            PathBuf::from(RAM_DISK_DIRECTORY)
        } else {
            base.to_path_buf()
        };
        tempfile::Builder::new()
            .prefix("rowsync-bench-store-")
            .tempdir_in(&parent)
            .with_context(|| format!("creating a directory in {}", parent.display()))
    }

    pub fn open(&self, path: &Path) -> Result<Client> {
        Client::open_with(path, &ClientOptions::new(self.durability))
            .with_context(|| format!("opening {} in mode {}", path.display(), self.label()))
    }

    /// Another connection to a file mode's database, with the mode's settings.
    pub fn connect(&self, path: &Path) -> Result<rusqlite::Connection> {
        let connection = rusqlite::Connection::open(path)?;
        connection.busy_timeout(BUSY_TIMEOUT)?;
        connection.pragma_update(None, "synchronous", self.durability.synchronous())?;
        Ok(connection)
    }
}

/// How long a writer waits for another thread's transaction.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// What to run and where.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub size: StoreSize,
    pub modes: Vec<Mode>,
    /// Where the databases of the modes on disk go.
    pub directory: PathBuf,
    /// Where results.json, the tables and the plots go; `None` writes none.
    pub results: Option<PathBuf>,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct StoreResults {
    pub size: StoreSize,
    pub kv: Vec<kv::KvPoint>,
    pub tpcb: Vec<tpcb::TpcbPoint>,
}

/// Runs the study and prints its tables to `out`.
pub async fn run(options: &StoreOptions, out: &mut dyn std::io::Write) -> Result<StoreResults> {
    options.size.check()?;
    let mut results = StoreResults {
        size: options.size.clone(),
        kv: Vec::new(),
        tpcb: Vec::new(),
    };
    for mode in &options.modes {
        for tracked in [false, true] {
            results
                .kv
                .extend(kv::run_mode(options, *mode, tracked).await?);
            results
                .tpcb
                .extend(tpcb::run_mode(options, *mode, tracked).await?);
        }
    }
    let text = report::tables(&results);
    out.write_all(text.as_bytes())?;
    if let Some(directory) = &options.results {
        report::write(directory, &results, &text)?;
        writeln!(out, "results written to {}", directory.display())?;
    }
    Ok(results)
}

/// Mean and standard deviation (population) of `values`.
pub fn mean_and_deviation(values: &[f64]) -> (f64, f64) {
    let count = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / count;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / count;
    (mean, variance.sqrt())
}
