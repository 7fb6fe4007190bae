//! Prepared statements kept per connection, by their SQL text.
//!
//! A sync runs the same dozen or so statements as the previous sync on its connection
//! (the fixed ones and the version's scripts, whose parameters are positional, so the
//! text repeats). Preparing each once per connection saves a round trip (Parse and
//! Describe) and PostgreSQL's parse analysis per statement per sync. Plans are still
//! made per execution for the values bound (`plan_cache_mode = force_custom_plan` on
//! every connection): a generic plan cannot see an upload's size.
//!
//! A cached statement whose tables changed is re-planned by PostgreSQL itself; one
//! whose result columns changed (`SELECT *` after `ALTER TABLE`) fails with
//! "cached plan must not change result type", after which the cache is cleared and the
//! sync's attempt is retried ([`is_stale_statement`]). The cache is also cleared after
//! any failed sync (a parameter type fixed at prepare may no longer fit a changed
//! column), when a script version changes revision, and whenever it reaches
//! [`PREPARED_STATEMENTS_MAX`] entries.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio_postgres::error::SqlState;
use tokio_postgres::{GenericClient, Statement};

/// Prepared statements one connection keeps at most.
pub const PREPARED_STATEMENTS_MAX: usize = 256;

#[derive(Default)]
pub struct Statements {
    /// Locked only to look up or insert, never across an await.
    entries: Mutex<HashMap<String, Statement>>,
}

impl Statements {
    /// The statement for `sql`, prepared on `client`'s connection the first time.
    pub async fn prepare(
        &self,
        client: &impl GenericClient,
        sql: &str,
    ) -> Result<Statement, tokio_postgres::Error> {
        let cached = self.lock().get(sql).cloned();
        if let Some(statement) = cached {
            return Ok(statement);
        }
        let statement = client.prepare(sql).await?;
        let mut entries = self.lock();
        if entries.len() >= PREPARED_STATEMENTS_MAX {
            entries.clear();
        }
        entries.insert(sql.to_string(), statement.clone());
        Ok(statement)
    }

    /// Forgets every statement (each is closed on the server as it is dropped).
    pub fn clear(&self) {
        self.lock().clear();
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Statement>> {
        // The map is consistent whenever the lock is released: a panic elsewhere
        // cannot leave it half-updated.
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Whether `error` says a cached statement no longer fits its tables.
pub fn is_stale_statement(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&SqlState::FEATURE_NOT_SUPPORTED)
        && error.as_db_error().is_some_and(|db| {
            db.message()
                .contains("cached plan must not change result type")
        })
}
