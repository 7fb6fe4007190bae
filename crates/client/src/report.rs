//! What a sync tells its caller: progress while it runs, a report when it ends, and the
//! rows that conflicted.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use rowsync_protocol::{Download, FrameDecoder, Message, Row, Value, FRAME_BYTES_MAX_DEFAULT};

use crate::transport::WireBytes;
use crate::ClientError;

/// Conflicted rows a [`SyncReport`] lists at most (the count in `conflicts` is complete).
pub const CONFLICTED_ROWS_REPORTED_MAX: usize = 10_000;

/// What one `sync()` did.
#[derive(Debug, Clone, Default)]
pub struct SyncReport {
    pub rows_uploaded: u64,
    pub rows_downloaded: u64,
    /// Upload operations the server did not apply as sent (it kept its own row).
    pub conflicts: u64,
    /// The rows behind `conflicts` with the server's row that won, as far as the download
    /// shows them (at most [`CONFLICTED_ROWS_REPORTED_MAX`]).
    pub conflicted_rows: Vec<ConflictedRow>,
    /// Round trips made: 2 when an unacknowledged upload had to be resent first.
    pub rounds: u32,
    /// The server had applied a resent upload already and applied nothing again.
    pub upload_already_applied: bool,
    pub watermark: i64,
    pub elapsed: Duration,
    /// Bytes on the wire, both directions, all rounds (TLS and HTTP overhead included).
    pub wire: WireBytes,
    /// Times the server answered busy and the sync was tried again.
    pub busy_retries: u32,
    /// The server confirmed it recorded the download acknowledgement.
    pub download_acknowledged: bool,
}

impl SyncReport {
    /// The report as JSON, for callers in other languages and scripts: the fields by
    /// their names here, `elapsed_seconds`, `bytes_sent` and `bytes_received`, and each
    /// conflicted row as `{table, key_columns, key, columns, server_row}` with values
    /// in the protocol's JSON form (`{"type": "int", "value": 1}`).
    pub fn to_json(&self) -> serde_json::Value {
        let conflicted: Vec<serde_json::Value> = self
            .conflicted_rows
            .iter()
            .map(|conflict| {
                serde_json::json!({
                    "table": conflict.table,
                    "key_columns": conflict.key_columns,
                    "key": conflict.key,
                    "columns": conflict.columns,
                    "server_row": conflict.server_row,
                })
            })
            .collect();
        serde_json::json!({
            "rows_uploaded": self.rows_uploaded,
            "rows_downloaded": self.rows_downloaded,
            "conflicts": self.conflicts,
            "conflicted_rows": conflicted,
            "rounds": self.rounds,
            "upload_already_applied": self.upload_already_applied,
            "watermark": self.watermark,
            "elapsed_seconds": self.elapsed.as_secs_f64(),
            "bytes_sent": self.wire.sent,
            "bytes_received": self.wire.received,
            "busy_retries": self.busy_retries,
            "download_acknowledged": self.download_acknowledged,
        })
    }
}

/// A row this client uploaded that the server did not take as sent: the download of the
/// same sync brought the server's version back.
#[derive(Debug, Clone, PartialEq)]
pub struct ConflictedRow {
    pub table: String,
    /// Primary-key column names and the row's key values, in the same order.
    pub key_columns: Vec<String>,
    pub key: Row,
    /// Column names of `server_row`.
    pub columns: Vec<String>,
    /// The server's row that won; `None` when the server has no such row (deleted).
    pub server_row: Option<Row>,
}

/// How far a sync has come, given to the progress callback after each piece of the
/// upload is sent and after each download message is applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncProgress {
    /// Bytes on the wire, both directions, so far.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Upload operations sent so far, out of `rows_to_upload`.
    pub rows_uploaded: u64,
    pub rows_to_upload: u64,
    /// Rows applied from the download so far.
    pub rows_downloaded: u64,
}

/// The keys an upload carried, by table, as hashes: a downloaded row whose key is among
/// them is the server's answer to a conflict (the server sends no echo of rows it
/// applied as uploaded).
#[derive(Debug, Default)]
pub(crate) struct UploadedKeys {
    tables: HashMap<String, HashSet<u64>>,
}

impl UploadedKeys {
    /// Reads the keys out of the upload frames the client sends.
    pub fn of_frames(frames: &[Vec<u8>]) -> Result<UploadedKeys, ClientError> {
        let mut keys = UploadedKeys::default();
        // A frame decoder: values sent in pieces come back into their row.
        let mut decoder =
            FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT).with_value_limits(u64::MAX, u64::MAX);
        let mut uploads = Vec::new();
        for frame in frames {
            decoder.feed(frame);
            while let Some(message) = decoder.next_message()? {
                uploads.push(message);
            }
        }
        for message in uploads {
            let Message::Upload(upload) = message else {
                return Err(ClientError::Protocol(
                    "a stored upload frame holds no upload message".into(),
                ));
            };
            let positions = key_positions(&upload.columns, &upload.key_columns)?;
            let set = keys.tables.entry(upload.table).or_default();
            let rows = upload
                .inserts
                .iter()
                .chain(upload.updates.iter().flat_map(|u| [&u.old, &u.new]));
            for row in rows {
                if let Some(key) = key_of(row, &positions) {
                    set.insert(key_hash(key.iter()));
                }
            }
            for key in &upload.deletes {
                set.insert(key_hash(key.iter()));
            }
        }
        Ok(keys)
    }

    /// Adds the rows of `download` whose keys went up to `out`, up to the limit.
    pub fn conflicts_in(&self, download: &Download, out: &mut Vec<ConflictedRow>) {
        let Some(set) = self.tables.get(&download.table) else {
            return;
        };
        // A message of deletes only names no columns.
        let positions = key_positions(&download.columns, &download.key_columns);
        let mut record = |key: Row, server_row: Option<Row>| {
            if out.len() < CONFLICTED_ROWS_REPORTED_MAX {
                out.push(ConflictedRow {
                    table: download.table.clone(),
                    key_columns: download.key_columns.clone(),
                    key,
                    columns: download.columns.clone(),
                    server_row,
                });
            }
        };
        for row in download.upserts.iter().filter(|_| positions.is_ok()) {
            if let Some(key) = key_of(row, positions.as_deref().unwrap_or_default()) {
                if set.contains(&key_hash(key.iter())) {
                    record(key, Some(row.clone()));
                }
            }
        }
        for key in &download.deletes {
            if set.contains(&key_hash(key.iter())) {
                record(key.clone(), None);
            }
        }
    }
}

fn key_positions(columns: &[String], key_columns: &[String]) -> Result<Vec<usize>, ClientError> {
    key_columns
        .iter()
        .map(|key| {
            columns
                .iter()
                .position(|c| c == key)
                .ok_or_else(|| ClientError::Protocol(format!("rows lack their key column {key:?}")))
        })
        .collect()
}

fn key_of(row: &Row, positions: &[usize]) -> Option<Row> {
    positions.iter().map(|&p| row.get(p).cloned()).collect()
}

fn key_hash<'v>(values: impl Iterator<Item = &'v Value>) -> u64 {
    let mut hasher = DefaultHasher::new();
    for value in values {
        match value {
            Value::Null => 0u8.hash(&mut hasher),
            Value::Int(v) => (1u8, v).hash(&mut hasher),
            Value::Double(v) => (2u8, v.to_bits()).hash(&mut hasher),
            Value::Decimal(v) => (3u8, v.to_string()).hash(&mut hasher),
            Value::Text(v) => (4u8, v).hash(&mut hasher),
            Value::Blob(v) => (5u8, v).hash(&mut hasher),
            Value::Timestamp(v) => (6u8, v).hash(&mut hasher),
        }
    }
    hasher.finish()
}
