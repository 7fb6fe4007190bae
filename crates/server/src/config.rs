use std::time::Duration;

use rowsync_protocol::FRAME_BYTES_MAX_DEFAULT;

use crate::token::TokenConfig;

/// Every bound of the server, with its unit in its name.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Syncs in progress at once; more connections get *busy* at once.
    pub connections_max: usize,
    /// Database workers, each with one pooled connection.
    pub workers: usize,
    pub frame_bytes_max: usize,
    /// Upload bytes (encoded) one sync may send.
    pub upload_bytes_max: usize,
    /// Download messages are cut at about this many bytes.
    pub download_message_bytes_max: usize,
    /// Encoded download bytes one sync keeps in memory; beyond, they go to a temporary file.
    pub download_spool_memory_bytes_max: usize,
    /// Encoded download bytes one sync may send at all (frames, counted before compression).
    pub download_bytes_max: u64,
    /// Retry hint sent with *busy*.
    pub busy_retry_after_ms: u32,
    /// How often tombstones every client has passed are removed.
    pub cleanup_interval: Duration,
    /// A connection that sends nothing for this long is closed (the body read timeout:
    /// each read of the upload must make progress within it).
    pub read_timeout: Duration,
    /// The header read timeout: on TCP and TLS the preamble and the whole `hello` must
    /// arrive within this long of the connection's start (after the TLS handshake); on
    /// HTTP the request's headers must.
    pub header_read_timeout: Duration,
    /// A TLS handshake must complete within this long.
    pub tls_handshake_timeout: Duration,
    /// Bytes one connection's upload may inflate to when it is compressed; checked
    /// while decompressing, so a small stream that would inflate to gigabytes is refused
    /// before it has produced more than this.
    pub decompressed_bytes_max: u64,
    /// A client whose reading of the download makes no progress for this long is dropped.
    pub write_timeout: Duration,
    /// Signed tokens accepted instead of passwords.
    pub tokens: TokenConfig,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            connections_max: 1024,
            workers: 4,
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            upload_bytes_max: 512 * 1024 * 1024,
            download_message_bytes_max: 1024 * 1024,
            download_spool_memory_bytes_max: 16 * 1024 * 1024,
            download_bytes_max: 16 * 1024 * 1024 * 1024,
            busy_retry_after_ms: 1000,
            cleanup_interval: Duration::from_secs(300),
            read_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            tls_handshake_timeout: Duration::from_secs(10),
            decompressed_bytes_max: 512 * 1024 * 1024 + 1024 * 1024,
            write_timeout: Duration::from_secs(60),
            tokens: TokenConfig::default(),
        }
    }
}
