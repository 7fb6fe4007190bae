//! `rowsync`: parses the command line and hands each command to its module in
//! `command/`. Nothing else.

mod command;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand};
use rowsync_cli::logging::{self, LogFormat};

use command::{
    cert, cleanup, config, demo, init, keys, profile, replay, script, serve, user, version,
};

#[derive(Parser)]
#[command(
    name = "rowsync",
    version,
    about = "Synchronize SQLite clients with a consolidated database"
)]
struct Cli {
    /// Settings from this TOML file: each key an option's long name with `_` for `-`
    /// (`max_connections = 1024`). The command line wins over ROWSYNC_* variables, which
    /// win over the file (docs/operations.md, "The config file").
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Log lines as text (coloured when stderr is a terminal) or as JSON objects, one
    /// a line (docs/operations.md, "Logging").
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

// The order of the variants is the order of `rowsync --help`.
#[derive(Subcommand)]
enum Command {
    /// Sync a client database with a server.
    Sync(rowsync_cli::sync_command::SyncArgs),
    /// Run the sync server.
    Serve(Box<serve::ServeArgs>),
    /// Play syncs recorded by `serve --record` against a server, or compare two runs
    /// (--diff RUN_A RUN_B).
    Replay(replay::ReplayArgs),
    /// Run a script version's scripts and sync types alone and as N copies at once
    /// (PostgreSQL): times, the ratio to perfect scaling, what the copies waited on, hot
    /// rows, a verdict with its remedy; --plans adds the plan advisor (also on SQLite).
    Profile(profile::ProfileArgs),
    /// Manage the scripts of script versions.
    Script {
        #[command(subcommand)]
        command: script::ScriptCommand,
    },
    /// Manage script versions.
    Version {
        #[command(subcommand)]
        command: version::VersionCommand,
    },
    /// Make an existing table synchronizable: change tracking and default scripts.
    Init(init::InitArgs),
    /// Check a config file: the settings a command would run with.
    Config {
        #[command(subcommand)]
        command: config::ConfigCommand,
    },
    /// Hand clients ranges of a table's integer keys for the rows they insert offline
    /// (the server's own key generator moves above them): docs/types.md.
    Keys(keys::KeysArgs),
    /// Remove tombstones every subscribed client has passed (the server also does this
    /// every --cleanup-interval-seconds).
    Cleanup(cleanup::CleanupArgs),
    /// Write a test certificate authority, a server certificate and a client
    /// certificate (PEM) for the TLS and HTTPS endpoints.
    Cert(cert::CertArgs),
    /// Manage users.
    User {
        #[command(subcommand)]
        command: user::UserCommand,
    },
    /// Run a complete demonstration (embedded SQLite by default, or --db postgres://... or mysql://...).
    Demo(demo::DemoArgs),
}

pub(crate) fn main() -> std::process::ExitCode {
    let argv = std::env::args_os().collect();
    let cli = match rowsync_cli::config::fold_in(&Cli::command(), argv) {
        Ok((argv, _)) => Cli::parse_from(argv),
        Err(error) => {
            eprintln!("error: {error:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    logging::init_with(cli.log_format);
    let config_file = cli.config.clone();
    if cli.command.only_prints() {
        end_quietly_when_the_output_closes();
    }
    let ran = tokio::runtime::Runtime::new()
        .context("starting the async runtime")
        .and_then(|runtime| runtime.block_on(run(cli.command, config_file)));
    match ran {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The message and its causes (each refusal names its fix), never a backtrace:
        // backtraces are for panics.
        Err(error) => {
            logging::notice(format!("error: {error:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

impl Command {
    /// Commands that talk to nothing but the database and their output: a closed output
    /// (`| head`) ends them as it ends `ls`. A server or client keeps the default
    /// (a closed socket is an error to handle, not an end).
    fn only_prints(&self) -> bool {
        matches!(
            self,
            Command::Script { .. }
                | Command::Version { .. }
                | Command::User { .. }
                | Command::Init(_)
                | Command::Keys(_)
                | Command::Cleanup(_)
                | Command::Cert(_)
        )
    }
}

/// Restores the default action of SIGPIPE (Rust's runtime ignores it, so a print to a
/// closed pipe panics with "failed printing to stdout").
fn end_quietly_when_the_output_closes() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to its default, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

async fn run(command: Command, config_file: Option<std::path::PathBuf>) -> Result<()> {
    match command {
        Command::Config { command } => config::run(command, config_file, Cli::command()),
        Command::Sync(args) => {
            let exit = rowsync_cli::sync_command::run(args).await?;
            std::process::exit(exit.code().into())
        }
        Command::Serve(args) => serve::run(*args).await,
        Command::Replay(args) => {
            let exit = replay::run(args).await?;
            std::process::exit(exit)
        }
        Command::Profile(args) => profile::run(args).await,
        Command::Script { command } => script::run(command).await,
        Command::Version { command } => version::run(command).await,
        Command::Init(args) => init::run(args).await,
        Command::Keys(args) => keys::run(args).await,
        Command::Cleanup(args) => cleanup::run(args).await,
        Command::Cert(args) => cert::run(args),
        Command::User { command } => user::run(command).await,
        Command::Demo(args) => demo::run(args).await,
    }
}
