//! Database workers: at most `workers` syncs do database work at once, each on one
//! pooled connection that it holds only for that work. Idle connections remember the
//! script version they last served, and a sync prefers one of its own version (whose
//! scripts that connection has loaded and whose `begin_connection` ran), as MobiLink
//! keeps connections per version. The count can change while syncs run (`resize`):
//! shrinking takes permits back as workers finish, and closes connections beyond it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rowsync_consolidated::{Consolidated, ConsolidatedConnection, DbError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What the pool counts for the controller and the metrics.
#[derive(Debug, Default)]
pub struct PoolCounters {
    /// Workers running a sync now.
    pub busy: AtomicUsize,
    /// Acquisitions that had to wait for a worker, since start.
    pub waited: AtomicUsize,
    /// Syncs waiting for a worker now.
    pub waiting: AtomicUsize,
    /// Microseconds workers were held, since start.
    pub busy_micros: AtomicUsize,
}

pub struct WorkerPool<B: Consolidated> {
    backend: B,
    idle: Mutex<Vec<(String, B::Connection)>>,
    permits: Arc<Semaphore>,
    /// The current worker count.
    workers: AtomicUsize,
    /// Permits to take back from workers as they finish (after a shrink).
    permits_owed: AtomicUsize,
    pub counters: PoolCounters,
}

impl<B: Consolidated> WorkerPool<B> {
    pub fn new(backend: B, workers: usize) -> Arc<WorkerPool<B>> {
        Arc::new(WorkerPool {
            backend,
            idle: Mutex::new(Vec::with_capacity(workers)),
            permits: Arc::new(Semaphore::new(workers)),
            workers: AtomicUsize::new(workers),
            permits_owed: AtomicUsize::new(0),
            counters: PoolCounters::default(),
        })
    }

    pub fn workers(&self) -> usize {
        self.workers.load(Ordering::Acquire)
    }

    /// Changes the worker count. Growing takes effect at once; shrinking as soon as
    /// enough workers are idle or finish.
    pub fn resize(&self, workers: usize) {
        let workers = workers.max(1);
        let current = self.workers.swap(workers, Ordering::AcqRel);
        if workers > current {
            let mut grow = workers - current;
            // Permits still owed from an earlier shrink are cancelled first.
            while grow > 0 {
                let owed = self.permits_owed.load(Ordering::Acquire);
                if owed == 0 {
                    break;
                }
                let cancel = owed.min(grow);
                if self
                    .permits_owed
                    .compare_exchange(owed, owed - cancel, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    grow -= cancel;
                }
            }
            self.permits.add_permits(grow);
        } else if workers < current {
            let shrink = current - workers;
            let forgotten = self.permits.forget_permits(shrink);
            self.permits_owed
                .fetch_add(shrink - forgotten, Ordering::AcqRel);
            let mut idle = self.idle.lock().expect("pool lock");
            let surplus = idle.len().saturating_sub(workers);
            idle.drain(..surplus);
        }
    }

    /// Waits for a free worker and gives it a connection: an idle one of `version` if
    /// any, else any idle one, else a new one.
    pub async fn acquire(self: &Arc<Self>, version: &str) -> Result<Worker<B>, DbError> {
        let permit = match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                self.counters.waited.fetch_add(1, Ordering::AcqRel);
                self.counters.waiting.fetch_add(1, Ordering::AcqRel);
                let permit = Arc::clone(&self.permits).acquire_owned().await;
                self.counters.waiting.fetch_sub(1, Ordering::AcqRel);
                permit.expect("the worker semaphore is never closed")
            }
        };
        let idle = {
            let mut idle = self.idle.lock().expect("pool lock");
            // Connections the database closed (a failover) are dropped, not handed out.
            idle.retain(|(_, connection)| !connection.is_closed());
            match idle.iter().rposition(|(served, _)| served == version) {
                Some(position) => Some(idle.remove(position).1),
                None => idle.pop().map(|(_, connection)| connection),
            }
        };
        // Counted busy from here, so the permit and the count travel together.
        self.counters.busy.fetch_add(1, Ordering::AcqRel);
        let mut worker = Worker {
            version: version.to_string(),
            connection: None,
            pool: Arc::clone(self),
            permit: Some(permit),
            started: Instant::now(),
        };
        worker.connection = Some(match idle {
            Some(connection) => connection,
            None => self.backend.connect().await?,
        });
        Ok(worker)
    }
}

/// A worker with its connection; dropping it returns both to the pool.
pub struct Worker<B: Consolidated> {
    version: String,
    connection: Option<B::Connection>,
    pool: Arc<WorkerPool<B>>,
    permit: Option<OwnedSemaphorePermit>,
    started: Instant,
}

impl<B: Consolidated> Worker<B> {
    pub fn connection(&mut self) -> &mut B::Connection {
        self.connection
            .as_mut()
            .expect("present until drop or discard")
    }

    /// Closes the connection instead of pooling it (after a database error, as MobiLink does).
    pub fn discard(mut self) {
        self.connection = None;
    }

    /// How long this worker has been held.
    pub fn held(&self) -> Duration {
        self.started.elapsed()
    }
}

impl<B: Consolidated> Drop for Worker<B> {
    fn drop(&mut self) {
        let pool = &self.pool;
        pool.counters.busy.fetch_sub(1, Ordering::AcqRel);
        pool.counters.busy_micros.fetch_add(
            self.started.elapsed().as_micros() as usize,
            Ordering::AcqRel,
        );
        let owed = pool
            .permits_owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                owed.checked_sub(1)
            })
            .is_ok();
        if owed {
            // The pool shrank: this worker's permit and connection go away.
            if let Some(permit) = self.permit.take() {
                permit.forget();
            }
            return;
        }
        if let Some(connection) = self.connection.take() {
            let version = std::mem::take(&mut self.version);
            let mut idle = pool.idle.lock().expect("pool lock");
            if idle.len() < pool.workers() {
                idle.push((version, connection));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rowsync_consolidated::sqlite::SqliteConsolidated;

    #[tokio::test]
    async fn resizing_changes_how_many_workers_run_at_once() {
        let directory = tempfile::tempdir().unwrap();
        let pool = WorkerPool::new(SqliteConsolidated::new(directory.path().join("c.db")), 2);
        let a = pool.acquire("v").await.unwrap();
        let b = pool.acquire("v").await.unwrap();
        assert_eq!(pool.counters.busy.load(Ordering::Acquire), 2);
        // Shrinking to one while both run: the first to finish gives its permit back.
        pool.resize(1);
        drop(a);
        let waiting = pool.acquire("v");
        tokio::pin!(waiting);
        assert!(
            futures_util::FutureExt::now_or_never(waiting.as_mut()).is_none(),
            "one worker is still running: a second must wait"
        );
        drop(b);
        let c = waiting.await.unwrap();
        assert!(Arc::clone(&pool.permits).try_acquire_owned().is_err());
        // Growing again lets two run.
        pool.resize(3);
        let d = pool.acquire("v").await.unwrap();
        let e = pool.acquire("v").await.unwrap();
        assert_eq!(pool.counters.busy.load(Ordering::Acquire), 3);
        assert!(pool.counters.waited.load(Ordering::Acquire) >= 1);
        drop((c, d, e));
        assert_eq!(pool.counters.busy.load(Ordering::Acquire), 0);
    }
}
