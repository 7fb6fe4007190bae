//! One sync's transaction on PostgreSQL: the primitives the sync driver composes.

use rowsync_protocol::{Row, TableUpload, Value};
use tokio_postgres::types::ToSql;
use tokio_postgres::Transaction;

use super::error::script_failure;
use super::events::{run_event, run_query_script};
use super::query::{
    bind_script, binds_of, query_rows, query_script, read_cursor, read_cursor_pair,
};
use super::rows::run_row_statements;
use super::schema::{
    deleted_table, foreign_keys, partition_value_misfit, quote_literal, table_shape,
    tombstone_table,
};
use super::scratch::{apply_scratch, apply_scratch_fast, ScratchTable, ScratchTarget};
use super::shapes::{schema_generation, CachedTable, ShapeCache, SyncGeneration};
use super::statements::Statements;
use super::value::Bind;
use crate::dialect::{
    CursorScript, CursorSink, Dialect, EchoXids, EndStep, OwnWrites, RowFailure, RowStatement,
    Savepoint, ScratchRows, Subscription, SubscriptionUpdate, TableApply,
};
use crate::echo::DownloadFilter;
use crate::foreign_keys::ForeignKey;
use crate::names::select_by_key;
use crate::parameters::{positional_parameters, Parameters, RowImages};
use crate::scripts::*;
use crate::shape::TableShape;
use crate::stored::KeysToCheck;
use crate::upload_rows::UploadedRow;
use crate::version_scripts::{ScriptRows, Scripts};
use crate::{quote_identifier as q, DownloadSender, SyncError};

/// The download watermark: the lowest transaction id still running in this statement's
/// snapshot, or the snapshot's `xmax` (latest completed + 1) when none is. Every
/// transaction below it has finished and is visible to the download cursors, which run
/// after it. Only the snapshot is trusted: `pg_xact_status` reads the commit log before
/// the process array, so a transaction whose commit is logged but not yet visible (for
/// instance while it waits for synchronous replication) would read as committed. Our
/// own id is at or above `xmax`, so the rows this sync wrote come down once more in the
/// client's next sync: a harmless duplicate.
const WATERMARK_QUERY: &str = concat!("SELECT ", snapshot_horizon!());

/// The client's lock (never waited for: a second sync of the client is refused), and the
/// announcement of a watermark at or below the one this sync will take: a shared
/// advisory lock on (`ANNOUNCED_WATERMARK_LOCK`, the horizon's low 32 bits), visible in
/// `pg_locks` at once, which cleanup reads and nobody ever takes exclusively, so no sync
/// waits for cleanup (see `schema::cleanup`). The horizon itself is a valid watermark
/// for every cursor that runs after it (see `Dialect::watermark` below). Last, the
/// schema generation the connection's cached table shapes are checked against
/// (`shapes`).
const LOCK_CLIENT_QUERY: &str = concat!(
    "SELECT pg_try_advisory_xact_lock(7262, hashtext($1)), \
     pg_advisory_xact_lock_shared(7264, ((h.horizon & 4294967295) \
       - CASE WHEN (h.horizon & 4294967295) >= 2147483648 THEN 4294967296 ELSE 0 END)::int4), \
     h.horizon, ",
    schema_generation!(),
    " FROM (SELECT ",
    snapshot_horizon!(),
    " AS horizon) AS h"
);

/// `Dialect::echo_xids`: this transaction's id (0 while it has none, i.e. wrote nothing)
/// for each cursor whose table it wrote exactly as often as its upload did. The counts
/// are PostgreSQL's own (`pg_stat_get_xact_*`: every writer, trigger and subtransaction
/// of this transaction). They also hold what earlier transactions of the connection
/// wrote until the backend flushes its statistics (at most once a second when busy), so
/// they are never below this transaction's writes and equality still proves that the
/// upload wrote everything; from PostgreSQL 15 on, `ECHO_XIDS_FLUSHING_QUERY` asks for a
/// flush when this transaction ends, so that the next sync's counts are its own. With
/// `track_counts` off the counts stay 0, never equal to what was uploaded. A
/// partitioned table counts its writes in its partitions, so it too leaves the work to
/// the echo filter. This form counts one tombstone row per key, as tracking set up
/// before tombstone batches keeps them; `echo_xids_batch_query` is the batches' form.
macro_rules! echo_xids_query {
    ($flush:literal) => {
        concat!(
            "SELECT CASE WHEN $3::int8 > 0 \
                  AND pg_stat_get_xact_tuples_inserted(t.oid) + pg_stat_get_xact_tuples_updated(t.oid) = $3::int8 \
                THEN x.id ELSE 0 END, \
                CASE WHEN $4::int8 > 0 AND pg_stat_get_xact_tuples_inserted(d.oid) = $4::int8 THEN x.id ELSE 0 END \
             FROM (SELECT COALESCE((pg_current_xact_id_if_assigned()::text)::bigint, 0) AS id) AS x, \
                  (SELECT to_regclass($1)::oid AS oid) AS t, (SELECT to_regclass($2)::oid AS oid) AS d",
            $flush
        )
    };
}
const ECHO_XIDS_QUERY: &str = echo_xids_query!("");
const ECHO_XIDS_FLUSHING_QUERY: &str =
    echo_xids_query!(", (SELECT pg_stat_force_next_flush()) AS flush");

/// `ECHO_XIDS_QUERY` for a table whose tombstones are kept in batches (`batches`, with
/// `first_key` its first key column): the transaction's tombstones are the upload's own
/// when every batch it wrote is one of the user's partition (`$4`) and those hold
/// exactly the upload's deletes (`$3` keys) — as the rows of the tombstone table before
/// batches were counted. `flush` asks for the statistics flush as above.
fn echo_xids_batch_query(batches: &str, first_key: &str, flush: bool) -> String {
    let batches_literal = quote_literal(&q(batches));
    format!(
        "SELECT CASE WHEN $2::int8 > 0 \
              AND pg_stat_get_xact_tuples_inserted(t.oid) + pg_stat_get_xact_tuples_updated(t.oid) = $2::int8 \
            THEN x.id ELSE 0 END, \
            CASE WHEN $3::int8 > 0 AND x.id <> 0 AND b.keys = $3::int8 \
              AND pg_stat_get_xact_tuples_inserted(to_regclass({batches_literal})) = b.batches \
            THEN x.id ELSE 0 END \
         FROM (SELECT COALESCE((pg_current_xact_id_if_assigned()::text)::bigint, 0) AS id) AS x \
         CROSS JOIN (SELECT to_regclass($1)::oid AS oid) AS t \
         CROSS JOIN LATERAL (SELECT count(*) AS batches, COALESCE(sum(cardinality(d.{first_key})), 0)::int8 AS keys \
             FROM {batches} AS d WHERE d.rs_partition = $4::text AND d.xid = x.id) AS b{flush}",
        batches = q(batches),
        first_key = q(first_key),
        flush = if flush {
            ", (SELECT pg_stat_force_next_flush()) AS flush"
        } else {
            ""
        },
    )
}

/// What this transaction has written so far to the tracked tables (each partition of a
/// partitioned one), by PostgreSQL's own counts; -1 with `track_counts` off, where the
/// counts stay 0 and prove nothing.
macro_rules! tracked_writes {
    () => {
        "(SELECT CASE WHEN current_setting('track_counts')::bool THEN COALESCE(sum( \
             pg_stat_get_xact_tuples_inserted(p.relid) + pg_stat_get_xact_tuples_updated(p.relid) \
             + pg_stat_get_xact_tuples_deleted(p.relid)), 0)::int8 ELSE -1 END \
         FROM rs_table AS r, LATERAL (SELECT to_regclass(quote_ident(r.table_name)) AS relid \
             UNION SELECT relid FROM pg_partition_tree(to_regclass(quote_ident(r.table_name)))) AS p)"
    };
}

/// Where `SUBSCRIPTION_UPSERT_COUNTING` leaves what the transaction had written before
/// the scripts after the cursors, for `LATE_WRITES_UPDATE` (a setting local to the
/// transaction: the two can be sent at once, as neither waits for the other's result).
macro_rules! writes_before_late_scripts {
    () => {
        "'rowsync.writes_before_late_scripts'"
    };
}

/// `Dialect::late_scripts_end`: the scripts after the cursors wrote to a tracked table
/// (or the counts cannot tell, or were not recorded), so the client's next sync skips
/// nothing of this one.
const LATE_WRITES_UPDATE: &str = concat!(
    "UPDATE rs_subscription SET last_sync_xid = 0 \
     FROM (SELECT NULLIF(current_setting(",
    writes_before_late_scripts!(),
    ", true), '')::int8 AS before) AS w \
     WHERE client_id = $1 AND (",
    tracked_writes!(),
    " IS DISTINCT FROM w.before OR w.before < 0)"
);

/// A table's partition column, and whether its tombstones are kept in batches.
const PARTITION_COLUMN_QUERY: &str = "SELECT CASE WHEN EXISTS (SELECT 1 FROM rs_table_rule AS r \
       WHERE r.table_name = rs_table.table_name) THEN NULL ELSE partition_column END, \
     to_regclass(quote_ident('rs_deleted_' || table_name)) IS NOT NULL, \
     EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = to_regclass(quote_ident(table_name)) \
             AND NOT t.tgisinternal AND t.tgname NOT LIKE 'rs\\_%') \
     OR EXISTS (SELECT 1 FROM pg_attribute c WHERE c.attrelid = to_regclass(quote_ident(table_name)) \
             AND c.attnum > 0 AND NOT c.attisdropped AND (c.attgenerated <> '' OR c.attidentity <> '')) \
     FROM rs_table WHERE table_name = $1";

const SUBSCRIPTION_QUERY: &str =
    "SELECT user_name, upload_sequence, download_watermark, last_sync_xid, upload_transfer_id \
     FROM rs_subscription WHERE client_id = $1";

macro_rules! subscription_upsert {
    ($returning:expr) => {
        concat!(
            "INSERT INTO rs_subscription (client_id, user_name, script_version, upload_sequence, download_watermark,
         download_acknowledged, last_sync_xid, last_sync_at, upload_transfer_id)
     VALUES ($1, $2, $3, $5, $6, $7, (pg_current_xact_id()::text)::bigint, now(), NULLIF($4, ''))
     ON CONFLICT (client_id) DO UPDATE SET
         script_version = excluded.script_version,
         upload_transfer_id = CASE WHEN excluded.upload_sequence > rs_subscription.upload_sequence
             THEN excluded.upload_transfer_id ELSE rs_subscription.upload_transfer_id END,
         upload_sequence = greatest(rs_subscription.upload_sequence, excluded.upload_sequence),
         download_watermark = excluded.download_watermark,
         download_acknowledged = greatest(rs_subscription.download_acknowledged, excluded.download_acknowledged),
         last_sync_xid = excluded.last_sync_xid,
         last_sync_at = excluded.last_sync_at",
            $returning
        )
    };
}

const SUBSCRIPTION_UPSERT: &str = subscription_upsert!("");
/// The upsert before scripts that run after the cursors: it keeps what the transaction
/// has written to tracked tables so far (`tracked_writes!`) for `LATE_WRITES_UPDATE`.
const SUBSCRIPTION_UPSERT_COUNTING: &str = subscription_upsert!(concat!(
    " RETURNING set_config(",
    writes_before_late_scripts!(),
    ", ",
    tracked_writes!(),
    "::text, true)"
));

/// A sync's transaction with the connection's prepared statements, and the SQL types of
/// the tables it has looked at (array scratch binds each column by its type).
pub struct PgTransaction<'c> {
    pub(super) transaction: Transaction<'c>,
    pub(super) statements: &'c Statements,
    /// The apply streams' lock timeout (`limit_lock_waits`).
    pub(super) lock_timeout_ms: u64,
    /// The connection's table shapes and partition columns (`shapes`): kept across
    /// syncs while the schema generation stays, else for this transaction only. Once
    /// the upload has run a statement on a table, the lock it holds until the end keeps
    /// `ALTER TABLE` out, so the shape cannot change meanwhile.
    pub(super) shapes: &'c mut ShapeCache,
    /// Where the generation this sync read is told to its apply streams.
    pub(super) generation: &'c SyncGeneration,
    /// The subscription read together with the client's lock, for `subscription`.
    pub(super) subscription: Option<(String, Option<Subscription>)>,
    /// The script version and revision the sync started with, checked together with
    /// the client's lock (no round trip of its own); none on an apply stream.
    pub(super) scripts_revision: Option<(&'c str, i64)>,
    /// The server has `pg_stat_force_next_flush` (PostgreSQL 15 and later).
    pub(super) flushes_counts: bool,
    /// The snapshot horizon read with the client's lock, while no upload statement has
    /// run since: the watermark, without a round trip of its own (see `watermark`).
    pub(super) lock_horizon: Option<i64>,
    /// Fast forms run in this transaction, each in a subtransaction of its own (see
    /// [`FAST_FORMS_PER_TRANSACTION_MAX`]).
    pub(super) fast_forms_run: usize,
}

/// Fast forms (`upload_insert_fast`) one sync transaction runs at most; beyond it the
/// checked scripts run alone. Each fast form that inserts takes a subtransaction id,
/// which stays in the backend's cache of 64 (`PGPROC_MAX_CACHED_SUBXIDS`) until the
/// transaction ends, released or not; past 64 every other session's snapshot checks
/// must read `pg_subtrans`. Half of it leaves room for the scripts' own savepoints.
pub(super) const FAST_FORMS_PER_TRANSACTION_MAX: usize = 32;

fn subscription_of(row: &tokio_postgres::Row) -> Subscription {
    Subscription {
        user_name: row.get(0),
        upload_sequence: row.get(1),
        download_watermark: row.get(2),
        last_sync_xid: row.get(3),
        upload_transfer_id: row.get(4),
    }
}

impl PgTransaction<'_> {
    /// What scratch a table's upload works with: its columns' SQL types as this
    /// transaction read its shape.
    fn scratch_target(&mut self, table: &str) -> ScratchTarget<'_> {
        let types = self
            .shapes
            .get(table)
            .map_or(&[][..], |cached| cached.types.as_slice());
        ScratchTarget {
            transaction: &self.transaction,
            statements: self.statements,
            types,
        }
    }

    /// Runs a statement (prepared once per connection) that returns exactly one row.
    async fn query_one(
        &self,
        sql: &str,
        parameters: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, SyncError> {
        let statement = self.statements.prepare(&self.transaction, sql).await?;
        Ok(self.transaction.query_one(&statement, parameters).await?)
    }
}

/// A statement of the sync's end (`Dialect::run_end_steps`), with its values.
pub(super) struct EndStatement {
    sql: &'static str,
    script: Option<(String, &'static str)>,
    text: Vec<String>,
    integers: Vec<i64>,
    values: Vec<Value>,
}

impl EndStatement {
    fn subscription(update: &SubscriptionUpdate<'_>) -> EndStatement {
        EndStatement {
            sql: if update.late_scripts {
                SUBSCRIPTION_UPSERT_COUNTING
            } else {
                SUBSCRIPTION_UPSERT
            },
            script: None,
            text: vec![
                update.client_id.to_string(),
                update.user.to_string(),
                update.script_version.to_string(),
                // Empty for none (`NULLIF`): transfer ids are never empty.
                update.upload_transfer_id.unwrap_or_default().to_string(),
            ],
            integers: vec![
                update.upload_sequence,
                update.download_watermark,
                update.download_acknowledged,
            ],
            values: Vec::new(),
        }
    }

    fn late_writes(client_id: &str) -> EndStatement {
        EndStatement {
            sql: LATE_WRITES_UPDATE,
            script: None,
            text: vec![client_id.to_string()],
            integers: Vec::new(),
            values: Vec::new(),
        }
    }

    /// A connection event's script bound to its values, if the version has one.
    fn event(
        scripts: &Scripts,
        event: &'static str,
        parameters: &Parameters<'_>,
    ) -> Result<Option<EndStatement>, SyncError> {
        let Some(script) = scripts.connection_event(event) else {
            return Ok(None);
        };
        let (sql, values) = bind_script(script, parameters, "", event)?;
        Ok(Some(EndStatement {
            sql: "",
            script: Some((sql, event)),
            text: Vec::new(),
            integers: Vec::new(),
            values,
        }))
    }

    /// A script's failure names its event.
    fn failure(&self, error: tokio_postgres::Error) -> SyncError {
        match &self.script {
            Some((_, event)) => script_failure(event, "", error),
            None => SyncError::from(error),
        }
    }

    fn sql(&self) -> &str {
        self.script.as_ref().map_or(self.sql, |(sql, _)| sql)
    }

    /// Its values in order: text, then integers, then a script's values.
    fn parameters<'v>(&'v self, binds: &'v [Bind<'v>]) -> Vec<&'v (dyn ToSql + Sync)> {
        let text = self.text.iter().map(|value| value as &(dyn ToSql + Sync));
        let integers = self
            .integers
            .iter()
            .map(|value| value as &(dyn ToSql + Sync));
        let binds = binds.iter().map(|bind| bind as &(dyn ToSql + Sync));
        text.chain(integers).chain(binds).collect()
    }
}

impl PgTransaction<'_> {
    /// Prepares each statement, then sends them all at once: `try_join_all` polls them
    /// in order, and each sends its request on its first poll, so they reach
    /// PostgreSQL, which runs them in order, as written.
    async fn run_end_steps_pipelined(&self, steps: &[EndStatement]) -> Result<(), SyncError> {
        let mut prepared = Vec::with_capacity(steps.len());
        for step in steps {
            let statement = self.statements.prepare(&self.transaction, step.sql()).await;
            prepared.push(statement.map_err(|error| step.failure(error))?);
        }
        let runs = steps
            .iter()
            .zip(&prepared)
            .map(|(step, statement)| async move {
                let binds = binds_of(&step.values);
                let parameters = step.parameters(&binds);
                let result = self.transaction.execute(statement, &parameters).await;
                result.map_err(|error| step.failure(error))
            });
        futures_util::future::try_join_all(runs).await?;
        Ok(())
    }
}

impl Dialect for PgTransaction<'_> {
    /// The lock, the subscription and the scripts' revision in one round trip: the
    /// statements are sent at once (pipelined) and PostgreSQL runs them in order, so
    /// the subscription is read by a statement that starts after the lock is held, as
    /// if sent after it. Read without the lock, it is dropped unused. A revision other
    /// than the one the sync started with is `SyncError::ScriptsChanged`.
    async fn lock_client(&mut self, client_id: &str) -> Result<bool, SyncError> {
        let lock = self
            .statements
            .prepare(&self.transaction, LOCK_CLIENT_QUERY)
            .await?;
        let read = self
            .statements
            .prepare(&self.transaction, SUBSCRIPTION_QUERY)
            .await?;
        let revision = self
            .statements
            .prepare(&self.transaction, super::events::SCRIPT_REVISION_QUERY)
            .await?;
        let version = self.scripts_revision.map_or("", |(version, _)| version);
        // `try_join3` polls in order, so the lock's statement is sent first.
        let (lock_row, subscription, revision_row) = futures_util::future::try_join3(
            self.transaction.query_one(&lock, &[&client_id]),
            self.transaction.query_opt(&read, &[&client_id]),
            async {
                match self.scripts_revision {
                    Some(_) => self.transaction.query_opt(&revision, &[&version]).await,
                    None => Ok(None),
                }
            },
        )
        .await?;
        if let Some((version, started_with)) = self.scripts_revision {
            let current: Option<i64> = revision_row.map(|row| row.get(0));
            if current != Some(started_with) {
                return Err(SyncError::ScriptsChanged {
                    version: version.to_string(),
                });
            }
        }
        let locked: bool = lock_row.get(0);
        self.lock_horizon = locked.then(|| lock_row.get(2));
        let generation: Option<i64> = lock_row.get(3);
        self.shapes.confirm(generation);
        self.generation.set(generation);
        if locked {
            let subscription = subscription.map(|row| subscription_of(&row));
            self.subscription = Some((client_id.to_string(), subscription));
        }
        Ok(locked)
    }

    async fn subscription(&mut self, client_id: &str) -> Result<Option<Subscription>, SyncError> {
        if let Some((read_for, subscription)) = self.subscription.take() {
            if read_for == client_id {
                return Ok(subscription);
            }
        }
        let statement = self
            .statements
            .prepare(&self.transaction, SUBSCRIPTION_QUERY)
            .await?;
        let row = self
            .transaction
            .query_opt(&statement, &[&client_id])
            .await?;
        Ok(row.map(|row| subscription_of(&row)))
    }

    async fn client_ids_of_user(&mut self, user: &str, count_max: u64) -> Result<u64, SyncError> {
        let count_max = i64::try_from(count_max).unwrap_or(i64::MAX);
        let row = self
            .transaction
            .query_one(
                "SELECT count(*) FROM (SELECT 1 FROM rs_subscription WHERE user_name = $1 LIMIT $2) AS s",
                &[&user, &count_max],
            )
            .await?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    async fn record_subscription(
        &mut self,
        update: &SubscriptionUpdate<'_>,
    ) -> Result<(), SyncError> {
        self.run_end_steps_pipelined(&[EndStatement::subscription(update)])
            .await
    }

    async fn late_scripts_end(&mut self, client_id: &str) -> Result<(), SyncError> {
        self.run_end_steps_pipelined(&[EndStatement::late_writes(client_id)])
            .await
    }

    /// Every step's statement prepared first (one at a time: a statement not yet
    /// prepared costs a round trip), then all sent at once.
    async fn run_end_steps(
        &mut self,
        scripts: &Scripts,
        parameters: &Parameters<'_>,
        steps: &[EndStep<'_>],
    ) -> Result<(), SyncError> {
        let mut statements = Vec::with_capacity(steps.len());
        for step in steps {
            let statement = match step {
                EndStep::Subscription(update) => EndStatement::subscription(update),
                EndStep::LateScriptsBegin => continue,
                EndStep::Event(event) => match EndStatement::event(scripts, event, parameters)? {
                    Some(statement) => statement,
                    None => continue,
                },
                EndStep::LateScriptsEnd(client_id) => EndStatement::late_writes(client_id),
            };
            statements.push(statement);
        }
        self.run_end_steps_pipelined(&statements).await
    }

    async fn run_event(
        &mut self,
        scripts: &Scripts,
        event: &str,
        parameters: &Parameters<'_>,
    ) -> Result<Option<ScriptRows>, SyncError> {
        run_event(
            &self.transaction,
            self.statements,
            scripts,
            event,
            parameters,
        )
        .await
    }

    /// The shape, the partition column and the foreign keys are read in one round trip
    /// (pipelined) and kept (`shapes`).
    async fn run_table_query(
        &mut self,
        scripts: &Scripts,
        table: &str,
        event: &str,
        parameters: &Parameters<'_>,
    ) -> Result<Option<ScriptRows>, SyncError> {
        run_query_script(
            &self.transaction,
            self.statements,
            scripts,
            table,
            event,
            parameters,
        )
        .await
    }

    async fn table_shape(&mut self, table: &str) -> Result<TableShape, SyncError> {
        if let Some(cached) = self.shapes.get(table) {
            return Ok(cached.shape.clone());
        }
        let partition = self
            .statements
            .prepare(&self.transaction, PARTITION_COLUMN_QUERY)
            .await?;
        let shape = async {
            table_shape(&self.transaction, Some(self.statements), table)
                .await
                .map_err(SyncError::from)
        };
        let partition =
            async { Ok::<_, SyncError>(self.transaction.query_opt(&partition, &[&table]).await?) };
        let keys = async {
            foreign_keys(&self.transaction, Some(self.statements), table)
                .await
                .map_err(SyncError::from)
        };
        let (found, partition, declared_keys) =
            futures_util::future::try_join3(shape, partition, keys).await?;
        let (shape, types) = found.ok_or_else(|| {
            SyncError::Schema(format!(
                "table {table:?} does not exist in the consolidated database"
            ))
        })?;
        let cached = CachedTable {
            shape: shape.clone(),
            types,
            partition: partition.as_ref().and_then(|row| row.get(0)),
            foreign_keys: declared_keys,
            tombstone_batches: partition.as_ref().is_some_and(|row| row.get(1)),
            server_writes: partition.as_ref().is_none_or(|row| row.get(2)),
        };
        self.shapes.insert(table, cached);
        Ok(shape)
    }

    async fn partition_column(&mut self, table: &str) -> Result<Option<String>, SyncError> {
        if let Some(cached) = self.shapes.get(table) {
            return Ok(cached.partition.clone());
        }
        let statement = self
            .statements
            .prepare(&self.transaction, PARTITION_COLUMN_QUERY)
            .await?;
        let row = self.transaction.query_opt(&statement, &[&table]).await?;
        Ok(row.and_then(|row| row.get(0)))
    }

    async fn keys_to_check(
        &mut self,
        shape: &TableShape,
        upload: &TableUpload,
        key_positions: &[usize],
    ) -> Result<KeysToCheck, SyncError> {
        Ok(match self.shapes.get(&shape.name) {
            Some(cached) => super::stored::keys_to_check(cached, upload, key_positions),
            None => KeysToCheck::All,
        })
    }

    /// Read and kept with the table's shape.
    async fn partition_value_misfit(
        &mut self,
        table: &str,
        column: &str,
        user: &str,
    ) -> Result<Option<String>, SyncError> {
        self.table_shape(table).await?;
        let Some(sql_type) = self.shapes.get(table).and_then(|cached| {
            let index = cached.shape.columns.iter().position(|c| c.name == column)?;
            Some(cached.types[index].clone())
        }) else {
            return Ok(None);
        };
        Ok(partition_value_misfit(&self.transaction, &sql_type, user).await?)
    }

    async fn foreign_keys(&mut self, table: &str) -> Result<Vec<ForeignKey>, SyncError> {
        if self.shapes.get(table).is_none() {
            self.table_shape(table).await?;
        }
        Ok(self
            .shapes
            .get(table)
            .map(|cached| cached.foreign_keys.clone())
            .unwrap_or_default())
    }

    /// `SET CONSTRAINTS ... DEFERRED` naming the cycle's DEFERRABLE keys (`init` refuses
    /// a cycle with one that is not; naming one would be an error).
    async fn defer_foreign_keys(&mut self, keys: &[ForeignKey]) -> Result<(), SyncError> {
        let mut names: Vec<String> = keys
            .iter()
            .filter(|key| key.deferrable)
            .map(|key| q(&key.constraint))
            .collect();
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Ok(());
        }
        let sql = format!("SET CONSTRAINTS {} DEFERRED", names.join(", "));
        self.transaction.batch_execute(&sql).await?;
        Ok(())
    }

    async fn savepoint(&mut self, step: Savepoint) -> Result<(), SyncError> {
        self.transaction.batch_execute(step.sql()).await?;
        Ok(())
    }

    async fn dropped_columns(
        &mut self,
        version: &str,
        table: &str,
    ) -> Result<Vec<String>, SyncError> {
        Ok(super::schema::dropped_columns(&self.transaction, version, table).await?)
    }

    async fn apply_scratch(
        &mut self,
        table: &TableApply<'_>,
        scratch: ScratchRows<'_, '_>,
    ) -> Result<Vec<Row>, SyncError> {
        self.lock_horizon = None;
        apply_scratch(&self.scratch_target(table.table()), table, scratch).await
    }

    fn runs_fast_forms(&self) -> bool {
        self.fast_forms_run < FAST_FORMS_PER_TRANSACTION_MAX
    }

    async fn apply_scratch_fast(
        &mut self,
        table: &TableApply<'_>,
        scratch: ScratchRows<'_, '_>,
        fast_event: &'static str,
    ) -> Result<Option<u64>, SyncError> {
        self.lock_horizon = None;
        self.fast_forms_run += 1;
        apply_scratch_fast(
            &self.scratch_target(table.table()),
            table,
            scratch,
            fast_event,
        )
        .await
    }

    async fn run_row_statements(
        &mut self,
        statement: &RowStatement<'_>,
        rows: &[UploadedRow],
    ) -> Result<Result<Vec<u64>, RowFailure>, SyncError> {
        self.lock_horizon = None;
        run_row_statements(&self.transaction, self.statements, statement, rows).await
    }

    async fn resolve_conflicts_set(
        &mut self,
        table: &TableApply<'_>,
        columns: &[String],
        conflicted: &[UploadedRow],
    ) -> Result<(), SyncError> {
        let transaction = &self.transaction;
        let name = table.table();
        let scratch =
            ScratchTable::create(transaction, "clash", table.shape, columns, true, true).await?;
        let operations: Vec<Value> = conflicted
            .iter()
            .map(|row| Value::Text(row.operation.to_string()))
            .collect();
        let nulls = vec![Value::Null; columns.len()];
        let rows = conflicted.iter().zip(&operations).map(|(row, operation)| {
            std::iter::once(operation)
                .chain(row.new.as_ref().unwrap_or(&nulls))
                .chain(row.old.as_ref().unwrap_or(&nulls))
                .collect()
        });
        scratch
            .load(transaction, name, rows, conflicted.len())
            .await?;
        query_script(
            transaction,
            self.statements,
            table.scripts,
            name,
            RESOLVE_CONFLICT,
            &[(CONFLICTS_PLACEHOLDER, &scratch.name)],
            table.parameters,
        )
        .await?;
        Ok(())
    }

    async fn current_row(
        &mut self,
        table: &str,
        columns: &[String],
        key_positions: &[usize],
        key: &[Value],
    ) -> Result<Option<Row>, SyncError> {
        let sql = select_by_key(&q(table), columns, key_positions, |n| format!("${n}"));
        let (_, rows) = query_rows(&self.transaction, self.statements, &sql, key).await?;
        Ok(rows.into_iter().next())
    }

    async fn run_for_row(
        &mut self,
        statement: &RowStatement<'_>,
        images: &RowImages<'_>,
    ) -> Result<(), SyncError> {
        let (sql, names) = positional_parameters(statement.sql);
        let values = names
            .iter()
            .map(|name| {
                statement.parameters.value_for_row(
                    name,
                    Some(images),
                    statement.table,
                    statement.event,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        query_rows(&self.transaction, self.statements, &sql, &values)
            .await
            .map_err(|error| script_failure(statement.event, statement.table, error))?;
        Ok(())
    }

    async fn fetch_by_keys(
        &mut self,
        table: &TableApply<'_>,
        keys: &[Row],
    ) -> Result<ScriptRows, SyncError> {
        let transaction = &self.transaction;
        let shape = table.shape;
        let scratch =
            ScratchTable::create(transaction, "keys", shape, &shape.key_columns, false, false)
                .await?;
        let rows = keys.iter().map(|row| row.iter().collect());
        scratch
            .load(transaction, &shape.name, rows, keys.len())
            .await?;
        query_script(
            transaction,
            self.statements,
            table.scripts,
            &shape.name,
            UPLOAD_FETCH,
            &[(KEYS_PLACEHOLDER, &scratch.name)],
            table.parameters,
        )
        .await
    }

    /// The horizon read with the client's lock when no upload statement has run since
    /// (an empty upload: only connection events ran between the two), else read now.
    /// The earlier horizon is as valid a watermark: every transaction below it had
    /// finished when the lock was taken, so it is visible to the cursors, which run
    /// later, and every transaction that may still commit was running then (its id is
    /// at or above the horizon) or began later (its id is at or above the snapshot's
    /// `xmax`, which is at or above the horizon). It is at most lower, so that a row
    /// committed in between comes down once more in the next sync: read so, the
    /// watermark costs no round trip, and after an upload a fresh one keeps the
    /// duplicates of a long apply out.
    async fn watermark(&mut self) -> Result<i64, SyncError> {
        if let Some(horizon) = self.lock_horizon {
            return Ok(horizon);
        }
        Ok(self.query_one(WATERMARK_QUERY, &[]).await?.get(0))
    }

    async fn echo_xids(
        &mut self,
        table: &str,
        written: OwnWrites,
        user: &str,
    ) -> Result<EchoXids, SyncError> {
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let shape = self.table_shape(table).await?;
        let batches = self
            .shapes
            .get(table)
            .is_some_and(|cached| cached.tombstone_batches);
        let (upserts, deletes) = (count(written.upserts), count(written.deletes));
        let row = match shape.key_columns.first() {
            Some(first_key) if batches => {
                let sql =
                    echo_xids_batch_query(&deleted_table(table), first_key, self.flushes_counts);
                self.query_one(&sql, &[&q(table), &upserts, &deletes, &user])
                    .await?
            }
            _ => {
                let sql = if self.flushes_counts {
                    ECHO_XIDS_FLUSHING_QUERY
                } else {
                    ECHO_XIDS_QUERY
                };
                let tombstones = q(&tombstone_table(table));
                self.query_one(sql, &[&q(table), &tombstones, &upserts, &deletes])
                    .await?
            }
        };
        Ok(EchoXids {
            upserts: row.get(0),
            deletes: row.get(1),
        })
    }

    async fn read_cursor(
        &mut self,
        cursor: &CursorScript<'_>,
        sink: &mut CursorSink<'_, '_>,
    ) -> Result<(), SyncError> {
        read_cursor(&self.transaction, self.statements, cursor, sink).await
    }

    async fn read_cursors(
        &mut self,
        cursors: &[CursorScript<'_>],
        filter: &mut DownloadFilter<'_>,
        download: &DownloadSender,
    ) -> Result<(), SyncError> {
        if let [first, second] = cursors {
            let pair = [first, second];
            return read_cursor_pair(&self.transaction, self.statements, pair, filter, download)
                .await;
        }
        crate::dialect::read_cursors_in_turn(self, cursors, filter, download).await
    }

    async fn limit_lock_waits(&mut self) -> Result<(), SyncError> {
        // Apply streams: an upload follows.
        self.lock_horizon = None;
        let ms = self.lock_timeout_ms;
        let sql = format!("SET LOCAL lock_timeout = '{ms}ms'");
        Ok(self.transaction.batch_execute(&sql).await?)
    }

    async fn prepare(self, gid: &str) -> Result<(), SyncError> {
        self.transaction
            .batch_execute(&format!("PREPARE TRANSACTION {}", quote_literal(gid)))
            .await?;
        // The session has no transaction any more: dropping ours sends a ROLLBACK that
        // PostgreSQL answers with a warning, not waited for.
        drop(self.transaction);
        Ok(())
    }

    async fn record_decision(&mut self, group: &str) -> Result<bool, SyncError> {
        let recorded = self
            .transaction
            .execute(super::streams::RECORD_DECISION, &[&group])
            .await?;
        Ok(recorded == 1)
    }

    async fn commit(self) -> Result<(), SyncError> {
        Ok(self.transaction.commit().await?)
    }

    async fn rollback(self) -> Result<(), SyncError> {
        Ok(self.transaction.rollback().await?)
    }
}
