//! `rowsync-bench link`, the server-to-database link (issue 20, 4(b)): the seed-003
//! backlog of 240,000 changes applied by one sync through a link of 300 ms round trip
//! (a toxiproxy in front of PostgreSQL, half the latency each way) over 1, 8 and 16
//! apply streams, in commands (applied changes) a second, beside SubscriptionStreams'
//! published figures (SQL Server 2005, other hardware, a 512 kbit/s link of 300 ms).
//!
//! Each stream count also runs with no latency: the difference is what the link costs,
//! the rest is the database's own work, which more streams can only share out over the
//! machine's cores. The sync runs in this process straight on the backend (no client,
//! no network stage): only the database link is measured.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::{
    sync_and_collect, ApplyStreamSettings, Consolidated, ConsolidatedConnection, SyncRequest,
    TableInit,
};
use rowsync_protocol::TableUpload;
use rowsync_testkit::link::{Direction, Toxiproxy};

use crate::apply::{connect, row, TABLE_DDL, USER};

/// SubscriptionStreams at 512 kbit/s and 300 ms (seed 003): streams, commands a second.
pub const SUBSCRIPTION_STREAMS_512K: [(usize, f64); 3] = [(1, 6.86), (8, 40.34), (16, 56.11)];
/// The same at 128 kbit/s.
pub const SUBSCRIPTION_STREAMS_128K: [(usize, f64); 3] = [(1, 5.9), (8, 31.54), (16, 28.01)];

/// What to run.
#[derive(Debug, Clone)]
pub struct DatabaseLinkOptions {
    /// Changes in the backlog (240,000 in the seed).
    pub changes: usize,
    /// Apply stream counts to compare.
    pub streams: Vec<usize>,
    /// The link's round trip, in milliseconds (half each way).
    pub round_trip_ms: u64,
}

impl DatabaseLinkOptions {
    /// The seed's sizes.
    pub fn full() -> DatabaseLinkOptions {
        DatabaseLinkOptions {
            changes: 240_000,
            streams: vec![1, 8, 16],
            round_trip_ms: 300,
        }
    }

    /// CI: seconds.
    pub fn quick() -> DatabaseLinkOptions {
        DatabaseLinkOptions {
            changes: 4_000,
            streams: vec![1, 4],
            round_trip_ms: 40,
        }
    }
}

/// One stream count: the backlog's time through the slow link and with no latency.
#[derive(Debug, Clone)]
pub struct DatabaseLinkResult {
    pub streams: usize,
    pub changes: usize,
    pub slow: Duration,
    pub fast: Duration,
}

impl DatabaseLinkResult {
    pub fn commands_per_second(&self) -> f64 {
        self.changes as f64 / self.slow.as_secs_f64()
    }
}

const TABLE: &str = "link_rows";

/// The proxied URL: `url` with its host and port replaced by `address`.
fn through(url: &str, address: std::net::SocketAddr) -> Result<String> {
    let config: tokio_postgres::Config = url.parse().context("parsing the database URL")?;
    let user = config
        .get_user()
        .context("the database URL names no user")?;
    let password = config
        .get_password()
        .map(|password| format!(":{}", String::from_utf8_lossy(password)))
        .unwrap_or_default();
    let database = config.get_dbname().unwrap_or(user);
    Ok(format!("postgres://{user}{password}@{address}/{database}"))
}

/// The database's TCP address from its URL.
async fn upstream(url: &str) -> Result<std::net::SocketAddr> {
    let config: tokio_postgres::Config = url.parse().context("parsing the database URL")?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => bail!("bench-link needs a TCP host in the database URL"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let mut addresses = tokio::net::lookup_host((host.as_str(), port)).await?;
    let address = addresses.next();
    address.with_context(|| format!("{host} has no address"))
}

/// Runs the study on the PostgreSQL database at `url` (a scratch database: its table
/// `link_rows` is made afresh) and prints its table to `out`.
pub async fn run(
    url: &str,
    options: &DatabaseLinkOptions,
    out: &mut dyn Write,
) -> Result<Vec<DatabaseLinkResult>> {
    if options.changes == 0 || options.streams.contains(&0) {
        bail!("the backlog and every stream count must be at least 1");
    }
    let admin = connect(url).await?;
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {TABLE}; DROP TABLE IF EXISTS rs_deleted_{TABLE} CASCADE;
             CREATE TABLE {TABLE} {TABLE_DDL};"
        ))
        .await?;
    let mut setup = PostgresConsolidated::new(url).connect().await?;
    setup.install_system_tables().await?;
    setup
        .init_table(&TableInit {
            table: TABLE.into(),
            partition_column: "owner".into(),
            script_version: Some("link".into()),
            based_on: None,
        })
        .await?;
    // Each run's clients upload their first sequence: earlier runs' subscriptions go.
    admin
        .execute(
            "DELETE FROM rs_subscription WHERE script_version = 'link'",
            &[],
        )
        .await?;
    let upstream = upstream(url).await?;
    let link = Toxiproxy::start()
        .and_then(|server| server.proxy(upstream))
        .map_err(|error| anyhow::anyhow!("toxiproxy: {error}"))?;
    let proxied = through(url, link.addr())?;
    writeln!(
        out,
        "bench-link, database link: {} changes in one sync, round trip {} ms",
        options.changes, options.round_trip_ms
    )?;
    let mut results = Vec::new();
    for &streams in &options.streams {
        let mut timed = [Duration::ZERO; 2];
        for (slot, latency) in [(0, options.round_trip_ms / 2), (1, 0)] {
            for direction in Direction::BOTH {
                if latency > 0 {
                    link.set_latency(direction, latency)
                } else {
                    link.remove("latency", direction)
                }
                .map_err(|error| anyhow::anyhow!("toxiproxy: {error}"))?;
            }
            admin.batch_execute(&format!("TRUNCATE {TABLE}")).await?;
            timed[slot] = apply_backlog(&proxied, streams, options.changes, slot).await?;
            let landed: i64 = admin
                .query_one(&format!("SELECT count(*) FROM {TABLE} WHERE id > 0"), &[])
                .await?
                .get(0);
            if landed != options.changes as i64 {
                bail!(
                    "{streams} streams: {landed} rows landed of {}",
                    options.changes
                );
            }
        }
        let result = DatabaseLinkResult {
            streams,
            changes: options.changes,
            slow: timed[0],
            fast: timed[1],
        };
        writeln!(
            out,
            "  {streams:>2} streams: {:>8.2} s at {} ms ({:>9.1} commands/s), {:>7.2} s with no latency",
            result.slow.as_secs_f64(),
            options.round_trip_ms,
            result.commands_per_second(),
            result.fast.as_secs_f64()
        )?;
        results.push(result);
    }
    Ok(results)
}

/// One sync of the whole backlog over `streams` apply streams, on a fresh backend whose
/// stream connections were opened (and statements prepared) by a small sync first, as
/// a running server's are: returns the backlog's time.
async fn apply_backlog(url: &str, streams: usize, changes: usize, run: usize) -> Result<Duration> {
    let backend = PostgresConsolidated::with_apply_streams(
        url,
        ApplyStreamSettings {
            streams_max: streams,
            rows_per_stream_min: 1,
            lock_timeout_ms: 600_000,
        },
    );
    let mut connection = backend.connect().await?;
    let warm_ids = -(streams as i64 * 4)..0;
    let client = |name: &str| format!("{name}-{streams}-{run}");
    sync_and_collect(
        &mut connection,
        Arc::new(backlog(&client("warm"), warm_ids)),
    )
    .await
    .context("the warm-up sync")?;
    let request = Arc::new(backlog(&client("backlog"), 1..changes as i64 + 1));
    let started = Instant::now();
    let outcome = sync_and_collect(&mut connection, request)
        .await
        .context("the backlog's sync")?;
    let elapsed = started.elapsed();
    if outcome.summary.rows_uploaded != changes as u64 || outcome.summary.conflicts != 0 {
        bail!("the backlog's sync applied {:?}", outcome.summary);
    }
    Ok(elapsed)
}

/// A client's first upload of inserts of `ids`.
fn backlog(client_id: &str, ids: std::ops::Range<i64>) -> SyncRequest {
    SyncRequest {
        client_id: client_id.into(),
        user: USER.into(),
        script_version: "link".into(),
        last_download_watermark: 0,
        upload_sequence: 1,
        tables: vec![TableUpload {
            table: TABLE.into(),
            columns: crate::apply::COLUMNS.iter().map(|&c| c.into()).collect(),
            key_columns: vec!["id".into()],
            inserts: ids.map(|id| row(id, 0)).collect(),
            updates: Vec::new(),
            deletes: Vec::new(),
        }],
        auth_parameters: Vec::new(),
        client_ids_per_user_max: None,
        transfer_id: None,
        check_identity: false,
        refused_rows_max: 0,
        key_ranges: None,
        sync_tables: Default::default(),
    }
}

/// The results as the Markdown table docs/results/ keeps, SubscriptionStreams beside.
pub fn markdown(options: &DatabaseLinkOptions, results: &[DatabaseLinkResult]) -> String {
    let one = results
        .iter()
        .find(|result| result.streams == 1)
        .map(DatabaseLinkResult::commands_per_second);
    let mut text = format!(
        "| apply streams | time at {rtt} ms (s) | commands/s | vs 1 stream | time with no latency (s) | link's share (s) | SubscriptionStreams 512 kbit/s, {rtt} ms (other hardware) |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n",
        rtt = options.round_trip_ms
    );
    for result in results {
        let published = SUBSCRIPTION_STREAMS_512K
            .iter()
            .find(|(streams, _)| *streams == result.streams)
            .map_or("-".to_string(), |(_, rate)| format!("{rate:.2}"));
        let ratio = one.map_or("-".to_string(), |one| {
            format!("{:.2}x", result.commands_per_second() / one)
        });
        text.push_str(&format!(
            "| {} | {:.2} | {:.0} | {} | {:.2} | {:.2} | {} |\n",
            result.streams,
            result.slow.as_secs_f64(),
            result.commands_per_second(),
            ratio,
            result.fast.as_secs_f64(),
            (result.slow.as_secs_f64() - result.fast.as_secs_f64()).max(0.0),
            published
        ));
    }
    text
}
