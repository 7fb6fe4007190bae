//! One connection's sync, stage by stage: the hello (within the header timeout), then
//! authentication (on the auth connections, never a worker), then the rest of the upload
//! into a spool (memory while the cache has room, else a temporary file; within the
//! upload timeout), then a database worker, then the download spooled and sent after the
//! worker is released. Each phase is timed into the metrics and the sync's log line.

use std::net::SocketAddr;
use std::sync::Arc;

use rowsync_consolidated::{
    download_channel, Consolidated, ConsolidatedConnection, DownloadAckRequest, DownloadMessage,
    SyncError, SyncRequest,
};
use rowsync_protocol::{
    encode_frame, Compression, CompressionError, DecodeError, DownloadAck, ErrorCode, FrameDecoder,
    Hello, Inbound, InboundError, Message, Outbound, TableUpload, WireError, PREAMBLE_BYTES,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use crate::auth;
use crate::download_frames::{chunk_frames, end_frame};
use crate::metrics::{Outcome, Phase, PhaseTimings};
use crate::reply::reply_and_close;
use crate::session::{merge, ServerSession, Step};
use crate::shared::{Shared, READ_CHUNK_BYTES};
use crate::spool::{Spool, SpoolError};

/// Why a sync ended early, and what (if anything) the client is told.
pub(crate) struct Failure {
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
    slot: OwnedSemaphorePermit,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut timings = PhaseTimings::default();
    shared.metrics.connections.inc();
    let result = run_sync(&mut stream, shared, &mut timings).await;
    shared.metrics.connections.dec();
    // The slot is free before the client hears the end of its sync: a client that
    // reconnects at once, after the answer or the close, finds it free (the reply and
    // the drain of a refused connection are bounded by their own timeouts).
    drop(slot);
    match result {
        Ok(summary) => {
            shared.metrics.sync_ended(Outcome::ok);
            tracing::debug!(%peer, phases = %timings, "{summary}");
            let _ = stream.shutdown().await;
        }
        Err(failure) => {
            // The client hears first; the log line cannot delay or prevent its answer.
            let outcome = if failure.reply.is_some() {
                Outcome::refused
            } else {
                Outcome::failed
            };
            shared.metrics.sync_ended(outcome);
            if let Some(error) = failure.reply {
                reply_and_close(stream, Message::Error(error)).await;
            } else {
                let _ = stream.shutdown().await;
            }
            tracing::warn!(%peer, phases = %timings, "sync failed: {}", failure.log);
        }
    }
}

/// The stream stage: bytes in, decompressed, spooled as they are (for the worker to
/// decode again), and checked message by message through the session.
struct UploadReader<'s, S> {
    stream: &'s mut S,
    inbound: Inbound,
    decoder: FrameDecoder,
    session: ServerSession,
    buffer: Vec<u8>,
    started: Instant,
    hello_seen: bool,
    /// The decompressed byte stream, hello included.
    spool: Option<Spool>,
}

impl<S: AsyncRead + Unpin> UploadReader<'_, S> {
    /// Reads until the session takes its next step (hello, complete, acknowledgement).
    async fn next_step<B: Consolidated>(&mut self, shared: &Shared<B>) -> Result<Step, Failure> {
        let config = &shared.config;
        loop {
            while let Some(chunk) = self.inbound.next_chunk().map_err(inbound_refusal)? {
                if let Some(spool) = self.spool.as_mut() {
                    spool.append(chunk).await.map_err(|error| {
                        Failure::tell(WireError::new(ErrorCode::Internal, error.to_string()))
                    })?;
                }
                self.decoder.feed(chunk);
            }
            loop {
                let before = self.decoder.buffered_bytes();
                // Checked in full but not kept: the worker decodes the rows from the spool.
                let message = match self.decoder.next_message_checked() {
                    Ok(Some(message)) => message,
                    Ok(None) => break,
                    Err(error) => return Err(Failure::tell(decode_refusal(error))),
                };
                let frame_bytes = before - self.decoder.buffered_bytes();
                match self.session.handle(message, frame_bytes) {
                    Ok(Step::Continue) => {}
                    Ok(step @ Step::Hello(_)) => {
                        self.hello_seen = true;
                        return Ok(step);
                    }
                    Ok(step) => return Ok(step),
                    Err(error) => return Err(Failure::tell(error)),
                }
            }
            // Until the hello is in, the header timeout bounds the wait; then the upload
            // timeout bounds the whole upload, and every read the read timeout.
            let now = Instant::now();
            let (deadline, what) = if self.hello_seen {
                (self.started + config.upload_timeout, "upload timeout")
            } else {
                (
                    self.started + config.header_read_timeout,
                    "header read timeout",
                )
            };
            let wait = deadline
                .saturating_duration_since(now)
                .min(config.read_timeout);
            let read = match tokio::time::timeout(wait, self.stream.read(&mut self.buffer)).await {
                Err(_) => {
                    let reason = if Instant::now() >= deadline {
                        let limit = if self.hello_seen {
                            config.upload_timeout
                        } else {
                            config.header_read_timeout
                        };
                        let part = if self.hello_seen {
                            "the upload"
                        } else {
                            "the hello"
                        };
                        format!(
                            "{part} did not arrive within the {what} of {} ms",
                            limit.as_millis()
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
                let reason = match self.decoder.finish() {
                    Err(error) => error.to_string(),
                    Ok(()) => {
                        "the client closed the connection before the end of the upload".into()
                    }
                };
                return Err(Failure::silent(reason));
            }
            self.inbound
                .feed(&self.buffer[..read])
                .map_err(inbound_refusal)?;
        }
    }

    /// The reply's sender: the client's compression, announced by its preamble.
    fn outbound(&self) -> Result<Outbound, Failure> {
        let compression = self
            .inbound
            .preamble()
            .map(|preamble| preamble.compression)
            .unwrap_or_default();
        Outbound::new(compression, self.inbound.preamble().is_some())
            .map_err(|error| Failure::tell(WireError::new(ErrorCode::Internal, error.to_string())))
    }
}

async fn run_sync<B: Consolidated>(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin + Send),
    shared: &Shared<B>,
    timings: &mut PhaseTimings,
) -> Result<String, Failure> {
    let config = &shared.config;
    let metrics = &shared.metrics;
    let started = Instant::now();
    let upload_spool = Spool::new(
        config.upload_spool_memory_bytes_max,
        config.upload_bytes_max as u64 + FRAME_OVERHEAD_BYTES,
        Outbound::new(Compression::None, false).expect("plain output needs no codec"),
        Arc::clone(&shared.cache),
    );
    let mut reader = UploadReader {
        stream,
        inbound: Inbound::new(config.decompressed_bytes_max),
        decoder: FrameDecoder::new(config.frame_bytes_max),
        session: ServerSession::new(config.upload_bytes_max),
        buffer: vec![0u8; READ_CHUNK_BYTES],
        started,
        hello_seen: false,
        spool: Some(upload_spool),
    };
    let Step::Hello(hello) = reader.next_step(shared).await? else {
        unreachable!("the session's first step is the hello");
    };
    timings.record(metrics, Phase::connect, started.elapsed());

    // Authentication, before the rest of the upload is read: a refused client costs no
    // more than its hello.
    let authenticating = Instant::now();
    let user = authenticated_user(shared, &hello).await?;
    timings.record(metrics, Phase::authenticate, authenticating.elapsed());

    let receiving = Instant::now();
    let (upload_sequence, acknowledged) = match reader.next_step(shared).await? {
        Step::Complete(upload) => (upload.upload_sequence, None),
        Step::Acknowledge { watermark, .. } => (0, Some(watermark)),
        Step::Hello(_) | Step::Continue => unreachable!("one hello, then the upload"),
    };
    let wire_bytes_received = reader.inbound.wire_bytes();
    let mut outbound = reader.outbound()?;
    let upload_spool = reader.spool.take().expect("spooled until complete");
    timings.record(metrics, Phase::upload_received, receiving.elapsed());
    if let Some(watermark) = acknowledged {
        drop(upload_spool);
        return acknowledge(reader.stream, shared, &hello, user, watermark, outbound).await;
    }
    let stream = reader.stream;

    // The download is encoded into its spool while the worker reads it.
    let (sender, mut chunks) = download_channel();
    let message_bytes_max = config.download_message_bytes_max;
    let preamble = outbound.take_preamble();
    let mut spool = Spool::new(
        config.download_spool_memory_bytes_max,
        config.download_bytes_max,
        outbound,
        Arc::clone(&shared.cache),
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
    let waiting = Instant::now();
    let mut worker = shared
        .pool
        .acquire(&hello.script_version)
        .await
        .map_err(database_failure)?;
    timings.record(metrics, Phase::worker_wait, waiting.elapsed());
    // The upload is decoded from its spool only now, so syncs waiting for a worker hold
    // it encoded (and spilled when the cache is full), never twice.
    let tables = assemble_upload(upload_spool, config.frame_bytes_max)
        .await
        .map_err(|error| Failure::tell(WireError::new(ErrorCode::Protocol, error.to_string())))?;
    let request = Arc::new(SyncRequest {
        client_id: hello.client_id.clone(),
        user,
        script_version: hello.script_version.clone(),
        last_download_watermark: hello.last_download_watermark,
        upload_sequence,
        tables,
        auth_parameters: hello.auth_parameters.clone(),
    });
    let working = Instant::now();
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
    let database_time = working.elapsed();
    let applied = outcome.apply_time.min(database_time);
    timings.record(metrics, Phase::upload_applied, applied);
    timings.record(metrics, Phase::download_fetched, database_time - applied);
    shared
        .load
        .completed(outcome.summary.rows_uploaded + outcome.download_rows);
    metrics.rows_uploaded.inc_by(outcome.summary.rows_uploaded);
    metrics.rows_downloaded.inc_by(outcome.download_rows);
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
    let sending = Instant::now();
    let sent = send_spool(stream, shared, preamble, spool).await;
    timings.record(metrics, Phase::download_sent, sending.elapsed());
    if let Err(error) = sent {
        return Err(Failure::silent(format!(
            "sending the download failed after commit: {error}"
        )));
    }
    Ok(summary)
}

/// Room for the hello and end-of-upload frames beside `upload_bytes_max` in the spool.
const FRAME_OVERHEAD_BYTES: u64 = 64 * 1024;

/// Decodes the spooled byte stream again and merges its upload messages by table.
async fn assemble_upload(
    spool: Spool,
    frame_bytes_max: usize,
) -> Result<Vec<TableUpload>, SpoolError> {
    let mut decoder = FrameDecoder::new(frame_bytes_max);
    let mut tables: Vec<TableUpload> = Vec::new();
    spool
        .drain(|piece| {
            decoder.feed(piece);
            while let Some(message) = decoder
                .next_message()
                .map_err(|error| SpoolError::Decode(error.to_string()))?
            {
                if let Message::Upload(upload) = message {
                    merge(&mut tables, upload)
                        .map_err(|error| SpoolError::Decode(error.message.clone()))?;
                }
            }
            Ok(())
        })
        .await?;
    Ok(tables)
}

/// A download acknowledgement (its own short exchange): record it and run
/// `download_ack` on a worker, and echo it to confirm.
async fn acknowledge<B: Consolidated>(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin + Send),
    shared: &Shared<B>,
    hello: &Hello,
    user: String,
    watermark: i64,
    mut outbound: Outbound,
) -> Result<String, Failure> {
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
        Arc::clone(&shared.cache),
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
    preamble: Option<[u8; PREAMBLE_BYTES]>,
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
    match auth::authenticate(
        &shared.auth_pool,
        &shared.password_checks,
        &shared.config.tokens,
        hello,
    )
    .await
    {
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
