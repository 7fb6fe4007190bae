//! The losing side of every conflict, kept in the client database (`rs_client_conflict`)
//! until the application removes it: the change this client uploaded that the server did
//! not take as sent, beside the server's row that won (or none, when the server has no
//! such row this user may see).
//!
//! The server names the keys in its `Conflicts` messages and sends its winning rows in the
//! download; the client's own values come from the upload it sent (its frames, kept in
//! `rs_client_inflight` until acknowledged). They are written in the transaction that
//! applies the download, so a conflict is kept exactly when its resolution is applied.

use std::collections::HashMap;

use rowsync_protocol::{
    encode_key_identity, Conflicts, Download, FrameDecoder, Message, Row, TableUpload, Value,
};
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{params, Connection, ToSql};
use serde_json::{Map, Value as Json};

use crate::report::key_positions;
use crate::ClientError;

/// The table of kept conflicts; rows stay until the application deletes them.
pub const KEPT_CONFLICTS_DDL: &str = "
CREATE TABLE IF NOT EXISTS rs_client_conflict (
    id INTEGER PRIMARY KEY,
    table_name TEXT NOT NULL,
    operation TEXT NOT NULL,
    key TEXT NOT NULL,
    client_row TEXT,
    server_row TEXT,
    upload_sequence INTEGER NOT NULL,
    recorded_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
";

/// One kept conflict: a change of this client that lost. Rows are JSON objects of column
/// name to value, each value in the form the client's table stores it (integer, real,
/// text, `null`; a blob as `{"blob": "<hex>"}`).
#[derive(Debug, Clone, PartialEq)]
pub struct KeptConflict {
    /// Its row id in `rs_client_conflict` (for [`crate::Client::remove_kept_conflict`]).
    pub id: i64,
    pub table: String,
    /// The losing change: `insert`, `update` or `delete`.
    pub operation: String,
    /// The primary key, column to value.
    pub key: Json,
    /// The row this client uploaded (`None` for a delete).
    pub client_row: Option<Json>,
    /// The server's row that won (`None`: the server has no such row this user may see).
    pub server_row: Option<Json>,
    /// The upload that carried the change.
    pub upload_sequence: u64,
    /// When the conflict was kept (UTC, ISO 8601).
    pub recorded_at: String,
}

impl KeptConflict {
    pub fn to_json(&self) -> Json {
        serde_json::json!({
            "id": self.id,
            "table": self.table,
            "operation": self.operation,
            "key": self.key,
            "client_row": self.client_row,
            "server_row": self.server_row,
            "upload_sequence": self.upload_sequence,
            "recorded_at": self.recorded_at,
        })
    }
}

/// The server's side of one named conflict, once the download said it.
#[derive(Debug, Default)]
struct ServerSide {
    /// The server's row with its column names; `None` until the download brings it, or
    /// when the download deletes the key.
    row: Option<(Vec<String>, Row)>,
}

/// The conflicts one round's answer names, with the server's rows as they arrive.
#[derive(Debug, Default)]
pub struct LosingRows {
    /// By table, then by the key's identity encoding.
    named: HashMap<String, HashMap<Vec<u8>, ServerSide>>,
    count: u64,
}

impl LosingRows {
    /// Notes the keys the server named. A server cannot name more conflicts than the
    /// upload has operations (`operations_max`): that is refused, so a bad answer cannot
    /// grow this without bound.
    pub fn named(&mut self, conflicts: &Conflicts, operations_max: u64) -> Result<(), ClientError> {
        let table = self.named.entry(conflicts.table.clone()).or_default();
        for key in &conflicts.keys {
            let mut encoded = Vec::new();
            encode_key_identity(key, &mut encoded);
            if table.insert(encoded, ServerSide::default()).is_none() {
                self.count += 1;
            }
        }
        if self.count > operations_max {
            return Err(ClientError::Protocol(format!(
                "the server named {} conflicts for an upload of {operations_max} operations",
                self.count
            )));
        }
        Ok(())
    }

    /// Takes the server's rows for named keys from a download message.
    pub fn answered(&mut self, download: &Download) {
        let Some(table) = self.named.get_mut(&download.table) else {
            return;
        };
        let mut encoded = Vec::new();
        for key in &download.deletes {
            encoded.clear();
            encode_key_identity(key, &mut encoded);
            if let Some(side) = table.get_mut(&encoded) {
                side.row = None;
            }
        }
        let Some(positions) = key_positions(&download.columns, &download.key_columns) else {
            return;
        };
        for row in &download.upserts {
            encoded.clear();
            let key: Vec<Value> = positions
                .iter()
                .filter_map(|&p| row.get(p).cloned())
                .collect();
            encode_key_identity(&key, &mut encoded);
            if let Some(side) = table.get_mut(&encoded) {
                side.row = Some((download.columns.clone(), row.clone()));
            }
        }
    }

    /// Writes a kept conflict for each named key, with the client's change from the
    /// upload `frames`; returns how many. Runs inside the download's transaction.
    pub fn record(
        &self,
        connection: &Connection,
        frames: &[Vec<u8>],
        upload_sequence: u64,
    ) -> Result<u64, ClientError> {
        if self.count == 0 {
            return Ok(0);
        }
        let mut kept = 0;
        for_each_upload(frames, |upload| {
            kept += self.record_table(connection, &upload, upload_sequence)?;
            Ok(())
        })?;
        Ok(kept)
    }

    fn record_table(
        &self,
        connection: &Connection,
        upload: &TableUpload,
        upload_sequence: u64,
    ) -> Result<u64, ClientError> {
        let Some(named) = self.named.get(&upload.table) else {
            return Ok(0);
        };
        let positions = key_positions(&upload.columns, &upload.key_columns).ok_or_else(|| {
            ClientError::Schema(format!(
                "the upload of {:?} lacks a key column",
                upload.table
            ))
        })?;
        let changes = upload
            .inserts
            .iter()
            .map(|row| ("insert", pick(row, &positions), Some(row)))
            .chain(
                upload
                    .updates
                    .iter()
                    .map(|update| ("update", pick(&update.new, &positions), Some(&update.new))),
            )
            .chain(
                upload
                    .deletes
                    .iter()
                    .map(|key| ("delete", key.clone(), None)),
            );
        let mut insert = connection.prepare_cached(
            "INSERT INTO rs_client_conflict
                 (table_name, operation, key, client_row, server_row, upload_sequence)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        let mut kept = 0;
        let mut encoded = Vec::new();
        for (operation, key, client_row) in changes {
            encoded.clear();
            encode_key_identity(&key, &mut encoded);
            let Some(side) = named.get(&encoded) else {
                continue;
            };
            let server_row = side
                .row
                .as_ref()
                .map(|(columns, row)| object(columns, row).to_string());
            insert.execute(params![
                upload.table,
                operation,
                object(&upload.key_columns, &key).to_string(),
                client_row.map(|row| object(&upload.columns, row).to_string()),
                server_row,
                upload_sequence as i64,
            ])?;
            kept += 1;
        }
        Ok(kept)
    }
}

/// Calls `each` with every table upload an in-flight upload's `frames` hold (this
/// client's own frames: no limits but their own), values in pieces made whole.
pub fn for_each_upload(
    frames: &[Vec<u8>],
    mut each: impl FnMut(TableUpload) -> Result<(), ClientError>,
) -> Result<(), ClientError> {
    let mut decoder = FrameDecoder::new(usize::MAX / 2).with_value_limits(u64::MAX, u64::MAX);
    for frame in frames {
        decoder.feed(frame);
        while let Some(message) = decoder.next_message()? {
            if let Message::Upload(upload) = message {
                each(upload)?;
            }
        }
    }
    Ok(())
}

pub fn pick(row: &[Value], positions: &[usize]) -> Row {
    positions
        .iter()
        .filter_map(|&p| row.get(p).cloned())
        .collect()
}

/// A row as a JSON object of column name to the value as SQLite stores it.
pub fn object(columns: &[String], row: &[Value]) -> Json {
    let mut object = Map::new();
    for (column, value) in columns.iter().zip(row) {
        object.insert(column.clone(), stored_form(value));
    }
    Json::Object(object)
}

/// A value in the form a SQLite client table stores it (the form a download writes).
pub fn stored_form(value: &Value) -> Json {
    let output = match value.to_sql() {
        Ok(output) => output,
        Err(_) => return Json::Null,
    };
    let value_ref = match &output {
        ToSqlOutput::Borrowed(value_ref) => *value_ref,
        ToSqlOutput::Owned(owned) => ValueRef::from(owned),
        _ => ValueRef::Null,
    };
    match value_ref {
        ValueRef::Null => Json::Null,
        ValueRef::Integer(number) => Json::from(number),
        ValueRef::Real(number) => serde_json::Number::from_f64(number)
            .map(Json::Number)
            .unwrap_or_else(|| Json::String(number.to_string())),
        ValueRef::Text(bytes) => Json::String(String::from_utf8_lossy(bytes).into_owned()),
        ValueRef::Blob(bytes) => serde_json::json!({ "blob": hex::encode(bytes) }),
    }
}

/// Every kept conflict, oldest first.
pub fn kept_conflicts(connection: &Connection) -> Result<Vec<KeptConflict>, ClientError> {
    let mut statement = connection.prepare(
        "SELECT id, table_name, operation, key, client_row, server_row, upload_sequence,
                recorded_at FROM rs_client_conflict ORDER BY id",
    )?;
    let rows = statement.query_map([], |row| {
        Ok(KeptConflict {
            id: row.get(0)?,
            table: row.get(1)?,
            operation: row.get(2)?,
            key: json_column(row, 3)?.unwrap_or(Json::Null),
            client_row: json_column(row, 4)?,
            server_row: json_column(row, 5)?,
            upload_sequence: row.get::<_, i64>(6)?.max(0) as u64,
            recorded_at: row.get(7)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// A column holding a JSON text (or NULL), parsed.
pub fn json_column(row: &rusqlite::Row, index: usize) -> rusqlite::Result<Option<Json>> {
    let Some(text) = row.get::<_, Option<String>>(index)? else {
        return Ok(None);
    };
    serde_json::from_str(&text).map(Some).map_err(|error| {
        rusqlite::Error::FromSqlConversionFailure(
            index,
            rusqlite::types::Type::Text,
            Box::new(error),
        )
    })
}

/// Removes one kept conflict; returns whether it was there.
pub fn remove_kept_conflict(connection: &Connection, id: i64) -> Result<bool, ClientError> {
    Ok(connection.execute("DELETE FROM rs_client_conflict WHERE id = ?1", [id])? > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_are_kept_in_the_form_a_client_table_stores() {
        let timestamp = Value::Timestamp(1_795_000_000_000_000);
        let expected_timestamp = Json::String(timestamp.text_form().unwrap());
        let cases = [
            (Value::Null, Json::Null),
            (Value::Int(7), json!(7)),
            (Value::Double(0.5), json!(0.5)),
            (Value::Double(f64::NAN), json!("NaN")),
            (Value::Bool(true), json!(1)),
            (Value::Text("é".into()), json!("é")),
            (Value::Blob(vec![0, 255]), json!({"blob": "00ff"})),
            (timestamp, expected_timestamp),
            (Value::Date(-1), json!("1969-12-31")),
        ];
        for (value, expected) in cases {
            assert_eq!(stored_form(&value), expected, "{value:?}");
        }
    }

    #[test]
    fn a_server_naming_more_conflicts_than_the_upload_has_operations_is_refused() {
        let mut losing = LosingRows::default();
        let conflicts = Conflicts {
            table: "items".into(),
            key_columns: vec!["id".into()],
            keys: (0..3).map(|n| vec![Value::Int(n)]).collect(),
        };
        losing.named(&conflicts, 3).unwrap();
        // The same keys again count once.
        losing.named(&conflicts, 3).unwrap();
        let more = Conflicts {
            keys: vec![vec![Value::Int(9)]],
            ..conflicts
        };
        let refused = losing.named(&more, 3).unwrap_err().to_string();
        assert!(refused.contains("4 conflicts"), "{refused}");
    }
}
