//! Which clients' version 3 uploads this server is receiving right now: the state every
//! connection shares (`Shared::holding`); holding and resuming transfers is `held`'s.

use std::collections::HashMap;

/// Version 3 uploads this server is receiving (and, if cut, holding) right now, counted
/// by client id from their hello on. The client may see its connection cut before the
/// server does (or before the server has even authenticated it), and ask about the
/// transfer at once: a question (or resumption) of the same client waits until those
/// connections have ended (at the latest their read timeout) and what they left is
/// written, so it is answered with what the cut left, not with nothing.
#[derive(Default)]
pub(crate) struct Holding {
    clients: std::sync::Mutex<HashMap<String, tokio::sync::watch::Sender<usize>>>,
}

impl Holding {
    /// Counts a connection of `client_id` as receiving until the guard is dropped.
    pub(crate) fn begin(&self, client_id: &str) -> HoldingGuard<'_> {
        let mut clients = self.clients.lock().expect("holding lock");
        clients
            .entry(client_id.to_string())
            .or_insert_with(|| tokio::sync::watch::channel(0).0)
            .send_modify(|receiving| *receiving += 1);
        HoldingGuard {
            holding: self,
            client_id: client_id.to_string(),
        }
    }

    /// Waits until no connection of `client_id` is receiving (or holding).
    pub(crate) async fn settled(&self, client_id: &str) {
        let receiver = self
            .clients
            .lock()
            .expect("holding lock")
            .get(client_id)
            .map(tokio::sync::watch::Sender::subscribe);
        if let Some(mut receiver) = receiver {
            // A closed channel means none are left either.
            let _ = receiver.wait_for(|receiving| *receiving == 0).await;
        }
    }
}

pub(crate) struct HoldingGuard<'h> {
    holding: &'h Holding,
    client_id: String,
}

impl Drop for HoldingGuard<'_> {
    fn drop(&mut self) {
        let mut clients = self.holding.clients.lock().expect("holding lock");
        if let Some(sender) = clients.get(&self.client_id) {
            sender.send_modify(|receiving| *receiving -= 1);
            if *sender.borrow() == 0 {
                clients.remove(&self.client_id);
            }
        }
    }
}
