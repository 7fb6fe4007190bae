//! Decimals beyond [`Decimal`]: any number of digits PostgreSQL's `numeric` holds, and its
//! `NaN` and infinities, carried as canonical text.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Decimal, DecimalParseError, Value};

/// The most digits after the decimal point a [`Numeric`] may carry (PostgreSQL's limit).
pub const NUMERIC_SCALE_MAX: usize = 16_383;
/// The most digits before the decimal point a [`Numeric`] may carry (PostgreSQL's limit).
pub const NUMERIC_WHOLE_DIGITS_MAX: usize = 131_072;

const SPECIAL: [&str; 3] = ["NaN", "Infinity", "-Infinity"];

/// An exact decimal that a [`Decimal`] cannot hold, as canonical text: `NaN`,
/// `Infinity`, `-Infinity`, or an optional `-`, the whole digits without leading zeros
/// (`0` if none), and, for a scale above 0, `.` and exactly `scale` digits. Never
/// negative zero, never a value a [`Decimal`] holds: every number has one encoding.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Numeric(String);

impl Numeric {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Digits after the point (0 for the special values).
    pub fn scale(&self) -> usize {
        self.0
            .split_once('.')
            .map_or(0, |(_, fraction)| fraction.len())
    }

    /// `NaN`, `Infinity` or `-Infinity`.
    pub fn is_special(&self) -> bool {
        SPECIAL.contains(&self.0.as_str())
    }

    /// Accepts exactly the canonical text (what the wire carries).
    pub fn from_canonical(text: &str) -> Result<Numeric, DecimalParseError> {
        match parse_decimal_value(text)? {
            Value::Numeric(numeric) if numeric.0 == text => Ok(numeric),
            Value::Numeric(_) => Err(fail(text, "not in canonical form")),
            _ => Err(fail(text, "fits a decimal, which must carry it")),
        }
    }
}

impl fmt::Display for Numeric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Numeric {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Numeric {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Numeric, D::Error> {
        let text = String::deserialize(deserializer)?;
        Numeric::from_canonical(&text).map_err(serde::de::Error::custom)
    }
}

fn fail(text: &str, reason: &'static str) -> DecimalParseError {
    DecimalParseError {
        text: text.to_string(),
        reason,
    }
}

/// Any decimal text (a sign, leading zeros, no digit before the point, `NaN`,
/// `Infinity` in any case) as its value: a [`Decimal`] when one holds it exactly (scale
/// kept), else a [`Numeric`].
pub fn parse_decimal_value(text: &str) -> Result<Value, DecimalParseError> {
    if let Some(special) = SPECIAL
        .iter()
        .find(|special| special.eq_ignore_ascii_case(text.trim_start_matches('+')))
    {
        return Ok(Value::Numeric(Numeric(special.to_string())));
    }
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(fail(text, "no digits"));
    }
    if !whole
        .bytes()
        .chain(fraction.bytes())
        .all(|b| b.is_ascii_digit())
    {
        return Err(fail(
            text,
            "only digits, one '.' and a leading sign are allowed",
        ));
    }
    let whole = whole.trim_start_matches('0');
    if whole.len() > NUMERIC_WHOLE_DIGITS_MAX {
        return Err(fail(
            text,
            "more than 131072 digits before the decimal point",
        ));
    }
    if fraction.len() > NUMERIC_SCALE_MAX {
        return Err(fail(text, "more than 16383 digits after the decimal point"));
    }
    let zero = whole.is_empty() && fraction.bytes().all(|b| b == b'0');
    let mut canonical = String::with_capacity(text.len() + 1);
    if negative && !zero {
        canonical.push('-');
    }
    canonical.push_str(if whole.is_empty() { "0" } else { whole });
    if !fraction.is_empty() {
        canonical.push('.');
        canonical.push_str(fraction);
    }
    Ok(match canonical.parse::<Decimal>() {
        Ok(decimal) => Value::Decimal(decimal),
        Err(_) => Value::Numeric(Numeric(canonical)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_decimals_stay_decimals_and_big_ones_become_numerics() {
        assert_eq!(
            parse_decimal_value("-0012.50").unwrap(),
            Value::Decimal("-12.50".parse().unwrap())
        );
        let big = format!("{}.5", "9".repeat(60));
        assert_eq!(
            parse_decimal_value(&format!("+000{big}")).unwrap(),
            Value::Numeric(Numeric(big.clone()))
        );
        assert_eq!(Numeric::from_canonical(&big).unwrap().scale(), 1);
        let tiny = format!("0.{}1", "0".repeat(40));
        assert!(matches!(
            parse_decimal_value(&tiny).unwrap(),
            Value::Numeric(_)
        ));
        assert_eq!(
            parse_decimal_value("-nan").unwrap_err().reason,
            "only digits, one '.' and a leading sign are allowed"
        );
        assert_eq!(
            parse_decimal_value("-infinity").unwrap(),
            Value::Numeric(Numeric("-Infinity".into()))
        );
    }

    #[test]
    fn only_canonical_text_is_accepted_from_the_wire() {
        let big = "1".repeat(40);
        assert!(Numeric::from_canonical(&big).is_ok());
        for (text, reason) in [
            (format!("0{big}"), "not in canonical form"),
            (format!("+{big}"), "not in canonical form"),
            ("12.5".to_string(), "fits a decimal, which must carry it"),
            (format!("-0.{}", "0".repeat(40)), "not in canonical form"),
            ("nan".to_string(), "not in canonical form"),
        ] {
            assert_eq!(
                Numeric::from_canonical(&text).unwrap_err().reason,
                reason,
                "{text}"
            );
        }
    }
}
