//! Recording syncs for replay (`rowsync serve --record DIR`, as MobiLink's replay
//! utility): each sync's hello (without its password, token or authentication
//! parameters), its upload frames as received (decompressed) and its outcome, so
//! `rowsync replay` can play real traffic against another server or script version.
//!
//! A recording directory holds `syncs/NNNNNNNN.json` (a [`RecordedSync`]: the hello and
//! when the sync started), `syncs/NNNNNNNN.upload` (the frames after the hello) and
//! `outcomes.jsonl` (one [`SyncOutcomeRecord`] per line). A replay run writes
//! `outcomes.jsonl` in the same form, so two runs, or a recording and a run, compare.
//! Bounded by `syncs_max` and `bytes_max`: past either, syncs are no longer recorded.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rowsync_protocol::{Download, Hello, Row, WireError};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Where and how much to record.
#[derive(Debug, Clone)]
pub struct RecordSettings {
    pub dir: PathBuf,
    /// Syncs recorded at most; later syncs are not recorded.
    pub syncs_max: u64,
    /// Bytes of upload frames recorded at most, over all syncs; a sync whose upload
    /// would pass it is recorded without its upload (`upload_complete: false`).
    pub bytes_max: u64,
}

#[derive(Debug, Error)]
pub enum RecordError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} already holds a recording (outcomes.jsonl); give an empty or new directory")]
    NotEmpty(PathBuf),
    #[error("{path}: not a recorded sync: {message}")]
    Malformed { path: PathBuf, message: String },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> RecordError + '_ {
    move |source| RecordError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The hello as recorded: everything but the credentials.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedHello {
    pub protocol_version: u16,
    pub client_id: String,
    pub user: String,
    pub script_version: String,
    pub last_download_watermark: i64,
    /// Whether the client sent a token rather than a password (neither is recorded).
    pub used_token: bool,
    /// How many authentication parameters the client sent (their values may be
    /// credentials and are not recorded).
    pub auth_parameter_count: usize,
    pub download_ack: bool,
}

impl RecordedHello {
    pub fn of(hello: &Hello) -> RecordedHello {
        RecordedHello {
            protocol_version: hello.protocol_version,
            client_id: hello.client_id.clone(),
            user: hello.user.clone(),
            script_version: hello.script_version.clone(),
            last_download_watermark: hello.last_download_watermark,
            used_token: !hello.token.is_empty(),
            auth_parameter_count: hello.auth_parameters.len(),
            download_ack: hello.download_ack,
        }
    }
}

/// One recorded sync (`syncs/NNNNNNNN.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecordedSync {
    /// Order in which the syncs' hellos arrived, from 1.
    pub sequence: u64,
    /// Milliseconds from the start of the recording to the hello.
    pub offset_ms: u64,
    pub hello: RecordedHello,
    /// The upload frames file holds the whole upload.
    pub upload_complete: bool,
}

/// What a sync came to, recorded by the server or by a replay (`outcomes.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncOutcomeRecord {
    pub sequence: u64,
    pub client_id: String,
    pub user: String,
    pub script_version: String,
    /// Upload operations received.
    pub rows_uploaded: u64,
    /// Upload operations not applied as sent.
    pub conflicts: u64,
    pub upload_already_applied: bool,
    /// Rows (upserts and deletes) in the download.
    pub download_rows: u64,
    /// [`DownloadDigest`] of the download's rows, in hex.
    pub download_checksum: String,
    /// `code N: message` when the sync was refused, or why it failed.
    pub error: Option<String>,
}

impl SyncOutcomeRecord {
    /// Upload operations applied as sent.
    pub fn rows_applied(&self) -> u64 {
        self.rows_uploaded.saturating_sub(self.conflicts)
    }
}

/// How an error reads in an outcome, alike on the server and in a replay.
pub fn error_text(error: &WireError) -> String {
    format!("code {}: {}", error.code, error.message)
}

/// An order-independent checksum of a download's rows: each row (table, upsert or
/// delete, its columns and values) hashed with FNV-1a over its JSON form, the hashes
/// added. The same rows in another order or other chunks give the same digest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DownloadDigest {
    pub rows: u64,
    pub sum: u64,
}

impl DownloadDigest {
    pub fn add(&mut self, download: &Download) {
        for (kind, rows, columns) in [
            ("upsert", &download.upserts, &download.columns),
            ("delete", &download.deletes, &download.key_columns),
        ] {
            for row in rows {
                self.add_row(&download.table, kind, columns, row);
            }
        }
    }

    fn add_row(&mut self, table: &str, kind: &str, columns: &[String], row: &Row) {
        let named: Vec<(&String, &rowsync_protocol::Value)> = columns.iter().zip(row).collect();
        let text = serde_json::to_vec(&(table, kind, named)).unwrap_or_default();
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in text {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.rows += 1;
        self.sum = self.sum.wrapping_add(hash);
    }

    pub fn hex(&self) -> String {
        format!("{:016x}", self.sum)
    }
}

/// The server's recorder: hands out a [`SyncRecording`] per sync while the bounds
/// allow and writes each when its sync ends.
pub struct Recorder {
    settings: RecordSettings,
    started: Instant,
    next_sequence: AtomicU64,
    bytes_used: AtomicU64,
    full_logged: AtomicBool,
    outcomes: Mutex<File>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Recorder")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// Starts a recording in `settings.dir` (created if missing; refused if it holds
    /// one already).
    pub fn create(settings: RecordSettings) -> Result<Recorder, RecordError> {
        let syncs = settings.dir.join("syncs");
        std::fs::create_dir_all(&syncs).map_err(io_error(&syncs))?;
        let outcomes_path = settings.dir.join("outcomes.jsonl");
        let outcomes = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&outcomes_path)
            .map_err(|error| match error.kind() {
                std::io::ErrorKind::AlreadyExists => RecordError::NotEmpty(settings.dir.clone()),
                _ => RecordError::Io {
                    path: outcomes_path.clone(),
                    source: error,
                },
            })?;
        Ok(Recorder {
            settings,
            started: Instant::now(),
            next_sequence: AtomicU64::new(1),
            bytes_used: AtomicU64::new(0),
            full_logged: AtomicBool::new(false),
            outcomes: Mutex::new(outcomes),
        })
    }

    /// A recording for the sync `hello` opens, unless `syncs_max` syncs are recorded.
    pub(crate) fn begin(self: &Arc<Self>, hello: &Hello) -> Option<SyncRecording> {
        let sequence = self.next_sequence.fetch_add(1, Ordering::Relaxed);
        if sequence > self.settings.syncs_max {
            self.log_full("syncs_max");
            return None;
        }
        Some(SyncRecording {
            recorder: Arc::clone(self),
            sync: RecordedSync {
                sequence,
                offset_ms: self.started.elapsed().as_millis() as u64,
                hello: RecordedHello::of(hello),
                upload_complete: true,
            },
            upload: Vec::new(),
            digest: DownloadDigest::default(),
        })
    }

    fn log_full(&self, bound: &str) {
        if !self.full_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                dir = %self.settings.dir.display(),
                "the recording reached its {bound}; later syncs are recorded incompletely or not at all"
            );
        }
    }

    /// Takes `bytes` of the recording's byte budget, if there is that much left.
    fn reserve(&self, bytes: u64) -> bool {
        let reserved = self
            .bytes_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + bytes <= self.settings.bytes_max).then_some(used + bytes)
            })
            .is_ok();
        if !reserved {
            self.log_full("bytes_max");
        }
        reserved
    }

    /// Writes a sync's files and its outcome line (blocking file I/O).
    fn write(
        &self,
        recording: &SyncRecording,
        outcome: &SyncOutcomeRecord,
    ) -> Result<(), RecordError> {
        let base = self
            .settings
            .dir
            .join("syncs")
            .join(format!("{:08}", recording.sync.sequence));
        let upload_path = base.with_extension("upload");
        std::fs::write(&upload_path, &recording.upload).map_err(io_error(&upload_path))?;
        let sync_path = base.with_extension("json");
        let text = serde_json::to_vec_pretty(&recording.sync).unwrap_or_default();
        std::fs::write(&sync_path, text).map_err(io_error(&sync_path))?;
        let mut line = serde_json::to_vec(outcome).unwrap_or_default();
        line.push(b'\n');
        let outcomes_path = self.settings.dir.join("outcomes.jsonl");
        let mut outcomes = self
            .outcomes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        outcomes.write_all(&line).map_err(io_error(&outcomes_path))
    }
}

/// One sync being recorded: its hello, its upload frames as they arrive, and the
/// digest of its download.
pub(crate) struct SyncRecording {
    recorder: Arc<Recorder>,
    sync: RecordedSync,
    upload: Vec<u8>,
    pub(crate) digest: DownloadDigest,
}

impl SyncRecording {
    /// Keeps upload bytes (decompressed frames) while the recording's budget lasts.
    pub(crate) fn append(&mut self, bytes: &[u8]) {
        if !self.sync.upload_complete {
            return;
        }
        if self.recorder.reserve(bytes.len() as u64) {
            self.upload.extend_from_slice(bytes);
        } else {
            self.sync.upload_complete = false;
            self.upload = Vec::new();
        }
    }

    /// The outcome of this sync from what the server saw.
    pub(crate) fn outcome(
        &self,
        facts: &crate::monitor::SyncFacts,
        error: Option<String>,
    ) -> SyncOutcomeRecord {
        let hello = &self.sync.hello;
        SyncOutcomeRecord {
            sequence: self.sync.sequence,
            client_id: hello.client_id.clone(),
            user: hello.user.clone(),
            script_version: hello.script_version.clone(),
            rows_uploaded: facts.rows_uploaded,
            conflicts: facts.conflicts,
            upload_already_applied: facts.upload_already_applied,
            download_rows: facts.rows_downloaded,
            download_checksum: self.digest.hex(),
            error,
        }
    }

    /// Writes the sync's files, off the async threads.
    pub(crate) fn finish(self, outcome: SyncOutcomeRecord) {
        tokio::task::spawn_blocking(move || {
            if let Err(error) = self.recorder.write(&self, &outcome) {
                tracing::warn!(%error, "recording a sync failed");
            }
        });
    }
}

/// A recording read back: its syncs in sequence order.
pub fn read_recording(dir: &Path) -> Result<Vec<RecordedSync>, RecordError> {
    let syncs_dir = dir.join("syncs");
    let mut syncs = Vec::new();
    for entry in std::fs::read_dir(&syncs_dir).map_err(io_error(&syncs_dir))? {
        let path = entry.map_err(io_error(&syncs_dir))?.path();
        if path.extension().and_then(|extension| extension.to_str()) != Some("json") {
            continue;
        }
        let text = std::fs::read(&path).map_err(io_error(&path))?;
        let sync: RecordedSync =
            serde_json::from_slice(&text).map_err(|error| RecordError::Malformed {
                path: path.clone(),
                message: error.to_string(),
            })?;
        syncs.push(sync);
    }
    syncs.sort_by_key(|sync| sync.sequence);
    Ok(syncs)
}

/// The upload frames of a recorded sync.
pub fn read_upload(dir: &Path, sequence: u64) -> Result<Vec<u8>, RecordError> {
    let path = dir.join("syncs").join(format!("{sequence:08}.upload"));
    std::fs::read(&path).map_err(io_error(&path))
}

/// A run's outcomes (`outcomes.jsonl` of a recording or a replay), by sequence.
pub fn read_outcomes(dir: &Path) -> Result<Vec<SyncOutcomeRecord>, RecordError> {
    let path = dir.join("outcomes.jsonl");
    let text = std::fs::read_to_string(&path).map_err(io_error(&path))?;
    let mut outcomes = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let outcome = serde_json::from_str(line).map_err(|error| RecordError::Malformed {
            path: path.clone(),
            message: format!("line {}: {error}", number + 1),
        })?;
        outcomes.push(outcome);
    }
    outcomes.sort_by_key(|outcome: &SyncOutcomeRecord| outcome.sequence);
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rowsync_protocol::Value;

    #[test]
    fn the_download_digest_does_not_depend_on_row_order_or_chunks() {
        let row = |id: i64| vec![Value::Int(id), Value::Text(format!("n{id}"))];
        let download = |rows: Vec<Row>| Download {
            table: "notes".into(),
            columns: vec!["id".into(), "body".into()],
            key_columns: vec!["id".into()],
            upserts: rows,
            deletes: vec![],
        };
        let mut whole = DownloadDigest::default();
        whole.add(&download(vec![row(1), row(2), row(3)]));
        let mut parts = DownloadDigest::default();
        parts.add(&download(vec![row(3)]));
        parts.add(&download(vec![row(2), row(1)]));
        assert_eq!(whole, parts);
        let mut other = DownloadDigest::default();
        other.add(&download(vec![row(1), row(2), row(4)]));
        assert_ne!(whole.sum, other.sum);
    }
}
