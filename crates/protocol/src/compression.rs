//! Compression of a connection's byte stream (zlib as in MobiLink, or zstd), chosen per
//! connection and per direction, and the transport preamble that negotiates it on
//! TCP and TLS. No I/O: callers move byte chunks in and out.
//!
//! Decompression is bounded: output comes out in chunks of at most
//! [`DECOMPRESS_CHUNK_BYTES`], and the total is checked against `decompressed_bytes_max`
//! as it is produced, so a small stream that would inflate to gigabytes is refused after
//! at most the limit (plus one byte) was produced, never inflated whole.

use std::io::Write;

use thiserror::Error;
use zstd::stream::raw::{DParameter, Decoder as ZstdDecoder, Operation};

/// Largest piece of decompressed output produced at a time.
pub const DECOMPRESS_CHUNK_BYTES: usize = 64 * 1024;
/// zlib level: 6 is zlib's own default, a fair balance of speed and size.
const ZLIB_LEVEL: u32 = 6;
/// zstd level: 3 is zstd's own default.
const ZSTD_LEVEL: i32 = 3;
/// A zstd stream may ask its decoder for a window of 2^window_log bytes; refuse more than
/// 8 MiB (the encoder at `ZSTD_LEVEL` never asks for more), so the decoder's own memory
/// is bounded whatever the stream says.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;
/// The largest window a zstd stream may ask for, in bytes (2^`ZSTD_WINDOW_LOG_MAX`).
pub const ZSTD_WINDOW_BYTES_MAX: u64 = 1 << ZSTD_WINDOW_LOG_MAX;
/// The smallest window zstd knows (a window descriptor's floor).
const ZSTD_WINDOW_BYTES_MIN: u64 = 1 << 10;
/// zstd's largest block.
const ZSTD_BLOCK_BYTES_MAX: u64 = 128 * 1024;
/// A zstd decoder's state besides its window and block buffers: `ZSTD_sizeof_DCtx` of a
/// decoder before its first frame is about 160 KiB in zstd 1.5 (the literals buffer and
/// entropy tables); rounded up (a test holds the estimate above the real size).
const ZSTD_DECODER_STATE_BYTES: u64 = 256 * 1024;
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// What the first bytes of a zstd stream say about the window its decoder will allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZstdWindow {
    /// The first frame's header is not complete yet.
    NeedMore,
    /// The window the stream may use from here on, in bytes: the first frame's, rounded
    /// up to a power of two (at least 1 KiB, at most [`ZSTD_WINDOW_BYTES_MAX`]). A
    /// decoder made with [`Decompressor::with_zstd_window_bytes_max`] of it refuses any
    /// later frame that asks for more.
    Bytes(u64),
}

/// Reads the window of a zstd stream's first frame from its header (RFC 8878, 3.1.1.1),
/// before any decoder is made, so that the decoder's memory can be reserved first.
/// Anything that is not a zstd frame's header (a skippable frame, garbage) gets the
/// largest window: the decoder refuses garbage at once, and a skippable frame's
/// successor may ask for anything up to the limit.
pub fn zstd_stream_window(stream: &[u8]) -> ZstdWindow {
    if stream.len() < 5 {
        return ZstdWindow::NeedMore;
    }
    if stream[..4] != ZSTD_MAGIC {
        return ZstdWindow::Bytes(ZSTD_WINDOW_BYTES_MAX);
    }
    let descriptor = stream[4];
    let single_segment = descriptor & 0x20 != 0;
    let window = if single_segment {
        // The window is the frame's content size, which follows the dictionary id.
        let dictionary_bytes = [0, 1, 2, 4][usize::from(descriptor & 3)];
        let size_bytes = [1, 2, 4, 8][usize::from(descriptor >> 6)];
        let start = 5 + dictionary_bytes;
        let Some(field) = stream.get(start..start + size_bytes) else {
            return ZstdWindow::NeedMore;
        };
        let mut size = field
            .iter()
            .rev()
            .fold(0u64, |size, &byte| (size << 8) | u64::from(byte));
        if size_bytes == 2 {
            size += 256;
        }
        size
    } else {
        let Some(&window_descriptor) = stream.get(5) else {
            return ZstdWindow::NeedMore;
        };
        let exponent = u32::from(window_descriptor >> 3);
        let mantissa = u64::from(window_descriptor & 7);
        let base = 1u64 << (10 + exponent);
        base + base / 8 * mantissa
    };
    ZstdWindow::Bytes(
        window
            .clamp(ZSTD_WINDOW_BYTES_MIN, ZSTD_WINDOW_BYTES_MAX)
            .next_power_of_two(),
    )
}

/// The memory a [`Decompressor`] of a zstd stream holds at most with a window of
/// `window_bytes` (as [`ZstdWindow::Bytes`] gives it): zstd's state, its input block
/// buffer, its window and one block beyond, and the decompressor's own output chunk.
pub fn zstd_decoder_bytes(window_bytes: u64) -> u64 {
    let window = window_bytes.clamp(ZSTD_WINDOW_BYTES_MIN, ZSTD_WINDOW_BYTES_MAX);
    let block = window.min(ZSTD_BLOCK_BYTES_MAX);
    ZSTD_DECODER_STATE_BYTES + window + 2 * block + DECOMPRESS_CHUNK_BYTES as u64
}

/// A stream compression. The byte values are part of the wire contract (the preamble).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    #[default]
    None,
    Zlib,
    Zstd,
}

impl Compression {
    pub const ALL: [Compression; 3] = [Compression::None, Compression::Zlib, Compression::Zstd];

    pub fn id(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Zlib => 1,
            Compression::Zstd => 2,
        }
    }

    pub fn from_id(id: u8) -> Option<Compression> {
        Compression::ALL.into_iter().find(|c| c.id() == id)
    }

    /// Name used in options and URLs: `none`, `zlib`, `zstd`.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Zlib => "zlib",
            Compression::Zstd => "zstd",
        }
    }

    /// HTTP content-coding token (RFC 9110: `deflate` is the zlib format).
    pub fn http_token(self) -> &'static str {
        match self {
            Compression::None => "identity",
            Compression::Zlib => "deflate",
            Compression::Zstd => "zstd",
        }
    }

    pub fn from_http_token(token: &str) -> Option<Compression> {
        let token = token.trim();
        Compression::ALL
            .into_iter()
            .find(|c| c.http_token().eq_ignore_ascii_case(token))
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Compression {
    type Err = String;

    fn from_str(text: &str) -> Result<Compression, String> {
        Compression::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| format!("unknown compression {text:?}: expected none, zlib or zstd"))
    }
}

#[derive(Debug, Error)]
pub enum CompressionError {
    #[error("the decompressed stream exceeds the limit of {limit_bytes} bytes")]
    DecompressedTooLarge { limit_bytes: u64 },
    #[error("invalid {compression} data: {message}")]
    Corrupt {
        compression: Compression,
        message: String,
    },
    #[error("{trailing_bytes} bytes follow the end of the {compression} stream")]
    TrailingBytes {
        compression: Compression,
        trailing_bytes: usize,
    },
    #[error("{compression} compression failed: {message}")]
    Compress {
        compression: Compression,
        message: String,
    },
}

enum Encoder {
    None(Vec<u8>),
    Zlib(flate2::write::ZlibEncoder<Vec<u8>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

/// Compresses one direction of a connection. Output is produced as it becomes
/// available; [`Compressor::finish`] ends the stream.
pub struct Compressor {
    compression: Compression,
    encoder: Encoder,
    input_bytes: u64,
    output_bytes: u64,
}

impl Compressor {
    pub fn new(compression: Compression) -> Result<Compressor, CompressionError> {
        let encoder = match compression {
            Compression::None => Encoder::None(Vec::new()),
            Compression::Zlib => Encoder::Zlib(flate2::write::ZlibEncoder::new(
                Vec::new(),
                flate2::Compression::new(ZLIB_LEVEL),
            )),
            Compression::Zstd => Encoder::Zstd(
                zstd::stream::write::Encoder::new(Vec::new(), ZSTD_LEVEL).map_err(|error| {
                    CompressionError::Compress {
                        compression,
                        message: error.to_string(),
                    }
                })?,
            ),
        };
        Ok(Compressor {
            compression,
            encoder,
            input_bytes: 0,
            output_bytes: 0,
        })
    }

    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Uncompressed bytes taken in so far.
    pub fn input_bytes(&self) -> u64 {
        self.input_bytes
    }

    /// Compressed bytes given out so far.
    pub fn output_bytes(&self) -> u64 {
        self.output_bytes
    }

    /// Compresses `input`; returns whatever compressed bytes are ready (maybe none).
    pub fn compress(&mut self, input: &[u8]) -> Result<Vec<u8>, CompressionError> {
        self.input_bytes += input.len() as u64;
        let written = match &mut self.encoder {
            Encoder::None(out) => {
                out.extend_from_slice(input);
                Ok(())
            }
            Encoder::Zlib(encoder) => encoder.write_all(input),
            Encoder::Zstd(encoder) => encoder.write_all(input),
        };
        written.map_err(|error| self.failed(error))?;
        Ok(self.take())
    }

    /// Everything taken in so far, compressed, so the peer can decode all of it now
    /// (a sync flush); the stream continues.
    pub fn flush(&mut self) -> Result<Vec<u8>, CompressionError> {
        let flushed = match &mut self.encoder {
            Encoder::None(_) => Ok(()),
            Encoder::Zlib(encoder) => encoder.flush(),
            Encoder::Zstd(encoder) => encoder.flush(),
        };
        flushed.map_err(|error| self.failed(error))?;
        Ok(self.take())
    }

    /// Ends the stream: the remaining compressed bytes and the stream's trailer.
    pub fn finish(mut self) -> Result<Vec<u8>, CompressionError> {
        let finished = match &mut self.encoder {
            Encoder::None(_) => Ok(()),
            Encoder::Zlib(encoder) => encoder.try_finish(),
            Encoder::Zstd(encoder) => encoder.do_finish(),
        };
        finished.map_err(|error| self.failed(error))?;
        Ok(self.take())
    }

    fn take(&mut self) -> Vec<u8> {
        let out = match &mut self.encoder {
            Encoder::None(out) => std::mem::take(out),
            Encoder::Zlib(encoder) => std::mem::take(encoder.get_mut()),
            Encoder::Zstd(encoder) => std::mem::take(encoder.get_mut()),
        };
        self.output_bytes += out.len() as u64;
        out
    }

    fn failed(&self, error: std::io::Error) -> CompressionError {
        CompressionError::Compress {
            compression: self.compression,
            message: error.to_string(),
        }
    }
}

/// Compresses a whole byte sequence into one finished stream.
pub fn compress_all(compression: Compression, input: &[u8]) -> Result<Vec<u8>, CompressionError> {
    let mut compressor = Compressor::new(compression)?;
    let mut out = compressor.compress(input)?;
    out.extend(compressor.finish()?);
    Ok(out)
}

enum Decoder {
    None,
    Zlib(Box<flate2::Decompress>),
    Zstd(Box<ZstdDecoder<'static>>),
}

/// What one [`Decoder::run`] did: the bytes it read and wrote, and whether the
/// compressed stream ended.
struct Inflated {
    read: usize,
    written: usize,
    stream_ended: bool,
}

impl Decoder {
    /// Inflates what `input` holds into `output`, as far as either goes.
    fn run(
        &mut self,
        compression: Compression,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<Inflated, CompressionError> {
        let corrupt = |message: String| CompressionError::Corrupt {
            compression,
            message,
        };
        match self {
            Decoder::None => {
                let count = input.len().min(output.len());
                output[..count].copy_from_slice(&input[..count]);
                Ok(Inflated {
                    read: count,
                    written: count,
                    stream_ended: false,
                })
            }
            Decoder::Zlib(decoder) => {
                let (in_before, out_before) = (decoder.total_in(), decoder.total_out());
                let status = decoder
                    .decompress(input, output, flate2::FlushDecompress::None)
                    .map_err(|error| corrupt(error.to_string()))?;
                Ok(Inflated {
                    read: (decoder.total_in() - in_before) as usize,
                    written: (decoder.total_out() - out_before) as usize,
                    stream_ended: status == flate2::Status::StreamEnd,
                })
            }
            Decoder::Zstd(decoder) => {
                let status = decoder
                    .run_on_buffers(input, output)
                    .map_err(|error| corrupt(error.to_string()))?;
                Ok(Inflated {
                    read: status.bytes_read,
                    written: status.bytes_written,
                    stream_ended: status.remaining == 0 && status.bytes_read > 0,
                })
            }
        }
    }
}

/// Decompresses one direction of a connection under a limit on the total output.
///
/// Use: [`feed`](Decompressor::feed) what arrived, then call
/// [`next_chunk`](Decompressor::next_chunk) until it returns `None` before feeding
/// again. The decompressor then holds at most one fed piece and one output chunk.
pub struct Decompressor {
    compression: Compression,
    decoder: Decoder,
    input: Vec<u8>,
    input_start: usize,
    output: Vec<u8>,
    output_len: usize,
    output_was_full: bool,
    input_bytes: u64,
    decompressed_bytes: u64,
    decompressed_bytes_max: u64,
    finished: bool,
}

impl Decompressor {
    pub fn new(
        compression: Compression,
        decompressed_bytes_max: u64,
    ) -> Result<Decompressor, CompressionError> {
        Decompressor::with_zstd_window_bytes_max(
            compression,
            decompressed_bytes_max,
            ZSTD_WINDOW_BYTES_MAX,
        )
    }

    /// As [`Decompressor::new`], refusing a zstd frame that asks for a window above
    /// `window_bytes_max` (rounded up to a power of two, at most
    /// [`ZSTD_WINDOW_BYTES_MAX`]): its memory is then at most
    /// [`zstd_decoder_bytes`]`(window_bytes_max)`.
    pub fn with_zstd_window_bytes_max(
        compression: Compression,
        decompressed_bytes_max: u64,
        window_bytes_max: u64,
    ) -> Result<Decompressor, CompressionError> {
        let window_log_max = window_bytes_max
            .clamp(ZSTD_WINDOW_BYTES_MIN, ZSTD_WINDOW_BYTES_MAX)
            .next_power_of_two()
            .trailing_zeros();
        let corrupt = |error: std::io::Error| CompressionError::Corrupt {
            compression,
            message: error.to_string(),
        };
        let decoder = match compression {
            Compression::None => Decoder::None,
            Compression::Zlib => Decoder::Zlib(Box::new(flate2::Decompress::new(true))),
            Compression::Zstd => {
                let mut decoder = ZstdDecoder::new().map_err(corrupt)?;
                decoder
                    .set_parameter(DParameter::WindowLogMax(window_log_max))
                    .map_err(corrupt)?;
                Decoder::Zstd(Box::new(decoder))
            }
        };
        Ok(Decompressor {
            compression,
            decoder,
            input: Vec::new(),
            input_start: 0,
            output: Vec::new(),
            output_len: 0,
            output_was_full: false,
            input_bytes: 0,
            decompressed_bytes: 0,
            decompressed_bytes_max,
            finished: false,
        })
    }

    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Compressed bytes fed so far (the bytes on the wire).
    pub fn input_bytes(&self) -> u64 {
        self.input_bytes
    }

    /// Decompressed bytes produced so far.
    pub fn decompressed_bytes(&self) -> u64 {
        self.decompressed_bytes
    }

    /// True once the compressed stream's end marker was seen (always false for `None`).
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Adds compressed bytes. Feed again only after `next_chunk` returned `None`.
    pub fn feed(&mut self, compressed: &[u8]) {
        self.input_bytes += compressed.len() as u64;
        if self.input_start == self.input.len() {
            self.input.clear();
            self.input_start = 0;
        }
        self.input.extend_from_slice(compressed);
    }

    /// The next piece of decompressed output, or `None` when everything fed so far has
    /// been decompressed.
    pub fn next_chunk(&mut self) -> Result<Option<&[u8]>, CompressionError> {
        self.next_chunk_at_most(DECOMPRESS_CHUNK_BYTES)
    }

    /// As [`Decompressor::next_chunk`], producing at most `bytes_max` bytes (and never
    /// more than [`DECOMPRESS_CHUNK_BYTES`]): a reader that knows how much it needs
    /// inflates no more.
    pub fn next_chunk_at_most(
        &mut self,
        bytes_max: usize,
    ) -> Result<Option<&[u8]>, CompressionError> {
        let pending = &self.input[self.input_start..];
        // A decoder whose last output filled the chunk may hold more output without
        // needing input: ask it again.
        if pending.is_empty() && !self.output_was_full {
            return Ok(None);
        }
        if self.finished && !pending.is_empty() {
            return Err(CompressionError::TrailingBytes {
                compression: self.compression,
                trailing_bytes: pending.len(),
            });
        }
        // Never produce more than one byte past the limit, so exceeding it is seen.
        let room = self
            .decompressed_bytes_max
            .saturating_sub(self.decompressed_bytes)
            .saturating_add(1)
            .min(bytes_max.clamp(1, DECOMPRESS_CHUNK_BYTES) as u64) as usize;
        if self.output.len() < room {
            self.output.resize(room, 0);
        }
        let output = &mut self.output[..room];
        let inflated = self.decoder.run(self.compression, pending, output)?;
        let (read, written) = (inflated.read, inflated.written);
        if inflated.stream_ended {
            self.finished = true;
        }
        self.input_start += read;
        self.output_was_full = written == room;
        self.decompressed_bytes += written as u64;
        if self.decompressed_bytes > self.decompressed_bytes_max {
            return Err(CompressionError::DecompressedTooLarge {
                limit_bytes: self.decompressed_bytes_max,
            });
        }
        if read == 0 && written == 0 {
            // Needs more input than fed (a partial block): keep what is pending.
            let rest = self.input.split_off(self.input_start);
            self.input = rest;
            self.input_start = 0;
            return Ok(None);
        }
        self.output_len = written;
        Ok(Some(&self.output[..self.output_len]))
    }
}

/// The transport preamble's first bytes. Its first byte, `R` (0x52), can never start a
/// frame of the preamble-less protocol: that would be a length of at least 0x52000000
/// bytes, far above any frame limit.
pub const PREAMBLE_MAGIC: [u8; 4] = *b"RSYN";
pub const PREAMBLE_BYTES: usize = 8;
/// Version of the preamble layout.
pub const PREAMBLE_VERSION: u8 = 1;

/// Sent first on a TCP or TLS connection by a client that wants compression (and by the
/// server before a download it compresses): magic, version, compression of the bytes
/// that follow in the sender's direction, two reserved zero bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preamble {
    pub compression: Compression,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PreambleError {
    #[error("unsupported transport preamble version {0} (this implementation speaks {PREAMBLE_VERSION})")]
    Version(u8),
    #[error("unknown compression id {0} in the transport preamble")]
    UnknownCompression(u8),
    #[error("the transport preamble does not start with RSYN")]
    Magic,
    #[error("the transport preamble's reserved bytes are not zero")]
    Reserved,
}

impl Preamble {
    pub fn encode(self) -> [u8; PREAMBLE_BYTES] {
        let mut bytes = [0u8; PREAMBLE_BYTES];
        bytes[..4].copy_from_slice(&PREAMBLE_MAGIC);
        bytes[4] = PREAMBLE_VERSION;
        bytes[5] = self.compression.id();
        bytes
    }

    pub fn decode(bytes: &[u8; PREAMBLE_BYTES]) -> Result<Preamble, PreambleError> {
        if bytes[..4] != PREAMBLE_MAGIC {
            return Err(PreambleError::Magic);
        }
        if bytes[4] != PREAMBLE_VERSION {
            return Err(PreambleError::Version(bytes[4]));
        }
        let compression =
            Compression::from_id(bytes[5]).ok_or(PreambleError::UnknownCompression(bytes[5]))?;
        if bytes[6..] != [0, 0] {
            return Err(PreambleError::Reserved);
        }
        Ok(Preamble { compression })
    }

    /// Whether a stream's first byte announces a preamble (otherwise a frame follows).
    pub fn starts_with_preamble(first_byte: u8) -> bool {
        first_byte == PREAMBLE_MAGIC[0]
    }
}

#[derive(Debug, Error)]
pub enum InboundError {
    #[error(transparent)]
    Preamble(#[from] PreambleError),
    #[error(transparent)]
    Compression(#[from] CompressionError),
}

enum InboundState {
    /// Nothing decided yet: fewer bytes than a preamble seen, all starting with `R`.
    Start(Vec<u8>),
    Body(Decompressor),
}

/// One direction of a connection as it arrives: an optional [`Preamble`], then the
/// (possibly compressed) frame stream. Feed what arrives, take decompressed pieces out.
pub struct Inbound {
    state: InboundState,
    preamble: Option<Preamble>,
    decompressed_bytes_max: u64,
    zstd_window_bytes_max: u64,
}

impl Inbound {
    pub fn new(decompressed_bytes_max: u64) -> Inbound {
        Inbound {
            state: InboundState::Start(Vec::new()),
            preamble: None,
            decompressed_bytes_max,
            zstd_window_bytes_max: ZSTD_WINDOW_BYTES_MAX,
        }
    }

    /// Refuses a zstd stream whose frames ask for a window above `bytes` (see
    /// [`Decompressor::with_zstd_window_bytes_max`]); takes effect only before the first
    /// bytes are fed.
    pub fn limit_zstd_window(&mut self, bytes: u64) {
        self.zstd_window_bytes_max = bytes;
    }

    /// The peer's preamble, once seen (`None` also for a preamble-less peer).
    pub fn preamble(&self) -> Option<Preamble> {
        self.preamble
    }

    /// Whether the first bytes have arrived and told preamble from frame.
    pub fn started(&self) -> bool {
        matches!(self.state, InboundState::Body(_))
    }

    /// Bytes received as they were on the wire, preamble included.
    pub fn wire_bytes(&self) -> u64 {
        match &self.state {
            InboundState::Start(buffered) => buffered.len() as u64,
            InboundState::Body(decompressor) => {
                decompressor.input_bytes() + self.preamble.map_or(0, |_| PREAMBLE_BYTES as u64)
            }
        }
    }

    /// Adds received bytes. Feed again only after `next_chunk` returned `None`.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), InboundError> {
        let buffered = match &mut self.state {
            InboundState::Body(decompressor) => {
                decompressor.feed(bytes);
                return Ok(());
            }
            InboundState::Start(buffered) => {
                buffered.extend_from_slice(bytes);
                buffered
            }
        };
        let Some(&first) = buffered.first() else {
            return Ok(());
        };
        let (compression, rest) = if Preamble::starts_with_preamble(first) {
            if buffered.len() < PREAMBLE_BYTES {
                return Ok(());
            }
            let header: [u8; PREAMBLE_BYTES] = buffered[..PREAMBLE_BYTES]
                .try_into()
                .expect("length checked");
            let preamble = Preamble::decode(&header)?;
            self.preamble = Some(preamble);
            (preamble.compression, buffered.split_off(PREAMBLE_BYTES))
        } else {
            (Compression::None, std::mem::take(buffered))
        };
        let mut decompressor = Decompressor::with_zstd_window_bytes_max(
            compression,
            self.decompressed_bytes_max,
            self.zstd_window_bytes_max,
        )?;
        decompressor.feed(&rest);
        self.state = InboundState::Body(decompressor);
        Ok(())
    }

    /// The next piece of the frame stream, or `None` when more bytes are needed.
    pub fn next_chunk(&mut self) -> Result<Option<&[u8]>, InboundError> {
        self.next_chunk_at_most(DECOMPRESS_CHUNK_BYTES)
    }

    /// As [`Inbound::next_chunk`], producing at most `bytes_max` bytes.
    pub fn next_chunk_at_most(&mut self, bytes_max: usize) -> Result<Option<&[u8]>, InboundError> {
        match &mut self.state {
            InboundState::Start(_) => Ok(None),
            InboundState::Body(decompressor) => Ok(decompressor.next_chunk_at_most(bytes_max)?),
        }
    }
}

/// The bytes a sender puts on the wire for one direction: a preamble and a compressed
/// stream, or (for [`Compression::None`] without a preamble) the frames unchanged, as a
/// peer that predates the preamble expects.
pub struct Outbound {
    compressor: Compressor,
    preamble: Option<Preamble>,
}

impl Outbound {
    /// `with_preamble`: announce the compression (required for anything but `None`).
    pub fn new(
        compression: Compression,
        with_preamble: bool,
    ) -> Result<Outbound, CompressionError> {
        Ok(Outbound {
            compressor: Compressor::new(compression)?,
            preamble: (with_preamble || compression != Compression::None)
                .then_some(Preamble { compression }),
        })
    }

    /// The preamble to send first, if any (taken once).
    pub fn take_preamble(&mut self) -> Option<[u8; PREAMBLE_BYTES]> {
        self.preamble.take().map(Preamble::encode)
    }

    pub fn compressor(&mut self) -> &mut Compressor {
        &mut self.compressor
    }

    pub fn finish(self) -> Result<Vec<u8>, CompressionError> {
        self.compressor.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decompress_all(
        compression: Compression,
        stream: &[u8],
        limit: u64,
        piece: usize,
    ) -> Result<Vec<u8>, CompressionError> {
        let mut decompressor = Decompressor::new(compression, limit)?;
        let mut out = Vec::new();
        for bytes in stream.chunks(piece) {
            decompressor.feed(bytes);
            while let Some(chunk) = decompressor.next_chunk()? {
                assert!(chunk.len() <= DECOMPRESS_CHUNK_BYTES);
                out.extend_from_slice(chunk);
            }
        }
        Ok(out)
    }

    fn sample() -> Vec<u8> {
        (0..200_000u32)
            .flat_map(|n| format!("row {n} quantity {}\n", n % 97).into_bytes())
            .collect()
    }

    #[test]
    fn every_compression_round_trips_in_any_piece_size() {
        let input = sample();
        for compression in Compression::ALL {
            let stream = compress_all(compression, &input).unwrap();
            if compression != Compression::None {
                assert!(stream.len() * 3 < input.len(), "{compression} compresses");
            }
            for piece in [1, 7, 4096, stream.len()] {
                let out = decompress_all(compression, &stream, u64::MAX, piece).unwrap();
                assert!(out == input, "{compression}, pieces of {piece}");
            }
        }
    }

    #[test]
    fn output_limited_per_call_round_trips_and_respects_the_limit() {
        let input = sample();
        for compression in Compression::ALL {
            let stream = compress_all(compression, &input).unwrap();
            for bytes_max in [1, 4, 1000] {
                let mut decompressor = Decompressor::new(compression, u64::MAX).unwrap();
                decompressor.feed(&stream);
                let mut out = Vec::new();
                while let Some(chunk) = decompressor.next_chunk_at_most(bytes_max).unwrap() {
                    assert!(chunk.len() <= bytes_max, "{compression}: {}", chunk.len());
                    out.extend_from_slice(chunk);
                }
                assert!(out == input, "{compression}, at most {bytes_max} per call");
            }
        }
    }

    #[test]
    fn flushed_output_decodes_before_the_stream_ends() {
        for compression in Compression::ALL {
            let mut compressor = Compressor::new(compression).unwrap();
            let mut stream = compressor.compress(b"first message").unwrap();
            stream.extend(compressor.flush().unwrap());
            let out = decompress_all(compression, &stream, 1 << 20, 3).unwrap();
            assert_eq!(out, b"first message", "{compression}");
        }
    }

    /// A stream of `compressed_bytes_max` bytes or less that inflates to `inflated` bytes.
    fn bomb(compression: Compression, inflated: u64) -> Vec<u8> {
        let zeros = vec![0u8; 1 << 20];
        let mut compressor = Compressor::new(compression).unwrap();
        let mut stream = Vec::new();
        for _ in 0..inflated / zeros.len() as u64 {
            stream.extend(compressor.compress(&zeros).unwrap());
        }
        stream.extend(compressor.finish().unwrap());
        stream
    }

    #[test]
    fn a_decompression_bomb_is_refused_at_the_limit_without_inflating_it() {
        // zstd: 3 GiB of zeros in under 100 KB; zlib (ratio ~1000:1): 100 MiB in ~100 KB.
        for (compression, inflated) in [
            (Compression::Zstd, 3u64 << 30),
            (Compression::Zlib, 100u64 << 20),
        ] {
            let stream = bomb(compression, inflated);
            assert!(
                stream.len() <= 105 * 1024,
                "{compression}: {}",
                stream.len()
            );
            let limit = 1 << 20;
            let mut decompressor = Decompressor::new(compression, limit).unwrap();
            let mut produced = 0u64;
            let mut refused = None;
            'feeding: for bytes in stream.chunks(16 * 1024) {
                decompressor.feed(bytes);
                loop {
                    match decompressor.next_chunk() {
                        Ok(Some(chunk)) => produced += chunk.len() as u64,
                        Ok(None) => break,
                        Err(error) => {
                            refused = Some(error);
                            break 'feeding;
                        }
                    }
                }
            }
            let error = refused.expect("the bomb is refused");
            assert!(
                matches!(error, CompressionError::DecompressedTooLarge { limit_bytes } if limit_bytes == limit),
                "{error}"
            );
            assert!(produced <= limit, "{produced} bytes handed out");
            assert_eq!(decompressor.decompressed_bytes(), limit + 1);
            // The decompressor's own buffers stayed at one output chunk.
            assert!(decompressor.output.capacity() <= DECOMPRESS_CHUNK_BYTES);
            assert!(decompressor.input.capacity() <= 32 * 1024);
        }
    }

    #[test]
    fn corrupt_and_trailing_input_is_refused_by_name() {
        let error = decompress_all(Compression::Zlib, b"not zlib at all", 1 << 20, 4).unwrap_err();
        assert!(error.to_string().contains("invalid zlib data"), "{error}");
        let error = decompress_all(Compression::Zstd, b"not zstd at all", 1 << 20, 4).unwrap_err();
        assert!(error.to_string().contains("invalid zstd data"), "{error}");
        for compression in [Compression::Zlib, Compression::Zstd] {
            let mut stream = compress_all(compression, b"hello").unwrap();
            stream.extend_from_slice(b"junk");
            let error = decompress_all(compression, &stream, 1 << 20, 1024).unwrap_err();
            assert!(
                matches!(
                    error,
                    CompressionError::TrailingBytes {
                        trailing_bytes: 4,
                        ..
                    }
                ),
                "{error}"
            );
        }
    }

    #[test]
    fn a_zstd_stream_asking_for_a_huge_window_is_refused() {
        let mut encoder = zstd::stream::raw::Encoder::new(1).unwrap();
        encoder
            .set_parameter(zstd::stream::raw::CParameter::WindowLog(27))
            .unwrap();
        encoder
            .set_parameter(zstd::stream::raw::CParameter::EnableLongDistanceMatching(
                true,
            ))
            .unwrap();
        let input = sample();
        let mut writer = zstd::stream::zio::Writer::new(Vec::new(), encoder);
        writer.write_all(&input).unwrap();
        writer.finish().unwrap();
        let stream = writer.into_inner().0;
        let error = decompress_all(Compression::Zstd, &stream, u64::MAX, 4096).unwrap_err();
        assert!(error.to_string().contains("invalid zstd data"), "{error}");
    }

    /// A zstd stream made with `window_log` (its frames ask for 2^window_log bytes).
    fn zstd_stream_with_window(input: &[u8], window_log: u32) -> Vec<u8> {
        let mut encoder = zstd::stream::raw::Encoder::new(ZSTD_LEVEL).unwrap();
        encoder
            .set_parameter(zstd::stream::raw::CParameter::WindowLog(window_log))
            .unwrap();
        let mut writer = zstd::stream::zio::Writer::new(Vec::new(), encoder);
        writer.write_all(input).unwrap();
        writer.finish().unwrap();
        writer.into_inner().0
    }

    /// `ZSTD_sizeof_DCtx` after a zstd decoder inflated all of `stream` as the
    /// decompressor does (streaming, into small output pieces).
    fn zstd_decoder_size_after(stream: &[u8]) -> u64 {
        use zstd::zstd_safe::{DCtx, InBuffer, OutBuffer};
        let mut context = DCtx::create();
        let mut input = InBuffer::around(stream);
        let mut out = vec![0u8; DECOMPRESS_CHUNK_BYTES];
        loop {
            let mut output = OutBuffer::around(&mut out[..]);
            let hint = context.decompress_stream(&mut output, &mut input).unwrap();
            if hint == 0 && input.pos() == stream.len() {
                break;
            }
        }
        context.sizeof() as u64
    }

    #[test]
    fn a_zstd_streams_window_is_read_from_its_header_and_bounds_its_decoders_memory() {
        let input = sample();
        // Our own compressor streams with no size announced: zstd's level-3 window.
        let ours = compress_all(Compression::Zstd, &input).unwrap();
        for cut in 0..6 {
            assert_eq!(
                zstd_stream_window(&ours[..cut]),
                ZstdWindow::NeedMore,
                "{cut}"
            );
        }
        let ZstdWindow::Bytes(window) = zstd_stream_window(&ours) else {
            panic!("a whole header");
        };
        assert_eq!(window, 2 * 1024 * 1024, "level 3's window");
        // The largest window allowed, and one above it (reserved as the largest; the
        // decoder refuses it).
        for (window_log, expected) in [(17, 1 << 17), (23, 1 << 23), (27, 1 << 23)] {
            let stream = zstd_stream_with_window(&input, window_log);
            assert_eq!(zstd_stream_window(&stream), ZstdWindow::Bytes(expected));
        }
        // A frame with its size announced (single segment): the window is the size.
        let small = zstd::bulk::compress(&input[..3000], ZSTD_LEVEL).unwrap();
        assert_eq!(zstd_stream_window(&small), ZstdWindow::Bytes(4096));
        // Not a zstd frame: the most, and the decoder refuses it anyway.
        assert_eq!(
            zstd_stream_window(b"not zstd"),
            ZstdWindow::Bytes(ZSTD_WINDOW_BYTES_MAX)
        );
        // What zstd really allocates stays within the estimate.
        for stream in [
            ours.clone(),
            zstd_stream_with_window(&input, 23),
            zstd_stream_with_window(&input, 17),
            small.clone(),
        ] {
            let ZstdWindow::Bytes(window) = zstd_stream_window(&stream) else {
                panic!("a whole header");
            };
            let size = zstd_decoder_size_after(&stream);
            assert!(
                size + DECOMPRESS_CHUNK_BYTES as u64 <= zstd_decoder_bytes(window),
                "window {window}: zstd holds {size} bytes, estimated {}",
                zstd_decoder_bytes(window)
            );
        }
    }

    #[test]
    fn a_decoder_limited_to_a_window_refuses_a_frame_asking_for_more() {
        // A stream is one frame (bytes after its end are refused), so the first frame's
        // window bounds the decoder for the whole stream; the limit says so to zstd too.
        let input = sample();
        let small = zstd::bulk::compress(&input[..3000], ZSTD_LEVEL).unwrap();
        let large = compress_all(Compression::Zstd, &input).unwrap();
        let inflate = |stream: &[u8], window: u64| {
            let mut decompressor =
                Decompressor::with_zstd_window_bytes_max(Compression::Zstd, u64::MAX, window)
                    .unwrap();
            decompressor.feed(stream);
            let mut out = 0;
            while let Some(chunk) = decompressor.next_chunk()? {
                out += chunk.len();
            }
            Ok::<usize, CompressionError>(out)
        };
        assert_eq!(inflate(&small, 4096).unwrap(), 3000);
        assert_eq!(inflate(&large, 2 * 1024 * 1024).unwrap(), input.len());
        let refused = inflate(&large, 4096).unwrap_err();
        assert!(
            refused.to_string().contains("invalid zstd data"),
            "{refused}"
        );
        let mut inbound = Inbound::new(u64::MAX);
        inbound.limit_zstd_window(4096);
        inbound
            .feed(
                &Preamble {
                    compression: Compression::Zstd,
                }
                .encode(),
            )
            .unwrap();
        inbound.feed(&large).unwrap();
        assert!(inbound.next_chunk().is_err());
    }

    #[test]
    fn inbound_tells_a_preamble_from_a_frame_at_any_split() {
        let frames = b"\x00\x00\x00\x05\x07\x00\x00\x05\xdc".to_vec();
        for (compression, with_preamble) in [
            (Compression::None, false),
            (Compression::None, true),
            (Compression::Zlib, true),
            (Compression::Zstd, true),
        ] {
            let mut outbound = Outbound::new(compression, with_preamble).unwrap();
            let mut wire = outbound.take_preamble().map(Vec::from).unwrap_or_default();
            wire.extend(outbound.compressor().compress(&frames).unwrap());
            wire.extend(outbound.finish().unwrap());
            for piece in [1, 3, 8, wire.len()] {
                let mut inbound = Inbound::new(1 << 20);
                let mut out = Vec::new();
                for bytes in wire.chunks(piece) {
                    inbound.feed(bytes).unwrap();
                    while let Some(chunk) = inbound.next_chunk().unwrap() {
                        out.extend_from_slice(chunk);
                    }
                }
                assert_eq!(out, frames, "{compression} {with_preamble} {piece}");
                assert_eq!(inbound.wire_bytes(), wire.len() as u64);
                assert_eq!(
                    inbound.preamble().map(|p| p.compression),
                    with_preamble.then_some(compression)
                );
            }
        }
        let mut inbound = Inbound::new(1 << 20);
        let error = inbound.feed(b"RSYN\x07\x00\x00\x00").unwrap_err();
        assert!(error.to_string().contains("preamble version 7"), "{error}");
    }

    #[test]
    fn preambles_round_trip_and_refuse_what_they_do_not_know() {
        for compression in Compression::ALL {
            let bytes = Preamble { compression }.encode();
            assert!(Preamble::starts_with_preamble(bytes[0]));
            assert_eq!(Preamble::decode(&bytes), Ok(Preamble { compression }));
        }
        assert_eq!(
            Preamble::encode(Preamble {
                compression: Compression::Zstd
            }),
            [0x52, 0x53, 0x59, 0x4e, 1, 2, 0, 0]
        );
        assert_eq!(
            Preamble::decode(b"RSYN\x02\x00\x00\x00"),
            Err(PreambleError::Version(2))
        );
        assert_eq!(
            Preamble::decode(b"RSYN\x01\x09\x00\x00"),
            Err(PreambleError::UnknownCompression(9))
        );
        assert!(!Preamble::starts_with_preamble(0));
        assert_eq!("ZSTD".parse::<Compression>(), Ok(Compression::Zstd));
        assert_eq!(
            Compression::from_http_token("deflate"),
            Some(Compression::Zlib)
        );
    }
}
