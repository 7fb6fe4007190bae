//! Running scripts on MySQL: named parameters (`:user`, `:new.qty`) become `?` markers,
//! one per occurrence, with their values bound in that order; results are read into
//! rowsync values.

use mysql_async::prelude::Queryable;
use rowsync_protocol::{Row, Value};

use super::error::script_failure;
use super::value::{bind_all, column_names, read_row};
use crate::parameters::{positional_parameters_with, Parameters, RowImages};
use crate::version_scripts::ScriptRows;
use crate::SyncError;

/// Marks parameter positions while rewriting; never part of valid SQL text.
const MARKER: char = '\u{0}';

/// `sql` with each named parameter replaced by `?`, and the names in marker order
/// (a name used twice is bound twice). String literals, quoted identifiers and
/// comments are left alone.
pub fn question_marks(sql: &str) -> Result<(String, Vec<String>), String> {
    if sql.contains(MARKER) {
        return Err("the script contains a NUL character".into());
    }
    let (numbered, names) = positional_parameters_with(sql, MARKER);
    let mut out = String::with_capacity(numbered.len());
    let mut order = Vec::new();
    let mut chars = numbered.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        if c != MARKER {
            out.push(c);
            continue;
        }
        let mut digits = String::new();
        while let Some((_, d)) = chars.peek().copied().filter(|(_, d)| d.is_ascii_digit()) {
            digits.push(d);
            chars.next();
        }
        let position: usize = digits
            .parse()
            .map_err(|_| "a parameter marker without its number")?;
        order.push(names[position - 1].clone());
        out.push('?');
    }
    Ok((out, order))
}

/// A script with its named parameters bound: the SQL and its values in order.
pub fn bind_script(
    sql: &str,
    parameters: &Parameters<'_>,
    row: Option<&RowImages<'_>>,
    table: &str,
    event: &str,
) -> Result<(String, Vec<Value>), SyncError> {
    let (sql, names) =
        question_marks(sql).map_err(|message| SyncError::script(event, table, message))?;
    let values = names
        .iter()
        .map(|name| parameters.value_for_row(name, row, table, event))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((sql, values))
}

/// Runs a statement with bound values; returns its columns, its rows and the rows it
/// changed. Failures are the script's (`event`, `table`).
pub async fn run(
    connection: &mut impl Queryable,
    sql: &str,
    values: &[Value],
    table: &str,
    event: &str,
) -> Result<(ScriptRows, u64), SyncError> {
    let fail = |error| script_failure(event, table, error);
    let mut result = connection
        .exec_iter(sql, bind_all(values))
        .await
        .map_err(fail)?;
    let columns = result
        .columns()
        .map(|columns| column_names(&columns))
        .unwrap_or_default();
    let rows: Vec<mysql_async::Row> = result.collect().await.map_err(fail)?;
    let changed = result.affected_rows();
    drop(result);
    let rows = rows
        .into_iter()
        .map(read_row)
        .collect::<Result<Vec<Row>, String>>()
        .map_err(|message| SyncError::script(event, table, message))?;
    Ok(((columns, rows), changed))
}

/// Runs a script with its named parameters bound from `parameters` (and a row's images).
pub async fn run_script(
    connection: &mut impl Queryable,
    script: &str,
    parameters: &Parameters<'_>,
    row: Option<&RowImages<'_>>,
    table: &str,
    event: &str,
) -> Result<(ScriptRows, u64), SyncError> {
    let (sql, values) = bind_script(script, parameters, row, table, event)?;
    run(connection, &sql, &values, table, event).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_occurrence_becomes_one_marker_outside_literals() {
        let (sql, names) =
            question_marks("SELECT ':x', a FROM t WHERE u = :user AND v = :new.q OR w = :user")
                .unwrap();
        assert_eq!(sql, "SELECT ':x', a FROM t WHERE u = ? AND v = ? OR w = ?");
        assert_eq!(names, ["user", "new.q", "user"]);
    }
}
