//! `rowsync demo`: the whole sync loop on a scratch database (see `rowsync_cli::demo`).

use std::path::PathBuf;

use anyhow::{bail, Result};
use rowsync_cli::demo;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// The consolidated database: a postgres:// or mysql:// URL of a scratch database (the demo
    /// drops and recreates its tables, orders and rs_*, there) or a SQLite file path.
    /// Default: a new SQLite file in the demo's directory.
    #[arg(long)]
    db: Option<String>,
    /// Client databases to create (spread over three users).
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Rows for the bulk upload and download measurement (0 to skip).
    #[arg(long, default_value_t = 100_000)]
    bulk_rows: usize,
    /// Keep the databases in this directory instead of a temporary one.
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub async fn run(args: DemoArgs) -> Result<()> {
    let report = demo::run(demo::DemoOptions {
        db: args.db,
        clients: args.clients,
        bulk_rows: args.bulk_rows,
        dir: args.dir,
        out: Box::new(std::io::stdout()),
    })
    .await?;
    if !report.agreement {
        bail!("the clients do not agree with the consolidated database");
    }
    Ok(())
}
