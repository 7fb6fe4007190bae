//! What rowsync knows of a consolidated table, and checking an upload against it.

use std::collections::HashSet;

use rowsync_protocol::{TableUpload, Value};

use crate::{DbError, SyncError, TableInit};

/// A column of a consolidated table.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
}

/// `init`'s refusal of a column whose type rowsync cannot carry.
pub fn unsupported_column_type(table: &str, column: &str, type_name: &str) -> DbError {
    DbError::Invalid(format!(
        "table {table:?} column {column:?} has type {type_name}, which rowsync cannot \
         synchronize; docs/types.md lists the types it can"
    ))
}

/// A user name that is no value of a table's partition column (`store_id integer`
/// against the user `alice`): the user's rows could never be found, so a sync, or an
/// `init` that knows the user, says so rather than download nothing (or another
/// value's rows, where the database converts the name silently).
pub fn partition_value_refusal(user: &str, table: &str, column: &str, type_name: &str) -> String {
    format!(
        "user {user:?} is no value of table {table:?}'s partition column {column:?} \
         ({type_name}), which holds the name of the user whose row it is. Name the user \
         after a value of that column, or partition the table by a column of user names \
         (`rowsync init --table {table} --partition-column COLUMN`)"
    )
}

/// `init`'s refusal of a partition column that a known user's name is no value of.
pub fn partition_column_refusal(init: &TableInit, user: &str, type_name: &str) -> DbError {
    DbError::Invalid(partition_value_refusal(
        user,
        &init.table,
        &init.partition_column,
        type_name,
    ))
}

/// Whether a text is a number as SQLite and MariaDB read one into a numeric column
/// (other text there compares as 0 or as no number at all).
pub fn is_number(text: &str) -> bool {
    !text.is_empty() && text.trim() == text && text.parse::<f64>().is_ok_and(f64::is_finite)
}

/// What rowsync needs to know of a consolidated table.
#[derive(Debug, Clone)]
pub struct TableShape {
    pub name: String,
    pub columns: Vec<Column>,
    /// Primary-key column names in key order.
    pub key_columns: Vec<String>,
}

impl TableShape {
    pub fn has_column(&self, name: &str) -> bool {
        self.columns.iter().any(|column| column.name == name)
    }

    pub fn column_names(&self) -> Vec<String> {
        self.columns
            .iter()
            .map(|column| column.name.clone())
            .collect()
    }
}

pub fn key_positions_in(
    columns: &[String],
    keys: &[String],
    table: &str,
    event: &str,
) -> Result<Vec<usize>, SyncError> {
    keys.iter()
        .map(|key| {
            columns
                .iter()
                .position(|column| column == key)
                .ok_or_else(|| {
                    SyncError::script(
                        event,
                        table,
                        format!(
                            "the script must select the key column {key:?}; it selects {columns:?}"
                        ),
                    )
                })
        })
        .collect()
}

/// Checks the upload's columns against the table and returns the positions of the key
/// columns within the upload's columns.
pub fn validate_upload_shape(
    upload: &TableUpload,
    shape: &TableShape,
) -> Result<Vec<usize>, SyncError> {
    let table = &shape.name;
    if upload.key_columns != shape.key_columns {
        return Err(SyncError::Schema(format!(
            "table {table:?} has primary key {:?} in the consolidated database, the upload names {:?}",
            shape.key_columns, upload.key_columns
        )));
    }
    let mut seen = HashSet::new();
    for column in &upload.columns {
        if !shape.has_column(column) {
            return Err(SyncError::Schema(format!(
                "table {table:?} has no column {column:?}"
            )));
        }
        if !seen.insert(column) {
            return Err(SyncError::Schema(format!(
                "column {column:?} of table {table:?} appears twice in the upload"
            )));
        }
    }
    let carries_rows = !(upload.inserts.is_empty() && upload.updates.is_empty());
    if carries_rows && upload.columns.is_empty() {
        return Err(SyncError::Schema(format!(
            "upload of table {table:?} carries rows but no columns"
        )));
    }
    if upload.columns.is_empty() {
        return Ok(Vec::new());
    }
    upload
        .key_columns
        .iter()
        .map(|key| {
            upload
                .columns
                .iter()
                .position(|column| column == key)
                .ok_or_else(|| {
                    SyncError::Schema(format!(
                        "upload of table {table:?} lacks key column {key:?}"
                    ))
                })
        })
        .collect()
}

/// Refuses a NULL in a key column of an inserted row, an updated row's new image or a
/// deleted key: no backend can hold it as the row's identity (SQLite would give an
/// INTEGER PRIMARY KEY a rowid of its choosing, PostgreSQL refuses it mid-script).
pub fn refuse_null_keys(upload: &TableUpload, key_positions: &[usize]) -> Result<(), SyncError> {
    let rows = upload
        .inserts
        .iter()
        .chain(upload.updates.iter().map(|update| &update.new));
    let null_in_row = rows
        .flat_map(|row| key_positions.iter().map(move |&position| (row, position)))
        .find(|(row, position)| matches!(row.get(*position), Some(Value::Null)))
        .map(|(_, position)| position);
    let null_in_delete = upload.deletes.iter().find_map(|key| {
        key.iter()
            .position(|value| matches!(value, Value::Null))
            .and_then(|index| key_positions.get(index).copied())
    });
    match null_in_row.or(null_in_delete) {
        None => Ok(()),
        Some(position) => Err(SyncError::Schema(format!(
            "upload of table {:?} holds a NULL in key column {:?}",
            upload.table, upload.columns[position]
        ))),
    }
}

/// (index, column) rows, ordered by index and position, as each index's columns.
pub fn columns_by_index(rows: Vec<(String, String)>) -> Vec<Vec<String>> {
    let mut indexes: Vec<(String, Vec<String>)> = Vec::new();
    for (index, column) in rows {
        match indexes.last_mut() {
            Some((name, columns)) if *name == index => columns.push(column),
            _ => indexes.push((index, vec![column])),
        }
    }
    indexes.into_iter().map(|(_, columns)| columns).collect()
}
