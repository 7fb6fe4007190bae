//! Scratch rows of an upload on MySQL: a temporary table per kind and table, shaped like the
//! table (`CREATE TEMPORARY TABLE ... AS SELECT`, columns nullable through an outer
//! join), filled by multi-row inserts of bound values; and finding what of it did not
//! land.

use mysql_async::prelude::Queryable;
use mysql_async::Transaction;
use rowsync_protocol::{Row, Value};

use super::error::{db, refused_value};
use super::query::{bind_script, run};
use super::schema::ColumnLimits;
use super::value::bind_all;
use crate::dialect::{ScratchRows, TableApply};
use crate::names::{column_list, key_match};
use crate::scripts::*;
use crate::shape::TableShape;
use crate::{quote_identifier as q, SyncError};

/// Rows per scratch insert (MySQL takes at most 65,535 bound values per statement).
const SCRATCH_INSERT_ROWS_MAX: usize = 1000;
const STATEMENT_VALUES_MAX: usize = 65_535;

/// A temporary scratch table of this connection, made afresh for each use (temporary
/// tables neither commit a transaction nor outlive the session).
pub(super) struct ScratchTable {
    pub(super) name: String,
    columns: Vec<String>,
    key_columns: Vec<String>,
}

impl ScratchTable {
    pub(super) async fn create(
        transaction: &mut Transaction<'_>,
        kind: &str,
        shape: &TableShape,
        columns: &[String],
        with_old_image: bool,
        with_operation: bool,
    ) -> Result<ScratchTable, SyncError> {
        let name = q(&format!("rs_stage_{kind}_{}", shape.name));
        let mut select: Vec<String> = Vec::new();
        let mut scratch = Vec::new();
        if with_operation {
            select.push(format!(
                "CAST('' AS CHAR(16)) AS {}",
                q(CONFLICT_OPERATION_COLUMN)
            ));
            scratch.push(CONFLICT_OPERATION_COLUMN.to_string());
        }
        select.extend(columns.iter().map(|column| format!("t.{}", q(column))));
        scratch.extend(columns.iter().cloned());
        if with_old_image {
            for column in columns {
                let old = format!("{OLD_IMAGE_PREFIX}{column}");
                select.push(format!("t.{} AS {}", q(column), q(&old)));
                scratch.push(old);
            }
        }
        transaction
            .query_drop(format!("DROP TEMPORARY TABLE IF EXISTS {name}"))
            .await
            .map_err(db)?;
        transaction
            .query_drop(format!(
                "CREATE TEMPORARY TABLE {name} AS SELECT {} FROM (SELECT 1 AS rs_one) AS rs_one \
                 LEFT JOIN {} AS t ON FALSE LIMIT 0",
                select.join(", "),
                q(&shape.name)
            ))
            .await
            .map_err(db)?;
        Ok(ScratchTable {
            name,
            columns: scratch,
            key_columns: shape.key_columns.clone(),
        })
    }

    /// Inserts rows in batches; a value a column cannot take is refused by table.
    pub(super) async fn load(
        &self,
        transaction: &mut Transaction<'_>,
        table: &str,
        rows: &[Vec<&Value>],
    ) -> Result<(), SyncError> {
        let width = self.columns.len().max(1);
        let batch_rows = SCRATCH_INSERT_ROWS_MAX
            .min(STATEMENT_VALUES_MAX / width)
            .max(1);
        self.check_doubles(table, rows)?;
        let one_row = format!("({})", vec!["?"; width].join(", "));
        for batch in rows.chunks(batch_rows) {
            let sql = format!(
                "INSERT INTO {} ({}) VALUES {}",
                self.name,
                column_list(&self.columns, ""),
                vec![one_row.as_str(); batch.len()].join(", ")
            );
            transaction
                .exec_drop(sql, bind_all(batch.iter().flatten().copied()))
                .await
                .map_err(|error| refused_value(table, error))?;
        }
        Ok(())
    }

    /// A decimal or a time with more digits after the point than its column keeps would
    /// be rounded by InnoDB without an error: it is refused naming table and column.
    fn check_limits(
        &self,
        table: &str,
        rows: &[Vec<&Value>],
        scales: &ColumnLimits,
    ) -> Result<(), SyncError> {
        for row in rows {
            for (value, column) in row.iter().zip(&self.columns) {
                let column = column.strip_prefix(OLD_IMAGE_PREFIX).unwrap_or(column);
                refuse_fraction_in_integer(table, column, value, scales)?;
                // A decimal's exact digits, as a SQLite client stores them, are that
                // decimal; other text in a numeric column would be converted.
                let digits = match value {
                    Value::Text(text) if scales.numeric.contains(column) => {
                        match decimal_digits(text) {
                            Some(scale) if scales.scales.contains_key(column) => Some(scale),
                            _ => return Err(SyncError::Schema(format!(
                                "upload of table {table:?} holds a value its column cannot take: column {column:?} is numeric, the value {value:?} is text"
                            ))),
                        }
                    }
                    _ => None,
                };
                let Some(&scale) = scales.scales.get(column) else {
                    continue;
                };
                let fits = match value {
                    Value::Text(text) => match digits {
                        Some(digits) => digits <= scale,
                        // A time or datetime in its text form: the digits InnoDB would
                        // round away are the nonzero ones past the column's scale.
                        None => fraction_digits(text) <= scale,
                    },
                    Value::Decimal(decimal) => u32::from(decimal.scale) <= scale,
                    Value::Numeric(numeric) => {
                        !numeric.is_special() && numeric.scale() as u32 <= scale
                    }
                    Value::Timestamp(micros) => scale >= 6 || micros % 10_i64.pow(6 - scale) == 0,
                    _ => true,
                };
                if !fits {
                    return Err(SyncError::Schema(format!(
                        "upload of table {table:?} holds a value its column cannot take: column {column:?} keeps {scale} digits after the point, the value {value:?} has more"
                    )));
                }
            }
        }
        Ok(())
    }

    /// InnoDB's DOUBLE stores neither NaN nor the infinities, and stores -0 as 0: such a
    /// value is refused naming table and column, never changed.
    fn check_doubles(&self, table: &str, rows: &[Vec<&Value>]) -> Result<(), SyncError> {
        for row in rows {
            for (value, column) in row.iter().zip(&self.columns) {
                let Value::Double(number) = value else {
                    continue;
                };
                if number.is_finite() && !(*number == 0.0 && number.is_sign_negative()) {
                    continue;
                }
                let column = column.strip_prefix(OLD_IMAGE_PREFIX).unwrap_or(column);
                return Err(SyncError::Schema(format!(
                    "upload of table {table:?} holds a value its column cannot take: column {column:?}: {number:?} (MySQL stores no NaN, infinity or -0)"
                )));
            }
        }
        Ok(())
    }

    fn key_list(&self, alias: &str) -> String {
        column_list(&self.key_columns, &format!("{alias}."))
    }
}

/// An integer column rounds a double with a fraction without an error (1.5 to 2): such a
/// value is refused naming table and column.
fn refuse_fraction_in_integer(
    table: &str,
    column: &str,
    value: &Value,
    limits: &ColumnLimits,
) -> Result<(), SyncError> {
    match value {
        Value::Double(number) if limits.integer.contains(column) && number.fract() != 0.0 => {
            Err(SyncError::Schema(format!(
                "upload of table {table:?} holds a value its column cannot take: column {column:?} holds integers, the value {number:?} has a fraction"
            )))
        }
        _ => Ok(()),
    }
}

/// The significant digits after the point of a time or datetime in its text form
/// (`13:05:09.000250` has 5, `24:00:00.000000` none; a trailing `Z` is not a digit).
fn fraction_digits(text: &str) -> u32 {
    let fraction = text
        .rsplit_once('.')
        .map_or("", |(_, fraction)| fraction.trim_end_matches('Z'));
    fraction.trim_end_matches('0').len() as u32
}

/// See `Dialect::apply_scratch`.
pub(super) async fn apply_scratch(
    transaction: &mut Transaction<'_>,
    context: &TableApply<'_>,
    scratch_rows: ScratchRows<'_, '_>,
    scales: Option<&ColumnLimits>,
) -> Result<Vec<Row>, SyncError> {
    let table = context.table();
    let event = scratch_rows.event;
    let scratch = ScratchTable::create(
        transaction,
        scratch_rows.kind,
        context.shape,
        scratch_rows.columns,
        event == UPLOAD_UPDATE,
        false,
    )
    .await?;
    if let Some(scales) = scales {
        scratch.check_limits(table, &scratch_rows.rows, scales)?;
    }
    scratch.load(transaction, table, &scratch_rows.rows).await?;
    let changed = if scratch_rows.run_script {
        let script =
            context
                .scripts
                .expand(table, event, &[(UPLOAD_PLACEHOLDER, &scratch.name)])?;
        let (sql, values) = bind_script(&script, context.parameters, None, table, event)?;
        run(transaction, &sql, &values, table, event).await?.1 as usize
    } else {
        0
    };
    if changed >= scratch_rows.rows.len() && event != UPLOAD_DELETE {
        return Ok(Vec::new());
    }
    unlanded_keys(transaction, context, event, &scratch).await
}

/// The scratch keys the table does not reflect: for deletes, keys still present (deleting
/// a key already gone is fine); else rows whose new image the table does not hold in the
/// user's partition.
async fn unlanded_keys(
    transaction: &mut Transaction<'_>,
    context: &TableApply<'_>,
    event: &str,
    scratch: &ScratchTable,
) -> Result<Vec<Row>, SyncError> {
    let table = q(context.table());
    let (condition, values) = if event == UPLOAD_DELETE {
        (
            format!(
                "EXISTS (SELECT 1 FROM {table} AS t WHERE {})",
                key_match(&scratch.key_columns, "t", "s")
            ),
            Vec::new(),
        )
    } else {
        let mut matches: Vec<String> = scratch
            .columns
            .iter()
            .filter(|column| !column.starts_with(OLD_IMAGE_PREFIX))
            .map(|column| format!("t.{c} <=> s.{c}", c = q(column)))
            .collect();
        let mut values = Vec::new();
        if let Some(partition) = context.partition_column {
            matches.push(format!("t.{} = ?", q(partition)));
            values.push(Value::Text(context.parameters.user.to_string()));
        }
        (
            format!(
                "NOT EXISTS (SELECT 1 FROM {table} AS t WHERE {})",
                matches.join(" AND ")
            ),
            values,
        )
    };
    let sql = format!(
        "SELECT {} FROM {} AS s WHERE {condition}",
        scratch.key_list("s"),
        scratch.name
    );
    let ((_, keys), _) = run(transaction, &sql, &values, context.table(), event).await?;
    Ok(keys)
}

/// The scale of `text` if it is exactly a decimal's text form (as a SQLite client
/// stores decimals), `None` for any other text.
fn decimal_digits(text: &str) -> Option<u32> {
    let value = rowsync_protocol::parse_decimal_value(text).ok()?;
    (value.text_form().as_deref() == Some(text)).then(|| {
        text.split_once('.')
            .map_or(0, |(_, fraction)| fraction.len() as u32)
    })
}
