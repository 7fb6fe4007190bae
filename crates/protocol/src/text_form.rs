//! The text form of each value that has one: what a v1 session carries instead of a
//! v2 tag, what a SQLite database stores, and what a server parses back from text into
//! a typed column. One form per value, so a round trip through text changes nothing.
//!
//! | value | text form |
//! |---|---|
//! | uuid | `0e3f5f6a-2b8c-4e1d-9f3a-5c6d7e8f9a0b` (lowercase) |
//! | date | `2024-02-29`; years before 1 as `-0044` (year 0 is 1 BC); `infinity` |
//! | time | `13:05:09.000250` (always six fraction digits), up to `24:00:00.000000` |
//! | timestamp | `2024-02-29 13:05:09.000250` (UTC), `infinity`, `-infinity` |
//! | interval | ISO 8601 with signed parts, as PostgreSQL writes it: `P1Y2M-3DT4H5M6.5S`, `PT0S` |
//! | numeric | its canonical digits: `-12.50`, `NaN` |
//! | array | JSON: `[1,null,[2,3]]`; decimals, uuids, dates, ... and blobs (hex) as strings, doubles as numbers or `"NaN"`, `"Infinity"`, `"-Infinity"` |

use std::borrow::Cow;
use std::fmt::Write;

use thiserror::Error;

use crate::numeric::parse_decimal_value;
use crate::{Interval, Value, ARRAY_DEPTH_MAX};

const MICROS_PER_DAY: i64 = 86_400_000_000;
const MICROS_PER_SECOND: i64 = 1_000_000;

/// Text that is not the form of the value its column holds.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{text:?} is not a {kind}: {reason}")]
pub struct TextFormError {
    pub text: String,
    pub kind: &'static str,
    pub reason: String,
}

/// What a column holds, as far as reading its text form goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueKind {
    Bool,
    Int,
    Double,
    /// `Decimal` or `Numeric`.
    Decimal,
    /// Text, and what travels as text: json, enums.
    Text,
    Blob,
    Timestamp,
    Date,
    Time,
    Interval,
    Uuid,
    Array(Box<ValueKind>),
}

impl ValueKind {
    pub fn name(&self) -> &'static str {
        match self {
            ValueKind::Bool => "boolean",
            ValueKind::Int => "integer",
            ValueKind::Double => "double",
            ValueKind::Decimal => "decimal",
            ValueKind::Text => "text",
            ValueKind::Blob => "blob",
            ValueKind::Timestamp => "timestamp",
            ValueKind::Date => "date",
            ValueKind::Time => "time",
            ValueKind::Interval => "interval",
            ValueKind::Uuid => "uuid",
            ValueKind::Array(_) => "array",
        }
    }
}

impl Value {
    /// The value as protocol v1 carries it: `Bool` as `Int` 0 or 1, the other v2
    /// values as `Text` in their text form; v1 values unchanged.
    pub fn to_v1(&self) -> Cow<'_, Value> {
        match self {
            Value::Bool(flag) => Cow::Owned(Value::Int(i64::from(*flag))),
            Value::Uuid(_)
            | Value::Date(_)
            | Value::Time(_)
            | Value::Interval(_)
            | Value::Numeric(_)
            | Value::Array(_) => Cow::Owned(Value::Text(self.text_form().expect("has a form"))),
            _ => Cow::Borrowed(self),
        }
    }

    /// The text form of a value that has one (not of null, integers, doubles, text
    /// and blobs, which a SQLite database holds as they are).
    pub fn text_form(&self) -> Option<String> {
        Some(match self {
            Value::Decimal(decimal) => decimal.to_string(),
            Value::Numeric(numeric) => numeric.to_string(),
            Value::Timestamp(micros) => format_timestamp(*micros),
            Value::Uuid(bytes) => format_uuid(bytes),
            Value::Date(days) => format_date(*days),
            Value::Time(micros) => format_time(*micros),
            Value::Interval(interval) => format_interval(interval),
            Value::Array(elements) => format_array(elements),
            Value::Bool(flag) => flag.to_string(),
            Value::Null | Value::Int(_) | Value::Double(_) | Value::Text(_) | Value::Blob(_) => {
                return None
            }
        })
    }

    /// The value as a key's identity: what a SQLite client stores, so that a key it
    /// uploads as text (a uuid, a date) is the same key the server reads typed.
    pub fn identity_form(&self) -> Cow<'_, Value> {
        match self {
            Value::Bool(flag) => Cow::Owned(Value::Int(i64::from(*flag))),
            Value::Null | Value::Int(_) | Value::Double(_) | Value::Text(_) | Value::Blob(_) => {
                Cow::Borrowed(self)
            }
            _ => Cow::Owned(Value::Text(self.text_form().expect("has a form"))),
        }
    }
}

/// Parses a column's value from text: the text form of `kind` (for `Text`, the text).
pub fn parse_text_form(kind: &ValueKind, text: &str) -> Result<Value, TextFormError> {
    let fail = |reason: String| TextFormError {
        text: text.chars().take(80).collect(),
        kind: kind.name(),
        reason,
    };
    Ok(match kind {
        ValueKind::Text => Value::Text(text.to_string()),
        ValueKind::Bool => match text {
            "true" | "1" => Value::Bool(true),
            "false" | "0" => Value::Bool(false),
            _ => return Err(fail("expected true or false".into())),
        },
        ValueKind::Int => Value::Int(text.parse().map_err(|e| fail(format!("{e}")))?),
        ValueKind::Double => {
            Value::Double(parse_double(text).ok_or_else(|| fail("expected a number".into()))?)
        }
        ValueKind::Decimal => parse_decimal_value(text).map_err(|e| fail(e.reason.into()))?,
        ValueKind::Blob => Value::Blob(hex::decode(text).map_err(|e| fail(e.to_string()))?),
        ValueKind::Timestamp => Value::Timestamp(parse_timestamp(text).map_err(fail)?),
        ValueKind::Date => Value::Date(parse_date(text).map_err(fail)?),
        ValueKind::Time => Value::Time(parse_time(text).map_err(fail)?),
        ValueKind::Interval => Value::Interval(parse_interval(text).map_err(fail)?),
        ValueKind::Uuid => Value::Uuid(
            parse_uuid(text).ok_or_else(|| fail("expected 8-4-4-4-12 hex digits".into()))?,
        ),
        ValueKind::Array(element) => {
            let json: serde_json::Value =
                serde_json::from_str(text).map_err(|e| fail(e.to_string()))?;
            json_to_value(element, &json, 0).map_err(fail)?
        }
    })
}

fn parse_double(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => text.parse().ok(),
    }
}

// --- calendar (proleptic Gregorian, any i64 day; Howard Hinnant's algorithms) ---

fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
}

fn format_civil(days: i64, out: &mut String) {
    let (year, month, day) = civil_from_days(days);
    let sign = if year < 0 { "-" } else { "" };
    let _ = write!(out, "{sign}{:04}-{month:02}-{day:02}", year.unsigned_abs());
}

/// `[-]YYYY-MM-DD` as days since 1970.
fn parse_civil(text: &str) -> Result<i64, String> {
    let bad = || "expected [-]YYYY-MM-DD".to_string();
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let mut parts = rest.splitn(3, '-');
    let (year, month, day) = (
        parts.next().ok_or_else(bad)?,
        parts.next().ok_or_else(bad)?,
        parts.next().ok_or_else(bad)?,
    );
    let digits = |s: &str, min: usize, max: usize| {
        s.len() >= min && s.len() <= max && s.bytes().all(|b| b.is_ascii_digit())
    };
    if !digits(year, 4, 9) || !digits(month, 2, 2) || !digits(day, 2, 2) {
        return Err(bad());
    }
    let year: i64 = year.parse().map_err(|_| bad())?;
    let year = if negative { -year } else { year };
    let (month, day): (u32, u32) = (
        month.parse().map_err(|_| bad())?,
        day.parse().map_err(|_| bad())?,
    );
    let days = days_from_civil(year, month, day);
    if !(1..=12).contains(&month) || day == 0 || civil_from_days(days) != (year, month, day) {
        return Err(format!(
            "{year:04}-{month:02}-{day:02} is not a day of the calendar"
        ));
    }
    Ok(days)
}

pub fn format_date(days: i32) -> String {
    match days {
        i32::MAX => "infinity".into(),
        i32::MIN => "-infinity".into(),
        _ => {
            let mut out = String::with_capacity(10);
            format_civil(i64::from(days), &mut out);
            out
        }
    }
}

pub fn parse_date(text: &str) -> Result<i32, String> {
    match text {
        "infinity" => return Ok(i32::MAX),
        "-infinity" => return Ok(i32::MIN),
        _ => {}
    }
    i32::try_from(parse_civil(text)?)
        .ok()
        .filter(|days| *days != i32::MAX && *days != i32::MIN)
        .ok_or_else(|| "outside the range of a date".into())
}

fn format_clock(micros: i64, out: &mut String) {
    let seconds = micros / MICROS_PER_SECOND;
    let _ = write!(
        out,
        "{:02}:{:02}:{:02}.{:06}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        micros % MICROS_PER_SECOND
    );
}

/// `HH:MM:SS[.f{1,6}]` as microseconds since midnight, up to `24:00:00`.
fn parse_clock(text: &str) -> Result<i64, String> {
    let bad = || "expected HH:MM:SS[.ffffff]".to_string();
    let (clock, fraction) = text.split_once('.').unwrap_or((text, ""));
    let parts: Vec<&str> = clock.split(':').collect();
    if parts.len() != 3
        || parts
            .iter()
            .any(|p| p.len() != 2 || !p.bytes().all(|b| b.is_ascii_digit()))
        || fraction.len() > 6
        || !fraction.bytes().all(|b| b.is_ascii_digit())
        || (text.contains('.') && fraction.is_empty())
    {
        return Err(bad());
    }
    let number = |s: &str| s.parse::<i64>().map_err(|_| bad());
    let (hours, minutes, seconds) = (number(parts[0])?, number(parts[1])?, number(parts[2])?);
    let micros = if fraction.is_empty() {
        0
    } else {
        number(&format!("{fraction:0<6}"))?
    };
    let total = ((hours * 60 + minutes) * 60 + seconds) * MICROS_PER_SECOND + micros;
    if minutes > 59 || seconds > 59 || total > MICROS_PER_DAY {
        return Err("outside 00:00:00 to 24:00:00".into());
    }
    Ok(total)
}

pub fn format_time(micros: i64) -> String {
    let mut out = String::with_capacity(15);
    format_clock(micros, &mut out);
    out
}

pub fn parse_time(text: &str) -> Result<i64, String> {
    parse_clock(text)
}

pub fn format_timestamp(micros: i64) -> String {
    match micros {
        i64::MAX => "infinity".into(),
        i64::MIN => "-infinity".into(),
        _ => {
            let mut out = String::with_capacity(26);
            format_civil(micros.div_euclid(MICROS_PER_DAY), &mut out);
            out.push(' ');
            format_clock(micros.rem_euclid(MICROS_PER_DAY), &mut out);
            out
        }
    }
}

/// The timestamp text form; a `T` for the space and a trailing `Z` are accepted too.
pub fn parse_timestamp(text: &str) -> Result<i64, String> {
    match text {
        "infinity" => return Ok(i64::MAX),
        "-infinity" => return Ok(i64::MIN),
        _ => {}
    }
    let trimmed = text.strip_suffix('Z').unwrap_or(text);
    let (date, clock) = trimmed
        .split_once([' ', 'T'])
        .ok_or("expected YYYY-MM-DD HH:MM:SS[.ffffff]")?;
    let clock = parse_clock(clock)?;
    if clock == MICROS_PER_DAY {
        return Err("24:00:00 is not a time of a timestamp".into());
    }
    let micros = i128::from(parse_civil(date)?) * i128::from(MICROS_PER_DAY) + i128::from(clock);
    i64::try_from(micros)
        .ok()
        .filter(|micros| *micros != i64::MAX && *micros != i64::MIN)
        .ok_or_else(|| "outside the range of a timestamp".into())
}

pub fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// A hyphenated UUID, hex digits in either case.
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let bytes = text.as_bytes();
    let hyphens_at = [8, 13, 18, 23];
    if bytes.len() != 36 || hyphens_at.iter().any(|&i| bytes[i] != b'-') {
        return None;
    }
    let digits: String = text.chars().filter(|c| *c != '-').collect();
    let mut out = [0u8; 16];
    hex::decode_to_slice(digits, &mut out).ok()?;
    Some(out)
}

pub fn format_interval(interval: &Interval) -> String {
    let mut out = String::from("P");
    let (years, months) = (interval.months / 12, interval.months % 12);
    for (amount, unit) in [
        (i64::from(years), 'Y'),
        (i64::from(months), 'M'),
        (i64::from(interval.days), 'D'),
    ] {
        if amount != 0 {
            let _ = write!(out, "{amount}{unit}");
        }
    }
    let micros = interval.micros;
    if micros != 0 {
        out.push('T');
        let (hours, minutes) = (micros / 3_600_000_000, micros / 60_000_000 % 60);
        let (seconds, fraction) = (micros / MICROS_PER_SECOND % 60, micros % MICROS_PER_SECOND);
        for (amount, unit) in [(hours, 'H'), (minutes, 'M')] {
            if amount != 0 {
                let _ = write!(out, "{amount}{unit}");
            }
        }
        if seconds != 0 || fraction != 0 {
            let sign = if seconds < 0 || fraction < 0 { "-" } else { "" };
            let _ = write!(out, "{sign}{}", seconds.unsigned_abs());
            if fraction != 0 {
                let digits = format!("{:06}", fraction.unsigned_abs());
                let _ = write!(out, ".{}", digits.trim_end_matches('0'));
            }
            out.push('S');
        }
    }
    if out == "P" {
        out.push_str("T0S");
    }
    out
}

/// The interval text form: `P`, then signed `nY`, `nM`, `nD`, and after `T` signed
/// `nH`, `nM`, `n[.ffffff]S`, each at most once and in this order.
pub fn parse_interval(text: &str) -> Result<Interval, String> {
    let bad = || "expected P[nY][nM][nD][T[nH][nM][n.ffffffS]]".to_string();
    let body = text.strip_prefix('P').ok_or_else(bad)?;
    let (date, time) = body.split_once('T').unwrap_or((body, ""));
    if body.is_empty() || (body.contains('T') && time.is_empty()) {
        return Err(bad());
    }
    let (mut months, mut days, mut micros) = (0i64, 0i64, 0i64);
    let overflow = || "outside the range of an interval".to_string();
    let mut units = date_units(date).ok_or_else(bad)?;
    for (unit, amount) in units.drain(..) {
        let amount: i64 = amount.parse().map_err(|_| bad())?;
        match unit {
            'Y' => {
                months = amount
                    .checked_mul(12)
                    .and_then(|m| m.checked_add(months))
                    .ok_or_else(overflow)?
            }
            'M' => months = months.checked_add(amount).ok_or_else(overflow)?,
            _ => days = amount,
        }
    }
    for (unit, amount) in time_units(time).ok_or_else(bad)? {
        let part = match unit {
            'H' => amount
                .parse::<i64>()
                .ok()
                .and_then(|h| h.checked_mul(3_600_000_000)),
            'M' => amount
                .parse::<i64>()
                .ok()
                .and_then(|m| m.checked_mul(60_000_000)),
            _ => seconds_micros(amount),
        };
        micros = part
            .and_then(|part| micros.checked_add(part))
            .ok_or_else(overflow)?;
    }
    Ok(Interval {
        months: i32::try_from(months).map_err(|_| overflow())?,
        days: i32::try_from(days).map_err(|_| overflow())?,
        micros,
    })
}

/// `-?digits[.digits]` seconds as microseconds (at most six fraction digits).
fn seconds_micros(amount: &str) -> Option<i64> {
    let (negative, digits) = match amount.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, amount),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty()
        || fraction.len() > 6
        || !fraction.bytes().all(|b| b.is_ascii_digit())
        || (digits.contains('.') && fraction.is_empty())
    {
        return None;
    }
    let whole: i64 = whole
        .parse()
        .ok()
        .filter(|_| whole.bytes().all(|b| b.is_ascii_digit()))?;
    let fraction: i64 = if fraction.is_empty() {
        0
    } else {
        format!("{fraction:0<6}").parse().ok()?
    };
    let magnitude = whole
        .checked_mul(MICROS_PER_SECOND)?
        .checked_add(fraction)?;
    Some(if negative { -magnitude } else { magnitude })
}

fn units<'t>(text: &'t str, order: &[char]) -> Option<Vec<(char, &'t str)>> {
    let mut found = Vec::new();
    let mut rest = text;
    let mut next_unit = 0;
    while !rest.is_empty() {
        let end = rest.find(|c: char| c.is_ascii_alphabetic())?;
        let unit = rest[end..].chars().next()?;
        let position = order[next_unit..].iter().position(|u| *u == unit)? + next_unit;
        let amount = &rest[..end];
        if amount.is_empty() || amount == "-" {
            return None;
        }
        found.push((unit, amount));
        next_unit = position + 1;
        rest = &rest[end + 1..];
    }
    Some(found)
}

fn date_units(text: &str) -> Option<Vec<(char, &str)>> {
    let found = units(text, &['Y', 'M', 'D'])?;
    let integer = |a: &str| {
        a.strip_prefix('-')
            .unwrap_or(a)
            .bytes()
            .all(|b| b.is_ascii_digit())
    };
    found.iter().all(|(_, a)| integer(a)).then_some(found)
}

fn time_units(text: &str) -> Option<Vec<(char, &str)>> {
    let found = units(text, &['H', 'M', 'S'])?;
    let integer = |a: &str| {
        a.strip_prefix('-')
            .unwrap_or(a)
            .bytes()
            .all(|b| b.is_ascii_digit())
    };
    found
        .iter()
        .all(|(unit, a)| *unit == 'S' || integer(a))
        .then_some(found)
}

// --- arrays as JSON ---

fn format_array(elements: &[Value]) -> String {
    serde_json::Value::Array(elements.iter().map(value_to_json).collect()).to_string()
}

fn value_to_json(value: &Value) -> serde_json::Value {
    use serde_json::Value as Json;
    match value {
        Value::Null => Json::Null,
        Value::Bool(flag) => Json::Bool(*flag),
        Value::Int(number) => Json::from(*number),
        Value::Double(number) => match serde_json::Number::from_f64(*number) {
            Some(number) => Json::Number(number),
            None if number.is_nan() => Json::from("NaN"),
            None if *number > 0.0 => Json::from("Infinity"),
            None => Json::from("-Infinity"),
        },
        Value::Text(text) => Json::from(text.as_str()),
        Value::Blob(bytes) => Json::from(hex::encode(bytes)),
        Value::Array(elements) => Json::Array(elements.iter().map(value_to_json).collect()),
        other => Json::from(other.text_form().expect("has a form")),
    }
}

fn json_to_value(
    kind: &ValueKind,
    json: &serde_json::Value,
    depth: usize,
) -> Result<Value, String> {
    use serde_json::Value as Json;
    if depth >= ARRAY_DEPTH_MAX {
        return Err(format!("more than {ARRAY_DEPTH_MAX} levels of arrays"));
    }
    let Json::Array(items) = json else {
        return Err("expected a JSON array".into());
    };
    let element = |item: &Json| -> Result<Value, String> {
        Ok(match (kind, item) {
            (_, Json::Null) => Value::Null,
            (_, Json::Array(_)) => json_to_value(kind, item, depth + 1)?,
            (ValueKind::Bool, Json::Bool(flag)) => Value::Bool(*flag),
            (ValueKind::Int, Json::Number(n)) => {
                Value::Int(n.as_i64().ok_or("an element is not a 64-bit integer")?)
            }
            (ValueKind::Decimal, Json::Number(n)) => match n.as_i64() {
                Some(whole) => Value::Decimal(crate::Decimal {
                    mantissa: whole.into(),
                    scale: 0,
                }),
                None => return Err("a decimal element with a fraction must be a string".into()),
            },
            (ValueKind::Double, Json::Number(n)) => {
                Value::Double(n.as_f64().ok_or("an element is not a number")?)
            }
            (ValueKind::Array(_), _) => {
                return Err("arrays of arrays are arrays of more dimensions".into())
            }
            (_, Json::String(text)) => parse_text_form(kind, text).map_err(|e| e.to_string())?,
            (_, other) => return Err(format!("element {other} is not a {}", kind.name())),
        })
    };
    Ok(Value::Array(
        items.iter().map(element).collect::<Result<_, _>>()?,
    ))
}

#[cfg(test)]
mod tests;
