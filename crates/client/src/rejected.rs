//! Changes the server refused, set aside in the client database (`rs_client_rejected`)
//! with the server's reason, until the application re-queues or removes them.
//!
//! A protocol v6 server that cannot apply an upload for some of its rows names each (its
//! table and key, or a whole table) and applies nothing. The client takes those rows'
//! changes out of the upload in flight, keeps them here, and sends the rest again in the
//! same sync: one bad row never stops a device.

use std::collections::HashMap;

use rowsync_protocol::{encode_key_identity, RefusedRow, Row, TableUpload};
use rusqlite::types::Value as SqlValue;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value as Json;

use crate::kept::{json_column, object, pick};
use crate::report::key_positions;
use crate::ClientError;

/// The table of rejected changes; rows stay until the application re-queues or removes
/// them.
pub const REJECTED_DDL: &str = "
CREATE TABLE IF NOT EXISTS rs_client_rejected (
    id INTEGER PRIMARY KEY,
    table_name TEXT NOT NULL,
    operation TEXT NOT NULL,
    key TEXT NOT NULL,
    client_row TEXT,
    old_row TEXT,
    code INTEGER NOT NULL,
    reason TEXT NOT NULL,
    upload_sequence INTEGER NOT NULL,
    recorded_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
";

/// One change the server refused. Rows are JSON objects of column name to value, in
/// the form the client's table stores it (as in [`crate::KeptConflict`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RejectedRow {
    /// Its row id in `rs_client_rejected` (for [`crate::Client::requeue_rejected`] and
    /// [`crate::Client::remove_rejected`]).
    pub id: i64,
    pub table: String,
    /// The refused change: `insert`, `update` or `delete`.
    pub operation: String,
    /// The primary key, column to value.
    pub key: Json,
    /// The row as this client sent it (`None` for a delete).
    pub client_row: Option<Json>,
    /// For an update, the row the change started from (what the server holds).
    pub old_row: Option<Json>,
    /// The server's error code for the row (7: a value or table the version cannot
    /// take; 9: a script or constraint failed).
    pub code: u16,
    /// The server's reason, in its words.
    pub reason: String,
    /// The upload that carried the change.
    pub upload_sequence: u64,
    /// When it was set aside (UTC, ISO 8601).
    pub recorded_at: String,
}

impl RejectedRow {
    pub fn to_json(&self) -> Json {
        serde_json::json!({
            "id": self.id,
            "table": self.table,
            "operation": self.operation,
            "key": self.key,
            "client_row": self.client_row,
            "old_row": self.old_row,
            "code": self.code,
            "reason": self.reason,
            "upload_sequence": self.upload_sequence,
            "recorded_at": self.recorded_at,
        })
    }
}

/// The rows a server refused, by table: a whole table, or keys by their identity.
pub struct Refusals<'a> {
    refused: &'a [RefusedRow],
}

impl<'a> Refusals<'a> {
    pub fn new(refused: &'a [RefusedRow]) -> Refusals<'a> {
        Refusals { refused }
    }

    /// The refusal that names `key` of `table`: the table's own, else the key's.
    fn finder(&self, table: &str) -> impl Fn(&Row) -> Option<&'a RefusedRow> {
        let refused = self.refused;
        let whole = refused
            .iter()
            .find(|refused| refused.table == table && refused.key_columns.is_empty());
        let keys: HashMap<Vec<u8>, &'a RefusedRow> = refused
            .iter()
            .filter(|refused| refused.table == table && !refused.key_columns.is_empty())
            .map(|refused| (identity(&refused.key), refused))
            .collect();
        move |key| whole.or_else(|| keys.get(&identity(key)).copied())
    }

    /// Takes the refused changes out of `upload`, writing each to `rs_client_rejected`;
    /// returns how many.
    pub fn set_aside(
        &self,
        connection: &Connection,
        upload: &mut TableUpload,
        upload_sequence: u64,
    ) -> Result<u64, ClientError> {
        let refusal_of = self.finder(&upload.table);
        let positions = key_positions(&upload.columns, &upload.key_columns).ok_or_else(|| {
            ClientError::Schema(format!(
                "the upload of {:?} lacks a key column",
                upload.table
            ))
        })?;
        // Taken out first, written after.
        let mut aside: Vec<SetAside> = Vec::new();
        upload.inserts.retain(|row| {
            let key = pick(row, &positions);
            let Some(refused) = refusal_of(&key) else {
                return true;
            };
            aside.push(SetAside {
                operation: "insert",
                key,
                client_row: Some(row.clone()),
                old_row: None,
                refused,
            });
            false
        });
        upload.updates.retain(|update| {
            let key = pick(&update.new, &positions);
            let Some(refused) = refusal_of(&key) else {
                return true;
            };
            aside.push(SetAside {
                operation: "update",
                key,
                client_row: Some(update.new.clone()),
                old_row: Some(update.old.clone()),
                refused,
            });
            false
        });
        upload.deletes.retain(|key| {
            let Some(refused) = refusal_of(key) else {
                return true;
            };
            aside.push(SetAside {
                operation: "delete",
                key: key.clone(),
                client_row: None,
                old_row: None,
                refused,
            });
            false
        });
        record_set_aside(connection, upload, &aside, upload_sequence)?;
        Ok(aside.len() as u64)
    }
}

/// Writes the changes set aside from `upload` to `rs_client_rejected`.
fn record_set_aside(
    connection: &Connection,
    upload: &TableUpload,
    aside: &[SetAside<'_>],
    upload_sequence: u64,
) -> Result<(), ClientError> {
    let mut insert = connection.prepare_cached(
        "INSERT INTO rs_client_rejected
             (table_name, operation, key, client_row, old_row, code, reason, upload_sequence)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    let row_json = |row: &Option<Row>| {
        row.as_ref()
            .map(|row| object(&upload.columns, row).to_string())
    };
    for change in aside {
        insert.execute(params![
            upload.table,
            change.operation,
            object(&upload.key_columns, &change.key).to_string(),
            row_json(&change.client_row),
            row_json(&change.old_row),
            change.refused.code,
            change.refused.reason,
            upload_sequence as i64,
        ])?;
    }
    Ok(())
}

/// A change taken out of an upload, with the refusal that names it.
struct SetAside<'r> {
    operation: &'static str,
    key: Row,
    client_row: Option<Row>,
    old_row: Option<Row>,
    refused: &'r RefusedRow,
}

fn identity(key: &Row) -> Vec<u8> {
    let mut encoded = Vec::new();
    encode_key_identity(key, &mut encoded);
    encoded
}

const REJECTED_COLUMNS: &str = "id, table_name, operation, key, client_row, old_row, code, \
     reason, upload_sequence, recorded_at";

/// Every rejected change, oldest first.
pub fn rejected_rows(connection: &Connection) -> Result<Vec<RejectedRow>, ClientError> {
    let mut statement = connection.prepare(&format!(
        "SELECT {REJECTED_COLUMNS} FROM rs_client_rejected ORDER BY id"
    ))?;
    let rows = statement.query_map([], rejected_of)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// One rejected change, if it is there.
pub fn rejected_row(connection: &Connection, id: i64) -> Result<Option<RejectedRow>, ClientError> {
    let sql = format!("SELECT {REJECTED_COLUMNS} FROM rs_client_rejected WHERE id = ?1");
    Ok(connection.query_row(&sql, [id], rejected_of).optional()?)
}

/// A row of `rs_client_rejected`, its columns in the order of `REJECTED_COLUMNS`.
fn rejected_of(row: &rusqlite::Row) -> rusqlite::Result<RejectedRow> {
    Ok(RejectedRow {
        id: row.get(0)?,
        table: row.get(1)?,
        operation: row.get(2)?,
        key: json_column(row, 3)?.unwrap_or(Json::Null),
        client_row: json_column(row, 4)?,
        old_row: json_column(row, 5)?,
        code: row.get::<_, i64>(6)?.clamp(0, i64::from(u16::MAX)) as u16,
        reason: row.get(7)?,
        upload_sequence: row.get::<_, i64>(8)?.max(0) as u64,
        recorded_at: row.get(9)?,
    })
}

/// The values of `columns` in a row kept as JSON (see [`RejectedRow`]), as SQLite
/// values; a column the row lacks is NULL.
pub fn sql_values(row: &Json, columns: &[String]) -> Result<Vec<SqlValue>, ClientError> {
    columns
        .iter()
        .map(|column| match row.get(column) {
            None | Some(Json::Null) => Ok(SqlValue::Null),
            Some(Json::Number(number)) => Ok(match number.as_i64() {
                Some(integer) => SqlValue::Integer(integer),
                None => SqlValue::Real(number.as_f64().unwrap_or(f64::NAN)),
            }),
            Some(Json::String(text)) => Ok(SqlValue::Text(text.clone())),
            Some(Json::Object(object)) => match object.get("blob").and_then(Json::as_str) {
                Some(hex_text) => hex::decode(hex_text).map(SqlValue::Blob).map_err(|_| {
                    ClientError::Schema(format!("column {column:?} holds a blob that is not hex"))
                }),
                None => Err(ClientError::Schema(format!(
                    "column {column:?} holds an object that is not a blob"
                ))),
            },
            Some(other) => Err(ClientError::Schema(format!(
                "column {column:?} holds {other}, which no client table stores"
            ))),
        })
        .collect()
}

/// Removes one rejected change; returns whether it was there.
pub fn remove_rejected(connection: &Connection, id: i64) -> Result<bool, ClientError> {
    Ok(connection.execute("DELETE FROM rs_client_rejected WHERE id = ?1", [id])? > 0)
}
