//! The download: each table's delete cursor, then its download cursor, read in batches
//! into the `DownloadSender`, the client's own upload filtered out and its conflicts'
//! resolution added.

use std::collections::HashMap;

use rowsync_protocol::{Conflicts, Value};

use crate::conflicts::Resolution;
use std::sync::{Arc, Mutex};

use crate::dialect::{CursorScript, CursorSink, Dialect, EchoXids, OwnWrites};
use crate::echo::DownloadFilter;
use crate::parameters::Parameters;
use crate::scripts::*;
use crate::shared_download::{CachedCursor, CursorKey, Lookup, Recording};
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

/// What a sync's download is read for.
pub struct DownloadOf<'a> {
    pub scripts: &'a Scripts,
    pub parameters: &'a Parameters<'a>,
    pub request: &'a SyncRequest,
    pub resolutions: &'a HashMap<&'a str, Resolution>,
    /// The upload was applied by this sync (not one applied before).
    pub applied: bool,
    /// This sync's watermark.
    pub watermark: i64,
}

/// Streams every download table; returns the rows sent.
/// The tables whose rows the sync downloads: the version's, or the subset the client
/// named (protocol v9).
fn covered<'s>(scripts: &'s Scripts, request: &SyncRequest) -> Vec<&'s str> {
    let tables = &request.sync_tables;
    scripts
        .download_tables()
        .into_iter()
        .filter(|table| {
            !tables.only_these || tables.watermarks.iter().any(|named| named.table == *table)
        })
        .collect()
}

pub async fn stream_download<D: Dialect>(
    transaction: &mut D,
    of: &DownloadOf<'_>,
    download: &DownloadSender,
) -> Result<DownloadSent, SyncError> {
    let DownloadOf {
        scripts,
        parameters,
        request,
        resolutions,
        applied,
        watermark,
    } = *of;
    let mut download_rows = 0;
    let mut watermark_cap: Option<i64> = None;
    for table in covered(scripts, request) {
        let shape = transaction.table_shape(table).await?;
        let column = transaction.partition_column(table).await?;
        super::check_partition_value(transaction, table, column.as_deref(), &request.user).await?;
        let resolution = resolutions.get(table);
        let echo = match own_writes(scripts, table, request, resolution, applied) {
            Some(written) => transaction.echo_xids(table, written, &request.user).await?,
            None => EchoXids::default(),
        };
        let mut filter = DownloadFilter::new(&shape, resolution);
        // Within a table, deletes come before upserts: a key deleted and written again
        // ends up written on a client that applies chunks in order. The two cursors
        // are read one after the other, in one round trip where the backend can.
        download.send(filter.conflict_deletes()).await?;
        let delete_parameters = parameters.with(vec![(ECHO_XID, Value::Int(echo.deletes))]);
        let upsert_parameters = parameters.with(vec![(ECHO_XID, Value::Int(echo.upserts))]);
        let cursors: Vec<CursorScript> = [
            (DOWNLOAD_DELETE_CURSOR, &delete_parameters),
            (DOWNLOAD_CURSOR, &upsert_parameters),
        ]
        .into_iter()
        .filter(|(event, _)| scripts.get(table, event).is_some())
        .map(|(event, parameters)| CursorScript {
            scripts,
            table,
            event,
            parameters,
            recording: None,
        })
        .collect();
        let may_share = request.upload_operation_count() == 0;
        let served = read_cursors(
            transaction,
            cursors,
            watermark,
            may_share,
            &mut filter,
            download,
        )
        .await?;
        watermark_cap = match (watermark_cap, served) {
            (Some(cap), Some(served)) => Some(cap.min(served)),
            (cap, served) => cap.or(served),
        };
        download.send(filter.conflict_upserts()).await?;
        download_rows += filter.rows_sent;
    }
    Ok(DownloadSent {
        rows: download_rows,
        watermark_cap,
    })
}

/// What [`stream_download`] sent.
pub struct DownloadSent {
    pub rows: u64,
    /// The download carries rows read by another sync at this watermark
    /// (`shared_download`): the sync reports no higher a watermark.
    pub watermark_cap: Option<i64>,
}

/// Reads a table's cursors in order, each either from the rows another sync read
/// (`shared_download`, when `may_share`) or from the database, in one call for those
/// in a row; the rows of a cursor that may be shared are kept for the syncs after.
/// Returns the lowest watermark of the rows served kept, if any were.
async fn read_cursors<D: Dialect>(
    transaction: &mut D,
    mut cursors: Vec<CursorScript<'_>>,
    watermark: i64,
    may_share: bool,
    filter: &mut DownloadFilter<'_>,
    download: &DownloadSender,
) -> Result<Option<i64>, SyncError> {
    let Some(shared) = download.shared_downloads().filter(|_| may_share) else {
        transaction.read_cursors(&cursors, filter, download).await?;
        return Ok(None);
    };
    let mut kept = Vec::new();
    let mut hits = Vec::new();
    for (index, cursor) in cursors.iter_mut().enumerate() {
        let script = cursor.scripts.get(cursor.table, cursor.event).unwrap_or("");
        let Some(key) = CursorKey::of(cursor.table, script, cursor.parameters) else {
            continue;
        };
        match shared.get(&key) {
            Lookup::Kept(hit) => hits.push((index, hit)),
            Lookup::Record => {
                let recording = Arc::new(Mutex::new(Recording::new(shared.bytes_max(), watermark)));
                cursor.recording = Some(Arc::clone(&recording));
                kept.push((key, recording));
            }
            Lookup::Read => {}
        }
    }
    let read = replay_and_read(transaction, &cursors, &hits, filter, download).await;
    drop(cursors);
    if let Err(error) = read {
        for (key, _) in &kept {
            shared.abandon(key);
        }
        return Err(error);
    }
    for (key, recording) in kept {
        if let Ok(recording) = Arc::try_unwrap(recording).map(Mutex::into_inner) {
            shared.put(
                key,
                recording.unwrap_or_else(|poisoned| poisoned.into_inner()),
            );
        }
    }
    Ok(hits.iter().map(|(_, hit)| hit.watermark).min())
}

/// The cursors in order: those in `hits` from the rows kept, the others from the
/// database, in one call for those in a row.
async fn replay_and_read<D: Dialect>(
    transaction: &mut D,
    cursors: &[CursorScript<'_>],
    hits: &[(usize, Arc<CachedCursor>)],
    filter: &mut DownloadFilter<'_>,
    download: &DownloadSender,
) -> Result<(), SyncError> {
    let mut start = 0;
    for (index, hit) in hits {
        transaction
            .read_cursors(&cursors[start..*index], filter, download)
            .await?;
        let mut sink = CursorSink::for_cursor(&cursors[*index], filter, download);
        for batch in &hit.batches {
            sink.take(&hit.columns, batch.clone()).await?;
        }
        start = index + 1;
    }
    transaction
        .read_cursors(&cursors[start..], filter, download)
        .await
}

/// What this sync's upload wrote to `table`, where that is known exactly: the upload
/// was applied now, by set scripts (which write the uploaded keys and return them), and
/// nothing of it conflicted, so each uploaded key is one row written (or deleted). The
/// backend compares it with everything its transaction wrote to the table
/// ([`Dialect::echo_xids`]); `None` leaves the echo filter alone to do the work.
fn own_writes(
    scripts: &Scripts,
    table: &str,
    request: &SyncRequest,
    resolution: Option<&Resolution>,
    applied: bool,
) -> Option<OwnWrites> {
    let resolution = resolution?;
    let upload = request.tables.iter().find(|upload| upload.table == table)?;
    if !applied || resolution.conflict_count > 0 {
        return None;
    }
    let by_set_script = |event: &str, rows: usize| {
        rows == 0 || scripts.get(table, event).is_some_and(is_set_script)
    };
    let all_set = by_set_script(UPLOAD_INSERT, upload.inserts.len())
        && by_set_script(UPLOAD_UPDATE, upload.updates.len())
        && by_set_script(UPLOAD_DELETE, upload.deletes.len());
    all_set.then_some(OwnWrites {
        upserts: resolution.uploaded_upsert_keys.len() as u64,
        deletes: resolution.uploaded_delete_keys.len() as u64,
    })
}

#[cfg(test)]
mod tests {
    use rowsync_protocol::{RowUpdate, TableUpload};

    use super::*;

    fn request(inserts: usize, updates: usize, deletes: usize) -> SyncRequest {
        let row = |id: i64| vec![Value::Int(id)];
        SyncRequest {
            client_id: "c".into(),
            user: "u".into(),
            script_version: "v1".into(),
            last_download_watermark: 0,
            upload_sequence: 1,
            tables: vec![TableUpload {
                table: "t".into(),
                columns: vec!["id".into()],
                key_columns: vec!["id".into()],
                inserts: (0..inserts as i64).map(row).collect(),
                updates: (100..100 + updates as i64)
                    .map(|id| RowUpdate {
                        old: row(id),
                        new: row(id),
                    })
                    .collect(),
                deletes: (200..200 + deletes as i64).map(row).collect(),
            }],
            auth_parameters: Vec::new(),
            client_ids_per_user_max: None,
            transfer_id: None,
            check_identity: false,
            refused_rows_max: 0,
            key_ranges: None,
            sync_tables: Default::default(),
        }
    }

    fn scripts(update: &str) -> Scripts {
        let entry =
            |event: &str, sql: &str| (("t".to_string(), event.to_string()), sql.to_string());
        Scripts::new(
            "v1",
            [
                entry(UPLOAD_INSERT, "INSERT INTO t SELECT * FROM {upload}"),
                entry(UPLOAD_UPDATE, update),
                entry(UPLOAD_DELETE, "DELETE FROM t USING {upload} AS u"),
            ],
        )
    }

    fn resolution(request: &SyncRequest) -> Resolution {
        let mut resolution = Resolution::default();
        resolution.record_upload(&request.tables[0], &[0]);
        resolution
    }

    #[test]
    fn own_writes_are_known_only_for_a_fresh_conflict_free_upload_by_set_scripts() {
        let sets = scripts("UPDATE t SET id = u.id FROM {upload} AS u");
        let upload = request(3, 2, 1);
        let applied = resolution(&upload);
        assert_eq!(
            own_writes(&sets, "t", &upload, Some(&applied), true),
            Some(OwnWrites {
                upserts: 5,
                deletes: 1
            })
        );
        assert_eq!(
            own_writes(&sets, "t", &upload, Some(&applied), false),
            None,
            "an upload applied before wrote nothing now"
        );
        assert_eq!(
            own_writes(&sets, "other", &upload, None, true),
            None,
            "a table without upload"
        );
        let conflicted = Resolution {
            conflict_count: 1,
            ..resolution(&upload)
        };
        assert_eq!(
            own_writes(&sets, "t", &upload, Some(&conflicted), true),
            None
        );
        let rows = scripts("UPDATE t SET id = :new.id WHERE id = :old.id");
        assert_eq!(
            own_writes(&rows, "t", &upload, Some(&applied), true),
            None,
            "a row script's writes are its own business"
        );
        let no_updates = request(3, 0, 1);
        assert_eq!(
            own_writes(
                &rows,
                "t",
                &no_updates,
                Some(&resolution(&no_updates)),
                true
            ),
            Some(OwnWrites {
                upserts: 3,
                deletes: 1
            }),
            "the row script did not run"
        );
    }
}
