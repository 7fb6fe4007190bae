//! What a sync tells its caller: progress while it runs, a report when it ends, and the
//! rows that conflicted.

use std::collections::HashMap;
use std::time::Duration;

use rowsync_protocol::{encode_key_identity, Conflicts, Download, ErrorCode, Row};

use crate::transport::WireBytes;

/// Conflicted rows a [`SyncReport`] lists at most (the count in `conflicts` is complete).
pub const CONFLICTED_ROWS_REPORTED_MAX: usize = 10_000;

/// What one `sync()` did.
#[derive(Debug, Clone, Default)]
pub struct SyncReport {
    pub rows_uploaded: u64,
    pub rows_downloaded: u64,
    /// Upload operations the server did not apply as sent (it kept its own row).
    pub conflicts: u64,
    /// The rows behind `conflicts`, as the server names them, with the server's row that
    /// won (at most [`CONFLICTED_ROWS_REPORTED_MAX`]).
    pub conflicted_rows: Vec<ConflictedRow>,
    /// Conflicts whose losing side (this client's change) this sync kept in the client
    /// database's `rs_client_conflict` ([`crate::Client::kept_conflicts`]).
    pub conflicts_kept: u64,
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
    /// Bytes of the upload's stream (decompressed) the server held from a cut earlier
    /// attempt, so they were not sent again (protocol v3).
    pub upload_bytes_resumed: u64,
    /// Bytes of the download's stream (decompressed) kept from a cut earlier attempt, so
    /// the server did not send them again (protocol v4).
    pub download_bytes_resumed: u64,
    /// The server found this database is not the one it knows under its client id (a
    /// copy, or a restored backup): it took a new client id ([`crate::Client::client_id`])
    /// and sent its changes as that client, in this sync (protocol v5).
    pub identity: Option<Identity>,
    /// Changes the server refused (protocol v6), set aside in `rs_client_rejected`
    /// ([`crate::Client::rejected_rows`]) while the rest of the upload went up.
    pub rows_rejected: u64,
}

/// Why a client database took a new client id in a sync (docs/client.md §6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// Another copy of this database had synced under the same client id.
    Copied,
    /// This database was behind the syncs the server had acknowledged to its client id:
    /// restored from a backup, or a copy the other copy synced past.
    Restored,
}

impl Identity {
    /// The server's refusal of a copied or restored database, if `error` is one.
    pub(crate) fn of_refusal(error: &crate::ClientError) -> Option<Identity> {
        match error.server_code()? {
            ErrorCode::ClientCopied => Some(Identity::Copied),
            ErrorCode::ClientRestored => Some(Identity::Restored),
            _ => None,
        }
    }

    /// `copied` or `restored`, as `to_json` gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Identity::Copied => "copied",
            Identity::Restored => "restored",
        }
    }
}

impl SyncReport {
    /// The report as JSON, for callers in other languages and scripts: the fields by
    /// their names here (`identity` as `null`, `"copied"` or `"restored"`),
    /// `elapsed_seconds`, `bytes_sent` and `bytes_received`, and each
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
            "conflicts_kept": self.conflicts_kept,
            "rounds": self.rounds,
            "upload_already_applied": self.upload_already_applied,
            "watermark": self.watermark,
            "elapsed_seconds": self.elapsed.as_secs_f64(),
            "bytes_sent": self.wire.sent,
            "bytes_received": self.wire.received,
            "busy_retries": self.busy_retries,
            "download_acknowledged": self.download_acknowledged,
            "upload_bytes_resumed": self.upload_bytes_resumed,
            "download_bytes_resumed": self.download_bytes_resumed,
            "identity": self.identity.map(Identity::as_str),
            "rows_rejected": self.rows_rejected,
        })
    }
}

/// A row this client uploaded that the server did not take as sent; the download of the
/// same sync brought the server's version back.
#[derive(Debug, Clone, PartialEq)]
pub struct ConflictedRow {
    pub table: String,
    /// Primary-key column names and the row's key values, in the same order.
    pub key_columns: Vec<String>,
    pub key: Row,
    /// Column names of `server_row` (empty without one).
    pub columns: Vec<String>,
    /// The server's row that won; `None` when the server has no such row (deleted), or
    /// the script version does not download the table.
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

/// The conflicted rows of one sync as the server names them: the keys from its
/// `Conflicts` messages, and the server's row for each from the download that follows.
#[derive(Debug, Default)]
pub(crate) struct ConflictedRows {
    /// Where each named key sits in the report's list, by table and encoded key.
    positions: HashMap<String, HashMap<Vec<u8>, usize>>,
}

impl ConflictedRows {
    /// Adds the keys the server named to `out`, up to the limit.
    pub fn named(&mut self, conflicts: Conflicts, out: &mut Vec<ConflictedRow>) {
        let table = self.positions.entry(conflicts.table.clone()).or_default();
        for key in conflicts.keys {
            if out.len() >= CONFLICTED_ROWS_REPORTED_MAX {
                return;
            }
            let mut encoded = Vec::new();
            encode_key_identity(&key, &mut encoded);
            if table.contains_key(&encoded) {
                continue;
            }
            table.insert(encoded, out.len());
            out.push(ConflictedRow {
                table: conflicts.table.clone(),
                key_columns: conflicts.key_columns.clone(),
                key,
                columns: Vec::new(),
                server_row: None,
            });
        }
    }

    /// Fills in the server's row for the named keys that `download` carries: the row it
    /// upserts, or none for a key it deletes.
    pub fn answered(&self, download: &Download, out: &mut [ConflictedRow]) {
        let Some(table) = self.positions.get(&download.table) else {
            return;
        };
        let mut encoded = Vec::new();
        for key in &download.deletes {
            encoded.clear();
            encode_key_identity(key, &mut encoded);
            if let Some(&index) = table.get(&encoded) {
                out[index].server_row = None;
            }
        }
        // A message of deletes only names no columns.
        let Some(positions) = key_positions(&download.columns, &download.key_columns) else {
            return;
        };
        for row in &download.upserts {
            encoded.clear();
            for value in positions.iter().filter_map(|&position| row.get(position)) {
                encode_key_identity(std::slice::from_ref(value), &mut encoded);
            }
            if let Some(&index) = table.get(&encoded) {
                out[index].columns = download.columns.clone();
                out[index].server_row = Some(row.clone());
            }
        }
    }
}

/// The positions of `key_columns` in `columns`; `None` if one is missing.
pub(crate) fn key_positions(columns: &[String], key_columns: &[String]) -> Option<Vec<usize>> {
    key_columns
        .iter()
        .map(|key| columns.iter().position(|c| c == key))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rowsync_protocol::Value;

    fn named(table: &str, keys: &[i64]) -> Conflicts {
        Conflicts {
            table: table.into(),
            key_columns: vec!["id".into()],
            keys: keys.iter().map(|&k| vec![Value::Int(k)]).collect(),
        }
    }

    #[test]
    fn named_keys_take_the_servers_rows_from_the_download() {
        let mut rows = ConflictedRows::default();
        let mut out = Vec::new();
        rows.named(named("orders", &[1, 2, 3, 1]), &mut out);
        rows.named(named("notes", &[1]), &mut out);
        assert_eq!(out.len(), 4, "each key once: {out:?}");
        let download = Download {
            table: "orders".into(),
            columns: vec!["item".into(), "id".into()],
            key_columns: vec!["id".into()],
            upserts: vec![
                vec![Value::Text("server's".into()), Value::Int(1)],
                vec![Value::Text("someone else's".into()), Value::Int(9)],
            ],
            deletes: vec![vec![Value::Int(2)]],
        };
        rows.answered(&download, &mut out);
        assert_eq!(
            out[0].server_row,
            Some(vec![Value::Text("server's".into()), Value::Int(1)])
        );
        assert_eq!(out[0].columns, vec!["item".to_string(), "id".to_string()]);
        assert_eq!((&out[1].server_row, out[1].columns.len()), (&None, 0));
        assert_eq!(out[2].server_row, None, "not in the download");
        assert_eq!(
            (out[3].table.as_str(), &out[3].server_row),
            ("notes", &None),
            "another table's key 1 is not orders' key 1"
        );
    }

    #[test]
    fn the_list_stops_at_its_limit() {
        let mut rows = ConflictedRows::default();
        let mut out = Vec::new();
        let keys: Vec<i64> = (0..CONFLICTED_ROWS_REPORTED_MAX as i64 + 5).collect();
        rows.named(named("orders", &keys), &mut out);
        assert_eq!(out.len(), CONFLICTED_ROWS_REPORTED_MAX);
    }
}
