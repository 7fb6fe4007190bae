//! Conflicts found in one table's upload and how they are resolved (server wins).

use std::collections::HashSet;

use rowsync_protocol::{Row, TableUpload};

use crate::scripts::*;
use crate::shape::{key_positions_in, TableShape};
use crate::stored::StoredBack;
use crate::upload_rows::key_bytes;
use crate::SyncError;

/// What applying one table's upload means for its download.
#[derive(Default)]
pub struct Resolution {
    pub conflict_count: u64,
    /// Keys the client uploaded: rows it already holds as the server now does, unless
    /// they conflicted (conflicts are resolved below and always sent).
    pub uploaded_upsert_keys: HashSet<Vec<u8>>,
    pub uploaded_delete_keys: HashSet<Vec<u8>>,
    /// Current server rows for conflicting keys (server wins), and conflicting keys the
    /// client must drop because no row in its partition has them.
    pub conflict_columns: Vec<String>,
    pub conflict_upserts: Vec<Row>,
    pub conflict_deletes: Vec<Row>,
    /// Every conflicting key once, in the order found: what the client is told.
    pub conflict_keys: Vec<Row>,
}

impl Resolution {
    /// Remembers every key the upload touched, to keep them out of the echo.
    pub fn record_upload(&mut self, upload: &TableUpload, key_positions: &[usize]) {
        self.uploaded_upsert_keys
            .reserve(upload.inserts.len() + upload.updates.len());
        self.uploaded_delete_keys.reserve(upload.deletes.len());
        for row in upload
            .inserts
            .iter()
            .chain(upload.updates.iter().map(|update| &update.new))
        {
            self.uploaded_upsert_keys
                .insert(key_bytes(row, key_positions));
        }
        let all: Vec<usize> = (0..upload.key_columns.len()).collect();
        for key in &upload.deletes {
            self.uploaded_delete_keys.insert(key_bytes(key, &all));
        }
    }

    /// Adds rows this upload wrote that the table stores otherwise than they were sent
    /// (`stored`), read with `upload_fetch`: they go down with the conflicts' rows.
    /// Keys the client holds in another form than the table stores go down as deletes
    /// (before the rows).
    pub fn add_stored_rows(&mut self, columns: Vec<String>, back: StoredBack) {
        self.conflict_deletes.extend(back.deletes);
        if back.upserts.is_empty() {
            return;
        }
        if self.conflict_upserts.is_empty() {
            self.conflict_columns = columns;
        }
        self.conflict_upserts.extend(back.upserts);
    }

    /// Server wins: `rows` (with `columns`) are the current rows `upload_fetch` found for
    /// the conflicting keys; keys it did not find are sent as deletes.
    pub fn resolve(
        &mut self,
        shape: &TableShape,
        conflict_keys: Vec<Row>,
        columns: Vec<String>,
        rows: Vec<Row>,
    ) -> Result<(), SyncError> {
        self.conflict_count = conflict_keys.len() as u64;
        let key_positions =
            key_positions_in(&columns, &shape.key_columns, &shape.name, UPLOAD_FETCH)?;
        let found: HashSet<Vec<u8>> = rows
            .iter()
            .map(|row| key_bytes(row, &key_positions))
            .collect();
        let all: Vec<usize> = (0..shape.key_columns.len()).collect();
        let mut seen = HashSet::new();
        for key in conflict_keys {
            let bytes = key_bytes(&key, &all);
            if !seen.insert(bytes.clone()) {
                continue;
            }
            if !found.contains(&bytes) {
                self.conflict_deletes.push(key.clone());
            }
            self.conflict_keys.push(key);
        }
        self.conflict_columns = columns;
        self.conflict_upserts = rows;
        Ok(())
    }
}
