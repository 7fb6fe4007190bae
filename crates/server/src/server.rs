//! The network and stream stages: accept under the connection limit, read the whole
//! upload, hand it to a database worker, send the download after the worker is free.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rowsync_consolidated::{
    download_channel, Consolidated, ConsolidatedConnection, DownloadAckRequest, DownloadMessage,
    SyncError, SyncRequest,
};
use rowsync_protocol::{
    encode_frame, CompressionError, DecodeError, DownloadAck, ErrorCode, FrameDecoder, Hello,
    Inbound, InboundError, Message, Outbound, WireError,
};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::download::{chunk_frames, end_frame, Spool, SpoolError};
use crate::pool::WorkerPool;
use crate::session::{ReceivedUpload, ServerSession, Step};

/// What the stream stage read: an upload, or a download acknowledgement.
enum Received {
    Upload(ReceivedUpload),
    Acknowledge { hello: Hello, watermark: i64 },
}
use crate::{auth, ServerConfig};

/// Bytes read from a socket at a time.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// How long in-flight syncs may finish after shutdown is requested.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("accepting connections failed: {0}")]
    Accept(std::io::Error),
}

pub(crate) struct Shared<B: Consolidated> {
    pub(crate) config: ServerConfig,
    pool: Arc<WorkerPool<B>>,
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
    let shared = Arc::new(Shared {
        pool: WorkerPool::new(backend, config.workers),
        slots: Arc::new(Semaphore::new(config.connections_max)),
        http_connections: Arc::new(Semaphore::new(config.connections_max)),
        config,
    });
    let cleanup = tokio::spawn(clean_up_periodically(
        Arc::clone(&shared.pool),
        shared.config.cleanup_interval,
    ));
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
            handle_connection(stream, peer, &shared).await;
            drop(permit);
        }
        None => {
            let retry_after_ms = shared.config.busy_retry_after_ms;
            tracing::debug!(%peer, "connection limit reached; answering busy");
            reply_and_close(stream, Message::Busy { retry_after_ms }).await;
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

/// Why a sync ended early, and what (if anything) the client is told.
struct Failure {
    reply: Option<WireError>,
    log: String,
}

impl Failure {
    fn tell(error: WireError) -> Failure {
        Failure {
            log: error.to_string(),
            reply: Some(error),
        }
    }

    fn silent(log: String) -> Failure {
        Failure { reply: None, log }
    }
}

/// Runs one sync over any byte stream (TCP, TLS, or an HTTP request and its response).
pub(crate) async fn handle_connection<B: Consolidated, S>(
    mut stream: S,
    peer: SocketAddr,
    shared: &Shared<B>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let started = Instant::now();
    match run_sync(&mut stream, shared).await {
        Ok(summary) => {
            tracing::debug!(%peer, elapsed_ms = started.elapsed().as_millis() as u64, "{summary}")
        }
        Err(failure) => {
            // The client hears first; the log line cannot delay or prevent its answer.
            if let Some(error) = failure.reply {
                reply_and_close(stream, Message::Error(error)).await;
            } else {
                let _ = stream.shutdown().await;
            }
            tracing::warn!(%peer, "sync failed: {}", failure.log);
            return;
        }
    }
    let _ = stream.shutdown().await;
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

async fn run_sync<B: Consolidated>(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin + Send),
    shared: &Shared<B>,
) -> Result<String, Failure> {
    let config = &shared.config;
    let (received, mut outbound, wire_bytes_received) = read_upload(stream, config).await?;
    let upload = match received {
        Received::Upload(upload) => upload,
        Received::Acknowledge { hello, watermark } => {
            return acknowledge(stream, shared, &hello, watermark, outbound).await
        }
    };
    let hello = &upload.hello;

    let user = authenticated_user(shared, hello).await?;
    let request = Arc::new(SyncRequest {
        client_id: hello.client_id.clone(),
        user,
        script_version: hello.script_version.clone(),
        last_download_watermark: hello.last_download_watermark,
        upload_sequence: upload.upload_sequence,
        tables: upload.tables,
        auth_parameters: hello.auth_parameters.clone(),
    });
    // The download is encoded into the spool while the worker reads it.
    let (sender, mut chunks) = download_channel();
    let message_bytes_max = config.download_message_bytes_max;
    let preamble = outbound.take_preamble();
    let mut spool = Spool::new(
        config.download_spool_memory_bytes_max,
        config.download_bytes_max,
        outbound,
    );
    let spooling = tokio::spawn(async move {
        while let Some(message) = chunks.recv().await {
            match message {
                DownloadMessage::Chunk(chunk) => {
                    for frame in chunk_frames(chunk, message_bytes_max) {
                        spool.append(&frame).await?;
                    }
                }
                DownloadMessage::Finish(answer) => {
                    let flushed = spool.flush().await;
                    let verdict = match &flushed {
                        Ok(()) => Ok(()),
                        Err(error) => Err(error.to_string()),
                    };
                    let _ = answer.send(verdict);
                    flushed?;
                }
            }
        }
        Ok::<Spool, SpoolError>(spool)
    });
    let mut worker = shared
        .pool
        .acquire(&request.script_version)
        .await
        .map_err(database_failure)?;
    let outcome = worker
        .connection()
        .synchronize(Arc::clone(&request), sender)
        .await;
    let spooled = spooling
        .await
        .map_err(|error| Failure::tell(WireError::new(ErrorCode::Internal, error.to_string())))?;
    let (outcome, mut spool) = match (outcome, spooled) {
        (Ok(outcome), Ok(spool)) => {
            drop(worker);
            (outcome, spool)
        }
        (Err(error), spooled) => {
            if matches!(error, SyncError::Database(_)) {
                worker.discard();
            } else {
                drop(worker);
            }
            // A spool failure (size, disk) is the cause when the backend only saw its
            // receiver go away.
            let wire = match (&error, spooled) {
                (
                    SyncError::DownloadAbandoned | SyncError::DownloadRefused(_),
                    Err(spool_error),
                ) => WireError::new(ErrorCode::Internal, spool_error.to_string()),
                _ => WireError::new(error.code(), error.to_string()),
            };
            return Err(Failure::tell(wire));
        }
        (Ok(_), Err(spool_error)) => {
            // Committed, but the download cannot be sent: the client retries, and its
            // upload is then acknowledged as already applied.
            drop(worker);
            return Err(Failure::tell(WireError::new(
                ErrorCode::Internal,
                spool_error.to_string(),
            )));
        }
    };
    // The worker is released: the end of the download joins the spool, then all of it
    // is sent while the worker serves others.
    let ended = async {
        spool.append(&end_frame(&outcome)).await?;
        spool.finish().await
    }
    .await;
    if let Err(spool_error) = ended {
        return Err(Failure::tell(WireError::new(
            ErrorCode::Internal,
            spool_error.to_string(),
        )));
    }
    let summary = format!(
        "client {:?} user {:?}: {} rows up ({} bytes received), {} rows down ({} bytes, {} sent{}), {} conflicts{}",
        request.client_id,
        request.user,
        outcome.summary.rows_uploaded,
        wire_bytes_received,
        outcome.download_rows,
        spool.bytes(),
        spool.wire_bytes(),
        if spool.spilled() {
            ", spilled to disk"
        } else {
            ""
        },
        outcome.summary.conflicts,
        if outcome.summary.upload_already_applied {
            ", upload already applied"
        } else {
            ""
        },
    );
    let sent = send_spool(stream, shared, preamble, spool).await;
    if let Err(error) = sent {
        return Err(Failure::silent(format!(
            "sending the download failed after commit: {error}"
        )));
    }
    Ok(summary)
}

/// A download acknowledgement (its own short exchange): authenticate, record it and run
/// `download_ack` on a worker, and echo it to confirm.
async fn acknowledge<B: Consolidated>(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin + Send),
    shared: &Shared<B>,
    hello: &Hello,
    watermark: i64,
    mut outbound: Outbound,
) -> Result<String, Failure> {
    let user = authenticated_user(shared, hello).await?;
    let request = DownloadAckRequest {
        client_id: hello.client_id.clone(),
        user,
        script_version: hello.script_version.clone(),
        watermark,
        auth_parameters: hello.auth_parameters.clone(),
    };
    let mut worker = shared
        .pool
        .acquire(&request.script_version)
        .await
        .map_err(database_failure)?;
    let recorded = worker.connection().acknowledge_download(&request).await;
    let recorded = match recorded {
        Ok(recorded) => {
            drop(worker);
            recorded
        }
        Err(error) => {
            if matches!(error, SyncError::Database(_)) {
                worker.discard();
            }
            return Err(Failure::tell(WireError::new(
                error.code(),
                error.to_string(),
            )));
        }
    };
    if !recorded {
        return Err(Failure::tell(WireError::new(
            ErrorCode::Protocol,
            format!(
                "watermark {watermark} is not the last one sent to client {:?}; nothing recorded",
                request.client_id
            ),
        )));
    }
    let preamble = outbound.take_preamble();
    let mut spool = Spool::new(
        shared.config.download_spool_memory_bytes_max,
        shared.config.download_bytes_max,
        outbound,
    );
    let reply = async {
        spool
            .append(&encode_frame(&Message::DownloadAck(DownloadAck {
                watermark,
            })))
            .await?;
        spool.finish().await
    }
    .await;
    reply.map_err(|error| Failure::tell(WireError::new(ErrorCode::Internal, error.to_string())))?;
    send_spool(stream, shared, preamble, spool)
        .await
        .map_err(|error| {
            Failure::silent(format!("confirming the acknowledgement failed: {error}"))
        })?;
    Ok(format!(
        "client {:?} acknowledged the download up to {watermark}",
        request.client_id
    ))
}

/// Sends the preamble (if any) and everything spooled; each write must progress within
/// the write timeout.
async fn send_spool<B: Consolidated>(
    stream: &mut (impl AsyncWrite + Unpin),
    shared: &Shared<B>,
    preamble: Option<[u8; rowsync_protocol::PREAMBLE_BYTES]>,
    spool: Spool,
) -> std::io::Result<()> {
    let write_timeout = shared.config.write_timeout;
    let stopped =
        || std::io::Error::new(std::io::ErrorKind::TimedOut, "the client stopped reading");
    if let Some(preamble) = preamble {
        tokio::time::timeout(write_timeout, stream.write_all(&preamble))
            .await
            .map_err(|_| stopped())??;
    }
    spool.send_to(stream, write_timeout).await?;
    tokio::time::timeout(write_timeout, stream.flush())
        .await
        .map_err(|_| stopped())?
}

/// The authenticated user of a hello, or the refusal to send.
async fn authenticated_user<B: Consolidated>(
    shared: &Shared<B>,
    hello: &Hello,
) -> Result<String, Failure> {
    match auth::authenticate(&shared.pool, &shared.config.tokens, hello).await {
        Ok(user) => Ok(user),
        Err(auth::AuthFailure::Refused(reason)) => Err(Failure::tell(WireError::new(
            ErrorCode::AuthenticationFailed,
            format!("authentication failed: {reason}"),
        ))),
        Err(auth::AuthFailure::Sync(error)) => Err(Failure::tell(WireError::new(
            error.code(),
            error.to_string(),
        ))),
    }
}

fn database_failure(error: impl std::fmt::Display) -> Failure {
    Failure::tell(WireError::new(
        ErrorCode::Internal,
        format!("consolidated database error: {error}"),
    ))
}

/// The stream stage: reads (and decompresses) and decodes until the upload is complete.
/// Returns the upload, the sender for the reply (the client's compression, announced
/// by a preamble when the client sent one) and the bytes received on the wire.
async fn read_upload(
    stream: &mut (impl AsyncRead + Unpin),
    config: &ServerConfig,
) -> Result<(Received, Outbound, u64), Failure> {
    let started = tokio::time::Instant::now();
    let header_deadline = started + config.header_read_timeout;
    let mut inbound = Inbound::new(config.decompressed_bytes_max);
    let mut decoder = FrameDecoder::new(config.frame_bytes_max);
    let mut session = ServerSession::new(config.upload_bytes_max);
    let mut hello_seen = false;
    let mut buffer = vec![0u8; READ_CHUNK_BYTES];
    loop {
        while let Some(chunk) = inbound.next_chunk().map_err(inbound_refusal)? {
            decoder.feed(chunk);
            loop {
                let before = decoder.buffered_bytes();
                let message = match decoder.next_message() {
                    Ok(Some(message)) => message,
                    Ok(None) => break,
                    Err(error) => return Err(Failure::tell(decode_refusal(error))),
                };
                let frame_bytes = before - decoder.buffered_bytes();
                let received = match session.handle(message, frame_bytes) {
                    Ok(Step::Continue) => None,
                    Ok(Step::Hello(_)) => {
                        hello_seen = true;
                        None
                    }
                    Ok(Step::Complete(upload)) => Some(Received::Upload(upload)),
                    Ok(Step::Acknowledge { hello, watermark }) => {
                        Some(Received::Acknowledge { hello, watermark })
                    }
                    Err(error) => return Err(Failure::tell(error)),
                };
                match received {
                    None => {}
                    Some(received) => {
                        let compression = inbound
                            .preamble()
                            .map(|preamble| preamble.compression)
                            .unwrap_or_default();
                        let outbound = Outbound::new(compression, inbound.preamble().is_some())
                            .map_err(|error| {
                                Failure::tell(WireError::new(
                                    ErrorCode::Internal,
                                    error.to_string(),
                                ))
                            })?;
                        return Ok((received, outbound, inbound.wire_bytes()));
                    }
                }
            }
        }
        // Until the hello is in, the header timeout also bounds the wait.
        let now = tokio::time::Instant::now();
        let header_wait = header_deadline.saturating_duration_since(now);
        let header_bound = !hello_seen && header_wait < config.read_timeout;
        let wait = if header_bound {
            header_wait
        } else {
            config.read_timeout
        };
        let read = match tokio::time::timeout(wait, stream.read(&mut buffer)).await {
            Err(_) => {
                let reason = if header_bound {
                    format!(
                        "the hello did not arrive within the header read timeout of {} ms",
                        config.header_read_timeout.as_millis()
                    )
                } else {
                    format!(
                        "nothing received for {} ms",
                        config.read_timeout.as_millis()
                    )
                };
                return Err(Failure::tell(WireError::new(ErrorCode::Timeout, reason)));
            }
            Ok(Err(error)) => {
                return Err(Failure::silent(format!(
                    "reading the upload failed: {error}"
                )))
            }
            Ok(Ok(read)) => read,
        };
        if read == 0 {
            let reason = match decoder.finish() {
                Err(error) => error.to_string(),
                Ok(()) => "the client closed the connection before the end of the upload".into(),
            };
            return Err(Failure::silent(reason));
        }
        inbound.feed(&buffer[..read]).map_err(inbound_refusal)?;
    }
}

fn inbound_refusal(error: InboundError) -> Failure {
    let code = match error {
        InboundError::Compression(CompressionError::DecompressedTooLarge { .. }) => {
            ErrorCode::UploadTooLarge
        }
        _ => ErrorCode::Protocol,
    };
    Failure::tell(WireError::new(code, error.to_string()))
}

fn decode_refusal(error: DecodeError) -> WireError {
    let code = match error {
        DecodeError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
        _ => ErrorCode::Protocol,
    };
    WireError::new(code, error.to_string())
}
