//! rowsync wire protocol, version 3 (a server also speaks versions 1 and 2).
//!
//! Everything here is pure: messages are encoded into byte vectors and decoded from
//! byte slices. Reading and writing sockets is the caller's business. The contract
//! other implementations follow is `docs/protocol.md`; the golden vectors in
//! `tests/vectors.json` pin the exact bytes.

mod codec;
mod compression;
mod error;
mod frame;
mod message;
mod numeric;
mod pieces;
#[cfg(feature = "sqlite")]
mod sqlite;
mod table_order;
mod text_form;
mod value;
mod whole;

pub use codec::{
    check_message, decode_message, encode_key_identity, encode_message, encode_values,
};
pub use compression::{
    compress_all, zstd_decoder_bytes, zstd_stream_window, Compression, CompressionError,
    Compressor, Decompressor, Inbound, InboundError, Outbound, Preamble, PreambleError, ZstdWindow,
    DECOMPRESS_CHUNK_BYTES, PREAMBLE_BYTES, PREAMBLE_MAGIC, PREAMBLE_VERSION,
    ZSTD_WINDOW_BYTES_MAX,
};
pub use error::{DecodeError, ErrorCode};
pub use frame::{encode_frame, FrameDecoder, FRAME_BYTES_MAX_DEFAULT, FRAME_HEADER_BYTES};
pub use message::{
    Conflicts, Download, DownloadAck, DownloadHeld, DownloadResume, EndDownload, EndUpload, Hello,
    KeyRange, KeyRanges, Message, MessageType, PieceKind, RefusedRow, RowUpdate, SessionToken,
    SyncSummary, SyncTables, TableUpload, TableWatermark, UploadHeld, UploadResume, ValuePiece,
    ValueStart, WireError,
};
pub use numeric::{parse_decimal_value, Numeric, NUMERIC_SCALE_MAX, NUMERIC_WHOLE_DIGITS_MAX};
pub use pieces::{
    message_frames, Frames, ROW_PIECES_BYTES_MAX_DEFAULT, VALUES_IN_PIECES_PER_ROW_MAX,
    VALUE_BYTES_MAX_DEFAULT, VALUE_IN_PIECES_COST_BYTES,
};
pub use table_order::{parent_first, TableOrder};
pub use text_form::{
    format_date, format_interval, format_time, format_timestamp, format_uuid, parse_date,
    parse_interval, parse_text_form, parse_time, parse_timestamp, parse_uuid, TextFormError,
    ValueKind,
};
pub use value::{
    Decimal, DecimalParseError, Interval, Row, Value, ARRAY_DEPTH_MAX, DECIMAL_SCALE_MAX,
};

/// The protocol version this crate speaks. A server accepts a hello of this version or
/// any down to [`PROTOCOL_VERSION_MIN`] and refuses others.
pub const PROTOCOL_VERSION: u16 = 9;

/// The oldest protocol version a server still serves: a v1 session gets every v2 value
/// in its v1 form ([`Value::to_v1`]), and never a value in pieces.
pub const PROTOCOL_VERSION_MIN: u16 = 1;

/// The first protocol version whose server names conflicting keys in `Conflicts`.
pub const CONFLICTS_SINCE_VERSION: u16 = 2;

/// The first protocol version that sends values larger than a frame in pieces
/// (`ValueStart`, `ValuePiece`).
pub const PIECES_SINCE_VERSION: u16 = 2;

/// The first protocol version whose uploads are resumable transfers: every upload
/// carries `UploadResume` right after its hello, and a client may ask what the server
/// holds of a cut transfer with `UploadHeld`.
pub const RESUME_SINCE_VERSION: u16 = 3;

/// The first protocol version whose downloads are resumable too: a cut download is held
/// by the server under the sync's transfer id, and the client continues it with
/// `DownloadResume`, answered by `DownloadHeld` and the rest of the stream.
pub const DOWNLOAD_RESUME_SINCE_VERSION: u16 = 4;

/// The first protocol version whose client proves it is the database the server knows:
/// it keeps an upload's transfer id until the upload is acknowledged, so the server
/// refuses an upload under an applied sequence with another transfer id (a copied
/// database, `ErrorCode::ClientCopied`) or below the last applied sequence (a restored
/// one, `ErrorCode::ClientRestored`) before applying anything.
pub const IDENTITY_SINCE_VERSION: u16 = 5;

/// The first protocol version whose server names the rows of an upload it refuses
/// (`ErrorCode::RowsRefused` with `WireError::refused`) instead of failing the whole
/// sync with the first row's error; its client sets them aside and sends the rest.
pub const REFUSED_ROWS_SINCE_VERSION: u16 = 6;

/// The first protocol version with key ranges (`KeyRanges`): the client says which
/// ranges it holds before `EndUpload`, and the server hands it new ones before
/// `EndDownload` where the script version has a `key_range` script for the table.
pub const KEY_RANGES_SINCE_VERSION: u16 = 7;

/// The first protocol version whose server hands a client that logged in by password a
/// `SessionToken`, which the client sends back in its next hellos' `token` (with the
/// password, which the server checks only when the token no longer holds).
pub const SESSION_TOKEN_SINCE_VERSION: u16 = 8;

/// The first protocol version whose hello may name the tables a sync covers and the
/// watermark each was last downloaded to (`Hello::tables`): a client syncs a subset of
/// its tables (a publication), or tables in order of priority.
pub const TABLES_SINCE_VERSION: u16 = 9;

/// The most key ranges one `KeyRanges` message may carry; a receiver refuses more.
pub const KEY_RANGES_PER_MESSAGE_MAX: usize = 1024;

/// Over HTTP(S), a version 4 download whose stream (its decompressed frames) is at least
/// this many bytes is confirmed by a receipt of its own: after the response, the client
/// sends a request whose body is the `DownloadResume` frame at the stream's length, and
/// the server keeps the download until it arrives (docs/protocol.md §5.12). Below it the
/// server takes a written response as delivered: the receipt's round trip, paid by every
/// such sync, would cost more link time than resuming a download this small could save
/// (at 512 kbit/s and 300 ms a round trip is the time of 19,200 bytes), and a compressed
/// download resumes only at its 32 KiB flush points anyway. After a resumed download
/// the receipt is sent whatever its length (it releases the held download).
pub const DOWNLOAD_RECEIPT_BYTES_MIN: u64 = 64 * 1024;
