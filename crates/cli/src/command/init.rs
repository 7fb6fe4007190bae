//! `rowsync init`: makes an existing table synchronizable.

use anyhow::Result;
use rowsync_cli::database::{DatabaseArg, OnBackend};
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};

#[derive(clap::Args)]
pub struct InitArgs {
    #[command(flatten)]
    database: DatabaseArg,
    #[arg(long)]
    table: String,
    /// Rows whose value in this column equals a user's name belong to that user.
    #[arg(long)]
    partition_column: String,
    #[arg(long, default_value = "v1")]
    script_version: String,
}

pub async fn run(args: InitArgs) -> Result<()> {
    args.database.database().run(args).await
}

impl OnBackend for InitArgs {
    type Output = ();
    async fn run<B: Consolidated>(self, backend: B) -> Result<()> {
        let mut connection = backend.connect().await?;
        connection.install_system_tables().await?;
        connection
            .init_table(&TableInit {
                table: self.table.clone(),
                partition_column: self.partition_column,
                script_version: self.script_version.clone(),
            })
            .await?;
        println!(
            "table {} is synchronized by script version {}",
            self.table, self.script_version
        );
        Ok(())
    }
}
