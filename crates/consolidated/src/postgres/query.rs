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
use crate::parameters::{positional_parameters, Parameters};
use crate::version_scripts::{ScriptRows, Scripts};
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
    let (table, event) = (cursor.table, cursor.event);
    let failure = |error: tokio_postgres::Error| script_failure(event, table, error);
    let sql = cursor.scripts.expand(table, event, &[])?;
    let (sql, values) = bind_script(&sql, cursor.parameters, table, event)?;
    let statement = statements
        .prepare(transaction, &sql)
        .await
        .map_err(failure)?;
    let binds = binds_of(&values);
    let rows = transaction
        .query_raw(&statement, binds.iter())
        .await
        .map_err(failure)?;
    let columns: Vec<String> = statement
        .columns()
        .iter()
        .map(|column| column.name().to_string())
        .collect();
    futures_util::pin_mut!(rows);
    let mut batch = CursorBatch::default();
    while let Some(row) = rows.try_next().await.map_err(failure)? {
        let values = (0..row.len())
            .map(|index| row.try_get::<_, Read>(index).map(|read| read.0))
            .collect::<Result<Row, _>>()
            .map_err(failure)?;
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
