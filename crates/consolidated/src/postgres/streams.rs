//! Apply streams on PostgreSQL (see `driver::streams`): a pool of connections beside the
//! workers' that apply shares of large uploads, two-phase commit (`PREPARE TRANSACTION`,
//! `COMMIT PREPARED`), the decision table `rs_stream_decision`, and the recovery of
//! groups a crashed server left prepared.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::schema::quote_literal;
use super::{PostgresConnection, PostgresConsolidated};
use crate::driver::GID_PREFIX;
use crate::{ApplyStreamSettings, DbError, SyncError};

/// How long a decision to roll back stays recorded, in hours: a sync whose streams a
/// starting server rolled back must still find it when it tries to commit.
pub const ABORT_DECISION_KEEP_HOURS: u32 = 24;

/// The apply stream connections of one consolidated database, shared by every worker:
/// at most `streams_max - 1` open, kept idle between syncs.
pub struct StreamPool {
    pub(super) settings: ApplyStreamSettings,
    url: String,
    idle: Mutex<Vec<PostgresConnection>>,
    open: AtomicUsize,
    /// Whether the server allows prepared transactions (`max_prepared_transactions`).
    supported: OnceCell<bool>,
}

impl StreamPool {
    pub fn new(url: &str, settings: ApplyStreamSettings) -> StreamPool {
        StreamPool {
            settings,
            url: url.to_string(),
            idle: Mutex::new(Vec::new()),
            open: AtomicUsize::new(0),
            supported: OnceCell::new(),
        }
    }

    fn open_max(&self) -> usize {
        self.settings.streams_max.saturating_sub(1)
    }

    /// Whether this server can prepare transactions, asked once.
    async fn supported(&self, client: &Client) -> bool {
        *self
            .supported
            .get_or_init(|| async {
                let allowed = match client
                    .query_one("SHOW max_prepared_transactions", &[])
                    .await
                {
                    Ok(row) => row.get::<_, String>(0).parse::<u32>().unwrap_or(0),
                    Err(error) => {
                        tracing::warn!(%error, "reading max_prepared_transactions failed");
                        0
                    }
                };
                if allowed == 0 {
                    tracing::info!(
                        "max_prepared_transactions is 0: uploads are applied on one stream"
                    );
                }
                allowed > 0
            })
            .await
    }

    /// Up to `count` connections: idle ones first, then new ones while fewer than
    /// `streams_max - 1` are open.
    pub async fn take(&self, client: &Client, count: usize) -> Vec<PostgresConnection> {
        if count == 0 || !self.supported(client).await {
            return Vec::new();
        }
        let mut taken: Vec<PostgresConnection> = {
            let mut idle = self
                .idle
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            let keep = idle.len().saturating_sub(count);
            idle.split_off(keep)
        };
        let wanted = count - taken.len();
        let reserved = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                Some(open + wanted.min(self.open_max().saturating_sub(open)))
            })
            .map_or(0, |open| wanted.min(self.open_max().saturating_sub(open)));
        let opening = (0..reserved).map(|_| self.connect());
        for opened in futures_util::future::join_all(opening).await {
            match opened {
                Ok(connection) => taken.push(connection),
                Err(error) => {
                    self.open.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(%error, "opening an apply stream connection failed");
                }
            }
        }
        taken
    }

    async fn connect(&self) -> Result<PostgresConnection, DbError> {
        let connection = PostgresConsolidated::open(&self.url, None).await?;
        // A stream waiting for a lock a sibling holds prepared would wait forever.
        let ms = self.settings.lock_timeout_ms;
        connection
            .client
            .batch_execute(&format!("SET lock_timeout = '{ms}ms'"))
            .await?;
        Ok(connection)
    }

    /// Takes connections back; after a failure, those whose link is closed are dropped
    /// and the others prepare their statements afresh.
    pub fn give_back(&self, connections: Vec<PostgresConnection>, healthy: bool) {
        let mut kept = Vec::with_capacity(connections.len());
        for connection in connections {
            if connection.client.is_closed() {
                self.open.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            if !healthy {
                connection.statements.clear();
            }
            kept.push(connection);
        }
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        idle.extend(kept);
    }
}

/// Commits or rolls back one prepared transaction; one that no longer exists was
/// resolved by someone else.
pub async fn finish_prepared(client: &Client, gid: &str, commit: bool) -> Result<(), SyncError> {
    let verb = if commit { "COMMIT" } else { "ROLLBACK" };
    match client
        .batch_execute(&format!("{verb} PREPARED {}", quote_literal(gid)))
        .await
    {
        Err(error) if error.code() == Some(&SqlState::UNDEFINED_OBJECT) => Ok(()),
        other => Ok(other?),
    }
}

/// Resolves one group from its decision: none recorded is recorded as a rollback (the
/// unique key makes this and the sync's own decision exclusive), then every prepared
/// transaction of the group is finished as decided. Returns how many were.
pub async fn resolve_group(client: &Client, group: &str) -> Result<u64, SyncError> {
    client
        .execute(
            "INSERT INTO rs_stream_decision (group_id, committed) VALUES ($1, false) \
             ON CONFLICT (group_id) DO NOTHING",
            &[&group],
        )
        .await?;
    let committed: bool = client
        .query_one(
            "SELECT committed FROM rs_stream_decision WHERE group_id = $1",
            &[&group],
        )
        .await?
        .get(0);
    let pattern = format!("{}-%", group.replace('_', "\\_").replace('%', "\\%"));
    let prepared = client
        .query(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE $1",
            &[&pattern],
        )
        .await?;
    for row in &prepared {
        finish_prepared(client, row.get(0), committed).await?;
    }
    tracing::info!(
        group,
        committed,
        transactions = prepared.len(),
        "resolved apply streams"
    );
    Ok(prepared.len() as u64)
}

/// Records that `group` is to be committed, in the sync's transaction; false when a
/// recovering server recorded a rollback first.
pub const RECORD_DECISION: &str = "INSERT INTO rs_stream_decision (group_id, committed) \
    VALUES ($1, true) ON CONFLICT (group_id) DO NOTHING";

/// Drops the decisions no longer needed: commits whose group has no prepared
/// transaction left, rollbacks older than `ABORT_DECISION_KEEP_HOURS` (run by cleanup
/// and at start-up, not by the syncs).
pub async fn forget_finished(client: &Client) -> Result<u64, tokio_postgres::Error> {
    client
        .execute(
            &format!(
                "DELETE FROM rs_stream_decision d WHERE (committed OR decided_at < now() - interval '{ABORT_DECISION_KEEP_HOURS} hours') \
                 AND NOT EXISTS (SELECT 1 FROM pg_prepared_xacts p \
                     WHERE p.database = current_database() AND p.gid LIKE d.group_id || '-%')"
            ),
            &[],
        )
        .await
}

/// At start-up: resolves every group of this database left prepared, then drops the
/// decisions no longer needed (commits whose group is gone, rollbacks older than
/// `ABORT_DECISION_KEEP_HOURS`, see [`forget_finished`]). Returns the transactions resolved.
pub async fn recover(client: &Client) -> Result<u64, DbError> {
    let pattern = format!("{GID_PREFIX}%");
    let groups = client
        .query(
            "SELECT DISTINCT regexp_replace(gid, '-[0-9]+$', '') FROM pg_prepared_xacts \
             WHERE database = current_database() AND gid LIKE $1",
            &[&pattern],
        )
        .await?;
    let mut resolved = 0;
    for row in &groups {
        let group: String = row.get(0);
        resolved += resolve_group(client, &group).await.map_err(|error| {
            DbError::Invalid(format!("resolving apply streams {group}: {error}"))
        })?;
    }
    forget_finished(client).await?;
    Ok(resolved)
}

/// The pool a worker's connection takes streams from (none for stream connections).
pub type SharedPool = Option<Arc<StreamPool>>;
