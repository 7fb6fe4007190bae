//! The stream stage: the hello (within the header timeout), then authentication (on the
//! auth connections, never a worker), then the rest of the upload (within the upload
//! timeout), decompressed, checked message by message through the session and kept
//! encoded in a spool (memory while the cache has room, else a temporary file).

use std::net::SocketAddr;
use std::sync::Arc;

use rowsync_consolidated::Consolidated;
use rowsync_protocol::{
    zstd_decoder_bytes, zstd_stream_window, Compression, ErrorCode, Hello, Outbound, Preamble,
    WireError, ZstdWindow, PREAMBLE_BYTES, PREAMBLE_MAGIC,
};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use crate::auth;
use crate::auth::Login;
use crate::config::ServerConfig;
use crate::decoders::{ZstdDecoderRoom, ZstdDecoders};
use crate::failure::Failure;
use crate::held::{self, Transfer};
use crate::metrics::{Metrics, Phase, PhaseTimings};
use crate::monitor::Identity;
use crate::pending::PendingHello;
use crate::record::SyncRecording;
use crate::session::Step;
use crate::session_token::IssuedToken;
use crate::shared::holding::HoldingGuard;
use crate::shared::{Shared, READ_CHUNK_BYTES};
use crate::spool::{Spool, SpoolError};
use crate::upload_stream::{UploadEvent, UploadLimits, UploadStream};

/// What the stream stage hands on: an authenticated client's checked upload, or its
/// acknowledgement of the last download (boxed: each holds a compressor's state).
pub(crate) enum Received {
    Upload(Box<CheckedUpload>),
    Acknowledgement(Box<Acknowledgement>),
    HeldQuery(Box<HeldQuery>),
    DownloadResume(Box<DownloadResumeQuery>),
    /// A download's receipt as a request of its own (HTTP; see `receipt`): no hello.
    Receipt {
        transfer_id: String,
        offset: u64,
    },
}

/// A request for the rest of a cut download (protocol v4, its own short exchange): no
/// upload follows.
pub(crate) struct DownloadResumeQuery {
    pub(crate) hello: Hello,
    /// The authenticated user.
    pub(crate) user: String,
    pub(crate) transfer_id: String,
    pub(crate) offset: u64,
    /// The reply's sender, compressing as the client asked.
    pub(crate) outbound: Outbound,
}

/// A question about a cut transfer (protocol v3, its own short exchange): no upload
/// follows.
pub(crate) struct HeldQuery {
    pub(crate) hello: Hello,
    /// The authenticated user.
    pub(crate) user: String,
    pub(crate) transfer_id: String,
    /// The reply's sender, compressing as the client asked.
    pub(crate) outbound: Outbound,
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
    /// The transfer a v3 client named; its held start goes once the sync committed.
    pub(crate) transfer: Option<Transfer>,
    /// A session token for the client (protocol v8), sent before the download's end.
    pub(crate) session_token: Option<IssuedToken>,
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
    let retry_after_ms = || shared.retry_after_ms();
    let mut reader = UploadReader::new(stream, shared, started, &retry_after_ms);
    let hello = match reader.next_step(config).await? {
        Step::Hello(hello) => hello,
        Step::Receipt {
            transfer_id,
            offset,
        } => {
            reader.pending = None;
            return Ok(Received::Receipt {
                transfer_id,
                offset,
            });
        }
        _ => unreachable!("the session's first step is the hello or a receipt"),
    };
    timings.record(metrics, Phase::connect, started.elapsed());
    if hello.protocol_version >= rowsync_protocol::RESUME_SINCE_VERSION && !hello.download_ack {
        // A transfer (or a question about one) from here on; see `shared::holding::Holding`.
        reader.receiving = Some(shared.holding.begin(&hello.client_id));
    }
    observe_hello(shared, timings, &hello);
    rowsync_consolidated::failpoint!("after_hello");

    // Authentication, before the rest of the upload is read: a refused client costs no
    // more than its hello.
    let authenticating = Instant::now();
    let Login {
        user,
        session_token,
    } = throttled_login(shared, peer, &hello)
        .await
        .map_err(|failure| failure.of(&hello))?;
    timings.record(metrics, Phase::authenticate, authenticating.elapsed());

    let receiving = Instant::now();
    reader.recording = timings.recording.take();
    let step = reader.rest_of_upload(shared, &hello, &user).await;
    timings.recording = reader.recording.take();
    let step = match step {
        Ok(step) => step,
        Err(failure) => {
            reader.hold_if_cut(shared, &hello, &user).await;
            return Err(failure.of(&hello));
        }
    };
    let wire_bytes_received = reader.upload.wire_bytes();
    let outbound = reader.outbound()?;
    let spool = reader.spool.take().expect("spooled until complete");
    timings.record(metrics, Phase::upload_received, receiving.elapsed());
    let upload_sequence = match step {
        Step::Complete(upload) => upload.upload_sequence,
        step => {
            // A short exchange of its own, not replayed; an answer about a transfer
            // waits for the client's other connections, not for this one.
            timings.recording = None;
            reader.receiving = None;
            return Ok(short_exchange(step, hello, user, outbound));
        }
    };
    Ok(Received::Upload(Box::new(CheckedUpload {
        hello,
        user,
        upload_sequence,
        spool,
        outbound,
        wire_bytes_received,
        transfer: reader.transfer.take(),
        session_token,
    })))
}

/// What the stream stage hands on for a session that is not an upload: a download
/// acknowledgement, a question about a held upload, a download resumption.
fn short_exchange(step: Step, hello: Hello, user: String, outbound: Outbound) -> Received {
    match step {
        Step::Acknowledge { watermark, .. } => {
            Received::Acknowledgement(Box::new(Acknowledgement {
                hello,
                user,
                watermark,
                outbound,
            }))
        }
        Step::HeldQuery { transfer_id, .. } => Received::HeldQuery(Box::new(HeldQuery {
            hello,
            user,
            transfer_id,
            outbound,
        })),
        Step::DownloadResume {
            transfer_id,
            offset,
            ..
        } => Received::DownloadResume(Box::new(DownloadResumeQuery {
            hello,
            user,
            transfer_id,
            offset,
            outbound,
        })),
        Step::Complete(_)
        | Step::Hello(_)
        | Step::Receipt { .. }
        | Step::Continue
        | Step::UnknownTable(_)
        | Step::Resume { .. } => unreachable!("one hello, then the upload"),
    }
}

/// The hello names the sync for the monitor and opens its recording (if recording).
fn observe_hello<B: Consolidated>(shared: &Shared<B>, timings: &mut PhaseTimings, hello: &Hello) {
    if let Some(watch) = &timings.watch {
        watch.identify(Identity {
            user: hello.user.clone(),
            client_id: hello.client_id.clone(),
            script_version: hello.script_version.clone(),
        });
    }
    if let Some(recorder) = &shared.config.recorder {
        timings.recording = recorder.begin(hello);
    }
}

/// Bytes in, decompressed, spooled as they are (for the worker to decode again), and
/// checked message by message through the session ([`UploadStream`]).
struct UploadReader<'s, S> {
    stream: &'s mut S,
    upload: UploadStream,
    /// Small until the hello is in and authenticated (a burst waits for authentication
    /// by the thousand), then `READ_CHUNK_BYTES`.
    buffer: Vec<u8>,
    /// The stream's first bytes, held back until they tell which decoder it needs
    /// (`None` once fed).
    head: Option<Vec<u8>>,
    zstd_decoders: &'s ZstdDecoders,
    /// Room reserved for this stream's zstd decoder, until the upload is read.
    decoder_room: Option<ZstdDecoderRoom>,
    started: Instant,
    /// The decompressed byte stream after the hello.
    spool: Option<Spool>,
    metrics: &'s Metrics,
    /// This connection's place among those waiting for their hello, until it arrives.
    pending: Option<PendingHello<'s>>,
    /// The retry hint for a connection evicted before its hello.
    retry_after_ms: &'s (dyn Fn() -> u32 + Sync),
    /// The sync's recording, which keeps the upload bytes too.
    recording: Option<SyncRecording>,
    /// The transfer a v3 upload named (protocol v3).
    transfer: Option<Transfer>,
    /// Marks the transfer as being received, until this reader is gone (`held`).
    receiving: Option<HoldingGuard<'s>>,
    /// The connection ended or stalled before the upload did (not a refusal): what
    /// arrived of the transfer is worth holding.
    cut: bool,
}

impl<'s, S: AsyncRead + Unpin> UploadReader<'s, S> {
    /// A reader of a new connection's stream, before its hello.
    fn new<B: Consolidated>(
        stream: &'s mut S,
        shared: &'s Shared<B>,
        started: Instant,
        retry_after_ms: &'s (dyn Fn() -> u32 + Sync),
    ) -> UploadReader<'s, S> {
        let config = &shared.config;
        let metrics = &shared.metrics;
        let upload_spool = Spool::new(
            config.upload_spool_memory_bytes_max,
            upload_spool_bytes_max(config),
            Outbound::new(Compression::None, false).expect("plain output needs no codec"),
            Arc::clone(&shared.cache),
        );
        UploadReader {
            stream,
            upload: UploadStream::new(UploadLimits::of(config)),
            buffer: vec![0u8; HELLO_READ_CHUNK_BYTES],
            head: Some(Vec::new()),
            zstd_decoders: &shared.zstd_decoders,
            decoder_room: None,
            started,
            spool: Some(upload_spool),
            metrics,
            pending: Some(shared.pending_hellos.register()),
            retry_after_ms,
            recording: None,
            transfer: None,
            receiving: None,
            cut: false,
        }
    }

    /// Reads until the session takes its next step (hello, complete, acknowledgement).
    /// Inflates no more than the next frame needs, and spools nothing before the hello
    /// is in (the worker reads only the upload's messages).
    async fn next_step(&mut self, config: &ServerConfig) -> Result<Step, Failure> {
        loop {
            match self.upload.next_event().map_err(Failure::tell)? {
                UploadEvent::Step(step) => {
                    if matches!(step, Step::Hello(_)) {
                        self.pending = None;
                    }
                    return Ok(step);
                }
                UploadEvent::Inflated { bytes, spool } => {
                    self.metrics
                        .upload_decompressed_bytes
                        .inc_by(bytes.len() as u64);
                    if let Some(upload_spool) = self.spool.as_mut().filter(|_| spool) {
                        self.metrics.upload_spooled_bytes.inc_by(bytes.len() as u64);
                        if let Some(recording) = self.recording.as_mut() {
                            recording.append(bytes);
                        }
                        upload_spool
                            .append(bytes)
                            .await
                            .map_err(|error| spool_refusal(error, config))?;
                        rowsync_consolidated::failpoint!("mid_upload");
                    }
                }
                UploadEvent::NeedInput => {
                    let read = self.read(config).await?;
                    if read == 0 {
                        self.cut = true;
                        return Err(Failure::silent(self.upload.ended_early()));
                    }
                    let Some(head) = self.head.as_mut() else {
                        self.upload
                            .feed(&self.buffer[..read])
                            .map_err(Failure::tell)?;
                        continue;
                    };
                    head.extend_from_slice(&self.buffer[..read]);
                    match decoder_need(head) {
                        DecoderNeed::MoreBytes => continue,
                        DecoderNeed::Nothing => {}
                        DecoderNeed::Zstd { window_bytes } => {
                            self.make_room(window_bytes, config).await?;
                        }
                    }
                    let head = self.head.take().expect("held back above");
                    self.upload.feed(&head).map_err(Failure::tell)?;
                }
            }
        }
    }

    /// Reads the rest of the upload (or the acknowledgement), refusing a table the script
    /// version does not synchronize as its first chunk arrives: the version's tables come
    /// from the cache, and are loaded again (once per upload) before a table is refused.
    async fn rest_of_upload<B: Consolidated>(
        &mut self,
        shared: &'s Shared<B>,
        hello: &Hello,
        user: &str,
    ) -> Result<Step, Failure> {
        let version = hello.script_version.as_str();
        self.upload.check_tables();
        let mut loaded = false;
        loop {
            let table = match self.next_step(&shared.config).await? {
                Step::UnknownTable(table) => table,
                Step::Resume {
                    transfer_id,
                    offset,
                } => {
                    let transfer = Transfer {
                        transfer_id,
                        offset,
                    };
                    if offset > 0 {
                        // Not counting itself, it waits for the client's other ones.
                        self.receiving = None;
                        let held = held::held_prefix(shared, hello, user, &transfer).await?;
                        self.upload.resume_with(held);
                        self.receiving = Some(shared.holding.begin(&hello.client_id));
                    }
                    self.transfer = Some(transfer);
                    continue;
                }
                step => return Ok(step),
            };
            let cached = shared
                .version_tables
                .cached(version)
                .filter(|tables| tables.tables.contains(&table));
            let tables = match cached {
                Some(tables) => Some(tables),
                None if !loaded => {
                    loaded = true;
                    shared.metrics.version_tables_loads.inc();
                    let tables = shared
                        .version_tables
                        .load(&shared.auth_pool, version)
                        .await
                        .map_err(|error| {
                            Failure::tell(WireError::new(error.code(), error.to_string()))
                        })?;
                    Some(tables)
                }
                None => None,
            };
            self.upload.resolve_table(tables).map_err(Failure::tell)?;
        }
    }

    /// Waits for room for a zstd decoder of `window_bytes` (`zstd_decoders_bytes_max`),
    /// as long as the hello may take to arrive and unless the connection is told to make
    /// room for newer ones; the decoder then refuses any frame asking for more.
    async fn make_room(&mut self, window_bytes: u64, config: &ServerConfig) -> Result<(), Failure> {
        let bytes = zstd_decoder_bytes(window_bytes);
        let deadline = self.started + config.header_read_timeout;
        let reserving = tokio::time::timeout_at(deadline, self.zstd_decoders.reserve(bytes));
        let room = match &self.pending {
            Some(pending) => tokio::select! {
                biased;
                room = reserving => room.ok(),
                () = pending.evicted() => None,
            },
            None => reserving.await.ok(),
        };
        let Some(room) = room else {
            return Err(Failure::busy(
                (self.retry_after_ms)(),
                format!(
                    "no room for a zstd decoder of {bytes} bytes (a {window_bytes}-byte window) \
                     among the connections' decoders (zstd_decoders_bytes_max {} bytes) within \
                     the header read timeout; answered busy",
                    config.zstd_decoders_bytes_max
                ),
            ));
        };
        self.upload.limit_zstd_window(window_bytes);
        self.decoder_room = Some(room);
        Ok(())
    }

    /// Holds what arrived of a v3 transfer when the connection was cut (see `held`).
    async fn hold_if_cut<B: Consolidated>(
        &mut self,
        shared: &Shared<B>,
        hello: &Hello,
        user: &str,
    ) {
        if !self.cut {
            return;
        }
        if let (Some(transfer), Some(spool)) = (self.transfer.take(), self.spool.take()) {
            held::hold_cut(shared, hello, user, &transfer, spool).await;
        }
    }

    /// One read into the buffer. Until the hello is in, the header timeout bounds the
    /// wait; then the upload timeout bounds the whole upload, and every read the read
    /// timeout.
    async fn read(&mut self, config: &ServerConfig) -> Result<usize, Failure> {
        if self.buffer.len() < READ_CHUNK_BYTES && self.upload.hello_seen() {
            self.buffer.resize(READ_CHUNK_BYTES, 0);
        }
        let now = Instant::now();
        let (deadline, what) = if self.upload.hello_seen() {
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
            // Bytes already there win over an eviction: a client whose hello arrived
            // while the server was busy accepting others is not turned away.
            Some(pending) => tokio::select! {
                biased;
                read = reading => read,
                () = pending.evicted() => {
                    return Err(Failure::busy(
                        (self.retry_after_ms)(),
                        format!(
                            "the hello did not arrive before newer connections needed the room \
                             (at most {} connections wait for their hello); answered busy",
                            config.hello_pending_connections_max
                        ),
                    ));
                }
            },
            None => reading.await,
        };
        if !matches!(read, Ok(Ok(read)) if read > 0) {
            self.cut = true;
        }
        match read {
            Err(_) => {
                let reason = if Instant::now() >= deadline {
                    let limit = if self.upload.hello_seen() {
                        config.upload_timeout
                    } else {
                        config.header_read_timeout
                    };
                    let part = if self.upload.hello_seen() {
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
        let preamble = self.upload.preamble();
        let compression = preamble
            .map(|preamble| preamble.compression)
            .unwrap_or_default();
        Outbound::new(compression, preamble.is_some())
            .map_err(|error| Failure::tell(WireError::new(ErrorCode::Internal, error.to_string())))
    }
}

/// Bytes read at a time until the hello is in: a preamble and a hello take a few
/// hundred.
const HELLO_READ_CHUNK_BYTES: usize = 4 * 1024;

/// What a stream's first bytes say about the decoder it needs.
enum DecoderNeed {
    /// Not enough bytes yet to tell.
    MoreBytes,
    /// No zstd decoder (plain frames, zlib, or a preamble the stream refuses).
    Nothing,
    /// A zstd decoder of this window.
    Zstd { window_bytes: u64 },
}

fn decoder_need(head: &[u8]) -> DecoderNeed {
    let Some(&first) = head.first() else {
        return DecoderNeed::MoreBytes;
    };
    if first != PREAMBLE_MAGIC[0] {
        return DecoderNeed::Nothing;
    }
    let Some(preamble) = head.get(..PREAMBLE_BYTES) else {
        return DecoderNeed::MoreBytes;
    };
    let preamble: &[u8; PREAMBLE_BYTES] = preamble.try_into().expect("sliced to length");
    match Preamble::decode(preamble) {
        Ok(Preamble {
            compression: Compression::Zstd,
        }) => match zstd_stream_window(&head[PREAMBLE_BYTES..]) {
            ZstdWindow::NeedMore => DecoderNeed::MoreBytes,
            ZstdWindow::Bytes(window_bytes) => DecoderNeed::Zstd { window_bytes },
        },
        _ => DecoderNeed::Nothing,
    }
}

/// The authenticated user of a hello, unless its address, its user name at the address,
/// or its user name (at an address that failed too) has too many refused logins in the
/// current window (refused unchecked: no database, no argon2); a refusal counts
/// against all three (`throttle`).
async fn throttled_login<B: Consolidated>(
    shared: &Shared<B>,
    peer: SocketAddr,
    hello: &Hello,
) -> Result<Login, Failure> {
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
        Ok(_) => throttle.succeeded(address, &hello.user),
        Err(failure)
            if failure.error().and_then(WireError::error_code)
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
) -> Result<Login, Failure> {
    let checks = auth::LoginChecks {
        pool: &shared.auth_pool,
        password_checks: &shared.password_checks,
        tokens: &shared.config.tokens,
        session_tokens: &shared.session_tokens,
    };
    match auth::authenticate(&checks, hello).await {
        Ok(login) => Ok(login),
        Err(auth::AuthFailure::Refused(reason)) => Err(Failure::tell(WireError::new(
            ErrorCode::AuthenticationFailed,
            format!("authentication failed: {reason}"),
        ))),
        Err(auth::AuthFailure::Sync(error)) => Err(Failure::tell(WireError::new(
            error.code(),
            error.to_string(),
        ))),
        Err(auth::AuthFailure::UnknownScriptVersion(message)) => Err(Failure::tell(
            WireError::new(ErrorCode::UnknownScriptVersion, message),
        )),
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

#[cfg(test)]
mod tests {
    use super::*;
    use rowsync_protocol::compress_all;

    #[test]
    fn a_streams_first_bytes_tell_the_decoder_it_needs() {
        let zstd = |frames: &[u8]| {
            let mut bytes = Preamble {
                compression: Compression::Zstd,
            }
            .encode()
            .to_vec();
            bytes.extend(compress_all(Compression::Zstd, frames).unwrap());
            bytes
        };
        let stream = zstd(b"\x00\x00\x00\x05\x07\x00\x00\x05\xdc");
        for cut in 0..PREAMBLE_BYTES + 6 {
            assert!(
                matches!(decoder_need(&stream[..cut]), DecoderNeed::MoreBytes),
                "{cut}"
            );
        }
        assert!(matches!(
            decoder_need(&stream),
            DecoderNeed::Zstd {
                window_bytes: 2097152
            }
        ));
        // Plain frames, zlib, a preamble the stream refuses: no zstd decoder.
        assert!(matches!(decoder_need(b"\x00\x00"), DecoderNeed::Nothing));
        let mut zlib = Preamble {
            compression: Compression::Zlib,
        }
        .encode()
        .to_vec();
        zlib.push(0x78);
        assert!(matches!(decoder_need(&zlib), DecoderNeed::Nothing));
        assert!(matches!(
            decoder_need(b"RSYX\x01\x02\x00\x00"),
            DecoderNeed::Nothing
        ));
    }
}
