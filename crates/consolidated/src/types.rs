use rowsync_protocol::{SyncSummary, TableUpload};

/// One sync's database work, assembled by the server once the whole upload is in hand.
#[derive(Debug, Clone)]
pub struct SyncRequest {
    pub client_id: String,
    /// The authenticated user: the only identity scripts ever see.
    pub user: String,
    pub script_version: String,
    pub last_download_watermark: i64,
    pub upload_sequence: u64,
    /// At most one entry per table (the server merges chunks).
    pub tables: Vec<TableUpload>,
}

impl SyncRequest {
    pub fn upload_operation_count(&self) -> u64 {
        self.tables
            .iter()
            .map(|table| (table.inserts.len() + table.updates.len() + table.deletes.len()) as u64)
            .sum()
    }
}

/// What a sync did, once its transaction committed; its download went to the
/// `DownloadSender`.
#[derive(Debug, Clone, Default)]
pub struct SyncOutcome {
    pub watermark: i64,
    pub summary: SyncSummary,
    /// Rows (upserts and deletes) streamed to the download.
    pub download_rows: u64,
}

/// `rowsync init`: make an existing table synchronizable in a script version.
#[derive(Debug, Clone)]
pub struct TableInit {
    pub table: String,
    /// Rows whose partition column equals the authenticated user name belong to that
    /// user's clients.
    pub partition_column: String,
    pub script_version: String,
}
