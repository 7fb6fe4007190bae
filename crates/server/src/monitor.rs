//! The live monitor behind the admin endpoint's `/monitor` page (as the MobiLink
//! Monitor): the syncs in progress with their current phase, a bounded history of the
//! recent syncs, and a bounded series of samples (one per load measurement) for the
//! charts. Cheap on the sync path: a sync takes the lock once when it starts and once
//! when it ends; its phase changes are one atomic store.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::phases::{Outcome, Phase, PHASES};

/// What a sample reads from the metrics: syncs ended so far by outcome and the gauges of
/// the moment.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Readings {
    pub(crate) ok: u64,
    /// Answered with an error: mostly the client's (a wrong password, rows refused).
    pub(crate) refused: u64,
    /// Ended without an answer: the server's or the network's fault.
    pub(crate) failed: u64,
    pub(crate) busy: u64,
    pub(crate) workers: i64,
    pub(crate) workers_busy: i64,
    pub(crate) syncs_waiting_for_worker: i64,
    pub(crate) connections: i64,
    pub(crate) cache_bytes: i64,
    pub(crate) cache_bytes_max: i64,
}

/// The monitor's bounds.
#[derive(Debug, Clone, Copy)]
pub struct MonitorSettings {
    /// Ended syncs kept for the page and `/api/monitor/syncs` (oldest dropped first).
    pub history_syncs_max: usize,
    /// Samples kept for the charts (one per `worker_adjust_interval`, 1 s by default).
    pub samples_max: usize,
    /// Rows of the history kept in the consolidated database (`rs_sync_history`), so
    /// that it outlives a restart; `None`: in memory only.
    pub history_table_rows_max: Option<u64>,
}

impl Default for MonitorSettings {
    fn default() -> MonitorSettings {
        MonitorSettings {
            history_syncs_max: 1000,
            samples_max: 900,
            history_table_rows_max: None,
        }
    }
}

/// Who a sync is for, once its hello arrived.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Identity {
    pub user: String,
    pub client_id: String,
    pub script_version: String,
}

/// A sync in progress, shared between its handler (which moves its phase) and the
/// monitor (which lists it).
#[derive(Debug)]
pub struct ActiveSync {
    id: u64,
    started_unix_ms: u64,
    started: Instant,
    /// Index in [`PHASES`] of the phase it is in (`PHASES.len()` once all are done).
    phase: AtomicUsize,
    identity: OnceLock<Identity>,
}

impl ActiveSync {
    pub(crate) fn enter_phase(&self, index: usize) {
        self.phase.store(index, Ordering::Relaxed);
    }

    pub(crate) fn identify(&self, identity: Identity) {
        let _ = self.identity.set(identity);
    }
}

/// A sync in progress as `/api/monitor/active` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ActiveView {
    pub id: u64,
    pub started_unix_ms: u64,
    pub elapsed_ms: f64,
    pub phase: &'static str,
    #[serde(flatten)]
    pub identity: Option<Identity>,
}

/// What a sync did, as its stages learn it.
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize)]
pub struct SyncFacts {
    pub rows_uploaded: u64,
    pub rows_downloaded: u64,
    /// Upload bytes received on the wire (compressed, if the client compressed).
    pub bytes_received: u64,
    /// Download bytes sent on the wire.
    pub bytes_sent: u64,
    pub conflicts: u64,
    pub upload_already_applied: bool,
}

/// One phase's time in an ended sync.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseTime {
    pub phase: Cow<'static, str>,
    pub ms: f64,
}

/// An ended sync, as `/api/monitor/syncs` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SyncRecord {
    pub id: u64,
    pub started_unix_ms: u64,
    pub duration_ms: f64,
    /// `ok`, `refused` (answered with an error) or `failed` (no answer).
    pub outcome: Cow<'static, str>,
    #[serde(flatten)]
    pub identity: Option<Identity>,
    pub phases: Vec<PhaseTime>,
    #[serde(flatten)]
    pub facts: SyncFacts,
    pub error: Option<String>,
}

/// One point of the charts: rates over the interval since the previous sample, the
/// gauges as they stand.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub unix_ms: u64,
    pub syncs_per_second: f64,
    /// Syncs answered with an error (a wrong password, refused rows), per second.
    pub refused_per_second: f64,
    /// Syncs that ended without an answer (the server's or the network's fault), per
    /// second.
    pub failed_per_second: f64,
    pub busy_answers_per_second: f64,
    /// Mean time of each phase (in [`PHASES`] order) over the syncs ended in the
    /// interval; `null` when none ended.
    pub phase_ms: Vec<Option<f64>>,
    pub workers: i64,
    pub workers_busy: i64,
    pub syncs_waiting_for_worker: i64,
    pub connections: i64,
    pub cache_bytes: i64,
    pub cache_bytes_max: i64,
}

/// Which ended syncs a query wants.
#[derive(Debug, Default, Clone)]
pub struct SyncFilter {
    pub user: Option<String>,
    pub outcome: Option<String>,
    pub limit: Option<usize>,
}

#[derive(Default)]
struct State {
    active: BTreeMap<u64, Arc<ActiveSync>>,
    recent: VecDeque<SyncRecord>,
    /// Ended syncs not yet written to the history table (when it is kept).
    unwritten: VecDeque<SyncRecord>,
    samples: VecDeque<Sample>,
    /// Phase times summed over the syncs ended since the last sample, and their count.
    phase_micros: [u64; PHASES.len()],
    phase_counts: [u64; PHASES.len()],
    /// The counters at the last sample, and when it was taken.
    last_counts: Option<(Readings, Instant)>,
}

pub struct Monitor {
    settings: MonitorSettings,
    next_id: AtomicU64,
    state: Mutex<State>,
    /// The file `rowsync profile --out` writes, shown on the page (`serve
    /// --profile-report`).
    profile_report: OnceLock<PathBuf>,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

impl Monitor {
    pub fn new(settings: MonitorSettings) -> Monitor {
        Monitor {
            settings,
            next_id: AtomicU64::new(1),
            state: Mutex::new(State::default()),
            profile_report: OnceLock::new(),
        }
    }

    /// Shows the profile report in this file on the page (set once, at start).
    pub fn set_profile_report(&self, path: PathBuf) {
        let _ = self.profile_report.set(path);
    }

    /// The file of the profile report the page shows, if one was named.
    pub fn profile_report(&self) -> Option<&Path> {
        self.profile_report.get().map(PathBuf::as_path)
    }

    pub fn settings(&self) -> MonitorSettings {
        self.settings
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves plain data; keep serving it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A sync starts (in its first phase, `connect`).
    pub(crate) fn started(&self) -> Arc<ActiveSync> {
        let sync = Arc::new(ActiveSync {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            started_unix_ms: unix_ms(),
            started: Instant::now(),
            phase: AtomicUsize::new(0),
            identity: OnceLock::new(),
        });
        self.state().active.insert(sync.id, Arc::clone(&sync));
        sync
    }

    /// A sync ended: it leaves the syncs in progress and joins the history.
    pub(crate) fn ended(
        &self,
        sync: &ActiveSync,
        outcome: Outcome,
        phases: &[(Phase, Duration)],
        facts: SyncFacts,
        error: Option<String>,
    ) {
        let record = SyncRecord {
            id: sync.id,
            started_unix_ms: sync.started_unix_ms,
            duration_ms: sync.started.elapsed().as_secs_f64() * 1000.0,
            outcome: Cow::Borrowed(outcome_name(outcome)),
            identity: sync.identity.get().cloned(),
            phases: phases
                .iter()
                .map(|(phase, duration)| PhaseTime {
                    phase: Cow::Borrowed(phase_name(*phase)),
                    ms: duration.as_secs_f64() * 1000.0,
                })
                .collect(),
            facts,
            error,
        };
        let mut state = self.state();
        state.active.remove(&sync.id);
        for (phase, duration) in phases {
            let index = phase_index(*phase);
            state.phase_micros[index] += duration.as_micros() as u64;
            state.phase_counts[index] += 1;
        }
        if self.settings.history_table_rows_max.is_some() {
            // Bounded as the history is: a database that cannot keep up loses the oldest.
            while state.unwritten.len() >= self.settings.history_syncs_max.max(1) {
                state.unwritten.pop_front();
            }
            state.unwritten.push_back(record.clone());
        }
        push_bounded(&mut state.recent, record, self.settings.history_syncs_max);
    }

    /// The ended syncs not yet written to the history table, taken.
    pub(crate) fn take_unwritten(&self) -> Vec<SyncRecord> {
        self.state().unwritten.drain(..).collect()
    }

    /// Puts the history read back from the table (oldest first) before what this
    /// server has seen; new syncs are numbered after it.
    pub(crate) fn restore(&self, records: Vec<SyncRecord>) {
        let mut state = self.state();
        let newest_id = records.iter().map(|record| record.id).max().unwrap_or(0);
        self.next_id.fetch_max(newest_id + 1, Ordering::Relaxed);
        let seen: Vec<SyncRecord> = state.recent.drain(..).collect();
        for record in records.into_iter().chain(seen) {
            push_bounded(&mut state.recent, record, self.settings.history_syncs_max);
        }
    }

    /// Takes a sample of the counters and gauges (the load monitor calls this once per
    /// measurement, through `Metrics::sample_monitor`).
    pub(crate) fn sample(&self, readings: Readings) {
        let now = Instant::now();
        let mut state = self.state();
        let (last, last_at) = state.last_counts.unwrap_or((readings, now));
        state.last_counts = Some((readings, now));
        let seconds = now.duration_since(last_at).as_secs_f64();
        let rate = |count: u64, last: u64| {
            if seconds > 0.0 {
                count.saturating_sub(last) as f64 / seconds
            } else {
                0.0
            }
        };
        let phase_ms = (0..PHASES.len())
            .map(|index| {
                let count = state.phase_counts[index];
                (count > 0).then(|| state.phase_micros[index] as f64 / count as f64 / 1000.0)
            })
            .collect();
        state.phase_micros = [0; PHASES.len()];
        state.phase_counts = [0; PHASES.len()];
        let sample = Sample {
            unix_ms: unix_ms(),
            syncs_per_second: rate(readings.ok, last.ok),
            refused_per_second: rate(readings.refused, last.refused),
            failed_per_second: rate(readings.failed, last.failed),
            busy_answers_per_second: rate(readings.busy, last.busy),
            phase_ms,
            workers: readings.workers,
            workers_busy: readings.workers_busy,
            syncs_waiting_for_worker: readings.syncs_waiting_for_worker,
            connections: readings.connections,
            cache_bytes: readings.cache_bytes,
            cache_bytes_max: readings.cache_bytes_max,
        };
        if self.settings.samples_max == 0 {
            return;
        }
        while state.samples.len() >= self.settings.samples_max {
            state.samples.pop_front();
        }
        state.samples.push_back(sample);
    }

    /// The syncs in progress, oldest first.
    pub fn active(&self) -> Vec<ActiveView> {
        let state = self.state();
        state
            .active
            .values()
            .map(|sync| ActiveView {
                id: sync.id,
                started_unix_ms: sync.started_unix_ms,
                elapsed_ms: sync.started.elapsed().as_secs_f64() * 1000.0,
                phase: PHASES
                    .get(sync.phase.load(Ordering::Relaxed))
                    .map_or("ending", |phase| phase_name(*phase)),
                identity: sync.identity.get().cloned(),
            })
            .collect()
    }

    /// The ended syncs `filter` wants, newest first.
    pub fn recent(&self, filter: &SyncFilter) -> Vec<SyncRecord> {
        let state = self.state();
        state
            .recent
            .iter()
            .rev()
            .filter(|record| {
                filter.user.as_deref().is_none_or(|user| {
                    record
                        .identity
                        .as_ref()
                        .is_some_and(|identity| identity.user == user)
                })
            })
            .filter(|record| {
                filter
                    .outcome
                    .as_deref()
                    .is_none_or(|outcome| record.outcome == outcome)
            })
            .take(filter.limit.unwrap_or(usize::MAX))
            .cloned()
            .collect()
    }

    /// The samples taken after `since_unix_ms`, oldest first.
    pub fn samples(&self, since_unix_ms: u64) -> Vec<Sample> {
        let state = self.state();
        state
            .samples
            .iter()
            .filter(|sample| sample.unix_ms > since_unix_ms)
            .cloned()
            .collect()
    }
}

/// Appends `record`, dropping the oldest beyond `max` (none kept when `max` is 0).
fn push_bounded(history: &mut VecDeque<SyncRecord>, record: SyncRecord, max: usize) {
    if max == 0 {
        return;
    }
    while history.len() >= max {
        history.pop_front();
    }
    history.push_back(record);
}

pub fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::connect => "connect",
        Phase::authenticate => "authenticate",
        Phase::upload_received => "upload_received",
        Phase::worker_wait => "worker_wait",
        Phase::upload_applied => "upload_applied",
        Phase::download_fetched => "download_fetched",
        Phase::download_sent => "download_sent",
    }
}

fn phase_index(phase: Phase) -> usize {
    PHASES
        .iter()
        .position(|candidate| *candidate == phase)
        .unwrap_or(0)
}

pub fn outcome_name(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::ok => "ok",
        Outcome::refused => "refused",
        Outcome::failed => "failed",
        Outcome::busy => "busy",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(user: &str) -> Identity {
        Identity {
            user: user.into(),
            client_id: format!("{user}-phone"),
            script_version: "v1".into(),
        }
    }

    #[test]
    fn lists_syncs_in_progress_and_keeps_a_bounded_filterable_history() {
        let monitor = Monitor::new(MonitorSettings {
            history_syncs_max: 2,
            samples_max: 2,
            history_table_rows_max: None,
        });
        let first = monitor.started();
        first.identify(identity("ann"));
        first.enter_phase(3);
        let active = monitor.active();
        assert_eq!(active.len(), 1);
        assert_eq!(active[0].phase, "worker_wait");
        assert_eq!(active[0].identity.as_ref().unwrap().user, "ann");
        let phases = [(Phase::connect, Duration::from_millis(2))];
        monitor.ended(&first, Outcome::ok, &phases, SyncFacts::default(), None);
        for user in ["bob", "cy"] {
            let sync = monitor.started();
            sync.identify(identity(user));
            let error = Some("code 4: no".to_string());
            monitor.ended(
                &sync,
                Outcome::refused,
                &phases,
                SyncFacts::default(),
                error,
            );
        }
        assert!(monitor.active().is_empty());
        let all = monitor.recent(&SyncFilter::default());
        let users: Vec<_> = all
            .iter()
            .map(|record| record.identity.as_ref().unwrap().user.as_str())
            .collect();
        assert_eq!(users, ["cy", "bob"], "newest first, ann dropped beyond 2");
        let bob = monitor.recent(&SyncFilter {
            user: Some("bob".into()),
            ..SyncFilter::default()
        });
        assert_eq!(bob.len(), 1);
        let ok = monitor.recent(&SyncFilter {
            outcome: Some("ok".into()),
            ..SyncFilter::default()
        });
        assert!(ok.is_empty());

        let metrics = crate::metrics::Metrics::new();
        for _ in 0..3 {
            monitor.sample(metrics.readings());
        }
        let samples = monitor.samples(0);
        assert_eq!(samples.len(), 2, "bounded by samples_max");
        assert!(samples.iter().all(|sample| sample.phase_ms[0].is_none()));
    }

    #[test]
    fn refused_and_failed_syncs_are_counted_apart() {
        let monitor = Monitor::new(MonitorSettings::default());
        let metrics = crate::metrics::Metrics::new();
        monitor.sample(metrics.readings());
        std::thread::sleep(Duration::from_millis(20));
        metrics.sync_ended(Outcome::refused);
        metrics.sync_ended(Outcome::refused);
        metrics.sync_ended(Outcome::failed);
        monitor.sample(metrics.readings());
        let sample = monitor.samples(0).pop().unwrap();
        assert!(
            sample.refused_per_second > sample.failed_per_second,
            "{sample:?}"
        );
        assert!(sample.failed_per_second > 0.0, "{sample:?}");
        assert_eq!(sample.syncs_per_second, 0.0);
    }
}
