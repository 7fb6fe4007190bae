//! The download: each table's delete cursor, then its download cursor, read in batches
//! into the `DownloadSender`, the client's own upload filtered out and its conflicts'
//! resolution added.

use std::collections::HashMap;

use rowsync_protocol::{Conflicts, Value};

use crate::conflicts::Resolution;
use crate::dialect::{CursorScript, Dialect, EchoXids, OwnWrites};
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

/// Streams every download table; returns the rows sent. `applied`: the upload was
/// applied by this sync (not one applied before).
pub async fn send_download<D: Dialect>(
    transaction: &mut D,
    scripts: &Scripts,
    parameters: &Parameters<'_>,
    request: &SyncRequest,
    resolutions: &HashMap<&str, Resolution>,
    applied: bool,
    download: &DownloadSender,
) -> Result<u64, SyncError> {
    let mut download_rows = 0;
    for table in scripts.download_tables() {
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
        })
        .collect();
        transaction
            .read_cursors(&cursors, &mut filter, download)
            .await?;
        download.send(filter.conflict_upserts()).await?;
        download_rows += filter.rows_sent;
    }
    Ok(download_rows)
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
