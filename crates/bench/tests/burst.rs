//! A burst of concurrent clients against a `rowsync serve` process: its peak resident
//! memory (`VmHWM`) stays under what its settings allow, the cache and the zstd
//! decoders' budget plus a fixed overhead per connection.
//!
//! CI runs a burst of 300 password clients with zstd; the full sizes run by hand:
//!
//! ```text
//! ROWSYNC_BURST_CLIENTS=2000 cargo test --release -p rowsync-bench --test burst -- \
//!     --nocapture a_burst
//! ROWSYNC_BURST_CLIENTS=2000 cargo test --release -p rowsync-bench --test burst -- \
//!     --ignored --nocapture burst_figures      # defaults, figures only
//! ```
//!
//! `ROWSYNC_BURST_OBSERVE_SECONDS=180` stops a burst after that long (10,000 password
//! clients take far longer to sync on two cores; the peak comes once all are in);
//! `ROWSYNC_BURST_LOGIN=token`, `ROWSYNC_BURST_COMPRESSION=none|zlib|zstd`,
//! `ROWSYNC_BURST_ROWS_UP`, `ROWSYNC_BURST_ROWS_DOWN` and `ROWSYNC_BURST_SERVER_ARGS`
//! vary it.
//!
//! `ROWSYNC_BIN` names the server binary (default: the `rowsync` cargo built beside this
//! test); `ROWSYNC_BURST_MAIN_BINARY=1` runs the bounded test against a server that
//! predates `--zstd-decoders-bytes-max` (the bound stays the same).

use std::path::PathBuf;

use rowsync_bench::burst::{self, BurstFigures, BurstOptions};

const MIB: u64 = 1024 * 1024;
/// What a connection holds beyond the cache and its zstd decoder: its task, socket
/// state, a 4 KiB read buffer until its hello is authenticated, its session and frame
/// decoder (a burst of 2,000 measured about 52 KiB a connection).
const CONNECTION_BYTES: u64 = 64 * 1024;
/// The server's own growth besides: workers' and authentication connections' SQLite
/// page caches, the runtime's threads, the monitor's history, the allocator's slack.
const SERVER_BYTES: u64 = 64 * MIB;
/// The settings the bounded test runs with, far below their defaults so that the bound
/// is tight.
const CACHE_BYTES_MAX: u64 = 16 * MIB;
const ZSTD_DECODERS_BYTES_MAX: u64 = 16 * MIB;

/// The `rowsync` binary: `ROWSYNC_BIN`, else the one cargo built beside this test.
fn rowsync_program() -> PathBuf {
    if let Some(path) = std::env::var_os("ROWSYNC_BIN") {
        return PathBuf::from(path);
    }
    let test = std::env::current_exe().expect("locating this test executable");
    let program = test
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join(format!("rowsync{}", std::env::consts::EXE_SUFFIX)))
        .expect("this test runs from target/<profile>/deps");
    assert!(
        program.is_file(),
        "{} not found: build it first (`cargo build --bin rowsync`) or set ROWSYNC_BIN",
        program.display()
    );
    program
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|text| text.parse().unwrap_or_else(|_| panic!("{name}: {text:?}")))
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "by hand: ROWSYNC_BURST_CLIENTS=2000 (or 10000), prints the figures"]
async fn burst_figures() {
    let clients = env_usize("ROWSYNC_BURST_CLIENTS", 2000);
    let mut options = BurstOptions::new(rowsync_program(), clients);
    options.rows_up = env_usize("ROWSYNC_BURST_ROWS_UP", options.rows_up);
    options.rows_down = env_usize("ROWSYNC_BURST_ROWS_DOWN", options.rows_down);
    if let Ok(compression) = std::env::var("ROWSYNC_BURST_COMPRESSION") {
        options.compression = compression.parse().unwrap();
    }
    if let Ok(seconds) = std::env::var("ROWSYNC_BURST_OBSERVE_SECONDS") {
        options.observe = Some(std::time::Duration::from_secs(seconds.parse().unwrap()));
    }
    if std::env::var("ROWSYNC_BURST_LOGIN").as_deref() == Ok("token") {
        options.login = burst::Login::Token;
    }
    if let Ok(args) = std::env::var("ROWSYNC_BURST_SERVER_ARGS") {
        options.server_args = args.split_whitespace().map(str::to_string).collect();
    }
    let figures = burst::run(&options).await.unwrap();
    println!("{figures}");
}

/// Peak resident memory a burst of `clients` may reach: the server idle, the cache and
/// the zstd decoders' budget full, and each connection's fixed share.
fn bound_bytes(figures: &BurstFigures, clients: usize) -> u64 {
    figures.idle_rss_bytes
        + CACHE_BYTES_MAX
        + ZSTD_DECODERS_BYTES_MAX
        + clients as u64 * CONNECTION_BYTES
        + SERVER_BYTES
}

/// Fails on a server whose zstd decoders are unbounded: 300 clients held 300 decoders of
/// 2 MiB windows while they waited for argon2id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_stays_within_the_cache_the_decoders_budget_and_a_share_per_connection() {
    let clients = env_usize("ROWSYNC_BURST_CLIENTS", 300);
    let mut options = BurstOptions::new(rowsync_program(), clients);
    options.server_args = vec![
        "--cache-bytes-max".into(),
        CACHE_BYTES_MAX.to_string(),
        "--workers".into(),
        "2".into(),
    ];
    if std::env::var_os("ROWSYNC_BURST_MAIN_BINARY").is_none() {
        options.server_args.extend([
            "--zstd-decoders-bytes-max".into(),
            ZSTD_DECODERS_BYTES_MAX.to_string(),
        ]);
    }
    let figures = burst::run(&options).await.unwrap();
    println!("{figures}");
    assert_eq!(figures.syncs_failed, 0, "{figures}");
    let bound = bound_bytes(&figures, clients);
    assert!(
        figures.peak_rss_bytes <= bound,
        "peak RSS {:.1} MiB above the bound of {:.1} MiB ({figures})",
        figures.peak_rss_bytes as f64 / MIB as f64,
        bound as f64 / MIB as f64
    );
}
