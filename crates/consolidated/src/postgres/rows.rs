//! Row scripts on PostgreSQL: one statement per uploaded row, prepared once and
//! pipelined, under a savepoint so that `handle_error` can skip a failing row.

use futures_util::stream::FuturesOrdered;
use futures_util::StreamExt;
use rowsync_protocol::Value;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Transaction;

use super::statements::Statements;
use super::sync::{bind_script, binds_of, query_rows, script_failure};
use crate::error::describe_postgres;
use crate::plan::{
    describe_key, error_parameters, positional_parameters, single_integer, Parameters, Scripts,
    UploadedRow,
};
use crate::scripts::*;
use crate::SyncError;

/// Row statements in flight on the connection at once.
pub const ROW_SCRIPT_PIPELINE_DEPTH: usize = 256;

/// What running a row script over a table's rows did.
pub struct RowsApplied {
    /// Rows the statement changed nothing for: conflict candidates.
    pub unchanged: Vec<usize>,
    /// Rows `handle_error` chose to skip.
    pub skipped: Vec<usize>,
}

/// Runs `sql` once per row. On a failure the rows run so far are rolled back to the
/// savepoint; `handle_error` decides whether the failing row is skipped (the others then
/// run again) or the whole upload rolls back.
#[allow(clippy::too_many_arguments)]
pub async fn run_row_script(
    transaction: &Transaction<'_>,
    statements: &Statements,
    scripts: &Scripts,
    table: &str,
    event: &str,
    sql: &str,
    columns: &[String],
    key_positions: &[usize],
    rows: &[UploadedRow],
    parameters: &Parameters<'_>,
) -> Result<RowsApplied, SyncError> {
    let (positional, names) = positional_parameters(sql);
    let statement = statements
        .prepare(transaction, &positional)
        .await
        .map_err(|error| script_failure(event, table, error))?;
    let mut applied = RowsApplied {
        unchanged: Vec::new(),
        skipped: Vec::new(),
    };
    let mut start = 0;
    while start < rows.len() {
        transaction.batch_execute("SAVEPOINT rs_rows").await?;
        let outcome = pipeline(
            transaction,
            &statement,
            &names,
            &rows[start..],
            columns,
            table,
            event,
            parameters,
        )
        .await;
        match outcome {
            Ok(counts) => {
                transaction
                    .batch_execute("RELEASE SAVEPOINT rs_rows")
                    .await?;
                collect_unchanged(&mut applied, start, &counts);
                break;
            }
            Err((offset, error)) => {
                transaction
                    .batch_execute("ROLLBACK TO SAVEPOINT rs_rows; RELEASE SAVEPOINT rs_rows")
                    .await?;
                let failed = start + offset;
                let error = error.with_row_key(describe_key(&rows[failed].key(key_positions)));
                if !skip_row(transaction, statements, scripts, parameters, &error).await? {
                    return Err(error);
                }
                // The rows before the failing one were fine: run them again.
                let counts = pipeline(
                    transaction,
                    &statement,
                    &names,
                    &rows[start..failed],
                    columns,
                    table,
                    event,
                    parameters,
                )
                .await
                .map_err(|(_, error)| error)?;
                collect_unchanged(&mut applied, start, &counts);
                applied.skipped.push(failed);
                start = failed + 1;
            }
        }
    }
    Ok(applied)
}

fn collect_unchanged(applied: &mut RowsApplied, start: usize, counts: &[u64]) {
    applied.unchanged.extend(
        counts
            .iter()
            .enumerate()
            .filter(|(_, &count)| count == 0)
            .map(|(index, _)| start + index),
    );
}

/// Executes the statement for each row, `ROW_SCRIPT_PIPELINE_DEPTH` at a time; the
/// first failure (by row order) ends it with that row's offset.
#[allow(clippy::too_many_arguments)]
async fn pipeline(
    transaction: &Transaction<'_>,
    statement: &tokio_postgres::Statement,
    names: &[String],
    rows: &[UploadedRow],
    columns: &[String],
    table: &str,
    event: &str,
    parameters: &Parameters<'_>,
) -> Result<Vec<u64>, (usize, SyncError)> {
    let mut in_flight = FuturesOrdered::new();
    let mut counts = Vec::with_capacity(rows.len());
    let mut next = 0;
    loop {
        while in_flight.len() < ROW_SCRIPT_PIPELINE_DEPTH && next < rows.len() {
            in_flight.push_back(execute_row(
                transaction,
                statement,
                names,
                &rows[next],
                columns,
                (table, event),
                parameters,
                next,
            ));
            next += 1;
        }
        match in_flight.next().await {
            None => return Ok(counts),
            Some(result) => counts.push(result?),
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn execute_row(
    transaction: &Transaction<'_>,
    statement: &tokio_postgres::Statement,
    names: &[String],
    row: &UploadedRow,
    columns: &[String],
    (table, event): (&str, &str),
    parameters: &Parameters<'_>,
    offset: usize,
) -> Result<u64, (usize, SyncError)> {
    let images = row.images(columns);
    let values = names
        .iter()
        .map(|name| parameters.value_for_row(name, Some(&images), table, event))
        .collect::<Result<Vec<Value>, SyncError>>()
        .map_err(|error| (offset, error))?;
    let binds = binds_of(&values);
    let params: Vec<&(dyn ToSql + Sync)> = binds
        .iter()
        .map(|bind| bind as &(dyn ToSql + Sync))
        .collect();
    transaction
        .execute(statement, &params)
        .await
        .map_err(|error| (offset, row_failure(event, table, error)))
}

/// A row statement's failure. A unique violation is the row's own fault here (the
/// statement names one key), not a concurrent insert as in a set script: it goes to
/// `handle_error` like any other instead of retrying the sync.
fn row_failure(event: &str, table: &str, error: tokio_postgres::Error) -> SyncError {
    if error.code() == Some(&SqlState::UNIQUE_VIOLATION) {
        return SyncError::Script {
            event: event.to_string(),
            table: table.to_string(),
            row_key: None,
            code: SqlState::UNIQUE_VIOLATION.code().to_string(),
            message: describe_postgres(&error),
        };
    }
    script_failure(event, table, error)
}

/// Asks `handle_error` what to do about a failed row: true skips it. Without the script,
/// or when it returns anything but `ERROR_ACTION_SKIP_ROW`, the upload rolls back.
pub async fn skip_row(
    transaction: &Transaction<'_>,
    statements: &Statements,
    scripts: &Scripts,
    parameters: &Parameters<'_>,
    error: &SyncError,
) -> Result<bool, SyncError> {
    let Some(script) = scripts.connection_event(HANDLE_ERROR) else {
        return Ok(false);
    };
    if !matches!(error, SyncError::Script { .. }) {
        return Ok(false);
    }
    let parameters = parameters.with(error_parameters(error));
    let (sql, values) = bind_script(script, &parameters, "", HANDLE_ERROR)?;
    let rows = query_rows(transaction, statements, &sql, &values)
        .await
        .map_err(|failure| script_failure(HANDLE_ERROR, "", failure))?;
    let action = single_integer(Some(rows), HANDLE_ERROR)?.unwrap_or(ERROR_ACTION_ROLLBACK);
    Ok(action == ERROR_ACTION_SKIP_ROW)
}
