//! `rowsync sync`: one synchronization of a client database from the shell.
//!
//! Prints what moved (or JSON with `--json`), shows progress on a terminal, and says how
//! the sync ended in its exit status (see [`SyncExit`]).

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rowsync_client::{
    BusyRetry, Client, ClientError, Compression, ExistingRows, FailureKind, KeptConflict,
    RejectedRow, SyncOptions, SyncProgress, SyncReport,
};
use rowsync_protocol::Value;
use serde_json::json;

/// How often the terminal spinner redraws when nothing moved.
const PROGRESS_TICK: Duration = Duration::from_millis(120);

#[derive(Args, Debug, Clone)]
pub struct SyncArgs {
    /// The client database (a SQLite file; created if missing).
    #[arg(long)]
    pub db: PathBuf,
    /// The server: tcp://host:port, tls://host:port, http://host:port/path or https://...
    #[arg(long)]
    pub server: String,
    /// The user to sync as (with --token, the token names the user).
    #[arg(long, default_value = "")]
    pub user: String,
    /// Read the password from the first line of standard input.
    #[arg(long, conflicts_with = "token")]
    pub password_stdin: bool,
    /// A signed token (JWT) to log in with instead of a password.
    #[arg(long, env = "ROWSYNC_TOKEN")]
    pub token: Option<String>,
    /// Start tracking this table (needs a primary key) before syncing; repeatable.
    #[arg(long = "track")]
    pub track: Vec<String>,
    /// Rows a --track table holds when first tracked: `upload` (this client's own
    /// writes, uploaded as inserts) or `from-server` (a pre-synced copy: not uploaded).
    #[arg(long, default_value = "upload", value_parser = ["upload", "from-server"])]
    pub existing_rows: String,
    /// Stop tracking this table before syncing (its changes not uploaded yet are set
    /// aside in rs_client_rejected); repeatable.
    #[arg(long = "untrack")]
    pub untrack: Vec<String>,
    /// Put the rejected change with this id back in line before syncing (after fixing
    /// its row); repeatable. `--json` lists them under `rejected_rows`.
    #[arg(long = "requeue-rejected")]
    pub requeue_rejected: Vec<i64>,
    /// The script version the server runs for this sync.
    #[arg(long, default_value = "v1")]
    pub version: String,
    /// Sync only these tables (comma-separated; protocol v9): their changes go up and
    /// theirs come down, each from its own last download. Default: every table.
    #[arg(long, value_delimiter = ',')]
    pub tables: Vec<String>,
    /// Tables synced first (comma-separated), committed before the rest is asked for;
    /// repeat for further levels, highest first (protocol v9).
    #[arg(long = "priority")]
    pub priority: Vec<String>,
    /// none, zlib or zstd.
    #[arg(long, default_value = "none")]
    pub compression: String,
    /// PEM file of the CA that signed the server's certificate (tls:// and https://).
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// The client id of a new database (a random one when not given).
    #[arg(long)]
    pub client_id: Option<String>,
    /// Retries when the server answers busy (0: give up at once).
    #[arg(long, default_value_t = rowsync_client::BUSY_RETRY_ATTEMPTS_MAX_DEFAULT)]
    pub busy_retries: u32,
    /// Limit on connecting and on each wait for the server, in seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout_seconds: u64,
    /// Print the report as one JSON object on standard output.
    #[arg(long)]
    pub json: bool,
}

/// How a sync ended, as the process's exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncExit {
    /// Everything went up and came down.
    Synced = 0,
    /// Anything else: network, TLS, local database, protocol.
    Error = 1,
    /// The server stayed busy through every retry (or another sync of this client was
    /// in progress).
    Busy = 3,
    /// The server refused the sync: credentials, protocol or script version, client id,
    /// an upload it cannot take. Trying again as it is will not help.
    Refused = 4,
    /// The sync completed, but the server kept its own rows for some uploaded changes.
    Conflict = 5,
    /// The sync completed, but the server refused some changes: they are set aside in
    /// the client database (`rejected_rows` in `--json`) and the rest went up.
    Rejected = 6,
}

impl SyncExit {
    pub fn code(self) -> u8 {
        self as u8
    }

    fn name(self) -> &'static str {
        match self {
            SyncExit::Synced => "synced",
            SyncExit::Error => "error",
            SyncExit::Busy => "busy",
            SyncExit::Refused => "refused",
            SyncExit::Conflict => "conflict",
            SyncExit::Rejected => "rejected",
        }
    }

    fn of_error(error: &ClientError) -> SyncExit {
        match error.kind() {
            FailureKind::Busy => SyncExit::Busy,
            FailureKind::Refused => SyncExit::Refused,
            FailureKind::Failed => SyncExit::Error,
        }
    }
}

/// Runs one sync; errors of the sync itself are reported and become the exit status,
/// only a command line that cannot run (no password on standard input) is an `Err`.
pub async fn run(args: SyncArgs) -> Result<SyncExit> {
    let mut options = SyncOptions::new(args.server.clone(), args.user.clone(), String::new());
    if args.password_stdin {
        options.password = read_password()?;
    } else if args.token.is_none() {
        bail!("give --password-stdin or --token");
    }
    options.token = args.token.clone();
    options.script_version = args.version.clone();
    options.tables = args.tables.clone();
    options.priorities = args
        .priority
        .iter()
        .map(|level| level.split(',').map(str::to_owned).collect())
        .collect();
    options.transport.compression = args
        .compression
        .parse::<Compression>()
        .map_err(|error| anyhow::anyhow!("--compression: {error}"))?;
    options.transport.tls.ca_file = args.ca_file.clone();
    options.timeout = Duration::from_secs(args.timeout_seconds);
    if args.busy_retries == 0 {
        options.busy_retry = BusyRetry::Never;
    } else if let BusyRetry::ServerHint { attempts_max, .. } = &mut options.busy_retry {
        *attempts_max = args.busy_retries;
    }
    let bar = progress_bar(args.json);
    let outcome = sync(&args, &options, &bar).await;
    bar.finish_and_clear();
    let exit = match &outcome {
        Ok(synced) if synced.report.rows_rejected > 0 => SyncExit::Rejected,
        Ok(synced) if synced.report.conflicts > 0 => SyncExit::Conflict,
        Ok(_) => SyncExit::Synced,
        Err(error) => SyncExit::of_error(error),
    };
    match (&outcome, args.json) {
        (Ok(synced), true) => println!("{}", report_json(synced, exit)),
        (Ok(synced), false) => print_report(synced),
        (Err(error), true) => println!(
            "{}",
            json!({ "outcome": exit.name(), "exit_code": exit.code(), "error": error.to_string() })
        ),
        (Err(error), false) => eprintln!("rowsync sync: {}: {error}", exit.name()),
    }
    Ok(exit)
}

/// A sync's report, and the losing sides of conflicts the client database keeps.
struct Synced {
    report: SyncReport,
    kept_conflicts: Vec<KeptConflict>,
    rejected_rows: Vec<RejectedRow>,
}

async fn sync(
    args: &SyncArgs,
    options: &SyncOptions,
    bar: &ProgressBar,
) -> Result<Synced, ClientError> {
    let mut client = Client::open_with_id(&args.db, args.client_id.as_deref())?;
    let existing: ExistingRows = args.existing_rows.parse()?;
    for table in &args.track {
        client.track_with(table, existing)?;
    }
    for table in &args.untrack {
        client.untrack(table)?;
    }
    for &id in &args.requeue_rejected {
        if !client.requeue_rejected(id)? {
            return Err(ClientError::Option(format!(
                "there is no rejected change {id}: `rowsync sync --json` lists them under rejected_rows"
            )));
        }
    }
    let report = client
        .sync_with_progress(options, &mut |progress| show(bar, progress))
        .await?;
    Ok(Synced {
        report,
        kept_conflicts: client.kept_conflicts()?,
        rejected_rows: client.rejected_rows()?,
    })
}

fn read_password() -> Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("reading the password from standard input")?;
    let password = line.trim_end_matches(['\r', '\n']).to_string();
    if password.is_empty() {
        bail!("--password-stdin: standard input held no password");
    }
    Ok(password)
}

/// A spinner with the counts on standard error when it is a terminal; hidden otherwise.
fn progress_bar(json: bool) -> ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {elapsed} {msg}") {
        bar.set_style(style);
    }
    // The spinner moves while the server prepares the download.
    bar.enable_steady_tick(PROGRESS_TICK);
    bar
}

fn show(bar: &ProgressBar, progress: &SyncProgress) {
    bar.set_message(format!(
        "up {}/{} rows {} | down {} rows {}",
        progress.rows_uploaded,
        progress.rows_to_upload,
        bytes(progress.bytes_sent),
        progress.rows_downloaded,
        bytes(progress.bytes_received),
    ));
}

fn bytes(count: u64) -> String {
    match count {
        0..1_000 => format!("{count} B"),
        1_000..1_000_000 => format!("{:.1} kB", count as f64 / 1e3),
        _ => format!("{:.1} MB", count as f64 / 1e6),
    }
}

fn print_report(synced: &Synced) {
    let report = &synced.report;
    println!(
        "uploaded {} rows, downloaded {} rows, {} conflicts, {} sent, {} received, {:.2} s",
        report.rows_uploaded,
        report.rows_downloaded,
        report.conflicts,
        bytes(report.wire.sent),
        bytes(report.wire.received),
        report.elapsed.as_secs_f64(),
    );
    if let Some(identity) = report.identity {
        println!(
            "this database was {}: the server knows another under its client id, so it \
             took a new client id and sent its changes as that client",
            identity.as_str()
        );
    }
    for conflict in &report.conflicted_rows {
        let key = text_row(&conflict.key);
        match &conflict.server_row {
            Some(row) => println!(
                "conflict: {} {key}: the server kept ({})",
                conflict.table,
                text_row(row)
            ),
            None => println!("conflict: {} {key}: the server deleted it", conflict.table),
        }
    }
    if !synced.kept_conflicts.is_empty() {
        println!(
            "{} losing changes kept in the client database's rs_client_conflict (see --json)",
            synced.kept_conflicts.len()
        );
    }
    for rejected in &synced.rejected_rows {
        println!(
            "rejected {}: {} of {} {}: {}",
            rejected.id, rejected.operation, rejected.table, rejected.key, rejected.reason
        );
    }
}

fn text_row(row: &[Value]) -> String {
    row.iter()
        .map(|value| match value {
            Value::Text(text) => format!("{text:?}"),
            other => serde_json::to_value(other)
                .map(|json| json.to_string())
                .unwrap_or_else(|_| format!("{other:?}")),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn report_json(synced: &Synced, exit: SyncExit) -> serde_json::Value {
    let mut json = synced.report.to_json();
    json["kept_conflicts"] = synced
        .kept_conflicts
        .iter()
        .map(KeptConflict::to_json)
        .collect();
    json["rejected_rows"] = synced
        .rejected_rows
        .iter()
        .map(RejectedRow::to_json)
        .collect();
    json["outcome"] = exit.name().into();
    json["exit_code"] = exit.code().into();
    json
}
