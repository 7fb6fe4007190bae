//! The server's background tasks: the load monitor (the smoothed completion rate behind
//! the busy hint, the worker-count controller, the gauges, the periodic summary line)
//! and the tombstone cleanup.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rowsync_consolidated::{
    Consolidated, ConsolidatedConnection, DbError, Direction, HistoryRecord,
};

use crate::config::ServerConfig;
use crate::controller::{ControllerConfig, Sample, WorkerController};
use crate::metrics::{Metrics, Outcome};
use crate::monitor::SyncRecord;
use crate::pool::WorkerPool;
use crate::shared::Shared;

/// Interval of the periodic summary line.
pub const SUMMARY_INTERVAL: Duration = Duration::from_secs(60);

/// Every `worker_adjust_interval`: measures the load, lets the controller (when a range
/// is set) change the worker count, updates the gauges; every `SUMMARY_INTERVAL` logs a
/// summary line.
pub(crate) async fn monitor_load<B: Consolidated>(shared: Arc<Shared<B>>) {
    let interval = shared
        .config
        .worker_adjust_interval
        .max(Duration::from_millis(100));
    let mut controller = worker_controller(&shared.config, interval);
    let counters = &shared.pool.counters;
    let mut ticks = tokio::time::interval(interval);
    ticks.tick().await;
    let mut last = LoadCounts::default();
    let mut last_tick = Instant::now();
    let mut summary = SummaryStart {
        at: Instant::now(),
        syncs: 0,
        rows: 0,
        busy_answers: 0,
    };
    loop {
        ticks.tick().await;
        let (syncs_completed, rows) = shared.load.totals();
        let now = LoadCounts {
            syncs_completed,
            rows,
            waited: counters.waited.load(Ordering::Acquire),
            busy_micros: counters.busy_micros.load(Ordering::Acquire),
        };
        let elapsed = last_tick.elapsed();
        last_tick = Instant::now();
        let sample = Sample {
            interval: elapsed,
            syncs_completed: now.syncs_completed - last.syncs_completed,
            rows: now.rows - last.rows,
            syncs_waited: (now.waited - last.waited) as u64
                + counters.waiting.load(Ordering::Acquire) as u64,
            worker_busy: Duration::from_micros((now.busy_micros - last.busy_micros) as u64),
        };
        last = now;
        let rate = sample.syncs_completed as f64 / elapsed.as_secs_f64().max(1e-3);
        shared.load.observe_rate(rate);
        apply_farm_share(&shared, controller.as_mut());
        if let Some(decision) = controller.as_mut().and_then(|c| c.observe(sample)) {
            resize_workers(&shared, &decision);
        }
        update_gauges(&shared);
        shared.metrics.sample_monitor();
        if summary.at.elapsed() >= SUMMARY_INTERVAL {
            summary = log_summary(&shared, &now, &summary);
        }
    }
}

/// The worker-count controller, when `workers_range` is set.
fn worker_controller(config: &ServerConfig, interval: Duration) -> Option<WorkerController> {
    config.workers_range.map(|(workers_min, workers_max)| {
        WorkerController::new(ControllerConfig {
            workers_min: workers_min.max(1),
            workers_max: workers_max.max(workers_min.max(1)),
            adjust_interval: interval,
        })
    })
}

fn update_gauges<B: Consolidated>(shared: &Shared<B>) {
    let counters = &shared.pool.counters;
    let metrics = &shared.metrics;
    metrics.workers.set(shared.pool.workers() as i64);
    metrics
        .workers_busy
        .set(counters.busy.load(Ordering::Acquire) as i64);
    metrics
        .syncs_waiting_for_worker
        .set(counters.waiting.load(Ordering::Acquire) as i64);
}

/// The load counters at one tick of the load monitor.
#[derive(Clone, Copy, Default)]
struct LoadCounts {
    syncs_completed: u64,
    rows: u64,
    /// Syncs that waited for a worker.
    waited: usize,
    /// Time workers spent busy.
    busy_micros: usize,
}

/// What the last summary line counted up to, and when.
struct SummaryStart {
    at: Instant,
    syncs: u64,
    rows: u64,
    busy_answers: u64,
}

/// Logs what happened since the last summary (`since`) up to `now`, and returns the
/// start of the next summary.
fn log_summary<B: Consolidated>(
    shared: &Shared<B>,
    now: &LoadCounts,
    since: &SummaryStart,
) -> SummaryStart {
    let busy_answers = shared.metrics.syncs_ended(Outcome::busy);
    tracing::info!(
        syncs = now.syncs_completed - since.syncs,
        rows = now.rows - since.rows,
        busy_answers = busy_answers - since.busy_answers,
        workers = shared.pool.workers(),
        cache_bytes = shared.cache.used_bytes(),
        "summary of the last {} s",
        since.at.elapsed().as_secs()
    );
    SummaryStart {
        at: Instant::now(),
        syncs: now.syncs_completed,
        rows: now.rows,
        busy_answers,
    }
}

/// Removes tombstones every client has passed, and held transfers older than their
/// direction's expiry (`held_upload_expiry`, `held_download_expiry`), on a worker, every
/// `interval`.
pub(crate) async fn clean_up_periodically<B: Consolidated>(
    pool: Arc<WorkerPool<B>>,
    interval: Duration,
    held_expiry: [(Direction, Duration); 2],
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.tick().await; // the first tick is immediate; start after one interval
    loop {
        ticks.tick().await;
        let mut worker = match pool.acquire("").await {
            Ok(worker) => worker,
            Err(error) => {
                tracing::warn!(%error, "cleanup failed; retrying next interval");
                continue;
            }
        };
        match worker.connection().cleanup().await {
            Ok(removed) => tracing::info!(removed, "tombstone cleanup"),
            Err(error) => {
                tracing::warn!(%error, "tombstone cleanup failed; retrying next interval")
            }
        }
        for (direction, expiry) in held_expiry {
            let direction_name = direction.name();
            match crate::held::expire(worker.connection(), direction, expiry).await {
                Ok(0) => {}
                Ok(removed) => {
                    tracing::info!(removed, "expired held {direction_name}s removed")
                }
                Err(error) => tracing::warn!(
                    %error,
                    "removing expired held {direction_name}s failed; retrying next interval"
                ),
            }
        }
    }
}

/// How often the syncs that ended are written to the monitor's history table.
pub const HISTORY_WRITE_INTERVAL: Duration = Duration::from_secs(1);

/// When the monitor's history is kept in the consolidated database: reads it back at
/// start, then writes the syncs that ended every `HISTORY_WRITE_INTERVAL`, keeping the
/// newest `rows_max` rows. A batch the database refuses is logged and left out of the
/// table (the page still shows it).
pub(crate) async fn keep_history_in_table<B: Consolidated>(
    pool: Arc<WorkerPool<B>>,
    metrics: Arc<Metrics>,
    rows_max: u64,
) {
    let monitor = &metrics.monitor;
    match read_history(&pool, monitor.settings().history_syncs_max as u64).await {
        Ok(records) => monitor.restore(records),
        Err(error) => {
            tracing::warn!(%error, "reading the monitor's history table failed; starting without it")
        }
    }
    let mut ticks = tokio::time::interval(HISTORY_WRITE_INTERVAL);
    loop {
        ticks.tick().await;
        let rows: Vec<HistoryRecord> = monitor.take_unwritten().iter().map(history_row).collect();
        if rows.is_empty() {
            continue;
        }
        let written = match pool.acquire("").await {
            Ok(mut worker) => {
                worker
                    .connection()
                    .append_sync_history(&rows, rows_max)
                    .await
            }
            Err(error) => Err(error),
        };
        if let Err(error) = written {
            tracing::warn!(%error, syncs = rows.len(), "writing the monitor's history table failed");
        }
    }
}

/// Every `farm_share_interval`: shares this server's refused logins with the other
/// servers of its database (`throttle`), and with `farm_workers_max` finds how many
/// servers are alive and sets this server's share of the workers (`monitor_load`
/// applies it). A failure is logged; what was not shared goes at the next tick.
pub(crate) async fn share_with_farm<B: Consolidated>(shared: Arc<Shared<B>>) {
    let interval = shared.config.farm_share_interval;
    if interval.is_zero() {
        return;
    }
    let server_id = rowsync_consolidated::new_session_secret()[..32].to_string();
    let mut ticks = tokio::time::interval(interval);
    loop {
        ticks.tick().await;
        let mut worker = match shared.auth_pool.acquire("").await {
            Ok(worker) => worker,
            Err(error) => {
                tracing::warn!(%error, "sharing with the other servers failed");
                continue;
            }
        };
        let connection = worker.connection();
        share_logins(&shared, connection, &server_id).await;
        if let Some(workers_max) = shared.config.farm_workers_max {
            let now_unix_ms = crate::held::unix_ms_now();
            let alive_since = now_unix_ms - 3 * interval.as_millis() as i64;
            match connection
                .farm_servers(&server_id, now_unix_ms, alive_since)
                .await
            {
                Ok(servers) => {
                    let share = (workers_max / servers.max(1) as usize).max(1);
                    shared.farm_workers_share.store(share, Ordering::Release);
                }
                Err(error) => {
                    tracing::warn!(%error, "telling the other servers this one is alive failed")
                }
            }
        }
    }
}

/// Stores the refused logins this server counted since the last time and reads the
/// other servers' (`throttle`); on a failure they are shared next time.
async fn share_logins<C: ConsolidatedConnection>(
    shared: &Shared<impl Consolidated>,
    connection: &mut C,
    server_id: &str,
) {
    let throttle = &shared.login_throttle;
    let window_ms = shared.config.login_failure_window.as_millis() as i64;
    let now = Instant::now();
    let now_unix_ms = crate::held::unix_ms_now();
    let own = throttle.own_changes(now, now_unix_ms);
    match connection
        .share_login_failures(server_id, &own, now_unix_ms - window_ms)
        .await
    {
        Ok(others) => throttle.replace_others(&others, now, now_unix_ms),
        Err(error) => {
            throttle.unshared(&own);
            tracing::warn!(%error, "sharing refused logins with the other servers failed");
        }
    }
}

/// Applies the farm's share of workers (`share_with_farm`) to the pool: through the
/// controller when the count is chosen, else as a cap on the fixed count.
fn apply_farm_share<B: Consolidated>(
    shared: &Shared<B>,
    controller: Option<&mut WorkerController>,
) {
    let share = shared.farm_workers_share.load(Ordering::Acquire);
    if share == 0 {
        return;
    }
    let decision = match controller {
        Some(controller) => controller.set_ceiling(Some(share)),
        None => {
            let workers = shared.config.workers.min(share).max(1);
            (shared.pool.workers() != workers).then(|| crate::controller::Decision {
                workers,
                reason: format!("the farm's share of workers for this server is {share}"),
            })
        }
    };
    if let Some(decision) = decision {
        resize_workers(shared, &decision);
    }
}

/// Moves the pool to a decided worker count, counted and logged with its reason.
fn resize_workers<B: Consolidated>(shared: &Shared<B>, decision: &crate::controller::Decision) {
    shared.pool.resize(decision.workers);
    shared.metrics.worker_adjustments.inc();
    tracing::info!(
        workers = decision.workers,
        "worker count: {}",
        decision.reason
    );
}

async fn read_history<B: Consolidated>(
    pool: &Arc<WorkerPool<B>>,
    limit: u64,
) -> Result<Vec<SyncRecord>, DbError> {
    let mut worker = pool.acquire("").await?;
    let rows = worker.connection().sync_history(limit).await?;
    Ok(rows
        .iter()
        .filter_map(|row| match serde_json::from_str(&row.record) {
            Ok(record) => Some(record),
            Err(error) => {
                tracing::warn!(%error, "a row of the monitor's history table is not a sync record; left out");
                None
            }
        })
        .collect())
}

fn history_row(record: &SyncRecord) -> HistoryRecord {
    HistoryRecord {
        ended_unix_ms: (record.started_unix_ms as f64 + record.duration_ms) as i64,
        user: record
            .identity
            .as_ref()
            .map(|identity| identity.user.clone()),
        outcome: record.outcome.to_string(),
        record: serde_json::to_string(record).expect("a sync record serializes"),
    }
}
