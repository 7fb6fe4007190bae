//! `rowsync-bench load`: many clients at once against PostgreSQL, to compare worker
//! settings (fixed counts against the controller's range, best of several runs with the
//! relative standard deviation) and the connection limit (clients above it, retrying
//! after the server's hint, against the limit raised), in one run. Each client uploads
//! its own rows (no download) and logs in with a token, so the database's work decides.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use rowsync_client::transport::{exchange, Exchange, TransportOptions};
use rowsync_client::SessionEvent;
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_protocol::FRAME_BYTES_MAX_DEFAULT;
use rowsync_server::{ServerConfig, TokenConfig};

use crate::apply::{chunks, connect, hello, row, TABLE_DDL, USER};
use rowsync_cli::local_server::LocalServer;

const TOKEN_SECRET: &[u8] = b"bench-load secret, thirty-two bytes or more";

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub clients: usize,
    pub rows_per_client: usize,
    pub runs: usize,
    /// Fixed worker counts to compare.
    pub fixed_workers: Vec<usize>,
    /// The controller's range.
    pub workers_range: (usize, usize),
    /// The connection limit below the number of clients.
    pub connections_low: usize,
}

#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub seconds: Vec<f64>,
    pub busy_retries: u64,
}

impl Series {
    pub fn best(&self) -> f64 {
        self.seconds.iter().cloned().fold(f64::INFINITY, f64::min)
    }

    /// Relative standard deviation of the runs, in percent.
    pub fn rsd_percent(&self) -> f64 {
        let n = self.seconds.len() as f64;
        let mean = self.seconds.iter().sum::<f64>() / n;
        let variance = self.seconds.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n;
        100.0 * variance.sqrt() / mean
    }
}

fn token() -> Result<String> {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        sub: &'a str,
        exp: u64,
    }
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs()
        + 24 * 3600;
    Ok(jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &Claims { sub: USER, exp },
        &jsonwebtoken::EncodingKey::from_secret(TOKEN_SECRET),
    )?)
}

/// One run: every client starts at once; returns the seconds until the last finished
/// and the busy answers retried.
async fn run_once(
    url: &str,
    options: &LoadOptions,
    config: ServerConfig,
    frames: &Arc<Vec<Vec<Vec<u8>>>>,
) -> Result<(f64, u64)> {
    let admin = connect(url).await?;
    admin
        .batch_execute(
            "TRUNCATE bench_rows; TRUNCATE rs_deleted_bench_rows; DELETE FROM rs_subscription",
        )
        .await?;
    let backend = PostgresConsolidated::new(url);
    let server = LocalServer::start(backend, config).await?;
    let address = Arc::new(server.address.clone());
    let token = Arc::new(token()?);
    let gate = Arc::new(tokio::sync::Barrier::new(options.clients + 1));
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..options.clients {
        let (address, token, gate, frames) = (
            Arc::clone(&address),
            Arc::clone(&token),
            Arc::clone(&gate),
            Arc::clone(frames),
        );
        tasks.spawn(async move {
            let mut hello = hello(&format!("load-{client}"), i64::MAX / 2);
            hello.user = String::new();
            hello.password = String::new();
            hello.token = token.to_string();
            gate.wait().await;
            let mut retries = 0u64;
            loop {
                let exchanged = exchange(Exchange {
                    address: &address,
                    transport: &TransportOptions::default(),
                    hello: hello.clone(),
                    upload_frames: &frames[client],
                    upload_sequence: 1,
                    frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
                    timeout: Duration::from_secs(600),
                    acknowledge: None,
                    transfer: None,
                    download_resume: None,
                    key_ranges: &[],
                })
                .await;
                // A refused client that is still sending when the server gives up
                // draining it sees a reset instead of the busy answer (the server is
                // at its limit either way): retry like busy. Safe: an upload is
                // applied at most once whatever happens.
                let event = match exchanged {
                    Err(rowsync_client::ClientError::Io(error))
                        if error.kind() == std::io::ErrorKind::ConnectionReset =>
                    {
                        SessionEvent::Busy {
                            retry_after_ms: 100,
                        }
                    }
                    other => other?,
                };
                match event {
                    SessionEvent::Complete(_) => return Ok::<u64, anyhow::Error>(retries),
                    SessionEvent::Busy { retry_after_ms } => {
                        retries += 1;
                        let jitter = 0.5 * rand::random::<f64>();
                        let wait = f64::from(retry_after_ms) * (1.0 + jitter);
                        tokio::time::sleep(Duration::from_secs_f64(wait / 1000.0)).await;
                    }
                    other => bail!("client {client}: {other:?}"),
                }
            }
        });
    }
    gate.wait().await;
    let started = Instant::now();
    let mut retries = 0;
    while let Some(joined) = tasks.join_next().await {
        retries += joined??;
    }
    let seconds = started.elapsed().as_secs_f64();
    server.stop().await?;
    let count: i64 = admin
        .query_one("SELECT count(*) FROM bench_rows", &[])
        .await?
        .get(0);
    let expected = (options.clients * options.rows_per_client) as i64;
    if count != expected {
        bail!("bench_rows holds {count} rows after the run, expected {expected}");
    }
    Ok((seconds, retries))
}

pub async fn run(url: &str, options: &LoadOptions, out: &mut dyn Write) -> Result<Vec<Series>> {
    if options.clients == 0 || options.rows_per_client == 0 || options.runs == 0 {
        bail!("--clients, --rows-per-client and --runs must be at least 1");
    }
    let admin = connect(url).await?;
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS bench_rows; DROP TABLE IF EXISTS rs_deleted_bench_rows CASCADE;
             CREATE TABLE bench_rows {TABLE_DDL};"
        ))
        .await?;
    let backend = PostgresConsolidated::new(url);
    let mut connection = backend.connect().await?;
    connection.install_system_tables().await?;
    connection
        .init_table(&TableInit {
            table: "bench_rows".into(),
            partition_column: "owner".into(),
            script_version: Some("bench".into()),
            based_on: None,
        })
        .await?;
    let frames: Arc<Vec<Vec<Vec<u8>>>> = Arc::new(
        (0..options.clients)
            .map(|client| {
                let first = (client * options.rows_per_client) as i64;
                chunks(
                    (first..first + options.rows_per_client as i64)
                        .map(|id| (Some(row(id, 0)), None, None)),
                )
            })
            .collect(),
    );
    let base = ServerConfig {
        connections_max: options.clients,
        tokens: TokenConfig {
            hs256_secret: Some(TOKEN_SECRET.to_vec()),
            ..TokenConfig::default()
        },
        busy_retry_after_ms: 100,
        ..ServerConfig::default()
    };
    writeln!(
        out,
        "{} clients x {} rows, {} runs each; time = first start to last end",
        options.clients, options.rows_per_client, options.runs
    )?;
    let mut series = Vec::new();
    let mut configs: Vec<(String, ServerConfig)> = options
        .fixed_workers
        .iter()
        .map(|&workers| {
            (
                format!("workers {workers}"),
                ServerConfig {
                    workers,
                    ..base.clone()
                },
            )
        })
        .collect();
    let (low, high) = options.workers_range;
    configs.push((
        format!("workers {low}-{high} (auto)"),
        ServerConfig {
            workers_range: Some((low, high)),
            ..base.clone()
        },
    ));
    for (label, config) in configs {
        series.push(measure(url, options, &label, config, &frames, out).await?);
    }
    // The connection limit: the best fixed count, limit below the clients vs raised.
    let best = options
        .fixed_workers
        .iter()
        .zip(&series)
        .min_by(|a, b| a.1.best().total_cmp(&b.1.best()))
        .map(|(&workers, _)| workers)
        .unwrap_or(base.workers);
    let limited = measure(
        url,
        options,
        &format!("limit {} (workers {best})", options.connections_low),
        ServerConfig {
            workers: best,
            connections_max: options.connections_low,
            ..base.clone()
        },
        &frames,
        out,
    )
    .await?;
    let raised = measure(
        url,
        options,
        &format!("limit {} (workers {best})", options.clients),
        ServerConfig {
            workers: best,
            ..base.clone()
        },
        &frames,
        out,
    )
    .await?;
    writeln!(
        out,
        "{:<28} {:>9} {:>9} {:>8} {:>12}",
        "setting", "best s", "mean s", "RSD %", "busy retries"
    )?;
    let all: Vec<&Series> = series.iter().chain([&limited, &raised]).collect();
    for s in &all {
        let mean = s.seconds.iter().sum::<f64>() / s.seconds.len() as f64;
        writeln!(
            out,
            "{:<28} {:>9.3} {:>9.3} {:>8.1} {:>12}",
            s.label,
            s.best(),
            mean,
            s.rsd_percent(),
            s.busy_retries
        )?;
    }
    let fixed_best = series[..series.len() - 1]
        .iter()
        .map(Series::best)
        .fold(f64::INFINITY, f64::min);
    writeln!(
        out,
        "automatic range / best fixed count: {:.2}",
        series[series.len() - 1].best() / fixed_best
    )?;
    writeln!(
        out,
        "above the connection limit / limit raised: {:.2}",
        limited.best() / raised.best()
    )?;
    series.push(limited);
    series.push(raised);
    Ok(series)
}

async fn measure(
    url: &str,
    options: &LoadOptions,
    label: &str,
    config: ServerConfig,
    frames: &Arc<Vec<Vec<Vec<u8>>>>,
    out: &mut dyn Write,
) -> Result<Series> {
    let mut series = Series {
        label: label.to_string(),
        seconds: Vec::new(),
        busy_retries: 0,
    };
    for _ in 0..options.runs {
        let (seconds, retries) = run_once(url, options, config.clone(), frames).await?;
        series.seconds.push(seconds);
        series.busy_retries += retries;
    }
    writeln!(out, "{label}: {:?}", series.seconds)?;
    Ok(series)
}
