//! Running scripts on SQLite: named parameters bound (dotted names by position), rows
//! read as `Value`s, cursors handed over in batches.

use rowsync_protocol::{Row, Value};
use rusqlite::{Connection, Statement};

use super::error::script_failure;
use crate::dialect::{CursorScript, CursorSink};
use crate::parameters::{positional_parameters_with, Parameters, RowImages};
use crate::scripts::UPLOAD_PLACEHOLDER;
use crate::version_scripts::{ScriptRows, Scripts};
use crate::{CursorBatch, SyncError};

fn bind_parameters(
    statement: &mut Statement,
    parameters: &Parameters,
    table: &str,
    event: &str,
) -> Result<(), SyncError> {
    for index in 1..=statement.parameter_count() {
        let Some(name) = statement.parameter_name(index).map(str::to_owned) else {
            return Err(SyncError::script(
                event,
                table,
                format!(
                    "parameter {index} has no name; scripts use named parameters such as :user"
                ),
            ));
        };
        statement.raw_bind_parameter(index, parameters.value(&name, table, event)?)?;
    }
    Ok(())
}

pub(super) fn prepare_script<'c>(
    connection: &'c Connection,
    scripts: &Scripts,
    table: &str,
    event: &str,
    substitutions: &[(&str, &str)],
    parameters: &Parameters,
) -> Result<Statement<'c>, SyncError> {
    let sql = scripts.expand(table, event, substitutions)?;
    let mut statement = connection
        .prepare(&sql)
        .map_err(|error| script_failure(event, table, error))?;
    bind_parameters(&mut statement, parameters, table, event)?;
    Ok(statement)
}

/// Runs a set script over a scratch table; returns the rows it changed.
pub(super) fn run_script(
    connection: &Connection,
    scripts: &Scripts,
    table: &str,
    event: &str,
    scratch_name: &str,
    parameters: &Parameters,
) -> Result<usize, SyncError> {
    let mut statement = prepare_script(
        connection,
        scripts,
        table,
        event,
        &[(UPLOAD_PLACEHOLDER, scratch_name)],
        parameters,
    )?;
    statement
        .raw_execute()
        .map_err(|error| script_failure(event, table, error))
}

/// Runs a query script and returns its column names and rows.
pub(super) fn query_script(
    connection: &Connection,
    scripts: &Scripts,
    table: &str,
    event: &str,
    substitutions: &[(&str, &str)],
    parameters: &Parameters,
) -> Result<ScriptRows, SyncError> {
    let mut statement =
        prepare_script(connection, scripts, table, event, substitutions, parameters)?;
    let columns: Vec<String> = statement.column_names().map(str::to_owned).collect();
    let rows = read_rows(&mut statement, columns.len(), event, table)?;
    Ok((columns, rows))
}

/// Every row a bound statement returns, each its first `width` values.
fn read_rows(
    statement: &mut Statement<'_>,
    width: usize,
    event: &str,
    table: &str,
) -> Result<Vec<Row>, SyncError> {
    let mut rows = Vec::new();
    let mut cursor = statement.raw_query();
    while let Some(row) = cursor
        .next()
        .map_err(|error| script_failure(event, table, error))?
    {
        rows.push(read_values(row, width).map_err(|error| script_failure(event, table, error))?);
    }
    Ok(rows)
}

/// A result row's first `width` values.
pub(super) fn read_values(row: &rusqlite::Row<'_>, width: usize) -> rusqlite::Result<Row> {
    (0..width).map(|index| row.get::<_, Value>(index)).collect()
}

/// Runs a cursor script and hands its rows to the sink a [`CursorBatch`] at a time.
pub(super) async fn read_cursor(
    connection: &Connection,
    cursor: &CursorScript<'_>,
    sink: &mut CursorSink<'_, '_>,
) -> Result<(), SyncError> {
    let (table, event) = (cursor.table, cursor.event);
    let mut statement = prepare_script(
        connection,
        cursor.scripts,
        table,
        event,
        &[],
        cursor.parameters,
    )?;
    let columns: Vec<String> = statement.column_names().map(str::to_owned).collect();
    let width = columns.len();
    let mut batch = CursorBatch::default();
    let mut rows = statement.raw_query();
    while let Some(row) = rows
        .next()
        .map_err(|error| script_failure(event, table, error))?
    {
        let values =
            read_values(row, width).map_err(|error| script_failure(event, table, error))?;
        if batch.push(values) {
            sink.take(&columns, batch.take()).await?;
        }
    }
    sink.take(&columns, batch.take()).await
}

/// Runs `sql` with its named parameters (dotted names included) bound by position;
/// returns what it selected.
pub fn run_bound(
    connection: &Connection,
    sql: &str,
    parameters: &Parameters,
    row: Option<&RowImages>,
    table: &str,
    event: &str,
) -> Result<(ScriptRows, usize), SyncError> {
    let (sql, names) = positional_parameters_with(sql, '?');
    let mut statement = connection
        .prepare_cached(&sql)
        .map_err(|error| script_failure(event, table, error))?;
    for (index, name) in names.iter().enumerate() {
        let value = parameters.value_for_row(name, row, table, event)?;
        statement
            .raw_bind_parameter(index + 1, value)
            .map_err(|error| script_failure(event, table, error))?;
    }
    let columns: Vec<String> = statement.column_names().map(str::to_owned).collect();
    if columns.is_empty() {
        let changed = statement
            .raw_execute()
            .map_err(|error| script_failure(event, table, error))?;
        return Ok(((columns, Vec::new()), changed));
    }
    let rows = read_rows(&mut statement, columns.len(), event, table)?;
    Ok(((columns, rows), 0))
}
