//! Database workers: at most `workers` syncs do database work at once, each on one
//! pooled connection that it holds only for that work. Idle connections remember the
//! script version they last served, and a sync prefers one of its own version (whose
//! scripts that connection has loaded and whose `begin_connection` ran), as MobiLink
//! keeps connections per version.

use std::sync::{Arc, Mutex};

use rowsync_consolidated::{Consolidated, DbError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct WorkerPool<B: Consolidated> {
    backend: B,
    idle: Mutex<Vec<(String, B::Connection)>>,
    permits: Arc<Semaphore>,
}

impl<B: Consolidated> WorkerPool<B> {
    pub fn new(backend: B, workers: usize) -> Arc<WorkerPool<B>> {
        Arc::new(WorkerPool {
            backend,
            idle: Mutex::new(Vec::with_capacity(workers)),
            permits: Arc::new(Semaphore::new(workers)),
        })
    }

    /// Waits for a free worker and gives it a connection: an idle one of `version` if
    /// any, else any idle one, else a new one.
    pub async fn acquire(self: &Arc<Self>, version: &str) -> Result<Worker<B>, DbError> {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("the worker semaphore is never closed");
        let idle = {
            let mut idle = self.idle.lock().expect("pool lock");
            match idle.iter().rposition(|(served, _)| served == version) {
                Some(position) => Some(idle.remove(position).1),
                None => idle.pop().map(|(_, connection)| connection),
            }
        };
        let connection = match idle {
            Some(connection) => connection,
            None => self.backend.connect().await?,
        };
        Ok(Worker {
            version: version.to_string(),
            connection: Some(connection),
            pool: Arc::clone(self),
            _permit: permit,
        })
    }
}

/// A worker with its connection; dropping it returns both to the pool.
pub struct Worker<B: Consolidated> {
    version: String,
    connection: Option<B::Connection>,
    pool: Arc<WorkerPool<B>>,
    _permit: OwnedSemaphorePermit,
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
}

impl<B: Consolidated> Drop for Worker<B> {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            let version = std::mem::take(&mut self.version);
            self.pool
                .idle
                .lock()
                .expect("pool lock")
                .push((version, connection));
        }
    }
}
