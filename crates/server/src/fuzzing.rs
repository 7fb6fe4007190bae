//! The fuzz targets' bodies: every reader of network bytes, driven by arbitrary input,
//! with the invariants each must keep (no panic, output and memory bounded by the
//! configured limits, checking and decoding agree). The cargo-fuzz targets in `fuzz/`
//! call these, and `tests/fuzz_corpus.rs` replays the committed corpus through them on
//! the stable toolchain; a violated invariant panics.
//!
//! Inputs carry a few leading control bytes (limits, how the bytes are split into
//! reads), so the fuzzer explores the limits and read boundaries too.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rowsync_protocol::{
    check_message, compress_all, decode_message, encode_frame, encode_message, Compression,
    CompressionError, Decompressor, FrameDecoder, Inbound, InboundError, Message, Preamble,
    DECOMPRESS_CHUNK_BYTES, FRAME_HEADER_BYTES, PREAMBLE_BYTES,
};

use std::collections::HashSet;
use std::sync::Arc;

use crate::session::{MergedTables, Step, VersionTables};
use crate::upload_stream::{UploadEvent, UploadLimits, UploadStream};

/// A fuzz target's body: one input in, a panic if an invariant breaks.
pub type Target = fn(&[u8]);

/// The fuzz targets, by the name of their directory under `fuzz/corpus`.
pub const TARGETS: &[(&str, Target)] = &[
    ("frame_decoder", frame_decoder),
    ("frame_stream", frame_stream),
    ("message", message),
    ("inbound", inbound),
    ("inflate_zlib", inflate_zlib),
    ("inflate_zstd", inflate_zstd),
    ("upload_stream", upload_stream),
];

/// Counts the bytes the Rust allocator has live, and their peak, so a target can check
/// its memory against the limits. Install it as the `#[global_allocator]` of a fuzz or
/// test binary; C libraries (zstd, zlib) allocate past it, bounded by their window.
pub struct CountingAllocator;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        COUNTING.store(true, Ordering::Relaxed);
        let live = LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// The bytes the Rust allocator has live now (0 unless a [`CountingAllocator`] is
/// installed).
pub fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Runs `body` and panics if the Rust heap grew by more than `bytes_max` at its peak
/// (when a [`CountingAllocator`] is installed; otherwise just runs it).
fn within_memory(bytes_max: usize, what: &str, body: impl FnOnce()) {
    let live_before = LIVE_BYTES.load(Ordering::Relaxed);
    PEAK_BYTES.store(live_before, Ordering::Relaxed);
    body();
    if COUNTING.load(Ordering::Relaxed) {
        let grown = PEAK_BYTES
            .load(Ordering::Relaxed)
            .saturating_sub(live_before);
        assert!(
            grown <= bytes_max,
            "{what}: the heap grew by {grown} bytes at its peak, above {bytes_max}"
        );
    }
}

/// Control bytes at the front of an input, read with defaults when it is short.
struct Control<'a> {
    data: &'a [u8],
}

impl<'a> Control<'a> {
    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&first, rest)) => {
                self.data = rest;
                first
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.byte(), self.byte()])
    }

    /// Splits the rest into reads of 1 to 256 bytes (0: one read of everything).
    fn reads(&mut self) -> Vec<&'a [u8]> {
        let size = self.byte();
        if size == 0 {
            return vec![self.data];
        }
        self.data.chunks(size as usize).collect()
    }
}

/// The frame decoder fed in arbitrary pieces: checking and decoding agree message by
/// message, each message re-encodes to its frame, and no more than one frame is held.
pub fn frame_decoder(data: &[u8]) {
    let mut control = Control { data };
    let frame_bytes_max = 1 + control.u16() as usize;
    let reads = control.reads();
    let held_max = FRAME_HEADER_BYTES + frame_bytes_max;
    let memory_max = 4 * data.len() + 80 * held_max + 4096;
    within_memory(memory_max, "frame_decoder", || {
        let mut decoding = FrameDecoder::new(frame_bytes_max);
        let mut checking = FrameDecoder::new(frame_bytes_max);
        for read in reads {
            decoding.feed(read);
            checking.feed(read);
            loop {
                let before = decoding.buffered_bytes();
                let decoded = decoding.next_message();
                let checked = checking.next_message_checked();
                match (decoded, checked) {
                    (Ok(Some(message)), Ok(Some(shape))) => {
                        assert_same_shape(&message, &shape);
                        let frame = encode_frame(&message);
                        let consumed = before - decoding.buffered_bytes();
                        // Values in pieces came in frames of their own before the message.
                        let in_pieces = consumed > frame.len()
                            && matches!(message, Message::Upload(_) | Message::Download(_));
                        assert!(frame.len() == consumed || in_pieces, "{consumed} bytes");
                    }
                    (Ok(None), Ok(None)) => break,
                    (Err(decoded), Err(checked)) => {
                        assert_eq!(decoded, checked, "decoding and checking refuse alike");
                        return;
                    }
                    (decoded, checked) => {
                        panic!("decoding gave {decoded:?}, checking {checked:?}")
                    }
                }
            }
            assert!(
                decoding.buffered_bytes() < held_max,
                "more than a frame held"
            );
            let needed = decoding.bytes_needed();
            assert!(needed > 0 && needed <= held_max, "{needed} bytes needed");
        }
        let _ = decoding.finish();
    });
}

/// The most bytes `frame_stream` feeds in all (its input times its repeats), so that
/// one input stays quick however it repeats.
const STREAM_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Growth across many valid frames (issue 32, item 1: a million empty values in pieces,
/// each kept until the next row, took a server from 513 to 684 MB while every single
/// input stayed small). The input's frames are fed again and again, up to 65,536 times,
/// to one decoder that checks (the stream stage's) and one that decodes (the worker's),
/// with the server's limits scaled down: one row's values in pieces may cost
/// `row_bytes_max`. After every repeat the heap the decoders hold stays within a bound
/// of their buffers and two rows' values, whatever the number of repeats.
pub fn frame_stream(data: &[u8]) {
    let mut control = Control { data };
    let frame_bytes_max = 16 + control.u16() as usize;
    let repeats = 1 + control.u16() as usize;
    let stream = control.data;
    let repeats = repeats.min(STREAM_BYTES_MAX / stream.len().max(1)).max(1);
    let row_bytes_max = 4 * frame_bytes_max as u64;
    let buffers = 4 * (FRAME_HEADER_BYTES + frame_bytes_max + stream.len());
    let held_max = 2 * (buffers + 2 * row_bytes_max as usize) + 4096;
    let live_before = LIVE_BYTES.load(Ordering::Relaxed);
    let new_decoder =
        || FrameDecoder::new(frame_bytes_max).with_value_limits(row_bytes_max, row_bytes_max);
    let (mut checking, mut decoding) = (new_decoder(), new_decoder());
    for repeat in 0..repeats {
        checking.feed(stream);
        decoding.feed(stream);
        let checked = drain(&mut checking, FrameDecoder::next_message_checked);
        let decoded = drain(&mut decoding, FrameDecoder::next_message);
        assert_eq!(checked, decoded, "checking and decoding agree");
        if COUNTING.load(Ordering::Relaxed) {
            let held = LIVE_BYTES
                .load(Ordering::Relaxed)
                .saturating_sub(live_before);
            assert!(
                held <= held_max,
                "frame_stream: {held} bytes held after {} repeats of {} bytes, above {held_max}",
                repeat + 1,
                stream.len()
            );
        }
        if checked.is_err() {
            return;
        }
    }
}

/// Takes every whole message; how many, or the first refusal.
fn drain(
    decoder: &mut FrameDecoder,
    next: fn(&mut FrameDecoder) -> Result<Option<Message>, rowsync_protocol::DecodeError>,
) -> Result<usize, rowsync_protocol::DecodeError> {
    let mut messages = 0;
    while next(decoder)?.is_some() {
        messages += 1;
    }
    Ok(messages)
}

/// One message body: checking and decoding agree, and a decoded message re-encodes to
/// exactly its body (every message has one encoding).
pub fn message(data: &[u8]) {
    within_memory(64 * data.len() + 4096, "message", || {
        let decoded = decode_message(data);
        let checked = check_message(data);
        match (decoded, checked) {
            (Ok(message), Ok(shape)) => {
                assert_same_shape(&message, &shape);
                assert_eq!(encode_message(&message), data, "re-encoded {message:?}");
            }
            (Err(decoded), Err(checked)) => assert_eq!(decoded, checked),
            (decoded, checked) => panic!("decoding gave {decoded:?}, checking {checked:?}"),
        }
    });
}

/// A checked message is the decoded one without its rows.
fn assert_same_shape(message: &Message, shape: &Message) {
    match (message, shape) {
        (Message::Upload(full), Message::Upload(checked)) => {
            assert_eq!(
                (&full.table, &full.columns, &full.key_columns),
                (&checked.table, &checked.columns, &checked.key_columns)
            );
        }
        (Message::Download(full), Message::Download(checked)) => {
            assert_eq!(
                (&full.table, &full.columns, &full.key_columns),
                (&checked.table, &checked.columns, &checked.key_columns)
            );
        }
        (Message::Conflicts(full), Message::Conflicts(checked)) => {
            assert_eq!(
                (&full.table, &full.key_columns),
                (&checked.table, &checked.key_columns)
            );
        }
        (full, checked) => assert_eq!(full, checked),
    }
}

/// The preamble and what follows it, fed in pieces and taken out in pieces of varying
/// size: never more output than asked, nor than the limit (plus the one byte that shows
/// it was exceeded).
pub fn inbound(data: &[u8]) {
    let mut control = Control { data };
    let limit = control.u16() as u64;
    let ask = 1 + control.byte() as usize * 257;
    let reads = control.reads();
    let memory_max = 2 * data.len() + 4 * DECOMPRESS_CHUNK_BYTES + 4096;
    within_memory(memory_max, "inbound", || {
        if let Some(header) = data.get(..PREAMBLE_BYTES) {
            let header: [u8; PREAMBLE_BYTES] = header.try_into().expect("eight bytes");
            if let Ok(preamble) = Preamble::decode(&header) {
                assert_eq!(preamble.encode(), header);
            }
        }
        let mut inbound = Inbound::new(limit);
        let mut total = 0u64;
        for read in reads {
            if inbound.feed(read).is_err() {
                return;
            }
            loop {
                match inbound.next_chunk_at_most(ask) {
                    Ok(Some(chunk)) => {
                        assert!(chunk.len() <= ask.min(DECOMPRESS_CHUNK_BYTES));
                        total += chunk.len() as u64;
                        assert!(total <= limit, "{total} bytes out, limit {limit}");
                    }
                    Ok(None) => break,
                    Err(InboundError::Compression(CompressionError::DecompressedTooLarge {
                        ..
                    })) => {
                        assert!(total <= limit);
                        return;
                    }
                    Err(_) => return,
                }
            }
        }
    });
}

pub fn inflate_zlib(data: &[u8]) {
    inflate(Compression::Zlib, data);
}

pub fn inflate_zstd(data: &[u8]) {
    inflate(Compression::Zstd, data);
}

/// A decompressor fed arbitrary bytes under a limit never produces more than the limit;
/// and the input compressed and inflated again comes back unchanged.
fn inflate(compression: Compression, data: &[u8]) {
    let mut control = Control { data };
    let limit = control.u16() as u64 * 16;
    let ask = 1 + control.byte() as usize * 257;
    let reads = control.reads();
    let memory_max = 4 * data.len() + 4 * DECOMPRESS_CHUNK_BYTES + 4096;
    within_memory(memory_max, "inflate", || {
        let mut decompressor =
            Decompressor::new(compression, limit).expect("a decompressor starts");
        let mut total = 0u64;
        'reads: for read in &reads {
            decompressor.feed(read);
            loop {
                match decompressor.next_chunk_at_most(ask) {
                    Ok(Some(chunk)) => {
                        assert!(chunk.len() <= ask.min(DECOMPRESS_CHUNK_BYTES));
                        total += chunk.len() as u64;
                        assert!(total <= limit, "{total} bytes out, limit {limit}");
                        assert_eq!(total, decompressor.decompressed_bytes());
                    }
                    Ok(None) => break,
                    Err(CompressionError::DecompressedTooLarge { limit_bytes }) => {
                        assert_eq!(limit_bytes, limit);
                        assert!(decompressor.decompressed_bytes() <= limit + 1);
                        break 'reads;
                    }
                    Err(_) => break 'reads,
                }
            }
        }
    });
    // The round trip, through the same pieces (the compressor's state is not measured).
    round_trip(compression, &reads, ask);
}

fn round_trip(compression: Compression, reads: &[&[u8]], ask: usize) {
    {
        let plain = reads.concat();
        let compressed = compress_all(compression, &plain).expect("compressing works");
        let mut decompressor =
            Decompressor::new(compression, plain.len() as u64).expect("a decompressor starts");
        let mut inflated = Vec::with_capacity(plain.len());
        for piece in compressed.chunks(reads.first().map_or(1, |read| read.len().max(1))) {
            decompressor.feed(piece);
            while let Some(chunk) = decompressor.next_chunk_at_most(ask).expect("inflates") {
                inflated.extend_from_slice(chunk);
            }
        }
        assert!(decompressor.is_finished() || plain.is_empty() && compressed.is_empty());
        assert_eq!(inflated, plain);
    }
}

/// The server's upload path (the stream stage of every transport: TCP, TLS, and HTTP
/// bodies alike) under small limits: no more than one frame inflated ahead of the
/// checks, nothing spooled before the hello, the spool within the upload limit, and a
/// completed upload's spool decodes and merges as the worker will.
pub fn upload_stream(data: &[u8]) {
    let mut control = Control { data };
    let frame_bytes_max = 16 + control.u16() as usize;
    let upload_bytes_max = control.u16() as usize * 4;
    let limits = UploadLimits {
        frame_bytes_max,
        upload_bytes_max,
        // Large, so that only inflating ahead of the frames could come near it.
        decompressed_bytes_max: 64 * 1024 * 1024,
        // Values in pieces up to half the upload (no control byte of its own, so the
        // corpus keeps its meaning).
        value_bytes_max: upload_bytes_max as u64 / 2,
    };
    let check_tables = control.byte() & 1 == 1;
    let reads = control.reads();
    let held_max = FRAME_HEADER_BYTES + limits.frame_bytes_max;
    let spool_max = limits.upload_bytes_max + held_max;
    let memory_max =
        4 * data.len() + 2 * spool_max + 80 * held_max + 4 * DECOMPRESS_CHUNK_BYTES + 4096;
    let mut completed = None;
    within_memory(memory_max, "upload_stream", || {
        completed = receive_upload(limits, check_tables, reads);
    });
    // Decoding is the worker's (its memory is the decoded upload's), not measured here.
    if let Some(spool) = completed {
        assert!(spool.len() <= spool_max, "spooled {}", spool.len());
        assert_spool_decodes(&spool, limits.frame_bytes_max);
    }
}

/// The stream stage's part of `upload_stream`: the spool of a completed upload.
fn receive_upload(limits: UploadLimits, check_tables: bool, reads: Vec<&[u8]>) -> Option<Vec<u8>> {
    let held_max = FRAME_HEADER_BYTES + limits.frame_bytes_max;
    let spool_max = limits.upload_bytes_max + held_max;
    let mut upload = UploadStream::new(limits);
    let mut spool = Vec::new();
    let mut inflated = 0usize;
    // Spooled from the hello on (protocol v3: from the `upload_resume` after it).
    let mut spooling = false;
    for read in reads {
        upload.feed(read).ok()?;
        loop {
            match upload.next_event().ok()? {
                UploadEvent::Inflated { bytes, spool: keep } => {
                    assert_eq!(keep, spooling, "spooled exactly from the hello on");
                    inflated += bytes.len();
                    if keep {
                        spool.extend_from_slice(bytes);
                        assert!(spool.len() <= spool_max, "spooled {}", spool.len());
                    }
                }
                UploadEvent::NeedInput => break,
                UploadEvent::Step(Step::Complete(_)) => return Some(spool),
                UploadEvent::Step(Step::Acknowledge { .. }) => return None,
                UploadEvent::Step(Step::Hello(hello)) => {
                    assert!(spool.is_empty());
                    spooling = hello.download_ack
                        || hello.protocol_version < rowsync_protocol::RESUME_SINCE_VERSION;
                    if check_tables {
                        upload.check_tables();
                    }
                }
                UploadEvent::Step(Step::UnknownTable(table)) => {
                    assert!(check_tables, "tables are checked only when asked");
                    let known = Arc::new(VersionTables {
                        version_exists: true,
                        tables: HashSet::from([FUZZ_TABLE.to_string()]),
                        other_versions: Vec::new(),
                    });
                    if upload.resolve_table(Some(known)).is_err() {
                        assert_ne!(table, FUZZ_TABLE);
                        return None;
                    }
                    assert_eq!(table, FUZZ_TABLE);
                }
                UploadEvent::Step(Step::Resume { offset, .. }) => {
                    assert!(spool.is_empty() && !spooling);
                    // Nothing is held here: the server refuses a resumption past 0.
                    if offset > 0 {
                        return None;
                    }
                    spooling = true;
                }
                UploadEvent::Step(
                    Step::HeldQuery { .. } | Step::DownloadResume { .. } | Step::Receipt { .. },
                ) => return None,
                UploadEvent::Step(Step::Continue) => unreachable!("never handed on"),
            }
            assert!(
                upload.buffered_bytes() <= held_max,
                "more than a frame held"
            );
            assert!(inflated as u64 <= limits.decompressed_bytes_max);
        }
    }
    let _ = upload.ended_early();
    None
}

/// The one table the `upload_stream` target's version synchronizes, when it checks.
const FUZZ_TABLE: &str = "orders";

/// What the worker does with a completed upload's spool: decode every frame in full and
/// merge the upload chunks by table. The checks on receipt promised it succeeds.
fn assert_spool_decodes(spool: &[u8], frame_bytes_max: usize) {
    let mut decoder = FrameDecoder::new(frame_bytes_max);
    decoder.feed(spool);
    let mut tables = MergedTables::default();
    let mut ended = false;
    while let Some(message) = decoder.next_message().expect("a checked frame decodes") {
        match message {
            Message::Upload(upload) => tables.merge(upload).expect("checked chunks merge"),
            Message::EndUpload(_) => ended = true,
            other => panic!("{other:?} in a checked upload"),
        }
    }
    decoder.finish().expect("the spool ends with a whole frame");
    assert!(ended, "the spool ends with end_upload");
}
