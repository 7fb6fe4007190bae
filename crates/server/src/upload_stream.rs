//! The bytes of one sync's upload as they arrive, turned into the session's steps. No
//! I/O: the stream stage feeds what it reads and spools what this hands back; the fuzz
//! targets (`fuzz/`) and their corpus replay feed it the same way.
//!
//! Wire bytes go through [`Inbound`] (preamble, decompression under
//! `decompressed_bytes_max`), then a [`FrameDecoder`] (frames under `frame_bytes_max`),
//! then [`check_message`](rowsync_protocol::check_message) and the [`ServerSession`]
//! (upload under `upload_bytes_max`). No more is inflated than the next frame needs, so
//! a decompression bomb costs at most one frame; nothing is spooled before the hello.

use rowsync_protocol::{
    CompressionError, DecodeError, ErrorCode, FrameDecoder, Inbound, InboundError, Preamble,
    WireError, PIECES_SINCE_VERSION, RESUME_SINCE_VERSION,
};

use std::sync::Arc;

use crate::session::{ServerSession, Step, VersionTables};

/// The limits one upload is read under (each a [`ServerConfig`](crate::ServerConfig)
/// setting of the same name).
#[derive(Debug, Clone, Copy)]
pub struct UploadLimits {
    pub decompressed_bytes_max: u64,
    pub frame_bytes_max: usize,
    pub upload_bytes_max: usize,
    /// The largest text or blob value taken in pieces (protocol v2).
    pub value_bytes_max: u64,
}

impl UploadLimits {
    /// The limits `config` sets.
    pub fn of(config: &crate::ServerConfig) -> UploadLimits {
        UploadLimits {
            decompressed_bytes_max: config.decompressed_bytes_max,
            frame_bytes_max: config.frame_bytes_max,
            upload_bytes_max: config.upload_bytes_max,
            value_bytes_max: config.value_bytes_max,
        }
    }
}

/// What the upload stream has for its reader next.
// A step carries a hello (with its tables since v9); the event lives for one frame and
// is matched at once, so boxing it would only add an allocation per step.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum UploadEvent<'a> {
    /// The session took a step (hello, complete upload, acknowledgement).
    Step(Step),
    /// Bytes inflated (already handed to the frame decoder); `spool` is true once the
    /// hello (and, protocol v3, the `upload_resume` after it) is in, when the reader
    /// keeps them for the worker: the transfer's stream.
    Inflated { bytes: &'a [u8], spool: bool },
    /// Everything fed so far is used up: read and feed more.
    NeedInput,
}

/// One upload's byte stream, from the wire to the session's steps.
pub struct UploadStream {
    inbound: Inbound,
    decoder: FrameDecoder,
    session: ServerSession,
    hello_seen: bool,
    /// Protocol v3: the hello is in, the `upload_resume` (or `upload_held`) not yet.
    awaiting_transfer: bool,
    /// The start of a resumed transfer's stream, as the server held it: fed to the
    /// decoder before any more of the wire's bytes.
    held: Vec<u8>,
    held_fed: usize,
}

impl UploadStream {
    pub fn new(limits: UploadLimits) -> UploadStream {
        UploadStream {
            inbound: Inbound::new(limits.decompressed_bytes_max),
            decoder: upload_decoder(&limits),
            session: ServerSession::new(limits.upload_bytes_max),
            hello_seen: false,
            awaiting_transfer: false,
            held: Vec::new(),
            held_fed: 0,
        }
    }

    /// Resumes a transfer after its [`Step::Resume`]: `held` (the transfer's stream up to
    /// the offset the client named) goes through the decoder, the checks and the spool
    /// as if it had just arrived, before the bytes that follow on the wire.
    pub fn resume_with(&mut self, held: Vec<u8>) {
        self.held = held;
        self.held_fed = 0;
    }

    /// Refuses a zstd stream whose frame asks for a window above `bytes` (the room
    /// reserved for its decoder); before the first bytes are fed.
    pub fn limit_zstd_window(&mut self, bytes: u64) {
        self.inbound.limit_zstd_window(bytes);
    }

    /// Adds bytes read from the wire. Feed again only after [`UploadStream::next_event`]
    /// answered [`UploadEvent::NeedInput`].
    pub fn feed(&mut self, wire: &[u8]) -> Result<(), WireError> {
        self.inbound.feed(wire).map_err(inbound_refusal)
    }

    /// The next step, piece of inflated stream, or the need for more input. A refusal is
    /// the error to send the client.
    pub fn next_event(&mut self) -> Result<UploadEvent<'_>, WireError> {
        if let Some(step) = self.checked_step()? {
            return Ok(UploadEvent::Step(step));
        }
        let needed = self.decoder.bytes_needed();
        if self.held_fed < self.held.len() {
            let end = self.held.len().min(self.held_fed + needed.max(1));
            let bytes = &self.held[self.held_fed..end];
            self.held_fed = end;
            self.decoder.feed(bytes);
            return Ok(UploadEvent::Inflated { bytes, spool: true });
        }
        match self
            .inbound
            .next_chunk_at_most(needed)
            .map_err(inbound_refusal)?
        {
            Some(bytes) => {
                self.decoder.feed(bytes);
                Ok(UploadEvent::Inflated {
                    bytes,
                    spool: self.hello_seen && !self.awaiting_transfer,
                })
            }
            None => Ok(UploadEvent::NeedInput),
        }
    }

    /// Checks the complete messages decoded so far, until the session takes a step.
    fn checked_step(&mut self) -> Result<Option<Step>, WireError> {
        loop {
            let before = self.decoder.buffered_bytes();
            // Checked in full but not kept: the worker decodes the rows from the spool.
            let message = self
                .decoder
                .next_message_checked()
                .map_err(decode_refusal)?;
            let frame_bytes = before - self.decoder.buffered_bytes();
            let Some(message) = message else {
                // Value pieces taken without a message after them count all the same.
                self.session.count(frame_bytes)?;
                return Ok(None);
            };
            match self.session.handle(message, frame_bytes)? {
                Step::Continue => {}
                step => {
                    if matches!(
                        step,
                        Step::Resume { .. } | Step::HeldQuery { .. } | Step::DownloadResume { .. }
                    ) {
                        self.awaiting_transfer = false;
                    }
                    if let Step::Hello(hello) = &step {
                        self.hello_seen = true;
                        self.awaiting_transfer =
                            !hello.download_ack && hello.protocol_version >= RESUME_SINCE_VERSION;
                        // A version 1 client knows nothing of values in pieces.
                        if hello.protocol_version < PIECES_SINCE_VERSION {
                            self.decoder.refuse_pieces();
                        }
                    }
                    return Ok(Some(step));
                }
            }
        }
    }

    /// Checks each table as its first chunk arrives ([`Step::UnknownTable`]).
    pub fn check_tables(&mut self) {
        self.session.check_tables();
    }

    /// Resolves a [`Step::UnknownTable`] (see [`ServerSession::resolve_table`]).
    pub fn resolve_table(&mut self, tables: Option<Arc<VersionTables>>) -> Result<(), WireError> {
        self.session.resolve_table(tables)
    }

    /// Why the stream cannot end here (the client closed its side): it ended inside a
    /// frame, or before the end of the upload.
    pub fn ended_early(&self) -> String {
        match self.decoder.finish() {
            Err(error) => error.to_string(),
            Ok(()) => "the client closed the connection before the end of the upload".into(),
        }
    }

    /// Whether the hello is in.
    pub fn hello_seen(&self) -> bool {
        self.hello_seen
    }

    /// The client's preamble, if it sent one.
    pub fn preamble(&self) -> Option<Preamble> {
        self.inbound.preamble()
    }

    /// Bytes received as they were on the wire, preamble included.
    pub fn wire_bytes(&self) -> u64 {
        self.inbound.wire_bytes()
    }

    /// Inflated bytes held by the frame decoder that do not yet form a whole frame.
    pub fn buffered_bytes(&self) -> usize {
        self.decoder.buffered_bytes()
    }
}

fn inbound_refusal(error: InboundError) -> WireError {
    let code = match error {
        InboundError::Compression(CompressionError::DecompressedTooLarge { .. }) => {
            ErrorCode::UploadTooLarge
        }
        _ => ErrorCode::Protocol,
    };
    WireError::new(code, error.to_string())
}

/// The upload's frame decoder: a value in pieces is refused above `value_bytes_max`
/// (at its `value_start`, before its bytes arrive); the values in pieces of one row
/// are bounded by the upload's own limit. The worker decodes the spool with the same.
pub(crate) fn upload_decoder(limits: &UploadLimits) -> FrameDecoder {
    FrameDecoder::new(limits.frame_bytes_max)
        .with_value_limits(limits.value_bytes_max, limits.upload_bytes_max as u64)
}

fn decode_refusal(error: DecodeError) -> WireError {
    let code = match error {
        DecodeError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
        DecodeError::ValueTooLarge {
            table,
            column,
            length,
            limit,
        } => {
            return WireError::new(
                ErrorCode::UploadTooLarge,
                format!(
                    "the upload holds a value of {length} bytes in column {column:?} of table \
                     {table:?}, above the server's value_bytes_max of {limit} bytes; nothing \
                     was applied"
                ),
            )
        }
        DecodeError::RowPiecesTooLarge { .. } => ErrorCode::UploadTooLarge,
        _ => ErrorCode::Protocol,
    };
    WireError::new(code, error.to_string())
}
