//! One sync over a byte stream (a TCP or TLS connection, or an HTTP request and its
//! response): its stages run in order ([`crate::stage`]), each phase timed into the
//! metrics and the sync's log line; the handler frees the sync's slot, then answers a
//! failure and logs the outcome.

use std::net::SocketAddr;

use rowsync_consolidated::Consolidated;
use rowsync_protocol::Message;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;

use crate::failure::Failure;
use crate::metrics::{Outcome, PhaseTimings};
use crate::reply::reply_and_close;
use crate::shared::Shared;
use crate::stage::stream::Received;
use crate::stage::{database, download, stream};

/// Runs one sync over any byte stream (TCP, TLS, or an HTTP request and its response).
pub(crate) async fn handle_connection<B: Consolidated, S>(
    mut stream: S,
    peer: SocketAddr,
    shared: &Shared<B>,
    slot: OwnedSemaphorePermit,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut timings = PhaseTimings::default();
    shared.metrics.connections.inc();
    let result = run_sync(&mut stream, shared, &mut timings).await;
    shared.metrics.connections.dec();
    // The slot is free before the client hears the end of its sync: a client that
    // reconnects at once, after the answer or the close, finds it free (the reply and
    // the drain of a refused connection are bounded by their own timeouts).
    drop(slot);
    match result {
        Ok(summary) => {
            shared.metrics.sync_ended(Outcome::ok);
            tracing::debug!(%peer, phases = %timings, "{summary}");
            let _ = stream.shutdown().await;
        }
        Err(failure) => {
            // The client hears first; the log line cannot delay or prevent its answer.
            let outcome = if failure.reply.is_some() {
                Outcome::refused
            } else {
                Outcome::failed
            };
            shared.metrics.sync_ended(outcome);
            if let Some(error) = failure.reply {
                reply_and_close(stream, Message::Error(error)).await;
            } else {
                let _ = stream.shutdown().await;
            }
            tracing::warn!(%peer, phases = %timings, "sync failed: {}", failure.log);
        }
    }
}

/// The stages of one sync: stream (hello, authentication, the checked upload), database
/// (a worker runs the transaction, the download is spooled), download (sent once the
/// worker is released). An acknowledgement of the last download takes the same path.
async fn run_sync<B: Consolidated>(
    connection: &mut (impl AsyncRead + AsyncWrite + Unpin + Send),
    shared: &Shared<B>,
    timings: &mut PhaseTimings,
) -> Result<String, Failure> {
    match stream::receive(connection, shared, timings).await? {
        Received::Upload(upload) => {
            let synchronized = database::synchronize(shared, *upload, timings).await?;
            download::send_download(connection, shared, synchronized, timings).await
        }
        Received::Acknowledgement(acknowledgement) => {
            database::record_acknowledgement(shared, &acknowledgement).await?;
            download::confirm_acknowledgement(connection, shared, *acknowledgement).await
        }
    }
}
