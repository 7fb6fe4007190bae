//! The pieces of the `rowsync` command that tests drive directly, and the `--db`
//! parsing every command shares.

pub mod database;
pub mod demo;
pub mod profile;
pub mod replay;
pub mod sync_command;
