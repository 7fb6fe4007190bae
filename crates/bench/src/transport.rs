//! `rowsync-bench transport`: the same sync workload over every transport x compression
//! in one run (MobiLink white paper, Test 5, Tables 12-16): a download, an update, a
//! delete and an insert of `rows` rows each, timed at the client (connection, TLS
//! handshake, transfer, server work and the client's SQLite work included), reported
//! relative to plain TCP without compression, with the bytes on the wire.
//!
//! Every combination has its own user (so its own partition) and client database on one
//! server that listens on all endpoints at once; repetitions are interleaved across the
//! combinations so drift in the machine's speed touches them all alike, and each phase
//! reports its median.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rowsync_cli::cert::{self, KeyKind, PkiFiles};
use rowsync_client::{Client, Compression, HttpVersion, SyncOptions, WireBytes};
use rowsync_consolidated::sqlite::{SqliteConnection, SqliteConsolidated};
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_server::tls::{self, TlsFiles};
use rowsync_server::{auth, Endpoint, ServerConfig, Transport};
use tokio::sync::oneshot;

pub(crate) const TABLE_DDL: &str =
    "CREATE TABLE bench_rows (id TEXT PRIMARY KEY, owner TEXT NOT NULL, \
     name TEXT NOT NULL, quantity INTEGER NOT NULL, note TEXT NOT NULL)";
/// The phases, in the paper's column order.
pub const PHASES: [&str; 4] = ["download", "update", "delete", "insert"];

/// A transport as the paper names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Tcp,
    TlsEcc,
    TlsRsa,
    Http,
    HttpsEcc,
    HttpsRsa,
}

impl Link {
    pub const ALL: [Link; 6] = [
        Link::Tcp,
        Link::TlsEcc,
        Link::TlsRsa,
        Link::Http,
        Link::HttpsEcc,
        Link::HttpsRsa,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Link::Tcp => "TCP",
            Link::TlsEcc => "TLS:ECC",
            Link::TlsRsa => "TLS:RSA",
            Link::Http => "HTTP",
            Link::HttpsEcc => "HTTPS:ECC",
            Link::HttpsRsa => "HTTPS:RSA",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Measurement {
    pub link: Link,
    pub compression: Compression,
    /// Median time of each phase, in [`PHASES`] order.
    pub times: [Duration; 4],
    /// Bytes on the wire for the four syncs of the first repetition.
    pub wire: WireBytes,
}

impl Measurement {
    pub fn label(&self) -> String {
        match self.compression {
            Compression::None => self.link.label().to_string(),
            other => format!("{} + {other}", self.link.label()),
        }
    }
}

const WORDS: [&str; 16] = [
    "north", "south", "east", "west", "red", "blue", "small", "large", "steel", "oak", "lamp",
    "desk", "chair", "shelf", "crate", "valve",
];

/// A row's text: about 92 bytes a row as in the paper, words that repeat as in real
/// data plus a token that does not, so compression sees ordinary data.
fn row_text(n: usize, generation: u64) -> (String, String) {
    let mut state = (n as u64 ^ generation.rotate_left(32))
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let name = format!(
        "{} {} {}",
        WORDS[next() as usize % 16],
        WORDS[next() as usize % 16],
        WORDS[next() as usize % 16]
    );
    let note = format!(
        "lot {:08x} to {} bay {}",
        next(),
        WORDS[next() as usize % 16],
        next() % 100
    );
    (name, note)
}

pub(crate) fn insert_rows(
    connection: &rusqlite::Connection,
    owner: &str,
    prefix: &str,
    rows: usize,
) -> Result<()> {
    let transaction = connection.unchecked_transaction()?;
    {
        let mut insert = transaction.prepare(
            "INSERT INTO bench_rows (id, owner, name, quantity, note) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for n in 0..rows {
            let (name, note) = row_text(n, prefix.len() as u64);
            insert.execute(rusqlite::params![
                format!("{prefix}-{n:06}"),
                owner,
                name,
                (n * 7 % 1000) as i64,
                note,
            ])?;
        }
    }
    transaction.commit()?;
    Ok(())
}

struct Server {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), rowsync_server::ServerError>>,
    urls: Vec<(Link, String)>,
}

async fn start_server(consolidated: &Path, ecc: &PkiFiles, rsa: &PkiFiles) -> Result<Server> {
    let files = |pki: &PkiFiles| TlsFiles {
        cert_chain: pki.server_cert.clone(),
        private_key: pki.server_key.clone(),
        client_ca: None,
    };
    let mut endpoints = Vec::new();
    let mut urls = Vec::new();
    for link in Link::ALL {
        let (transport, scheme) = match link {
            Link::Tcp => (Transport::Tcp, "tcp"),
            Link::TlsEcc => (
                Transport::Tls(tls::server_config(&files(ecc), &[tls::ALPN_ROWSYNC])?),
                "tls",
            ),
            Link::TlsRsa => (
                Transport::Tls(tls::server_config(&files(rsa), &[tls::ALPN_ROWSYNC])?),
                "tls",
            ),
            Link::Http => (Transport::Http, "http"),
            Link::HttpsEcc => (
                Transport::Https(tls::server_config(&files(ecc), &tls::ALPN_HTTP)?),
                "https",
            ),
            Link::HttpsRsa => (
                Transport::Https(tls::server_config(&files(rsa), &tls::ALPN_HTTP)?),
                "https",
            ),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding a loopback port")?;
        let path = if scheme.starts_with("http") {
            "/sync"
        } else {
            ""
        };
        urls.push((link, format!("{scheme}://{}{path}", listener.local_addr()?)));
        endpoints.push(Endpoint {
            listener,
            transport,
        });
    }
    let backend = SqliteConsolidated::new(consolidated);
    let (stop, stopped) = oneshot::channel::<()>();
    let config = ServerConfig {
        connections_max: 64,
        ..ServerConfig::default()
    };
    let task = tokio::spawn(rowsync_server::serve_endpoints(
        endpoints,
        backend,
        config,
        async {
            let _ = stopped.await;
        },
    ));
    Ok(Server { stop, task, urls })
}

struct Subject {
    link: Link,
    compression: Compression,
    user: String,
    client: Client,
    options: SyncOptions,
    times: [Vec<Duration>; 4],
    wire: Option<WireBytes>,
}

fn median(times: &[Duration]) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

/// An SQLite consolidated database at `path` with `bench_rows` (partitioned by `owner`,
/// script version `v1`) initialised, and a connection to administer it.
pub(crate) async fn bench_rows_consolidated(
    path: &Path,
) -> Result<(SqliteConsolidated, SqliteConnection)> {
    rusqlite::Connection::open(path)?.execute_batch(TABLE_DDL)?;
    let backend = SqliteConsolidated::new(path);
    let mut admin = backend.connect().await?;
    admin.install_system_tables().await?;
    admin
        .init_table(&TableInit {
            table: "bench_rows".into(),
            partition_column: "owner".into(),
            script_version: Some("v1".into()),
            based_on: None,
        })
        .await?;
    Ok((backend, admin))
}

/// Runs the workload and prints the table; returns one measurement per combination,
/// links in [`Link::ALL`] order, compressions in [`Compression::ALL`] order.
pub async fn run(rows: usize, repeat: usize, out: &mut dyn Write) -> Result<Vec<Measurement>> {
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let consolidated_path = dir.path().join("consolidated.db");
    let (_, mut admin) = bench_rows_consolidated(&consolidated_path).await?;
    let names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    let ecc_dir = dir.path().join("ecc");
    let rsa_dir = dir.path().join("rsa");
    std::fs::create_dir_all(&ecc_dir)?;
    std::fs::create_dir_all(&rsa_dir)?;
    let ecc = cert::write_test_pki(&ecc_dir, &names, KeyKind::EcdsaP256)?;
    let rsa = cert::write_test_pki(&rsa_dir, &names, KeyKind::Rsa2048)?;
    let server = start_server(&consolidated_path, &ecc, &rsa).await?;

    let password = "bench-transport-password";
    let hash = auth::hash_password(password).map_err(|error| anyhow::anyhow!("{error}"))?;
    let mut subjects = Vec::new();
    for (link, url) in &server.urls {
        for compression in Compression::ALL {
            // Names of one length: user names and keys travel in every row, so every
            // combination moves the same bytes before compression.
            let user = format!("user{:02}", subjects.len());
            admin.set_user(&user, &hash).await?;
            let mut client = Client::open(dir.path().join(format!("{user}.db")))?;
            client.connection().execute_batch(TABLE_DDL)?;
            client.track("bench_rows")?;
            let mut options = SyncOptions::new(url.clone(), user.clone(), password);
            options.transport.compression = compression;
            options.transport.http_version = HttpVersion::Auto;
            options.transport.tls.ca_file = Some(match link {
                Link::TlsRsa | Link::HttpsRsa => rsa.ca_cert.clone(),
                _ => ecc.ca_cert.clone(),
            });
            // Registers the client; not measured.
            client
                .sync(&options)
                .await
                .with_context(|| format!("first sync over {} + {compression}", link.label()))?;
            subjects.push(Subject {
                link: *link,
                compression,
                user,
                client,
                options,
                times: Default::default(),
                wire: None,
            });
        }
    }

    let consolidated = rusqlite::Connection::open(&consolidated_path)?;
    consolidated.busy_timeout(Duration::from_secs(30))?;
    for round in 0..repeat {
        for subject in &mut subjects {
            let mut wire = WireBytes::default();
            // Keys are global: each user's rows carry its name.
            let prefix = format!("{}-down{round}", subject.user);
            insert_rows(&consolidated, &subject.user, &prefix, rows)?;
            for (phase, name) in PHASES.iter().enumerate() {
                let db = subject.client.connection();
                match *name {
                    "download" => {}
                    "update" => {
                        db.execute(
                            "UPDATE bench_rows SET quantity = quantity + 1, note = 'returned: ' || note WHERE id LIKE ?1",
                            [format!("{prefix}-%")],
                        )?;
                    }
                    "delete" => {
                        db.execute(
                            "DELETE FROM bench_rows WHERE id LIKE ?1",
                            [format!("{prefix}-%")],
                        )?;
                    }
                    _ => insert_rows(
                        db,
                        &subject.user,
                        &format!("{}-up{round}", subject.user),
                        rows,
                    )?,
                }
                let report = subject
                    .client
                    .sync(&subject.options)
                    .await
                    .with_context(|| {
                        format!(
                            "{name} sync over {} + {}",
                            subject.link.label(),
                            subject.compression
                        )
                    })?;
                let moved = if *name == "download" {
                    report.rows_downloaded
                } else {
                    report.rows_uploaded
                };
                if moved != rows as u64 {
                    bail!(
                        "{}: the {name} moved {moved} rows, expected {rows}",
                        subject.user
                    );
                }
                subject.times[phase].push(report.elapsed);
                wire.sent += report.wire.sent;
                wire.received += report.wire.received;
            }
            subject.wire.get_or_insert(wire);
        }
    }
    // Every client holds exactly its partition.
    for subject in &subjects {
        let count = |connection: &rusqlite::Connection| -> rusqlite::Result<i64> {
            connection.query_row(
                "SELECT count(*) FROM bench_rows WHERE owner = ?1",
                [&subject.user],
                |row| row.get(0),
            )
        };
        let (client_rows, server_rows) =
            (count(subject.client.connection())?, count(&consolidated)?);
        if client_rows != server_rows || server_rows != (rows * repeat) as i64 {
            bail!(
                "{}: client holds {client_rows} rows, consolidated {server_rows}, expected {}",
                subject.user,
                rows * repeat
            );
        }
    }
    let _ = server.stop.send(());
    server.task.await.context("server task")??;

    let measurements: Vec<Measurement> = subjects
        .iter()
        .map(|subject| Measurement {
            link: subject.link,
            compression: subject.compression,
            times: std::array::from_fn(|phase| median(&subject.times[phase])),
            wire: subject.wire.unwrap_or_default(),
        })
        .collect();
    print_table(&measurements, rows, repeat, out)?;
    Ok(measurements)
}

fn print_table(
    measurements: &[Measurement],
    rows: usize,
    repeat: usize,
    out: &mut dyn Write,
) -> Result<()> {
    let base = &measurements[0];
    writeln!(
        out,
        "sync time relative to plain TCP (median of {repeat}; {rows} rows per sync; TCP = 1.00: \
         download {:.1} ms, update {:.1} ms, delete {:.1} ms, insert {:.1} ms)",
        base.times[0].as_secs_f64() * 1000.0,
        base.times[1].as_secs_f64() * 1000.0,
        base.times[2].as_secs_f64() * 1000.0,
        base.times[3].as_secs_f64() * 1000.0,
    )?;
    writeln!(
        out,
        "{:<20} {:>9} {:>9} {:>9} {:>9}   {:>11} {:>11} {:>8}",
        "protocol", "download", "update", "delete", "insert", "bytes sent", "bytes recv", "vs none"
    )?;
    for measurement in measurements {
        let ratio = |phase: usize| {
            measurement.times[phase].as_secs_f64() / base.times[phase].as_secs_f64().max(1e-9)
        };
        let uncompressed = measurements
            .iter()
            .find(|m| m.link == measurement.link && m.compression == Compression::None)
            .expect("every link has an uncompressed row");
        let total = |wire: &WireBytes| (wire.sent + wire.received) as f64;
        writeln!(
            out,
            "{:<20} {:>9.2} {:>9.2} {:>9.2} {:>9.2}   {:>11} {:>11} {:>8.2}",
            measurement.label(),
            ratio(0),
            ratio(1),
            ratio(2),
            ratio(3),
            measurement.wire.sent,
            measurement.wire.received,
            total(&measurement.wire) / total(&uncompressed.wire).max(1.0),
        )?;
    }
    writeln!(
        out,
        "bytes: both directions of the four syncs on the TCP connection (TLS records and HTTP \
         headers included); vs none = total bytes relative to the same transport uncompressed"
    )?;
    Ok(())
}
