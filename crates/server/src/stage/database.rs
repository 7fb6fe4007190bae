//! The database stage: wait for a worker (preferring one that last served the same
//! script version), decode the upload from its spool, run the sync's transaction while
//! a task encodes the download into its spool, release the worker. A download
//! acknowledgement is recorded here too.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rowsync_consolidated::{
    download_channel, Canceller, Consolidated, ConsolidatedConnection, DownloadAckRequest,
    DownloadMessage, SyncError, SyncOutcome, SyncRequest,
};
use rowsync_protocol::{
    ErrorCode, FrameDecoder, Hello, KeyRange, Message, TableUpload, WireError,
    CONFLICTS_SINCE_VERSION, DOWNLOAD_RESUME_SINCE_VERSION, IDENTITY_SINCE_VERSION,
    KEY_RANGES_SINCE_VERSION, REFUSED_ROWS_SINCE_VERSION,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::ServerConfig;
use crate::download_frames::{check_values, chunk_messages, conflict_frames, message_frames_for};
use crate::failure::Failure;
use crate::held::Transfer;
use crate::metrics::{Phase, PhaseTimings};
use crate::pool::Worker;
use crate::record::DownloadDigest;
use crate::session::MergedTables;
use crate::shared::Shared;
use crate::spool::{Spool, SpoolError};
use crate::stage::stream::{Acknowledgement, CheckedUpload};
use crate::stage::{download_spool, Synchronized};
use crate::upload_stream::{upload_decoder, UploadLimits};

/// A compressed resumable download (protocol v4) is flushed after this many bytes of its
/// frames, as the client flushes a resumable upload.
pub(crate) const RESUMABLE_DOWNLOAD_FLUSH_BYTES: usize = 32 * 1024;

/// Takes a worker, decodes the upload, runs the sync's transaction and releases the
/// worker; the phases `worker_wait`, `upload_applied` and `download_fetched`.
pub(crate) async fn run_on_worker<B: Consolidated>(
    shared: &Shared<B>,
    upload: CheckedUpload,
    timings: &mut PhaseTimings,
    client_gone: impl Future<Output = ()>,
) -> Result<Synchronized, Failure> {
    let config = &shared.config;
    let metrics = &shared.metrics;
    let CheckedUpload {
        hello,
        user,
        upload_sequence,
        spool: upload_spool,
        outbound,
        wire_bytes_received,
        transfer,
        session_token,
    } = upload;
    // The download is encoded into its spool while the worker reads it.
    let (sender, chunks) = download_channel();
    let sender = match &shared.shared_downloads {
        Some(kept) => sender.with_shared_downloads(Arc::clone(kept)),
        None => sender,
    };
    let (preamble, mut spool) = download_spool(shared, outbound);
    if hello.protocol_version >= DOWNLOAD_RESUME_SINCE_VERSION {
        // A cut costs at most this much more than the bytes in flight.
        spool.flush_every(RESUMABLE_DOWNLOAD_FLUSH_BYTES);
    }
    let framing = DownloadFraming::new(config, &hello, timings.recording.is_some());
    let spooling = spool_download(chunks, spool, framing);
    let waiting = Instant::now();
    let mut worker = shared
        .pool
        .acquire(&hello.script_version)
        .await
        .map_err(database_failure)?;
    timings.record(metrics, Phase::worker_wait, waiting.elapsed());
    // The upload is decoded from its spool only now, so syncs waiting for a worker hold
    // it encoded (and spilled when the cache is full), never twice.
    let assembled = assemble_upload(upload_spool, upload_decoder(&UploadLimits::of(config)))
        .await
        .map_err(|error| Failure::tell(WireError::new(ErrorCode::Protocol, error.to_string())))?;
    let request = Arc::new(sync_request(
        config,
        hello,
        user,
        upload_sequence,
        transfer,
        assembled,
    ));
    let working = Instant::now();
    let canceller = worker.connection().canceller();
    let raced = {
        let transaction = worker
            .connection()
            .run_sync_transaction(Arc::clone(&request), sender);
        tokio::select! {
            outcome = transaction => Some(outcome),
            () = client_gone => None,
        }
    };
    let Some(outcome) = raced else {
        return Err(cancelled(worker, canceller).await);
    };
    let spooled = spooled_download(spooling, timings).await?;
    let (outcome, spool) = settle(worker, outcome, spooled)?;
    record_committed(shared, timings, &outcome, working.elapsed());
    Ok(Synchronized {
        request,
        outcome,
        spool,
        preamble,
        wire_bytes_received,
        session_token,
    })
}

/// What the backend runs: the upload as assembled, with the limits and the protocol
/// features of the client's version.
fn sync_request(
    config: &ServerConfig,
    hello: Hello,
    user: String,
    upload_sequence: u64,
    transfer: Option<Transfer>,
    assembled: AssembledUpload,
) -> SyncRequest {
    SyncRequest {
        client_id: hello.client_id,
        user,
        script_version: hello.script_version,
        last_download_watermark: hello.last_download_watermark,
        upload_sequence,
        tables: assembled.tables,
        auth_parameters: hello.auth_parameters,
        client_ids_per_user_max: config.client_ids_per_user_max,
        transfer_id: transfer.map(|transfer| transfer.transfer_id),
        check_identity: hello.protocol_version >= IDENTITY_SINCE_VERSION,
        refused_rows_max: match hello.protocol_version >= REFUSED_ROWS_SINCE_VERSION {
            true => config.refused_rows_max,
            false => 0,
        },
        key_ranges: (hello.protocol_version >= KEY_RANGES_SINCE_VERSION)
            .then_some(assembled.key_ranges),
        sync_tables: hello.tables,
    }
}

/// The client went away while its sync ran: the statement running is cancelled (a
/// re-check of a large upload applied before, a script waiting for a lock) and the
/// worker's connection, its transaction never committed, is discarded.
async fn cancelled<B: Consolidated>(worker: Worker<B>, canceller: Canceller) -> Failure {
    let cancel = canceller.cancel().await;
    worker.discard();
    let how = match cancel {
        Ok(()) => "its database work was cancelled".to_string(),
        Err(error) => format!("cancelling its database work failed: {error}"),
    };
    Failure::silent(format!(
        "the client closed the connection before its download; {how}"
    ))
}

/// A committed sync's database phases (`database_time` split at the end of the apply),
/// and its rows into the load estimate and the counters.
fn record_committed<B: Consolidated>(
    shared: &Shared<B>,
    timings: &mut PhaseTimings,
    outcome: &SyncOutcome,
    database_time: Duration,
) {
    let metrics = &shared.metrics;
    let applied = outcome.apply_time.min(database_time);
    timings.record(metrics, Phase::upload_applied, applied);
    timings.record(metrics, Phase::download_fetched, database_time - applied);
    shared
        .load
        .completed(outcome.summary.rows_uploaded + outcome.download_rows);
    metrics.rows_uploaded.inc_by(outcome.summary.rows_uploaded);
    metrics.rows_downloaded.inc_by(outcome.download_rows);
}

/// How the download is framed for one client.
#[derive(Clone, Copy)]
struct DownloadFraming {
    message_bytes_max: usize,
    /// The client speaks a protocol version that has `Conflicts` messages.
    name_conflicts: bool,
    /// A checksum of the download's rows is kept (the sync is recorded).
    digest: bool,
    /// The session's version: a v1 client gets v2 values in their v1 form, and no
    /// value in pieces.
    protocol_version: u16,
    /// The largest text or blob value sent (in pieces); a larger one refuses the sync.
    value_bytes_max: u64,
}

impl DownloadFraming {
    /// The framing of a download to the client of `hello`; `digest` when the sync is recorded.
    fn new(config: &ServerConfig, hello: &Hello, digest: bool) -> DownloadFraming {
        DownloadFraming {
            message_bytes_max: config.download_message_bytes_max,
            name_conflicts: hello.protocol_version >= CONFLICTS_SINCE_VERSION,
            digest,
            protocol_version: hello.protocol_version,
            value_bytes_max: config.value_bytes_max,
        }
    }
}

/// The task that encodes the backend's download chunks into frames and spools them; it
/// answers the backend's end of download only once the spool holds all of it. With
/// `digest` (the sync is recorded) it also digests the rows.
fn spool_download(
    mut chunks: mpsc::Receiver<DownloadMessage>,
    mut spool: Spool,
    framing: DownloadFraming,
) -> JoinHandle<Result<(Spool, DownloadDigest), SpoolError>> {
    tokio::spawn(async move {
        let mut rows_digest = DownloadDigest::default();
        while let Some(message) = chunks.recv().await {
            match message {
                DownloadMessage::Chunk(chunk) => {
                    if framing.digest {
                        rows_digest.add(&chunk);
                    }
                    check_values(&chunk, framing.value_bytes_max)?;
                    let messages =
                        chunk_messages(chunk, framing.message_bytes_max, framing.protocol_version);
                    for message in messages {
                        // A row larger than a message is alone in its message; to a v2
                        // client its large values go first, in pieces, each freed once sent.
                        for frame in message_frames_for(
                            message,
                            framing.message_bytes_max,
                            framing.protocol_version,
                        ) {
                            spool.append(&frame?).await?;
                        }
                    }
                }
                DownloadMessage::Conflicts(conflicts) if framing.name_conflicts => {
                    for frame in conflict_frames(conflicts, framing.message_bytes_max) {
                        spool.append(&frame).await?;
                    }
                }
                DownloadMessage::Conflicts(_) => {}
                DownloadMessage::Finish(answer) => {
                    let flushed = spool.flush().await;
                    let verdict = match &flushed {
                        Ok(()) => Ok(()),
                        Err(error) => Err(error.to_string()),
                    };
                    let _ = answer.send(verdict);
                    flushed?;
                }
            }
        }
        Ok::<_, SpoolError>((spool, rows_digest))
    })
}

/// The spooling task's end: the download's spool, its rows' digest kept in the sync's
/// recording.
async fn spooled_download(
    spooling: JoinHandle<Result<(Spool, DownloadDigest), SpoolError>>,
    timings: &mut PhaseTimings,
) -> Result<Result<Spool, SpoolError>, Failure> {
    let spooled = spooling
        .await
        .map_err(|error| Failure::tell(WireError::new(ErrorCode::Internal, error.to_string())))?;
    Ok(spooled.map(|(spool, digest)| {
        if let Some(recording) = timings.recording.as_mut() {
            recording.digest = digest;
        }
        spool
    }))
}

/// Releases the worker (discarding its connection after a database error) and joins the
/// transaction's outcome with the spooled download.
fn settle<B: Consolidated>(
    worker: Worker<B>,
    outcome: Result<SyncOutcome, SyncError>,
    spooled: Result<Spool, SpoolError>,
) -> Result<(SyncOutcome, Spool), Failure> {
    match (outcome, spooled) {
        (Ok(outcome), Ok(spool)) => {
            drop(worker);
            Ok((outcome, spool))
        }
        (Err(error), spooled) => {
            if matches!(error, SyncError::Database(_)) {
                worker.discard();
            } else {
                drop(worker);
            }
            // A spool failure (size, disk) is the cause when the backend only saw its
            // receiver go away.
            let wire = match (&error, spooled) {
                (
                    SyncError::DownloadAbandoned | SyncError::DownloadRefused(_),
                    Err(spool_error),
                ) => spool_refusal(spool_error),
                _ => error.to_wire(),
            };
            Err(Failure::tell(wire))
        }
        (Ok(_), Err(spool_error)) => {
            // Committed, but the download cannot be sent: the client retries, and its
            // upload is then acknowledged as already applied.
            drop(worker);
            Err(Failure::tell(spool_refusal(spool_error)))
        }
    }
}

/// What the client hears when the download could not be spooled: a value above
/// `value_bytes_max` is code 5 (not retriable until the limit or the row changes);
/// anything else the server's problem.
fn spool_refusal(error: SpoolError) -> WireError {
    let code = match error {
        SpoolError::ValueTooLarge { .. } | SpoolError::RowTooLarge { .. } => {
            ErrorCode::UploadTooLarge
        }
        _ => ErrorCode::Internal,
    };
    WireError::new(code, error.to_string())
}

/// An upload decoded from its spool: its tables, merged, and the client's key ranges.
struct AssembledUpload {
    tables: Vec<TableUpload>,
    key_ranges: Vec<KeyRange>,
}

/// Decodes the spooled byte stream again and merges its upload messages by table.
async fn assemble_upload(
    spool: Spool,
    mut decoder: FrameDecoder,
) -> Result<AssembledUpload, SpoolError> {
    let mut tables = MergedTables::default();
    let mut key_ranges = Vec::new();
    spool
        .drain(|piece| {
            decoder.feed(piece);
            // Every spooled frame was checked as it arrived (upload_stream).
            while let Some(message) = decoder
                .next_message_prechecked()
                .map_err(|error| SpoolError::Decode(error.to_string()))?
            {
                match message {
                    Message::Upload(upload) => tables
                        .merge(upload)
                        .map_err(|error| SpoolError::Decode(error.message.clone()))?,
                    Message::KeyRanges(held) => key_ranges.extend(held.ranges),
                    _ => {}
                }
            }
            Ok(())
        })
        .await?;
    Ok(AssembledUpload {
        tables: tables.into_tables(),
        key_ranges,
    })
}

/// Records a download acknowledgement on a worker, which runs the `download_ack` script;
/// refused when the watermark is not the last one sent to the client.
pub(crate) async fn record_acknowledgement<B: Consolidated>(
    shared: &Shared<B>,
    acknowledgement: &Acknowledgement,
) -> Result<(), Failure> {
    let Acknowledgement {
        hello,
        user,
        watermark,
        ..
    } = acknowledgement;
    let request = DownloadAckRequest {
        client_id: hello.client_id.clone(),
        user: user.clone(),
        script_version: hello.script_version.clone(),
        watermark: *watermark,
        auth_parameters: hello.auth_parameters.clone(),
    };
    let mut worker = shared
        .pool
        .acquire(&request.script_version)
        .await
        .map_err(database_failure)?;
    let recorded = worker.connection().acknowledge_download(&request).await;
    let recorded = match recorded {
        Ok(recorded) => {
            drop(worker);
            recorded
        }
        Err(error) => {
            if matches!(error, SyncError::Database(_)) {
                worker.discard();
            }
            return Err(Failure::tell(WireError::new(
                error.code(),
                error.to_string(),
            )));
        }
    };
    if !recorded {
        return Err(Failure::tell(WireError::new(
            ErrorCode::Protocol,
            format!(
                "watermark {watermark} is not the last one sent to client {:?}; nothing recorded",
                request.client_id
            ),
        )));
    }
    Ok(())
}

fn database_failure(error: impl std::fmt::Display) -> Failure {
    Failure::tell(WireError::new(
        ErrorCode::Internal,
        format!("consolidated database error: {error}"),
    ))
}
