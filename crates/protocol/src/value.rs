use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::Numeric;

/// The largest number of digits after the decimal point a [`Decimal`] may carry.
/// An `i128` mantissa holds 38 full decimal digits.
pub const DECIMAL_SCALE_MAX: u8 = 38;

/// One row: values in the column order of the message that carries it.
pub type Row = Vec<Value>;

/// A typed column value as it travels on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum Value {
    Null,
    Int(i64),
    Double(f64),
    /// Exact decimal; `NUMERIC(30,6)` and anything up to 38 digits round-trips without loss.
    Decimal(Decimal),
    Text(String),
    Blob(#[serde(with = "hex::serde")] Vec<u8>),
    /// Microseconds since 1970-01-01T00:00:00Z; `i64::MAX` and `i64::MIN` are
    /// PostgreSQL's `infinity` and `-infinity`.
    Timestamp(i64),
    // Protocol v2 (a v1 session carries each of these in its v1 form, [`Value::to_v1`]).
    Bool(bool),
    /// A UUID's 16 bytes, in the order of its text form.
    Uuid(#[serde(with = "hex::serde")] [u8; 16]),
    /// Days since 1970-01-01; `i32::MAX` and `i32::MIN` are `infinity` and `-infinity`.
    Date(i32),
    /// Microseconds since midnight, 0 to 86,400,000,000 (`24:00:00`) inclusive.
    Time(i64),
    Interval(Interval),
    /// An exact decimal a [`Decimal`] cannot hold (more than 38 digits, a scale above
    /// 38, `NaN`, `Infinity`, `-Infinity`), as its canonical digits.
    Numeric(Numeric),
    /// An array; nested arrays of equal length for each dimension are a multidimensional
    /// one. At most [`ARRAY_DEPTH_MAX`] levels.
    Array(Vec<Value>),
}

impl Value {
    /// Bytes this value takes when encoded, used for size accounting without encoding.
    pub fn encoded_len(&self) -> usize {
        1 + match self {
            Value::Null => 0,
            Value::Int(_) | Value::Double(_) | Value::Timestamp(_) => 8,
            Value::Decimal(_) => 17,
            Value::Text(text) => 4 + text.len(),
            Value::Blob(bytes) => 4 + bytes.len(),
            Value::Bool(_) => 1,
            Value::Uuid(_) | Value::Interval(_) => 16,
            Value::Date(_) => 4,
            Value::Time(_) => 8,
            Value::Numeric(numeric) => 4 + numeric.as_str().len(),
            Value::Array(elements) => 4 + elements.iter().map(Value::encoded_len).sum::<usize>(),
        }
    }

    /// The value's name in errors: `integer`, `uuid`, ...
    pub fn kind_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Int(_) => "integer",
            Value::Double(_) => "double",
            Value::Decimal(_) => "decimal",
            Value::Text(_) => "text",
            Value::Blob(_) => "blob",
            Value::Timestamp(_) => "timestamp",
            Value::Bool(_) => "boolean",
            Value::Uuid(_) => "uuid",
            Value::Date(_) => "date",
            Value::Time(_) => "time",
            Value::Interval(_) => "interval",
            Value::Numeric(_) => "numeric",
            Value::Array(_) => "array",
        }
    }
}

/// Nesting levels an array value may have (PostgreSQL's limit on dimensions).
pub const ARRAY_DEPTH_MAX: usize = 6;

/// A time span as PostgreSQL keeps it: months, days and microseconds, each with its own
/// sign, none converted into another (a month is not 30 days).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Interval {
    pub months: i32,
    pub days: i32,
    pub micros: i64,
}

impl From<&str> for Value {
    fn from(text: &str) -> Value {
        Value::Text(text.to_string())
    }
}

impl From<i64> for Value {
    fn from(number: i64) -> Value {
        Value::Int(number)
    }
}

/// An exact decimal number: `mantissa * 10^-scale`.
///
/// Equality is structural: `1.50` (mantissa 150, scale 2) and `1.5` differ, because a
/// round trip must give back exactly what was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decimal {
    pub mantissa: i128,
    pub scale: u8,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("invalid decimal {text:?}: {reason}")]
pub struct DecimalParseError {
    pub text: String,
    pub reason: &'static str,
}

impl Decimal {
    pub fn new(mantissa: i128, scale: u8) -> Option<Decimal> {
        (scale <= DECIMAL_SCALE_MAX).then_some(Decimal { mantissa, scale })
    }
}

impl FromStr for Decimal {
    type Err = DecimalParseError;

    fn from_str(text: &str) -> Result<Decimal, DecimalParseError> {
        let fail = |reason| DecimalParseError {
            text: text.to_string(),
            reason,
        };
        let (negative, digits) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let (whole, fraction) = match digits.split_once('.') {
            Some((whole, fraction)) => (whole, fraction),
            None => (digits, ""),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(fail("no digits"));
        }
        if !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
        {
            return Err(fail("only digits, one '.' and a leading sign are allowed"));
        }
        let scale = u8::try_from(fraction.len())
            .ok()
            .filter(|scale| *scale <= DECIMAL_SCALE_MAX)
            .ok_or_else(|| fail("more than 38 digits after the decimal point"))?;
        let mut mantissa: i128 = 0;
        for digit in whole.bytes().chain(fraction.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(digit - b'0')))
                .ok_or_else(|| fail("more than 38 significant digits"))?;
        }
        Ok(Decimal {
            mantissa: if negative { -mantissa } else { mantissa },
            scale,
        })
    }
}

impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.mantissa.unsigned_abs().to_string();
        let scale = usize::from(self.scale);
        let sign = if self.mantissa < 0 { "-" } else { "" };
        if scale == 0 {
            return write!(f, "{sign}{digits}");
        }
        let padded = format!("{digits:0>width$}", width = scale + 1);
        let (whole, fraction) = padded.split_at(padded.len() - scale);
        write!(f, "{sign}{whole}.{fraction}")
    }
}

impl Serialize for Decimal {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Decimal {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Decimal, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_text_round_trips_at_numeric_30_6_extremes() {
        for text in [
            "999999999999999999999999.999999",
            "-999999999999999999999999.999999",
            "0.000001",
            "-0.000001",
            "0.000000",
            "12.500000",
            "42",
            "99999999999999999999999999999999999999",
        ] {
            let decimal: Decimal = text.parse().unwrap();
            assert_eq!(decimal.to_string(), text);
        }
    }

    #[test]
    fn decimal_parse_refuses_bad_text_with_reason() {
        for (text, reason) in [
            ("", "no digits"),
            (".", "no digits"),
            ("1e5", "only digits, one '.' and a leading sign are allowed"),
            (
                "1.2.3",
                "only digits, one '.' and a leading sign are allowed",
            ),
            (
                "999999999999999999999999999999999999999",
                "more than 38 significant digits",
            ),
        ] {
            assert_eq!(
                text.parse::<Decimal>().unwrap_err().reason,
                reason,
                "{text}"
            );
        }
    }

    #[test]
    fn decimal_keeps_scale_and_sign_below_one() {
        let decimal: Decimal = "-.05".parse().unwrap();
        assert_eq!(
            decimal,
            Decimal {
                mantissa: -5,
                scale: 2
            }
        );
        assert_eq!(decimal.to_string(), "-0.05");
    }
}
