//! The pieces of the `rowsync` command that tests drive directly.

pub mod demo;
