//! A burst of concurrent clients against a `rowsync serve` process: its peak resident
//! memory (`VmHWM`) stays under what its settings allow.
//!
//! CI runs a small burst; the full sizes run by hand and print their figures:
//!
//! ```text
//! ROWSYNC_BURST_CLIENTS=2000 cargo test --release -p rowsync-bench --test burst -- \
//!     --ignored --nocapture
//! ```
//!
//! `ROWSYNC_BIN` names the server binary (default: the `rowsync` cargo built beside this
//! test).

use std::path::PathBuf;

use rowsync_bench::burst::{self, BurstOptions};

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
    if std::env::var("ROWSYNC_BURST_LOGIN").as_deref() == Ok("token") {
        options.login = burst::Login::Token;
    }
    if let Ok(args) = std::env::var("ROWSYNC_BURST_SERVER_ARGS") {
        options.server_args = args.split_whitespace().map(str::to_string).collect();
    }
    let figures = burst::run(&options).await.unwrap();
    println!("{figures}");
}
