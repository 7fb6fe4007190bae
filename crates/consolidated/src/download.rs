//! How a backend hands a sync's download to the server: in chunks, through a bounded
//! channel, while its transaction runs, so no download is ever held whole in memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rowsync_protocol::{Conflicts, Download, KeyRange, Row, SyncSummary, Value};
use tokio::sync::{mpsc, oneshot};

use crate::shared_download::SharedDownloads;
use crate::{ConsolidatedConnection, SyncError, SyncRequest};

/// Rows a backend reads from a download cursor at a time, and so the most rows of one
/// chunk (a few MB: each batch read from PostgreSQL is one round trip).
pub const DOWNLOAD_BATCH_ROWS: usize = 10_000;

/// Bytes (encoded) at which a backend hands a cursor's rows on before
/// `DOWNLOAD_BATCH_ROWS` are read: rows holding large values (up to the server's
/// `value_bytes_max` each) go one chunk at a time, so a download's memory stays a few
/// such rows, not a batch of them.
pub const DOWNLOAD_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Rows read from a cursor, handed on at `DOWNLOAD_BATCH_ROWS` rows or
/// `DOWNLOAD_BATCH_BYTES` bytes, whichever comes first.
#[derive(Debug, Default)]
pub struct CursorBatch {
    rows: Vec<Row>,
    bytes: usize,
}

impl CursorBatch {
    /// Adds a row; true when the batch is full and should be handed on.
    pub fn push(&mut self, row: Row) -> bool {
        self.bytes += 2 + row.iter().map(Value::encoded_len).sum::<usize>();
        self.rows.push(row);
        self.rows.len() >= DOWNLOAD_BATCH_ROWS || self.bytes >= DOWNLOAD_BATCH_BYTES
    }

    pub fn take(&mut self) -> Vec<Row> {
        self.bytes = 0;
        std::mem::take(&mut self.rows)
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// Chunks that may wait between the backend and the server's encoder.
pub const DOWNLOAD_CHANNEL_CHUNKS: usize = 8;

/// The backend's end of the download channel. Within a table, chunks of deletes come
/// before chunks of upserts, so a receiver that applies chunks in order gets the right
/// rows even when a key was deleted and written again.
#[derive(Clone)]
pub struct DownloadSender {
    sender: mpsc::Sender<DownloadMessage>,
    chunks_sent: Arc<AtomicUsize>,
    shared: Option<Arc<SharedDownloads>>,
}

/// What travels from a backend to the download's receiver.
pub enum DownloadMessage {
    Chunk(Download),
    /// Keys of one table's upload the server did not apply as sent; all of them come
    /// before the first chunk.
    Conflicts(Conflicts),
    /// The download is complete; the receiver answers whether it took all of it (an
    /// error says why not). The backend commits only after a yes.
    Finish(oneshot::Sender<Result<(), String>>),
}

impl DownloadSender {
    /// The same sender, whose syncs read shared rows once (`shared_download`).
    pub fn with_shared_downloads(mut self, shared: Arc<SharedDownloads>) -> DownloadSender {
        self.shared = Some(shared);
        self
    }

    pub(crate) fn shared_downloads(&self) -> Option<&Arc<SharedDownloads>> {
        self.shared.as_ref()
    }

    pub async fn send(&self, chunk: Download) -> Result<(), SyncError> {
        if chunk.upserts.is_empty() && chunk.deletes.is_empty() {
            return Ok(());
        }
        self.chunks_sent.fetch_add(1, Ordering::Relaxed);
        self.sender
            .send(DownloadMessage::Chunk(chunk))
            .await
            .map_err(|_| SyncError::DownloadAbandoned)
    }

    /// Names one table's conflicting keys to the receiver (nothing when there are none).
    pub async fn send_conflicts(&self, conflicts: Conflicts) -> Result<(), SyncError> {
        if conflicts.keys.is_empty() {
            return Ok(());
        }
        // Told keys cannot be taken back: a sync is not retried once they left.
        self.chunks_sent.fetch_add(1, Ordering::Relaxed);
        self.sender
            .send(DownloadMessage::Conflicts(conflicts))
            .await
            .map_err(|_| SyncError::DownloadAbandoned)
    }

    /// Waits until the receiver has taken every chunk; call right before committing.
    pub async fn finish(&self) -> Result<(), SyncError> {
        let (answer, verdict) = oneshot::channel();
        self.sender
            .send(DownloadMessage::Finish(answer))
            .await
            .map_err(|_| SyncError::DownloadAbandoned)?;
        Self::verdict(verdict.await)
    }

    fn verdict(
        answer: Result<Result<(), String>, oneshot::error::RecvError>,
    ) -> Result<(), SyncError> {
        match answer {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => Err(SyncError::DownloadRefused(reason)),
            Err(_) => Err(SyncError::DownloadAbandoned),
        }
    }

    /// Chunks sent so far: a sync may only be retried from scratch before the first.
    pub fn chunks_sent(&self) -> usize {
        self.chunks_sent.load(Ordering::Relaxed)
    }
}

/// A download channel: the sender for the backend, the receiver for whoever encodes.
pub fn download_channel() -> (DownloadSender, mpsc::Receiver<DownloadMessage>) {
    let (sender, receiver) = mpsc::channel(DOWNLOAD_CHANNEL_CHUNKS);
    let sender = DownloadSender {
        sender,
        chunks_sent: Arc::new(AtomicUsize::new(0)),
        shared: None,
    };
    (sender, receiver)
}

/// A sync with its whole download gathered, one `Download` per table: for tests and
/// tools that want to look at a download, not for the server.
#[derive(Debug, Clone, Default)]
pub struct CollectedSync {
    pub downloads: Vec<Download>,
    /// The conflicting keys the sync named, as it sent them.
    pub conflicts: Vec<Conflicts>,
    pub watermark: i64,
    pub summary: SyncSummary,
    /// Key ranges the sync handed out (protocol v7).
    pub key_ranges: Vec<KeyRange>,
}

impl CollectedSync {
    pub fn download_row_count(&self) -> u64 {
        self.downloads
            .iter()
            .map(|table| (table.upserts.len() + table.deletes.len()) as u64)
            .sum()
    }
}

/// Runs a sync and gathers its download.
pub async fn sync_and_collect<C: ConsolidatedConnection>(
    connection: &mut C,
    request: Arc<SyncRequest>,
) -> Result<CollectedSync, SyncError> {
    sync_and_collect_shared(connection, request, None).await
}

/// [`sync_and_collect`], reading shared rows once through `shared` when given.
pub async fn sync_and_collect_shared<C: ConsolidatedConnection>(
    connection: &mut C,
    request: Arc<SyncRequest>,
    shared: Option<Arc<SharedDownloads>>,
) -> Result<CollectedSync, SyncError> {
    let (sender, mut receiver) = download_channel();
    let sender = match shared {
        Some(shared) => sender.with_shared_downloads(shared),
        None => sender,
    };
    let gather = async move {
        let mut downloads: Vec<Download> = Vec::new();
        let mut conflicts: Vec<Conflicts> = Vec::new();
        while let Some(message) = receiver.recv().await {
            let chunk = match message {
                DownloadMessage::Chunk(chunk) => chunk,
                DownloadMessage::Conflicts(table) => {
                    conflicts.push(table);
                    continue;
                }
                DownloadMessage::Finish(answer) => {
                    let _ = answer.send(Ok(()));
                    continue;
                }
            };
            match downloads.iter_mut().find(|d| d.table == chunk.table) {
                Some(table) => {
                    if table.columns.is_empty() {
                        table.columns = chunk.columns;
                    }
                    table.upserts.extend(chunk.upserts);
                    table.deletes.extend(chunk.deletes);
                }
                None => downloads.push(chunk),
            }
        }
        (downloads, conflicts)
    };
    let (outcome, (downloads, conflicts)) =
        tokio::join!(connection.run_sync_transaction(request, sender), gather);
    let outcome = outcome?;
    Ok(CollectedSync {
        downloads,
        conflicts,
        watermark: outcome.watermark,
        summary: outcome.summary,
        key_ranges: outcome.key_ranges,
    })
}
