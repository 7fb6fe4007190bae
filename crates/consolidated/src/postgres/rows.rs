//! Row scripts on PostgreSQL: one statement per uploaded row, prepared once and
//! pipelined, under a savepoint so that a failing row leaves nothing of the call applied.

use futures_util::stream::FuturesOrdered;
use futures_util::StreamExt;
use rowsync_protocol::Value;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Transaction;

use super::error::{describe_postgres, script_failure};
use super::query::binds_of;
use super::statements::Statements;
use crate::dialect::{RowFailure, RowStatement};
use crate::parameters::positional_parameters;
use crate::upload_rows::UploadedRow;
use crate::SyncError;

/// Row statements in flight on the connection at once.
pub const ROW_SCRIPT_PIPELINE_DEPTH: usize = 256;

/// Runs the row script once per row; on a failure, rolls the rows run so far back to
/// the savepoint and names the failing row.
pub(super) async fn run_row_statements(
    transaction: &Transaction<'_>,
    statements: &Statements,
    statement: &RowStatement<'_>,
    rows: &[UploadedRow],
) -> Result<Result<Vec<u64>, RowFailure>, SyncError> {
    let (positional, names) = positional_parameters(statement.sql);
    let prepared = statements
        .prepare(transaction, &positional)
        .await
        .map_err(|error| script_failure(statement.event, statement.table, error))?;
    let bound = BoundRows {
        transaction,
        prepared: &prepared,
        names: &names,
        statement,
    };
    transaction.batch_execute("SAVEPOINT rs_rows").await?;
    match bound.pipeline(rows).await {
        Ok(counts) => {
            transaction
                .batch_execute("RELEASE SAVEPOINT rs_rows")
                .await?;
            Ok(Ok(counts))
        }
        Err(failure) => {
            transaction
                .batch_execute("ROLLBACK TO SAVEPOINT rs_rows; RELEASE SAVEPOINT rs_rows")
                .await?;
            Ok(Err(failure))
        }
    }
}

/// A prepared row statement and what its parameters are bound from.
struct BoundRows<'a> {
    transaction: &'a Transaction<'a>,
    prepared: &'a tokio_postgres::Statement,
    /// The script's parameter names in position order.
    names: &'a [String],
    statement: &'a RowStatement<'a>,
}

impl BoundRows<'_> {
    /// Executes the statement for each row, `ROW_SCRIPT_PIPELINE_DEPTH` at a time; the
    /// first failure (by row order) ends it with that row's offset.
    async fn pipeline(&self, rows: &[UploadedRow]) -> Result<Vec<u64>, RowFailure> {
        let mut in_flight = FuturesOrdered::new();
        let mut counts = Vec::with_capacity(rows.len());
        let mut next = 0;
        loop {
            while in_flight.len() < ROW_SCRIPT_PIPELINE_DEPTH && next < rows.len() {
                in_flight.push_back(self.execute(&rows[next], next));
                next += 1;
            }
            match in_flight.next().await {
                None => return Ok(counts),
                Some(result) => counts.push(result?),
            }
        }
    }

    async fn execute(&self, row: &UploadedRow, offset: usize) -> Result<u64, RowFailure> {
        let RowStatement {
            table,
            event,
            columns,
            parameters,
            ..
        } = *self.statement;
        let images = row.images(columns);
        let values = self
            .names
            .iter()
            .map(|name| parameters.value_for_row(name, Some(&images), table, event))
            .collect::<Result<Vec<Value>, SyncError>>()
            .map_err(|error| RowFailure { offset, error })?;
        let binds = binds_of(&values);
        let params: Vec<&(dyn ToSql + Sync)> = binds
            .iter()
            .map(|bind| bind as &(dyn ToSql + Sync))
            .collect();
        self.transaction
            .execute(self.prepared, &params)
            .await
            .map_err(|error| RowFailure {
                offset,
                error: row_failure(event, table, error),
            })
    }
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
