//! `rowsync version`: adds and lists script versions.

use anyhow::Result;
use rowsync_cli::database::{DatabaseArg, OnBackend};
use rowsync_consolidated::{Consolidated, ConsolidatedConnection};

#[derive(clap::Subcommand)]
pub enum VersionCommand {
    /// Add a script version (or update its description).
    Add {
        #[command(flatten)]
        database: DatabaseArg,
        /// The version's name, which clients ask for (`v2`).
        name: String,
        /// What the version is for (which app release uses it), shown by `version list`.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List the script versions.
    List {
        #[command(flatten)]
        database: DatabaseArg,
    },
}

pub async fn run(command: VersionCommand) -> Result<()> {
    let (VersionCommand::Add { database, .. } | VersionCommand::List { database }) = &command;
    database.database()?.run(command).await
}

impl OnBackend for VersionCommand {
    type Output = ();
    async fn run<B: Consolidated>(self, backend: B) -> Result<()> {
        let mut connection = backend.connect().await?;
        connection.install_system_tables().await?;
        match self {
            VersionCommand::Add {
                name, description, ..
            } => {
                connection.add_script_version(&name, &description).await?;
                println!("script version {name} saved");
            }
            VersionCommand::List { .. } => {
                for (name, description) in connection.script_versions().await? {
                    println!("{name}\t{description}");
                }
            }
        }
        Ok(())
    }
}
