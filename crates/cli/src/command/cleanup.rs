//! `rowsync cleanup`: removes the tombstones every subscribed client has passed.

use anyhow::Result;
use rowsync_cli::database::{DatabaseArg, OnBackend};
use rowsync_consolidated::{Consolidated, ConsolidatedConnection};

#[derive(clap::Args)]
pub struct CleanupArgs {
    #[command(flatten)]
    database: DatabaseArg,
}

pub async fn run(args: CleanupArgs) -> Result<()> {
    args.database.database()?.run(args).await
}

impl OnBackend for CleanupArgs {
    type Output = ();
    async fn run<B: Consolidated>(self, backend: B) -> Result<()> {
        let removed = backend.connect().await?.cleanup().await?;
        println!("{removed} tombstones removed");
        Ok(())
    }
}
