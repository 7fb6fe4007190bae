//! rowsync's benchmarks, run by this crate's binary `rowsync-bench` (src/main.rs, not
//! the product binary `rowsync`) and by this crate's tests at small sizes.
//!
//! - [`timing`]: `rowsync-bench timing`, the white paper's timing framework (Tests 1-5)
//!   against the server under test as its own `rowsync serve` process.
//! - [`apply`]: `rowsync-bench apply`, each sync type against PostgreSQL's bulk path.
//! - [`load`]: `rowsync-bench load`, worker settings and the connection limit under load.
//! - [`transport`]: `rowsync-bench transport`, every transport x compression.
//! - [`burst`]: a burst of concurrent clients against a `rowsync serve` process on
//!   SQLite, for the server's peak resident memory (`tests/burst.rs`).
//! - [`shared`]: `rowsync-bench shared`, first syncs of one shared table with its rows
//!   read by every sync and read once.
//! - [`store`]: `rowsync-bench store`, the Berkeley DB study on the client store.
//! - [`link`]: `rowsync-bench link`, the seed-003 study over slow, high-latency links.
//! - [`link_database`]: `rowsync-bench link --db`, the server-to-database link over apply
//!   streams.
//!
//! The in-process server they start is `rowsync_cli::local_server` (the demo's too).

// A benchmark reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

pub mod apply;
pub mod burst;
pub mod link;
pub mod link_database;
pub mod load;
pub mod logins;
pub mod shared;
pub mod store;
pub mod timing;
pub mod transport;
