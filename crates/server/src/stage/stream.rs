//! The stream stage: the hello (within the header timeout), then authentication (on the
//! auth connections, never a worker), then the rest of the upload (within the upload
//! timeout), decompressed, checked message by message through the session and kept
//! encoded in a spool (memory while the cache has room, else a temporary file).

use std::net::SocketAddr;
use std::sync::Arc;

use rowsync_consolidated::Consolidated;
use rowsync_protocol::{
    Compression, CompressionError, DecodeError, ErrorCode, FrameDecoder, Hello, Inbound,
    InboundError, Outbound, WireError,
};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use crate::auth;
use crate::config::ServerConfig;
use crate::failure::Failure;
use crate::metrics::{Metrics, Phase, PhaseTimings};
use crate::pending::PendingHello;
use crate::session::{ServerSession, Step};
use crate::shared::{Shared, READ_CHUNK_BYTES};
use crate::spool::{Spool, SpoolError};

/// What the stream stage hands on: an authenticated client's checked upload, or its
/// acknowledgement of the last download (boxed: each holds a compressor's state).
pub(crate) enum Received {
    Upload(Box<CheckedUpload>),
    Acknowledgement(Box<Acknowledgement>),
}

/// An upload, complete and checked, kept encoded in its spool for a worker to decode.
pub(crate) struct CheckedUpload {
    pub(crate) hello: Hello,
    /// The authenticated user.
    pub(crate) user: String,
    pub(crate) upload_sequence: u64,
    /// The decompressed byte stream after the hello.
    pub(crate) spool: Spool,
    /// The reply's sender, compressing as the client asked.
    pub(crate) outbound: Outbound,
    /// Bytes received on the wire (compressed, if the client compressed).
    pub(crate) wire_bytes_received: u64,
}

/// A download acknowledgement (its own short exchange): no upload follows.
pub(crate) struct Acknowledgement {
    pub(crate) hello: Hello,
    /// The authenticated user.
    pub(crate) user: String,
    pub(crate) watermark: i64,
    /// The reply's sender, compressing as the client asked.
    pub(crate) outbound: Outbound,
}

/// Reads the hello, authenticates its user, then reads and checks the rest of the
/// upload into a spool; the phases `connect`, `authenticate` and `upload_received`.
pub(crate) async fn receive<B: Consolidated>(
    stream: &mut (impl AsyncRead + Unpin),
    peer: SocketAddr,
    shared: &Shared<B>,
    timings: &mut PhaseTimings,
) -> Result<Received, Failure> {
    let config = &shared.config;
    let metrics = &shared.metrics;
    let started = Instant::now();
    let upload_spool = Spool::new(
        config.upload_spool_memory_bytes_max,
        upload_spool_bytes_max(config),
        Outbound::new(Compression::None, false).expect("plain output needs no codec"),
        Arc::clone(&shared.cache),
    );
    let mut reader = UploadReader {
        stream,
        inbound: Inbound::new(config.decompressed_bytes_max),
        decoder: upload_decoder(config),
        session: ServerSession::new(config.upload_bytes_max),
        buffer: vec![0u8; READ_CHUNK_BYTES],
        started,
        hello_seen: false,
        spool: Some(upload_spool),
        metrics,
        pending: Some(shared.pending_hellos.register()),
    };
    let Step::Hello(hello) = reader.next_step(config).await? else {
        unreachable!("the session's first step is the hello");
    };
    timings.record(metrics, Phase::connect, started.elapsed());

    // Authentication, before the rest of the upload is read: a refused client costs no
    // more than its hello.
    let authenticating = Instant::now();
    let user = throttled_login(shared, peer, &hello)
        .await
        .map_err(|failure| failure.of(&hello))?;
    timings.record(metrics, Phase::authenticate, authenticating.elapsed());

    let receiving = Instant::now();
    let step = reader
        .next_step(config)
        .await
        .map_err(|failure| failure.of(&hello))?;
    let (upload_sequence, acknowledged) = match step {
        Step::Complete(upload) => (upload.upload_sequence, None),
        Step::Acknowledge { watermark, .. } => (0, Some(watermark)),
        Step::Hello(_) | Step::Continue => unreachable!("one hello, then the upload"),
    };
    let wire_bytes_received = reader.inbound.wire_bytes();
    let outbound = reader.outbound()?;
    let spool = reader.spool.take().expect("spooled until complete");
    timings.record(metrics, Phase::upload_received, receiving.elapsed());
    Ok(match acknowledged {
        Some(watermark) => {
            drop(spool);
            Received::Acknowledgement(Box::new(Acknowledgement {
                hello,
                user,
                watermark,
                outbound,
            }))
        }
        None => Received::Upload(Box::new(CheckedUpload {
            hello,
            user,
            upload_sequence,
            spool,
            outbound,
            wire_bytes_received,
        })),
    })
}

/// Bytes in, decompressed, spooled as they are (for the worker to decode again), and
/// checked message by message through the session.
struct UploadReader<'s, S> {
    stream: &'s mut S,
    inbound: Inbound,
    decoder: FrameDecoder,
    session: ServerSession,
    buffer: Vec<u8>,
    started: Instant,
    hello_seen: bool,
    /// The decompressed byte stream after the hello.
    spool: Option<Spool>,
    metrics: &'s Metrics,
    /// This connection's place among those waiting for their hello, until it arrives.
    pending: Option<PendingHello<'s>>,
}

impl<S: AsyncRead + Unpin> UploadReader<'_, S> {
    /// Reads until the session takes its next step (hello, complete, acknowledgement).
    /// Inflates no more than the next frame needs (its header, then the length the
    /// header announced), so a decompression bomb costs at most one frame; and spools
    /// nothing before the hello is in (the worker reads only the upload's messages).
    async fn next_step(&mut self, config: &ServerConfig) -> Result<Step, Failure> {
        loop {
            if let Some(step) = self.checked_step()? {
                return Ok(step);
            }
            let needed = self.decoder.bytes_needed();
            if let Some(chunk) = self
                .inbound
                .next_chunk_at_most(needed)
                .map_err(inbound_refusal)?
            {
                self.metrics
                    .upload_decompressed_bytes
                    .inc_by(chunk.len() as u64);
                if let Some(spool) = self.spool.as_mut().filter(|_| self.hello_seen) {
                    self.metrics.upload_spooled_bytes.inc_by(chunk.len() as u64);
                    spool
                        .append(chunk)
                        .await
                        .map_err(|error| spool_refusal(error, config))?;
                }
                self.decoder.feed(chunk);
                continue;
            }
            let read = self.read(config).await?;
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

    /// Checks the complete messages decoded so far, until the session takes a step.
    fn checked_step(&mut self) -> Result<Option<Step>, Failure> {
        loop {
            let before = self.decoder.buffered_bytes();
            // Checked in full but not kept: the worker decodes the rows from the spool.
            let message = match self.decoder.next_message_checked() {
                Ok(message) => message,
                Err(error) => return Err(Failure::tell(decode_refusal(error))),
            };
            let frame_bytes = before - self.decoder.buffered_bytes();
            let Some(message) = message else {
                // Value pieces taken without a message after them count all the same.
                self.session.count(frame_bytes).map_err(Failure::tell)?;
                return Ok(None);
            };
            match self.session.handle(message, frame_bytes) {
                Ok(Step::Continue) => {}
                Ok(step @ Step::Hello(_)) => {
                    self.hello_seen = true;
                    self.pending = None;
                    return Ok(Some(step));
                }
                Ok(step) => return Ok(Some(step)),
                Err(error) => return Err(Failure::tell(error)),
            }
        }
    }

    /// One read into the buffer. Until the hello is in, the header timeout bounds the
    /// wait; then the upload timeout bounds the whole upload, and every read the read
    /// timeout.
    async fn read(&mut self, config: &ServerConfig) -> Result<usize, Failure> {
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
        let reading = tokio::time::timeout(wait, self.stream.read(&mut self.buffer));
        let read = match &self.pending {
            Some(pending) => tokio::select! {
                read = reading => read,
                () = pending.evicted() => {
                    return Err(Failure::tell(WireError::new(
                        ErrorCode::Timeout,
                        format!(
                            "the hello did not arrive before newer connections needed the room \
                             (at most {} connections wait for their hello)",
                            config.hello_pending_connections_max
                        ),
                    )));
                }
            },
            None => reading.await,
        };
        match read {
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
                Err(Failure::tell(WireError::new(ErrorCode::Timeout, reason)))
            }
            Ok(Err(error)) => Err(Failure::silent(format!(
                "reading the upload failed: {error}"
            ))),
            Ok(Ok(read)) => Ok(read),
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

/// The authenticated user of a hello, unless its address or user name has too many
/// refused logins in the current window (refused unchecked: no database, no argon2);
/// a refusal counts against both.
async fn throttled_login<B: Consolidated>(
    shared: &Shared<B>,
    peer: SocketAddr,
    hello: &Hello,
) -> Result<String, Failure> {
    let throttle = &shared.login_throttle;
    let address = peer.ip();
    if let Err(throttled) = throttle.check(address, &hello.user, std::time::Instant::now()) {
        shared.metrics.logins_throttled.inc();
        return Err(Failure::tell(WireError::new(
            ErrorCode::AuthenticationFailed,
            format!(
                "authentication failed: too many failed logins for this {}; try again in {} s",
                throttled.by,
                throttled.retry_after.as_secs().max(1)
            ),
        )));
    }
    let authenticated = authenticated_user(shared, hello).await;
    match &authenticated {
        Ok(_) => throttle.succeeded(&hello.user),
        Err(failure)
            if failure.reply.as_ref().and_then(WireError::error_code)
                == Some(ErrorCode::AuthenticationFailed) =>
        {
            throttle.failed(address, &hello.user, std::time::Instant::now());
        }
        Err(_) => {}
    }
    authenticated
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

/// The upload spool's limit: what the session accepts (`upload_bytes_max`, checked as
/// each frame completes) plus the one frame being assembled, so the session or the
/// decompression limit refuses an oversized upload (code 5) before the spool would.
fn upload_spool_bytes_max(config: &ServerConfig) -> u64 {
    config.upload_bytes_max as u64 + config.frame_bytes_max as u64
}

/// A spool that cannot take more of the upload: too large is code 5 like the session's
/// refusal (should the spool ever refuse first); a failing disk is the server's problem.
fn spool_refusal(error: SpoolError, config: &ServerConfig) -> Failure {
    let wire = match error {
        SpoolError::TooLarge { .. } => WireError::new(
            ErrorCode::UploadTooLarge,
            format!(
                "the upload exceeds the server's limit of {} bytes",
                config.upload_bytes_max
            ),
        ),
        error => WireError::new(
            ErrorCode::Internal,
            format!("spooling the upload failed: {error}"),
        ),
    };
    Failure::tell(wire)
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

/// The upload's frame decoder: a value in pieces is refused above `value_bytes_max`
/// (at its `value_start`, before its bytes arrive); the values in pieces of one row
/// are bounded by the upload's own limit.
pub(crate) fn upload_decoder(config: &ServerConfig) -> FrameDecoder {
    FrameDecoder::new(config.frame_bytes_max)
        .with_value_limits(config.value_bytes_max, config.upload_bytes_max as u64)
}

fn decode_refusal(error: DecodeError) -> WireError {
    match error {
        DecodeError::FrameTooLarge { .. } => {
            WireError::new(ErrorCode::FrameTooLarge, error.to_string())
        }
        DecodeError::ValueTooLarge { length, limit } => WireError::new(
            ErrorCode::UploadTooLarge,
            format!(
                "the upload holds a value of {length} bytes, above the server's \
                 value_bytes_max of {limit} bytes"
            ),
        ),
        DecodeError::RowPiecesTooLarge { .. } => {
            WireError::new(ErrorCode::UploadTooLarge, error.to_string())
        }
        _ => WireError::new(ErrorCode::Protocol, error.to_string()),
    }
}
