//! The log of `rowsync` and `rowsync-bench`: to stderr, filtered by `ROWSYNC_LOG`
//! (tracing's `EnvFilter` syntax; `warn` when unset), as text (coloured only when stderr
//! is a terminal) or as JSON lines (`--log-format json`, `log_format = "json"`), one
//! object per event, for a log shipper.
//!
//! The few lines a command always says (the server's banner, a draining notice, the
//! final error) go through [`notice`]: plain on stderr with text logs, and as JSON
//! lines of target `rowsync::notice` (whatever `ROWSYNC_LOG` says) with JSON logs, so
//! that every line of a JSON log parses.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

/// The shape of the log lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, fields, target).
    Json,
}

const NOTICE_TARGET: &str = "rowsync::notice";

static JSON: AtomicBool = AtomicBool::new(false);

/// Text logs.
pub fn init() {
    init_with(LogFormat::Text);
}

pub fn init_with(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ROWSYNC_LOG")
        .unwrap_or_else(|_| "warn".into());
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // A closed log pipe must not matter: by default the subscriber reports its own
        // write errors with eprintln!, which panics on a broken pipe and would take
        // down the sync that was logging.
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder
            .with_env_filter(filter)
            .with_ansi(std::io::stderr().is_terminal())
            .init(),
        LogFormat::Json => {
            JSON.store(true, Ordering::Relaxed);
            let notices = format!("{NOTICE_TARGET}=info")
                .parse()
                .expect("a constant directive parses");
            builder
                .json()
                .with_env_filter(filter.add_directive(notices))
                .with_ansi(false)
                .init()
        }
    }
}

/// A line a command always says: plain on stderr, or a JSON log line with JSON logs.
pub fn notice(message: impl std::fmt::Display) {
    if JSON.load(Ordering::Relaxed) {
        tracing::info!(target: NOTICE_TARGET, "{message}");
    } else {
        eprintln!("{message}");
    }
}
