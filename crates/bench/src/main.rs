//! `rowsync-bench`: the benchmarks' command line, a binary of its own so the product
//! binary `rowsync` links neither the benchmarks nor, through `bench-link`, the test kit.
//! Parses the command line and hands each command to `command.rs`; the benchmarks
//! themselves are this crate's library.
//!
//! The subcommands were once `rowsync-bench timing`, `rowsync-bench apply`, ...: those names
//! stay as aliases, so a recorded command line (docs/results) runs with `rowsync-bench`
//! in place of `rowsync`.

mod command;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use command::{
    ApplyArgs, LinkArgs, LoadArgs, LoginsArgs, SharedArgs, StoreArgs, TimingArgs, TransportArgs,
};

#[derive(Parser)]
#[command(
    name = "rowsync-bench",
    version,
    about = "rowsync's benchmarks (docs/benchmarks.md)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure sync throughput by workers, clients, rows per sync and protocol.
    ///
    /// The MobiLink 12 performance white paper's Tests 1-5 (workers, retry delay above the
    /// connection limit, clients, rows per sync, protocols) with the database's own limit
    /// and one-statement-per-row scripts measured in the same run. The server under test
    /// is the `rowsync` binary beside this one (or --server-program). Drops and recreates
    /// purchase, purchase_raw and bench_server_time in the database named. See
    /// docs/benchmarks.md.
    #[command(alias = "bench")]
    Timing(TimingArgs),
    /// Measure uploads and a download through rowsync against PostgreSQL's bulk path.
    ///
    /// Uploads (insert, update, delete) and a download through rowsync against
    /// PostgreSQL's own bulk path in the same run. Drops and recreates bench_rows,
    /// bench_raw and their rowsync tables in the database named.
    #[command(alias = "bench-apply")]
    Apply(ApplyArgs),
    /// Measure many clients at once against PostgreSQL.
    ///
    /// Fixed worker counts against the controller's range (best of --runs, with the
    /// relative standard deviation), and clients above the connection limit against the
    /// limit raised. Drops and recreates bench_rows in the database named.
    #[command(alias = "bench-load")]
    Load(LoadArgs),
    /// Measure the same syncs over each transport and compression.
    ///
    /// A fixed sync workload (download, update, delete, insert) over every transport x
    /// compression, in one run, relative to plain TCP, with the bytes on the wire. Runs
    /// on an embedded SQLite database in a temporary directory.
    #[command(alias = "bench-transport")]
    Transport(TransportArgs),
    /// Measure the client database: durability modes and the cost of change tracking.
    ///
    /// The Berkeley DB performance overview's study on the client store: a key-value
    /// workload (insert, fetch, update, delete, reinsert) in each durability mode, on a
    /// tracked and an untracked table, by thread count; TPC-B-like transactions; the
    /// sync after each. Needs no server. See docs/benchmarks.md.
    #[command(alias = "bench-store")]
    Store(StoreArgs),
    /// Measure syncs over slow, high-latency links (512 and 128 kbit/s, 300 ms).
    ///
    /// Links emulated with toxiproxy: the client's link at 512 and 128 kbit/s with 300 ms
    /// round trips, a backlog from one client and from many, time against the wire limit,
    /// and the cost of a cut upload. See docs/benchmarks.md.
    #[command(alias = "bench-link")]
    Link(LinkArgs),
    /// Measure first syncs of one shared table: rows read by every sync, or read once.
    ///
    /// Many clients each download the same shared table (docs/rules.md) at their first
    /// sync; with the rows read from PostgreSQL by every sync and read once and served
    /// kept (`shared_download_cache_bytes_max`), alternated in one run: wall time, the
    /// server's CPU, PostgreSQL's CPU. Drops and recreates bench_film.
    Shared(SharedArgs),
    /// Measure password logins with and without session tokens.
    ///
    /// Clients each syncing by password again and again, all at once, against a server
    /// that checks the password (argon2id) at every sync and one that hands out session
    /// tokens, alternated in one run on an SQLite database: syncs per second and CPU per
    /// sync. Needs nothing but this binary.
    Logins(LoginsArgs),
}

fn main() -> Result<()> {
    rowsync_cli::logging::init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        match cli.command {
            Command::Timing(args) => command::run_timing(args).await,
            Command::Apply(args) => command::run_apply(args).await,
            Command::Load(args) => command::run_load(args).await,
            Command::Transport(args) => command::run_transport(args).await,
            Command::Store(args) => command::run_store(args).await,
            Command::Link(args) => command::run_link(args).await,
            Command::Shared(args) => command::run_shared(args).await,
            Command::Logins(args) => command::run_logins(args).await,
        }
    })
}
