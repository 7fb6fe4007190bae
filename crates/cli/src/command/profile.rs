//! `rowsync profile`: the contention profiler and the plan advisor. The work is in
//! `rowsync_cli::profile`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use rowsync_cli::database::{Database, DatabaseArg};
use rowsync_cli::profile::{self, report, ProfileOptions, ProfileReport};

#[derive(clap::Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    database: DatabaseArg,
    /// The script version to profile.
    #[arg(long)]
    version: String,
    /// Take users, clients and watermarks from a recording (`serve --record DIR`)
    /// instead of the data (subscriptions, then the largest partitions).
    #[arg(long)]
    record: Option<PathBuf>,
    /// Copy counts to run at once (1 and --workers are always added).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8])]
    copies: Vec<usize>,
    /// The server's worker count, one of the copy counts.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Batches per copy count and parameters (the median is reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Rows each copy of an upload sync type uploads per table.
    #[arg(long, default_value_t = 10)]
    upload_rows: usize,
    /// Profile single scripts only, no whole sync types (which commit: updates of rows
    /// to their own values, deletes put back by inserts).
    #[arg(long)]
    scripts_only: bool,
    /// Cores perfect scaling is reckoned for (default: this machine's).
    #[arg(long)]
    cores: Option<usize>,
    /// Run the plan advisor too (on SQLite, only the plan advisor runs).
    #[arg(long)]
    plans: bool,
    /// Print the report as JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file (replaced whole), which `serve
    /// --profile-report FILE` shows on the monitor page.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub async fn run(args: ProfileArgs) -> Result<()> {
    let report = match args.database.database()? {
        Database::Postgres(url) => {
            let cores = args
                .cores
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            let options = ProfileOptions {
                url,
                script_version: args.version.clone(),
                recording: args.record.clone(),
                copies: profile::copy_counts(&args.copies, args.workers),
                rounds: args.rounds,
                upload_rows: args.upload_rows,
                syncs: !args.scripts_only,
                cores,
                plans: args.plans,
            };
            profile::run(&options).await?
        }
        Database::Sqlite(path) => {
            if !args.plans {
                bail!("on SQLite only the plan advisor runs (SQLite has no wait events to sample): give --plans");
            }
            let version = args.version.clone();
            let plans =
                tokio::task::spawn_blocking(move || profile::plans_sqlite::advise(&path, &version))
                    .await??;
            ProfileReport {
                created_unix_ms: profile::unix_ms(),
                database: "SQLite".into(),
                script_version: args.version.clone(),
                cores: 1,
                copies: Vec::new(),
                parameter_source: "data".into(),
                users: Vec::new(),
                targets: Vec::new(),
                plans: Some(plans),
            }
        }
        other => bail!(
            "rowsync profile runs on PostgreSQL (and its plan advisor on SQLite), not on {}",
            other.kind()
        ),
    };
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(out) = &args.out {
        write_whole(out, &json)?;
    }
    if args.json {
        println!("{json}");
    } else if report.targets.is_empty() {
        print!(
            "{}",
            report::render_plans(report.plans.as_deref().unwrap_or_default())
        );
    } else {
        print!("{}", report::render(&report));
    }
    Ok(())
}

/// Writes beside and renames, so a reader never sees half a report.
fn write_whole(path: &PathBuf, text: &str) -> Result<()> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}
