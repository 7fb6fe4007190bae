use std::time::Duration;

use rowsync_protocol::{FRAME_BYTES_MAX_DEFAULT, VALUE_BYTES_MAX_DEFAULT};

use crate::token::TokenConfig;

/// The default of `shared_download_cache_bytes_max`: 64 MiB.
pub const SHARED_DOWNLOAD_CACHE_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;

/// The default of `client_ids_per_user_max`.
pub const CLIENT_IDS_PER_USER_MAX_DEFAULT: u64 = 10_000;

/// The default of `malloc_mmap_threshold_bytes`: glibc's own starting threshold, kept.
pub const MALLOC_MMAP_THRESHOLD_BYTES_DEFAULT: usize = 128 * 1024;

/// Every bound of the server, with its unit in its name.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Syncs in progress at once; more connections get *busy* at once.
    pub connections_max: usize,
    /// Connections holding a slot without having sent their hello: beyond it, the oldest
    /// of them past `hello_pending_grace` is answered busy, so silent connections hold at
    /// most this many slots for longer than the grace.
    pub hello_pending_connections_max: usize,
    /// How long a connection may wait for its hello before it can be told to make room
    /// for newer ones (`hello_pending_connections_max`).
    pub hello_pending_grace: Duration,
    /// Database workers, each with one pooled connection (a fixed count).
    pub workers: usize,
    /// Instead of a fixed count, let the controller choose within (min, max).
    pub workers_range: Option<(usize, usize)>,
    /// How often the load is measured (and the worker count reconsidered).
    pub worker_adjust_interval: Duration,
    /// Database connections used only to authenticate (never a sync's worker).
    pub auth_connections: usize,
    /// Password hash checks (argon2id) running at once.
    pub password_checks_max: usize,
    /// Refused logins from one address within `login_failure_window` after which its
    /// logins are refused unchecked until the window ends.
    pub login_failures_per_address_max: u32,
    /// Refused logins for one user name from one address (an IPv6 address by its /64)
    /// within `login_failure_window` after which that user's logins from that address
    /// are refused unchecked.
    pub login_failures_per_address_user_max: u32,
    /// Refused logins for one user name from any address within `login_failure_window`
    /// after which that user's logins are refused unchecked from every address that has
    /// failed in the window (never from one that has not).
    pub login_failures_per_user_max: u32,
    /// The window the login failure limits count in.
    pub login_failure_window: Duration,
    /// How often a server shares its refused logins with the other servers of its
    /// database and reads theirs (`rs_login_failure`), so a farm throttles as one
    /// server, and (with `farm_workers_max`) says it is alive (`rs_server`); zero:
    /// never (each server counts alone and takes its whole worker count).
    pub farm_share_interval: Duration,
    /// Workers all the servers of one database may run together (`None`: no farm
    /// budget): each server runs at most its share, this divided by the servers alive
    /// (heard of within three `farm_share_interval`s), and never fewer than one.
    pub farm_workers_max: Option<usize>,
    /// Client ids (subscriptions) one user may have: the first sync of a new client id
    /// beyond it is refused with code 13 (`None`: no limit). Each subscription holds
    /// tombstones back for everyone until it syncs again.
    pub client_ids_per_user_max: Option<u64>,
    /// Upload and download bytes all syncs in flight may keep in memory; beyond, they
    /// go to temporary files.
    pub cache_bytes_max: usize,
    /// Rows of shared cursors (a `shared` table's, say) kept for the syncs after the one
    /// that read them (`rowsync_consolidated::shared_download`); 0 keeps none.
    pub shared_download_cache_bytes_max: u64,
    /// How long kept rows serve other syncs: a client served them gets their watermark,
    /// so its next sync reads again at most this much of the changes.
    pub shared_download_cache_age: Duration,
    /// Memory all connections' zstd decoders may hold together (each holds the window
    /// its stream asks for, 2 MiB for the client library, at most 8 MiB, from the
    /// stream's first bytes until its upload is read); a connection whose decoder does
    /// not fit waits for room before inflating anything. At least one decoder of the
    /// largest window (about 8.6 MiB). Default: an eighth of physical memory.
    pub zstd_decoders_bytes_max: usize,
    /// Allocations of at least this many bytes get pages of their own from the kernel,
    /// given back when freed (glibc's `M_MMAP_THRESHOLD`, set when the server starts;
    /// 0 leaves glibc's sliding threshold). glibc otherwise raises the threshold to the
    /// largest block freed so far (a zstd window, a 1 MiB download message), after which
    /// such blocks come from its arenas, and pages touched there stay resident: a burst
    /// of 2,000 clients left 1.45 GB resident with 0.35 GB allocated at its peak.
    pub malloc_mmap_threshold_bytes: usize,
    /// Upload bytes one sync keeps in memory (while the cache has room).
    pub upload_spool_memory_bytes_max: usize,
    pub frame_bytes_max: usize,
    /// Upload bytes (encoded) one sync may send.
    pub upload_bytes_max: usize,
    /// The largest value (text or blob bytes) an upload may hold or a download may carry;
    /// a value larger than a frame travels in pieces (protocol v2). Above it: code 5.
    pub value_bytes_max: u64,
    /// Download messages are cut at about this many bytes.
    pub download_message_bytes_max: usize,
    /// Encoded download bytes one sync keeps in memory; beyond, they go to a temporary file.
    pub download_spool_memory_bytes_max: usize,
    /// Encoded download bytes one sync may send at all (frames, counted before compression).
    pub download_bytes_max: u64,
    /// Retry hint sent with *busy* before any sync completed, and the least one sent;
    /// after that the hint is the syncs in progress divided by the completion rate.
    pub busy_retry_after_ms: u32,
    /// The largest retry hint sent with *busy*.
    pub busy_retry_after_ms_max: u32,
    /// How often tombstones every client has passed are removed.
    pub cleanup_interval: Duration,
    /// A connection that sends nothing for this long is closed (the body read timeout:
    /// each read of the upload must make progress within it).
    pub read_timeout: Duration,
    /// The header read timeout: on TCP and TLS the preamble and the whole `hello` must
    /// arrive within this long of the connection's start (after the TLS handshake); on
    /// HTTP the request's headers must.
    pub header_read_timeout: Duration,
    /// The whole upload must arrive within this long of the connection's start: a
    /// client sending a byte now and then holds its slot no longer.
    pub upload_timeout: Duration,
    /// An HTTP connection with no request in progress for this long is closed (HTTP/1.1
    /// keep-alive and HTTP/2 alike); its connection permit is then free.
    pub http_idle_timeout: Duration,
    /// How often an HTTP/2 connection is pinged while open; one whose ping is not
    /// answered within `read_timeout` is closed.
    pub http2_keep_alive_interval: Duration,
    /// Receipt requests (protocol v4) one HTTP connection may send per second; more are
    /// answered without looking anything up.
    pub receipts_per_connection_per_second_max: u32,
    /// A TLS handshake must complete within this long.
    pub tls_handshake_timeout: Duration,
    /// Bytes one connection's upload may inflate to when it is compressed; checked
    /// while decompressing, so a small stream that would inflate to gigabytes is refused
    /// before it has produced more than this.
    pub decompressed_bytes_max: u64,
    /// A client whose reading of the download makes no progress for this long is dropped.
    pub write_timeout: Duration,
    /// The most bytes of one cut upload (its decompressed stream) held for its client to
    /// resume (protocol v3); a cut upload above it is not held and is sent again whole.
    pub held_upload_bytes_max: u64,
    /// The most bytes all held uploads together take in the consolidated database; a cut
    /// upload that would go beyond it is not held (and its client's earlier one goes).
    pub held_uploads_bytes_max: u64,
    /// Protocol v6: the most rows of one upload the server names when it refuses them
    /// (each tried alone, in a transaction rolled back after); an upload with more
    /// failing rows fails as a whole with the first one's error.
    pub refused_rows_max: u64,
    /// The most bytes the held uploads of one user (all its client ids) take together,
    /// counted as stored (decompressed), not as received; a cut upload that would go
    /// beyond it is not held.
    pub held_uploads_bytes_per_user_max: u64,
    /// Held uploads older than this are removed by the background cleanup (every
    /// `cleanup_interval`); a client resuming later sends its upload again whole.
    pub held_upload_expiry: Duration,
    /// The most bytes of one cut download (its whole decompressed stream) held for its
    /// client to resume (protocol v4); a cut download above it is not held, and the
    /// client's next sync downloads afresh.
    pub held_download_bytes_max: u64,
    /// The most bytes all held downloads together take in the consolidated database; a
    /// cut download that would go beyond it is not held (and its client's earlier one
    /// goes).
    pub held_downloads_bytes_max: u64,
    /// The most bytes the held downloads of one user take together; a cut download that
    /// would go beyond it is not held.
    pub held_downloads_bytes_per_user_max: u64,
    /// Held downloads older than this are removed by the background cleanup; a client
    /// resuming later downloads afresh.
    pub held_download_expiry: Duration,
    /// After a stop is asked (SIGTERM, SIGINT), how long running syncs may finish while
    /// new ones are answered busy; then the server stops anyway.
    pub drain_timeout: Duration,
    /// Signed tokens accepted instead of passwords.
    pub tokens: TokenConfig,
    /// How long a session token handed out after a password login holds
    /// (`session_token_seconds`; zero: none are handed out, protocol v8).
    pub session_token_lifetime: Duration,
    /// Records each sync for replay (`--record DIR`), when set.
    pub recorder: Option<std::sync::Arc<crate::record::Recorder>>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            connections_max: 1024,
            hello_pending_connections_max: 256,
            hello_pending_grace: Duration::from_secs(2),
            workers: 4,
            workers_range: None,
            worker_adjust_interval: Duration::from_secs(1),
            auth_connections: 2,
            password_checks_max: std::thread::available_parallelism().map_or(2, |n| n.get()),
            login_failures_per_address_max: 30,
            login_failures_per_address_user_max: 10,
            login_failures_per_user_max: 100,
            client_ids_per_user_max: Some(CLIENT_IDS_PER_USER_MAX_DEFAULT),
            login_failure_window: Duration::from_secs(60),
            farm_share_interval: Duration::from_secs(1),
            farm_workers_max: None,
            cache_bytes_max: crate::cache::default_cache_bytes_max(),
            shared_download_cache_bytes_max: SHARED_DOWNLOAD_CACHE_BYTES_MAX_DEFAULT,
            shared_download_cache_age: Duration::from_secs(10),
            zstd_decoders_bytes_max: crate::decoders::default_zstd_decoders_bytes_max(),
            malloc_mmap_threshold_bytes: MALLOC_MMAP_THRESHOLD_BYTES_DEFAULT,
            upload_spool_memory_bytes_max: 16 * 1024 * 1024,
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            upload_bytes_max: 512 * 1024 * 1024,
            value_bytes_max: VALUE_BYTES_MAX_DEFAULT,
            download_message_bytes_max: 1024 * 1024,
            download_spool_memory_bytes_max: 16 * 1024 * 1024,
            download_bytes_max: 16 * 1024 * 1024 * 1024,
            busy_retry_after_ms: 1000,
            busy_retry_after_ms_max: 60_000,
            cleanup_interval: Duration::from_secs(300),
            read_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            upload_timeout: Duration::from_secs(600),
            tls_handshake_timeout: Duration::from_secs(10),
            http_idle_timeout: Duration::from_secs(10),
            http2_keep_alive_interval: Duration::from_secs(20),
            receipts_per_connection_per_second_max: 4,
            decompressed_bytes_max: 512 * 1024 * 1024 + 1024 * 1024,
            write_timeout: Duration::from_secs(60),
            held_upload_bytes_max: 64 * 1024 * 1024,
            held_uploads_bytes_max: 1024 * 1024 * 1024,
            held_uploads_bytes_per_user_max: 128 * 1024 * 1024,
            held_upload_expiry: Duration::from_secs(24 * 60 * 60),
            refused_rows_max: 1000,
            held_download_bytes_max: 64 * 1024 * 1024,
            held_downloads_bytes_max: 1024 * 1024 * 1024,
            held_downloads_bytes_per_user_max: 128 * 1024 * 1024,
            held_download_expiry: Duration::from_secs(24 * 60 * 60),
            drain_timeout: Duration::from_secs(30),
            tokens: TokenConfig::default(),
            session_token_lifetime: Duration::from_secs(
                crate::session_token::SESSION_TOKEN_SECONDS_DEFAULT,
            ),
            recorder: None,
        }
    }
}
