//! The download: each table's delete cursor, then its download cursor, read in batches
//! into the `DownloadSender`, the client's own upload filtered out and its conflicts'
//! resolution added.

use std::collections::HashMap;

use rowsync_protocol::Conflicts;

use crate::conflicts::Resolution;
use crate::dialect::{CursorScript, CursorSink, Dialect};
use crate::echo::DownloadFilter;
use crate::parameters::Parameters;
use crate::scripts::*;
use crate::version_scripts::Scripts;
use crate::{DownloadSender, SyncError, SyncRequest};

/// Names each table's conflicting keys, in the upload's table order, ahead of the
/// download that carries the server's rows for them.
pub async fn send_conflicts(
    request: &SyncRequest,
    resolutions: &HashMap<&str, Resolution>,
    download: &DownloadSender,
) -> Result<(), SyncError> {
    for upload in &request.tables {
        let Some(resolution) = resolutions.get(upload.table.as_str()) else {
            continue;
        };
        download
            .send_conflicts(Conflicts {
                table: upload.table.clone(),
                key_columns: upload.key_columns.clone(),
                keys: resolution.conflict_keys.clone(),
            })
            .await?;
    }
    Ok(())
}

/// Streams every download table; returns the rows sent.
pub async fn send_download<D: Dialect>(
    transaction: &mut D,
    scripts: &Scripts,
    parameters: &Parameters<'_>,
    resolutions: &HashMap<&str, Resolution>,
    download: &DownloadSender,
) -> Result<u64, SyncError> {
    let mut download_rows = 0;
    for table in scripts.download_tables() {
        let shape = transaction.table_shape(table).await?;
        let mut filter = DownloadFilter::new(&shape, resolutions.get(table));
        // Within a table, deletes come before upserts: a key deleted and written again
        // ends up written on a client that applies chunks in order.
        let deletes = CursorScript {
            scripts,
            table,
            event: DOWNLOAD_DELETE_CURSOR,
            parameters,
        };
        read_cursor(transaction, &deletes, &mut filter, download).await?;
        download.send(filter.conflict_deletes()).await?;
        let upserts = CursorScript {
            event: DOWNLOAD_CURSOR,
            ..deletes
        };
        read_cursor(transaction, &upserts, &mut filter, download).await?;
        download.send(filter.conflict_upserts()).await?;
        download_rows += filter.rows_sent;
    }
    Ok(download_rows)
}

/// Reads one cursor, if the version has it, through the filter into the download.
async fn read_cursor<D: Dialect>(
    transaction: &mut D,
    cursor: &CursorScript<'_>,
    filter: &mut DownloadFilter<'_>,
    download: &DownloadSender,
) -> Result<(), SyncError> {
    if cursor.scripts.get(cursor.table, cursor.event).is_none() {
        return Ok(());
    }
    let mut sink = CursorSink {
        filter,
        download,
        deletes: cursor.event == DOWNLOAD_DELETE_CURSOR,
    };
    transaction.read_cursor(cursor, &mut sink).await
}
