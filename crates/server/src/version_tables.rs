//! The tables each script version synchronizes, known to the stream stage so that an
//! upload naming any other table is refused as its first chunk arrives, whatever the
//! login (a token login never touches the database otherwise).
//!
//! Loaded from the version's scripts on an authentication connection the first time a
//! sync of the version uploads a table, then kept: the cache holds only versions that
//! exist (the administrator's, so it is bounded by them, and by `VERSIONS_CACHED_MAX`).
//! A cached list can be stale: a table it lacks is looked up once more before being
//! refused, so a table just added is never refused; a table just removed still meets
//! the worker's own check.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rowsync_consolidated::{Consolidated, ConsolidatedConnection, DbError, SyncError};

use crate::pool::WorkerPool;
use crate::session::VersionTables;

/// Versions whose tables are kept at most; when full, the cache starts again empty.
pub(crate) const VERSIONS_CACHED_MAX: usize = 1024;

#[derive(Default)]
pub(crate) struct VersionTablesCache {
    versions: Mutex<HashMap<String, Arc<VersionTables>>>,
}

impl VersionTablesCache {
    /// The version's tables as last loaded, if they were.
    pub(crate) fn cached(&self, version: &str) -> Option<Arc<VersionTables>> {
        self.lock().get(version).cloned()
    }

    /// Loads the version's tables from the database (and keeps them if it exists).
    pub(crate) async fn load<B: Consolidated>(
        &self,
        pool: &Arc<WorkerPool<B>>,
        version: &str,
    ) -> Result<Arc<VersionTables>, SyncError> {
        let mut worker = pool.acquire(version).await?;
        let loaded = load_tables(worker.connection(), version).await;
        let tables = match loaded {
            Ok(tables) => Arc::new(tables),
            Err(error) => {
                worker.discard();
                return Err(error.into());
            }
        };
        if tables.version_exists {
            let mut versions = self.lock();
            if versions.len() >= VERSIONS_CACHED_MAX && !versions.contains_key(version) {
                versions.clear();
            }
            versions.insert(version.to_string(), Arc::clone(&tables));
        }
        Ok(tables)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<VersionTables>>> {
        self.versions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The tables named by the version's scripts (connection scripts name none).
async fn load_tables<C: ConsolidatedConnection>(
    connection: &mut C,
    version: &str,
) -> Result<VersionTables, DbError> {
    let versions = connection.script_versions().await?;
    if !versions.iter().any(|(name, _)| name == version) {
        return Ok(VersionTables {
            other_versions: versions.into_iter().map(|(name, _)| name).collect(),
            ..VersionTables::default()
        });
    }
    let tables = connection
        .scripts(Some(version))
        .await?
        .into_iter()
        .map(|entry| entry.table)
        .filter(|table| !table.is_empty())
        .collect();
    Ok(VersionTables {
        version_exists: true,
        tables,
        other_versions: Vec::new(),
    })
}
