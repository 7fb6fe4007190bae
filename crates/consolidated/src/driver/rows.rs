//! Row scripts: one statement per uploaded row, and `handle_error` deciding whether a
//! failing row is skipped or the whole upload rolls back.

use crate::dialect::{Dialect, RowStatement};
use crate::parameters::error_parameters;
use crate::scripts::*;
use crate::upload_rows::{describe_key, UploadedRow};
use crate::version_scripts::{single_integer, Scripts};
use crate::SyncError;

/// What running a row script over a table's rows did.
#[derive(Default)]
pub struct RowsApplied {
    /// Rows the statement changed nothing for: conflict candidates.
    pub unchanged: Vec<usize>,
    /// Rows `handle_error` chose to skip.
    pub skipped: Vec<usize>,
}

/// Runs the statement once per row. When a row fails, `handle_error` decides: skip it
/// (the rows before it run again, since the failed call left nothing applied, and the
/// rows after it go on) or roll the whole upload back.
pub async fn run_row_script<D: Dialect>(
    transaction: &mut D,
    scripts: &Scripts,
    statement: &RowStatement<'_>,
    key_positions: &[usize],
    rows: &[UploadedRow],
) -> Result<RowsApplied, SyncError> {
    let mut applied = RowsApplied::default();
    let mut start = 0;
    while start < rows.len() {
        let failure = match transaction
            .run_row_statements(statement, &rows[start..])
            .await?
        {
            Ok(counts) => {
                collect_unchanged(&mut applied, start, &counts);
                break;
            }
            Err(failure) => failure,
        };
        let failed = start + failure.offset;
        let error = failure
            .error
            .with_row_key(describe_key(&rows[failed].key(key_positions)));
        if !skip_row(transaction, scripts, statement, &error).await? {
            return Err(error);
        }
        let counts = transaction
            .run_row_statements(statement, &rows[start..failed])
            .await?
            .map_err(|failure| failure.error)?;
        collect_unchanged(&mut applied, start, &counts);
        applied.skipped.push(failed);
        start = failed + 1;
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

/// Asks `handle_error` what to do about a failed row: true skips it. Without the script,
/// for a failure that is not the script's, or when it returns anything but
/// `ERROR_ACTION_SKIP_ROW`, the upload rolls back.
async fn skip_row<D: Dialect>(
    transaction: &mut D,
    scripts: &Scripts,
    statement: &RowStatement<'_>,
    error: &SyncError,
) -> Result<bool, SyncError> {
    if !matches!(error, SyncError::Script { .. }) {
        return Ok(false);
    }
    let parameters = statement.parameters.with(error_parameters(error));
    let rows = transaction
        .run_event(scripts, HANDLE_ERROR, &parameters)
        .await?;
    let action = single_integer(rows, HANDLE_ERROR)?.unwrap_or(ERROR_ACTION_ROLLBACK);
    Ok(action == ERROR_ACTION_SKIP_ROW)
}
