//! The sync algorithm, once for every backend: one sync's transaction in the order of
//! MobiLink's events, over the primitives of [`crate::dialect`].
//!
//! ```text
//! begin_synchronization
//!   begin_upload                     (not for an upload applied before)
//!     per table: upload_insert, upload_update, upload_delete (set or row scripts,
//!                handle_error per failing row), conflicts found set-wise,
//!                resolve_conflict, upload_fetch (server wins)
//!   end_upload
//!   key_range                        (per table the client runs low on keys of, v7)
//!   user_groups                      (per group-rule table: the client's groups kept)
//!   modify_next_last_download        (the watermark)
//!   begin_download
//!     per table: download_delete_cursor, download_cursor (echoes left out by the
//!                default cursors where the upload is all the sync wrote, else filtered)
//!   end_download
//!   the subscription recorded
//! end_synchronization
//! commit once the server holds the whole download
//! ```

mod apply;
mod download;
mod groups;
mod key_ranges;
mod refused;
mod rows;
mod streams;
mod upload;

pub use streams::GID_PREFIX;

use std::time::Instant;

use rowsync_protocol::{SyncSummary, Value};

use crate::dialect::{Dialect, EndStep, Subscription, SubscriptionUpdate, SyncBackend};
use crate::parameters::{error_parameters, Parameters};
use crate::scripts::*;
use crate::shape::partition_value_refusal;
use crate::version_scripts::{single_integer, Scripts};
use crate::{DownloadSender, SyncError, SyncOutcome, SyncRequest};
use streams::StreamSet;

/// Attempts of one sync's transaction when it meets a failure the backend says may
/// pass (a concurrent insert of the same key, a serialization failure, a deadlock);
/// each attempt starts from scratch.
pub const SYNC_ATTEMPTS_MAX: u32 = 3;

/// Runs one sync with the version's `scripts` (loaded before, so a script changed
/// meanwhile is used from the next sync on), retrying from scratch what may pass
/// while no part of the download has left; after a failure, `report_error` runs in a
/// transaction of its own. A large upload is applied over the backend's apply streams
/// (`streams`); when an attempt that used them fails, the upload is applied again on
/// one stream (not counted as an attempt), as SubscriptionStreams does.
pub async fn sync_with_retries<B: SyncBackend>(
    backend: &mut B,
    scripts: &Scripts,
    request: &SyncRequest,
    download: &DownloadSender,
) -> Result<SyncOutcome, SyncError> {
    let mut attempt = 1;
    let mut stream_count = backend.apply_streams_for(request.upload_operation_count());
    let error = loop {
        match attempt_sync(backend, stream_count, scripts, request, download).await {
            Ok(outcome) => return Ok(outcome),
            // Found with the client's lock, before anything ran: the backend starts
            // the sync again with the current scripts.
            Err(failed) if matches!(failed.error, SyncError::ScriptsChanged { .. }) => {
                return Err(failed.error)
            }
            Err(failed) if failed.streams_used && download.chunks_sent() == 0 => {
                tracing::warn!(error = %failed.error, stream_count,
                    "an attempt over apply streams failed: applying the upload on one stream");
                stream_count = 1;
            }
            Err(failed)
                if attempt < SYNC_ATTEMPTS_MAX
                    && download.chunks_sent() == 0
                    && backend.may_retry(&failed.error) =>
            {
                tracing::debug!(error = %failed.error, attempt, "retrying the sync transaction");
                attempt += 1;
            }
            Err(failed) => break failed.error,
        }
    };
    let error = name_refused_rows(backend, scripts, request, error).await;
    backend.after_failure();
    if let Err(report_failure) = report_error(backend, scripts, request, &error).await {
        tracing::error!(%report_failure, sync_error = %error, "report_error failed");
    }
    Err(error)
}

/// Protocol v6: when the upload failed for some of its rows, at most
/// `request.refused_rows_max` of them, the sync's error names them all
/// (`SyncError::RowsRefused`); otherwise it stays the first row's error.
async fn name_refused_rows<B: SyncBackend>(
    backend: &mut B,
    scripts: &Scripts,
    request: &SyncRequest,
    error: SyncError,
) -> SyncError {
    let rows_max = request.refused_rows_max;
    if rows_max == 0 || !refused::may_name_rows(&error) {
        return error;
    }
    match refused::find_refused(backend, scripts, request, rows_max).await {
        Ok(rows) if !rows.is_empty() && rows.len() as u64 <= rows_max => SyncError::RowsRefused {
            rows,
            first: Box::new(error),
        },
        Ok(rows) => {
            tracing::debug!(refused = rows.len(), rows_max, "refused rows not named");
            error
        }
        Err(search) => {
            tracing::warn!(%search, sync_error = %error, "looking for the refused rows failed");
            error
        }
    }
}

/// A failed attempt, and whether it applied over apply streams.
struct AttemptFailed {
    error: SyncError,
    streams_used: bool,
}

/// One attempt over `stream_count` apply streams (this connection's included), with the
/// other connections taken from the backend for it and given back after.
async fn attempt_sync<B: SyncBackend>(
    backend: &mut B,
    stream_count: usize,
    scripts: &Scripts,
    request: &SyncRequest,
    download: &DownloadSender,
) -> Result<SyncOutcome, AttemptFailed> {
    let mut connections = match stream_count {
        0 | 1 => Vec::new(),
        count => backend.take_streams(count - 1).await,
    };
    let mut streams = StreamSet::new(&mut connections);
    let result = attempt_with_streams(backend, &mut streams, scripts, request, download).await;
    let streams_used = streams.used();
    if !connections.is_empty() {
        backend.return_streams(connections, result.is_ok());
    }
    result.map_err(|error| AttemptFailed {
        error,
        streams_used,
    })
}

/// The whole sync in one transaction (and, when the upload went over apply streams,
/// their prepared transactions), committed once the server holds the whole download,
/// or rolled back (and its locks released) before the failure is told.
async fn attempt_with_streams<B: SyncBackend>(
    backend: &mut B,
    streams: &mut StreamSet<'_, B>,
    scripts: &Scripts,
    request: &SyncRequest,
    download: &DownloadSender,
) -> Result<SyncOutcome, SyncError> {
    let started = Instant::now();
    let mut transaction = backend.begin().await?;
    let mut result = run_events(
        &mut transaction,
        streams,
        scripts,
        request,
        download,
        started,
    )
    .await;
    if let (Ok(_), Some(group)) = (&result, streams.prepared_group()) {
        crate::failpoint!("streams_prepared");
        result = match transaction.record_decision(group).await {
            Ok(true) => result,
            Ok(false) => Err(SyncError::StreamsRolledBack {
                group: group.to_string(),
            }),
            Err(error) => Err(error),
        };
    }
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(error) => {
            // Waiting for the rollback frees the client's lock before anyone hears of
            // the failure: a retry at once is not told the client is still syncing.
            if let Err(rollback) = transaction.rollback().await {
                tracing::debug!(%rollback, "rolling back a failed sync");
            }
            streams.finish(false).await;
            return Err(error);
        }
    };
    let group = streams.prepared_group().is_some();
    if let Err(error) = transaction.commit().await {
        streams.resolve_unknown().await;
        return Err(error);
    }
    crate::failpoint!("after_commit");
    if group {
        crate::failpoint!("streams_decided");
        // The decision stays until cleanup drops it (no round trip on the sync's path).
        streams.finish(true).await;
    }
    Ok(outcome)
}

/// The sync's events in MobiLink's order, in the open transaction.
async fn run_events<D: Dialect, B: SyncBackend>(
    transaction: &mut D,
    streams: &mut StreamSet<'_, B>,
    scripts: &Scripts,
    request: &SyncRequest,
    download: &DownloadSender,
    started: Instant,
) -> Result<SyncOutcome, SyncError> {
    if !transaction.lock_client(&request.client_id).await? {
        return Err(SyncError::AlreadySynchronizing {
            client_id: request.client_id.clone(),
        });
    }
    let subscription = transaction.subscription(&request.client_id).await?;
    if subscription.is_none() {
        check_client_ids_of_user(transaction, request).await?;
    }
    let applied_sequence = applied_sequence(request, subscription.as_ref())?;
    check_identity(request, subscription.as_ref())?;
    check_sync_tables(scripts, request)?;
    let mut parameters = Parameters::for_request(request)?;
    parameters.last_sync_xid = last_sync_xid(request, subscription.as_ref());
    let upload_already_applied = parameters.upload_sequence <= applied_sequence;
    let sync = apply::SyncContext {
        scripts,
        parameters: &parameters,
        apply: !upload_already_applied,
    };
    transaction
        .run_event(scripts, BEGIN_SYNCHRONIZATION, &parameters)
        .await?;
    crate::failpoint!("before_apply");
    let uploaded = upload::apply_upload(transaction, streams, &sync, request).await?;
    // Before anything is sent: a concurrent sync that took the same range first fails
    // this attempt on the range's key, and the attempt is retried.
    let key_ranges = key_ranges::hand_out(transaction, scripts, &parameters, request).await?;
    // Also for an upload applied before: its client may not have applied that sync's
    // download, and must learn which of its changes lost before this one overwrites them.
    download::send_conflicts(request, &uploaded.resolutions, download).await?;
    let apply_time = started.elapsed();
    let previous_download = match request.sync_tables.is_whole() {
        true => subscription.as_ref().map_or(0, |s| s.download_watermark),
        // The client's tables were last downloaded at different watermarks: a group
        // change stamped with a table's own counts as not delivered (`groups`), so it
        // is sent again rather than missed.
        false => i64::MAX,
    };
    let mut watermark =
        watermark_and_groups(transaction, scripts, &parameters, previous_download).await?;
    transaction
        .run_event(scripts, BEGIN_DOWNLOAD, &parameters)
        .await?;
    let of = download::DownloadOf {
        scripts,
        parameters: &parameters,
        request,
        resolutions: &uploaded.resolutions,
        applied: sync.apply,
        watermark,
    };
    let sent = download::stream_download(transaction, &of, download).await?;
    let download_rows = sent.rows;
    if let Some(cap) = sent.watermark_cap {
        watermark = watermark.min(cap);
    }
    end_events(transaction, scripts, &parameters, request, watermark).await?;
    // The server must hold the whole download before the upload is committed.
    download.finish().await?;
    Ok(SyncOutcome {
        download_rows,
        key_ranges,
        watermark,
        apply_time,
        summary: SyncSummary {
            rows_uploaded: request.upload_operation_count(),
            conflicts: uploaded.conflicts,
            upload_already_applied,
        },
    })
}

/// Records the subscription, then runs the scripts after the cursors (`end_download`,
/// `end_synchronization`). It is recorded first so that a backend can tell what those
/// scripts write apart from what the client now has: the client's next sync must bring
/// it, not skip it as this sync's own (`:last_sync_xid`). None of these steps reads what
/// another returns: a backend may send them at once (`Dialect::run_end_steps`).
async fn end_events<D: Dialect>(
    transaction: &mut D,
    scripts: &Scripts,
    parameters: &Parameters<'_>,
    request: &SyncRequest,
    watermark: i64,
) -> Result<(), SyncError> {
    let late_scripts = [END_DOWNLOAD, END_SYNCHRONIZATION]
        .iter()
        .any(|event| scripts.connection_event(event).is_some());
    let mut steps = vec![EndStep::Subscription(SubscriptionUpdate {
        client_id: &request.client_id,
        user: &request.user,
        script_version: &request.script_version,
        upload_sequence: parameters.upload_sequence,
        upload_transfer_id: request.transfer_id.as_deref(),
        download_watermark: watermark,
        download_acknowledged: request.last_download_watermark,
        late_scripts,
    })];
    if late_scripts {
        steps.push(EndStep::LateScriptsBegin);
    }
    steps.push(EndStep::Event(END_DOWNLOAD));
    steps.push(EndStep::Event(END_SYNCHRONIZATION));
    if late_scripts {
        steps.push(EndStep::LateScriptsEnd(&request.client_id));
    }
    transaction.run_end_steps(scripts, parameters, &steps).await
}

/// The upload sequence this client already had applied: a client id belongs to the
/// first user that synced with it. Refuses an upload naming one table twice, and a
/// sequence that is 0 or more than one above the last applied (a client's first upload
/// is 1): accepted, such a sequence would be answered as applied without applying
/// anything, or would make every later upload of the client id look applied.
fn applied_sequence(
    request: &SyncRequest,
    subscription: Option<&Subscription>,
) -> Result<i64, SyncError> {
    let mut tables = std::collections::HashSet::new();
    for upload in &request.tables {
        if !tables.insert(upload.table.as_str()) {
            return Err(SyncError::Schema(format!(
                "table {:?} appears twice in one upload",
                upload.table
            )));
        }
    }
    let applied = match subscription {
        Some(found) if found.user_name != request.user => {
            return Err(SyncError::ClientIdTaken {
                client_id: request.client_id.clone(),
            })
        }
        Some(found) => found.upload_sequence,
        None => 0,
    };
    let applied_unsigned = u64::try_from(applied).unwrap_or(0);
    let expected = applied_unsigned.saturating_add(1);
    if request.upload_sequence == 0 || request.upload_sequence > expected {
        return Err(SyncError::UploadSequence {
            client_id: request.client_id.clone(),
            sequence: request.upload_sequence,
            applied: applied_unsigned,
            expected,
        });
    }
    Ok(applied)
}

/// Refuses an upload that cannot come from the database the subscription knows, before
/// anything is applied. A client of protocol v5 keeps an upload's transfer id until the
/// upload is acknowledged, so its upload under the sequence applied last is that very
/// transfer, and it never sends a sequence below it. Another transfer id there: a copy
/// of the database synced under the same client id (`ClientCopied`); a sequence below:
/// the database is behind acknowledgements the server gave, restored from a backup or a
/// copy the other copy synced past (`ClientRestored`). Either takes a new client id.
/// Older clients, and an upload applied without a transfer id, are not checked.
fn check_identity(
    request: &SyncRequest,
    subscription: Option<&Subscription>,
) -> Result<(), SyncError> {
    let Some(found) = subscription.filter(|_| request.check_identity) else {
        return Ok(());
    };
    let applied = u64::try_from(found.upload_sequence).unwrap_or(0);
    if request.upload_sequence < applied {
        return Err(SyncError::ClientRestored {
            client_id: request.client_id.clone(),
            sequence: request.upload_sequence,
            applied,
        });
    }
    let applied_as = found.upload_transfer_id.as_deref();
    let sent_as = request.transfer_id.as_deref();
    if request.upload_sequence == applied && applied_as.is_some() && applied_as != sent_as {
        return Err(SyncError::ClientCopied {
            client_id: request.client_id.clone(),
            sequence: request.upload_sequence,
        });
    }
    Ok(())
}

/// Refuses a new client id of a user who already has `client_ids_per_user_max` (each
/// subscription holds tombstones back for everyone until it syncs again). Syncs of new
/// client ids of one user running at the same moment may each pass, so the limit can be
/// exceeded by at most the number of such syncs at once.
async fn check_client_ids_of_user<D: Dialect>(
    transaction: &mut D,
    request: &SyncRequest,
) -> Result<(), SyncError> {
    let Some(limit) = request.client_ids_per_user_max else {
        return Ok(());
    };
    let count = transaction.client_ids_of_user(&request.user, limit).await?;
    if count >= limit {
        return Err(SyncError::ClientIdsExceeded {
            user: request.user.clone(),
            client_id: request.client_id.clone(),
            limit,
        });
    }
    Ok(())
}

/// A client that comes back with exactly the watermark of its previous sync applied
/// that sync's download, so it holds every row that sync's transaction wrote: the
/// default cursors may skip them (`:last_sync_xid`).
fn last_sync_xid(request: &SyncRequest, subscription: Option<&Subscription>) -> i64 {
    if !request.sync_tables.is_whole() {
        // Some tables were not in that sync's download, or in one since.
        return 0;
    }
    match subscription {
        Some(found) if found.download_watermark == request.last_download_watermark => {
            found.last_sync_xid
        }
        _ => 0,
    }
}

/// Refuses a sync naming a table its version does not synchronize (protocol v9), or
/// covering a subset of tables while uploading another: nothing is applied.
fn check_sync_tables(scripts: &Scripts, request: &SyncRequest) -> Result<(), SyncError> {
    let named = &request.sync_tables.watermarks;
    for table in named {
        scripts.check_synchronizes(&table.table)?;
    }
    if !request.sync_tables.only_these {
        return Ok(());
    }
    match request
        .tables
        .iter()
        .find(|upload| !named.iter().any(|table| table.table == upload.table))
    {
        Some(outside) => Err(SyncError::Schema(format!(
            "the upload holds changes to table {:?}, which this sync does not cover: \
             a sync of some tables uploads the changes of those tables only",
            outside.table
        ))),
        None => Ok(()),
    }
}

/// The client's groups kept (`groups`), then the watermark (above every one before when
/// the groups changed), then the changes stamped with it.
async fn watermark_and_groups<D: Dialect>(
    transaction: &mut D,
    scripts: &Scripts,
    parameters: &Parameters<'_>,
    previous_download: i64,
) -> Result<i64, SyncError> {
    let changed = groups::record(transaction, scripts, parameters, previous_download).await?;
    if !changed.is_empty() {
        transaction.advance_watermark().await?;
    }
    let watermark = next_watermark(transaction, scripts, parameters).await?;
    groups::stamp(transaction, scripts, parameters, &changed, watermark).await?;
    Ok(watermark)
}

/// The watermark, taken before the download is read (the cursors' later snapshots see
/// every transaction below it), as `modify_next_last_download` may change it.
async fn next_watermark<D: Dialect>(
    transaction: &mut D,
    scripts: &Scripts,
    parameters: &Parameters<'_>,
) -> Result<i64, SyncError> {
    let watermark = transaction.watermark().await?;
    let next = parameters.with(vec![("next_last_download", Value::Int(watermark))]);
    let modified = transaction
        .run_event(scripts, MODIFY_NEXT_LAST_DOWNLOAD, &next)
        .await?;
    Ok(single_integer(modified, MODIFY_NEXT_LAST_DOWNLOAD)?.unwrap_or(watermark))
}

/// Refuses a sync whose user is no value of `table`'s partition column `column`
/// (`shape::partition_value_refusal`); a table without one is anyone's.
async fn check_partition_value<D: Dialect>(
    transaction: &mut D,
    table: &str,
    column: Option<&str>,
    user: &str,
) -> Result<(), SyncError> {
    let Some(column) = column else {
        return Ok(());
    };
    match transaction
        .partition_value_misfit(table, column, user)
        .await?
    {
        None => Ok(()),
        Some(type_name) => Err(SyncError::Schema(partition_value_refusal(
            user, table, column, &type_name,
        ))),
    }
}

/// `report_error` after a failed sync, in its own committed transaction (the sync's
/// was rolled back), so what it records stays.
async fn report_error<B: SyncBackend>(
    backend: &mut B,
    scripts: &Scripts,
    request: &SyncRequest,
    error: &SyncError,
) -> Result<(), SyncError> {
    if scripts.connection_event(REPORT_ERROR).is_none() {
        return Ok(());
    }
    let parameters = Parameters::for_request(request)?.with(error_parameters(error));
    let mut transaction = backend.begin().await?;
    transaction
        .run_event(scripts, REPORT_ERROR, &parameters)
        .await?;
    transaction.commit().await
}
