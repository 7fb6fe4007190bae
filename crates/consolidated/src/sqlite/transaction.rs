//! One sync's transaction on SQLite (`BEGIN IMMEDIATE`: writers are serialized, so no
//! lock of its own is needed): the primitives the sync driver composes.

use rowsync_protocol::{Row, Value};
use rusqlite::{params, Connection, OptionalExtension};

use super::events::{run_event, run_query_script};
use super::query::{query_script, read_cursor, run_bound, run_script};
use super::schema::{foreign_keys, partition_value_misfit, table_shape};
use super::scratch::{Landed, ScratchTable};
use crate::dialect::{
    CursorScript, CursorSink, Dialect, RowFailure, RowStatement, Savepoint, ScratchRows,
    Subscription, SubscriptionUpdate, SyncBackend, TableApply,
};
use crate::foreign_keys::ForeignKey;
use crate::names::select_by_key;
use crate::parameters::{Parameters, RowImages};
use crate::scripts::*;
use crate::shape::TableShape;
use crate::upload_rows::UploadedRow;
use crate::version_scripts::{ScriptRows, Scripts};
use crate::{quote_identifier as q, SyncError};

/// A connection running syncs on a blocking thread.
pub struct SqliteBackend<'c> {
    pub connection: &'c mut Connection,
}

impl SyncBackend for SqliteBackend<'_> {
    type Transaction<'t>
        = SqliteTransaction<'t>
    where
        Self: 't;

    async fn begin(&mut self) -> Result<SqliteTransaction<'_>, SyncError> {
        self.connection.execute_batch("BEGIN IMMEDIATE")?;
        Ok(SqliteTransaction {
            connection: self.connection,
        })
    }

    fn may_retry(&mut self, _error: &SyncError) -> bool {
        false
    }

    fn after_failure(&mut self) {}
}

/// An open `BEGIN IMMEDIATE` transaction, rolled back when dropped uncommitted.
pub struct SqliteTransaction<'c> {
    connection: &'c Connection,
}

impl Drop for SqliteTransaction<'_> {
    fn drop(&mut self) {
        if !self.connection.is_autocommit() {
            if let Err(error) = self.connection.execute_batch("ROLLBACK") {
                tracing::warn!(%error, "rolling back a failed sync");
            }
        }
    }
}

impl Dialect for SqliteTransaction<'_> {
    async fn lock_client(&mut self, _client_id: &str) -> Result<bool, SyncError> {
        // The write transaction serializes syncs, and cleanup is one too.
        Ok(true)
    }

    async fn subscription(&mut self, client_id: &str) -> Result<Option<Subscription>, SyncError> {
        Ok(self
            .connection
            .query_row(
                "SELECT user_name, upload_sequence, download_watermark, upload_transfer_id \
                 FROM rs_subscription WHERE client_id = ?1",
                [client_id],
                |row| {
                    Ok(Subscription {
                        user_name: row.get(0)?,
                        upload_sequence: row.get(1)?,
                        download_watermark: row.get(2)?,
                        last_sync_xid: 0,
                        upload_transfer_id: row.get(3)?,
                    })
                },
            )
            .optional()?)
    }

    async fn client_ids_of_user(&mut self, user: &str, count_max: u64) -> Result<u64, SyncError> {
        let count_max = i64::try_from(count_max).unwrap_or(i64::MAX);
        let count: i64 = self.connection.query_row(
            "SELECT count(*) FROM (SELECT 1 FROM rs_subscription WHERE user_name = ?1 LIMIT ?2)",
            params![user, count_max],
            |row| row.get(0),
        )?;
        Ok(count as u64)
    }

    async fn record_subscription(
        &mut self,
        update: &SubscriptionUpdate<'_>,
    ) -> Result<(), SyncError> {
        self.connection.execute(
            "INSERT INTO rs_subscription (client_id, user_name, script_version, upload_sequence, download_watermark,
                 download_acknowledged, last_sync_at, upload_transfer_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, CURRENT_TIMESTAMP, ?7)
             ON CONFLICT (client_id) DO UPDATE SET
                 script_version = excluded.script_version,
                 upload_transfer_id = CASE WHEN excluded.upload_sequence > upload_sequence
                     THEN excluded.upload_transfer_id ELSE upload_transfer_id END,
                 upload_sequence = max(upload_sequence, excluded.upload_sequence),
                 download_watermark = excluded.download_watermark,
                 download_acknowledged = max(download_acknowledged, excluded.download_acknowledged),
                 last_sync_at = excluded.last_sync_at",
            params![
                update.client_id,
                update.user,
                update.script_version,
                update.upload_sequence,
                update.download_watermark,
                update.download_acknowledged,
                update.upload_transfer_id
            ],
        )?;
        Ok(())
    }

    async fn run_event(
        &mut self,
        scripts: &Scripts,
        event: &str,
        parameters: &Parameters<'_>,
    ) -> Result<Option<ScriptRows>, SyncError> {
        run_event(self.connection, scripts, event, parameters)
    }

    async fn run_table_query(
        &mut self,
        scripts: &Scripts,
        table: &str,
        event: &str,
        parameters: &Parameters<'_>,
    ) -> Result<Option<ScriptRows>, SyncError> {
        run_query_script(self.connection, scripts, table, event, parameters)
    }

    async fn table_shape(&mut self, table: &str) -> Result<TableShape, SyncError> {
        table_shape(self.connection, table)?.ok_or_else(|| {
            SyncError::Schema(format!(
                "table {table:?} does not exist in the consolidated database"
            ))
        })
    }

    async fn partition_column(&mut self, table: &str) -> Result<Option<String>, SyncError> {
        Ok(self
            .connection
            .query_row(
                "SELECT CASE WHEN EXISTS (SELECT 1 FROM rs_table_rule AS r WHERE r.table_name = ?1) \
                 THEN NULL ELSE partition_column END FROM rs_table WHERE table_name = ?1",
                [table],
                |row| row.get(0),
            )
            .optional()?
            .flatten())
    }

    async fn partition_value_misfit(
        &mut self,
        table: &str,
        column: &str,
        user: &str,
    ) -> Result<Option<String>, SyncError> {
        Ok(partition_value_misfit(
            self.connection,
            table,
            column,
            user,
        )?)
    }

    async fn foreign_keys(&mut self, table: &str) -> Result<Vec<ForeignKey>, SyncError> {
        Ok(foreign_keys(self.connection, table)?)
    }

    /// Every foreign key (SQLite defers no other constraint) waits for the commit;
    /// SQLite turns this off at the transaction's end.
    async fn defer_foreign_keys(&mut self, _keys: &[ForeignKey]) -> Result<(), SyncError> {
        self.connection
            .pragma_update(None, "defer_foreign_keys", "ON")?;
        Ok(())
    }

    async fn savepoint(&mut self, step: Savepoint) -> Result<(), SyncError> {
        self.connection.execute_batch(step.sql())?;
        Ok(())
    }

    async fn dropped_columns(
        &mut self,
        version: &str,
        table: &str,
    ) -> Result<Vec<String>, SyncError> {
        Ok(super::schema::dropped_columns(
            self.connection,
            version,
            table,
        )?)
    }

    async fn apply_scratch(
        &mut self,
        table: &TableApply<'_>,
        scratch_rows: ScratchRows<'_, '_>,
    ) -> Result<Vec<Row>, SyncError> {
        let connection = self.connection;
        let shape = table.shape;
        let event = scratch_rows.event;
        let scratch = ScratchTable::create(
            connection,
            scratch_rows.kind,
            shape,
            scratch_rows.columns,
            event == UPLOAD_UPDATE,
        )?;
        let scratch_count = scratch_rows.rows.len();
        scratch.load(connection, &mut scratch_rows.rows.into_iter())?;
        let changed = if scratch_rows.run_script {
            let (scripts, parameters) = (table.scripts, table.parameters);
            run_script(
                connection,
                scripts,
                &shape.name,
                event,
                &scratch.name,
                parameters,
            )?
        } else {
            0
        };
        if event == UPLOAD_DELETE {
            // Deleting a key already gone changes nothing and is fine: only keys still
            // present are conflicts, whatever the count.
            scratch.keys_still_in_table(connection, shape)
        } else if changed < scratch_count {
            let landed = Landed {
                partition_column: table.partition_column,
                user: table.parameters.user,
            };
            scratch.rows_not_matching_table(connection, shape, &landed)
        } else {
            Ok(Vec::new())
        }
    }

    async fn run_row_statements(
        &mut self,
        statement: &RowStatement<'_>,
        rows: &[UploadedRow],
    ) -> Result<Result<Vec<u64>, RowFailure>, SyncError> {
        let connection = self.connection;
        connection.execute_batch("SAVEPOINT rs_rows")?;
        let mut counts = Vec::with_capacity(rows.len());
        for (offset, row) in rows.iter().enumerate() {
            let images = row.images(statement.columns);
            match run_bound(
                connection,
                statement.sql,
                statement.parameters,
                Some(&images),
                statement.table,
                statement.event,
            ) {
                Ok((_, changed)) => counts.push(changed as u64),
                Err(error) => {
                    connection.execute_batch("ROLLBACK TO rs_rows; RELEASE rs_rows")?;
                    return Ok(Err(RowFailure { offset, error }));
                }
            }
        }
        connection.execute_batch("RELEASE rs_rows")?;
        Ok(Ok(counts))
    }

    async fn resolve_conflicts_set(
        &mut self,
        table: &TableApply<'_>,
        columns: &[String],
        conflicted: &[UploadedRow],
    ) -> Result<(), SyncError> {
        let connection = self.connection;
        let name = table.table();
        let scratch = q(&format!("rs_stage_clash_{name}"));
        let mut select = vec![format!("'' AS {}", q(CONFLICT_OPERATION_COLUMN))];
        select.extend(columns.iter().map(|column| q(column)));
        select.extend(columns.iter().map(|column| {
            format!(
                "{} AS {}",
                q(column),
                q(&format!("{OLD_IMAGE_PREFIX}{column}"))
            )
        }));
        connection.execute_batch(&format!(
            "DROP TABLE IF EXISTS temp.{scratch}; CREATE TEMP TABLE {scratch} AS SELECT {} FROM main.{} WHERE 0;",
            select.join(", "),
            q(name)
        ))?;
        let placeholders = vec!["?"; 1 + 2 * columns.len()].join(", ");
        let mut insert = connection.prepare(&format!(
            "INSERT INTO temp.{scratch} VALUES ({placeholders})"
        ))?;
        let nulls = vec![Value::Null; columns.len()];
        for row in conflicted {
            let operation = Value::Text(row.operation.to_string());
            let values = std::iter::once(&operation)
                .chain(row.new.as_ref().unwrap_or(&nulls))
                .chain(row.old.as_ref().unwrap_or(&nulls));
            insert.execute(rusqlite::params_from_iter(values))?;
        }
        let sql = table.scripts.expand(
            name,
            RESOLVE_CONFLICT,
            &[(CONFLICTS_PLACEHOLDER, &format!("temp.{scratch}"))],
        )?;
        run_bound(
            connection,
            &sql,
            table.parameters,
            None,
            name,
            RESOLVE_CONFLICT,
        )?;
        Ok(())
    }

    async fn current_row(
        &mut self,
        table: &str,
        columns: &[String],
        key_positions: &[usize],
        key: &[Value],
    ) -> Result<Option<Row>, SyncError> {
        let sql = select_by_key(&format!("main.{}", q(table)), columns, key_positions, |n| {
            format!("?{n}")
        });
        let mut statement = self.connection.prepare_cached(&sql)?;
        Ok(statement
            .query_row(rusqlite::params_from_iter(key), |found| {
                (0..columns.len())
                    .map(|index| found.get::<_, Value>(index))
                    .collect::<Result<Row, _>>()
            })
            .optional()?)
    }

    async fn run_for_row(
        &mut self,
        statement: &RowStatement<'_>,
        images: &RowImages<'_>,
    ) -> Result<(), SyncError> {
        run_bound(
            self.connection,
            statement.sql,
            statement.parameters,
            Some(images),
            statement.table,
            statement.event,
        )?;
        Ok(())
    }

    async fn fetch_by_keys(
        &mut self,
        table: &TableApply<'_>,
        keys: &[Row],
    ) -> Result<ScriptRows, SyncError> {
        let connection = self.connection;
        let shape = table.shape;
        let scratch = ScratchTable::create(connection, "keys", shape, &shape.key_columns, false)?;
        scratch.load(connection, &mut keys.iter().map(|row| row.iter().collect()))?;
        query_script(
            connection,
            table.scripts,
            &shape.name,
            UPLOAD_FETCH,
            &[(KEYS_PLACEHOLDER, &scratch.name)],
            table.parameters,
        )
    }

    async fn advance_watermark(&mut self) -> Result<(), SyncError> {
        self.connection
            .execute("UPDATE rs_clock SET version = version + 1 WHERE id = 1", [])?;
        Ok(())
    }

    async fn watermark(&mut self) -> Result<i64, SyncError> {
        Ok(self
            .connection
            .query_row("SELECT version FROM rs_clock WHERE id = 1", [], |row| {
                row.get(0)
            })?)
    }

    async fn read_cursor(
        &mut self,
        cursor: &CursorScript<'_>,
        sink: &mut CursorSink<'_, '_>,
    ) -> Result<(), SyncError> {
        read_cursor(self.connection, cursor, sink).await
    }

    async fn commit(self) -> Result<(), SyncError> {
        self.connection.execute_batch("COMMIT")?;
        Ok(())
    }

    async fn rollback(self) -> Result<(), SyncError> {
        if !self.connection.is_autocommit() {
            self.connection.execute_batch("ROLLBACK")?;
        }
        Ok(())
    }
}
