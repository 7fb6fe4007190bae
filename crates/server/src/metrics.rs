//! What the server counts, as Prometheus metrics (`/metrics` on the admin endpoint),
//! and the per-sync phase timings, like the MobiLink Monitor's.

use std::fmt;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::monitor::{ActiveSync, Monitor, MonitorSettings, Readings, SyncFacts};
pub use crate::phases::{Outcome, Phase, PHASES};
use crate::record::SyncRecording;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: Phase,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: Outcome,
}

pub struct Metrics {
    registry: Registry,
    syncs: Family<OutcomeLabel, Counter>,
    phase_seconds: Family<PhaseLabel, Histogram>,
    pub rows_uploaded: Counter,
    pub rows_downloaded: Counter,
    /// Connections holding a slot (up to the connection limit).
    pub connections: Gauge,
    pub syncs_waiting_for_worker: Gauge,
    pub workers_busy: Gauge,
    pub workers: Gauge,
    pub worker_adjustments: Counter,
    /// Upload and download bytes held in memory by syncs in flight.
    pub cache_bytes: Gauge,
    pub cache_bytes_max: Gauge,
    /// The most bytes the cache held at once since the server started.
    pub cache_bytes_peak: Gauge,
    pub spilled_bytes: Counter,
    /// Memory reserved by connections' zstd decoders (`zstd_decoders_bytes_max`).
    pub zstd_decoders_bytes: Gauge,
    /// Upload bytes produced by the stream stage's decompression (the bytes it read,
    /// for an uncompressed stream): what inflating cost, counted as it happens.
    pub upload_decompressed_bytes: Counter,
    /// Upload bytes appended to upload spools (memory or temporary file).
    pub upload_spooled_bytes: Counter,
    /// Cut uploads held in the consolidated database for their clients to resume.
    pub uploads_held: Counter,
    /// Upload bytes taken from held transfers instead of the wire (resumed uploads).
    pub upload_resumed_bytes: Counter,
    /// Cut downloads held in the consolidated database for their clients to resume.
    pub downloads_held: Counter,
    /// Download bytes a resumed download did not send again (the client had them).
    pub download_resumed_bytes: Counter,
    /// Script versions' table lists loaded from the database by the stream stage.
    pub version_tables_loads: Counter,
    /// Connections holding a slot that have not sent their hello yet.
    pub connections_awaiting_hello: Gauge,
    /// Connections closed without a hello to make room for newer ones.
    pub hello_pending_evictions: Counter,
    /// HTTP connections open with no request in progress.
    pub http_connections_idle: Gauge,
    /// HTTP connections closed while idle to make room for newer ones.
    pub http_idle_evictions: Counter,
    /// Receipt requests answered without a lookup: malformed transfer id, or above
    /// `receipts_per_connection_per_second_max`.
    pub receipts_refused: Counter,
    /// Logins refused unchecked: too many failures for the address or the user.
    pub logins_throttled: Counter,
    /// 1 while the server drains (a stop was asked): new syncs are answered busy.
    pub draining: Gauge,
    /// 1 when the consolidated database answered the last readiness check.
    pub database_up: Gauge,
    /// The live monitor (`/monitor` on the admin endpoint).
    pub monitor: Monitor,
}

fn phase_histogram() -> Histogram {
    Histogram::new(phase_buckets())
}

/// 100 µs to about 24 min, each bucket three times the last, as the decimals they are
/// (`0.0003`, not the `0.00030000000000000003` that multiplying floats gives).
fn phase_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0001, 3.0, 16).map(|bound| {
        format!("{bound:.4}")
            .parse()
            .expect("a formatted float parses")
    })
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::with_monitor(MonitorSettings::default())
    }

    /// The metrics, with a monitor keeping what `settings` allow.
    pub fn with_monitor(settings: MonitorSettings) -> Metrics {
        let mut registry = Registry::with_prefix("rowsync");
        let syncs = Family::<OutcomeLabel, Counter>::default();
        registry.register("syncs", "Syncs ended, by outcome", syncs.clone());
        let phase_seconds = Family::<PhaseLabel, Histogram>::new_with_constructor(
            phase_histogram as fn() -> Histogram,
        );
        registry.register(
            "sync_phase_seconds",
            "Time spent in each phase of a sync",
            phase_seconds.clone(),
        );
        let mut metrics = Metrics {
            syncs,
            phase_seconds,
            rows_uploaded: Counter::default(),
            rows_downloaded: Counter::default(),
            connections: Gauge::default(),
            syncs_waiting_for_worker: Gauge::default(),
            workers_busy: Gauge::default(),
            workers: Gauge::default(),
            worker_adjustments: Counter::default(),
            cache_bytes: Gauge::default(),
            cache_bytes_max: Gauge::default(),
            cache_bytes_peak: Gauge::default(),
            spilled_bytes: Counter::default(),
            zstd_decoders_bytes: Gauge::default(),
            upload_decompressed_bytes: Counter::default(),
            upload_spooled_bytes: Counter::default(),
            uploads_held: Counter::default(),
            upload_resumed_bytes: Counter::default(),
            downloads_held: Counter::default(),
            download_resumed_bytes: Counter::default(),
            version_tables_loads: Counter::default(),
            connections_awaiting_hello: Gauge::default(),
            hello_pending_evictions: Counter::default(),
            http_connections_idle: Gauge::default(),
            http_idle_evictions: Counter::default(),
            receipts_refused: Counter::default(),
            logins_throttled: Counter::default(),
            draining: Gauge::default(),
            database_up: Gauge::default(),
            monitor: Monitor::new(settings),
            registry,
        };
        metrics.register_sync_metrics();
        metrics.register_memory_metrics();
        metrics.register_transfer_metrics();
        metrics.register_admission_metrics();
        metrics
    }

    /// Registers: rows moved, connections and database workers.
    fn register_sync_metrics(&mut self) {
        self.registry.register(
            "rows_uploaded",
            "Rows uploaded by applied syncs",
            self.rows_uploaded.clone(),
        );
        self.registry.register(
            "rows_downloaded",
            "Rows sent in downloads",
            self.rows_downloaded.clone(),
        );
        self.registry.register(
            "connections",
            "Connections holding a slot",
            self.connections.clone(),
        );
        self.registry.register(
            "syncs_waiting_for_worker",
            "Syncs whose upload is in, waiting for a database worker",
            self.syncs_waiting_for_worker.clone(),
        );
        self.registry.register(
            "workers_busy",
            "Database workers running a sync",
            self.workers_busy.clone(),
        );
        self.registry.register(
            "workers",
            "Database workers (current count)",
            self.workers.clone(),
        );
        self.registry.register(
            "worker_adjustments",
            "Changes of the worker count by the controller",
            self.worker_adjustments.clone(),
        );
    }

    /// Registers: the cache, the zstd decoders and what the spools wrote.
    fn register_memory_metrics(&mut self) {
        self.registry.register(
            "cache_bytes",
            "Upload and download bytes in memory for syncs in flight",
            self.cache_bytes.clone(),
        );
        self.registry.register(
            "cache_bytes_max",
            "The cache limit",
            self.cache_bytes_max.clone(),
        );
        self.registry.register(
            "cache_bytes_peak",
            "The most bytes the cache held at once since the server started",
            self.cache_bytes_peak.clone(),
        );
        self.registry.register(
            "zstd_decoders_bytes",
            "Memory reserved by the connections' zstd decoders (at most zstd_decoders_bytes_max)",
            self.zstd_decoders_bytes.clone(),
        );
        self.registry.register(
            "spilled_bytes",
            "Bytes written to temporary files because the cache was full",
            self.spilled_bytes.clone(),
        );
        self.registry.register(
            "upload_decompressed_bytes",
            "Upload bytes decompressed by the stream stage (as read, when not compressed)",
            self.upload_decompressed_bytes.clone(),
        );
        self.registry.register(
            "upload_spooled_bytes",
            "Upload bytes appended to upload spools",
            self.upload_spooled_bytes.clone(),
        );
    }

    /// Registers: held and resumed transfers, and the version table lists loaded.
    fn register_transfer_metrics(&mut self) {
        self.registry.register(
            "uploads_held",
            "Cut uploads held in the consolidated database for their clients to resume",
            self.uploads_held.clone(),
        );
        self.registry.register(
            "upload_resumed_bytes",
            "Upload bytes taken from held transfers instead of the wire",
            self.upload_resumed_bytes.clone(),
        );
        self.registry.register(
            "downloads_held",
            "Cut downloads held in the consolidated database for their clients to resume",
            self.downloads_held.clone(),
        );
        self.registry.register(
            "download_resumed_bytes",
            "Download bytes a resumed download did not send again",
            self.download_resumed_bytes.clone(),
        );
        self.registry.register(
            "version_tables_loads",
            "Script versions' table lists loaded to refuse unknown tables as they arrive",
            self.version_tables_loads.clone(),
        );
    }

    /// Registers: what connections were turned away or evicted for, and the server's readiness.
    fn register_admission_metrics(&mut self) {
        self.registry.register(
            "connections_awaiting_hello",
            "Connections holding a slot that have not sent their hello yet",
            self.connections_awaiting_hello.clone(),
        );
        self.registry.register(
            "hello_pending_evictions",
            "Connections closed without a hello to make room for newer ones",
            self.hello_pending_evictions.clone(),
        );
        self.registry.register(
            "http_connections_idle",
            "HTTP connections open with no request in progress",
            self.http_connections_idle.clone(),
        );
        self.registry.register(
            "http_idle_evictions",
            "HTTP connections closed while idle to make room for newer ones",
            self.http_idle_evictions.clone(),
        );
        self.registry.register(
            "receipts_refused",
            "Receipt requests answered without a lookup (malformed, or too many on one connection)",
            self.receipts_refused.clone(),
        );
        self.registry.register(
            "logins_throttled",
            "Logins refused unchecked: too many failures for the address or the user",
            self.logins_throttled.clone(),
        );
        self.registry.register(
            "draining",
            "1 while the server drains after a stop was asked: new syncs are answered busy",
            self.draining.clone(),
        );
        self.registry.register(
            "database_up",
            "1 when the consolidated database answered the last readiness check",
            self.database_up.clone(),
        );
    }

    /// Whether the server takes syncs (`/readyz`): the database answered its last check
    /// and no stop was asked; else why not.
    pub fn readiness(&self) -> Result<(), &'static str> {
        if self.draining.get() != 0 {
            Err("draining: a stop was asked")
        } else if self.database_up.get() == 0 {
            Err("the consolidated database does not answer")
        } else {
            Ok(())
        }
    }

    pub fn sync_ended(&self, outcome: Outcome) {
        self.syncs.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    pub fn syncs_ended(&self, outcome: Outcome) -> u64 {
        self.syncs.get_or_create(&OutcomeLabel { outcome }).get()
    }

    /// The counters and gauges a monitor sample takes.
    pub(crate) fn readings(&self) -> Readings {
        Readings {
            ok: self.syncs_ended(Outcome::ok),
            refused: self.syncs_ended(Outcome::refused),
            failed: self.syncs_ended(Outcome::failed),
            busy: self.syncs_ended(Outcome::busy),
            workers: self.workers.get(),
            workers_busy: self.workers_busy.get(),
            syncs_waiting_for_worker: self.syncs_waiting_for_worker.get(),
            connections: self.connections.get(),
            cache_bytes: self.cache_bytes.get(),
            cache_bytes_max: self.cache_bytes_max.get(),
        }
    }

    /// Takes a sample for the monitor's charts (the load monitor, once per measurement).
    pub(crate) fn sample_monitor(&self) {
        self.monitor.sample(self.readings());
    }

    pub fn phase(&self, phase: Phase, duration: Duration) {
        self.phase_seconds
            .get_or_create(&PhaseLabel { phase })
            .observe(duration.as_secs_f64());
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// Per-sync phase timings, for the sync's log line and the histograms, and what the
/// stages learn of the sync on the way (for the monitor and the recording).
#[derive(Default)]
pub struct PhaseTimings {
    pub phases: Vec<(Phase, Duration)>,
    /// The sync as the monitor lists it while it runs.
    pub(crate) watch: Option<std::sync::Arc<ActiveSync>>,
    pub(crate) facts: SyncFacts,
    /// The sync being recorded (`--record`), from its hello on.
    pub(crate) recording: Option<SyncRecording>,
}

impl PhaseTimings {
    pub fn record(&mut self, metrics: &Metrics, phase: Phase, duration: Duration) {
        metrics.phase(phase, duration);
        self.phases.push((phase, duration));
        if let Some(watch) = &self.watch {
            watch.enter_phase(self.phases.len());
        }
    }
}

impl fmt::Display for PhaseTimings {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, (phase, duration)) in self.phases.iter().enumerate() {
            if index > 0 {
                formatter.write_str(" ")?;
            }
            write!(
                formatter,
                "{phase}={:.1}ms",
                duration.as_secs_f64() * 1000.0
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_counters_gauges_and_phase_histograms() {
        let metrics = Metrics::new();
        metrics.sync_ended(Outcome::ok);
        metrics.sync_ended(Outcome::busy);
        metrics.sync_ended(Outcome::busy);
        metrics.phase(Phase::worker_wait, Duration::from_millis(3));
        metrics.workers.set(7);
        metrics.cache_bytes.set(1234);
        let text = metrics.encode();
        for expected in [
            "rowsync_syncs_total{outcome=\"busy\"} 2",
            "rowsync_syncs_total{outcome=\"ok\"} 1",
            "rowsync_sync_phase_seconds_count{phase=\"worker_wait\"} 1",
            "rowsync_workers 7",
            "rowsync_cache_bytes 1234",
        ] {
            assert!(text.contains(expected), "{expected} in\n{text}");
        }
        assert_eq!(metrics.syncs_ended(Outcome::busy), 2);
    }

    #[test]
    fn bucket_bounds_are_the_decimals_they_stand_for() {
        let metrics = Metrics::new();
        metrics.phase(Phase::connect, Duration::from_millis(3));
        let text = metrics.encode();
        let bounds: Vec<&str> = text
            .split("le=\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .collect();
        assert!(bounds.contains(&"0.0003"), "{text}");
        assert!(bounds.contains(&"1434.8907"), "{text}");
        for bound in bounds {
            let decimals = bound.split_once('.').map_or(0, |(_, digits)| digits.len());
            assert!(decimals <= 4, "le=\"{bound}\"");
        }
    }
}
