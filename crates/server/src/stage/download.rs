//! The download stage: after the worker is released, the end of the download joins its
//! spool and all of it is sent, each write within the write timeout; a download
//! acknowledgement is confirmed by echoing it.

use std::sync::Arc;

use rowsync_consolidated::Consolidated;
use rowsync_protocol::{encode_frame, DownloadAck, ErrorCode, Message, WireError, PREAMBLE_BYTES};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::download_frames::end_frame;
use crate::failure::Failure;
use crate::metrics::{Phase, PhaseTimings};
use crate::monitor::SyncFacts;
use crate::shared::Shared;
use crate::spool::Spool;
use crate::stage::database::Synchronized;
use crate::stage::stream::Acknowledgement;

/// Appends the end of the download and sends the whole spool; the phase
/// `download_sent`. Returns the sync's log line.
pub(crate) async fn send_download<B: Consolidated>(
    stream: &mut (impl AsyncWrite + Unpin),
    shared: &Shared<B>,
    synchronized: Synchronized,
    timings: &mut PhaseTimings,
) -> Result<String, Failure> {
    let Synchronized {
        request,
        outcome,
        mut spool,
        preamble,
        wire_bytes_received,
    } = synchronized;
    // The worker is released: the end of the download joins the spool, then all of it
    // is sent while the worker serves others.
    let ended = async {
        spool.append(&end_frame(&outcome)).await?;
        spool.finish().await
    }
    .await;
    if let Err(spool_error) = ended {
        return Err(Failure::tell(WireError::new(
            ErrorCode::Internal,
            spool_error.to_string(),
        )));
    }
    let summary = format!(
        "client {:?} user {:?}: {} rows up ({} bytes received), {} rows down ({} bytes, {} sent{}), {} conflicts{}",
        request.client_id,
        request.user,
        outcome.summary.rows_uploaded,
        wire_bytes_received,
        outcome.download_rows,
        spool.bytes(),
        spool.wire_bytes(),
        if spool.spilled() {
            ", spilled to disk"
        } else {
            ""
        },
        outcome.summary.conflicts,
        if outcome.summary.upload_already_applied {
            ", upload already applied"
        } else {
            ""
        },
    );
    timings.facts = SyncFacts {
        rows_uploaded: outcome.summary.rows_uploaded,
        rows_downloaded: outcome.download_rows,
        bytes_received: wire_bytes_received,
        bytes_sent: spool.wire_bytes(),
        conflicts: outcome.summary.conflicts,
        upload_already_applied: outcome.summary.upload_already_applied,
    };
    let sending = Instant::now();
    let sent = send_spool(stream, shared, preamble, spool).await;
    timings.record(&shared.metrics, Phase::download_sent, sending.elapsed());
    if let Err(error) = sent {
        return Err(Failure::silent(format!(
            "sending the download failed after commit: {error}"
        )));
    }
    Ok(summary)
}

/// Confirms a recorded download acknowledgement by echoing it. Returns the log line.
pub(crate) async fn confirm_acknowledgement<B: Consolidated>(
    stream: &mut (impl AsyncWrite + Unpin),
    shared: &Shared<B>,
    acknowledgement: Acknowledgement,
) -> Result<String, Failure> {
    let Acknowledgement {
        hello,
        watermark,
        outbound,
        ..
    } = acknowledgement;
    let answer = Message::DownloadAck(DownloadAck { watermark });
    answer_exchange(stream, shared, outbound, answer).await?;
    Ok(format!(
        "client {:?} acknowledged the download up to {watermark}",
        hello.client_id
    ))
}

/// Sends the one message that answers a short exchange (an acknowledgement, a question
/// about a held transfer), compressed as the client asked.
pub(crate) async fn answer_exchange<B: Consolidated>(
    stream: &mut (impl AsyncWrite + Unpin),
    shared: &Shared<B>,
    mut outbound: rowsync_protocol::Outbound,
    answer: Message,
) -> Result<(), Failure> {
    let preamble = outbound.take_preamble();
    let mut spool = Spool::new(
        shared.config.download_spool_memory_bytes_max,
        shared.config.download_bytes_max,
        outbound,
        Arc::clone(&shared.cache),
    );
    let reply = async {
        spool.append(&encode_frame(&answer)).await?;
        spool.finish().await
    }
    .await;
    reply.map_err(|error| Failure::tell(WireError::new(ErrorCode::Internal, error.to_string())))?;
    send_spool(stream, shared, preamble, spool)
        .await
        .map_err(|error| Failure::silent(format!("sending the answer failed: {error}")))
}

/// Sends the preamble (if any) and everything spooled; each write must progress within
/// the write timeout.
async fn send_spool<B: Consolidated>(
    stream: &mut (impl AsyncWrite + Unpin),
    shared: &Shared<B>,
    preamble: Option<[u8; PREAMBLE_BYTES]>,
    spool: Spool,
) -> std::io::Result<()> {
    let write_timeout = shared.config.write_timeout;
    let stopped =
        || std::io::Error::new(std::io::ErrorKind::TimedOut, "the client stopped reading");
    if let Some(preamble) = preamble {
        tokio::time::timeout(write_timeout, stream.write_all(&preamble))
            .await
            .map_err(|_| stopped())??;
    }
    spool.send_to(stream, write_timeout).await?;
    tokio::time::timeout(write_timeout, stream.flush())
        .await
        .map_err(|_| stopped())?
}
