use rowsync_protocol::{DecodeError, ErrorCode, InboundError, WireError};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("network: {0}")]
    Io(#[from] std::io::Error),
    #[error("could not reach {address}: {source}")]
    Connect {
        address: String,
        source: std::io::Error,
    },
    #[error("invalid server address {address:?}: {message}")]
    Address { address: String, message: String },
    #[error("TLS with {address}: {message}")]
    Tls { address: String, message: String },
    #[error("HTTP: {message}")]
    Http {
        status: Option<u16>,
        message: String,
    },
    #[error("the server's byte stream: {0}")]
    Stream(#[from] InboundError),
    #[error("timed out after {timeout_ms} ms while {during}")]
    Timeout {
        during: &'static str,
        timeout_ms: u64,
    },
    #[error("malformed data from the server: {0}")]
    Decode(#[from] DecodeError),
    #[error("the server refused the sync: {0}")]
    Server(WireError),
    #[error("the server is busy; retry after {retry_after_ms} ms")]
    Busy { retry_after_ms: u32 },
    #[error("protocol violation by the server: {0}")]
    Protocol(String),
    #[error("{0}")]
    Schema(String),
    /// Reading, writing or syncing the client database's files outside SQLite (the
    /// memory mode's copy, the flush before an upload).
    #[error("the client database file {path}: {source}")]
    File {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// No key of the table's ranges is left on this device (protocol v7 key ranges).
    #[error(
        "no key of table {table:?} is left on this device: sync to be handed a new range \
         (the server hands ranges out for the tables its script version has a key_range \
         script for: `rowsync keys`, docs/types.md)"
    )]
    NoKeys { table: String },
    /// An option the client cannot work with (a durability mode name, a combination).
    #[error("invalid client option: {0}")]
    Option(String),
}

/// What a failed sync means for whoever called it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The server stayed busy through every retry, or another sync of this client was
    /// in progress: try again later.
    Busy,
    /// The server refused the sync: credentials, protocol or script version, client
    /// id, an upload it cannot take. Trying again unchanged will not help.
    Refused,
    /// Anything else: network, TLS, the local database, a protocol violation, a
    /// script that failed on the server.
    Failed,
}

impl ClientError {
    pub fn kind(&self) -> FailureKind {
        match self {
            ClientError::Busy { .. } => FailureKind::Busy,
            ClientError::Server(wire) => match wire.error_code() {
                Some(
                    ErrorCode::AuthenticationFailed
                    | ErrorCode::UnsupportedProtocolVersion
                    | ErrorCode::UnknownScriptVersion
                    | ErrorCode::ClientIdTaken
                    | ErrorCode::ClientIdsExceeded
                    | ErrorCode::Schema
                    | ErrorCode::RowsRefused
                    | ErrorCode::UploadTooLarge
                    | ErrorCode::FrameTooLarge,
                ) => FailureKind::Refused,
                Some(ErrorCode::AlreadySynchronizing) => FailureKind::Busy,
                _ => FailureKind::Failed,
            },
            _ => FailureKind::Failed,
        }
    }

    /// The server's error code, when the server ended the sync with an error.
    pub fn server_code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server(wire) => wire.error_code(),
            _ => None,
        }
    }
}
