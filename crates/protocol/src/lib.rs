//! rowsync wire protocol, version 2.
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
mod pieces;
#[cfg(feature = "sqlite")]
mod sqlite;
mod value;

pub use codec::{check_message, decode_message, encode_message, encode_values};
pub use compression::{
    compress_all, Compression, CompressionError, Compressor, Decompressor, Inbound, InboundError,
    Outbound, Preamble, PreambleError, DECOMPRESS_CHUNK_BYTES, PREAMBLE_BYTES, PREAMBLE_MAGIC,
    PREAMBLE_VERSION,
};
pub use error::{DecodeError, ErrorCode};
pub use frame::{encode_frame, FrameDecoder, FRAME_BYTES_MAX_DEFAULT, FRAME_HEADER_BYTES};
pub use message::{
    Download, DownloadAck, EndDownload, EndUpload, Hello, Message, MessageType, PieceKind,
    RowUpdate, SyncSummary, TableUpload, ValuePiece, ValueStart, WireError,
};
pub use pieces::{message_frames, Frames, ROW_PIECES_BYTES_MAX_DEFAULT, VALUE_BYTES_MAX_DEFAULT};
pub use value::{Decimal, DecimalParseError, Row, Value, DECIMAL_SCALE_MAX};

/// The protocol version this crate speaks. A server refuses a hello with any other.
pub const PROTOCOL_VERSION: u16 = 2;
