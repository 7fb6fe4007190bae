//! The download stage: after the worker is released, the end of the download joins its
//! spool and all of it is sent, each write within the write timeout; a download
//! acknowledgement is confirmed by echoing it. A protocol v4 download is resumable: when
//! its sending fails, or the client's receipt does not come (TCP and TLS: on the same
//! connection, after it; HTTP: as a request of its own, for a download of at least
//! `DOWNLOAD_RECEIPT_BYTES_MIN`, see `receipt`), its stream is held
//! (`held::hold_download`) and a later `download_resume` is answered with the rest.

use rowsync_consolidated::Consolidated;
use rowsync_protocol::{
    encode_frame, DownloadAck, ErrorCode, Message, WireError, DOWNLOAD_RECEIPT_BYTES_MIN,
    PREAMBLE_BYTES,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::connection_end::ConnectionEnd;
use crate::download_frames::end_frame;
use crate::failure::Failure;
use crate::metrics::{Phase, PhaseTimings};
use crate::monitor::SyncFacts;
use crate::shared::Shared;
use crate::spool::{Sending, Spool};
use crate::stage::stream::Acknowledgement;
use crate::stage::{download_spool, Synchronized};

/// A download the client can resume (protocol v4): held when it may not have arrived.
pub(crate) struct Resumable {
    pub(crate) hello: rowsync_protocol::Hello,
    pub(crate) user: String,
    pub(crate) transfer_id: String,
    pub(crate) receipt: Receipt,
}

/// How the client says that a resumable download arrived whole.
pub(crate) enum Receipt {
    /// TCP and TLS: a frame on the same connection, right after the download.
    Follows,
    /// HTTP (the request body has ended by then): a request of its own, for a download
    /// of at least `DOWNLOAD_RECEIPT_BYTES_MIN` stream bytes, on the connection that
    /// carried the sync; none comes once that connection has ended.
    Request(ConnectionEnd),
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
        session_token,
    } = synchronized;
    // The worker is released: the end of the download joins the spool, then all of it
    // is sent while the worker serves others.
    let ended = async {
        spool
            .append(&end_frame(&outcome, session_token.as_ref()))
            .await?;
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
    let Resumable {
        hello,
        user,
        transfer_id,
        receipt,
    } = resumable;
    let length = spool.bytes();
    // Expected before the first byte goes, so the receipt cannot come first.
    let mut awaiting = match &receipt {
        Receipt::Request(_) if length >= DOWNLOAD_RECEIPT_BYTES_MIN => Some(
            shared
                .receipts
                .expect(&hello.client_id, &transfer_id, length),
        ),
        _ => None,
    };
    let sent = send_spool_kept(stream, shared, preamble, &mut spool).await;
    let delivered = match (&sent, receipt, awaiting.as_mut()) {
        (Err(_), _, _) => false,
        (Ok(()), Receipt::Follows, _) => {
            receipt_follows(stream, shared, &transfer_id, length).await
        }
        // Below the receipt's size a written response counts as delivered.
        (Ok(()), Receipt::Request(_), None) => true,
        (Ok(()), Receipt::Request(end), Some(waiting)) => {
            // The request and the response end here, so that the client can send its
            // receipt on the same connection.
            let config = &shared.config;
            let _ = tokio::time::timeout(config.write_timeout, stream.shutdown()).await;
            let _ = tokio::time::timeout(config.read_timeout, request_end(stream)).await;
            waiting.arrived(config.read_timeout, end.ended()).await
        }
    };
    if !delivered {
        crate::held::hold_download(shared, &hello, &user, &transfer_id, spool).await;
    }
    // Only now: a receipt that came late waited for the download to be held.
    drop(awaiting);
    sent
}

/// Answers a `download_resume`: the held download's length and digest, then its stream
/// from the offset asked; released once the client's receipt says it has all of it (TCP
/// and TLS: it follows here; HTTP: a request of its own releases it, see `receipt`).
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
    if receipt_expected && receipt_follows(stream, shared, &transfer_id, length).await {
        crate::held::release(
            shared,
            rowsync_consolidated::Direction::Download,
            &hello,
            &user,
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
async fn receipt_follows<B: Consolidated>(
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

/// Reads an HTTP request's body to its end (nothing follows the `end_upload`; at most
/// `RECEIPT_FRAME_BYTES_MAX` bytes are read, in case): until the body's end is read, an
/// HTTP/1.1 connection takes no next request, such as the receipt.
async fn request_end(stream: &mut (impl AsyncRead + Unpin)) {
    let mut buffer = [0u8; RECEIPT_FRAME_BYTES_MAX];
    let mut left = RECEIPT_FRAME_BYTES_MAX;
    while left > 0 {
        match stream.read(&mut buffer[..left]).await {
            Ok(read) if read > 0 => left -= read,
            _ => return,
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
