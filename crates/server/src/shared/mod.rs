//! What every connection of a server shares: the configuration, the worker pool and the
//! pool of authentication connections, the cache, the metrics, the connection slots and
//! the load estimate behind the busy hint. The state of transfers every connection
//! sees (uploads being received, downloads awaiting their receipt) is in the modules
//! beneath (`holding`, `receipts`), so that `held` and `receipt`, which act on it, import
//! this module and it imports neither.

pub(crate) mod holding;
pub(crate) mod receipts;

use rowsync_consolidated::shared_download::SharedDownloads;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rowsync_consolidated::Consolidated;
use tokio::sync::Semaphore;

use crate::cache::Cache;
use crate::config::ServerConfig;
use crate::decoders::ZstdDecoders;
use crate::metrics::{Metrics, Outcome};
use crate::pending::{Counted, PendingHellos};
use crate::pool::WorkerPool;
use crate::session_token::SessionTokens;
use crate::throttle::{LoginThrottle, ThrottleLimits};
use crate::version_tables::VersionTablesCache;

/// Bytes read from a socket at a time.
pub(crate) const READ_CHUNK_BYTES: usize = 64 * 1024;

pub(crate) struct Shared<B: Consolidated> {
    pub(crate) config: ServerConfig,
    pub(crate) pool: Arc<WorkerPool<B>>,
    /// Connections for authentication only: logins never take a sync's worker.
    pub(crate) auth_pool: Arc<WorkerPool<B>>,
    /// Password hash checks (argon2id, CPU-bound) running at once.
    pub(crate) password_checks: Semaphore,
    /// The session keys read from the database, for the session tokens logins hand out.
    pub(crate) session_tokens: SessionTokens,
    pub(crate) cache: Arc<Cache>,
    /// Room for the connections' zstd decoders (`zstd_decoders_bytes_max`).
    pub(crate) zstd_decoders: ZstdDecoders,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) load: Load,
    /// One permit per sync in progress, whatever its transport (`connections_max`).
    pub(crate) slots: Arc<Semaphore>,
    /// One permit per open HTTP(S) connection (`connections_max` of them): a keep-alive
    /// or HTTP/2 connection may sit between requests without holding a sync's slot.
    pub(crate) http_connections: Arc<Semaphore>,
    /// One permit per HTTP sync response still being sent (`connections_max`): a sync's
    /// slot is free once its download is written into the response, which may still be
    /// on its way; a drain waits for these too.
    pub(crate) http_responses: Arc<Semaphore>,
    /// Connections with a slot still waiting for their hello
    /// (`hello_pending_connections_max`).
    pub(crate) pending_hellos: PendingHellos,
    /// HTTP connections with no request in progress (`hello_pending_connections_max`):
    /// beyond it, the oldest idle past the grace is closed, freeing its permit.
    pub(crate) idle_http: PendingHellos,
    /// Refused logins counted by address, by user at an address, and by user.
    pub(crate) login_throttle: LoginThrottle,
    /// This server's share of `farm_workers_max` (0: no farm budget, or not known yet).
    pub(crate) farm_workers_share: std::sync::atomic::AtomicUsize,
    /// The tables of each script version, for refusing unknown tables as they arrive.
    pub(crate) version_tables: VersionTablesCache,
    /// Cut uploads being held right now, by client id (see `holding::Holding`).
    pub(crate) holding: holding::Holding,
    /// Downloads sent over HTTP, kept until their receipt (see `receipt`).
    pub(crate) receipts: receipts::Receipts,
    /// Shared rows read once (`shared_download_cache_bytes_max`); `None` when 0.
    pub(crate) shared_downloads: Option<Arc<SharedDownloads>>,
}

impl<B: Consolidated> Shared<B> {
    /// The state of a server starting with `workers` workers.
    pub(crate) fn new(
        backend: B,
        config: ServerConfig,
        metrics: Arc<Metrics>,
        workers: usize,
    ) -> Shared<B> {
        Shared {
            pool: WorkerPool::new(backend.clone(), workers),
            auth_pool: WorkerPool::new(backend, config.auth_connections.max(1)),
            password_checks: Semaphore::new(config.password_checks_max.max(1)),
            session_tokens: SessionTokens::new(config.session_token_lifetime),
            cache: Cache::new(config.cache_bytes_max, Arc::clone(&metrics)),
            zstd_decoders: ZstdDecoders::new(
                config.zstd_decoders_bytes_max,
                metrics.zstd_decoders_bytes.clone(),
            ),
            farm_workers_share: std::sync::atomic::AtomicUsize::new(0),
            login_throttle: LoginThrottle::new(
                ThrottleLimits {
                    per_address_max: config.login_failures_per_address_max,
                    per_address_user_max: config.login_failures_per_address_user_max,
                    per_user_max: config.login_failures_per_user_max,
                },
                config.login_failure_window,
            ),
            pending_hellos: PendingHellos::new(
                config.hello_pending_connections_max,
                config.hello_pending_grace,
                Counted {
                    waiting: metrics.connections_awaiting_hello.clone(),
                    evictions: metrics.hello_pending_evictions.clone(),
                },
            ),
            idle_http: PendingHellos::new(
                config.hello_pending_connections_max,
                config.hello_pending_grace,
                Counted {
                    waiting: metrics.http_connections_idle.clone(),
                    evictions: metrics.http_idle_evictions.clone(),
                },
            ),
            version_tables: VersionTablesCache::default(),
            holding: holding::Holding::default(),
            receipts: receipts::Receipts::default(),
            shared_downloads: (config.shared_download_cache_bytes_max > 0).then(|| {
                SharedDownloads::new(
                    config.shared_download_cache_bytes_max,
                    config.shared_download_cache_age,
                )
            }),
            metrics,
            load: Load::default(),
            slots: Arc::new(Semaphore::new(config.connections_max)),
            http_connections: Arc::new(Semaphore::new(config.connections_max)),
            http_responses: Arc::new(Semaphore::new(config.connections_max)),
            config,
        }
    }

    /// When a refused client should come back: the syncs in progress ahead of it,
    /// divided by the rate at which syncs complete, within the configured bounds (the
    /// configured hint itself before anything completed).
    pub(crate) fn busy_retry_after_ms(&self) -> u32 {
        self.metrics.sync_ended(Outcome::busy);
        self.retry_after_ms()
    }

    /// The hint [`Shared::busy_retry_after_ms`] gives, without counting a busy answer.
    pub(crate) fn retry_after_ms(&self) -> u32 {
        let rate = self.load.syncs_per_second();
        let floor = self.config.busy_retry_after_ms;
        if rate <= 0.0 {
            return floor;
        }
        // Connections still waiting for their hello are not syncs ahead of the client:
        // counted, silent connections would push the hint to its maximum.
        let in_progress = (self.config.connections_max
            - self
                .slots
                .available_permits()
                .min(self.config.connections_max))
        .saturating_sub(self.pending_hellos.waiting());
        let estimate = 1000.0 * in_progress as f64 / rate;
        (estimate as u64).clamp(
            u64::from(floor),
            u64::from(self.config.busy_retry_after_ms_max.max(floor)),
        ) as u32
    }
}

/// What the monitor needs to know of completed syncs.
#[derive(Debug, Default)]
pub(crate) struct Load {
    syncs_completed: AtomicU64,
    rows: AtomicU64,
    /// Syncs completed per second, smoothed (f64 bits).
    syncs_per_second: AtomicU64,
}

/// Weight of the newest interval in the smoothed completion rate.
const RATE_SMOOTHING: f64 = 0.5;

impl Load {
    pub(crate) fn completed(&self, rows: u64) {
        self.syncs_completed.fetch_add(1, Ordering::AcqRel);
        self.rows.fetch_add(rows, Ordering::AcqRel);
    }

    /// Syncs completed and their rows (uploaded and downloaded), since the start.
    pub(crate) fn totals(&self) -> (u64, u64) {
        (
            self.syncs_completed.load(Ordering::Acquire),
            self.rows.load(Ordering::Acquire),
        )
    }

    /// Folds the completion rate of the last interval into the smoothed rate.
    pub(crate) fn observe_rate(&self, syncs_per_second: f64) {
        let smoothed =
            RATE_SMOOTHING * syncs_per_second + (1.0 - RATE_SMOOTHING) * self.syncs_per_second();
        self.syncs_per_second
            .store(smoothed.to_bits(), Ordering::Release);
    }

    fn syncs_per_second(&self) -> f64 {
        f64::from_bits(self.syncs_per_second.load(Ordering::Acquire))
    }
}
