//! Receipts of downloads sent over HTTP (protocol v4, docs/protocol.md §5.12). Over TCP
//! and TLS the client's receipt follows its download on the same connection
//! (`stage::download`). Over HTTP the request body has ended before the download is
//! sent, so the receipt is a request of its own whose body is the `download_resume`
//! frame at the stream's length. The sync that sent the download keeps its spool (in
//! memory or its temporary file, not the database) while it waits for that request
//! ([`Receipts::expect`]); the receipt request finds it here by its transfer id
//! ([`confirm`]). A receipt that finds nothing here (it reached another server behind a
//! load balancer, or came after the wait) releases the held download of its transfer
//! from the consolidated database, if there is one.
//!
//! A receipt needs no login: its transfer id is its only proof. So a receipt whose id
//! is not of the unguessable form ([`is_transfer_id`]) is answered without looking
//! anything up, and so is one beyond `receipts_per_connection_per_second_max` on its
//! HTTP connection ([`ReceiptRate`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rowsync_consolidated::{Consolidated, ConsolidatedConnection, Direction};
use tokio::sync::oneshot;

use crate::shared::Shared;

/// The downloads this server has sent over HTTP and keeps until their receipt, by
/// transfer id.
#[derive(Default)]
pub(crate) struct Receipts {
    awaited: Mutex<HashMap<String, Awaited>>,
    /// Numbers each wait, so a wait forgets only itself (a fresh sync of the same
    /// transfer may wait while the one before it gives up).
    serial: std::sync::atomic::AtomicU64,
}

struct Awaited {
    serial: u64,
    client_id: String,
    /// The download's stream length, which the receipt must name.
    length: u64,
    /// True: the receipt came; false: the client asked to resume instead.
    arrived: oneshot::Sender<bool>,
}

/// What a receipt found on this server.
enum Found {
    /// The sync waiting for it has it: its download was delivered.
    Delivered,
    /// The sync stopped waiting (its wait ran out, or its connection ended) and holds,
    /// or held, the download in the database.
    GaveUp { client_id: String },
    /// The receipt names the transfer at another length than its download's.
    Mismatch { length: u64 },
    /// No download of this transfer waits here.
    Unknown,
}

impl Receipts {
    /// Expects the receipt of a download of `length` stream bytes from now on (before
    /// its first byte is sent, so the receipt cannot come first).
    pub(crate) fn expect(
        &self,
        client_id: &str,
        transfer_id: &str,
        length: u64,
    ) -> ReceiptWait<'_> {
        let (arrived, receiver) = oneshot::channel();
        let serial = self
            .serial
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let awaited = Awaited {
            serial,
            client_id: client_id.to_string(),
            length,
            arrived,
        };
        self.awaited
            .lock()
            .expect("receipts lock")
            .insert(transfer_id.to_string(), awaited);
        ReceiptWait {
            receipts: self,
            serial,
            transfer_id: transfer_id.to_string(),
            arrived: receiver,
        }
    }

    fn take(&self, transfer_id: &str, offset: u64) -> Found {
        let mut awaited = self.awaited.lock().expect("receipts lock");
        match awaited.get(transfer_id) {
            None => return Found::Unknown,
            Some(entry) if entry.length != offset => {
                return Found::Mismatch {
                    length: entry.length,
                }
            }
            Some(_) => {}
        }
        let entry = awaited.remove(transfer_id).expect("found above");
        match entry.arrived.send(true) {
            Ok(()) => Found::Delivered,
            Err(_) => Found::GaveUp {
                client_id: entry.client_id,
            },
        }
    }

    /// The client asks to resume the download of `transfer_id`: it does not have all of
    /// it, so a sync of this server waiting for its receipt holds it at once (the
    /// resumption waits for that, `held::Holding`) instead of at the end of its wait.
    pub(crate) fn resuming(&self, transfer_id: &str) {
        let mut awaited = self.awaited.lock().expect("receipts lock");
        if let Some(entry) = awaited.remove(transfer_id) {
            let _ = entry.arrived.send(false);
        }
    }
}

/// A download waiting for its receipt; forgotten when dropped, which the sync does after
/// it held the download, if the receipt did not come (a receipt meanwhile waits for
/// that, then releases it).
pub(crate) struct ReceiptWait<'r> {
    receipts: &'r Receipts,
    serial: u64,
    transfer_id: String,
    arrived: oneshot::Receiver<bool>,
}

impl ReceiptWait<'_> {
    /// Whether the receipt arrives within `within`, before `connection_end` (the HTTP
    /// connection that carried the sync ended: its client sends the receipt on it, so
    /// none is coming). A receipt that comes after this returned false finds the sync
    /// giving up, and waits until it held the download to release it.
    pub(crate) async fn arrived(
        &mut self,
        within: Duration,
        connection_end: impl std::future::Future<Output = ()>,
    ) -> bool {
        let arrived = tokio::select! {
            biased;
            arrived = &mut self.arrived => arrived.unwrap_or(false),
            () = tokio::time::sleep(within) => false,
            () = connection_end => false,
        };
        if !arrived {
            self.arrived.close();
            // A receipt sent between the wait's end and the close counts all the same.
            return self.arrived.try_recv().unwrap_or(false);
        }
        true
    }
}

impl Drop for ReceiptWait<'_> {
    fn drop(&mut self) {
        let mut awaited = self.receipts.awaited.lock().expect("receipts lock");
        if awaited
            .get(&self.transfer_id)
            .is_some_and(|entry| entry.serial == self.serial)
        {
            awaited.remove(&self.transfer_id);
        }
    }
}

/// The fewest hex digits of a transfer id a receipt is looked up for: 128 random bits,
/// as the reference client draws them.
pub const TRANSFER_ID_HEX_DIGITS_MIN: usize = 32;
/// The most bytes of a transfer id a receipt is looked up for.
pub const TRANSFER_ID_BYTES_MAX: usize = 128;

/// Whether a transfer id has the unguessable form a receipt must carry: at least
/// [`TRANSFER_ID_HEX_DIGITS_MIN`] and at most [`TRANSFER_ID_BYTES_MAX`] hex digits.
pub fn is_transfer_id(transfer_id: &str) -> bool {
    (TRANSFER_ID_HEX_DIGITS_MIN..=TRANSFER_ID_BYTES_MAX).contains(&transfer_id.len())
        && transfer_id.bytes().all(|byte| byte.is_ascii_hexdigit())
}

/// The receipt requests of one HTTP connection in the current second.
#[derive(Default)]
pub(crate) struct ReceiptRate {
    window: Mutex<Option<(std::time::Instant, u32)>>,
}

impl ReceiptRate {
    /// Counts a receipt; false when it is beyond `per_second_max` in its second.
    fn allow(&self, per_second_max: u32) -> bool {
        let now = std::time::Instant::now();
        let mut window = self.window.lock().expect("receipt rate lock");
        let (since, count) = match *window {
            Some((since, count)) if now.duration_since(since) < Duration::from_secs(1) => {
                (since, count)
            }
            _ => (now, 0),
        };
        *window = Some((since, count.saturating_add(1)));
        count < per_second_max
    }
}

/// Answers a receipt request: the download waiting here is delivered, or the held
/// download of the transfer, if its length is the receipt's, is released. A malformed
/// transfer id, or a receipt beyond its connection's rate (`rate`: HTTP only), is
/// answered without a lookup. Returns the log line; failures are logged only (the held
/// download then expires).
pub(crate) async fn confirm<B: Consolidated>(
    shared: &Shared<B>,
    rate: Option<&ReceiptRate>,
    transfer_id: &str,
    offset: u64,
) -> String {
    let per_second_max = shared.config.receipts_per_connection_per_second_max;
    if !is_transfer_id(transfer_id) {
        shared.metrics.receipts_refused.inc();
        return format!(
            "a receipt named a transfer id of {} bytes, not {TRANSFER_ID_HEX_DIGITS_MIN} to \
             {TRANSFER_ID_BYTES_MAX} hex digits; ignored",
            transfer_id.len()
        );
    }
    if rate.is_some_and(|rate| !rate.allow(per_second_max)) {
        shared.metrics.receipts_refused.inc();
        return format!(
            "a receipt above {per_second_max} per second on its connection \
             (receipts_per_connection_per_second_max); ignored"
        );
    }
    match shared.receipts.take(transfer_id, offset) {
        Found::Delivered => {
            format!(
                "the receipt of transfer {transfer_id:?} confirmed its download of {offset} bytes"
            )
        }
        Found::Mismatch { length } => format!(
            "a receipt of transfer {transfer_id:?} named byte {offset} of a {length}-byte \
             download; ignored"
        ),
        Found::GaveUp { client_id } => {
            shared.holding.settled(&client_id).await;
            release_received(shared, transfer_id, offset).await
        }
        Found::Unknown => release_received(shared, transfer_id, offset).await,
    }
}

/// Releases the held download of `transfer_id` if its client has all of it (`offset`
/// is its length).
async fn release_received<B: Consolidated>(
    shared: &Shared<B>,
    transfer_id: &str,
    offset: u64,
) -> String {
    let released = async {
        let mut worker = shared.auth_pool.acquire("").await?;
        let connection = worker.connection();
        let Some(client_id) = connection
            .held_transfer_client(Direction::Download, transfer_id)
            .await?
        else {
            return Ok(None);
        };
        let held = connection
            .held_transfer(Direction::Download, &client_id, transfer_id)
            .await?;
        if held.is_none_or(|held| held.length != offset) {
            return Ok(None);
        }
        connection
            .release_held_transfer(Direction::Download, &client_id, transfer_id)
            .await
            .map(|released| released.then_some(client_id))
    };
    let released: Result<Option<String>, rowsync_consolidated::DbError> = released.await;
    match released {
        Ok(Some(client_id)) => format!(
            "the receipt of transfer {transfer_id:?} released client {client_id:?}'s held \
             download"
        ),
        Ok(None) => format!("the receipt of transfer {transfer_id:?} found nothing held"),
        Err(error) => {
            tracing::warn!(%error, "releasing a received download failed; it expires");
            format!("the receipt of transfer {transfer_id:?} could not release its download")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 32, item 7: an empty or 3 MB transfer id was looked up.
    #[test]
    fn only_an_unguessable_transfer_id_is_looked_up() {
        assert!(is_transfer_id("0123456789abcdefABCDEF0123456789"));
        assert!(is_transfer_id(&"f".repeat(TRANSFER_ID_BYTES_MAX)));
        for refused in [
            String::new(),
            "3f2a9c1e0b7d4e58".into(),
            "g".repeat(32),
            "f".repeat(TRANSFER_ID_BYTES_MAX + 1),
            "x".repeat(3_000_000),
        ] {
            assert!(!is_transfer_id(&refused), "{} bytes", refused.len());
        }
    }

    #[test]
    fn a_connection_gets_its_receipts_per_second_and_no_more() {
        let rate = ReceiptRate::default();
        assert!((0..4).all(|_| rate.allow(4)));
        assert!(!rate.allow(4));
    }
}
