//! Running statements on PostgreSQL: named parameters bound by position, rows read as
//! `Value`s, cursors streamed in batches.

use futures_util::TryStreamExt;
use rowsync_protocol::{Row, Value};
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Transaction};

use super::error::script_failure;
use super::statements::Statements;
use super::value::{Bind, Read};
use crate::dialect::{CursorScript, CursorSink};
use crate::echo::DownloadFilter;
use crate::parameters::{positional_parameters, Parameters};
use crate::version_scripts::{ScriptRows, Scripts};
use crate::DownloadSender;
use crate::{CursorBatch, SyncError};

pub(super) fn binds_of(values: &[Value]) -> Vec<Bind<'_>> {
    values.iter().map(Bind).collect()
}

/// Binds a script's named parameters as positional ones.
pub(super) fn bind_script(
    sql: &str,
    parameters: &Parameters,
    table: &str,
    event: &str,
) -> Result<(String, Vec<Value>), SyncError> {
    let (sql, names) = positional_parameters(sql);
    let values = names
        .iter()
        .map(|name| parameters.value(name, table, event))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((sql, values))
}

pub(super) async fn query_rows(
    transaction: &impl GenericClient,
    statements: &Statements,
    sql: &str,
    values: &[Value],
) -> Result<(Vec<String>, Vec<Row>), tokio_postgres::Error> {
    let binds = binds_of(values);
    let parameters: Vec<&(dyn ToSql + Sync)> = binds
        .iter()
        .map(|bind| bind as &(dyn ToSql + Sync))
        .collect();
    query_bound(transaction, statements, sql, &parameters).await
}

/// Runs `sql` with its parameters bound; its column names and rows.
pub(super) async fn query_bound(
    transaction: &impl GenericClient,
    statements: &Statements,
    sql: &str,
    parameters: &[&(dyn ToSql + Sync)],
) -> Result<(Vec<String>, Vec<Row>), tokio_postgres::Error> {
    let statement = statements.prepare(transaction, sql).await?;
    let rows = transaction.query(&statement, parameters).await?;
    let columns = statement
        .columns()
        .iter()
        .map(|column| column.name().to_string())
        .collect();
    let rows = rows
        .iter()
        .map(|row| {
            (0..row.len())
                .map(|index| row.try_get::<_, Read>(index).map(|read| read.0))
                .collect()
        })
        .collect::<Result<Vec<Row>, _>>()?;
    Ok((columns, rows))
}

pub(super) async fn query_script(
    transaction: &impl GenericClient,
    statements: &Statements,
    scripts: &Scripts,
    table: &str,
    event: &str,
    substitutions: &[(&str, &str)],
    parameters: &Parameters<'_>,
) -> Result<ScriptRows, SyncError> {
    let sql = scripts.expand(table, event, substitutions)?;
    let (sql, values) = bind_script(&sql, parameters, table, event)?;
    query_rows(transaction, statements, &sql, &values)
        .await
        .map_err(|error| script_failure(event, table, error))
}

/// Reads a cursor script in one round trip (Bind, Execute and Sync sent at once) into
/// the sink a [`CursorBatch`] at a time (at most `DOWNLOAD_BATCH_ROWS` rows), so a
/// download of any size takes bounded memory: the rows are streamed, and the connection
/// reads no further than the row taken (its response channel holds one message block,
/// then it stops reading the socket and PostgreSQL waits), so a batch of large rows is
/// handed on as soon as it reaches its bytes. A named portal fetched batch by batch
/// would cost a round trip for the Bind and one per batch.
pub(super) async fn read_cursor(
    transaction: &Transaction<'_>,
    statements: &Statements,
    cursor: &CursorScript<'_>,
    sink: &mut CursorSink<'_, '_>,
) -> Result<(), SyncError> {
    let bound = BoundCursor::prepare(transaction, statements, cursor).await?;
    bound.read(transaction, sink).await
}

/// Reads two cursor scripts as [`read_cursor`] does, one after the other, in one round
/// trip: the second is sent with the first, and PostgreSQL runs it once the first's
/// rows are all out, while the connection holds the second's first rows back until the
/// first's are taken (so memory stays bounded, and no response waits on another).
pub(super) async fn read_cursor_pair(
    transaction: &Transaction<'_>,
    statements: &Statements,
    cursors: [&CursorScript<'_>; 2],
    filter: &mut DownloadFilter<'_>,
    download: &DownloadSender,
) -> Result<(), SyncError> {
    let first = BoundCursor::prepare(transaction, statements, cursors[0]).await?;
    let second = BoundCursor::prepare(transaction, statements, cursors[1]).await?;
    let second_binds = binds_of(&second.values);
    let second_rows = transaction.query_raw(&second.statement, second_binds.iter());
    let first_read = async {
        let mut sink = CursorSink::for_cursor(cursors[0], &mut *filter, download);
        first.read(transaction, &mut sink).await
    };
    // `join` polls the first read first, so its statement is sent first.
    let (first_read, second_rows) = futures_util::future::join(first_read, second_rows).await;
    first_read?;
    let rows = second_rows.map_err(|error| second.failure(error))?;
    let mut sink = CursorSink::for_cursor(cursors[1], filter, download);
    second.stream(rows, &mut sink).await
}

/// A cursor script prepared, with its parameters' values.
struct BoundCursor<'c> {
    table: &'c str,
    event: &'static str,
    statement: tokio_postgres::Statement,
    values: Vec<Value>,
}

impl<'c> BoundCursor<'c> {
    async fn prepare(
        transaction: &Transaction<'_>,
        statements: &Statements,
        cursor: &CursorScript<'c>,
    ) -> Result<BoundCursor<'c>, SyncError> {
        let (table, event) = (cursor.table, cursor.event);
        let sql = cursor.scripts.expand(table, event, &[])?;
        let (sql, values) = bind_script(&sql, cursor.parameters, table, event)?;
        let statement = statements
            .prepare(transaction, &sql)
            .await
            .map_err(|error| script_failure(event, table, error))?;
        Ok(BoundCursor {
            table,
            event,
            statement,
            values,
        })
    }

    fn failure(&self, error: tokio_postgres::Error) -> SyncError {
        script_failure(self.event, self.table, error)
    }

    async fn read(
        &self,
        transaction: &Transaction<'_>,
        sink: &mut CursorSink<'_, '_>,
    ) -> Result<(), SyncError> {
        let binds = binds_of(&self.values);
        let rows = transaction
            .query_raw(&self.statement, binds.iter())
            .await
            .map_err(|error| self.failure(error))?;
        self.stream(rows, sink).await
    }

    /// Hands the cursor's rows to `sink` a batch at a time.
    async fn stream(
        &self,
        rows: tokio_postgres::RowStream,
        sink: &mut CursorSink<'_, '_>,
    ) -> Result<(), SyncError> {
        let columns: Vec<String> = self
            .statement
            .columns()
            .iter()
            .map(|column| column.name().to_string())
            .collect();
        futures_util::pin_mut!(rows);
        let mut batch = CursorBatch::default();
        while let Some(row) = rows.try_next().await.map_err(|error| self.failure(error))? {
            let values = (0..row.len())
                .map(|index| row.try_get::<_, Read>(index).map(|read| read.0))
                .collect::<Result<Row, _>>()
                .map_err(|error| self.failure(error))?;
            drop(row);
            if batch.push(values) {
                sink.take(&columns, batch.take()).await?;
            }
        }
        if !batch.is_empty() {
            sink.take(&columns, batch.take()).await?;
        }
        Ok(())
    }
}
