//! Conversions between wire values and SQLite values (feature `sqlite`).
//!
//! SQLite has five storage classes; booleans are stored as integers 0 and 1, a NaN
//! double as the text `NaN` (a NaN REAL would become NULL), and every
//! other value that has a text form (decimals, timestamps, uuids, dates, times,
//! intervals, arrays; see `text_form`) as that text, so that nothing is rounded:
//! timestamps as `YYYY-MM-DD HH:MM:SS.ffffff` (UTC), uuids lowercase, arrays as JSON.
//! Reading gives back the storage class; a server parses the text back into its
//! column's type.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};

use crate::Value;

impl ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Value::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            Value::Int(number) => ToSqlOutput::Borrowed(ValueRef::Integer(*number)),
            // SQLite stores a NaN REAL as NULL: NaN is kept as its text form.
            Value::Double(number) if number.is_nan() => ToSqlOutput::from("NaN".to_string()),
            Value::Double(number) => ToSqlOutput::Borrowed(ValueRef::Real(*number)),
            Value::Bool(flag) => ToSqlOutput::Borrowed(ValueRef::Integer(i64::from(*flag))),
            Value::Text(text) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
            Value::Blob(bytes) => ToSqlOutput::Borrowed(ValueRef::Blob(bytes)),
            Value::Decimal(_)
            | Value::Timestamp(_)
            | Value::Uuid(_)
            | Value::Date(_)
            | Value::Time(_)
            | Value::Interval(_)
            | Value::Numeric(_)
            | Value::Array(_) => ToSqlOutput::from(self.text_form().expect("has a text form")),
        })
    }
}

impl FromSql for Value {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Value> {
        Ok(match value {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(number) => Value::Int(number),
            ValueRef::Real(number) => Value::Double(number),
            ValueRef::Text(bytes) => Value::Text(
                String::from_utf8(bytes.to_vec())
                    .map_err(|error| FromSqlError::Other(Box::new(error)))?,
            ),
            ValueRef::Blob(bytes) => Value::Blob(bytes.to_vec()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_survives_a_sqlite_round_trip_in_its_storage_class() {
        let connection = rusqlite::Connection::open_in_memory().unwrap();
        let cases = [
            (Value::Null, Value::Null),
            (Value::Int(-7), Value::Int(-7)),
            (Value::Double(0.25), Value::Double(0.25)),
            (Value::Double(f64::NAN), Value::Text("NaN".into())),
            (
                Value::Decimal("999999999999999999999999.999999".parse().unwrap()),
                Value::Text("999999999999999999999999.999999".into()),
            ),
            (Value::Text("é".into()), Value::Text("é".into())),
            (Value::Blob(vec![0, 1]), Value::Blob(vec![0, 1])),
            (Value::Bool(true), Value::Int(1)),
            (
                Value::Uuid([0x0f; 16]),
                Value::Text("0f0f0f0f-0f0f-0f0f-0f0f-0f0f0f0f0f0f".into()),
            ),
            (Value::Date(-1), Value::Text("1969-12-31".into())),
            (Value::Time(1), Value::Text("00:00:00.000001".into())),
            (
                Value::Array(vec![Value::Int(1), Value::Null]),
                Value::Text("[1,null]".into()),
            ),
            (
                Value::Timestamp(1_700_000_000_123_456),
                Value::Text("2023-11-14 22:13:20.123456".into()),
            ),
        ];
        for (input, expected) in cases {
            let back: Value = connection
                .query_row("SELECT ?1", [&input], |row| row.get(0))
                .unwrap();
            assert_eq!(back, expected);
        }
    }
}
