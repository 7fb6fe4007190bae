//! One sync's transaction on MySQL: the primitives the sync driver composes. Before the
//! transaction starts, a stamper transaction stamps committed rows (see `stamp`); the
//! sync's REPEATABLE READ view is created after it committed.

use std::collections::HashMap;

use mysql_async::prelude::Queryable;
use mysql_async::{Transaction, TxOpts};
use rowsync_protocol::{Row, Value};

use super::error::{db, row_script_failure, server_code, LOCK_NOT_GRANTED};
use super::events::{run_event, run_query_script};
use super::query::{bind_script, run, run_script};
use super::schema::{column_limits, foreign_keys, table_shape, ColumnLimits};
use super::scratch::{apply_scratch, ScratchTable};
use super::stamp::stamp_committed_rows;
use super::value::{column_names, read_row};
use super::MysqlConnection;
use crate::dialect::{
    CursorScript, CursorSink, Dialect, RowFailure, RowStatement, Savepoint, ScratchRows,
    Subscription, SubscriptionUpdate, SyncBackend, TableApply,
};
use crate::foreign_keys::ForeignKey;
use crate::names::select_by_key;
use crate::parameters::{Parameters, RowImages};
use crate::scripts::*;
use crate::shape::{is_number, TableShape};
use crate::upload_rows::UploadedRow;
use crate::version_scripts::{ScriptRows, Scripts};
use crate::{quote_identifier as q, CursorBatch, SyncError};

const SUBSCRIPTION_UPSERT: &str =
    "INSERT INTO rs_subscription (client_id, user_name, script_version, upload_sequence, download_watermark,
         download_acknowledged, last_sync_xid, last_sync_at, upload_transfer_id)
     VALUES (?, ?, ?, ?, ?, ?, ?, CURRENT_TIMESTAMP(6), ?)
     ON DUPLICATE KEY UPDATE
         script_version = VALUES(script_version),
         upload_transfer_id = IF(VALUES(upload_sequence) > upload_sequence,
             VALUES(upload_transfer_id), upload_transfer_id),
         upload_sequence = GREATEST(upload_sequence, VALUES(upload_sequence)),
         download_watermark = VALUES(download_watermark),
         download_acknowledged = GREATEST(download_acknowledged, VALUES(download_acknowledged)),
         last_sync_xid = VALUES(last_sync_xid),
         last_sync_at = VALUES(last_sync_at)";

impl SyncBackend for MysqlConnection {
    type Transaction<'t> = MysqlTransaction<'t>;

    async fn begin(&mut self) -> Result<MysqlTransaction<'_>, SyncError> {
        let tables = self.stamped_tables().await?;
        let stamp = stamp_committed_rows(&mut self.connection, &tables).await?;
        // The triggers mark what this sync writes with its stamp (`rs_origin`).
        self.connection
            .exec_drop("SET @rs_sync = ?", (stamp,))
            .await
            .map_err(db)?;
        self.sync_marked = true;
        let transaction = self
            .connection
            .start_transaction(TxOpts::default())
            .await
            .map_err(db)?;
        Ok(MysqlTransaction {
            transaction,
            stamp,
            marked: &mut self.sync_marked,
            column_limits: HashMap::new(),
            partition_columns: HashMap::new(),
        })
    }

    fn may_retry(&mut self, error: &SyncError) -> bool {
        super::error::may_retry(error)
    }

    fn after_failure(&mut self) {
        // A table's key may have changed under the stamper's cache: look it up afresh.
        self.stamping.clear();
    }
}

/// A sync's open transaction and the stamp its stamper gave (the watermark is one more).
pub struct MysqlTransaction<'c> {
    transaction: Transaction<'c>,
    stamp: i64,
    /// Whether `@rs_sync` is still set on the connection (cleared at commit).
    marked: &'c mut bool,
    /// What the columns of the tables looked at would change silently (digits after
    /// the point, text in a numeric column), by table: scratch refuses such values.
    column_limits: HashMap<String, ColumnLimits>,
    /// The partition columns read (asked by the upload and again by the download).
    partition_columns: HashMap<String, Option<String>>,
}

impl Dialect for MysqlTransaction<'_> {
    async fn lock_client(&mut self, client_id: &str) -> Result<bool, SyncError> {
        // A row lock on the client, never waited for: a lock wait of 0 s fails at once.
        let transaction = &mut self.transaction;
        transaction
            .query_drop("SET SESSION innodb_lock_wait_timeout = 0")
            .await
            .map_err(db)?;
        let mut locked = transaction
            .exec_drop(
                "INSERT IGNORE INTO rs_sync_lock (client_id) VALUES (?)",
                (client_id,),
            )
            .await;
        if locked.is_ok() {
            locked = transaction
                .exec_drop(
                    "SELECT 1 FROM rs_sync_lock WHERE client_id = ? FOR UPDATE",
                    (client_id,),
                )
                .await;
        }
        transaction
            .query_drop("SET SESSION innodb_lock_wait_timeout = DEFAULT")
            .await
            .map_err(db)?;
        match locked {
            Ok(()) => Ok(true),
            Err(error)
                if server_code(&error).is_some_and(|code| LOCK_NOT_GRANTED.contains(&code)) =>
            {
                Ok(false)
            }
            Err(error) => Err(SyncError::Database(db(error))),
        }
    }

    async fn subscription(&mut self, client_id: &str) -> Result<Option<Subscription>, SyncError> {
        let row: Option<(String, i64, i64, i64, Option<String>)> = self
            .transaction
            .exec_first(
                "SELECT user_name, upload_sequence, download_watermark, last_sync_xid, \
                 upload_transfer_id FROM rs_subscription WHERE client_id = ?",
                (client_id,),
            )
            .await
            .map_err(db)?;
        Ok(row.map(
            |(user_name, upload_sequence, download_watermark, last_sync_xid, transfer_id)| {
                Subscription {
                    user_name,
                    upload_sequence,
                    download_watermark,
                    last_sync_xid,
                    upload_transfer_id: transfer_id,
                }
            },
        ))
    }

    async fn client_ids_of_user(&mut self, user: &str, count_max: u64) -> Result<u64, SyncError> {
        let count: Option<i64> = self
            .transaction
            .exec_first(
                "SELECT count(*) FROM (SELECT 1 FROM rs_subscription WHERE user_name = ? LIMIT ?) AS s",
                (user, count_max),
            )
            .await
            .map_err(db)?;
        Ok(count.unwrap_or(0) as u64)
    }

    async fn record_subscription(
        &mut self,
        update: &SubscriptionUpdate<'_>,
    ) -> Result<(), SyncError> {
        self.transaction
            .exec_drop(
                SUBSCRIPTION_UPSERT,
                (
                    update.client_id,
                    update.user,
                    update.script_version,
                    update.upload_sequence,
                    update.download_watermark,
                    update.download_acknowledged,
                    self.stamp,
                    update.upload_transfer_id,
                ),
            )
            .await
            .map_err(db)?;
        // Visible when the subscription is: from then on cleanup reads the watermark there.
        self.transaction
            .query_drop("DELETE FROM rs_sync_in_flight WHERE connection_id = CONNECTION_ID()")
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn late_scripts_begin(&mut self) -> Result<(), SyncError> {
        // Their rows carry origin 0, as other writers' do: the client's next sync, which
        // skips this sync's origin, brings them.
        self.transaction
            .query_drop("SET @rs_sync = 0")
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn run_event(
        &mut self,
        scripts: &Scripts,
        event: &str,
        parameters: &Parameters<'_>,
    ) -> Result<Option<ScriptRows>, SyncError> {
        run_event(&mut self.transaction, scripts, event, parameters).await
    }

    async fn run_table_query(
        &mut self,
        scripts: &Scripts,
        table: &str,
        event: &str,
        parameters: &Parameters<'_>,
    ) -> Result<Option<ScriptRows>, SyncError> {
        run_query_script(&mut self.transaction, scripts, table, event, parameters).await
    }

    async fn table_shape(&mut self, table: &str) -> Result<TableShape, SyncError> {
        let (shape, columns) = table_shape(&mut self.transaction, table)
            .await?
            .ok_or_else(|| {
                SyncError::Schema(format!(
                    "table {table:?} does not exist in the consolidated database"
                ))
            })?;
        self.column_limits
            .insert(table.to_string(), column_limits(&columns));
        Ok(shape)
    }

    async fn partition_column(&mut self, table: &str) -> Result<Option<String>, SyncError> {
        if let Some(column) = self.partition_columns.get(table) {
            return Ok(column.clone());
        }
        // NULL for a table whose rule is not `owner`.
        let column: Option<Option<String>> = self
            .transaction
            .exec_first(
                "SELECT CASE WHEN EXISTS (SELECT 1 FROM rs_table_rule AS r WHERE r.table_name = ?) \
                 THEN NULL ELSE partition_column END FROM rs_table WHERE table_name = ?",
                (table, table),
            )
            .await
            .map_err(db)?;
        let column = column.flatten();
        self.partition_columns
            .insert(table.to_string(), column.clone());
        Ok(column)
    }

    /// By the column's type, as scratch reads it (`column_limits`).
    async fn partition_value_misfit(
        &mut self,
        table: &str,
        column: &str,
        user: &str,
    ) -> Result<Option<String>, SyncError> {
        if !self.column_limits.contains_key(table) {
            self.table_shape(table).await?;
        }
        let numeric = self
            .column_limits
            .get(table)
            .is_some_and(|limits| limits.numeric.contains(column));
        Ok((numeric && !is_number(user)).then(|| "numeric".to_string()))
    }

    /// Read at each sync that writes two tables or more (InnoDB keys cannot be
    /// deferred: `defer_foreign_keys` does nothing and `init` refuses cycles).
    async fn foreign_keys(&mut self, table: &str) -> Result<Vec<ForeignKey>, SyncError> {
        Ok(foreign_keys(&mut self.transaction, table).await?)
    }

    async fn savepoint(&mut self, step: Savepoint) -> Result<(), SyncError> {
        for statement in step.sql().split("; ") {
            self.transaction.query_drop(statement).await.map_err(db)?;
        }
        Ok(())
    }

    async fn dropped_columns(
        &mut self,
        version: &str,
        table: &str,
    ) -> Result<Vec<String>, SyncError> {
        Ok(super::schema::dropped_columns(&mut self.transaction, version, table).await?)
    }

    async fn apply_scratch(
        &mut self,
        table: &TableApply<'_>,
        scratch: ScratchRows<'_, '_>,
    ) -> Result<Vec<Row>, SyncError> {
        let scales = self.column_limits.get(table.table());
        apply_scratch(&mut self.transaction, table, scratch, scales).await
    }

    async fn run_row_statements(
        &mut self,
        statement: &RowStatement<'_>,
        rows: &[UploadedRow],
    ) -> Result<Result<Vec<u64>, RowFailure>, SyncError> {
        let transaction = &mut self.transaction;
        transaction
            .query_drop("SAVEPOINT rs_rows")
            .await
            .map_err(db)?;
        let mut counts = Vec::with_capacity(rows.len());
        for (offset, row) in rows.iter().enumerate() {
            let images = row.images(statement.columns);
            match run_row(transaction, statement, &images).await {
                Ok(changed) => counts.push(changed),
                Err(error) => {
                    transaction
                        .query_drop("ROLLBACK TO SAVEPOINT rs_rows")
                        .await
                        .map_err(db)?;
                    transaction
                        .query_drop("RELEASE SAVEPOINT rs_rows")
                        .await
                        .map_err(db)?;
                    return Ok(Err(RowFailure { offset, error }));
                }
            }
        }
        transaction
            .query_drop("RELEASE SAVEPOINT rs_rows")
            .await
            .map_err(db)?;
        Ok(Ok(counts))
    }

    async fn resolve_conflicts_set(
        &mut self,
        table: &TableApply<'_>,
        columns: &[String],
        conflicted: &[UploadedRow],
    ) -> Result<(), SyncError> {
        let transaction = &mut self.transaction;
        let name = table.table();
        let scratch =
            ScratchTable::create(transaction, "clash", table.shape, columns, true, true).await?;
        let operations: Vec<Value> = conflicted
            .iter()
            .map(|row| Value::Text(row.operation.to_string()))
            .collect();
        let nulls = vec![Value::Null; columns.len()];
        let rows: Vec<Vec<&Value>> = conflicted
            .iter()
            .zip(&operations)
            .map(|(row, operation)| {
                std::iter::once(operation)
                    .chain(row.new.as_ref().unwrap_or(&nulls))
                    .chain(row.old.as_ref().unwrap_or(&nulls))
                    .collect()
            })
            .collect();
        scratch.load(transaction, name, &rows).await?;
        let sql = table.scripts.expand(
            name,
            RESOLVE_CONFLICT,
            &[(CONFLICTS_PLACEHOLDER, &scratch.name)],
        )?;
        run_script(
            transaction,
            &sql,
            table.parameters,
            None,
            name,
            RESOLVE_CONFLICT,
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
        let sql = select_by_key(&q(table), columns, key_positions, |_| "?".into());
        let ((_, rows), _) = run(&mut self.transaction, &sql, key, table, RESOLVE_CONFLICT).await?;
        Ok(rows.into_iter().next())
    }

    async fn run_for_row(
        &mut self,
        statement: &RowStatement<'_>,
        images: &RowImages<'_>,
    ) -> Result<(), SyncError> {
        run_row(&mut self.transaction, statement, images).await?;
        Ok(())
    }

    async fn fetch_by_keys(
        &mut self,
        table: &TableApply<'_>,
        keys: &[Row],
    ) -> Result<ScriptRows, SyncError> {
        let transaction = &mut self.transaction;
        let shape = table.shape;
        let scratch =
            ScratchTable::create(transaction, "keys", shape, &shape.key_columns, false, false)
                .await?;
        let rows: Vec<Vec<&Value>> = keys.iter().map(|row| row.iter().collect()).collect();
        scratch.load(transaction, &shape.name, &rows).await?;
        let sql = table.scripts.expand(
            &shape.name,
            UPLOAD_FETCH,
            &[(KEYS_PLACEHOLDER, &scratch.name)],
        )?;
        let (rows, _) = run_script(
            transaction,
            &sql,
            table.parameters,
            None,
            &shape.name,
            UPLOAD_FETCH,
        )
        .await?;
        Ok(rows)
    }

    async fn watermark(&mut self) -> Result<i64, SyncError> {
        Ok(self.stamp + 1)
    }

    async fn read_cursor(
        &mut self,
        cursor: &CursorScript<'_>,
        sink: &mut CursorSink<'_, '_>,
    ) -> Result<(), SyncError> {
        let (table, event) = (cursor.table, cursor.event);
        let script = cursor.scripts.expand(table, event, &[])?;
        let (sql, values) = bind_script(&script, cursor.parameters, None, table, event)?;
        let fail = |error| super::error::script_failure(event, table, error);
        let mut result = self
            .transaction
            .exec_iter(sql, super::value::bind_all(&values))
            .await
            .map_err(fail)?;
        let columns = result
            .columns()
            .map(|columns| column_names(&columns))
            .unwrap_or_default();
        let mut batch = CursorBatch::default();
        while let Some(row) = result.next().await.map_err(fail)? {
            let row = read_row(row).map_err(|message| SyncError::script(event, table, message))?;
            if batch.push(row) {
                sink.take(&columns, batch.take()).await?;
            }
        }
        if !batch.is_empty() {
            sink.take(&columns, batch.take()).await?;
        }
        Ok(())
    }

    async fn rollback(mut self) -> Result<(), SyncError> {
        self.transaction
            .query_drop("SET @rs_sync = NULL")
            .await
            .map_err(db)?;
        *self.marked = false;
        self.transaction.rollback().await.map_err(db)?;
        Ok(())
    }

    async fn commit(mut self) -> Result<(), SyncError> {
        self.transaction
            .query_drop("SET @rs_sync = NULL")
            .await
            .map_err(db)?;
        *self.marked = false;
        self.transaction.commit().await.map_err(db)?;
        Ok(())
    }
}

/// Runs a row statement for one row's images; returns the rows it changed (matched).
async fn run_row(
    transaction: &mut Transaction<'_>,
    statement: &RowStatement<'_>,
    images: &RowImages<'_>,
) -> Result<u64, SyncError> {
    let (sql, values) = bind_script(
        statement.sql,
        statement.parameters,
        Some(images),
        statement.table,
        statement.event,
    )?;
    let result = transaction
        .exec_iter(sql, super::value::bind_all(&values))
        .await
        .map_err(|error| row_script_failure(statement.event, statement.table, error))?;
    result
        .drop_result()
        .await
        .map_err(|error| row_script_failure(statement.event, statement.table, error))?;
    Ok(transaction.affected_rows())
}
