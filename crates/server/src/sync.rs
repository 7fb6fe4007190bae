//! One sync over a byte stream (a TCP or TLS connection, or an HTTP request and its
//! response): its stages run in order ([`crate::stage`]), each phase timed into the
//! metrics and the sync's log line; the handler frees the sync's slot, then answers a
//! failure and logs the outcome.

use std::net::SocketAddr;

use rowsync_consolidated::{Consolidated, Direction};
use rowsync_protocol::DOWNLOAD_RESUME_SINCE_VERSION;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;

use crate::connection_end::ConnectionEnd;
use crate::failure::{Failure, Reply};
use crate::metrics::{Outcome, PhaseTimings};
use crate::record::error_text;
use crate::reply::reply_and_close;
use crate::shared::Shared;
use crate::stage::stream::Received;
use crate::stage::{database, download, stream};

/// Whether a read tells that the client closed its connection while its sync waits for
/// the database.
#[derive(Clone)]
pub(crate) enum ClientClose {
    /// TCP and TLS: after its upload a client sends nothing until the download ends, so
    /// a read that ends or fails means it is gone.
    Watched,
    /// HTTP: the request body ends before the download, whether the client stays or not;
    /// only the end of the HTTP connection that carried the request tells.
    Unseen(ConnectionEnd),
}

/// Runs one sync over any byte stream (TCP, TLS, or an HTTP request and its response).
pub(crate) async fn handle_connection<B: Consolidated, S>(
    mut stream: S,
    peer: SocketAddr,
    shared: &Shared<B>,
    slot: OwnedSemaphorePermit,
    close: ClientClose,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut timings = PhaseTimings {
        watch: Some(shared.metrics.monitor.started()),
        ..PhaseTimings::default()
    };
    shared.metrics.connections.inc();
    let result = run_stages(&mut stream, peer, shared, &mut timings, &close).await;
    let outcome = match &result {
        Ok(_) => Outcome::ok,
        Err(failure) => match &failure.reply {
            Some(Reply::Busy { .. }) => Outcome::busy,
            Some(_) => Outcome::refused,
            None => Outcome::failed,
        },
    };
    // Counted before the connection leaves the gauge: once no connection is left, every
    // ended sync is counted.
    shared.metrics.sync_ended(outcome);
    shared.metrics.connections.dec();
    // The slot is free before the client hears the end of its sync: a client that
    // reconnects at once, after the answer or the close, finds it free (the reply and
    // the drain of a refused connection are bounded by their own timeouts).
    drop(slot);
    match result {
        Ok(summary) => {
            observe_end(shared, &mut timings, Outcome::ok, None);
            tracing::debug!(%peer, phases = %timings, "{summary}");
            let _ = stream.shutdown().await;
        }
        Err(failure) => {
            // The client hears first; the log line cannot delay or prevent its answer.
            let error = match failure.error() {
                Some(error) => error_text(error),
                None => failure.log.clone(),
            };
            observe_end(shared, &mut timings, outcome, Some(error));
            match failure.reply {
                Some(reply) => reply_and_close(stream, reply.into_message()).await,
                None => {
                    let _ = stream.shutdown().await;
                }
            }
            let identity = failure.identity.as_deref().unwrap_or("user=unknown");
            tracing::warn!(%peer, phases = %timings, "sync failed ({identity}): {}", failure.log);
        }
    }
}

/// The sync leaves the monitor's syncs in progress for its history, and its recording
/// (if any) is written with its outcome.
fn observe_end<B: Consolidated>(
    shared: &Shared<B>,
    timings: &mut PhaseTimings,
    outcome: Outcome,
    error: Option<String>,
) {
    if let Some(recording) = timings.recording.take() {
        let outcome = recording.outcome(&timings.facts, error.clone());
        recording.finish(outcome);
    }
    if let Some(watch) = timings.watch.take() {
        shared
            .metrics
            .monitor
            .ended(&watch, outcome, &timings.phases, timings.facts, error);
    }
}

/// The stages of one sync: stream (hello, authentication, the checked upload), database
/// (a worker runs the transaction, the download is spooled), download (sent once the
/// worker is released). An acknowledgement of the last download takes the same path.
async fn run_stages<B: Consolidated>(
    connection: &mut (impl AsyncRead + AsyncWrite + Unpin + Send),
    peer: SocketAddr,
    shared: &Shared<B>,
    timings: &mut PhaseTimings,
    close: &ClientClose,
) -> Result<String, Failure> {
    match stream::receive(connection, peer, shared, timings).await? {
        Received::Upload(upload) => sync_upload(connection, shared, *upload, timings, close).await,
        Received::Acknowledgement(acknowledgement) => {
            let hello = acknowledgement.hello.clone();
            rowsync_consolidated::failpoint!("before_ack");
            database::record_acknowledgement(shared, &acknowledgement)
                .await
                .map_err(|failure| failure.of(&hello))?;
            rowsync_consolidated::failpoint!("after_ack");
            download::confirm_acknowledgement(connection, shared, *acknowledgement)
                .await
                .map_err(|failure| failure.of(&hello))
        }
        Received::DownloadResume(query) => {
            let hello = query.hello.clone();
            let receipt = matches!(close, ClientClose::Watched);
            download::send_held_download(connection, shared, *query, receipt)
                .await
                .map_err(|failure| failure.of(&hello))
        }
        Received::Receipt {
            transfer_id,
            offset,
        } => {
            let receipts = match close {
                ClientClose::Unseen(end) => Some(end.receipt_rate()),
                ClientClose::Watched => None,
            };
            Ok(crate::receipt::confirm(shared, receipts, &transfer_id, offset).await)
        }
        Received::HeldQuery(query) => answer_held_query(connection, shared, *query).await,
    }
}

/// An upload's sync: the database stage, the held start of a resumed upload released
/// once committed, then the download stage.
async fn sync_upload<B: Consolidated>(
    connection: &mut (impl AsyncRead + AsyncWrite + Unpin + Send),
    shared: &Shared<B>,
    upload: stream::CheckedUpload,
    timings: &mut PhaseTimings,
    close: &ClientClose,
) -> Result<String, Failure> {
    let identity = crate::failure::identity(&upload.hello);
    // A resumed transfer's held start goes once the sync committed.
    let resumed = upload
        .transfer
        .clone()
        .filter(|transfer| transfer.offset > 0)
        .map(|transfer| (upload.hello.clone(), upload.user.clone(), transfer));
    let with_identity = |mut failure: Failure| {
        failure.identity.get_or_insert_with(|| identity.clone());
        failure
    };
    let resumable = resumable_download(&upload, close);
    // A resumption of this download waits until it is sent (or held).
    let _sending = resumable
        .as_ref()
        .map(|resumable| shared.holding.begin(&resumable.hello.client_id));
    let gone = client_gone(connection, close);
    let synchronized = database::run_on_worker(shared, upload, timings, gone)
        .await
        .map_err(with_identity)?;
    if let Some((hello, user, transfer)) = resumed {
        let transfer_id = &transfer.transfer_id;
        crate::held::release(shared, Direction::Upload, &hello, &user, transfer_id).await;
    }
    download::send_download(connection, shared, synchronized, timings, resumable)
        .await
        .map_err(with_identity)
}

/// Protocol v3: how much of a cut upload the server holds for the client.
async fn answer_held_query<B: Consolidated>(
    connection: &mut (impl AsyncRead + AsyncWrite + Unpin + Send),
    shared: &Shared<B>,
    query: stream::HeldQuery,
) -> Result<String, Failure> {
    let stream::HeldQuery {
        hello,
        user,
        transfer_id,
        outbound,
    } = query;
    let answer = crate::held::held_answer(shared, &hello, &user, &transfer_id)
        .await
        .map_err(|failure| failure.of(&hello))?;
    let length = answer.length;
    let message = rowsync_protocol::Message::UploadHeld(answer);
    download::answer_exchange(connection, shared, outbound, message)
        .await
        .map_err(|failure| failure.of(&hello))?;
    Ok(format!(
        "client {:?} asked about transfer {transfer_id:?}: {length} bytes held",
        hello.client_id
    ))
}

/// A protocol v4 upload's download is resumable under the upload's transfer id.
fn resumable_download(
    upload: &stream::CheckedUpload,
    close: &ClientClose,
) -> Option<download::Resumable> {
    let transfer = upload.transfer.as_ref()?;
    (upload.hello.protocol_version >= DOWNLOAD_RESUME_SINCE_VERSION).then(|| download::Resumable {
        hello: upload.hello.clone(),
        user: upload.user.clone(),
        transfer_id: transfer.transfer_id.clone(),
        receipt: match close {
            ClientClose::Watched => download::Receipt::Follows,
            ClientClose::Unseen(end) => download::Receipt::Request(end.clone()),
        },
    })
}

/// Resolves when the client closed its connection (a read ends or fails), if `close`
/// says a read can tell; bytes it sends instead are none of the protocol's: they are
/// dropped and the watch ends.
async fn client_gone(connection: &mut (impl AsyncRead + Unpin), close: &ClientClose) {
    if matches!(close, ClientClose::Watched) {
        let mut byte = [0u8; 1];
        if matches!(connection.read(&mut byte).await, Ok(0) | Err(_)) {
            return;
        }
    }
    std::future::pending::<()>().await
}
