//! Database workers: at most `workers` syncs do database work at once, each on one
//! pooled connection that it holds only for that work.

use std::sync::{Arc, Mutex};

use rowsync_consolidated::{Consolidated, DbError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct WorkerPool<B: Consolidated> {
    backend: B,
    idle: Mutex<Vec<B::Connection>>,
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

    /// Waits for a free worker and gives it a connection (reused, or opened if none idle).
    pub async fn acquire(self: &Arc<Self>) -> Result<Worker<B>, DbError> {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("the worker semaphore is never closed");
        let idle = self.idle.lock().expect("pool lock").pop();
        let connection = match idle {
            Some(connection) => connection,
            None => self.backend.connect().await?,
        };
        Ok(Worker {
            connection: Some(connection),
            pool: Arc::clone(self),
            _permit: permit,
        })
    }
}

/// A worker with its connection; dropping it returns both to the pool.
pub struct Worker<B: Consolidated> {
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
            self.pool.idle.lock().expect("pool lock").push(connection);
        }
    }
}
