//! Scratch rows of an upload on SQLite: a temporary table per kind with the consolidated
//! table's column affinities, and the queries that find what of it did not land.

use rowsync_protocol::{Row, Value};
use rusqlite::types::{FromSql, ValueRef};
use rusqlite::Connection;

use super::query::read_values;
use crate::names::{column_list, key_match};
use crate::scripts::*;
use crate::shape::TableShape;
use crate::{quote_identifier as q, SyncError};

/// Where an uploaded row counts as landed: in the table and, when the table is
/// partitioned, in the uploading user's partition. An identical row in another
/// partition is not the client's, so its upload is a conflict (sent back as a delete).
pub(super) struct Landed<'a> {
    pub(super) partition_column: Option<&'a str>,
    pub(super) user: &'a str,
}

/// A temporary table holding one kind of a table's scratch upload.
pub(super) struct ScratchTable {
    pub(super) name: String,
    /// The consolidated table scratch for.
    table: String,
    columns: Vec<String>,
    key_columns: Vec<String>,
    /// The scratch column that is the table's INTEGER PRIMARY KEY (its rowid), if any:
    /// SQLite refuses anything but an integer there, at the script's insert.
    rowid_column: Option<usize>,
}

impl ScratchTable {
    /// Creates (or empties) `temp.rs_stage_<kind>_<table>` with the upload's columns and
    /// the consolidated table's column affinities, so comparisons match the table's.
    pub(super) fn create(
        connection: &Connection,
        kind: &str,
        shape: &TableShape,
        columns: &[String],
        with_old_image: bool,
    ) -> Result<ScratchTable, SyncError> {
        let name = format!("temp.{}", q(&format!("rs_stage_{kind}_{}", shape.name)));
        let mut select: Vec<String> = columns.iter().map(|column| q(column)).collect();
        let mut scratch_columns = columns.to_vec();
        if with_old_image {
            for column in columns {
                let old = format!("{OLD_IMAGE_PREFIX}{column}");
                select.push(format!("{} AS {}", q(column), q(&old)));
                scratch_columns.push(old);
            }
        }
        let bare = format!("rs_stage_{kind}_{}", shape.name);
        let mut ddl = format!(
            "DROP TABLE IF EXISTS {name}; CREATE TEMP TABLE {bare_q} AS SELECT {select} FROM main.{table} WHERE 0;",
            bare_q = q(&bare),
            select = select.join(", "),
            table = q(&shape.name),
        );
        if columns == shape.key_columns.as_slice() {
            // Scratch keys (deletes, fetches) are indexed: a script probing them once per
            // row of the table (`EXISTS (SELECT 1 FROM {upload} WHERE key = t.key)`, the
            // delete script before 2026-11-24) then costs a search, not a scan of the
            // scratch per table row (quadratic: 20,000 deletes took 17 s).
            ddl.push_str(&format!(
                " CREATE INDEX temp.{index} ON {bare_q} ({keys});",
                index = q(&format!("{bare}_key")),
                bare_q = q(&bare),
                keys = column_list(&shape.key_columns, ""),
            ));
        }
        connection.execute_batch(&ddl)?;
        let rowid_column = rowid_alias(connection, &shape.name)?
            .and_then(|rowid| scratch_columns.iter().position(|column| *column == rowid));
        Ok(ScratchTable {
            name,
            table: shape.name.clone(),
            columns: scratch_columns,
            key_columns: shape.key_columns.clone(),
            rowid_column,
        })
    }

    /// Puts the rows in scratch, refusing (naming table and column) a value the column does not
    /// hold exactly as sent: SQLite's column affinity would otherwise change it silently
    /// (NaN to NULL, -0.0 to 0, a long decimal to a double, text '12' to the integer
    /// 12). The scratch has the table's affinities, so what it holds is what the table
    /// would; each row's stored values come back through `RETURNING`.
    pub(super) fn load(
        &self,
        connection: &Connection,
        rows: &mut dyn Iterator<Item = Vec<&Value>>,
    ) -> Result<(), SyncError> {
        let placeholders = vec!["?"; self.columns.len()].join(", ");
        let mut statement = connection.prepare(&format!(
            "INSERT INTO {} VALUES ({placeholders}) RETURNING *",
            self.name
        ))?;
        for row in rows {
            if let Some(index) = row
                .iter()
                .position(|value| matches!(value, Value::Timestamp(_)))
            {
                return Err(
                    self.refused(index, "SQLite has no timestamp type; send the time as text")
                );
            }
            let mut stored = statement.query(rusqlite::params_from_iter(row.iter()))?;
            let Some(stored) = stored.next()? else {
                continue;
            };
            if let Some(index) = self.rowid_column {
                if !matches!(
                    stored.get_ref(index)?,
                    ValueRef::Integer(_) | ValueRef::Null
                ) {
                    let sent = row[index];
                    return Err(self.refused(
                        index,
                        &format!("an INTEGER PRIMARY KEY holds only integers, not {sent:?}"),
                    ));
                }
            }
            for (index, sent) in row.iter().enumerate() {
                if self.columns[index].starts_with(OLD_IMAGE_PREFIX) {
                    continue;
                }
                if !holds_exactly(sent, stored.get_ref(index)?) {
                    let held = Value::column_result(stored.get_ref(index)?)
                        .map_or_else(|_| "a value".to_string(), |held| format!("{held:?}"));
                    return Err(self.refused(index, &format!("{sent:?} would be stored as {held}")));
                }
            }
        }
        Ok(())
    }

    fn refused(&self, index: usize, why: &str) -> SyncError {
        SyncError::Schema(format!(
            "upload of table {:?} holds a value its column cannot take: column {:?}: {why}",
            self.table, self.columns[index]
        ))
    }

    fn select_keys(
        &self,
        connection: &Connection,
        condition: &str,
        parameters: &[&str],
    ) -> Result<Vec<Row>, SyncError> {
        let keys = column_list(&self.key_columns, "s.");
        let mut statement = connection.prepare(&format!(
            "SELECT {keys} FROM {} AS s WHERE {condition}",
            self.name
        ))?;
        let width = self.key_columns.len();
        let rows = statement
            .query_map(rusqlite::params_from_iter(parameters), |row| {
                read_values(row, width)
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// Scratch rows whose new image is not what the table now holds (in the user's
    /// partition): not applied as sent.
    pub(super) fn rows_not_matching_table(
        &self,
        connection: &Connection,
        shape: &TableShape,
        landed: &Landed,
    ) -> Result<Vec<Row>, SyncError> {
        let mut matches = self
            .columns
            .iter()
            .filter(|column| !column.starts_with(OLD_IMAGE_PREFIX))
            .map(|column| format!("t.{c} IS s.{c}", c = q(column)))
            .collect::<Vec<_>>();
        let mut parameters = Vec::new();
        if let Some(partition_column) = landed.partition_column {
            matches.push(format!("t.{} = ?1", q(partition_column)));
            parameters.push(landed.user);
        }
        self.select_keys(
            connection,
            &format!(
                "NOT EXISTS (SELECT 1 FROM main.{} AS t WHERE {})",
                q(&shape.name),
                matches.join(" AND ")
            ),
            &parameters,
        )
    }

    /// Scratch delete keys whose row is still in the table: not deleted.
    pub(super) fn keys_still_in_table(
        &self,
        connection: &Connection,
        shape: &TableShape,
    ) -> Result<Vec<Row>, SyncError> {
        let matches = key_match(&self.key_columns, "t", "s");
        self.select_keys(
            connection,
            &format!(
                "EXISTS (SELECT 1 FROM main.{} AS t WHERE {matches})",
                q(&shape.name)
            ),
            &[],
        )
    }
}

/// The column that is `table`'s rowid (a lone INTEGER PRIMARY KEY of a rowid table), if
/// any.
fn rowid_alias(connection: &Connection, table: &str) -> Result<Option<String>, SyncError> {
    let mut statement = connection.prepare(
        "SELECT name, upper(type) FROM pragma_table_info(?1) WHERE pk > 0 \
         AND NOT EXISTS (SELECT 1 FROM pragma_index_list(?1) WHERE origin = 'pk')",
    )?;
    let keys = statement
        .query_map([table], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(match keys.as_slice() {
        [(name, kind)] if kind == "INTEGER" => Some(name.clone()),
        _ => None,
    })
}

/// Whether SQLite holds `sent` exactly as `stored`: the same value in the same storage
/// class (doubles bit for bit), or an integer as its digits in a text column or as the
/// same number in a real column (PostgreSQL takes both too), a boolean as 0 or 1, and a
/// value with a text form (`Value::text_form`) as that text.
fn holds_exactly(sent: &Value, stored: ValueRef<'_>) -> bool {
    /// Integers a double holds exactly.
    const EXACT_IN_DOUBLE: i64 = 1 << 53;
    match (sent, stored) {
        (Value::Null, ValueRef::Null) => true,
        (Value::Int(number), ValueRef::Integer(held)) => *number == held,
        (Value::Int(number), ValueRef::Text(held)) => number.to_string().as_bytes() == held,
        (Value::Int(number), ValueRef::Real(held)) => {
            number.abs() <= EXACT_IN_DOUBLE && *number as f64 == held
        }
        (Value::Double(number), ValueRef::Real(held)) => number.to_bits() == held.to_bits(),
        (Value::Bool(flag), ValueRef::Integer(held)) => i64::from(*flag) == held,
        (Value::Text(text), ValueRef::Text(held)) => text.as_bytes() == held,
        // Decimals, uuids, dates, times, intervals, arrays: their text form.
        (
            Value::Decimal(_) | Value::Numeric(_) | Value::Uuid(_) | Value::Date(_),
            ValueRef::Text(held),
        )
        | (Value::Time(_) | Value::Interval(_) | Value::Array(_), ValueRef::Text(held)) => {
            sent.text_form().is_some_and(|form| form.as_bytes() == held)
        }
        (Value::Blob(bytes), ValueRef::Blob(held)) => bytes.as_slice() == held,
        _ => false,
    }
}
