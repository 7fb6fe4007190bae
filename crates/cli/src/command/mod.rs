//! One module per `rowsync` command, each with its arguments (a clap `Args` or
//! `Subcommand` type) and a `run` that does the command. `main.rs` only parses and
//! dispatches.
//!
//! A new command is a new module here and a variant of `main.rs`'s `Command`; the client
//! command `rowsync sync` goes here as `sync.rs`. Commands that take `--db` flatten
//! [`DatabaseArg`](rowsync_cli::database::DatabaseArg) and run through
//! [`Database::run`](rowsync_cli::database::Database::run), which picks the backend.

pub mod cert;
pub mod cleanup;
pub mod config;
pub mod demo;
pub mod init;
pub mod keys;
pub mod profile;
pub mod replay;
pub mod rules;
pub mod schema;
pub mod script;
pub mod serve;
pub mod status;
pub mod user;
pub mod version;
