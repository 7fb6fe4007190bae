//! Receipts of downloads sent over HTTP (protocol v4, docs/protocol.md §5.12). Over TCP
//! and TLS the client's receipt follows its download on the same connection
//! (`stage::download`). Over HTTP the request body has ended before the download is
//! sent, so the receipt is a request of its own whose body is the `download_resume`
//! frame at the stream's length. The sync that sent the download keeps its spool (in
//! memory or its temporary file, not the database) while it waits for that request
//! (`Receipts::expect`, in `shared::receipts`); the receipt request finds it here by its transfer id
//! ([`confirm`]). A receipt that finds nothing here (it reached another server behind a
//! load balancer, or came after the wait) releases the held download of its transfer
//! from the consolidated database, if there is one.
//!
//! A receipt needs no login: its transfer id is its only proof. So a receipt whose id
//! is not of the unguessable form ([`is_transfer_id`]) is answered without looking
//! anything up, and so is one beyond `receipts_per_connection_per_second_max` on its
//! HTTP connection ([`ReceiptRate`]).

use std::sync::Mutex;
use std::time::Duration;

use rowsync_consolidated::{Consolidated, ConsolidatedConnection, Direction};

use crate::shared::receipts::Found;
use crate::shared::Shared;

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
