//! Connections that hold a sync's slot but have not sent their hello yet: at most
//! `hello_pending_connections_max` of them. When one more arrives, the oldest is told to
//! close, so silent connections (which cost nothing to open) can hold no more than that
//! many slots, however fast they come, and a client that says hello at once is never
//! refused because of them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::metrics::Metrics;

/// The registry of connections waiting for their hello, oldest first.
pub(crate) struct PendingHellos {
    limit: usize,
    state: Mutex<PendingState>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct PendingState {
    next_id: u64,
    /// By registration order: the first entry is the oldest.
    waiting: BTreeMap<u64, Arc<Notify>>,
}

/// One connection's place in the registry; leaving it (hello received, or the
/// connection ended) frees the place.
pub(crate) struct PendingHello<'r> {
    registry: &'r PendingHellos,
    id: u64,
    evicted: Arc<Notify>,
}

impl PendingHellos {
    pub(crate) fn new(limit: usize, metrics: Arc<Metrics>) -> PendingHellos {
        PendingHellos {
            limit: limit.max(1),
            state: Mutex::new(PendingState::default()),
            metrics,
        }
    }

    /// Registers a connection; if that makes one more than the limit, the oldest is
    /// told to close (its [`PendingHello::evicted`] completes).
    pub(crate) fn register(&self) -> PendingHello<'_> {
        let evicted = Arc::new(Notify::new());
        let mut state = self
            .state
            .lock()
            .expect("the pending registry is never poisoned");
        let id = state.next_id;
        state.next_id += 1;
        state.waiting.insert(id, Arc::clone(&evicted));
        if state.waiting.len() > self.limit {
            if let Some((_, oldest)) = state.waiting.pop_first() {
                // Stored if the connection is not waiting right now: it sees it on its
                // next wait.
                oldest.notify_one();
                self.metrics.hello_pending_evictions.inc();
            }
        }
        self.metrics
            .connections_awaiting_hello
            .set(state.waiting.len() as i64);
        PendingHello {
            registry: self,
            id,
            evicted,
        }
    }

    /// Connections waiting for their hello now.
    pub(crate) fn waiting(&self) -> usize {
        self.state
            .lock()
            .expect("the pending registry is never poisoned")
            .waiting
            .len()
    }
}

impl PendingHello<'_> {
    /// Completes once a newer connection took this one's place.
    pub(crate) async fn evicted(&self) {
        self.evicted.notified().await;
    }
}

impl Drop for PendingHello<'_> {
    fn drop(&mut self) {
        if let Ok(mut state) = self.registry.state.lock() {
            state.waiting.remove(&self.id);
            self.registry
                .metrics
                .connections_awaiting_hello
                .set(state.waiting.len() as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_is_evicted_beyond_the_limit_and_leaving_frees_a_place() {
        let metrics = Arc::new(Metrics::new());
        let registry = PendingHellos::new(2, Arc::clone(&metrics));
        let evicted = || metrics.hello_pending_evictions.get();
        let first = registry.register();
        let second = registry.register();
        assert_eq!(evicted(), 0);
        drop(second);
        let _third = registry.register();
        assert_eq!((registry.waiting(), evicted()), (2, 0));
        let _fourth = registry.register();
        assert_eq!((registry.waiting(), evicted()), (2, 1));
        assert_eq!(metrics.connections_awaiting_hello.get(), 2);
        // The oldest, `first`, was told (the notification waits for it).
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(first.evicted());
    }
}
