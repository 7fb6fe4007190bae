//! rowsync values to and from MySQL's. Results are read by their column's type: the text
//! protocol gives every value as bytes, the binary protocol integers, floats and dates.
//! Decimals travel as their digits (exact both ways); text and binary strings are told
//! apart by the column's character set (63 is `binary`); dates are UTC (every rowsync
//! session sets `time_zone = '+00:00'`).

use chrono::{Datelike, NaiveDate, Timelike};
use mysql_async::consts::ColumnType;
use mysql_async::{Column, Value as MyValue};
use rowsync_protocol::{parse_decimal_value, Decimal, Row, Value};

/// MySQL's number for the `binary` character set: the column holds bytes, not text.
const BINARY_CHARSET: u16 = 63;

/// A rowsync value as a statement parameter.
pub fn bind(value: &Value) -> MyValue {
    match value {
        Value::Null => MyValue::NULL,
        Value::Int(number) => MyValue::Int(*number),
        Value::Double(number) => MyValue::Double(*number),
        Value::Text(text) => MyValue::Bytes(text.clone().into_bytes()),
        Value::Blob(bytes) => MyValue::Bytes(bytes.clone()),
        Value::Timestamp(micros) => timestamp_to_date(*micros),
        Value::Bool(flag) => MyValue::Int(i64::from(*flag)),
        Value::Date(days) => timestamp_to_date(i64::from(*days).saturating_mul(MICROS_PER_DAY)),
        Value::Time(micros) => MyValue::Time(
            false,
            (micros / MICROS_PER_DAY) as u32,
            (micros / 3_600_000_000 % 24) as u8,
            (micros / 60_000_000 % 60) as u8,
            (micros / 1_000_000 % 60) as u8,
            (micros % 1_000_000) as u32,
        ),
        // Decimals as their digits; uuids, intervals and arrays in their text form
        // (MariaDB's UUID type reads it; it has no interval or array type).
        Value::Decimal(_)
        | Value::Numeric(_)
        | Value::Uuid(_)
        | Value::Interval(_)
        | Value::Array(_) => MyValue::Bytes(value.text_form().unwrap_or_default().into_bytes()),
    }
}

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// The MySQL/MariaDB types rowsync carries (`information_schema.COLUMNS.DATA_TYPE`);
/// `init` refuses a table with a column of any other (spatial types, `inet4`, ...).
pub const SUPPORTED_DATA_TYPES: &[&str] = &[
    "tinyint",
    "smallint",
    "mediumint",
    "int",
    "integer",
    "bigint",
    "float",
    "double",
    "decimal",
    "bit",
    "year",
    "char",
    "varchar",
    "tinytext",
    "text",
    "mediumtext",
    "longtext",
    "binary",
    "varbinary",
    "tinyblob",
    "blob",
    "mediumblob",
    "longblob",
    "date",
    "time",
    "datetime",
    "timestamp",
    "enum",
    "set",
    "json",
    "uuid",
];

/// Parameters for a statement, in order.
pub fn bind_all<'v>(values: impl IntoIterator<Item = &'v Value>) -> mysql_async::Params {
    let values: Vec<MyValue> = values.into_iter().map(bind).collect();
    if values.is_empty() {
        mysql_async::Params::Empty
    } else {
        mysql_async::Params::Positional(values)
    }
}

/// A value MySQL sent, as rowsync's; `Err` names what could not be read.
pub fn read(column: &Column, value: MyValue) -> Result<Value, String> {
    Ok(match value {
        MyValue::NULL => Value::Null,
        MyValue::Int(number) => Value::Int(number),
        MyValue::UInt(number) => match i64::try_from(number) {
            Ok(number) => Value::Int(number),
            Err(_) => Value::Decimal(Decimal {
                mantissa: i128::from(number),
                scale: 0,
            }),
        },
        MyValue::Float(number) => Value::Double(f64::from(number)),
        MyValue::Double(number) => Value::Double(number),
        MyValue::Date(year, month, day, ..) if is_date(column) => {
            date_only(&format!("{year:04}-{month:02}-{day:02}"))?
        }
        MyValue::Date(year, month, day, hour, minute, second, micros) => {
            date_to_timestamp(year, month, day, hour, minute, second, micros)?
        }
        MyValue::Time(false, days, hours, minutes, seconds, micros)
            if u32::from(hours) + days * 24 < 24
                || (days * 24 + u32::from(hours) == 24
                    && minutes == 0
                    && seconds == 0
                    && micros == 0) =>
        {
            Value::Time(
                ((i64::from(days) * 24 + i64::from(hours)) * 60 + i64::from(minutes)) * 60_000_000
                    + i64::from(seconds) * 1_000_000
                    + i64::from(micros),
            )
        }
        // A duration beyond a day (MySQL's TIME spans ±838 hours) stays text.
        MyValue::Time(negative, days, hours, minutes, seconds, micros) => Value::Text(format!(
            "{}{:02}:{minutes:02}:{seconds:02}{}",
            if negative { "-" } else { "" },
            u64::from(days) * 24 + u64::from(hours),
            if micros > 0 {
                format!(".{micros:06}")
            } else {
                String::new()
            }
        )),
        MyValue::Bytes(bytes) => read_bytes(column, bytes)?,
    })
}

/// A row of values MySQL sent.
pub fn read_row(row: mysql_async::Row) -> Result<Row, String> {
    let columns = row.columns();
    row.unwrap()
        .into_iter()
        .zip(columns.iter())
        .map(|(value, column)| read(column, value))
        .collect()
}

/// The column names of a result.
pub fn column_names(columns: &[Column]) -> Vec<String> {
    columns
        .iter()
        .map(|column| column.name_str().into_owned())
        .collect()
}

fn read_bytes(column: &Column, bytes: Vec<u8>) -> Result<Value, String> {
    let text = |bytes: Vec<u8>| {
        String::from_utf8(bytes).map_err(|error| format!("column {}: {error}", column.name_str()))
    };
    use ColumnType::*;
    Ok(match column.column_type() {
        MYSQL_TYPE_TINY | MYSQL_TYPE_SHORT | MYSQL_TYPE_LONG | MYSQL_TYPE_INT24
        | MYSQL_TYPE_LONGLONG | MYSQL_TYPE_YEAR => {
            let digits = text(bytes)?;
            match digits.parse::<i64>() {
                Ok(number) => Value::Int(number),
                Err(_) => parse_decimal(&digits)?,
            }
        }
        MYSQL_TYPE_DECIMAL | MYSQL_TYPE_NEWDECIMAL => parse_decimal(&text(bytes)?)?,
        MYSQL_TYPE_FLOAT | MYSQL_TYPE_DOUBLE => {
            let digits = text(bytes)?;
            Value::Double(
                digits
                    .parse()
                    .map_err(|error| format!("column {}: {error}", column.name_str()))?,
            )
        }
        MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => date_only(&text(bytes)?)?,
        MYSQL_TYPE_TIME | MYSQL_TYPE_TIME2 => {
            let clock = text(bytes)?;
            match rowsync_protocol::parse_time(&clock) {
                Ok(micros) => Value::Time(micros),
                Err(_) => Value::Text(clock),
            }
        }
        MYSQL_TYPE_DATETIME
        | MYSQL_TYPE_TIMESTAMP
        | MYSQL_TYPE_DATETIME2
        | MYSQL_TYPE_TIMESTAMP2 => parse_date(&text(bytes)?)?,
        MYSQL_TYPE_BIT | MYSQL_TYPE_GEOMETRY => Value::Blob(bytes),
        _ if column.character_set() == BINARY_CHARSET => Value::Blob(bytes),
        _ => Value::Text(text(bytes)?),
    })
}

fn parse_decimal(digits: &str) -> Result<Value, String> {
    parse_decimal_value(digits).map_err(|error| error.to_string())
}

fn is_date(column: &Column) -> bool {
    matches!(
        column.column_type(),
        ColumnType::MYSQL_TYPE_DATE | ColumnType::MYSQL_TYPE_NEWDATE
    )
}

/// A `DATE` as days since 1970.
fn date_only(text: &str) -> Result<Value, String> {
    rowsync_protocol::parse_date(text)
        .map(Value::Date)
        .map_err(|error| format!("date {text:?}: {error}"))
}

/// `YYYY-MM-DD[ hh:mm:ss[.ffffff]]` as microseconds since the epoch (UTC).
fn parse_date(text: &str) -> Result<Value, String> {
    let parsed = chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
        .or_else(|_| {
            NaiveDate::parse_from_str(text, "%Y-%m-%d")
                .map(|date| date.and_hms_opt(0, 0, 0).expect("midnight exists"))
        })
        .map_err(|error| format!("date {text:?}: {error}"))?;
    Ok(Value::Timestamp(parsed.and_utc().timestamp_micros()))
}

fn date_to_timestamp(
    year: u16,
    month: u8,
    day: u8,
    hour: u8,
    minute: u8,
    second: u8,
    micros: u32,
) -> Result<Value, String> {
    let date = NaiveDate::from_ymd_opt(i32::from(year), u32::from(month), u32::from(day))
        .and_then(|date| {
            date.and_hms_micro_opt(
                u32::from(hour),
                u32::from(minute),
                u32::from(second),
                micros,
            )
        })
        .ok_or_else(|| format!("date {year:04}-{month:02}-{day:02} is not a valid date"))?;
    Ok(Value::Timestamp(date.and_utc().timestamp_micros()))
}

fn timestamp_to_date(micros: i64) -> MyValue {
    match chrono::DateTime::from_timestamp_micros(micros) {
        Some(time) => {
            let naive = time.naive_utc();
            MyValue::Date(
                u16::try_from(naive.year()).unwrap_or(0),
                naive.month() as u8,
                naive.day() as u8,
                naive.hour() as u8,
                naive.minute() as u8,
                naive.second() as u8,
                naive.nanosecond() / 1000,
            )
        }
        // Out of chrono's range: MySQL refuses the text as a date, naming the column.
        None => MyValue::Bytes(micros.to_string().into_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip_through_microseconds() {
        let micros = 1_700_000_000_123_456;
        let MyValue::Date(y, mo, d, h, mi, s, us) = timestamp_to_date(micros) else {
            panic!("a date");
        };
        assert_eq!(
            date_to_timestamp(y, mo, d, h, mi, s, us).unwrap(),
            Value::Timestamp(micros)
        );
        assert_eq!(
            parse_date("2023-11-14 22:13:20.123456").unwrap(),
            Value::Timestamp(micros)
        );
    }
}
