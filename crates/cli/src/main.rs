//! `rowsync`: parses the command line and hands each command to its module in
//! `command/`. Nothing else.

mod command;

use anyhow::{Context, Result};
use std::ffi::OsString;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use rowsync_cli::logging::{self, LogFormat};

use command::{
    cert, cleanup, config, demo, init, keys, profile, replay, rules, schema, script, serve, status,
    user, version,
};

#[derive(Parser)]
#[command(
    name = "rowsync",
    version,
    about = "Synchronize SQLite databases on devices with a central database, offline first",
    after_help = "New here? `rowsync demo` shows the whole loop in one command; the README \
                  then sets up your own table. `rowsync COMMAND --help` tells more about a \
                  command, `--help-all` shows every option of it. The benchmarks are the \
                  separate program rowsync-bench (docs/benchmarks.md)."
)]
struct Cli {
    /// Settings from this TOML file: each key an option's long name with `_` for `-`
    /// (`max_connections = 1024`). The command line wins over ROWSYNC_* variables, which
    /// win over the file (docs/operations.md, "The config file").
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Log lines as text (coloured when stderr is a terminal) or as JSON objects, one
    /// a line (docs/operations.md, "Logging").
    #[arg(long, global = true, value_enum, hide_possible_values = true, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// The groups of `rowsync --help`, in the order a newcomer needs them; each command is
/// in one (a test checks).
const COMMAND_GROUPS: [(&str, &[&str]); 4] = [
    (
        "Getting started",
        &["demo", "init", "rules", "schema", "user"],
    ),
    ("Running", &["serve", "sync"]),
    (
        "Operating",
        &[
            "status", "script", "version", "keys", "cleanup", "cert", "config",
        ],
    ),
    ("Benchmarking and diagnosing", &["replay", "profile"]),
];

// Each command's first paragraph, one short line, is what `rowsync --help` shows: what
// the command does for its user. The rest shows in `rowsync COMMAND --help`.
#[derive(Subcommand)]
enum Command {
    /// Try rowsync in one command, on a scratch database (nothing to install).
    ///
    /// A server, four client devices of three users, changes on both sides and a
    /// conflict, three rounds of syncs, a check that each device holds exactly its rows,
    /// and a bulk upload and download with their rates. Embedded SQLite by default, or
    /// --db postgres://... or mysql://... (a scratch database: the demo drops its tables).
    Demo(demo::DemoArgs),
    /// Make a table of your central database synchronizable.
    ///
    /// Installs change tracking (row versions and tombstones kept by triggers) and the
    /// default sync scripts. Run it again after the table changed (docs/schema-changes.md).
    Init(init::InitArgs),
    /// Set which rows each user's devices get, for a whole app, from one rule file.
    ///
    /// `check` compares the file with the database (tables without a rule, rules naming
    /// missing tables); `apply` makes every table synchronizable by its rule: change
    /// tracking and the scripts of a script version (docs/rules.md).
    Rules {
        #[command(subcommand)]
        command: rules::RulesCommand,
    },
    /// Make a device's tables: the client CREATE TABLEs from the server's.
    ///
    /// Prints them for a script version, or creates them in a client database with
    /// --client-db (tables it has already are left as they are).
    Schema(schema::SchemaArgs),
    /// Add and manage the users devices log in as.
    User {
        #[command(subcommand)]
        command: user::UserCommand,
    },
    /// Run the sync server.
    // One paragraph above: a long description would space out every option's help.
    #[command(
        after_help = "The server stays in the foreground until Ctrl-C or SIGTERM \
        (then running syncs finish first). The essential options are shown; `rowsync serve \
        --help-all` lists all of them, by topic. docs/rowsync.example.toml is a config file \
        with the production settings, each explained."
    )]
    Serve(Box<serve::ServeArgs>),
    /// Sync a client database with a server, from the shell.
    Sync(rowsync_cli::sync_command::SyncArgs),
    /// See what the database synchronizes and for whom.
    ///
    /// The tables of each script version with their rules, the clients of each version
    /// and their last sync, the users, held transfers, and on PostgreSQL whether the
    /// event triggers that follow partitions are installed; --json for tools.
    Status(status::StatusArgs),
    /// Show or change the sync scripts (the SQL each sync runs).
    Script {
        #[command(subcommand)]
        command: script::ScriptCommand,
    },
    /// List or add script versions (a set of scripts per app release).
    Version {
        #[command(subcommand)]
        command: version::VersionCommand,
    },
    /// Hand devices key ranges for the rows they insert offline.
    ///
    /// Splits a table's integer keys between the devices and the server (whose own key
    /// generator moves above them): docs/types.md, "Keys for rows made offline".
    Keys(keys::KeysArgs),
    /// Remove the records of deletions every device has received.
    ///
    /// The server also does this every --cleanup-interval-seconds.
    Cleanup(cleanup::CleanupArgs),
    /// Make test TLS certificates (a CA, a server and a client one).
    ///
    /// PEM files for the TLS and HTTPS endpoints and for clients that present one.
    Cert(cert::CertArgs),
    /// Check a config file: the settings a command would run with.
    Config {
        #[command(subcommand)]
        command: config::ConfigCommand,
    },
    /// Replay recorded syncs against a server, or compare two runs.
    ///
    /// Plays syncs recorded by `serve --record` against a server (new scripts tried on
    /// real traffic), or compares two runs (--diff RUN_A RUN_B).
    Replay(replay::ReplayArgs),
    /// Find why syncs slow down under load, and missing indexes.
    ///
    /// Runs a script version's scripts and sync types alone and as N copies at once
    /// (PostgreSQL): times, the ratio to perfect scaling, what the copies waited on, hot
    /// rows, a verdict with its remedy; --plans adds the plan advisor (also on SQLite).
    Profile(profile::ProfileArgs),
}

/// The `rowsync` command line, with `rowsync --help` in groups.
fn cli() -> clap::Command {
    let command = Cli::command();
    let template = help_template(&command);
    command.help_template(template)
}

/// `rowsync --help`: the usage, the commands by group with the first line of each
/// one's description, the options.
fn help_template(command: &clap::Command) -> String {
    let width = COMMAND_GROUPS
        .iter()
        .flat_map(|(_, names)| names.iter().map(|name| name.len()))
        .max()
        .unwrap_or(0);
    let mut text = String::from("{about-with-newline}\n{usage-heading} {usage}\n");
    for (group, names) in COMMAND_GROUPS {
        text.push_str(&format!("\n{group}:\n"));
        for name in names {
            let about = command
                .find_subcommand(name)
                .and_then(clap::Command::get_about)
                .map(ToString::to_string)
                .unwrap_or_default();
            text.push_str(&format!("  {name:<width$}  {about}\n"));
        }
    }
    text.push_str("\nOptions:\n{options}{after-help}");
    text
}

/// The command line to parse `argv` with: with `--help-all` anywhere, the options that
/// help hides (the less used ones of `serve`) are shown, and `--help-all` asks for help.
fn with_hidden_shown(command: clap::Command, argv: &[OsString]) -> clap::Command {
    if !argv.iter().any(|word| word == "--help-all") {
        return command;
    }
    let path: Vec<String> = argv
        .iter()
        .skip(1)
        .filter_map(|word| word.to_str())
        .filter(|word| !word.starts_with('-'))
        .map(str::to_string)
        .collect();
    unhide(command, &path)
}

fn unhide(mut command: clap::Command, path: &[String]) -> clap::Command {
    let hidden: Vec<clap::Id> = command
        .get_arguments()
        .filter(|arg| arg.is_hide_set())
        .map(|arg| arg.get_id().clone())
        .collect();
    for id in hidden {
        command = command.mut_arg(id, |arg| arg.hide(false));
    }
    match path.split_first() {
        Some((name, rest)) if command.find_subcommand(name).is_some() => {
            let name = name.clone();
            command.mut_subcommand(name, |sub| unhide(sub, rest))
        }
        _ => command,
    }
}

/// `argv` with `--help-all` as `--help`.
fn help_all_as_help(argv: Vec<OsString>) -> Vec<OsString> {
    argv.into_iter()
        .map(|word| match word == "--help-all" {
            true => OsString::from("--help"),
            false => word,
        })
        .collect()
}

pub(crate) fn main() -> std::process::ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let command = with_hidden_shown(cli(), &argv);
    let argv = help_all_as_help(argv);
    let cli = match rowsync_cli::config::fold_in(&command, argv) {
        Ok((argv, _)) => parse(command, argv),
        Err(error) => {
            eprintln!("error: {}", shown(&error));
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
            logging::notice(format!("error: {}", shown(&error)));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each cause once: a cause whose words the message already
/// carries (drivers repeat their source in their own message) is left out.
fn shown(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

/// The parsed command line; help, a version request or a usage error end the process
/// as clap ends it.
fn parse(command: clap::Command, argv: Vec<OsString>) -> Cli {
    let mut command = command;
    let matches = command
        .try_get_matches_from_mut(argv)
        .unwrap_or_else(|error| error.exit());
    Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.format(&mut command).exit())
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
                | Command::Rules { .. }
                | Command::Schema(_)
                | Command::Status(_)
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
        Command::Config { command } => config::run(command, config_file, cli()),
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
        Command::Rules { command } => rules::run(command).await,
        Command::Schema(args) => schema::run(args).await,
        Command::Status(args) => status::run(args).await,
        Command::Keys(args) => keys::run(args).await,
        Command::Cleanup(args) => cleanup::run(args).await,
        Command::Cert(args) => cert::run(args),
        Command::User { command } => user::run(command).await,
        Command::Demo(args) => demo::run(args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every argument and command of the tree, with its path: `rowsync serve --workers`.
    fn walk(command: &clap::Command, path: &str, found: &mut Vec<String>) {
        for arg in command.get_arguments() {
            let builtin = matches!(
                arg.get_action(),
                clap::ArgAction::Help
                    | clap::ArgAction::HelpShort
                    | clap::ArgAction::HelpLong
                    | clap::ArgAction::Version
            );
            if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                found.push(format!("{path} {}: an argument without help", arg.get_id()));
            }
        }
        for sub in command.get_subcommands() {
            let sub_path = format!("{path} {}", sub.get_name());
            if sub.get_about().is_none() && sub.get_name() != "help" {
                found.push(format!("{sub_path}: a command without a description"));
            }
            walk(sub, &sub_path, found);
        }
    }

    #[test]
    fn an_error_shows_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused (os 111)");
        let error = anyhow::Error::new(io)
            .context("driver: refused (os 111)")
            .context("nothing accepts connections at db:5432");
        assert_eq!(
            shown(&error),
            "nothing accepts connections at db:5432: driver: refused (os 111)"
        );
    }

    #[test]
    fn every_argument_and_command_has_help() {
        let mut missing = Vec::new();
        walk(&cli(), "rowsync", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    #[test]
    fn every_command_is_in_one_group_of_the_help() {
        let command = cli();
        let mut grouped: Vec<&str> = COMMAND_GROUPS
            .iter()
            .flat_map(|(_, names)| names.iter().copied())
            .collect();
        grouped.sort_unstable();
        let mut commands: Vec<&str> = command
            .get_subcommands()
            .map(clap::Command::get_name)
            .filter(|name| *name != "help")
            .collect();
        commands.sort_unstable();
        assert_eq!(grouped, commands);
        let help = command.clone().render_help().to_string();
        for word in ["seed-003", "white paper", "Tests 1-5"] {
            assert!(!help.contains(word), "{help}");
        }
    }

    #[test]
    fn serve_help_is_short_and_help_all_is_whole() {
        let short = serve_help(&[]);
        assert!(short.lines().count() <= 50, "{short}");
        assert!(short.contains("--help-all") && short.contains("docs/rowsync.example.toml"));
        let all = serve_help(&["--help-all"]);
        for option in ["--held-upload-expiry-seconds", "--jwt-issuer", "--workers"] {
            assert!(all.contains(option), "{option}: {all}");
            assert_eq!(short.contains(option), option == "--workers", "{option}");
        }
    }

    /// `rowsync serve --help` and `EXTRA`, as the program prints it.
    fn serve_help(extra: &[&str]) -> String {
        let mut argv = vec!["rowsync", "serve", "--help"];
        argv.extend(extra);
        let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
        let command = with_hidden_shown(cli(), &argv);
        let error = command
            .try_get_matches_from(help_all_as_help(argv))
            .err()
            .unwrap();
        assert_eq!(error.kind(), clap::error::ErrorKind::DisplayHelp);
        error.to_string()
    }
}
