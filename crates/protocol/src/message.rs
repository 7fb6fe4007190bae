use serde::{Deserialize, Serialize};

use crate::{ErrorCode, Row};

/// Every message of the protocol. The numeric type byte of each is in [`MessageType`].
///
/// A sync is: client sends `Hello`, zero or more `Upload`, one `EndUpload`; server
/// answers with zero or more `Conflicts` (protocol v2), zero or more `Download` and one
/// `EndDownload`, or with `Error` or `Busy` at any point, after which the connection
/// closes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    Hello(Hello),
    Upload(TableUpload),
    EndUpload(EndUpload),
    Download(Download),
    EndDownload(EndDownload),
    Error(WireError),
    Busy {
        retry_after_ms: u32,
    },
    DownloadAck(DownloadAck),
    Conflicts(Conflicts),
    /// Protocol v2: a value too large for one frame follows in `ValuePiece` messages.
    ValueStart(ValueStart),
    /// Protocol v2: the next bytes of the value announced by `ValueStart`.
    ValuePiece(ValuePiece),
    /// Protocol v3: right after the hello of an upload, which transfer it is and from
    /// which byte of its stream the bytes that follow go on.
    UploadResume(UploadResume),
    /// Protocol v3: a client asks what the server holds of a cut transfer (right after a
    /// hello, instead of an upload); the server answers with the same message.
    UploadHeld(UploadHeld),
    /// Protocol v4: a client asks for the rest of a cut download from a byte of its
    /// stream (right after a hello, instead of an upload), or, after a download's end on
    /// TCP and TLS, says it received the whole stream (`offset` = its length).
    DownloadResume(DownloadResume),
    /// Protocol v4: the server's answer to `DownloadResume`: the held download's whole
    /// length and SHA-256; the stream's bytes from the asked offset follow.
    DownloadHeld(DownloadHeld),
    /// Protocol v7: key ranges. From a client, right before `EndUpload`: the ranges it
    /// holds and how far it used each. From the server, right before `EndDownload`: new
    /// ranges handed to the client.
    KeyRanges(KeyRanges),
    /// Protocol v8: from the server, right before `EndDownload` (with `KeyRanges`): a
    /// session token the client sends in its next hellos' `token` instead of paying for a
    /// password check, until it expires or is refused.
    SessionToken(SessionToken),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MessageType {
    Hello = 0x01,
    Upload = 0x02,
    EndUpload = 0x03,
    Download = 0x04,
    EndDownload = 0x05,
    Error = 0x06,
    Busy = 0x07,
    DownloadAck = 0x08,
    Conflicts = 0x09,
    ValueStart = 0x0A,
    ValuePiece = 0x0B,
    UploadResume = 0x0C,
    UploadHeld = 0x0D,
    DownloadResume = 0x0E,
    DownloadHeld = 0x0F,
    KeyRanges = 0x10,
    SessionToken = 0x11,
}

impl Message {
    pub fn message_type(&self) -> MessageType {
        match self {
            Message::Hello(_) => MessageType::Hello,
            Message::Upload(_) => MessageType::Upload,
            Message::EndUpload(_) => MessageType::EndUpload,
            Message::Download(_) => MessageType::Download,
            Message::EndDownload(_) => MessageType::EndDownload,
            Message::Error(_) => MessageType::Error,
            Message::Busy { .. } => MessageType::Busy,
            Message::DownloadAck(_) => MessageType::DownloadAck,
            Message::Conflicts(_) => MessageType::Conflicts,
            Message::ValueStart(_) => MessageType::ValueStart,
            Message::ValuePiece(_) => MessageType::ValuePiece,
            Message::UploadResume(_) => MessageType::UploadResume,
            Message::UploadHeld(_) => MessageType::UploadHeld,
            Message::DownloadResume(_) => MessageType::DownloadResume,
            Message::DownloadHeld(_) => MessageType::DownloadHeld,
            Message::KeyRanges(_) => MessageType::KeyRanges,
            Message::SessionToken(_) => MessageType::SessionToken,
        }
    }
}

impl MessageType {
    /// Every message type, in type byte order.
    pub const ALL: [MessageType; 17] = [
        MessageType::Hello,
        MessageType::Upload,
        MessageType::EndUpload,
        MessageType::Download,
        MessageType::EndDownload,
        MessageType::Error,
        MessageType::Busy,
        MessageType::DownloadAck,
        MessageType::Conflicts,
        MessageType::ValueStart,
        MessageType::ValuePiece,
        MessageType::UploadResume,
        MessageType::UploadHeld,
        MessageType::DownloadResume,
        MessageType::DownloadHeld,
        MessageType::KeyRanges,
        MessageType::SessionToken,
    ];

    /// The message type of a type byte, if there is one.
    pub fn from_u8(byte: u8) -> Option<MessageType> {
        MessageType::ALL
            .into_iter()
            .find(|message_type| *message_type as u8 == byte)
    }

    pub fn name(self) -> &'static str {
        match self {
            MessageType::Hello => "hello",
            MessageType::Upload => "upload",
            MessageType::EndUpload => "end_upload",
            MessageType::Download => "download",
            MessageType::EndDownload => "end_download",
            MessageType::Error => "error",
            MessageType::Busy => "busy",
            MessageType::DownloadAck => "download_ack",
            MessageType::Conflicts => "conflicts",
            MessageType::ValueStart => "value_start",
            MessageType::ValuePiece => "value_piece",
            MessageType::UploadResume => "upload_resume",
            MessageType::UploadHeld => "upload_held",
            MessageType::DownloadResume => "download_resume",
            MessageType::DownloadHeld => "download_held",
            MessageType::KeyRanges => "key_ranges",
            MessageType::SessionToken => "session_token",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u16,
    pub client_id: String,
    pub user: String,
    pub password: String,
    pub script_version: String,
    /// The watermark of the last download this client applied (0 before the first).
    pub last_download_watermark: i64,
    /// A signed token (JWT) instead of a password; empty for none. With a token, the
    /// user is the token's subject and `password` is ignored.
    pub token: String,
    /// Custom authentication parameters, bound into scripts as `:auth_1`, `:auth_2`, ...
    pub auth_parameters: Vec<String>,
    /// The client will confirm that it applied the download with `DownloadAck`; the
    /// server then advances the client's acknowledged watermark and runs `download_ack`.
    pub download_ack: bool,
    /// The tables this sync covers and their watermarks (protocol v9; before it, and
    /// when empty: every table of the version, each from `last_download_watermark`).
    #[serde(default, skip_serializing_if = "SyncTables::is_whole")]
    pub tables: SyncTables,
}

/// Which tables a sync covers, and the watermark of the last download each had where
/// it is not the hello's `last_download_watermark` (protocol v9).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncTables {
    /// Only the tables in `watermarks` (a subset of the version's, a publication);
    /// false: every table of the version.
    pub only_these: bool,
    /// Tables whose last download differs from the hello's watermark, and in a subset
    /// every table of it. The hello's watermark is then the lowest of the client's.
    pub watermarks: Vec<TableWatermark>,
}

impl SyncTables {
    /// Every table, each from the hello's watermark: what a hello before v9 says.
    pub fn is_whole(&self) -> bool {
        !self.only_these && self.watermarks.is_empty()
    }
}

/// The watermark of the last download a client applied to one table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableWatermark {
    pub table: String,
    pub last_download: i64,
}

/// A session token the server issued after a password login (protocol v8).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionToken {
    /// Opaque to the client: sent back as the hello's `token`, with the password.
    pub token: String,
    /// Seconds from now until the server stops accepting it.
    pub expires_in_seconds: u32,
}

/// The client applied the download that ended with this watermark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadAck {
    pub watermark: i64,
}

/// A value too large for one frame, announced before its pieces (protocol v2). Its
/// bytes follow in [`ValuePiece`] messages, and the next `Upload` or `Download` (a
/// single row) holds it where a value has the tag `in_pieces` (0x20).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueStart {
    /// The value's type: what its bytes become once whole.
    pub kind: PieceKind,
    /// The value's bytes in all (text: UTF-8 bytes; blob: raw bytes).
    pub length: u64,
    /// The table of the row that holds the value, so a receiver can name it when it
    /// refuses the value at its announcement.
    pub table: String,
    /// The column the value belongs to.
    pub column: String,
}

/// The types a value in pieces may have: those whose payload is a byte string. The
/// number is the value's own tag (§4 of docs/protocol.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum PieceKind {
    Text = 0x04,
    Blob = 0x05,
}

impl PieceKind {
    pub fn from_u8(tag: u8) -> Option<PieceKind> {
        match tag {
            0x04 => Some(PieceKind::Text),
            0x05 => Some(PieceKind::Blob),
            _ => None,
        }
    }
}

/// The next bytes of the value a [`ValueStart`] announced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValuePiece {
    #[serde(with = "hex::serde")]
    pub bytes: Vec<u8>,
}

/// Which transfer an upload is, and where its bytes go on (protocol v3). The stream a
/// transfer counts in is the upload's frames after this message, decompressed: the
/// server takes the first `offset` bytes from what it holds of the transfer (the prefix
/// a cut connection left), and the bytes that follow this message continue from there.
/// `offset` 0 starts the transfer; the transfer id is the client's choice, kept until
/// the upload is acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadResume {
    pub transfer_id: String,
    pub offset: u64,
}

/// What a server holds of a cut transfer (protocol v3). Asked with `length` 0 and no
/// digest; answered with the held prefix's length in bytes and its SHA-256 (32 bytes),
/// or length 0 and no digest when the server holds nothing of it for this client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadHeld {
    pub transfer_id: String,
    pub length: u64,
    #[serde(with = "hex::serde")]
    pub sha256: Vec<u8>,
}

/// Which cut download a client continues, and from which byte of its stream (protocol
/// v4). The download's stream is its frames (`conflicts`, `download`, `end_download`),
/// decompressed; its transfer id is the one the sync's `UploadResume` named. After a
/// download's end (TCP and TLS), the same message with `offset` = the stream's length
/// is the client's receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadResume {
    pub transfer_id: String,
    pub offset: u64,
}

/// A held download as the server answers `DownloadResume` (protocol v4): the whole
/// stream's length in bytes and SHA-256 (32 bytes), before the bytes from the offset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadHeld {
    pub transfer_id: String,
    pub length: u64,
    #[serde(with = "hex::serde")]
    pub sha256: Vec<u8>,
}

/// Key ranges of one client (protocol v7), in either direction.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KeyRanges {
    pub ranges: Vec<KeyRange>,
}

impl KeyRanges {
    /// Why a receiver refuses this message, if it does: more than
    /// `KEY_RANGES_PER_MESSAGE_MAX` ranges, or a range that is not well formed.
    pub fn refusal(&self) -> Option<String> {
        let max = crate::KEY_RANGES_PER_MESSAGE_MAX;
        if self.ranges.len() > max {
            return Some(format!(
                "a key_ranges message names {} ranges; at most {max} are taken",
                self.ranges.len()
            ));
        }
        self.ranges
            .iter()
            .find(|range| !range.is_well_formed())
            .map(|range| {
                format!(
                    "key range {}..{} of table {:?} with next key {} is not a range: its start \
                     must be below its end and its next key within it",
                    range.start, range.end, range.table, range.next
                )
            })
    }
}

/// Keys `start` (included) to `end` (excluded) of one table's key column, handed to one
/// client for the rows it inserts offline; no other client and no writer on the server
/// is handed them. `next` is the first key the client has not used (`start` in a range
/// the server hands out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRange {
    pub table: String,
    pub start: i64,
    pub end: i64,
    pub next: i64,
}

impl KeyRange {
    /// Keys of the range not used yet (0 for a range used up or malformed).
    pub fn keys_left(&self) -> u64 {
        let next = self.next.max(self.start);
        u64::try_from(i128::from(self.end) - i128::from(next)).unwrap_or(0)
    }

    /// Whether `start <= next <= end` and the range holds at least one key.
    pub fn is_well_formed(&self) -> bool {
        self.start < self.end && self.start <= self.next && self.next <= self.end
    }
}

/// The client's changes to one table. A large upload of one table may span several
/// `Upload` messages with the same table and columns; the receiver concatenates them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TableUpload {
    pub table: String,
    /// Column names of the rows in `inserts` and of both images in `updates`.
    pub columns: Vec<String>,
    /// Primary-key column names; `deletes` carries values for these only, in this order.
    pub key_columns: Vec<String>,
    pub inserts: Vec<Row>,
    pub updates: Vec<RowUpdate>,
    pub deletes: Vec<Row>,
}

/// An update carries the row as the client last saw it from the server (`old`) and as it
/// is now (`new`); the server detects conflicts by comparing `old` with its current row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowUpdate {
    pub old: Row,
    pub new: Row,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndUpload {
    /// Strictly increasing per client; the server applies each sequence at most once.
    pub upload_sequence: u64,
}

/// Rows of one table the client must hold (`upserts`) or drop (`deletes`, keys only).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Download {
    pub table: String,
    pub columns: Vec<String>,
    pub key_columns: Vec<String>,
    pub upserts: Vec<Row>,
    pub deletes: Vec<Row>,
}

/// Keys of one table's uploaded rows the server did not apply as sent (protocol v2):
/// the server's row for each follows in this sync's download (as an upsert, or as a
/// delete when the server has none). Sent before the download's first `Download`; a
/// table's keys may span several messages. Their number over all messages is at most
/// `EndDownload.summary.conflicts`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Conflicts {
    pub table: String,
    pub key_columns: Vec<String>,
    /// Values of `key_columns`, in that order, one row per conflicting key.
    pub keys: Vec<Row>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndDownload {
    /// The client sends this back as `last_download_watermark` in its next hello.
    pub watermark: i64,
    pub summary: SyncSummary,
}

/// What the server did with the upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SyncSummary {
    /// Upload operations (inserts + updates + deletes) received in this sync.
    pub rows_uploaded: u64,
    /// Upload operations the server did not apply as sent (server wins).
    pub conflicts: u64,
    /// The upload sequence was applied by an earlier sync; nothing was applied again.
    pub upload_already_applied: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireError {
    /// An [`ErrorCode`] number; unknown numbers must be tolerated by receivers.
    pub code: u16,
    pub message: String,
    /// Protocol v6, code 17 (`RowsRefused`) only: each row of the upload the server
    /// refused. Empty for every other code.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedRow>,
}

/// Protocol v6: a row of an upload the server refused, and why. Nothing of the upload
/// was applied; the client sets the row's change aside and sends the rest again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefusedRow {
    pub table: String,
    /// The table's key columns and the row's values of them; both empty when every
    /// change of the table is refused (a table the script version does not synchronize).
    pub key_columns: Vec<String>,
    pub key: Row,
    /// The [`ErrorCode`] the row alone would have failed the sync with.
    pub code: u16,
    pub reason: String,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> WireError {
        WireError {
            code: code as u16,
            message: message.into(),
            refused: Vec::new(),
        }
    }

    pub fn error_code(&self) -> Option<ErrorCode> {
        ErrorCode::from_u16(self.code)
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.error_code() {
            Some(code) => write!(f, "{code:?} (code {}): {}", self.code, self.message),
            None => write!(f, "error code {}: {}", self.code, self.message),
        }
    }
}
