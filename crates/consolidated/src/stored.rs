//! What the server stored of an upload: rows the table holds otherwise than the client
//! sent them (a trigger's `last_update = now()`, a default or generated column, the
//! canonical form of a numeric or a timestamp) go back to the client in the same sync,
//! so it ends holding exactly the server's row, the old image the server will expect
//! next time. Rows stored exactly as sent stay out of the download (the echo saving).

use std::collections::HashMap;

use rowsync_protocol::{parse_text_form, Row, TableUpload, Value, ValueKind};

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

/// What goes back to the client of the rows read back after its upload.
#[derive(Debug, Default, PartialEq)]
pub struct StoredBack {
    /// The server's rows that differ from what the client sent.
    pub upserts: Vec<Row>,
    /// Keys as the client sent them, where the table stores the key in another form
    /// (a timestamp key written without its fraction): the client drops its own form
    /// and takes the server's row, so it never holds two rows for one server key.
    pub deletes: Vec<Row>,
}

/// Of the rows read back after the upload (`rows`, with `columns` and the key at
/// `fetched_key_positions`), those that differ from what the upload sent for the same
/// key in a column both name, compared in the form a SQLite client stores
/// ([`rowsync_protocol::Value::identity_form`]). A sent key found only once parsed
/// into its column's kind (the kind of the stored key's value) is another form of the
/// stored key: its row comes back with a delete of the sent form.
pub fn rows_stored_otherwise(
    upload: &TableUpload,
    upload_key_positions: &[usize],
    columns: &[String],
    fetched_key_positions: &[usize],
    rows: Vec<Row>,
) -> StoredBack {
    let sent: HashMap<Vec<u8>, &Row> = upserted_rows(upload)
        .map(|row| (key_bytes(row, upload_key_positions), row))
        .collect();
    // For each fetched column, where the upload holds it.
    let in_upload: Vec<Option<usize>> = columns
        .iter()
        .map(|column| upload.columns.iter().position(|c| c == column))
        .collect();
    let differs = |stored: &Row, sent: &Row| {
        stored.iter().zip(&in_upload).any(|(stored, position)| {
            position
                .and_then(|p| sent.get(p))
                .is_some_and(|sent| sent.identity_form() != stored.identity_form())
        })
    };
    let mut back = StoredBack::default();
    let mut by_stored_form: Option<HashMap<Vec<u8>, &Row>> = None;
    for stored in rows {
        let key = key_bytes(&stored, fetched_key_positions);
        if let Some(sent) = sent.get(&key) {
            if differs(&stored, sent) {
                back.upserts.push(stored);
            }
            continue;
        }
        // Built once, with the key columns' kinds read off the first such stored row.
        let index = by_stored_form.get_or_insert_with(|| {
            let kinds: Vec<Option<ValueKind>> = fetched_key_positions
                .iter()
                .map(|&position| stored.get(position).and_then(kind_of))
                .collect();
            upserted_rows(upload)
                .map(|row| (stored_key_bytes(row, upload_key_positions, &kinds), row))
                .collect()
        });
        if let Some(sent) = index.get(&key) {
            back.deletes
                .push(keys_of(std::iter::once(*sent), upload_key_positions).remove(0));
            back.upserts.push(stored);
        }
    }
    back
}

/// The kind a text form of `value`'s column is parsed into, where the text form is not
/// the value itself.
fn kind_of(value: &Value) -> Option<ValueKind> {
    Some(match value {
        Value::Timestamp(_) => ValueKind::Timestamp,
        Value::Date(_) => ValueKind::Date,
        Value::Time(_) => ValueKind::Time,
        Value::Uuid(_) => ValueKind::Uuid,
        Value::Decimal(_) | Value::Numeric(_) => ValueKind::Decimal,
        Value::Interval(_) => ValueKind::Interval,
        Value::Bool(_) => ValueKind::Bool,
        _ => return None,
    })
}

/// A sent row's key as its columns store it: each text value parsed into `kinds`.
fn stored_key_bytes(row: &Row, key_positions: &[usize], kinds: &[Option<ValueKind>]) -> Vec<u8> {
    let key: Row = key_positions
        .iter()
        .zip(kinds)
        .filter_map(|(&position, kind)| {
            let value = row.get(position)?;
            Some(match (kind, value) {
                (Some(kind), Value::Text(text)) => {
                    parse_text_form(kind, text).unwrap_or_else(|_| value.clone())
                }
                _ => value.clone(),
            })
        })
        .collect();
    key_bytes(&key, &(0..key.len()).collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use rowsync_protocol::{Decimal, RowUpdate};

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
        let ids: Vec<&Value> = back.upserts.iter().map(|row| &row[1]).collect();
        assert_eq!(ids, [&Value::Int(1), &Value::Int(3)]);
        assert!(back.deletes.is_empty());
        assert_eq!(
            keys_of(upserted_rows(&upload), &[0]),
            [[Value::Int(1)], [Value::Int(2)], [Value::Int(3)]]
        );
    }

    #[test]
    fn a_key_sent_in_another_form_comes_back_with_a_delete_of_that_form() {
        let sent_key = text("2026-11-27T09:01:00Z");
        let upload = TableUpload {
            table: "payment".into(),
            columns: vec!["paid_at".into(), "id".into(), "amount".into()],
            key_columns: vec!["paid_at".into(), "id".into()],
            inserts: vec![vec![sent_key.clone(), Value::Int(2), text("5")]],
            ..TableUpload::default()
        };
        let stored_at = Value::Timestamp(1_795_770_060_000_000);
        let price = Value::Decimal("5.00".parse::<Decimal>().unwrap());
        let columns = ["paid_at", "id", "amount"].map(String::from);
        let rows = vec![vec![stored_at.clone(), Value::Int(2), price.clone()]];
        let back = rows_stored_otherwise(&upload, &[0, 1], &columns, &[0, 1], rows);
        assert_eq!(back.deletes, [vec![sent_key, Value::Int(2)]]);
        assert_eq!(back.upserts, [vec![stored_at, Value::Int(2), price]]);
    }
}
