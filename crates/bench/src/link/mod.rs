//! `rowsync-bench link`: the seed-003 study (SubscriptionStreams over branch-office
//! links) as rowsync meets it. Each part is a section of its own module, run in turn:
//!
//! - [`client_link`], part (a): the client's link at 512 and 128 kbit/s with 300 ms
//!   of round trip: a backlog of changes from one client, and the same spread over
//!   many clients, with and without compression; time against the wire limit (bytes
//!   on the wire / bandwidth), and what a cut mid-upload costs the retry.
//!
//! The link is a real TCP proxy (toxiproxy, through `rowsync_testkit::link`) between
//! real clients (SQLite files) and a server in this process on an SQLite consolidated
//! database. A section for the server-to-database link adds a module here and a call in
//! [`run`].

pub mod client_link;

use std::io::Write;

use anyhow::{bail, Result};
use rowsync_client::Compression;

/// The seed's backlog: 24 hours of an office's transactions.
pub const FULL_CHANGES: usize = 240_000;
/// CI's size: seconds, not minutes, at the seed's bandwidths.
pub const QUICK_CHANGES: usize = 240;

/// What `rowsync-bench link` runs.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// Changes in the backlog (all clients together).
    pub changes: usize,
    /// Link bandwidths, kbit/s (each a multiple of 8 per client sharing it).
    pub kbits: Vec<u64>,
    /// Round-trip latency, ms (half in each direction).
    pub round_trip_ms: u64,
    pub compressions: Vec<Compression>,
    /// Client counts the backlog is spread over (1: one client).
    pub spreads: Vec<usize>,
    /// Also cut a one-client upload at these fractions of its bytes (0 < f < 1) and
    /// measure the retry.
    pub cuts: Vec<f64>,
    /// The clients' transport over the link: plain TCP, or HTTP (one POST per sync).
    pub http: bool,
}

impl LinkOptions {
    /// `quick` (CI) or `full` (the seed's 240,000 changes; by hand).
    pub fn sized(size: &str) -> Result<LinkOptions> {
        let changes = match size {
            "quick" => QUICK_CHANGES,
            "full" => FULL_CHANGES,
            other => bail!("unknown size {other:?}: quick or full"),
        };
        Ok(LinkOptions {
            changes,
            kbits: vec![512, 128],
            round_trip_ms: 300,
            compressions: vec![Compression::None, Compression::Zstd],
            spreads: vec![1, if size == "quick" { 4 } else { 16 }],
            cuts: vec![0.5, 0.99],
            http: false,
        })
    }

    pub fn check(&self) -> Result<()> {
        if self.changes == 0 || self.kbits.is_empty() || self.spreads.is_empty() {
            bail!("bench-link needs changes, at least one bandwidth and one client count");
        }
        for &kbit in &self.kbits {
            for &clients in &self.spreads {
                if clients == 0 || !self.changes.is_multiple_of(clients) {
                    bail!(
                        "{} changes do not spread evenly over {clients} clients",
                        self.changes
                    );
                }
                if !kbit.is_multiple_of(8 * clients as u64) {
                    bail!(
                        "{kbit} kbit/s shared by {clients} clients is not a multiple of 8 kbit/s \
                         each (toxiproxy's unit is 1,000 bytes a second)"
                    );
                }
            }
        }
        if self.cuts.iter().any(|&f| !(f > 0.0 && f < 1.0)) {
            bail!("cuts are fractions of the upload, between 0 and 1");
        }
        Ok(())
    }
}

/// Every section's measurements.
#[derive(Debug)]
pub struct LinkResults {
    pub client: client_link::ClientLinkResults,
}

/// Runs every section and prints its tables.
pub async fn run(options: &LinkOptions, out: &mut dyn Write) -> Result<LinkResults> {
    options.check()?;
    let client = client_link::run(options, out).await?;
    Ok(LinkResults { client })
}
