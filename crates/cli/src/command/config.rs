//! `rowsync config check`: what a command would run with, from the config file, the
//! environment and the command line (rowsync_cli::config), checked as the command
//! checks it, secrets masked.

use anyhow::{anyhow, Result};
use rowsync_cli::config::{fold_in, shown};

#[derive(clap::Subcommand)]
pub enum ConfigCommand {
    /// Check the settings a command would run with (from --config FILE, ROWSYNC_*
    /// variables and the command line after --) and print them, secrets masked:
    /// `rowsync config check --config rowsync.toml -- serve`.
    Check {
        /// The command and its options: `serve`, `init --table notes`, ...
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<String>,
    },
}

/// `config`'s own `--config` (a global option) is passed on to the checked command.
pub fn run(
    command: ConfigCommand,
    config: Option<std::path::PathBuf>,
    cli: clap::Command,
) -> Result<()> {
    let ConfigCommand::Check { command: words } = command;
    let mut argv: Vec<std::ffi::OsString> = vec!["rowsync".into()];
    argv.extend(words.iter().map(Into::into));
    if let Some(path) = config {
        argv.push("--config".into());
        argv.push(path.into());
    }
    let (folded, settings) = fold_in(&cli, argv)?;
    cli.try_get_matches_from(&folded)
        .map_err(|error| anyhow!("`rowsync {}` would not start: {error}", words.join(" ")))?;
    for setting in &settings {
        println!("{}", shown(setting));
    }
    Ok(())
}
