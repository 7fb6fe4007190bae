//! Part (a) of `rowsync-bench link`: the client's link. A backlog of inserts waits in
//! the clients' databases; all of them sync at once over an emulated link (bandwidth
//! shared evenly by the clients' connections, half the round trip in each direction),
//! timed against the wire limit: bytes on the wire (both directions: a sync's download
//! follows its upload) divided by the bandwidth. The cut rows then cut one client's
//! upload at a fraction of its bytes, and measure the retry that follows.
//!
//! toxiproxy limits the payload of each TCP connection, so the wire limit here counts
//! rowsync's bytes only; a real link also carries TCP/IP headers (about 3% more for
//! full segments).

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rowsync_client::{Client, Compression, SyncOptions, WireBytes};
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection};
use rowsync_server::{auth, ServerConfig};
use rowsync_testkit::link::{Direction, Link, Toxiproxy};

use super::LinkOptions;
use crate::transport::{bench_rows_consolidated, insert_rows, TABLE_DDL};
use rowsync_cli::local_server::LocalServer;

/// A sync over the slow link may take hours at the full size: the client's and the
/// server's upload timeouts are raised to this for the bench (their defaults, 60 s and
/// 600 s, suit a LAN; see docs/operations.md).
const SLOW_LINK_TIMEOUT: Duration = Duration::from_secs(6 * 3600);
const PASSWORD: &str = "bench-link-password";

/// One backlog synchronized over one link.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub kbit: u64,
    pub compression: Compression,
    pub clients: usize,
    pub changes: usize,
    pub elapsed: Duration,
    /// All clients' bytes, as each client counted them on its socket.
    pub wire: WireBytes,
}

impl Measurement {
    /// The time the bytes on the wire need at the link's bandwidth.
    pub fn wire_limit(&self) -> Duration {
        transfer_time(self.wire.sent + self.wire.received, self.kbit)
    }

    /// Measured time over the wire limit (1.0: the link was never idle).
    pub fn ratio(&self) -> f64 {
        self.elapsed.as_secs_f64() / self.wire_limit().as_secs_f64().max(1e-9)
    }
}

/// One client's upload (or download) cut after `cut_at` bytes, then synchronized again.
#[derive(Debug, Clone)]
pub struct CutMeasurement {
    pub kbit: u64,
    pub compression: Compression,
    /// Which way the cut transfer went: `Upstream` an upload, `Downstream` a download.
    pub direction: Direction,
    pub fraction: f64,
    /// Bytes the link let through in the cut direction before it closed the connection.
    pub cut_at: u64,
    /// The same backlog synchronized without a cut.
    pub clean: Measurement,
    /// The retry after the cut.
    pub retry: WireBytes,
    /// Bytes of the transfer's (decompressed) stream kept from the cut attempt (by the
    /// server for an upload, protocol v3; by the client for a download, v4), which the
    /// retry did not send again.
    pub resumed: u64,
    /// The cut attempt and the retry, from the first byte to the end of the retry.
    pub elapsed: Duration,
}

impl CutMeasurement {
    /// Bytes on the wire beyond those of the clean sync. A cut download's attempt sent
    /// what the clean sync sent (its hello and upload) before the cut bytes came down.
    pub fn extra_bytes(&self) -> i64 {
        let clean = self.clean.wire.sent + self.clean.wire.received;
        let cut_attempt = match self.direction {
            Direction::Upstream => self.cut_at,
            Direction::Downstream => self.clean.wire.sent + self.cut_at,
        };
        (cut_attempt + self.retry.sent + self.retry.received) as i64 - clean as i64
    }

    /// "upload" or "download".
    pub fn transfer(&self) -> &'static str {
        match self.direction {
            Direction::Upstream => "upload",
            Direction::Downstream => "download",
        }
    }

    /// Time beyond the clean sync's.
    pub fn extra_time(&self) -> f64 {
        self.elapsed.as_secs_f64() - self.clean.elapsed.as_secs_f64()
    }
}

#[derive(Debug, Default)]
pub struct ClientLinkResults {
    pub backlogs: Vec<Measurement>,
    pub cuts: Vec<CutMeasurement>,
}

/// The time `bytes` take at `kbit` kbit/s.
pub fn transfer_time(bytes: u64, kbit: u64) -> Duration {
    Duration::from_secs_f64(bytes as f64 * 8.0 / (kbit as f64 * 1000.0))
}

/// Bytes in flight on the link: bandwidth x round trip.
pub fn bytes_in_flight(kbit: u64, round_trip_ms: u64) -> u64 {
    kbit * 1000 / 8 * round_trip_ms / 1000
}

struct Bench {
    dir: tempfile::TempDir,
    admin: <SqliteConsolidated as Consolidated>::Connection,
    /// The password hash every client's user shares.
    hash: String,
    server: LocalServer,
    address: SocketAddr,
    /// The endpoint the links lead to: `address`, or the HTTP endpoint.
    upstream: SocketAddr,
    /// `tcp` or `http`: the clients' transport over the links.
    scheme: &'static str,
    toxiproxy: Toxiproxy,
    users: usize,
}

/// Runs part (a) and prints its tables.
pub async fn run(options: &LinkOptions, out: &mut dyn Write) -> Result<ClientLinkResults> {
    let mut bench = Bench::start(options.http).await?;
    let mut results = ClientLinkResults::default();
    for &kbit in &options.kbits {
        for &compression in &options.compressions {
            for &clients in &options.spreads {
                let measurement = bench.backlog(options, kbit, compression, clients).await?;
                // Progress on stderr: a full run takes hours; the tables come at its end.
                eprintln!(
                    "bench-link: {kbit} kbit/s, {compression}, {clients} clients: {:.1} s, \
                     {:.2}x the wire limit",
                    measurement.elapsed.as_secs_f64(),
                    measurement.ratio()
                );
                if clients == 1 {
                    let download = if options.cuts.is_empty() {
                        None
                    } else {
                        Some(bench.clean_download(options, kbit, compression).await?)
                    };
                    for &fraction in &options.cuts {
                        let upload = bench.cut(options, &measurement, fraction).await?;
                        let clean = download.as_ref().expect("measured with cuts");
                        let download = bench.cut_download(options, clean, fraction).await?;
                        for cut in [upload, download] {
                            eprintln!(
                                "bench-link: {} cut at {:.0}%: {} extra bytes, {:.1} s extra",
                                cut.transfer(),
                                fraction * 100.0,
                                cut.extra_bytes(),
                                cut.extra_time()
                            );
                            results.cuts.push(cut);
                        }
                    }
                }
                results.backlogs.push(measurement);
            }
        }
    }
    bench.server.stop().await?;
    print_tables(options, &results, out)?;
    Ok(results)
}

struct Subject {
    client: Client,
    options: SyncOptions,
}

impl Bench {
    async fn start(http: bool) -> Result<Bench> {
        let dir = tempfile::tempdir().context("creating a temporary directory")?;
        let (backend, admin) = bench_rows_consolidated(&dir.path().join("consolidated.db")).await?;
        let hash = auth::hash_password(PASSWORD).map_err(|error| anyhow::anyhow!("{error}"))?;
        let config = ServerConfig {
            upload_timeout: SLOW_LINK_TIMEOUT,
            ..ServerConfig::default()
        };
        let server = LocalServer::start_on(backend, config, http).await?;
        let address = server.address.parse().context("the server's address")?;
        let upstream = match &server.http_address {
            Some(http) => http.parse().context("the server's HTTP address")?,
            None => address,
        };
        let toxiproxy = Toxiproxy::start().map_err(anyhow::Error::msg)?;
        Ok(Bench {
            dir,
            admin,
            hash,
            server,
            address,
            upstream,
            scheme: if http { "http" } else { "tcp" },
            toxiproxy,
            users: 0,
        })
    }

    /// A link to the server: `kbit` shared by `clients` connections, the round trip
    /// split over both directions.
    fn link(&self, options: &LinkOptions, kbit: u64, clients: usize) -> Result<Link> {
        let link = self
            .toxiproxy
            .proxy(self.upstream)
            .map_err(anyhow::Error::msg)?;
        for direction in Direction::BOTH {
            link.set_latency(direction, options.round_trip_ms / 2)
                .and_then(|()| link.set_bandwidth(direction, kbit / clients as u64))
                .map_err(anyhow::Error::msg)?;
        }
        Ok(link)
    }

    /// New clients, registered over the plain loopback, each holding `rows` new rows in
    /// a partition of its own (its own user), so that none downloads another's rows.
    async fn clients(
        &mut self,
        count: usize,
        rows: usize,
        compression: Compression,
    ) -> Result<Vec<Subject>> {
        let mut subjects = Vec::with_capacity(count);
        for _ in 0..count {
            self.users += 1;
            let name = format!("client{:05}", self.users);
            self.admin.set_user(&name, &self.hash).await?;
            let mut client = Client::open(self.dir.path().join(format!("{name}.db")))?;
            client.connection().execute_batch(TABLE_DDL)?;
            client.track("bench_rows")?;
            let mut options = SyncOptions::new(format!("tcp://{}", self.address), &name, PASSWORD);
            options.timeout = SLOW_LINK_TIMEOUT;
            options.transport.compression = compression;
            client
                .sync(&options)
                .await
                .context("registering a client")?;
            // Keys are global: each client's rows carry its name.
            insert_rows(client.connection(), &name, &name, rows)?;
            subjects.push(Subject { client, options });
        }
        Ok(subjects)
    }

    async fn backlog(
        &mut self,
        options: &LinkOptions,
        kbit: u64,
        compression: Compression,
        clients: usize,
    ) -> Result<Measurement> {
        let rows = options.changes / clients;
        let mut subjects = self.clients(clients, rows, compression).await?;
        let link = self.link(options, kbit, clients)?;
        for subject in &mut subjects {
            subject.options.address = self.url(link.addr());
        }
        let started = Instant::now();
        let reports = futures_util::future::join_all(
            subjects
                .iter_mut()
                .map(|subject| subject.client.sync(&subject.options)),
        )
        .await;
        let elapsed = started.elapsed();
        let mut wire = WireBytes::default();
        for report in reports {
            let report =
                report.with_context(|| format!("a sync at {kbit} kbit/s + {compression}"))?;
            if report.rows_uploaded != rows as u64 || report.upload_already_applied {
                bail!(
                    "a client uploaded {} rows, expected {rows}",
                    report.rows_uploaded
                );
            }
            wire.sent += report.wire.sent;
            wire.received += report.wire.received;
        }
        Ok(Measurement {
            kbit,
            compression,
            clients,
            changes: options.changes,
            elapsed,
            wire,
        })
    }

    /// One client's backlog (as `clean`'s), its upload cut at `fraction` of the bytes
    /// `clean` sent, then synchronized again over the same link without the cut.
    async fn cut(
        &mut self,
        options: &LinkOptions,
        clean: &Measurement,
        fraction: f64,
    ) -> Result<CutMeasurement> {
        let mut subjects = self.clients(1, options.changes, clean.compression).await?;
        let subject = &mut subjects[0];
        let link = self.link(options, clean.kbit, 1)?;
        subject.options.address = self.url(link.addr());
        let cut_at = (clean.wire.sent as f64 * fraction) as u64;
        link.cut_after(Direction::Upstream, cut_at)
            .map_err(anyhow::Error::msg)?;
        let started = Instant::now();
        if subject.client.sync(&subject.options).await.is_ok() {
            bail!(
                "a sync cut after {cut_at} of {} bytes completed",
                clean.wire.sent
            );
        }
        link.remove("limit_data", Direction::Upstream)
            .map_err(anyhow::Error::msg)?;
        let report = subject
            .client
            .sync(&subject.options)
            .await
            .context("the retry after a cut")?;
        let elapsed = started.elapsed();
        if report.rows_uploaded != options.changes as u64 || report.upload_already_applied {
            bail!(
                "the retry after a cut uploaded {} rows (already applied: {}), expected {} applied now",
                report.rows_uploaded,
                report.upload_already_applied,
                options.changes
            );
        }
        Ok(CutMeasurement {
            kbit: clean.kbit,
            compression: clean.compression,
            direction: Direction::Upstream,
            fraction,
            cut_at,
            clean: clean.clone(),
            retry: report.wire,
            resumed: report.upload_bytes_resumed,
            elapsed,
        })
    }
}

impl Bench {
    /// The URL of the server through a link at `link` (HTTP's default path).
    fn url(&self, link: SocketAddr) -> String {
        match self.scheme {
            "http" => format!("http://{link}/sync"),
            _ => format!("tcp://{link}"),
        }
    }

    /// A new client of an existing user (its first sync downloads the user's rows),
    /// over `link`.
    fn reader(&mut self, user: &str, compression: Compression, link: &Link) -> Result<Subject> {
        self.users += 1;
        let name = format!("reader{:05}", self.users);
        let client = Client::open(self.dir.path().join(format!("{name}.db")))?;
        client.connection().execute_batch(TABLE_DDL)?;
        let mut client = client;
        client.track("bench_rows")?;
        let mut options = SyncOptions::new(self.url(link.addr()), user, PASSWORD);
        options.timeout = SLOW_LINK_TIMEOUT;
        options.transport.compression = compression;
        Ok(Subject { client, options })
    }

    /// The backlog of one client (uploaded over the loopback), downloaded whole by a
    /// new client of its user over the link: the clean download a cut one is held
    /// against. Returns it with the user.
    async fn clean_download(
        &mut self,
        options: &LinkOptions,
        kbit: u64,
        compression: Compression,
    ) -> Result<(Measurement, String)> {
        let mut subjects = self.clients(1, options.changes, compression).await?;
        let subject = &mut subjects[0];
        subject.client.sync(&subject.options).await?;
        let user = subject.options.user.clone();
        let link = self.link(options, kbit, 1)?;
        let mut reader = self.reader(&user, compression, &link)?;
        let started = Instant::now();
        let report = reader.client.sync(&reader.options).await?;
        if report.rows_downloaded != options.changes as u64 {
            bail!(
                "a new client downloaded {} rows, expected {}",
                report.rows_downloaded,
                options.changes
            );
        }
        let measurement = Measurement {
            kbit,
            compression,
            clients: 1,
            changes: options.changes,
            elapsed: started.elapsed(),
            wire: report.wire,
        };
        Ok((measurement, user))
    }

    /// Another new client of the clean download's user, its download cut at `fraction`
    /// of the bytes the clean one received, then synchronized again without the cut.
    async fn cut_download(
        &mut self,
        options: &LinkOptions,
        (clean, user): &(Measurement, String),
        fraction: f64,
    ) -> Result<CutMeasurement> {
        let link = self.link(options, clean.kbit, 1)?;
        let mut reader = self.reader(user, clean.compression, &link)?;
        let cut_at = (clean.wire.received as f64 * fraction) as u64;
        link.cut_after(Direction::Downstream, cut_at)
            .map_err(anyhow::Error::msg)?;
        let started = Instant::now();
        if reader.client.sync(&reader.options).await.is_ok() {
            bail!(
                "a download cut after {cut_at} of {} bytes completed",
                clean.wire.received
            );
        }
        link.remove("limit_data", Direction::Downstream)
            .map_err(anyhow::Error::msg)?;
        let report = reader
            .client
            .sync(&reader.options)
            .await
            .context("the retry after a download cut")?;
        let elapsed = started.elapsed();
        if report.rows_downloaded != options.changes as u64 {
            bail!(
                "the retry after a download cut applied {} rows, expected {}",
                report.rows_downloaded,
                options.changes
            );
        }
        Ok(CutMeasurement {
            kbit: clean.kbit,
            compression: clean.compression,
            direction: Direction::Downstream,
            fraction,
            cut_at,
            clean: clean.clone(),
            retry: report.wire,
            resumed: report.download_bytes_resumed,
            elapsed,
        })
    }
}

fn print_tables(
    options: &LinkOptions,
    results: &ClientLinkResults,
    out: &mut dyn Write,
) -> Result<()> {
    writeln!(
        out,
        "(a) client link: {} changes, {} ms round trip, over {}; wire limit = bytes on the wire / bandwidth",
        options.changes,
        options.round_trip_ms,
        if options.http { "HTTP" } else { "TCP" }
    )?;
    writeln!(
        out,
        "{:>7} {:<11} {:>7} {:>10} {:>12} {:>12} {:>10} {:>10} {:>8}",
        "kbit/s",
        "compression",
        "clients",
        "time s",
        "bytes up",
        "bytes down",
        "limit s",
        "x limit",
        "chg/s"
    )?;
    for m in &results.backlogs {
        writeln!(
            out,
            "{:>7} {:<11} {:>7} {:>10.1} {:>12} {:>12} {:>10.1} {:>10.2} {:>8.0}",
            m.kbit,
            m.compression.to_string(),
            m.clients,
            m.elapsed.as_secs_f64(),
            m.wire.sent,
            m.wire.received,
            m.wire_limit().as_secs_f64(),
            m.ratio(),
            m.changes as f64 / m.elapsed.as_secs_f64().max(1e-9),
        )?;
    }
    if results.cuts.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\none client's upload or download cut, then synchronized again (bytes in flight: \
         bandwidth x round trip)"
    )?;
    writeln!(
        out,
        "{:>7} {:<11} {:<9} {:>6} {:>12} {:>12} {:>12} {:>10} {:>12} {:>12}",
        "kbit/s",
        "compression",
        "transfer",
        "cut at",
        "cut byte",
        "extra bytes",
        "in flight",
        "extra s",
        "retry bytes",
        "resumed"
    )?;
    for cut in &results.cuts {
        writeln!(
            out,
            "{:>7} {:<11} {:<9} {:>5.0}% {:>12} {:>12} {:>12} {:>10.1} {:>12} {:>12}",
            cut.kbit,
            cut.compression.to_string(),
            cut.transfer(),
            cut.fraction * 100.0,
            cut.cut_at,
            cut.extra_bytes(),
            bytes_in_flight(cut.kbit, options.round_trip_ms),
            cut.extra_time(),
            cut.retry.sent + cut.retry.received,
            cut.resumed,
        )?;
    }
    print_clean_downloads(results, out)
}

/// The clean downloads the download cuts are measured against: a new client's first
/// sync over the link (over HTTP, a download's receipt is part of it).
fn print_clean_downloads(results: &ClientLinkResults, out: &mut dyn Write) -> Result<()> {
    writeln!(
        out,
        "\nclean downloads (a new client's first sync of the backlog over the link)"
    )?;
    writeln!(
        out,
        "{:>7} {:<11} {:>10} {:>12} {:>12}",
        "kbit/s", "compression", "time s", "bytes up", "bytes down"
    )?;
    let mut seen = Vec::new();
    for cut in results
        .cuts
        .iter()
        .filter(|cut| cut.direction == Direction::Downstream)
    {
        let clean = &cut.clean;
        if seen.contains(&(clean.kbit, clean.compression)) {
            continue;
        }
        seen.push((clean.kbit, clean.compression));
        writeln!(
            out,
            "{:>7} {:<11} {:>10.2} {:>12} {:>12}",
            clean.kbit,
            clean.compression.to_string(),
            clean.elapsed.as_secs_f64(),
            clean.wire.sent,
            clean.wire.received,
        )?;
    }
    Ok(())
}
