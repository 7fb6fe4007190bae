//! `rowsync`: parses the command line and calls into the crates. Nothing else.

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use rowsync_cli::demo;
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_server::tls::{self, KeyKind, TlsFiles};
use rowsync_server::{auth, Endpoint, ServerConfig, Transport};

#[derive(Parser)]
#[command(
    name = "rowsync",
    version,
    about = "Synchronize SQLite clients with a consolidated database"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Sync a client database with a server.
    Sync(rowsync_cli::sync_command::SyncArgs),
    /// Run the sync server.
    Serve {
        /// The consolidated database: a SQLite file path or a postgres:// URL.
        #[arg(long)]
        db: String,
        /// Address of the plain TCP endpoint (tcp:// clients).
        #[arg(long, default_value = "127.0.0.1:2439")]
        listen: SocketAddr,
        /// Also serve TLS (tls:// clients) here; needs --cert and --key.
        #[arg(long)]
        tls_listen: Option<SocketAddr>,
        /// Also serve HTTP/1.1 and HTTP/2 (h2c) here (http:// clients).
        #[arg(long)]
        http_listen: Option<SocketAddr>,
        /// Also serve HTTPS (HTTP/1.1 and HTTP/2 by ALPN) here; needs --cert and --key.
        #[arg(long)]
        https_listen: Option<SocketAddr>,
        /// PEM certificate chain of the TLS and HTTPS endpoints (see `rowsync cert`).
        #[arg(long)]
        cert: Option<PathBuf>,
        /// PEM private key of --cert.
        #[arg(long)]
        key: Option<PathBuf>,
        /// Require TLS and HTTPS clients to present a certificate signed by this CA (PEM).
        #[arg(long)]
        client_ca: Option<PathBuf>,
        /// Database workers (each holds one pooled connection while it works): a fixed
        /// count. Give --workers-min and --workers-max instead to let the server choose.
        #[arg(long, default_value_t = 4, conflicts_with_all = ["workers_min", "workers_max"])]
        workers: usize,
        /// The fewest database workers the server may run (with --workers-max).
        #[arg(long, requires = "workers_max")]
        workers_min: Option<usize>,
        /// The most database workers the server may run (with --workers-min).
        #[arg(long, requires = "workers_min")]
        workers_max: Option<usize>,
        /// Syncs in progress at once; more clients are told busy with a retry hint.
        #[arg(long, default_value_t = 1024)]
        max_connections: usize,
        /// Upload and download bytes all syncs in flight keep in memory; beyond, they go
        /// to temporary files. Default: a quarter of physical memory.
        #[arg(long)]
        cache_bytes_max: Option<usize>,
        /// The whole upload must arrive within this many seconds of connecting.
        #[arg(long, default_value_t = ServerConfig::default().upload_timeout.as_secs())]
        upload_timeout_seconds: u64,
        /// Serve Prometheus metrics (GET /metrics) on this address, e.g. 127.0.0.1:9464.
        #[arg(long)]
        admin_listen: Option<SocketAddr>,
        /// Largest frame accepted, in bytes.
        #[arg(long, default_value_t = rowsync_protocol::FRAME_BYTES_MAX_DEFAULT)]
        frame_bytes_max: usize,
        /// Largest upload accepted for one sync, in bytes.
        #[arg(long, default_value_t = ServerConfig::default().upload_bytes_max)]
        upload_bytes_max: usize,
        /// Close a connection that sends nothing for this many seconds (body read timeout).
        #[arg(long, default_value_t = 30)]
        read_timeout_seconds: u64,
        /// The hello (TCP, TLS) or the request headers (HTTP) must arrive within this.
        #[arg(long, default_value_t = ServerConfig::default().header_read_timeout.as_millis() as u64)]
        header_read_timeout_ms: u64,
        /// A TLS handshake must complete within this.
        #[arg(long, default_value_t = ServerConfig::default().tls_handshake_timeout.as_millis() as u64)]
        tls_handshake_timeout_ms: u64,
        /// Bytes a compressed upload may inflate to, checked while decompressing.
        #[arg(long, default_value_t = ServerConfig::default().decompressed_bytes_max)]
        decompressed_bytes_max: u64,
        /// Remove tombstones every client has passed this often.
        #[arg(long, default_value_t = 300)]
        cleanup_interval_seconds: u64,
        /// Accept HS256 tokens (JWT) signed with the secret in this file.
        #[arg(long)]
        jwt_hs256_secret_file: Option<PathBuf>,
        /// Accept RS256 tokens (JWT) signed for the RSA public key in this PEM file.
        #[arg(long)]
        jwt_rs256_public_key_file: Option<PathBuf>,
        /// Require this `aud` claim in tokens.
        #[arg(long)]
        jwt_audience: Option<String>,
        /// Require this `iss` claim in tokens.
        #[arg(long)]
        jwt_issuer: Option<String>,
    },
    /// Manage the scripts of script versions.
    Script {
        #[command(subcommand)]
        command: ScriptCommand,
    },
    /// Manage script versions.
    Version {
        #[command(subcommand)]
        command: VersionCommand,
    },
    /// Make an existing table synchronizable: change tracking and default scripts.
    Init {
        /// The consolidated database: a SQLite file path or a postgres:// URL.
        #[arg(long)]
        db: String,
        #[arg(long)]
        table: String,
        /// Rows whose value in this column equals a user's name belong to that user.
        #[arg(long)]
        partition_column: String,
        #[arg(long, default_value = "v1")]
        script_version: String,
    },
    /// Remove tombstones every subscribed client has passed (the server also does this
    /// every --cleanup-interval-seconds).
    Cleanup {
        /// The consolidated database: a SQLite file path or a postgres:// URL.
        #[arg(long)]
        db: String,
    },
    /// Write a test certificate authority, a server certificate and a client
    /// certificate (PEM) for the TLS and HTTPS endpoints.
    Cert {
        /// Directory to write ca.pem, server.pem, server-key.pem, client.pem and
        /// client-key.pem into (created if missing).
        #[arg(long)]
        dir: PathBuf,
        /// Host names and IP addresses the server certificate is valid for.
        #[arg(long = "name", default_values_t = ["localhost".to_string(), "127.0.0.1".to_string()])]
        names: Vec<String>,
        /// RSA 2048 keys instead of ECDSA P-256.
        #[arg(long)]
        rsa: bool,
    },
    /// Time a fixed sync workload (download, update, delete, insert) over every
    /// transport x compression, in one run, relative to plain TCP, with the bytes on the
    /// wire. Runs on an embedded SQLite database in a temporary directory.
    BenchTransport {
        /// Rows per sync.
        #[arg(long, default_value_t = 1000)]
        rows: usize,
        /// Times each workload runs per combination (the median is reported).
        #[arg(long, default_value_t = 3)]
        repeat: usize,
    },
    /// Manage users.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Measure uploads (insert, update, delete) and a download through rowsync against
    /// PostgreSQL's own bulk path in the same run. Drops and recreates bench_rows,
    /// bench_raw and their rowsync tables in the database named.
    BenchApply {
        /// A postgres:// URL of a scratch database.
        #[arg(long)]
        db: String,
        #[arg(long, default_value_t = 1_000_000)]
        rows: usize,
    },
    /// The white paper's timing framework: Tests 1-5 (workers, retry delay above the
    /// connection limit, clients, rows per sync, protocols) with the database's own limit
    /// and one-statement-per-row scripts measured in the same run. Drops and recreates
    /// purchase, purchase_raw and bench_server_time in the database named. See
    /// docs/benchmarks.md.
    Bench {
        /// A postgres:// URL of a scratch database.
        #[arg(long)]
        db: String,
        /// quick (CI, under a minute), standard (1,000 clients x 1,000 rows) or paper
        /// (the paper's sizes: 10 million rows per sync type).
        #[arg(long, default_value = "quick")]
        size: String,
        /// Which tests to run, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5")]
        tests: Vec<u8>,
        /// verify (decode and checksum, no local store) or sqlite (real clients, each
        /// with its own SQLite file).
        #[arg(long, default_value = "verify")]
        client_mode: String,
        /// Directory for results.json, report.txt, test*.txt and test*.svg.
        #[arg(long, default_value = "bench-results")]
        results: PathBuf,
        /// Clients per point (where the test does not vary it).
        #[arg(long)]
        clients: Option<usize>,
        /// Rows per sync (where the test does not vary it).
        #[arg(long)]
        rows: Option<usize>,
        /// Sets of simultaneous syncs per sync type (where the test does not vary it).
        #[arg(long)]
        sets: Option<usize>,
        /// Database workers: a count (8) or the controller's range (2-16).
        #[arg(long)]
        workers: Option<String>,
        /// The server's connection limit (Test 2: the low limit).
        #[arg(long)]
        connection_limit: Option<usize>,
        /// Busy clients retry after this fixed delay instead of the server's hint.
        #[arg(long)]
        retry_delay_ms: Option<u64>,
        /// tcp, tls-ecc, tls-rsa, http, https-ecc or https-rsa.
        #[arg(long)]
        transport: Option<String>,
        /// none, zlib or zstd.
        #[arg(long)]
        compression: Option<String>,
        /// Runs per point of Test 1 (best and relative standard deviation).
        #[arg(long)]
        repeat: Option<usize>,
    },
    /// Many clients at once against PostgreSQL: fixed worker counts against the
    /// controller's range (best of --runs, with the relative standard deviation), and
    /// clients above the connection limit against the limit raised. Drops and recreates
    /// bench_rows in the database named.
    BenchLoad {
        /// A postgres:// URL of a scratch database.
        #[arg(long)]
        db: String,
        #[arg(long, default_value_t = 400)]
        clients: usize,
        #[arg(long, default_value_t = 1000)]
        rows_per_client: usize,
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Fixed worker counts to compare, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
        fixed_workers: Vec<usize>,
        #[arg(long, default_value_t = 1)]
        workers_min: usize,
        #[arg(long, default_value_t = 32)]
        workers_max: usize,
        /// The connection limit for the above-the-limit comparison.
        #[arg(long, default_value_t = 50)]
        connections_low: usize,
    },
    /// Run a complete demonstration (embedded SQLite by default, or --db postgres://...).
    Demo {
        /// The consolidated database: a postgres:// URL of a scratch database (the demo
        /// drops and recreates its tables, orders and rs_*, there) or a SQLite file path.
        /// Default: a new SQLite file in the demo's directory.
        #[arg(long)]
        db: Option<String>,
        /// Client databases to create (spread over three users).
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// Rows for the bulk upload and download measurement (0 to skip).
        #[arg(long, default_value_t = 100_000)]
        bulk_rows: usize,
        /// Keep the databases in this directory instead of a temporary one.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum UserCommand {
    /// Add a user, or set the password of an existing one.
    Add {
        /// The consolidated database: a SQLite file path or a postgres:// URL.
        #[arg(long)]
        db: String,
        #[arg(long)]
        name: String,
        /// The password; read from standard input when absent.
        #[arg(long, env = "ROWSYNC_PASSWORD", hide_env_values = true)]
        password: Option<String>,
    },
}

#[derive(clap::Args)]
struct ScriptKey {
    /// The consolidated database: a SQLite file path or a postgres:// URL.
    #[arg(long)]
    db: String,
    #[arg(long)]
    version: String,
    /// The table of a table event; none for connection events.
    #[arg(long, default_value = "")]
    table: String,
    #[arg(long)]
    event: String,
}

#[derive(Subcommand)]
enum ScriptCommand {
    /// List the scripts of one version (or of all).
    List {
        /// The consolidated database: a SQLite file path or a postgres:// URL.
        #[arg(long)]
        db: String,
        #[arg(long)]
        version: Option<String>,
    },
    /// Print one script.
    Show {
        #[command(flatten)]
        key: ScriptKey,
    },
    /// Store a script, read from --file or from standard input.
    Set {
        #[command(flatten)]
        key: ScriptKey,
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Remove a script.
    Remove {
        #[command(flatten)]
        key: ScriptKey,
    },
}

#[derive(Subcommand)]
enum VersionCommand {
    /// Add a script version (or update its description).
    Add {
        /// The consolidated database: a SQLite file path or a postgres:// URL.
        #[arg(long)]
        db: String,
        name: String,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List the script versions.
    List {
        /// The consolidated database: a SQLite file path or a postgres:// URL.
        #[arg(long)]
        db: String,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ROWSYNC_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // A closed log pipe must not matter: by default the subscriber reports its own
        // write errors with eprintln!, which panics on a broken pipe and would take
        // down the sync that was logging.
        .log_internal_errors(false)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(run(cli.command))
}

fn parse_compression(text: &str) -> Result<rowsync_protocol::Compression> {
    Ok(match text {
        "none" => rowsync_protocol::Compression::None,
        "zlib" => rowsync_protocol::Compression::Zlib,
        "zstd" => rowsync_protocol::Compression::Zstd,
        other => bail!("unknown compression {other:?}: none, zlib or zstd"),
    })
}

fn is_postgres(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

async fn run(command: Command) -> Result<()> {
    let db = match &command {
        Command::Serve { db, .. }
        | Command::Init { db, .. }
        | Command::Cleanup { db }
        | Command::User {
            command: UserCommand::Add { db, .. },
        }
        | Command::Script {
            command:
                ScriptCommand::List { db, .. }
                | ScriptCommand::Show {
                    key: ScriptKey { db, .. },
                }
                | ScriptCommand::Set {
                    key: ScriptKey { db, .. },
                    ..
                }
                | ScriptCommand::Remove {
                    key: ScriptKey { db, .. },
                },
        }
        | Command::Version {
            command: VersionCommand::Add { db, .. } | VersionCommand::List { db },
        } => Some(db.clone()),
        Command::Demo { .. }
        | Command::Sync(_)
        | Command::BenchApply { .. }
        | Command::BenchLoad { .. }
        | Command::Bench { .. }
        | Command::Cert { .. }
        | Command::BenchTransport { .. } => None,
    };
    match db {
        Some(db) if is_postgres(&db) => run_with(command, PostgresConsolidated::new(db)).await,
        Some(db) => run_with(command, SqliteConsolidated::new(PathBuf::from(db))).await,
        None => run_with(command, SqliteConsolidated::new("unused.db")).await,
    }
}

/// Runs a command against one backend (`--db` chose it).
async fn run_with<B: Consolidated>(command: Command, backend: B) -> Result<()> {
    match command {
        Command::Sync(args) => {
            let exit = rowsync_cli::sync_command::run(args).await?;
            std::process::exit(exit.code().into())
        }
        Command::Serve {
            db,
            listen,
            tls_listen,
            http_listen,
            https_listen,
            cert,
            key,
            client_ca,
            workers,
            workers_min,
            workers_max,
            max_connections,
            cache_bytes_max,
            upload_timeout_seconds,
            admin_listen,
            frame_bytes_max,
            upload_bytes_max,
            read_timeout_seconds,
            header_read_timeout_ms,
            tls_handshake_timeout_ms,
            decompressed_bytes_max,
            cleanup_interval_seconds,
            jwt_hs256_secret_file,
            jwt_rs256_public_key_file,
            jwt_audience,
            jwt_issuer,
        } => {
            let read = |path: Option<PathBuf>| -> Result<Option<Vec<u8>>> {
                path.map(|path| {
                    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
                })
                .transpose()
            };
            // A secret file written by `echo` ends with a newline that is not the secret's.
            let secret = read(jwt_hs256_secret_file)?.map(|mut secret| {
                while secret
                    .last()
                    .is_some_and(|byte| matches!(byte, b'\n' | b'\r'))
                {
                    secret.pop();
                }
                secret
            });
            let tokens = rowsync_server::TokenConfig {
                hs256_secret: secret,
                rs256_public_key_pem: read(jwt_rs256_public_key_file)?,
                audience: jwt_audience,
                issuer: jwt_issuer,
                leeway_seconds: 30,
            };
            if workers == 0 || max_connections == 0 {
                bail!("--workers and --max-connections must be at least 1");
            }
            let workers_range = match (workers_min, workers_max) {
                (Some(min), Some(max)) if min >= 1 && min <= max => Some((min, max)),
                (Some(_), Some(_)) => {
                    bail!("--workers-min must be at least 1 and at most --workers-max")
                }
                _ => None,
            };
            let tls_files = match (cert, key) {
                (Some(cert_chain), Some(private_key)) => Some(TlsFiles {
                    cert_chain,
                    private_key,
                    client_ca,
                }),
                (None, None) => {
                    if client_ca.is_some() {
                        bail!("--client-ca needs --cert and --key");
                    }
                    None
                }
                _ => bail!("--cert and --key go together"),
            };
            let mut wanted = vec![(listen, "tcp")];
            wanted.extend(tls_listen.map(|address| (address, "tls")));
            wanted.extend(http_listen.map(|address| (address, "http")));
            wanted.extend(https_listen.map(|address| (address, "https")));
            let mut endpoints = Vec::new();
            let mut shown_endpoints = Vec::new();
            for (address, kind) in wanted {
                let transport = match kind {
                    "tcp" => Transport::Tcp,
                    "http" => Transport::Http,
                    _ => {
                        let Some(files) = &tls_files else {
                            bail!("--{kind}-listen needs --cert and --key (make a test pair with `rowsync cert`)");
                        };
                        let alpn: &[&[u8]] = if kind == "tls" {
                            &[tls::ALPN_ROWSYNC]
                        } else {
                            &tls::ALPN_HTTP
                        };
                        let config = tls::server_config(files, alpn)?;
                        if kind == "tls" {
                            Transport::Tls(config)
                        } else {
                            Transport::Https(config)
                        }
                    }
                };
                let listener = tokio::net::TcpListener::bind(address)
                    .await
                    .with_context(|| format!("binding {address}"))?;
                shown_endpoints.push(format!("{kind}://{}", listener.local_addr()?));
                endpoints.push(Endpoint {
                    listener,
                    transport,
                });
            }
            backend.connect().await?.install_system_tables().await?;
            let shown = if is_postgres(&db) {
                "a PostgreSQL database"
            } else {
                db.as_str()
            };
            eprintln!("rowsync serving {shown} on {}", shown_endpoints.join(" "));
            let defaults = ServerConfig::default();
            let config = ServerConfig {
                connections_max: max_connections,
                workers,
                workers_range,
                cache_bytes_max: cache_bytes_max.unwrap_or(defaults.cache_bytes_max),
                upload_timeout: Duration::from_secs(upload_timeout_seconds),
                frame_bytes_max,
                upload_bytes_max,
                read_timeout: Duration::from_secs(read_timeout_seconds),
                header_read_timeout: Duration::from_millis(header_read_timeout_ms),
                tls_handshake_timeout: Duration::from_millis(tls_handshake_timeout_ms),
                decompressed_bytes_max,
                cleanup_interval: Duration::from_secs(cleanup_interval_seconds.max(1)),
                tokens,
                ..ServerConfig::default()
            };
            let metrics = Arc::new(rowsync_server::metrics::Metrics::new());
            if let Some(address) = admin_listen {
                let listener = tokio::net::TcpListener::bind(address)
                    .await
                    .with_context(|| format!("binding the admin endpoint {address}"))?;
                eprintln!(
                    "rowsync metrics on http://{}/metrics",
                    listener.local_addr()?
                );
                let metrics = Arc::clone(&metrics);
                tokio::spawn(async move {
                    let shutdown = async {
                        let _ = tokio::signal::ctrl_c().await;
                    };
                    if let Err(error) =
                        rowsync_server::admin::serve_admin(listener, metrics, shutdown).await
                    {
                        tracing::error!(%error, "the admin endpoint stopped");
                    }
                });
            }
            let shutdown = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            rowsync_server::serve_endpoints_with_metrics(
                endpoints, backend, config, metrics, shutdown,
            )
            .await?;
            Ok(())
        }
        Command::Cert { dir, names, rsa } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let kind = if rsa {
                KeyKind::Rsa2048
            } else {
                KeyKind::EcdsaP256
            };
            let files = tls::write_test_pki(&dir, &names, kind)?;
            println!(
                "CA certificate (clients trust it through TlsOptions::ca_file): {}",
                files.ca_cert.display()
            );
            println!(
                "server certificate for {}: {} (key {})",
                names.join(", "),
                files.server_cert.display(),
                files.server_key.display()
            );
            println!(
                "client certificate: {} (key {})",
                files.client_cert.display(),
                files.client_key.display()
            );
            Ok(())
        }
        Command::BenchTransport { rows, repeat } => {
            if rows == 0 || repeat == 0 {
                bail!("--rows and --repeat must be at least 1");
            }
            rowsync_cli::bench_transport::run(rows, repeat, &mut std::io::stdout()).await?;
            Ok(())
        }
        Command::Init {
            db: _,
            table,
            partition_column,
            script_version,
        } => {
            let mut connection = backend.connect().await?;
            connection.install_system_tables().await?;
            connection
                .init_table(&TableInit {
                    table: table.clone(),
                    partition_column,
                    script_version: script_version.clone(),
                })
                .await?;
            println!("table {table} is synchronized by script version {script_version}");
            Ok(())
        }
        Command::User {
            command:
                UserCommand::Add {
                    db: _,
                    name,
                    password,
                },
        } => {
            let password = match password {
                Some(password) => password,
                None => {
                    let mut input = String::new();
                    std::io::stdin()
                        .read_to_string(&mut input)
                        .context("reading the password from stdin")?;
                    input.trim_end_matches(['\r', '\n']).to_string()
                }
            };
            if password.is_empty() {
                bail!("the password must not be empty");
            }
            let hash = auth::hash_password(&password)
                .map_err(|error| anyhow::anyhow!("hashing: {error}"))?;
            let mut connection = backend.connect().await?;
            connection.install_system_tables().await?;
            connection.set_user(&name, &hash).await?;
            println!("user {name} saved");
            Ok(())
        }
        Command::Script { command } => script_command(command, backend).await,
        Command::Version { command } => {
            let mut connection = backend.connect().await?;
            connection.install_system_tables().await?;
            match command {
                VersionCommand::Add {
                    db: _,
                    name,
                    description,
                } => {
                    connection.add_script_version(&name, &description).await?;
                    println!("script version {name} saved");
                }
                VersionCommand::List { db: _ } => {
                    for (name, description) in connection.script_versions().await? {
                        println!("{name}\t{description}");
                    }
                }
            }
            Ok(())
        }
        Command::Cleanup { db: _ } => {
            let removed = backend.connect().await?.cleanup().await?;
            println!("{removed} tombstones removed");
            Ok(())
        }
        Command::BenchApply { db, rows } => {
            if !is_postgres(&db) {
                bail!("bench-apply measures PostgreSQL: give --db postgres://...");
            }
            rowsync_cli::bench_apply::run(&db, rows, &mut std::io::stdout()).await?;
            Ok(())
        }
        Command::Bench {
            db,
            size,
            tests,
            client_mode,
            results,
            clients,
            rows,
            sets,
            workers,
            connection_limit,
            retry_delay_ms,
            transport,
            compression,
            repeat,
        } => {
            use rowsync_cli::bench::{
                self, clients::ClientMode, clients::Retry, server::Protocol, server::Workers,
            };
            if !is_postgres(&db) {
                bail!("bench measures PostgreSQL (and its own bulk path beside rowsync): give --db postgres://...");
            }
            let workers = workers
                .map(|text| -> Result<Workers> {
                    Ok(match text.split_once('-') {
                        Some((min, max)) => Workers::Auto(min.trim().parse()?, max.trim().parse()?),
                        None => Workers::Fixed(text.trim().parse()?),
                    })
                })
                .transpose()
                .context("--workers takes a count (8) or a range (2-16)")?;
            let options = bench::BenchOptions {
                db,
                server_program: std::env::current_exe()
                    .context("locating the rowsync executable")?,
                size: bench::Size::parse(&size)?,
                tests,
                client_mode: match client_mode.as_str() {
                    "verify" => ClientMode::Verify,
                    "sqlite" => ClientMode::Sqlite,
                    other => bail!("unknown client mode {other:?}: verify or sqlite"),
                },
                results_dir: results,
                clients,
                rows,
                sets,
                workers,
                connections_max: connection_limit,
                retry: retry_delay_ms.map(|ms| Retry::Fixed(std::time::Duration::from_millis(ms))),
                protocol: transport.as_deref().map(Protocol::parse).transpose()?,
                compression: compression.as_deref().map(parse_compression).transpose()?,
                repeat,
            };
            bench::run(options, &mut std::io::stdout()).await?;
            Ok(())
        }
        Command::BenchLoad {
            db,
            clients,
            rows_per_client,
            runs,
            fixed_workers,
            workers_min,
            workers_max,
            connections_low,
        } => {
            if !is_postgres(&db) {
                bail!("bench-load measures PostgreSQL: give --db postgres://...");
            }
            let options = rowsync_cli::bench_load::LoadOptions {
                clients,
                rows_per_client,
                runs,
                fixed_workers,
                workers_range: (workers_min, workers_max),
                connections_low,
            };
            rowsync_cli::bench_load::run(&db, &options, &mut std::io::stdout()).await?;
            Ok(())
        }
        Command::Demo {
            db,
            clients,
            bulk_rows,
            dir,
        } => {
            let report = demo::run(demo::DemoOptions {
                db,
                clients,
                bulk_rows,
                dir,
                out: Box::new(std::io::stdout()),
            })
            .await?;
            if !report.agreement {
                bail!("the clients do not agree with the consolidated database");
            }
            Ok(())
        }
    }
}

async fn script_command<B: Consolidated>(command: ScriptCommand, backend: B) -> Result<()> {
    let mut connection = backend.connect().await?;
    connection.install_system_tables().await?;
    match command {
        ScriptCommand::List { db: _, version } => {
            for entry in connection.scripts(version.as_deref()).await? {
                let table = if entry.table.is_empty() {
                    "(connection)"
                } else {
                    entry.table.as_str()
                };
                let first_line = entry.script.lines().next().unwrap_or("");
                println!(
                    "{}\t{table}\t{}\t{first_line}",
                    entry.script_version, entry.event
                );
            }
        }
        ScriptCommand::Show { key } => {
            let found = connection
                .scripts(Some(&key.version))
                .await?
                .into_iter()
                .find(|entry| entry.table == key.table && entry.event == key.event);
            match found {
                Some(entry) => println!("{}", entry.script),
                None => bail!(
                    "script version {:?} has no {} script{}",
                    key.version,
                    key.event,
                    table_suffix(&key.table)
                ),
            }
        }
        ScriptCommand::Set { key, file } => {
            rowsync_consolidated::scripts::check_event(&key.table, &key.event)
                .map_err(anyhow::Error::msg)?;
            let script = match file {
                Some(path) => std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?,
                None => {
                    let mut input = String::new();
                    std::io::stdin()
                        .read_to_string(&mut input)
                        .context("reading the script from stdin")?;
                    input
                }
            };
            let script = script.trim().to_string();
            if script.is_empty() {
                bail!("the script is empty");
            }
            connection
                .set_script(&rowsync_consolidated::ScriptEntry {
                    script_version: key.version.clone(),
                    table: key.table.clone(),
                    event: key.event.clone(),
                    script,
                })
                .await?;
            println!(
                "{} script{} of version {} saved",
                key.event,
                table_suffix(&key.table),
                key.version
            );
        }
        ScriptCommand::Remove { key } => {
            if !connection
                .remove_script(&key.version, &key.table, &key.event)
                .await?
            {
                bail!(
                    "script version {:?} has no {} script{}",
                    key.version,
                    key.event,
                    table_suffix(&key.table)
                );
            }
            println!("{} script{} removed", key.event, table_suffix(&key.table));
        }
    }
    Ok(())
}

fn table_suffix(table: &str) -> String {
    if table.is_empty() {
        String::new()
    } else {
        format!(" for table {table}")
    }
}
