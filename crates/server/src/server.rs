//! The network stage: accept on every endpoint under one connection limit (above it,
//! *busy* with a retry-after computed from the load), hand each connection to its
//! transport, and start and stop the server's background tasks (`background`).
//! One sync over a connection is in `sync`; the state all connections share in
//! `shared`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rowsync_consolidated::{Consolidated, ConsolidatedConnection, Direction};
use rowsync_protocol::Message;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit};

pub use crate::background::SUMMARY_INTERVAL;
use crate::background::{
    clean_up_periodically, keep_history_in_table, monitor_load, share_with_farm,
};
use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::reply::reply_and_close;
use crate::shared::Shared;
use crate::sync::{handle_connection, ClientClose};

/// After a drain, how long HTTP connections may take to finish writing their last
/// response before the server stops.
const HTTP_FLUSH_GRACE: Duration = Duration::from_secs(2);

/// How often the readiness check asks the consolidated database for `SELECT 1`.
pub const READINESS_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// How often the database is asked again while it does not answer: a server is ready
/// again within this of its database's failover ending, not a whole check interval.
pub const READINESS_RECHECK_INTERVAL: Duration = Duration::from_millis(250);

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("accepting connections failed: {0}")]
    Accept(std::io::Error),
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
    crate::allocator::set_mmap_threshold(config.malloc_mmap_threshold_bytes);
    let readiness = tokio::spawn(check_database(backend.clone(), Arc::clone(&metrics)));
    let shared = Arc::new(Shared::new(backend, config, metrics, workers));
    let cleanup = tokio::spawn(clean_up_periodically(
        Arc::clone(&shared.pool),
        shared.config.cleanup_interval,
        [
            (Direction::Upload, shared.config.held_upload_expiry),
            (Direction::Download, shared.config.held_download_expiry),
        ],
    ));
    let monitor = tokio::spawn(monitor_load(Arc::clone(&shared)));
    let logins = tokio::spawn(share_with_farm(Arc::clone(&shared)));
    let history = shared
        .metrics
        .monitor
        .settings()
        .history_table_rows_max
        .map(|rows_max| {
            tokio::spawn(keep_history_in_table(
                Arc::clone(&shared.pool),
                Arc::clone(&shared.metrics),
                rows_max,
            ))
        });
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
    drain(&shared).await;
    let _ = stop.send(true);
    while accepting.join_next().await.is_some() {}
    for task in [cleanup, monitor, readiness, logins]
        .into_iter()
        .chain(history)
    {
        task.abort();
    }
    result
}

/// Lets running syncs finish, up to `drain_timeout`, while the endpoints go on
/// answering: taking every slot as it frees, so a sync that arrives meanwhile finds
/// none and is answered busy (behind a load balancer it goes to another server), and
/// `/readyz` says draining.
async fn drain<B: Consolidated>(shared: &Shared<B>) {
    shared.metrics.draining.set(1);
    let slots = shared.config.connections_max as u32;
    let drain_timeout = shared.config.drain_timeout;
    let drained = async {
        let running = shared.slots.acquire_many(slots).await;
        let sending = shared.http_responses.acquire_many(slots).await;
        (running, sending)
    };
    match tokio::time::timeout(drain_timeout, drained).await {
        Ok(_) => tracing::info!("drained: no sync is running"),
        Err(_) => tracing::warn!(
            ?drain_timeout,
            "syncs still running when drain_timeout passed; stopping anyway"
        ),
    }
    // A response handed to its connection may still be in its write buffer: let the
    // HTTP connections end (an idle keep-alive one is closed at exit, losing nothing).
    let flushed = shared.http_connections.acquire_many(slots);
    let _ = tokio::time::timeout(HTTP_FLUSH_GRACE, flushed).await;
}

/// Asks the consolidated database for `SELECT 1` every `READINESS_CHECK_INTERVAL` (every
/// `READINESS_RECHECK_INTERVAL` while it does not answer), on a connection of its own
/// (made again after a failure), into `database_up`.
async fn check_database<B: Consolidated>(backend: B, metrics: Arc<Metrics>) {
    let mut connection = None;
    loop {
        if connection.is_none() {
            connection = backend.connect().await.ok();
        }
        let answered = match connection.as_mut() {
            Some(connection) => connection.ping().await.is_ok(),
            None => false,
        };
        if !answered {
            connection = None;
        }
        if answered != (metrics.database_up.get() == 1) {
            tracing::info!(answered, "the consolidated database's readiness changed");
        }
        metrics.database_up.set(i64::from(answered));
        tokio::time::sleep(match answered {
            true => READINESS_CHECK_INTERVAL,
            false => READINESS_RECHECK_INTERVAL,
        })
        .await;
    }
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
        spawn_connection(stream, peer, &transport, Arc::clone(&shared));
    }
}

/// Hands an accepted connection to its transport, in a task of its own. TCP and TLS
/// take a sync's slot now (or are answered busy); HTTP(S) takes a connection permit, and
/// each request on it a slot.
fn spawn_connection<B: Consolidated>(
    stream: TcpStream,
    peer: SocketAddr,
    transport: &Transport,
    shared: Arc<Shared<B>>,
) {
    match transport {
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
            let tls = match transport {
                Transport::Https(config) => {
                    Some(tokio_rustls::TlsAcceptor::from(Arc::clone(config)))
                }
                _ => None,
            };
            tokio::spawn(async move {
                let over_limit = connection.is_none();
                match tls {
                    None => crate::http::serve_connection(stream, peer, shared, over_limit).await,
                    Some(acceptor) => {
                        let timeout = shared.config.tls_handshake_timeout;
                        if let Some(stream) =
                            crate::tls_accept::accept(stream, peer, &acceptor, timeout, true).await
                        {
                            crate::http::serve_connection(stream, peer, shared, over_limit).await;
                        }
                    }
                }
                drop(connection);
            });
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
            handle_connection(stream, peer, &shared, permit, ClientClose::Watched).await;
        }
        None => {
            let retry_after_ms = shared.busy_retry_after_ms();
            tracing::debug!(%peer, retry_after_ms, "connection limit reached; answering busy");
            reply_and_close(stream, Message::Busy { retry_after_ms }).await;
        }
    }
}

fn is_transient_accept_error(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(error.kind(), ConnectionAborted | ConnectionReset | Interrupted | WouldBlock)
        || error.raw_os_error() == Some(24) // EMFILE: out of file descriptors, for now
        || error.raw_os_error() == Some(23) // ENFILE
}
