//! The downloads this server sent over HTTP and keeps until their receipt: the state
//! every connection shares (`Shared::receipts`); what a receipt request does with it is
//! `receipt`'s.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::oneshot;

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
pub(crate) enum Found {
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

    pub(crate) fn take(&self, transfer_id: &str, offset: u64) -> Found {
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
    /// resumption waits for that, `holding::Holding`) instead of at the end of its wait.
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
