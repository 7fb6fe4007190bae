//! The database stage: wait for a worker (preferring one that last served the same
//! script version), decode the upload from its spool, run the sync's transaction while
//! a task encodes the download into its spool, release the worker. A download
//! acknowledgement is recorded here too.

use std::sync::Arc;
use std::time::Duration;

use rowsync_consolidated::{
    download_channel, Consolidated, ConsolidatedConnection, DownloadAckRequest, DownloadMessage,
    SyncError, SyncOutcome, SyncRequest,
};
use rowsync_protocol::{
    message_frames, ErrorCode, FrameDecoder, Message, TableUpload, WireError, PREAMBLE_BYTES,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::ServerConfig;
use crate::download_frames::{check_values, chunk_messages};
use crate::failure::Failure;
use crate::metrics::{Phase, PhaseTimings};
use crate::pool::Worker;
use crate::session::MergedTables;
use crate::shared::Shared;
use crate::spool::{Spool, SpoolError};
use crate::stage::stream::{upload_decoder, Acknowledgement, CheckedUpload};

/// What the database stage hands on: the committed sync and its whole download, spooled
/// (the end of the download not yet appended).
pub(crate) struct Synchronized {
    pub(crate) request: Arc<SyncRequest>,
    pub(crate) outcome: SyncOutcome,
    pub(crate) spool: Spool,
    /// The preamble that opens the reply, if the client sent one.
    pub(crate) preamble: Option<[u8; PREAMBLE_BYTES]>,
    /// Bytes of the upload received on the wire, for the sync's log line.
    pub(crate) wire_bytes_received: u64,
}

/// Takes a worker, decodes the upload, runs the sync's transaction and releases the
/// worker; the phases `worker_wait`, `upload_applied` and `download_fetched`.
pub(crate) async fn synchronize<B: Consolidated>(
    shared: &Shared<B>,
    upload: CheckedUpload,
    timings: &mut PhaseTimings,
) -> Result<Synchronized, Failure> {
    let config = &shared.config;
    let metrics = &shared.metrics;
    let CheckedUpload {
        hello,
        user,
        upload_sequence,
        spool: upload_spool,
        mut outbound,
        wire_bytes_received,
    } = upload;
    // The download is encoded into its spool while the worker reads it.
    let (sender, chunks) = download_channel();
    let preamble = outbound.take_preamble();
    let spool = Spool::new(
        config.download_spool_memory_bytes_max,
        config.download_bytes_max,
        outbound,
        Arc::clone(&shared.cache),
    );
    let spooling = spool_download(chunks, spool, config);
    let waiting = Instant::now();
    let mut worker = shared
        .pool
        .acquire(&hello.script_version)
        .await
        .map_err(database_failure)?;
    timings.record(metrics, Phase::worker_wait, waiting.elapsed());
    // The upload is decoded from its spool only now, so syncs waiting for a worker hold
    // it encoded (and spilled when the cache is full), never twice.
    let tables = assemble_upload(upload_spool, upload_decoder(config))
        .await
        .map_err(|error| Failure::tell(WireError::new(ErrorCode::Protocol, error.to_string())))?;
    let request = Arc::new(SyncRequest {
        client_id: hello.client_id,
        user,
        script_version: hello.script_version,
        last_download_watermark: hello.last_download_watermark,
        upload_sequence,
        tables,
        auth_parameters: hello.auth_parameters,
    });
    let working = Instant::now();
    let outcome = worker
        .connection()
        .synchronize(Arc::clone(&request), sender)
        .await;
    let spooled = spooling
        .await
        .map_err(|error| Failure::tell(WireError::new(ErrorCode::Internal, error.to_string())))?;
    let (outcome, spool) = settle(worker, outcome, spooled)?;
    record_committed(shared, timings, &outcome, working.elapsed());
    Ok(Synchronized {
        request,
        outcome,
        spool,
        preamble,
        wire_bytes_received,
    })
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

/// The task that encodes the backend's download chunks into frames and spools them; it
/// answers the backend's end of download only once the spool holds all of it.
fn spool_download(
    mut chunks: mpsc::Receiver<DownloadMessage>,
    mut spool: Spool,
    config: &ServerConfig,
) -> JoinHandle<Result<Spool, SpoolError>> {
    let message_bytes_max = config.download_message_bytes_max;
    let value_bytes_max = config.value_bytes_max;
    tokio::spawn(async move {
        while let Some(message) = chunks.recv().await {
            match message {
                DownloadMessage::Chunk(chunk) => {
                    check_values(&chunk, value_bytes_max)?;
                    for message in chunk_messages(chunk, message_bytes_max) {
                        // A row larger than a message is alone in its message; its
                        // large values go first, in pieces, each freed once sent.
                        for frame in message_frames(Message::Download(message), message_bytes_max) {
                            spool.append(&frame).await?;
                        }
                    }
                }
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
        Ok::<Spool, SpoolError>(spool)
    })
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
                _ => WireError::new(error.code(), error.to_string()),
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
        SpoolError::ValueTooLarge { .. } => ErrorCode::UploadTooLarge,
        _ => ErrorCode::Internal,
    };
    WireError::new(code, error.to_string())
}

/// Decodes the spooled byte stream again and merges its upload messages by table.
async fn assemble_upload(
    spool: Spool,
    mut decoder: FrameDecoder,
) -> Result<Vec<TableUpload>, SpoolError> {
    let mut tables = MergedTables::default();
    spool
        .drain(|piece| {
            decoder.feed(piece);
            while let Some(message) = decoder
                .next_message()
                .map_err(|error| SpoolError::Decode(error.to_string()))?
            {
                if let Message::Upload(upload) = message {
                    tables
                        .merge(upload)
                        .map_err(|error| SpoolError::Decode(error.message.clone()))?;
                }
            }
            Ok(())
        })
        .await?;
    Ok(tables.into_tables())
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
