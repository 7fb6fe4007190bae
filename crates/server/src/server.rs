//! The network stage: accept on every endpoint under one connection limit (above it,
//! *busy* with a retry-after computed from the load), and the server's background
//! tasks: the worker-count controller, the periodic summary, tombstone cleanup. One
//! connection's sync is in [`crate::sync`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rowsync_consolidated::{Consolidated, ConsolidatedConnection};
use rowsync_protocol::{encode_frame, Message};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::cache::Cache;
use crate::controller::{ControllerConfig, Sample, WorkerController};
use crate::metrics::Metrics;
use crate::pool::WorkerPool;
use crate::sync::handle_connection;
use crate::ServerConfig;

/// Bytes read from a socket at a time.
pub(crate) const READ_CHUNK_BYTES: usize = 64 * 1024;
/// How long in-flight syncs may finish after shutdown is requested.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("accepting connections failed: {0}")]
    Accept(std::io::Error),
}

pub(crate) struct Shared<B: Consolidated> {
    pub(crate) config: ServerConfig,
    pub(crate) pool: Arc<WorkerPool<B>>,
    /// Connections for authentication only: logins never take a sync's worker.
    pub(crate) auth_pool: Arc<WorkerPool<B>>,
    /// Password hash checks (argon2id, CPU-bound) running at once.
    pub(crate) password_checks: Semaphore,
    pub(crate) cache: Arc<Cache>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) load: Load,
    /// One permit per sync in progress, whatever its transport (`connections_max`).
    pub(crate) slots: Arc<Semaphore>,
    /// One permit per open HTTP(S) connection (`connections_max` of them): a keep-alive
    /// or HTTP/2 connection may sit between requests without holding a sync's slot.
    http_connections: Arc<Semaphore>,
}

/// How an endpoint's connections carry the protocol.
#[derive(Clone)]
pub enum Transport {
    /// The frame stream on a TCP connection.
    Tcp,
    /// The frame stream inside TLS.
    Tls(Arc<rustls::ServerConfig>),
    /// HTTP/1.1 or HTTP/2 (prior knowledge): one POST per sync.
    Http,
    /// HTTP/1.1 or HTTP/2 (chosen by ALPN) inside TLS.
    Https(Arc<rustls::ServerConfig>),
}

impl Transport {
    pub fn name(&self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Tls(_) => "tls",
            Transport::Http => "http",
            Transport::Https(_) => "https",
        }
    }
}

/// A listening socket and the transport its connections speak.
pub struct Endpoint {
    pub listener: TcpListener,
    pub transport: Transport,
}

/// Serves syncs on `listener` (plain TCP) until `shutdown` completes, then lets syncs in
/// progress finish (up to a grace period).
pub async fn serve<B: Consolidated>(
    listener: TcpListener,
    backend: B,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let endpoint = Endpoint {
        listener,
        transport: Transport::Tcp,
    };
    serve_endpoints(vec![endpoint], backend, config, shutdown).await
}

/// Serves syncs on every endpoint, all under one connection limit and one worker pool,
/// until `shutdown` completes; then lets syncs in progress finish (up to a grace period).
pub async fn serve_endpoints<B: Consolidated>(
    endpoints: Vec<Endpoint>,
    backend: B,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    serve_endpoints_with_metrics(
        endpoints,
        backend,
        config,
        Arc::new(Metrics::new()),
        shutdown,
    )
    .await
}

/// [`serve_endpoints`], counting into `metrics` (which an admin endpoint may expose).
pub async fn serve_endpoints_with_metrics<B: Consolidated>(
    endpoints: Vec<Endpoint>,
    backend: B,
    config: ServerConfig,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let workers = match config.workers_range {
        Some((workers_min, _)) => workers_min,
        None => config.workers,
    };
    metrics.workers.set(workers as i64);
    let shared = Arc::new(Shared {
        pool: WorkerPool::new(backend.clone(), workers),
        auth_pool: WorkerPool::new(backend, config.auth_connections.max(1)),
        password_checks: Semaphore::new(config.password_checks_max.max(1)),
        cache: Cache::new(config.cache_bytes_max, Arc::clone(&metrics)),
        metrics,
        load: Load::default(),
        slots: Arc::new(Semaphore::new(config.connections_max)),
        http_connections: Arc::new(Semaphore::new(config.connections_max)),
        config,
    });
    let cleanup = tokio::spawn(clean_up_periodically(
        Arc::clone(&shared.pool),
        shared.config.cleanup_interval,
    ));
    let monitor = tokio::spawn(monitor_load(Arc::clone(&shared)));
    let (stop, stopped) = watch::channel(false);
    let mut accepting = tokio::task::JoinSet::new();
    for endpoint in endpoints {
        accepting.spawn(accept_loop(endpoint, Arc::clone(&shared), stopped.clone()));
    }
    let mut result = Ok(());
    tokio::select! {
        _ = shutdown => {}
        Some(joined) = accepting.join_next() => {
            result = joined.unwrap_or_else(|error| {
                Err(ServerError::Accept(std::io::Error::other(error.to_string())))
            });
        }
    }
    let _ = stop.send(true);
    while accepting.join_next().await.is_some() {}
    cleanup.abort();
    monitor.abort();
    let in_flight = shared.config.connections_max as u32;
    if tokio::time::timeout(SHUTDOWN_GRACE, shared.slots.acquire_many(in_flight))
        .await
        .is_err()
    {
        tracing::warn!("syncs still running after the shutdown grace period; stopping anyway");
    }
    result
}

/// The network stage of one endpoint.
async fn accept_loop<B: Consolidated>(
    endpoint: Endpoint,
    shared: Arc<Shared<B>>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ServerError> {
    let Endpoint {
        listener,
        transport,
    } = endpoint;
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.changed() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) if is_transient_accept_error(&error) => {
                    tracing::warn!(%error, "accept failed; continuing");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(error) => return Err(ServerError::Accept(error)),
            },
        };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        match &transport {
            Transport::Tcp => {
                let permit = Arc::clone(&shared.slots).try_acquire_owned().ok();
                tokio::spawn(serve_stream(stream, peer, shared, permit));
            }
            Transport::Tls(config) => {
                let permit = Arc::clone(&shared.slots).try_acquire_owned().ok();
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(config));
                tokio::spawn(async move {
                    let timeout = shared.config.tls_handshake_timeout;
                    if let Some(stream) =
                        crate::tls_accept::accept(stream, peer, &acceptor, timeout, false).await
                    {
                        serve_stream(stream, peer, shared, permit).await;
                    }
                });
            }
            Transport::Http | Transport::Https(_) => {
                // Above the limit, the connection is still served, briefly: every request
                // on it is answered busy, then it closes.
                let connection = Arc::clone(&shared.http_connections)
                    .try_acquire_owned()
                    .ok();
                if connection.is_none() {
                    tracing::debug!(%peer, "HTTP connection limit reached; answering busy");
                }
                let tls = match &transport {
                    Transport::Https(config) => {
                        Some(tokio_rustls::TlsAcceptor::from(Arc::clone(config)))
                    }
                    _ => None,
                };
                tokio::spawn(async move {
                    let over_limit = connection.is_none();
                    match tls {
                        None => {
                            crate::http::serve_connection(stream, peer, shared, over_limit).await
                        }
                        Some(acceptor) => {
                            let timeout = shared.config.tls_handshake_timeout;
                            if let Some(stream) =
                                crate::tls_accept::accept(stream, peer, &acceptor, timeout, true)
                                    .await
                            {
                                crate::http::serve_connection(stream, peer, shared, over_limit)
                                    .await;
                            }
                        }
                    }
                    drop(connection);
                });
            }
        }
    }
}

/// One sync over a byte stream (TCP or TLS): with a slot, run it; without, answer busy.
async fn serve_stream<B: Consolidated, S>(
    stream: S,
    peer: SocketAddr,
    shared: Arc<Shared<B>>,
    permit: Option<OwnedSemaphorePermit>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    match permit {
        Some(permit) => {
            handle_connection(stream, peer, &shared, permit).await;
        }
        None => {
            let retry_after_ms = shared.busy_retry_after_ms();
            tracing::debug!(%peer, retry_after_ms, "connection limit reached; answering busy");
            reply_and_close(stream, Message::Busy { retry_after_ms }).await;
        }
    }
}

/// What the monitor needs to know of completed syncs.
#[derive(Debug, Default)]
pub(crate) struct Load {
    syncs_completed: AtomicU64,
    rows: AtomicU64,
    /// Syncs completed per second, smoothed (f64 bits).
    syncs_per_second: AtomicU64,
}

/// Weight of the newest interval in the smoothed completion rate.
const RATE_SMOOTHING: f64 = 0.5;
/// Interval of the periodic summary line.
pub const SUMMARY_INTERVAL: Duration = Duration::from_secs(60);

impl Load {
    pub(crate) fn completed(&self, rows: u64) {
        self.syncs_completed.fetch_add(1, Ordering::AcqRel);
        self.rows.fetch_add(rows, Ordering::AcqRel);
    }

    fn syncs_per_second(&self) -> f64 {
        f64::from_bits(self.syncs_per_second.load(Ordering::Acquire))
    }
}

impl<B: Consolidated> Shared<B> {
    /// When a refused client should come back: the syncs in progress ahead of it,
    /// divided by the rate at which syncs complete, within the configured bounds (the
    /// configured hint itself before anything completed).
    pub(crate) fn busy_retry_after_ms(&self) -> u32 {
        self.metrics.sync_ended(crate::metrics::Outcome::busy);
        let rate = self.load.syncs_per_second();
        let floor = self.config.busy_retry_after_ms;
        if rate <= 0.0 {
            return floor;
        }
        let in_progress = self.config.connections_max
            - self
                .slots
                .available_permits()
                .min(self.config.connections_max);
        let estimate = 1000.0 * in_progress as f64 / rate;
        (estimate as u64).clamp(
            u64::from(floor),
            u64::from(self.config.busy_retry_after_ms_max.max(floor)),
        ) as u32
    }
}

/// Every `worker_adjust_interval`: measures the load, lets the controller (when a range
/// is set) change the worker count, updates the gauges; every `SUMMARY_INTERVAL` logs a
/// summary line.
async fn monitor_load<B: Consolidated>(shared: Arc<Shared<B>>) {
    let interval = shared
        .config
        .worker_adjust_interval
        .max(Duration::from_millis(100));
    let mut controller = shared
        .config
        .workers_range
        .map(|(workers_min, workers_max)| {
            WorkerController::new(ControllerConfig {
                workers_min: workers_min.max(1),
                workers_max: workers_max.max(workers_min.max(1)),
                adjust_interval: interval,
            })
        });
    let counters = &shared.pool.counters;
    let mut ticks = tokio::time::interval(interval);
    ticks.tick().await;
    let mut last = (0u64, 0u64, 0usize, 0usize);
    let mut last_tick = Instant::now();
    let mut summary = (Instant::now(), 0u64, 0u64, 0u64);
    loop {
        ticks.tick().await;
        let now = (
            shared.load.syncs_completed.load(Ordering::Acquire),
            shared.load.rows.load(Ordering::Acquire),
            counters.waited.load(Ordering::Acquire),
            counters.busy_micros.load(Ordering::Acquire),
        );
        let elapsed = last_tick.elapsed();
        last_tick = Instant::now();
        let sample = Sample {
            interval: elapsed,
            syncs_completed: now.0 - last.0,
            rows: now.1 - last.1,
            syncs_waited: (now.2 - last.2) as u64 + counters.waiting.load(Ordering::Acquire) as u64,
            worker_busy: Duration::from_micros((now.3 - last.3) as u64),
        };
        last = now;
        let rate = sample.syncs_completed as f64 / elapsed.as_secs_f64().max(1e-3);
        let smoothed =
            RATE_SMOOTHING * rate + (1.0 - RATE_SMOOTHING) * shared.load.syncs_per_second();
        shared
            .load
            .syncs_per_second
            .store(smoothed.to_bits(), Ordering::Release);
        if let Some(controller) = controller.as_mut() {
            if let Some(decision) = controller.observe(sample) {
                shared.pool.resize(decision.workers);
                shared.metrics.worker_adjustments.inc();
                tracing::info!(
                    workers = decision.workers,
                    "worker count: {}",
                    decision.reason
                );
            }
        }
        let metrics = &shared.metrics;
        metrics.workers.set(shared.pool.workers() as i64);
        metrics
            .workers_busy
            .set(counters.busy.load(Ordering::Acquire) as i64);
        metrics
            .syncs_waiting_for_worker
            .set(counters.waiting.load(Ordering::Acquire) as i64);
        if summary.0.elapsed() >= SUMMARY_INTERVAL {
            let busy_answers = metrics.syncs_ended(crate::metrics::Outcome::busy);
            tracing::info!(
                syncs = now.0 - summary.1,
                rows = now.1 - summary.2,
                busy_answers = busy_answers - summary.3,
                workers = shared.pool.workers(),
                cache_bytes = shared.cache.used_bytes(),
                "summary of the last {} s",
                summary.0.elapsed().as_secs()
            );
            summary = (Instant::now(), now.0, now.1, busy_answers);
        }
    }
}

/// Removes tombstones every client has passed, on a worker, every `interval`.
async fn clean_up_periodically<B: Consolidated>(pool: Arc<WorkerPool<B>>, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.tick().await; // the first tick is immediate; start after one interval
    loop {
        ticks.tick().await;
        let result = match pool.acquire("").await {
            Ok(mut worker) => worker.connection().cleanup().await,
            Err(error) => Err(error),
        };
        match result {
            Ok(removed) => tracing::info!(removed, "tombstone cleanup"),
            Err(error) => {
                tracing::warn!(%error, "tombstone cleanup failed; retrying next interval")
            }
        }
    }
}

fn is_transient_accept_error(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(error.kind(), ConnectionAborted | ConnectionReset | Interrupted | WouldBlock)
        || error.raw_os_error() == Some(24) // EMFILE: out of file descriptors, for now
        || error.raw_os_error() == Some(23) // ENFILE
}

/// Bytes of unread input discarded after a refusal, and for how long, so that closing
/// does not reset the connection before the client has read the refusal.
const REFUSAL_DRAIN_BYTES_MAX: usize = 1024 * 1024;
const REFUSAL_DRAIN_TIME: Duration = Duration::from_secs(2);

/// Sends a final message (error or busy), closes our side, and drains what the client
/// is still sending so the kernel does not answer it with a reset that could destroy
/// the message in flight.
pub(crate) async fn reply_and_close(stream: impl AsyncRead + AsyncWrite + Unpin, message: Message) {
    reply_bytes_and_close(stream, &encode_frame(&message)).await
}

/// Sends `reply` (a frame, or a plain-text answer), closes our side, drains the input.
pub(crate) async fn reply_bytes_and_close(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    reply: &[u8],
) {
    if tokio::time::timeout(REFUSAL_DRAIN_TIME, stream.write_all(reply))
        .await
        .is_err()
    {
        return;
    }
    let _ = stream.shutdown().await;
    let _ = tokio::time::timeout(REFUSAL_DRAIN_TIME, async {
        let mut buffer = vec![0u8; READ_CHUNK_BYTES];
        let mut drained = 0;
        while drained < REFUSAL_DRAIN_BYTES_MAX {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => drained += read,
            }
        }
    })
    .await;
}
