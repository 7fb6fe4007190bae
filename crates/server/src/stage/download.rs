//! The download stage: after the worker is released, the end of the download joins its
//! spool and all of it is sent, each write within the write timeout; a download
//! acknowledgement is confirmed by echoing it. A protocol v4 download is resumable: when
//! its sending fails, or (TCP and TLS) the client's receipt does not follow it, its
//! stream is held (`held::hold_download`) and a later `download_resume` is answered with
//! the rest.

use std::sync::Arc;

use rowsync_consolidated::Consolidated;
use rowsync_protocol::{encode_frame, DownloadAck, ErrorCode, Message, WireError, PREAMBLE_BYTES};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::download_frames::end_frame;
use crate::failure::Failure;
use crate::metrics::{Phase, PhaseTimings};
use crate::monitor::SyncFacts;
use crate::shared::Shared;
use crate::spool::{Sending, Spool};
use crate::stage::database::Synchronized;
use crate::stage::stream::Acknowledgement;

/// A download the client can resume (protocol v4): held when it may not have arrived.
pub(crate) struct Resumable {
    pub(crate) hello: rowsync_protocol::Hello,
    pub(crate) user: String,
    pub(crate) transfer_id: String,
    /// The client sends a receipt after the download's end (TCP and TLS, where the
    /// server can read after writing; an HTTP request body has ended by then).
    pub(crate) receipt: bool,
}

/// Appends the end of the download and sends the whole spool; the phase
/// `download_sent`. Returns the sync's log line.
pub(crate) async fn send_download<B: Consolidated>(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    shared: &Shared<B>,
    synchronized: Synchronized,
    timings: &mut PhaseTimings,
    resumable: Option<Resumable>,
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
    let sent = match resumable {
        Some(resumable) => send_resumable(stream, shared, preamble, spool, resumable).await,
        None => send_spool(stream, shared, preamble, spool).await,
    };
    timings.record(&shared.metrics, Phase::download_sent, sending.elapsed());
    if let Err(error) = sent {
        return Err(Failure::silent(format!(
            "sending the download failed after commit: {error}"
        )));
    }
    Ok(summary)
}

/// Sends a resumable download, keeping its spool until the client's receipt (or the
/// end of sending, without one); a download the client may lack is held.
async fn send_resumable<B: Consolidated>(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    shared: &Shared<B>,
    preamble: Option<[u8; PREAMBLE_BYTES]>,
    mut spool: Spool,
    resumable: Resumable,
) -> std::io::Result<()> {
    let sent = send_spool_kept(stream, shared, preamble, &mut spool).await;
    let delivered = match &sent {
        Ok(()) if resumable.receipt => {
            receipt(stream, shared, &resumable.transfer_id, spool.bytes()).await
        }
        Ok(()) => true,
        Err(_) => false,
    };
    if !delivered {
        let Resumable {
            hello,
            user,
            transfer_id,
            ..
        } = &resumable;
        crate::held::hold_download(shared, hello, user, transfer_id, spool).await;
    }
    sent
}

/// Answers a `download_resume`: the held download's length and digest, then its stream
/// from the offset asked; released once the client's receipt says it has all of it.
pub(crate) async fn send_held_download<B: Consolidated>(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    shared: &Shared<B>,
    query: crate::stage::stream::DownloadResumeQuery,
    receipt_expected: bool,
) -> Result<String, Failure> {
    let crate::stage::stream::DownloadResumeQuery {
        hello,
        user,
        transfer_id,
        offset,
        outbound,
    } = query;
    let (answer, rest) =
        crate::held::held_download(shared, &hello, &user, &transfer_id, offset).await?;
    let length = answer.length;
    let frame = encode_frame(&Message::DownloadHeld(answer));
    let (preamble, mut spool) = spooled(shared, outbound, &[&frame, &rest]).await?;
    send_spool_kept(stream, shared, preamble, &mut spool)
        .await
        .map_err(|error| Failure::silent(format!("resuming the download failed: {error}")))?;
    if receipt_expected && receipt(stream, shared, &transfer_id, length).await {
        crate::held::release(
            shared,
            rowsync_consolidated::Direction::Download,
            &hello,
            &transfer_id,
        )
        .await;
    }
    Ok(format!(
        "client {:?} resumed the download of transfer {transfer_id:?} at byte {offset} of {length}",
        hello.client_id
    ))
}

/// Whether the client's receipt arrives within the read timeout: a plain
/// `download_resume` frame naming the transfer at the stream's length.
async fn receipt<B: Consolidated>(
    stream: &mut (impl AsyncRead + Unpin),
    shared: &Shared<B>,
    transfer_id: &str,
    length: u64,
) -> bool {
    let mut decoder = rowsync_protocol::FrameDecoder::new(RECEIPT_FRAME_BYTES_MAX);
    let mut buffer = [0u8; RECEIPT_FRAME_BYTES_MAX];
    loop {
        match decoder.next_message() {
            Ok(Some(Message::DownloadResume(resume))) => {
                return resume.transfer_id == transfer_id && resume.offset == length
            }
            Ok(None) => {}
            Ok(Some(_)) | Err(_) => return false,
        }
        let read = tokio::time::timeout(shared.config.read_timeout, stream.read(&mut buffer));
        match read.await {
            Ok(Ok(read)) if read > 0 => decoder.feed(&buffer[..read]),
            _ => return false,
        }
    }
}

/// The largest receipt frame read (a transfer id and an offset).
const RECEIPT_FRAME_BYTES_MAX: usize = 1024;

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
    outbound: rowsync_protocol::Outbound,
    answer: Message,
) -> Result<(), Failure> {
    let (preamble, spool) = spooled(shared, outbound, &[&encode_frame(&answer)]).await?;
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
    mut spool: Spool,
) -> std::io::Result<()> {
    send_spool_as(stream, shared, preamble, &mut spool, Sending::Release).await
}

/// [`send_spool`], keeping the spool's bytes for a download the client may lack.
async fn send_spool_kept<B: Consolidated>(
    stream: &mut (impl AsyncWrite + Unpin),
    shared: &Shared<B>,
    preamble: Option<[u8; PREAMBLE_BYTES]>,
    spool: &mut Spool,
) -> std::io::Result<()> {
    send_spool_as(stream, shared, preamble, spool, Sending::Keep).await
}

async fn send_spool_as<B: Consolidated>(
    stream: &mut (impl AsyncWrite + Unpin),
    shared: &Shared<B>,
    preamble: Option<[u8; PREAMBLE_BYTES]>,
    spool: &mut Spool,
    sending: Sending,
) -> std::io::Result<()> {
    let write_timeout = shared.config.write_timeout;
    let stopped =
        || std::io::Error::new(std::io::ErrorKind::TimedOut, "the client stopped reading");
    if let Some(preamble) = preamble {
        tokio::time::timeout(write_timeout, stream.write_all(&preamble))
            .await
            .map_err(|_| stopped())??;
    }
    spool.send(stream, write_timeout, sending).await?;
    tokio::time::timeout(write_timeout, stream.flush())
        .await
        .map_err(|_| stopped())?
}

/// A download spool for `outbound`, within the server's download bounds and its spool
/// cache, and the preamble to send before it.
pub(crate) fn download_spool<B: Consolidated>(
    shared: &Shared<B>,
    mut outbound: rowsync_protocol::Outbound,
) -> (Option<[u8; PREAMBLE_BYTES]>, Spool) {
    let preamble = outbound.take_preamble();
    let spool = Spool::new(
        shared.config.download_spool_memory_bytes_max,
        shared.config.download_bytes_max,
        outbound,
        Arc::clone(&shared.cache),
    );
    (preamble, spool)
}

/// A finished download spool of `pieces` (frames, or a held stream's bytes); a failure
/// to spool them is the client's internal error.
async fn spooled<B: Consolidated>(
    shared: &Shared<B>,
    outbound: rowsync_protocol::Outbound,
    pieces: &[&[u8]],
) -> Result<(Option<[u8; PREAMBLE_BYTES]>, Spool), Failure> {
    let (preamble, mut spool) = download_spool(shared, outbound);
    let stored = async {
        for piece in pieces {
            spool.append(piece).await?;
        }
        spool.finish().await
    }
    .await;
    stored
        .map_err(|error| Failure::tell(WireError::new(ErrorCode::Internal, error.to_string())))?;
    Ok((preamble, spool))
}
