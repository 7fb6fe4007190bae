//! `rowsync`: parses the command line and hands each command to its module in
//! `command/`. Nothing else.

mod command;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use command::{cert, cleanup, demo, init, profile, replay, script, serve, user, version};

#[derive(Parser)]
#[command(
    name = "rowsync",
    version,
    about = "Synchronize SQLite clients with a consolidated database"
)]
struct Cli {
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

pub(crate) fn main() -> Result<()> {
    rowsync_cli::logging::init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(run(cli.command))
}

async fn run(command: Command) -> Result<()> {
    match command {
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
        Command::Cleanup(args) => cleanup::run(args).await,
        Command::Cert(args) => cert::run(args),
        Command::User { command } => user::run(command).await,
        Command::Demo(args) => demo::run(args).await,
    }
}
