//! `rowsync user add`: adds a user or sets the password of an existing one.

use std::io::Read;

use anyhow::{bail, Context, Result};
use rowsync_cli::database::{DatabaseArg, OnBackend};
use rowsync_consolidated::{Consolidated, ConsolidatedConnection};
use rowsync_server::auth;

#[derive(clap::Subcommand)]
pub enum UserCommand {
    /// Add a user, or set the password of an existing one.
    Add(UserAddArgs),
}

#[derive(clap::Args)]
pub struct UserAddArgs {
    #[command(flatten)]
    database: DatabaseArg,
    #[arg(long)]
    name: String,
    /// The password; read from standard input when absent.
    #[arg(long, env = "ROWSYNC_PASSWORD", hide_env_values = true)]
    password: Option<String>,
}

pub async fn run(command: UserCommand) -> Result<()> {
    match command {
        UserCommand::Add(args) => args.database.database().run(args).await,
    }
}

impl OnBackend for UserAddArgs {
    type Output = ();
    async fn run<B: Consolidated>(self, backend: B) -> Result<()> {
        let password = match self.password {
            Some(password) => password,
            None => {
                let mut input = String::new();
                std::io::stdin()
                    .read_to_string(&mut input)
                    .context("reading the password from stdin")?;
                input.trim_end_matches(['\r', '\n']).to_string()
            }
        };
        if password.is_empty() {
            bail!("the password must not be empty");
        }
        let hash =
            auth::hash_password(&password).map_err(|error| anyhow::anyhow!("hashing: {error}"))?;
        let mut connection = backend.connect().await?;
        connection.install_system_tables().await?;
        connection.set_user(&self.name, &hash).await?;
        println!("user {} saved", self.name);
        Ok(())
    }
}
