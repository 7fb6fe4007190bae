//! Rows that leave a table without a DELETE statement naming it, and partitioned
//! tables tracked at the partition level.
//!
//! PostgreSQL fires a statement-level trigger only on the table a statement names, and
//! clones only row-level triggers onto partitions. So a synchronized partitioned table
//! gets, on each of its partitions, its own copy of the table's statement-level delete
//! trigger (a `DELETE` aimed at a partition) and a `BEFORE TRUNCATE` trigger; its key
//! change trigger runs `BEFORE UPDATE`, since an update that moves a row to another
//! partition fires no `AFTER UPDATE` row trigger (it is a delete and an insert). Rows
//! that leave with their partition (`DETACH PARTITION`, `DROP TABLE`) and partitions
//! created later are followed by event triggers (`partitions.sql`), which need a
//! superuser once; `rs_partition` records the partitions followed.

use tokio_postgres::GenericClient;

use super::{deleted_table, CURRENT_XID};
use crate::names::column_list;
use crate::{quote_identifier as q, DbError};

/// The functions and event triggers every synchronized partitioned table shares.
const PARTITIONS_DDL: &str = include_str!("partitions.sql");

/// `rs_track_gone_<T>(relation)`: tombstones for every row `relation` (the table or one
/// of its partitions, its own rows only) holds, before they leave it without a delete
/// (`rs_track_gone(T, relation)` calls it by the table's name); and the table's own
/// `BEFORE TRUNCATE` trigger.
pub(super) fn truncate_ddl(name: &str, keys: &[String], partition_column: &str) -> String {
    let aggregated = keys
        .iter()
        .map(|key| format!("array_agg(o.{})", q(key)))
        .collect::<Vec<_>>()
        .join(", ");
    let partition = q(partition_column);
    let insert = format!(
        "INSERT INTO {batches} ({key_columns}, rs_partition, xid) \
         SELECT {aggregated}, o.{partition}::text, {CURRENT_XID} FROM ONLY %s AS o \
         WHERE o.{partition} IS NOT NULL GROUP BY o.{partition}::text",
        batches = q(&deleted_table(name)),
        key_columns = column_list(keys, ""),
    );
    format!(
        "
CREATE OR REPLACE FUNCTION rs_track_gone(tracked TEXT, relation oid) RETURNS void
LANGUAGE plpgsql AS $rs$
BEGIN
    EXECUTE format('SELECT %I(%s::regclass)', 'rs_track_gone_' || tracked, relation);
END $rs$;
CREATE OR REPLACE FUNCTION rs_track_truncate() RETURNS trigger LANGUAGE plpgsql AS $rs$
BEGIN
    PERFORM rs_track_gone(TG_ARGV[0], TG_RELID);
    RETURN NULL;
END $rs$;
CREATE OR REPLACE FUNCTION {gone}(relation regclass) RETURNS void LANGUAGE plpgsql AS $rs$
BEGIN
    EXECUTE format({insert}, relation);
END $rs$;
DROP TRIGGER IF EXISTS {trigger} ON {table};
CREATE TRIGGER {trigger} BEFORE TRUNCATE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION rs_track_truncate({name_literal});
",
        gone = q(&format!("rs_track_gone_{name}")),
        insert = super::quote_literal(&insert),
        trigger = q(&format!("rs_truncate_{name}")),
        table = q(name),
        name_literal = super::quote_literal(name),
    )
}

/// Whether `table` is a partitioned table.
pub(super) async fn is_partitioned(
    client: &impl GenericClient,
    table: &str,
) -> Result<bool, DbError> {
    let row = client
        .query_opt(
            "SELECT 1 FROM pg_class WHERE oid = to_regclass($1) AND relkind = 'p'",
            &[&q(table)],
        )
        .await?;
    Ok(row.is_some())
}

/// Keeps the event triggers from following partitions while `init`'s own DDL runs (for
/// the rest of its transaction): `follow_partitions` does it after.
pub(super) async fn initializing(client: &impl GenericClient) -> Result<(), DbError> {
    client
        .batch_execute("SET LOCAL rowsync.initializing = 'on'")
        .await?;
    Ok(())
}

/// Follows a partitioned table's partitions from now on: the shared functions and event
/// triggers, then the triggers on the partitions it has.
pub(super) async fn follow_partitions(
    client: &impl GenericClient,
    table: &str,
) -> Result<(), DbError> {
    // A role other than a superuser may init again once the event triggers are there
    // (it could not replace their functions, a superuser's).
    let installed_by_another: bool = client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_event_trigger WHERE evtname IN \
             ('rs_partitions_changed', 'rs_partitions_dropping', 'rs_partitions_dropped')) = 3 \
             AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)",
            &[],
        )
        .await?
        .get(0);
    if !installed_by_another {
        install_partitions_ddl(client, table).await?;
    }
    client
        .execute("SELECT rs_partitions_follow($1, false)", &[&table])
        .await?;
    Ok(())
}

/// `PARTITIONS_DDL`, or why it cannot be installed.
async fn install_partitions_ddl(client: &impl GenericClient, table: &str) -> Result<(), DbError> {
    client
        .batch_execute(PARTITIONS_DDL)
        .await
        .map_err(|error| match error.code() {
            Some(code) if *code == tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE => {
                DbError::Invalid(format!(
                    "table {table:?} is partitioned, and rowsync follows its partitions \
                     (detached, dropped or created later) with event triggers, which only a \
                     superuser may create: run `rowsync init` as a superuser for the first \
                     partitioned table; later ones need not be"
                ))
            }
            _ => DbError::from(error),
        })
}
