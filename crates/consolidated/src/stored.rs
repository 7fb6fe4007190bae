//! What the server stored of an upload: rows the table holds otherwise than the client
//! sent them (a trigger's `last_update = now()`, a default or generated column, the
//! canonical form of a numeric or a timestamp) go back to the client in the same sync,
//! so it ends holding exactly the server's row, the old image the server will expect
//! next time. Rows stored exactly as sent stay out of the download (the echo saving).

use std::collections::HashMap;

use rowsync_protocol::{Row, TableUpload};

use crate::upload_rows::key_bytes;

/// Which uploaded rows a backend says must be read back and compared after the upload.
#[derive(Debug, Clone, PartialEq)]
pub enum KeysToCheck {
    /// Every row is stored as sent (no trigger, default or generated column can change
    /// it, and every value is in the form the column stores).
    None,
    /// Every uploaded insert and update (the table may change what it is given).
    All,
    /// Only these keys (values in the upload's key order): their values change form.
    Only(Vec<Row>),
}

/// The upload's inserted and updated rows (new images), in the upload's columns.
pub fn upserted_rows(upload: &TableUpload) -> impl Iterator<Item = &Row> {
    upload
        .inserts
        .iter()
        .chain(upload.updates.iter().map(|update| &update.new))
}

/// The keys of `rows` (values at `key_positions`), in key order.
pub fn keys_of<'r>(rows: impl Iterator<Item = &'r Row>, key_positions: &[usize]) -> Vec<Row> {
    rows.map(|row| {
        key_positions
            .iter()
            .filter_map(|&position| row.get(position).cloned())
            .collect()
    })
    .collect()
}

/// Of the rows read back after the upload (`rows`, with `columns` and the key at
/// `fetched_key_positions`), those that differ from what the upload sent for the same
/// key in a column both name, compared in the form a SQLite client stores
/// ([`rowsync_protocol::Value::identity_form`]). A row whose key the upload does not
/// hold in that form is left to the download cursor.
pub fn rows_stored_otherwise(
    upload: &TableUpload,
    upload_key_positions: &[usize],
    columns: &[String],
    fetched_key_positions: &[usize],
    rows: Vec<Row>,
) -> Vec<Row> {
    let sent: HashMap<Vec<u8>, &Row> = upserted_rows(upload)
        .map(|row| (key_bytes(row, upload_key_positions), row))
        .collect();
    // For each fetched column, where the upload holds it.
    let in_upload: Vec<Option<usize>> = columns
        .iter()
        .map(|column| upload.columns.iter().position(|c| c == column))
        .collect();
    rows.into_iter()
        .filter(|stored| {
            let Some(sent) = sent.get(&key_bytes(stored, fetched_key_positions)) else {
                return false;
            };
            stored.iter().zip(&in_upload).any(|(stored, position)| {
                position
                    .and_then(|p| sent.get(p))
                    .is_some_and(|sent| sent.identity_form() != stored.identity_form())
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use rowsync_protocol::{Decimal, RowUpdate, Value};

    use super::*;

    fn text(value: &str) -> Value {
        Value::Text(value.into())
    }

    #[test]
    fn only_rows_stored_otherwise_than_sent_come_back() {
        let upload = TableUpload {
            table: "t".into(),
            columns: vec!["id".into(), "price".into(), "at".into()],
            key_columns: vec!["id".into()],
            inserts: vec![
                vec![Value::Int(1), text("5"), text("2026-11-27 10:00:04")],
                vec![Value::Int(2), text("5.00"), text("2026-11-27 10:00:04")],
            ],
            updates: vec![RowUpdate {
                old: vec![Value::Int(3), text("1.00"), Value::Null],
                new: vec![Value::Int(3), text("2.00"), text("2026-11-27 10:00:04")],
            }],
            deletes: vec![vec![Value::Int(4)]],
        };
        let price = Value::Decimal("5.00".parse::<Decimal>().unwrap());
        // Read back in another column order, with a column the upload lacks.
        let columns = ["at", "id", "price", "server_only"].map(String::from);
        let at = text("2026-11-27 10:00:04");
        let rows = vec![
            vec![at.clone(), Value::Int(1), price.clone(), Value::Int(0)],
            vec![at.clone(), Value::Int(2), price.clone(), Value::Int(0)],
            // A trigger moved the timestamp on.
            vec![
                text("2026-11-28 00:00:00"),
                Value::Int(3),
                text("2.00"),
                Value::Int(0),
            ],
            // A key the upload does not hold (another form of it): left to the cursor.
            vec![at, Value::Int(9), price, Value::Int(0)],
        ];
        let back = rows_stored_otherwise(&upload, &[0], &columns, &[1], rows);
        let ids: Vec<&Value> = back.iter().map(|row| &row[1]).collect();
        assert_eq!(ids, [&Value::Int(1), &Value::Int(3)]);
        assert_eq!(
            keys_of(upserted_rows(&upload), &[0]),
            [[Value::Int(1)], [Value::Int(2)], [Value::Int(3)]]
        );
    }
}
