//! `rowsync`: parses the command line and calls into the crates. Nothing else.

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use rowsync_cli::demo;
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_server::{auth, ServerConfig};

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

#[derive(Subcommand)]
enum Command {
    /// Run the sync server.
    Serve {
        /// The consolidated database: a SQLite file path or a postgres:// URL.
        #[arg(long)]
        db: String,
        #[arg(long, default_value = "127.0.0.1:2439")]
        listen: SocketAddr,
        /// Database workers (each holds one pooled connection while it works).
        #[arg(long, default_value_t = 4)]
        workers: usize,
        /// Syncs in progress at once; more clients are told busy with a retry hint.
        #[arg(long, default_value_t = 1024)]
        max_connections: usize,
        /// Largest frame accepted, in bytes.
        #[arg(long, default_value_t = rowsync_protocol::FRAME_BYTES_MAX_DEFAULT)]
        frame_bytes_max: usize,
        /// Largest upload accepted for one sync, in bytes.
        #[arg(long, default_value_t = ServerConfig::default().upload_bytes_max)]
        upload_bytes_max: usize,
        /// Close a connection that sends nothing for this many seconds.
        #[arg(long, default_value_t = 30)]
        read_timeout_seconds: u64,
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
        Command::Demo { .. } | Command::BenchApply { .. } => None,
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
        Command::Serve {
            db,
            listen,
            workers,
            max_connections,
            frame_bytes_max,
            upload_bytes_max,
            read_timeout_seconds,
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
            backend.connect().await?.install_system_tables().await?;
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("binding {listen}"))?;
            let shown = if is_postgres(&db) {
                "a PostgreSQL database"
            } else {
                db.as_str()
            };
            eprintln!("rowsync serving {shown} on {}", listener.local_addr()?);
            let config = ServerConfig {
                connections_max: max_connections,
                workers,
                frame_bytes_max,
                upload_bytes_max,
                read_timeout: Duration::from_secs(read_timeout_seconds),
                cleanup_interval: Duration::from_secs(cleanup_interval_seconds.max(1)),
                tokens,
                ..ServerConfig::default()
            };
            let shutdown = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            rowsync_server::serve(listener, backend, config, shutdown).await?;
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
