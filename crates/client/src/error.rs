use rowsync_protocol::{DecodeError, InboundError, WireError};
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
}
