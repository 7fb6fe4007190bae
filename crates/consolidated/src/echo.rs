//! The download filter: a client's own applied upload is not echoed back to it, and
//! conflicting keys come down as the server's rows.

use std::collections::HashSet;

use rowsync_protocol::{Download, Row};

use crate::conflicts::Resolution;
use crate::scripts::*;
use crate::shape::{key_positions_in, TableShape};
use crate::upload_rows::{key_bytes, write_key_bytes};
use crate::SyncError;

/// Streams one table's download as chunks: first deletes (the delete cursor's keys
/// minus the client's own deletes, then conflict deletes), then upserts (the cursor's
/// rows minus the client's own applied uploads, then the current rows of conflicting
/// keys). Only the upload's keys are held in memory, never the cursor's rows.
pub struct DownloadFilter<'a> {
    shape: &'a TableShape,
    resolution: &'a Resolution,
    conflict_upsert_keys: HashSet<Vec<u8>>,
    conflict_delete_keys: HashSet<Vec<u8>>,
    /// The cursor's columns and key positions, once its first batch was seen.
    cursor: Option<(Vec<String>, Vec<usize>)>,
    pub rows_sent: u64,
}

static NO_RESOLUTION: std::sync::OnceLock<Resolution> = std::sync::OnceLock::new();

impl<'a> DownloadFilter<'a> {
    pub fn new(shape: &'a TableShape, resolution: Option<&'a Resolution>) -> DownloadFilter<'a> {
        let resolution =
            resolution.unwrap_or_else(|| NO_RESOLUTION.get_or_init(Resolution::default));
        let all: Vec<usize> = (0..shape.key_columns.len()).collect();
        DownloadFilter {
            shape,
            conflict_delete_keys: resolution
                .conflict_deletes
                .iter()
                .map(|key| key_bytes(key, &all))
                .collect(),
            conflict_upsert_keys: HashSet::new(),
            resolution,
            cursor: None,
            rows_sent: 0,
        }
    }

    fn chunk(&self, columns: Vec<String>, upserts: Vec<Row>, deletes: Vec<Row>) -> Download {
        Download {
            table: self.shape.name.clone(),
            columns,
            key_columns: self.shape.key_columns.clone(),
            upserts,
            deletes,
        }
    }

    /// A batch of the delete cursor, as a chunk to send.
    pub fn deletes(&mut self, columns: &[String], keys: Vec<Row>) -> Result<Download, SyncError> {
        if columns.len() != self.shape.key_columns.len() {
            return Err(SyncError::script(
                DOWNLOAD_DELETE_CURSOR,
                &self.shape.name,
                format!(
                    "the script must select exactly the key columns {:?}; it selects {columns:?}",
                    self.shape.key_columns
                ),
            ));
        }
        let all: Vec<usize> = (0..self.shape.key_columns.len()).collect();
        let mut bytes = Vec::new();
        let keys: Vec<Row> = keys
            .into_iter()
            .filter(|key| {
                write_key_bytes(key, &all, &mut bytes);
                !self
                    .resolution
                    .uploaded_delete_keys
                    .contains(bytes.as_slice())
                    && !self.conflict_delete_keys.contains(bytes.as_slice())
            })
            .collect();
        self.rows_sent += keys.len() as u64;
        Ok(self.chunk(Vec::new(), Vec::new(), keys))
    }

    /// Conflicting keys the client must drop; send after the delete cursor's chunks.
    pub fn conflict_deletes(&mut self) -> Download {
        self.rows_sent += self.resolution.conflict_deletes.len() as u64;
        self.chunk(
            Vec::new(),
            Vec::new(),
            self.resolution.conflict_deletes.clone(),
        )
    }

    /// A batch of the download cursor, as a chunk to send.
    pub fn upserts(&mut self, columns: &[String], rows: Vec<Row>) -> Result<Download, SyncError> {
        if self.cursor.is_none() {
            let table = self.shape.name.as_str();
            let key_positions =
                key_positions_in(columns, &self.shape.key_columns, table, DOWNLOAD_CURSOR)?;
            if !self.resolution.conflict_upserts.is_empty()
                && self.resolution.conflict_columns != columns
            {
                return Err(SyncError::script(UPLOAD_FETCH, table, format!(
                        "upload_fetch selects {:?} but download_cursor selects {columns:?}; they must select the same columns",
                        self.resolution.conflict_columns
                    )));
            }
            self.conflict_upsert_keys = self
                .resolution
                .conflict_upserts
                .iter()
                .map(|row| key_bytes(row, &key_positions))
                .collect();
            self.cursor = Some((columns.to_vec(), key_positions));
        }
        let (columns, key_positions) = self.cursor.as_ref().expect("set above");
        if self.resolution.uploaded_upsert_keys.is_empty() && self.conflict_upsert_keys.is_empty() {
            self.rows_sent += rows.len() as u64;
            return Ok(self.chunk(columns.clone(), rows, Vec::new()));
        }
        let mut key = Vec::new();
        let rows: Vec<Row> = rows
            .into_iter()
            .filter(|row| {
                write_key_bytes(row, key_positions, &mut key);
                !self
                    .resolution
                    .uploaded_upsert_keys
                    .contains(key.as_slice())
                    && !self.conflict_upsert_keys.contains(key.as_slice())
            })
            .collect();
        self.rows_sent += rows.len() as u64;
        Ok(self.chunk(columns.clone(), rows, Vec::new()))
    }

    /// The current rows of conflicting keys (server wins); send last.
    pub fn conflict_upserts(&mut self) -> Download {
        self.rows_sent += self.resolution.conflict_upserts.len() as u64;
        self.chunk(
            self.resolution.conflict_columns.clone(),
            self.resolution.conflict_upserts.clone(),
            Vec::new(),
        )
    }
}
