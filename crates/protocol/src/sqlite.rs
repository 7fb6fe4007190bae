//! Conversions between wire values and SQLite values (feature `sqlite`).
//!
//! SQLite has five storage classes; decimals and timestamps are stored as text so that
//! nothing is rounded: decimals in their exact digits, timestamps as
//! `YYYY-MM-DD HH:MM:SS.ffffff` (UTC). Reading gives back the storage class.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};

use crate::Value;

impl ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Value::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            Value::Int(number) => ToSqlOutput::Borrowed(ValueRef::Integer(*number)),
            Value::Double(number) => ToSqlOutput::Borrowed(ValueRef::Real(*number)),
            Value::Decimal(decimal) => ToSqlOutput::from(decimal.to_string()),
            Value::Text(text) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
            Value::Blob(bytes) => ToSqlOutput::Borrowed(ValueRef::Blob(bytes)),
            Value::Timestamp(micros) => ToSqlOutput::from(format_timestamp(*micros)?),
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

fn format_timestamp(micros: i64) -> rusqlite::Result<String> {
    let time = chrono::DateTime::from_timestamp_micros(micros).ok_or_else(|| {
        rusqlite::Error::ToSqlConversionFailure(
            format!("timestamp of {micros} microseconds is outside the representable range").into(),
        )
    })?;
    Ok(time.format("%Y-%m-%d %H:%M:%S%.6f").to_string())
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
            (
                Value::Decimal("999999999999999999999999.999999".parse().unwrap()),
                Value::Text("999999999999999999999999.999999".into()),
            ),
            (Value::Text("é".into()), Value::Text("é".into())),
            (Value::Blob(vec![0, 1]), Value::Blob(vec![0, 1])),
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
