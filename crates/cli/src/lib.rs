//! The pieces of the `rowsync` command that tests drive directly, the `--db` parsing
//! every command shares, and what the benchmarks (`rowsync-bench`, crates/bench) and the
//! TLS tests take from it: test certificates ([`cert`]) and an in-process server
//! ([`local_server`]).

pub mod cert;
pub mod config;
pub mod database;
pub mod demo;
pub mod local_server;
pub mod logging;
pub mod profile;
pub mod replay;
pub mod standby;
pub mod sync_command;
