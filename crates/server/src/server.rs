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
use rowsync_protocol::{encode_frame, DecodeError, ErrorCode, FrameDecoder, Message, WireError};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::download::{chunk_frames, end_frame, Spool, SpoolError};
use crate::pool::WorkerPool;
use crate::session::{ReceivedUpload, ServerSession, Step};
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

struct Shared<B: Consolidated> {
    config: ServerConfig,
    pool: Arc<WorkerPool<B>>,
}

/// Serves syncs on `listener` until `shutdown` completes, then lets syncs in progress
/// finish (up to a grace period).
pub async fn serve<B: Consolidated>(
    listener: TcpListener,
    backend: B,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let slots = Arc::new(Semaphore::new(config.connections_max));
    let shared = Arc::new(Shared {
        pool: WorkerPool::new(backend, config.workers),
        config,
    });
    let cleanup = tokio::spawn(clean_up_periodically(
        Arc::clone(&shared.pool),
        shared.config.cleanup_interval,
    ));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
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
        match Arc::clone(&slots).try_acquire_owned() {
            Ok(permit) => {
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    handle_connection(stream, peer, &shared).await;
                    drop(permit);
                });
            }
            Err(_) => {
                let retry_after_ms = shared.config.busy_retry_after_ms;
                tracing::debug!(%peer, "connection limit reached; answering busy");
                tokio::spawn(reply_and_close(stream, Message::Busy { retry_after_ms }));
            }
        }
    }
    cleanup.abort();
    let in_flight = shared.config.connections_max as u32;
    if tokio::time::timeout(SHUTDOWN_GRACE, slots.acquire_many(in_flight))
        .await
        .is_err()
    {
        tracing::warn!("syncs still running after the shutdown grace period; stopping anyway");
    }
    Ok(())
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

async fn handle_connection<B: Consolidated>(
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared<B>,
) {
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
async fn reply_and_close(mut stream: TcpStream, message: Message) {
    let frame = encode_frame(&message);
    if tokio::time::timeout(REFUSAL_DRAIN_TIME, stream.write_all(&frame))
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
    stream: &mut TcpStream,
    shared: &Shared<B>,
) -> Result<String, Failure> {
    let config = &shared.config;
    let upload = read_upload(stream, config).await?;
    let hello = &upload.hello;

    let user = match auth::authenticate(&shared.pool, &config.tokens, hello).await {
        Ok(user) => user,
        Err(auth::AuthFailure::Refused(reason)) => {
            return Err(Failure::tell(WireError::new(
                ErrorCode::AuthenticationFailed,
                format!("authentication failed: {reason}"),
            )))
        }
        Err(auth::AuthFailure::Sync(error)) => {
            return Err(Failure::tell(WireError::new(
                error.code(),
                error.to_string(),
            )))
        }
    };
    let request = Arc::new(SyncRequest {
        client_id: hello.client_id.clone(),
        user,
        script_version: hello.script_version.clone(),
        last_download_watermark: hello.last_download_watermark,
        upload_sequence: upload.upload_sequence,
        tables: upload.tables,
        auth_parameters: hello.auth_parameters.clone(),
    });
    let download_ack = hello.download_ack;
    // The download is encoded into the spool while the worker reads it.
    let (sender, mut chunks) = download_channel();
    let message_bytes_max = config.download_message_bytes_max;
    let mut spool = Spool::new(
        config.download_spool_memory_bytes_max,
        config.download_bytes_max,
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
    let (outcome, spool) = match (outcome, spooled) {
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
    let summary = format!(
        "client {:?} user {:?}: {} rows up, {} rows down ({} bytes{}), {} conflicts{}",
        request.client_id,
        request.user,
        outcome.summary.rows_uploaded,
        outcome.download_rows,
        spool.bytes(),
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
    // The worker is released: sending happens while it serves others.
    let end = end_frame(&outcome);
    let sent = async {
        spool.send_to(stream, config.write_timeout).await?;
        tokio::time::timeout(config.write_timeout, async {
            stream.write_all(&end).await?;
            stream.flush().await
        })
        .await
        .map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "the client stopped reading")
        })?
    }
    .await;
    if let Err(error) = sent {
        return Err(Failure::silent(format!(
            "sending the download failed after commit: {error}"
        )));
    }
    if download_ack {
        receive_download_ack(stream, shared, &request, outcome.watermark).await?;
    }
    Ok(summary)
}

/// Waits for the client's `DownloadAck` (it applied the download), then records it and
/// runs `download_ack` on a worker. No worker is held while waiting.
async fn receive_download_ack<B: Consolidated>(
    stream: &mut TcpStream,
    shared: &Shared<B>,
    request: &SyncRequest,
    watermark: i64,
) -> Result<(), Failure> {
    let config = &shared.config;
    let mut decoder = FrameDecoder::new(config.frame_bytes_max);
    let mut buffer = vec![0u8; READ_CHUNK_BYTES];
    let ack = loop {
        match decoder.next_message() {
            Ok(Some(Message::DownloadAck(ack))) => break ack,
            Ok(Some(other)) => {
                return Err(Failure::tell(WireError::new(
                    ErrorCode::Protocol,
                    format!(
                        "expected download_ack, received {}",
                        other.message_type().name()
                    ),
                )))
            }
            Ok(None) => {}
            Err(error) => return Err(Failure::tell(decode_refusal(error))),
        }
        let read = tokio::time::timeout(config.read_timeout, stream.read(&mut buffer))
            .await
            .map_err(|_| {
                Failure::silent("no download acknowledgement within the read timeout".into())
            })?
            .map_err(|error| {
                Failure::silent(format!(
                    "reading the download acknowledgement failed: {error}"
                ))
            })?;
        if read == 0 {
            return Err(Failure::silent(
                "the client closed the connection without acknowledging the download".into(),
            ));
        }
        decoder.feed(&buffer[..read]);
    };
    if ack.watermark != watermark {
        return Err(Failure::tell(WireError::new(
            ErrorCode::Protocol,
            format!(
                "the acknowledgement names watermark {}, the download ended with {watermark}",
                ack.watermark
            ),
        )));
    }
    let ack_request = DownloadAckRequest {
        client_id: request.client_id.clone(),
        user: request.user.clone(),
        script_version: request.script_version.clone(),
        watermark,
        auth_parameters: request.auth_parameters.clone(),
    };
    let mut worker = shared
        .pool
        .acquire(&request.script_version)
        .await
        .map_err(database_failure)?;
    match worker.connection().acknowledge_download(&ack_request).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(Failure::silent(format!(
            "download acknowledgement for watermark {watermark} of client {:?} no longer matches its subscription; ignored",
            request.client_id
        ))),
        Err(error) => {
            if matches!(error, SyncError::Database(_)) {
                worker.discard();
            }
            Err(Failure::silent(format!("download_ack failed: {error}")))
        }
    }
}

fn database_failure(error: impl std::fmt::Display) -> Failure {
    Failure::tell(WireError::new(
        ErrorCode::Internal,
        format!("consolidated database error: {error}"),
    ))
}

/// The stream stage: reads and decodes until the upload is complete.
async fn read_upload(
    stream: &mut TcpStream,
    config: &ServerConfig,
) -> Result<ReceivedUpload, Failure> {
    let mut decoder = FrameDecoder::new(config.frame_bytes_max);
    let mut session = ServerSession::new(config.upload_bytes_max);
    let mut buffer = vec![0u8; READ_CHUNK_BYTES];
    loop {
        loop {
            let before = decoder.buffered_bytes();
            let message = match decoder.next_message() {
                Ok(Some(message)) => message,
                Ok(None) => break,
                Err(error) => return Err(Failure::tell(decode_refusal(error))),
            };
            let frame_bytes = before - decoder.buffered_bytes();
            match session.handle(message, frame_bytes) {
                Ok(Step::Continue) => {}
                Ok(Step::Complete(upload)) => return Ok(upload),
                Err(error) => return Err(Failure::tell(error)),
            }
        }
        let read = match tokio::time::timeout(config.read_timeout, stream.read(&mut buffer)).await {
            Err(_) => {
                return Err(Failure::tell(WireError::new(
                    ErrorCode::Timeout,
                    format!(
                        "nothing received for {} ms",
                        config.read_timeout.as_millis()
                    ),
                )))
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
        decoder.feed(&buffer[..read]);
    }
}

fn decode_refusal(error: DecodeError) -> WireError {
    let code = match error {
        DecodeError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
        _ => ErrorCode::Protocol,
    };
    WireError::new(code, error.to_string())
}
