use thiserror::Error;

/// Why a byte sequence is not a valid message. Every variant names what was wrong and
/// where, so a peer's bug can be found from the error text alone.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    #[error("truncated message: needed {needed} more bytes for {what} at offset {offset}")]
    Truncated {
        what: &'static str,
        offset: usize,
        needed: usize,
    },
    #[error("unknown message type 0x{0:02x}")]
    UnknownMessageType(u8),
    #[error("unknown value tag 0x{tag:02x} at offset {offset}")]
    UnknownValueTag { tag: u8, offset: usize },
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str, offset: usize },
    #[error("decimal scale {scale} at offset {offset} exceeds the maximum of {max}")]
    DecimalScale { scale: u8, offset: usize, max: u8 },
    #[error("{trailing} unexpected bytes after the end of a {message} message")]
    TrailingBytes {
        message: &'static str,
        trailing: usize,
    },
    #[error("stream ended mid-frame: {received_bytes} of {expected_bytes} bytes received")]
    EndedMidFrame {
        received_bytes: usize,
        expected_bytes: usize,
    },
    #[error("{what} at offset {offset} is {value}; a flag must be 0 or 1")]
    InvalidFlag {
        what: &'static str,
        value: u8,
        offset: usize,
    },
    #[error("{what} at offset {offset} is invalid: {reason}")]
    InvalidValue {
        what: &'static str,
        offset: usize,
        reason: String,
    },
    #[error("empty frame: a frame must contain at least the message type byte")]
    EmptyFrame,
    #[error("frame of {length_bytes} bytes exceeds the limit of {limit_bytes} bytes")]
    FrameTooLarge {
        length_bytes: usize,
        limit_bytes: usize,
    },
    #[error("{what} count {count} at offset {offset} cannot fit in the {remaining} bytes left")]
    CountTooLarge {
        what: &'static str,
        count: usize,
        offset: usize,
        remaining: usize,
    },
    #[error("value_start at offset {offset} names tag 0x{tag:02x}; only text and blob values travel in pieces")]
    PieceKind { tag: u8, offset: usize },
    #[error(
        "the value in column {column:?} of table {table:?} takes {length} bytes, above the \
         limit of {limit} bytes for a value"
    )]
    ValueTooLarge {
        table: String,
        column: String,
        length: u64,
        limit: u64,
    },
    #[error(
        "the values in pieces of one row take {bytes} bytes, above the limit of {limit} bytes"
    )]
    RowPiecesTooLarge { bytes: u64, limit: u64 },
    #[error("more than {limit} values in pieces for one row")]
    ValuesInPiecesTooMany { limit: usize },
    #[error("value_start for {table}.{column} announces an empty value; an empty value travels in its row")]
    EmptyValueInPieces { table: String, column: String },
    #[error("a value in pieces from a protocol version 1 peer: values in pieces need version 2")]
    PiecesRefused,
    #[error("value_piece without a value_start before it")]
    PieceWithoutStart,
    #[error(
        "value pieces carry {received} bytes, more than the {length} their value_start announced"
    )]
    PieceOverrun { received: u64, length: u64 },
    #[error("{message} message while a value in pieces has only {received} of its {length} bytes")]
    ValueIncomplete {
        message: &'static str,
        received: u64,
        length: u64,
    },
    #[error(
        "the value in pieces at offset {offset} sits in column {column:?} of table {table:?}, \
         but was announced for column {announced_column:?} of table {announced_table:?}"
    )]
    InPiecesMisplaced {
        offset: usize,
        announced_table: String,
        announced_column: String,
        table: String,
        column: String,
    },
    #[error("value in pieces at offset {offset}, but no whole value was sent before the message")]
    InPiecesMissing { offset: usize },
    #[error(
        "{count} values were sent in pieces before a {message} message that does not hold them"
    )]
    InPiecesUnused { count: usize, message: &'static str },
    #[error(
        "a message holding values in pieces must carry exactly one row; this one carries {rows}"
    )]
    InPiecesRows { rows: usize },
    #[error("row at offset {offset} has {found} values, the message declares {expected} columns")]
    RowWidth {
        offset: usize,
        expected: usize,
        found: usize,
    },
}

/// Error codes carried by the `Error` message. Numbers are part of the wire contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[repr(u16)]
pub enum ErrorCode {
    /// A frame or message could not be decoded, or arrived out of order.
    Protocol = 1,
    /// A frame exceeded the receiver's frame size limit.
    FrameTooLarge = 2,
    /// Unknown user or wrong credentials (deliberately indistinguishable).
    AuthenticationFailed = 3,
    /// The hello named a protocol version this server does not speak.
    UnsupportedProtocolVersion = 4,
    /// The upload exceeded the server's upload size limit, or a value (uploaded or to be
    /// downloaded) the server's `value_bytes_max`.
    UploadTooLarge = 5,
    /// The hello named a script version the consolidated database does not have.
    UnknownScriptVersion = 6,
    /// The upload names a table or column the script version does not synchronize.
    Schema = 7,
    /// Another sync for the same client is in progress.
    AlreadySynchronizing = 8,
    /// A sync script failed; the upload was rolled back as a whole.
    Script = 9,
    /// The client id is registered to another user.
    ClientIdTaken = 10,
    /// The peer took too long.
    Timeout = 11,
    /// Anything else on the server; the upload was rolled back as a whole.
    Internal = 12,
    /// The user already has as many client ids as the server allows
    /// (`client_ids_per_user_max`): a new client id is refused.
    ClientIdsExceeded = 13,
    /// Protocol v3: the server holds less of the transfer than the `upload_resume`
    /// offset (nothing at all, another client's or user's, expired): the client sends
    /// the upload again from offset 0.
    TransferNotHeld = 14,
    /// Protocol v5: an upload under the sequence the server applied last, with another
    /// transfer id: another copy of this client database synced under its client id.
    /// Nothing was applied; the client takes a new client id and sends again.
    ClientCopied = 15,
    /// Protocol v5: an upload below the sequence the server applied last: this client
    /// database is behind its own acknowledged syncs (restored from a backup, or a copy
    /// the other copy synced past). Nothing was applied; the client takes a new client
    /// id and sends again.
    ClientRestored = 16,
    /// Protocol v6: rows of the upload were refused (a script or constraint failed for
    /// them, a value their column cannot take, a table the script version does not
    /// synchronize); the error names each (`WireError::refused`). Nothing was applied:
    /// the client sets those rows' changes aside and sends the rest again.
    RowsRefused = 17,
}

impl ErrorCode {
    pub fn from_u16(code: u16) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match code {
            1 => Protocol,
            2 => FrameTooLarge,
            3 => AuthenticationFailed,
            4 => UnsupportedProtocolVersion,
            5 => UploadTooLarge,
            6 => UnknownScriptVersion,
            7 => Schema,
            8 => AlreadySynchronizing,
            9 => Script,
            10 => ClientIdTaken,
            11 => Timeout,
            12 => Internal,
            13 => ClientIdsExceeded,
            14 => TransferNotHeld,
            15 => ClientCopied,
            16 => ClientRestored,
            17 => RowsRefused,
            _ => return None,
        })
    }
}
