//! The benchmark commands, `timing`, `apply`, `load`, `transport`, `store` and `link`:
//! their arguments, handed to this crate's library.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rowsync_bench::link::LinkOptions;
use rowsync_bench::store::{self, Mode, StoreOptions, StoreSize};
use rowsync_bench::timing::clients::{ClientMode, Retry};
use rowsync_bench::timing::server::{Protocol, Workers};
use rowsync_bench::timing::{self, BenchOptions, Size};
use rowsync_bench::{apply, link, link_database, load, logins, shared, transport};
use rowsync_cli::database::Database;

#[derive(clap::Args)]
pub struct TimingArgs {
    /// A postgres:// URL of a scratch database.
    #[arg(long)]
    db: String,
    /// quick (CI, under a minute), standard (1,000 clients x 1,000 rows) or paper
    /// (the paper's sizes: 10 million rows per sync type).
    #[arg(long, default_value = "quick")]
    size: String,
    /// Which tests to run, comma-separated: the paper's 1 to 5, and 6, a farm of
    /// servers behind HAProxy against one server (needs haproxy).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5")]
    tests: Vec<u8>,
    /// verify (decode and checksum, no local store) or sqlite (real clients, each
    /// with its own SQLite file).
    #[arg(long, default_value = "verify")]
    client_mode: String,
    /// Directory for results.json, report.txt, test*.txt and test*.svg.
    #[arg(long, default_value = "bench-results")]
    results: PathBuf,
    /// Clients per point (where the test does not vary it).
    #[arg(long)]
    clients: Option<usize>,
    /// Rows per sync (where the test does not vary it).
    #[arg(long)]
    rows: Option<usize>,
    /// Sets of simultaneous syncs per sync type (where the test does not vary it).
    #[arg(long)]
    sets: Option<usize>,
    /// Database workers: a count (8) or the controller's range (2-16).
    #[arg(long)]
    workers: Option<String>,
    /// The server's connection limit (Test 2: the low limit).
    #[arg(long)]
    connection_limit: Option<usize>,
    /// Busy clients retry after this fixed delay instead of the server's hint.
    #[arg(long)]
    retry_delay_ms: Option<u64>,
    /// tcp, tls-ecc, tls-rsa, http, https-ecc or https-rsa.
    #[arg(long)]
    transport: Option<String>,
    /// none, zlib or zstd.
    #[arg(long)]
    compression: Option<String>,
    /// Runs per point of Test 1 (best and relative standard deviation).
    #[arg(long)]
    repeat: Option<usize>,
    /// The server under test, run as `PROGRAM serve` (default: the `rowsync` binary
    /// beside this one, which `cargo build --release --bin rowsync` makes).
    #[arg(long)]
    server_program: Option<PathBuf>,
    /// Test 6: how many servers the farm runs behind HAProxy.
    #[arg(long)]
    farm_servers: Option<usize>,
}

#[derive(clap::Args)]
pub struct ApplyArgs {
    /// A postgres:// URL of a scratch database.
    #[arg(long)]
    db: String,
    /// Rows each sync type moves (each upload, and the download).
    #[arg(long, default_value_t = 1_000_000)]
    rows: usize,
}

#[derive(clap::Args)]
pub struct SharedArgs {
    /// A postgres:// URL of a scratch database.
    #[arg(long)]
    db: String,
    /// Clients, each doing one first sync.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Rows of the shared table.
    #[arg(long, default_value_t = 10_000)]
    rows: usize,
    /// Syncs at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Rounds of each configuration, alternated.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
}

pub async fn run_shared(args: SharedArgs) -> Result<()> {
    if !is_postgres(&args.db) {
        bail!("shared measures PostgreSQL: give --db postgres://...");
    }
    let options = shared::SharedOptions {
        clients: args.clients,
        rows: args.rows,
        concurrency: args.concurrency,
        rounds: args.rounds,
    };
    shared::run(&args.db, &options, &mut std::io::stdout()).await?;
    Ok(())
}

#[derive(clap::Args)]
pub struct LoginsArgs {
    /// Clients, each with a user of its own, syncing at once.
    #[arg(long, default_value_t = 100)]
    clients: usize,
    /// Syncs each client makes per round.
    #[arg(long, default_value_t = 5)]
    syncs_per_client: usize,
    /// Rounds of each server, alternated.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
}

pub async fn run_logins(args: LoginsArgs) -> Result<()> {
    let options = logins::LoginsOptions {
        clients: args.clients,
        syncs_per_client: args.syncs_per_client,
        rounds: args.rounds,
    };
    logins::run(&options, &mut std::io::stdout()).await?;
    Ok(())
}

#[derive(clap::Args)]
pub struct LoadArgs {
    /// A postgres:// URL of a scratch database.
    #[arg(long)]
    db: String,
    /// Clients syncing at once.
    #[arg(long, default_value_t = 400)]
    clients: usize,
    /// Rows each client uploads.
    #[arg(long, default_value_t = 1000)]
    rows_per_client: usize,
    /// Runs of each configuration (the best is reported, with the spread).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Fixed worker counts to compare, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    fixed_workers: Vec<usize>,
    /// The fewest workers the controller may choose.
    #[arg(long, default_value_t = 1)]
    workers_min: usize,
    /// The most workers the controller may choose.
    #[arg(long, default_value_t = 32)]
    workers_max: usize,
    /// The connection limit for the above-the-limit comparison.
    #[arg(long, default_value_t = 50)]
    connections_low: usize,
}

#[derive(clap::Args)]
pub struct TransportArgs {
    /// Rows per sync.
    #[arg(long, default_value_t = 1000)]
    rows: usize,
    /// Times each workload runs per combination (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
}

fn is_postgres(db: &str) -> bool {
    matches!(Database::parse(db), Ok(Database::Postgres(_)))
}

/// `--server-program`, else the `rowsync` binary in this binary's directory.
fn server_program(named: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(program) = named {
        return Ok(program);
    }
    let this = std::env::current_exe().context("locating the rowsync-bench executable")?;
    let program = this.with_file_name(format!("rowsync{}", std::env::consts::EXE_SUFFIX));
    if !program.is_file() {
        bail!(
            "{} not found: build it (`cargo build --release --bin rowsync`) or give --server-program",
            program.display()
        );
    }
    Ok(program)
}

/// `rowsync-bench timing`: the server under test is the `rowsync` binary, run as
/// `rowsync serve`.
pub async fn run_timing(args: TimingArgs) -> Result<()> {
    if !is_postgres(&args.db) {
        bail!("timing measures PostgreSQL (and its own bulk path beside rowsync): give --db postgres://...");
    }
    let workers = args
        .workers
        .map(|text| -> Result<Workers> {
            Ok(match text.split_once('-') {
                Some((min, max)) => Workers::Auto(min.trim().parse()?, max.trim().parse()?),
                None => Workers::Fixed(text.trim().parse()?),
            })
        })
        .transpose()
        .context("--workers takes a count (8) or a range (2-16)")?;
    let options = BenchOptions {
        db: args.db,
        server_program: server_program(args.server_program)?,
        size: Size::parse(&args.size)?,
        tests: args.tests,
        client_mode: match args.client_mode.as_str() {
            "verify" => ClientMode::Verify,
            "sqlite" => ClientMode::Sqlite,
            other => bail!("unknown client mode {other:?}: verify or sqlite"),
        },
        results_dir: args.results,
        clients: args.clients,
        rows: args.rows,
        sets: args.sets,
        workers,
        connections_max: args.connection_limit,
        retry: args
            .retry_delay_ms
            .map(|ms| Retry::Fixed(Duration::from_millis(ms))),
        protocol: args.transport.as_deref().map(Protocol::parse).transpose()?,
        compression: args
            .compression
            .as_deref()
            .map(parse_compression)
            .transpose()?,
        repeat: args.repeat,
        farm_servers: args.farm_servers,
    };
    timing::run(options, &mut std::io::stdout()).await?;
    Ok(())
}

fn parse_compression(text: &str) -> Result<rowsync_protocol::Compression> {
    Ok(match text {
        "none" => rowsync_protocol::Compression::None,
        "zlib" => rowsync_protocol::Compression::Zlib,
        "zstd" => rowsync_protocol::Compression::Zstd,
        other => bail!("unknown compression {other:?}: none, zlib or zstd"),
    })
}

pub async fn run_apply(args: ApplyArgs) -> Result<()> {
    if !is_postgres(&args.db) {
        bail!("apply measures PostgreSQL: give --db postgres://...");
    }
    apply::run(&args.db, args.rows, &mut std::io::stdout()).await?;
    Ok(())
}

pub async fn run_load(args: LoadArgs) -> Result<()> {
    if !is_postgres(&args.db) {
        bail!("load measures PostgreSQL: give --db postgres://...");
    }
    let options = load::LoadOptions {
        clients: args.clients,
        rows_per_client: args.rows_per_client,
        runs: args.runs,
        fixed_workers: args.fixed_workers,
        workers_range: (args.workers_min, args.workers_max),
        connections_low: args.connections_low,
    };
    load::run(&args.db, &options, &mut std::io::stdout()).await?;
    Ok(())
}

pub async fn run_transport(args: TransportArgs) -> Result<()> {
    if args.rows == 0 || args.repeat == 0 {
        bail!("--rows and --repeat must be at least 1");
    }
    transport::run(args.rows, args.repeat, &mut std::io::stdout()).await?;
    Ok(())
}

#[derive(clap::Args)]
pub struct StoreArgs {
    /// quick (CI: 2,000 records, threads 1-2, a small TPC-B) or full (the seed's sizes:
    /// 576,000 records, threads 1-16, TPC-B at 1,000 branches).
    #[arg(long, default_value = "quick")]
    size: String,
    /// Durability modes, comma-separated: full, normal, off, memory, ramdisk (full on
    /// /dev/shm). Default: all there are.
    #[arg(long, value_delimiter = ',')]
    modes: Vec<String>,
    /// Records of the key-value workload (a multiple of 10), instead of the size's.
    #[arg(long)]
    records: Option<usize>,
    /// Thread counts of the key-value workload, instead of the size's.
    #[arg(long, value_delimiter = ',')]
    threads: Vec<usize>,
    /// Thread counts of the TPC-B-like transaction, instead of the size's.
    #[arg(long, value_delimiter = ',')]
    tpcb_threads: Vec<usize>,
    /// TPC-B-like transactions per point, instead of the size's.
    #[arg(long)]
    tpcb_transactions: Option<usize>,
    /// Runs per point (mean and standard deviation).
    #[arg(long)]
    repeat: Option<usize>,
    /// Where the databases of the modes on disk are made.
    #[arg(long, default_value = ".")]
    directory: PathBuf,
    /// Directory for results.json, report.txt and the plots.
    #[arg(long, default_value = "bench-store-results")]
    results: PathBuf,
}

fn parse_mode(name: &str) -> Result<Mode> {
    Ok(match name {
        "ramdisk" => Mode {
            durability: rowsync_client::Durability::Full,
            ram_disk: true,
        },
        other => Mode {
            durability: rowsync_client::Durability::parse(other)?,
            ram_disk: false,
        },
    })
}

pub async fn run_store(args: StoreArgs) -> Result<()> {
    let mut size = StoreSize::parse(&args.size)?;
    size.records = args.records.unwrap_or(size.records);
    size.tpcb_transactions = args.tpcb_transactions.unwrap_or(size.tpcb_transactions);
    size.repeat = args.repeat.unwrap_or(size.repeat);
    if !args.threads.is_empty() {
        size.threads = args.threads;
    }
    if !args.tpcb_threads.is_empty() {
        size.tpcb_threads = args.tpcb_threads;
    }
    let modes = match args.modes.is_empty() {
        true => Mode::all(),
        false => args
            .modes
            .iter()
            .map(|m| parse_mode(m))
            .collect::<Result<_>>()?,
    };
    let options = StoreOptions {
        size,
        modes,
        directory: args.directory,
        results: Some(args.results),
    };
    store::run(&options, &mut std::io::stdout()).await?;
    Ok(())
}

#[derive(clap::Args)]
pub struct LinkArgs {
    /// quick (CI: 240 changes, 1 and 4 clients) or full (the seed's 240,000 changes,
    /// 1 and 16 clients).
    #[arg(long, default_value = "quick")]
    size: String,
    /// Changes in the backlog, instead of the size's.
    #[arg(long)]
    changes: Option<usize>,
    /// Link bandwidths in kbit/s, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,128")]
    kbits: Vec<u64>,
    /// Round-trip latency in ms (half each way).
    #[arg(long, default_value_t = 300)]
    round_trip_ms: u64,
    /// Compressions, comma-separated: none, zlib, zstd.
    #[arg(long, value_delimiter = ',', default_value = "none,zstd")]
    compression: Vec<String>,
    /// Client counts to spread the backlog over, instead of the size's.
    #[arg(long, value_delimiter = ',')]
    clients: Vec<usize>,
    /// Fractions of a one-client upload to cut at, comma-separated (none: no cut rows).
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.99")]
    cuts: Vec<f64>,
    /// Leave out the cut rows.
    #[arg(long)]
    no_cuts: bool,
    /// The clients' transport over the link: tcp, or http (one POST per sync, and a
    /// download's receipt as a request of its own).
    #[arg(long, default_value = "tcp")]
    transport: String,
    /// Also the server-to-database link (issue 20, 4(b)): a postgres:// URL of a scratch
    /// database, reached through a toxiproxy at --round-trip-ms; drops and recreates its
    /// table link_rows.
    #[arg(long)]
    db: Option<String>,
    /// Apply stream counts of the database link (default: 1,4 quick, 1,8,16 full).
    #[arg(long, value_delimiter = ',')]
    streams: Vec<usize>,
    /// Write the database link's Markdown table to this file.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

pub async fn run_link(args: LinkArgs) -> Result<()> {
    let mut options = LinkOptions::sized(&args.size)?;
    options.changes = args.changes.unwrap_or(options.changes);
    options.kbits = args.kbits.clone();
    options.round_trip_ms = args.round_trip_ms;
    options.compressions = args
        .compression
        .iter()
        .map(|name| parse_compression(name))
        .collect::<Result<_>>()?;
    if !args.clients.is_empty() {
        options.spreads = args.clients.clone();
    }
    options.http = match args.transport.as_str() {
        "tcp" => false,
        "http" => true,
        other => bail!("unknown transport {other:?}: tcp or http"),
    };
    options.cuts = if args.no_cuts {
        Vec::new()
    } else {
        args.cuts.clone()
    };
    link::run(&options, &mut std::io::stdout()).await?;
    if let Some(db) = &args.db {
        run_link_database(db, &args).await?;
    }
    Ok(())
}

/// `link --db`: the server-to-database link over apply streams.
async fn run_link_database(db: &str, args: &LinkArgs) -> Result<()> {
    if !is_postgres(db) {
        bail!("link --db measures PostgreSQL: give a postgres:// URL");
    }
    let mut options = match args.size.as_str() {
        "full" => link_database::DatabaseLinkOptions::full(),
        _ => link_database::DatabaseLinkOptions::quick(),
    };
    if !args.streams.is_empty() {
        options.streams = args.streams.clone();
    }
    options.changes = args.changes.unwrap_or(options.changes);
    options.round_trip_ms = args.round_trip_ms;
    let results = link_database::run(db, &options, &mut std::io::stdout()).await?;
    let table = link_database::markdown(&options, &results);
    println!("\n{table}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &table).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
