//! Wire values <-> PostgreSQL binary values.
//!
//! Binding converts a [`Value`] to the column's type (an integer into `int2/4/8`,
//! `numeric` or `float`, a decimal into exact `numeric`, a timestamp into `timestamp[tz]`,
//! ...), and refuses, naming both types, what would lose information. Reading maps each
//! supported type to its natural value; `numeric` is decoded exactly into a `Decimal`.

use std::error::Error;

use bytes::{BufMut, BytesMut};
use postgres_types::{FromSql, IsNull, ToSql, Type};
use rowsync_protocol::{Decimal, Value, DECIMAL_SCALE_MAX};

type BoxError = Box<dyn Error + Sync + Send>;

/// Microseconds from the Unix epoch to PostgreSQL's epoch, 2000-01-01.
const POSTGRES_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;
const NUMERIC_POSITIVE: u16 = 0x0000;
const NUMERIC_NEGATIVE: u16 = 0x4000;
const NUMERIC_NAN: u16 = 0xC000;

/// A value bound as a query or COPY parameter.
#[derive(Debug)]
pub struct Bind<'a>(pub &'a Value);

fn mismatch(value: &Value, ty: &Type) -> BoxError {
    let kind = match value {
        Value::Null => "null",
        Value::Int(_) => "integer",
        Value::Double(_) => "double",
        Value::Decimal(_) => "decimal",
        Value::Text(_) => "text",
        Value::Blob(_) => "blob",
        Value::Timestamp(_) => "timestamp",
    };
    format!("a {kind} value cannot be stored in a column of type {ty}").into()
}

impl ToSql for Bind<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        let value = self.0;
        match (value, ty) {
            (Value::Null, _) => return Ok(IsNull::Yes),
            (Value::Int(n), &Type::INT8) => out.put_i64(*n),
            (Value::Int(n), &Type::INT4) => {
                out.put_i32(i32::try_from(*n).map_err(|_| format!("{n} does not fit int4"))?)
            }
            (Value::Int(n), &Type::INT2) => {
                out.put_i16(i16::try_from(*n).map_err(|_| format!("{n} does not fit int2"))?)
            }
            (Value::Int(n), &Type::BOOL) => out.put_u8(match n {
                0 => 0,
                1 => 1,
                _ => return Err(format!("{n} is not a boolean (0 or 1)").into()),
            }),
            (Value::Int(n), &Type::NUMERIC) => encode_numeric(
                &Decimal {
                    mantissa: i128::from(*n),
                    scale: 0,
                },
                out,
            ),
            (Value::Int(n), &Type::FLOAT8) => out.put_f64(*n as f64),
            (Value::Double(d), &Type::FLOAT8) => out.put_f64(*d),
            (Value::Double(d), &Type::FLOAT4) => out.put_f32(*d as f32),
            (Value::Decimal(d), &Type::NUMERIC) => encode_numeric(d, out),
            (
                Value::Text(t),
                &Type::TEXT | &Type::VARCHAR | &Type::BPCHAR | &Type::NAME | &Type::UNKNOWN,
            ) => out.put_slice(t.as_bytes()),
            (Value::Text(t), &Type::NUMERIC) => encode_numeric(&t.parse()?, out),
            // Numbers into text columns keep their exact digits, as SQLite stores them.
            (Value::Decimal(d), &Type::TEXT | &Type::VARCHAR | &Type::BPCHAR) => {
                out.put_slice(d.to_string().as_bytes())
            }
            (Value::Int(n), &Type::TEXT | &Type::VARCHAR | &Type::BPCHAR) => {
                out.put_slice(n.to_string().as_bytes())
            }
            (Value::Blob(b), &Type::BYTEA) => out.put_slice(b),
            // A SQLite client stores timestamps as text (`YYYY-MM-DD HH:MM:SS.ffffff`,
            // UTC) and uploads them so.
            (Value::Text(t), &Type::TIMESTAMP | &Type::TIMESTAMPTZ) => out.put_i64(
                parse_timestamp_micros(t)?
                    .checked_sub(POSTGRES_EPOCH_OFFSET_MICROS)
                    .ok_or("timestamp out of range")?,
            ),
            (Value::Timestamp(micros), &Type::TIMESTAMP | &Type::TIMESTAMPTZ) => out.put_i64(
                micros
                    .checked_sub(POSTGRES_EPOCH_OFFSET_MICROS)
                    .ok_or("timestamp out of range")?,
            ),
            _ => return Err(mismatch(value, ty)),
        }
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    postgres_types::to_sql_checked!();
}

/// A value read from a result row or a COPY.
#[derive(Debug, Clone, PartialEq)]
pub struct Read(pub Value);

impl<'a> FromSql<'a> for Read {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Read, BoxError> {
        let value = match *ty {
            Type::INT8 => Value::Int(i64::from_sql(ty, raw)?),
            Type::INT4 => Value::Int(i32::from_sql(ty, raw)?.into()),
            Type::INT2 => Value::Int(i16::from_sql(ty, raw)?.into()),
            Type::OID => Value::Int(u32::from_sql(ty, raw)?.into()),
            Type::BOOL => Value::Int(bool::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Value::Double(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Double(f32::from_sql(ty, raw)?.into()),
            Type::NUMERIC => Value::Decimal(decode_numeric(raw)?),
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => {
                Value::Text(String::from_sql(ty, raw)?)
            }
            Type::BYTEA => Value::Blob(raw.to_vec()),
            Type::TIMESTAMP | Type::TIMESTAMPTZ => {
                let since_2000 = i64::from_sql(&Type::INT8, raw)?;
                Value::Timestamp(
                    since_2000
                        .checked_add(POSTGRES_EPOCH_OFFSET_MICROS)
                        .ok_or("timestamp out of range")?,
                )
            }
            _ => return Err(format!("columns of type {ty} cannot be synchronized yet").into()),
        };
        Ok(Read(value))
    }

    fn from_sql_null(_: &Type) -> Result<Read, BoxError> {
        Ok(Read(Value::Null))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// PostgreSQL's binary `numeric`: digit count, weight (power of 10000 of the first
/// digit), sign, display scale, then base-10000 digits.
pub fn encode_numeric(decimal: &Decimal, out: &mut BytesMut) {
    let mut digits = [0i16; NUMERIC_GROUPS_MAX];
    let (count, weight) = numeric_groups(decimal, &mut digits);
    out.put_i16(count as i16);
    out.put_i16(weight);
    out.put_u16(if decimal.mantissa < 0 && count > 0 {
        NUMERIC_NEGATIVE
    } else {
        NUMERIC_POSITIVE
    });
    out.put_u16(decimal.scale.into());
    for &digit in &digits[..count] {
        out.put_i16(digit);
    }
}

/// Base-10000 groups of a decimal's 39 whole digits at most (10 groups) and 38 fraction
/// digits at most (10 groups).
const NUMERIC_GROUPS_MAX: usize = 20;
const NUMERIC_BASE: u128 = 10_000;

/// Fills `digits` with the decimal's base-10000 groups, leading and trailing zero groups
/// left out, and gives their count and the weight (power of 10000) of the first one.
/// Integer arithmetic only: no text, no allocation.
fn numeric_groups(decimal: &Decimal, digits: &mut [i16; NUMERIC_GROUPS_MAX]) -> (usize, i16) {
    let scale = u32::from(decimal.scale);
    let magnitude = decimal.mantissa.unsigned_abs();
    let divisor = 10u128.pow(scale);
    let (mut whole, mut fraction) = (magnitude / divisor, magnitude % divisor);
    // Fraction groups, last first: the last holds the scale's remainder digits, padded
    // with zeros on its right to four.
    let mut fraction_groups = [0i16; NUMERIC_GROUPS_MAX / 2];
    let fraction_count = scale.div_ceil(4) as usize;
    let partial = scale % 4;
    for index in (0..fraction_count).rev() {
        let group = if index == fraction_count - 1 && partial != 0 {
            let taken = fraction % 10u128.pow(partial);
            fraction /= 10u128.pow(partial);
            taken * 10u128.pow(4 - partial)
        } else {
            let taken = fraction % NUMERIC_BASE;
            fraction /= NUMERIC_BASE;
            taken
        };
        fraction_groups[index] = group as i16;
    }
    let mut whole_groups = [0i16; NUMERIC_GROUPS_MAX / 2];
    let mut whole_count = 0;
    while whole > 0 {
        whole_groups[whole_count] = (whole % NUMERIC_BASE) as i16;
        whole /= NUMERIC_BASE;
        whole_count += 1;
    }
    let mut count = 0;
    for &group in whole_groups[..whole_count]
        .iter()
        .rev()
        .chain(&fraction_groups[..fraction_count])
    {
        digits[count] = group;
        count += 1;
    }
    let mut weight = whole_count as i16 - 1;
    let leading = digits[..count].iter().take_while(|&&d| d == 0).count();
    digits.copy_within(leading..count, 0);
    count -= leading;
    weight -= leading as i16;
    while count > 0 && digits[count - 1] == 0 {
        count -= 1;
    }
    if count == 0 {
        weight = 0;
    }
    (count, weight)
}

/// The `index`th 16-bit field of a binary numeric (0-3 the header, then the digits).
fn numeric_field(raw: &[u8], index: usize) -> Result<u16, BoxError> {
    raw.get(index * 2..index * 2 + 2)
        .map(|bytes| u16::from_be_bytes([bytes[0], bytes[1]]))
        .ok_or_else(|| "truncated numeric".into())
}

/// A binary numeric's digit count, weight, sign and scale, checked.
fn numeric_header(raw: &[u8]) -> Result<(i16, i16, u16, u16), BoxError> {
    let count = numeric_field(raw, 0)? as i16;
    let weight = numeric_field(raw, 1)? as i16;
    let sign = numeric_field(raw, 2)?;
    let scale = numeric_field(raw, 3)?;
    if sign == NUMERIC_NAN || sign > NUMERIC_NEGATIVE {
        return Err("NaN and infinite numerics cannot be synchronized".into());
    }
    if scale > u16::from(DECIMAL_SCALE_MAX) || count < 0 {
        return Err(format!(
            "numeric with scale {scale} exceeds the maximum of {DECIMAL_SCALE_MAX}"
        )
        .into());
    }
    Ok((count, weight, sign, scale))
}

pub fn decode_numeric(raw: &[u8]) -> Result<Decimal, BoxError> {
    let (count, weight, sign, scale) = numeric_header(raw)?;
    let weight = i32::from(weight);
    // Digit i is worth 10000^(weight - i), so 10^(4 (weight - i) + scale) in the
    // mantissa; digits past the scale are cut off (PostgreSQL sends none).
    let too_large = || -> BoxError { "numeric has more than 38 significant digits".into() };
    let mut mantissa: i128 = 0;
    for index in 0..count as usize {
        let digit = numeric_field(raw, 4 + index)?;
        if digit == 0 {
            continue;
        }
        let exponent = 4 * (weight - index as i32) + i32::from(scale);
        let term = if exponent >= 0 {
            let power = u32::try_from(exponent)
                .ok()
                .and_then(|exponent| 10i128.checked_pow(exponent))
                .ok_or_else(too_large)?;
            i128::from(digit).checked_mul(power).ok_or_else(too_large)?
        } else if exponent > -4 {
            i128::from(digit) / 10i128.pow(exponent.unsigned_abs())
        } else {
            0
        };
        mantissa = mantissa.checked_add(term).ok_or_else(too_large)?;
    }
    Ok(Decimal {
        mantissa: if sign == NUMERIC_NEGATIVE {
            -mantissa
        } else {
            mantissa
        },
        scale: scale as u8,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_binary_round_trips_numeric_30_6_values() {
        for text in [
            "999999999999999999999999.999999",
            "-999999999999999999999999.999999",
            "0.000001",
            "0.000000",
            "12345.678900",
            "10000",
            "0",
            "-1.5",
            "100000000.0001",
        ] {
            let decimal: Decimal = text.parse().unwrap();
            let mut out = BytesMut::new();
            encode_numeric(&decimal, &mut out);
            assert_eq!(decode_numeric(&out).unwrap(), decimal, "{text}");
        }
    }

    /// The first, text-based conversion: the reference the integer one must match.
    fn reference_encode(decimal: &Decimal, out: &mut BytesMut) {
        let scale = usize::from(decimal.scale);
        let text = decimal.mantissa.unsigned_abs().to_string();
        let padded = format!("{text:0>width$}", width = scale + 1);
        let (whole, fraction) = padded.split_at(padded.len() - scale);
        // Whole part grouped by four from the right, fraction by four from the left.
        let whole_padded = format!("{whole:0>width$}", width = whole.len().div_ceil(4) * 4);
        let fraction_padded = format!(
            "{fraction:0<width$}",
            width = fraction.len().div_ceil(4) * 4
        );
        let group = |digits: &str| -> Vec<i16> {
            digits
                .as_bytes()
                .chunks(4)
                .map(|chunk| std::str::from_utf8(chunk).unwrap().parse().unwrap())
                .collect()
        };
        let whole_groups = group(&whole_padded);
        let mut digits: Vec<i16> = whole_groups
            .iter()
            .copied()
            .chain(group(&fraction_padded))
            .collect();
        let mut weight = whole_groups.len() as i16 - 1;
        let leading_zeros = digits.iter().take_while(|&&d| d == 0).count();
        digits.drain(..leading_zeros);
        weight -= leading_zeros as i16;
        while digits.last() == Some(&0) {
            digits.pop();
        }
        if digits.is_empty() {
            weight = 0;
        }
        out.put_i16(digits.len() as i16);
        out.put_i16(weight);
        out.put_u16(if decimal.mantissa < 0 && !digits.is_empty() {
            NUMERIC_NEGATIVE
        } else {
            NUMERIC_POSITIVE
        });
        out.put_u16(decimal.scale.into());
        for digit in digits {
            out.put_i16(digit);
        }
    }

    fn reference_decode(raw: &[u8]) -> Result<Decimal, BoxError> {
        let (count, weight, sign, scale) = numeric_header(raw)?;
        let digits = (0..count as usize)
            .map(|i| numeric_field(raw, 4 + i))
            .collect::<Result<Vec<u16>, _>>()?;
        // Digit i is worth 10000^(weight - i); render whole and fraction digits as text.
        let mut whole = String::new();
        let mut fraction = String::new();
        for power in (0..=weight.max(-1)).rev() {
            let index = weight - power;
            let digit = if (0..count).contains(&index) {
                digits[index as usize]
            } else {
                0
            };
            whole.push_str(&format!("{digit:04}"));
        }
        let fraction_groups = (usize::from(scale)).div_ceil(4);
        for position in 1..=fraction_groups as i16 {
            let index = weight + position;
            let digit = if (0..count).contains(&index) {
                digits[index as usize]
            } else {
                0
            };
            fraction.push_str(&format!("{digit:04}"));
        }
        fraction.truncate(usize::from(scale));
        let whole = whole.trim_start_matches('0');
        let sign = if sign == NUMERIC_NEGATIVE { "-" } else { "" };
        let text = format!(
            "{sign}{}.{fraction}",
            if whole.is_empty() { "0" } else { whole }
        );
        let text = text.trim_end_matches('.');
        Ok(text.parse::<Decimal>()?)
    }

    fn encoded(decimal: &Decimal) -> BytesMut {
        let mut out = BytesMut::new();
        encode_numeric(decimal, &mut out);
        out
    }

    proptest::proptest! {
        #[test]
        fn numeric_encoding_matches_the_text_reference(mantissa in proptest::num::i128::ANY, digits in 0u32..=38, scale in 0u8..=38) {
            // Mantissas of every length, not only 38-digit ones.
            let mantissa = mantissa % 10i128.pow(digits).max(1);
            let decimal = Decimal { mantissa, scale };
            let mut reference = BytesMut::new();
            reference_encode(&decimal, &mut reference);
            proptest::prop_assert_eq!(&encoded(&decimal)[..], &reference[..]);
            proptest::prop_assert_eq!(decode_numeric(&reference).unwrap(), decimal);
        }

        #[test]
        fn numeric_decoding_matches_the_text_reference(
            digits in proptest::collection::vec(0u16..10_000, 0..12),
            weight in -12i16..12,
            negative in proptest::bool::ANY,
            scale in 0u16..=38,
        ) {
            let mut raw = BytesMut::new();
            raw.put_i16(digits.len() as i16);
            raw.put_i16(weight);
            raw.put_u16(if negative { NUMERIC_NEGATIVE } else { NUMERIC_POSITIVE });
            raw.put_u16(scale);
            for digit in &digits {
                raw.put_u16(*digit);
            }
            match (decode_numeric(&raw), reference_decode(&raw)) {
                (Ok(ours), Ok(reference)) => proptest::prop_assert_eq!(ours, reference),
                (Err(_), Err(_)) => {}
                (ours, reference) => proptest::prop_assert!(false, "{ours:?} vs {reference:?}"),
            }
        }
    }

    #[test]
    fn numeric_layout_matches_postgres() {
        // 12345.6789 is digits [1, 2345, 6789], weight 1, dscale 4 (as PostgreSQL sends it).
        let mut out = BytesMut::new();
        encode_numeric(&"12345.6789".parse().unwrap(), &mut out);
        assert_eq!(
            &out[..],
            &[0, 3, 0, 1, 0, 0, 0, 4, 0, 1, 0x09, 0x29, 0x1a, 0x85]
        );
    }
}

/// Microseconds since 1970 of a timestamp written as text by a SQLite client (UTC):
/// `YYYY-MM-DD HH:MM:SS[.ffffff]`, a `T` instead of the space also accepted.
fn parse_timestamp_micros(text: &str) -> Result<i64, Box<dyn std::error::Error + Sync + Send>> {
    let trimmed = text.trim_end_matches('Z');
    ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"]
        .iter()
        .find_map(|format| chrono::NaiveDateTime::parse_from_str(trimmed, format).ok())
        .map(|time| time.and_utc().timestamp_micros())
        .ok_or_else(|| format!("{text:?} is not a timestamp (YYYY-MM-DD HH:MM:SS.ffffff)").into())
}

#[cfg(test)]
mod timestamp_text_tests {
    use super::parse_timestamp_micros;

    #[test]
    fn sqlite_timestamp_text_parses_to_the_same_microseconds() {
        assert_eq!(
            parse_timestamp_micros("2023-11-14 22:13:20.123456").unwrap(),
            1_700_000_000_123_456
        );
        assert_eq!(
            parse_timestamp_micros("2023-11-14T22:13:20").unwrap(),
            1_700_000_000_000_000
        );
        let error = parse_timestamp_micros("yesterday").unwrap_err().to_string();
        assert!(
            error.contains("\"yesterday\" is not a timestamp"),
            "{error}"
        );
    }
}
