//! Connections that hold a sync's slot but have not sent their hello yet: beyond
//! `hello_pending_connections_max` of them, the oldest that has waited at least
//! `hello_pending_grace` is told to close, so silent connections (which cost nothing to
//! open) hold no more than that many slots for longer than the grace, however fast they
//! come, and a client that says hello at once is never refused because of them. The
//! grace is what a burst of real clients needs: accepted by the hundred at once, each is
//! told to wait only after it had time to send its hello (on two cores shared with a
//! thousand clients, their hellos can take hundreds of milliseconds to be written).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

/// The registry of connections waiting for their hello, oldest first. The same registry
/// bounds HTTP connections with no request in progress (`Shared::idle_http`).
pub(crate) struct PendingHellos {
    limit: usize,
    grace: Duration,
    state: Mutex<PendingState>,
    counted: Counted,
}

/// The metrics a registry keeps: the connections waiting, and those told to close.
pub(crate) struct Counted {
    pub(crate) waiting: Gauge,
    pub(crate) evictions: Counter,
}

#[derive(Default)]
struct PendingState {
    next_id: u64,
    /// By registration order: the first entry is the oldest.
    waiting: BTreeMap<u64, Waiting>,
}

struct Waiting {
    since: Instant,
    evicted: Arc<Notify>,
}

/// One connection's place in the registry; leaving it (hello received, or the
/// connection ended) frees the place.
pub(crate) struct PendingHello<'r> {
    registry: &'r PendingHellos,
    id: u64,
    since: Instant,
    evicted: Arc<Notify>,
}

impl PendingHellos {
    pub(crate) fn new(limit: usize, grace: Duration, counted: Counted) -> PendingHellos {
        PendingHellos {
            limit: limit.max(1),
            grace,
            state: Mutex::new(PendingState::default()),
            counted,
        }
    }

    /// Registers a connection; if more than the limit wait, those past their grace are
    /// told to close, oldest first (their [`PendingHello::evicted`] completes).
    pub(crate) fn register(&self) -> PendingHello<'_> {
        let evicted = Arc::new(Notify::new());
        let since = Instant::now();
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        let waiting = Waiting {
            since,
            evicted: Arc::clone(&evicted),
        };
        state.waiting.insert(id, waiting);
        self.evict_excess(&mut state, since);
        PendingHello {
            registry: self,
            id,
            since,
            evicted,
        }
    }

    /// Tells the oldest connections past their grace to close while more than the limit
    /// wait.
    fn evict_excess(&self, state: &mut PendingState, now: Instant) {
        while state.waiting.len() > self.limit {
            let Some(entry) = state.waiting.first_entry() else {
                break;
            };
            if now.saturating_duration_since(entry.get().since) < self.grace {
                break;
            }
            // Stored if the connection is not waiting right now: it sees it on its next
            // wait.
            entry.remove().evicted.notify_one();
            self.counted.evictions.inc();
        }
        self.counted.waiting.set(state.waiting.len() as i64);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PendingState> {
        self.state
            .lock()
            .expect("the pending registry is never poisoned")
    }

    /// Connections waiting for their hello now.
    pub(crate) fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }
}

impl PendingHello<'_> {
    /// Completes once this connection must make room: more than the limit wait and it is
    /// among the oldest past their grace (checked when others arrive, and once its own
    /// grace ends).
    pub(crate) async fn evicted(&self) {
        let grace_ended = async {
            tokio::time::sleep_until(self.since + self.registry.grace).await;
            let registry = self.registry;
            registry.evict_excess(&mut registry.lock(), Instant::now());
            std::future::pending::<()>().await
        };
        tokio::select! {
            () = self.evicted.notified() => {}
            () = grace_ended => {}
        }
    }
}

impl Drop for PendingHello<'_> {
    fn drop(&mut self) {
        if let Ok(mut state) = self.registry.state.lock() {
            state.waiting.remove(&self.id);
            self.registry
                .counted
                .waiting
                .set(state.waiting.len() as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn counted(metrics: &Metrics) -> Counted {
        Counted {
            waiting: metrics.connections_awaiting_hello.clone(),
            evictions: metrics.hello_pending_evictions.clone(),
        }
    }

    #[test]
    fn without_grace_the_oldest_is_evicted_beyond_the_limit_and_leaving_frees_a_place() {
        let metrics = Arc::new(Metrics::new());
        let registry = PendingHellos::new(2, Duration::ZERO, counted(&metrics));
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
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(first.evicted());
    }

    /// Whether the connection is told to make room (within a millisecond of paused time).
    async fn told(pending: &PendingHello<'_>) -> bool {
        tokio::time::timeout(Duration::from_millis(1), pending.evicted())
            .await
            .is_ok()
    }

    /// A burst beyond the limit is left its grace to send hellos; then the oldest of those
    /// still silent make room, down to the limit, each when its own grace ends.
    #[tokio::test(start_paused = true)]
    async fn a_burst_keeps_its_grace_then_the_oldest_silent_ones_make_room() {
        let metrics = Arc::new(Metrics::new());
        let grace = Duration::from_millis(1000);
        let registry = PendingHellos::new(2, grace, counted(&metrics));
        let evicted = || metrics.hello_pending_evictions.get();
        let first = registry.register();
        tokio::time::advance(Duration::from_millis(400)).await;
        let second = registry.register();
        let third = registry.register();
        let fourth = registry.register();
        assert_eq!(
            (registry.waiting(), evicted()),
            (4, 0),
            "nobody within the grace"
        );
        drop(third); // its hello came
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(told(&first).await, "the oldest, past its grace, makes room");
        assert_eq!((registry.waiting(), evicted()), (2, 1));
        tokio::time::advance(Duration::from_millis(1000)).await;
        assert!(!told(&second).await, "at the limit nobody else has to go");
        assert!(!told(&fourth).await);
        let _fifth = registry.register();
        assert_eq!(
            (registry.waiting(), evicted()),
            (2, 2),
            "one more past the limit: the oldest past its grace goes at once"
        );
        assert!(told(&second).await);
    }
}
