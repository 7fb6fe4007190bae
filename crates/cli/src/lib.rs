//! The pieces of the `rowsync` command that tests drive directly.

pub mod bench;
pub mod bench_apply;
pub mod bench_load;
pub mod bench_transport;
pub mod demo;
pub mod local_server;
pub mod sync_command;
