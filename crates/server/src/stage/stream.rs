//! The stream stage: the hello (within the header timeout), then authentication (on the
//! auth connections, never a worker), then the rest of the upload (within the upload
//! timeout), decompressed, checked message by message through the session and kept
//! encoded in a spool (memory while the cache has room, else a temporary file).

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
use crate::metrics::{Phase, PhaseTimings};
use crate::session::{ServerSession, Step};
use crate::shared::{Shared, READ_CHUNK_BYTES};
use crate::spool::Spool;

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
    /// The decompressed byte stream, hello included.
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

/// Room for the hello and end-of-upload frames beside `upload_bytes_max` in the spool.
const FRAME_OVERHEAD_BYTES: u64 = 64 * 1024;

/// Reads the hello, authenticates its user, then reads and checks the rest of the
/// upload into a spool; the phases `connect`, `authenticate` and `upload_received`.
pub(crate) async fn receive<B: Consolidated>(
    stream: &mut (impl AsyncRead + Unpin),
    shared: &Shared<B>,
    timings: &mut PhaseTimings,
) -> Result<Received, Failure> {
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
    let Step::Hello(hello) = reader.next_step(config).await? else {
        unreachable!("the session's first step is the hello");
    };
    timings.record(metrics, Phase::connect, started.elapsed());

    // Authentication, before the rest of the upload is read: a refused client costs no
    // more than its hello.
    let authenticating = Instant::now();
    let user = authenticated_user(shared, &hello).await?;
    timings.record(metrics, Phase::authenticate, authenticating.elapsed());

    let receiving = Instant::now();
    let (upload_sequence, acknowledged) = match reader.next_step(config).await? {
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
    /// The decompressed byte stream, hello included.
    spool: Option<Spool>,
}

impl<S: AsyncRead + Unpin> UploadReader<'_, S> {
    /// Reads until the session takes its next step (hello, complete, acknowledgement).
    async fn next_step(&mut self, config: &ServerConfig) -> Result<Step, Failure> {
        loop {
            while let Some(chunk) = self.inbound.next_chunk().map_err(inbound_refusal)? {
                if let Some(spool) = self.spool.as_mut() {
                    spool.append(chunk).await.map_err(|error| {
                        Failure::tell(WireError::new(ErrorCode::Internal, error.to_string()))
                    })?;
                }
                self.decoder.feed(chunk);
            }
            if let Some(step) = self.checked_step()? {
                return Ok(step);
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
                Ok(Some(message)) => message,
                Ok(None) => return Ok(None),
                Err(error) => return Err(Failure::tell(decode_refusal(error))),
            };
            let frame_bytes = before - self.decoder.buffered_bytes();
            match self.session.handle(message, frame_bytes) {
                Ok(Step::Continue) => {}
                Ok(step @ Step::Hello(_)) => {
                    self.hello_seen = true;
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
        match tokio::time::timeout(wait, self.stream.read(&mut self.buffer)).await {
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
