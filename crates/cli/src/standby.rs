//! `rowsync serve --ha`: a server meant for a highly available farm checks at start that
//! its PostgreSQL replicates synchronously. A sync is acknowledged once its transaction
//! commits; with asynchronous replication (or none) a failover to a standby can lose
//! syncs the clients were told had landed, and those clients never send them again.

use anyhow::Result;
use rowsync_consolidated::ConsolidatedConnection;
use rowsync_protocol::Value;

use crate::database::Database;

/// What the database says of its synchronous standbys.
#[derive(Debug, PartialEq, Eq)]
pub enum Standby {
    /// Standbys replicating synchronously now.
    Synchronous(i64),
    /// `synchronous_standby_names` is empty: commits wait for no standby.
    NoneConfigured,
    /// Named in `synchronous_standby_names`, but none replicating synchronously now
    /// (commits wait for one to come back).
    NoneConnected(String),
    /// The role may not read `pg_stat_replication` (it needs `pg_read_all_stats`).
    Unknown(String),
    /// Not PostgreSQL: the farm's failover is not checked.
    NotPostgres(&'static str),
}

pub async fn check(
    connection: &mut impl ConsolidatedConnection,
    database: &Database,
) -> Result<Standby> {
    if !matches!(database, Database::Postgres(_)) {
        return Ok(Standby::NotPostgres(database.kind()));
    }
    let rows = connection
        .query_sql(
            "SELECT current_setting('synchronous_standby_names'),
                    (SELECT count(*) FROM pg_stat_replication
                     WHERE sync_state IN ('sync', 'quorum')),
                    (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL)",
        )
        .await?;
    let (names, synchronous, hidden) = match rows.first().map(Vec::as_slice) {
        Some([Value::Text(names), Value::Int(synchronous), Value::Int(hidden)]) => {
            (names.clone(), *synchronous, *hidden)
        }
        other => anyhow::bail!("the standby check read {other:?}"),
    };
    Ok(match (names.trim().is_empty(), synchronous, hidden) {
        (true, _, _) => Standby::NoneConfigured,
        (false, 0, 0) => Standby::NoneConnected(names),
        (false, 0, _) => Standby::Unknown(names),
        (false, count, _) => Standby::Synchronous(count),
    })
}

/// The warning `--ha` prints for what the database said, if any.
pub fn warning(standby: &Standby) -> Option<String> {
    const LOSES: &str = "a failover can lose syncs their clients were told had landed \
                         (docs/operations.md, \"Running a farm\")";
    match standby {
        Standby::Synchronous(_) => None,
        Standby::NoneConfigured => Some(format!(
            "warning: --ha, but the database replicates to no synchronous standby \
             (synchronous_standby_names is empty): {LOSES}"
        )),
        Standby::NoneConnected(names) => Some(format!(
            "warning: --ha, but no standby of synchronous_standby_names = '{names}' is \
             replicating synchronously now: commits wait until one is"
        )),
        Standby::Unknown(names) => Some(format!(
            "warning: --ha: synchronous_standby_names = '{names}', but this role cannot see \
             whether a standby replicates synchronously (grant it pg_read_all_stats)"
        )),
        Standby::NotPostgres(kind) => Some(format!(
            "warning: --ha checks PostgreSQL's synchronous standby; on {kind} the farm's \
             failover is not checked"
        )),
    }
}
