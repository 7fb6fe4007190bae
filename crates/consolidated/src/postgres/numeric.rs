//! PostgreSQL's binary `numeric` <-> [`Decimal`] (integer arithmetic, the common case)
//! and <-> [`Numeric`] (any digits, `NaN` and infinities, through their text).

use std::error::Error;

use bytes::{BufMut, BytesMut};
use rowsync_protocol::{Decimal, Numeric, Value, DECIMAL_SCALE_MAX};

type BoxError = Box<dyn Error + Sync + Send>;

const NUMERIC_POSITIVE: u16 = 0x0000;
const NUMERIC_NEGATIVE: u16 = 0x4000;
const NUMERIC_NAN: u16 = 0xC000;
const NUMERIC_PINF: u16 = 0xD000;
const NUMERIC_NINF: u16 = 0xF000;

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

/// A binary numeric's digit count, weight, sign and scale.
fn numeric_header(raw: &[u8]) -> Result<(i16, i16, u16, u16), BoxError> {
    let count = numeric_field(raw, 0)? as i16;
    let weight = numeric_field(raw, 1)? as i16;
    let sign = numeric_field(raw, 2)?;
    let scale = numeric_field(raw, 3)?;
    if count < 0 {
        return Err(format!("numeric with {count} digits").into());
    }
    Ok((count, weight, sign, scale))
}

/// A binary numeric as the value that holds it: a [`Decimal`] when it fits, else a
/// [`Numeric`] (more digits, `NaN`, infinities).
pub fn read_numeric(raw: &[u8]) -> Result<Value, BoxError> {
    match decode_numeric(raw) {
        Ok(decimal) => Ok(Value::Decimal(decimal)),
        Err(_) => Ok(rowsync_protocol::parse_decimal_value(&numeric_text(raw)?)?),
    }
}

/// A binary numeric as decimal text (any number of digits).
fn numeric_text(raw: &[u8]) -> Result<String, BoxError> {
    let (count, weight, sign, scale) = numeric_header(raw)?;
    match sign {
        NUMERIC_NAN => return Ok("NaN".into()),
        NUMERIC_PINF => return Ok("Infinity".into()),
        NUMERIC_NINF => return Ok("-Infinity".into()),
        NUMERIC_POSITIVE | NUMERIC_NEGATIVE => {}
        other => return Err(format!("numeric with sign 0x{other:04x}").into()),
    }
    let digit = |index: i32| -> Result<u16, BoxError> {
        if (0..i32::from(count)).contains(&index) {
            let digit = numeric_field(raw, 4 + index as usize)?;
            (digit < 10_000)
                .then_some(digit)
                .ok_or_else(|| format!("numeric digit {digit} is not below 10000").into())
        } else {
            Ok(0)
        }
    };
    let mut text = String::from(if sign == NUMERIC_NEGATIVE { "-" } else { "" });
    let weight = i32::from(weight);
    if weight < 0 {
        text.push('0');
    }
    for index in 0..=weight {
        text.push_str(&format!("{:04}", digit(index)?));
    }
    if scale > 0 {
        let mut fraction = String::new();
        for group in 0..(i32::from(scale) + 3) / 4 {
            fraction.push_str(&format!("{:04}", digit(weight + 1 + group)?));
        }
        fraction.truncate(usize::from(scale));
        text.push('.');
        text.push_str(&fraction);
    }
    Ok(text)
}

/// A [`Numeric`] as PostgreSQL's binary numeric, grouped from its digits.
pub fn encode_numeric_text(numeric: &Numeric, out: &mut BytesMut) {
    let special = match numeric.as_str() {
        "NaN" => Some(NUMERIC_NAN),
        "Infinity" => Some(NUMERIC_PINF),
        "-Infinity" => Some(NUMERIC_NINF),
        _ => None,
    };
    if let Some(sign) = special {
        out.put_slice(&[0, 0, 0, 0]);
        out.put_u16(sign);
        out.put_u16(0);
        return;
    }
    let text = numeric.as_str();
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let whole = format!("{whole:0>width$}", width = whole.len().div_ceil(4) * 4);
    let fraction_padded = format!(
        "{fraction:0<width$}",
        width = fraction.len().div_ceil(4) * 4
    );
    let group = |digits: &str| -> Vec<i16> {
        digits
            .as_bytes()
            .chunks(4)
            .map(|chunk| chunk.iter().fold(0i16, |n, b| n * 10 + i16::from(b - b'0')))
            .collect()
    };
    let whole_groups = group(&whole);
    let mut groups: Vec<i16> = whole_groups
        .iter()
        .copied()
        .chain(group(&fraction_padded))
        .collect();
    let leading = groups.iter().take_while(|&&g| g == 0).count();
    groups.drain(..leading);
    let mut weight = whole_groups.len() as i32 - 1 - leading as i32;
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    out.put_i16(groups.len() as i16);
    out.put_i16(weight as i16);
    out.put_u16(if negative && !groups.is_empty() {
        NUMERIC_NEGATIVE
    } else {
        NUMERIC_POSITIVE
    });
    out.put_u16(fraction.len() as u16);
    for group in groups {
        out.put_i16(group);
    }
}

pub fn decode_numeric(raw: &[u8]) -> Result<Decimal, BoxError> {
    let (count, weight, sign, scale) = numeric_header(raw)?;
    if sign != NUMERIC_POSITIVE && sign != NUMERIC_NEGATIVE {
        return Err("NaN and infinite numerics are not decimals".into());
    }
    if scale > u16::from(DECIMAL_SCALE_MAX) {
        return Err(format!(
            "numeric with scale {scale} exceeds the maximum of {DECIMAL_SCALE_MAX}"
        )
        .into());
    }
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
    fn numerics_beyond_decimals_round_trip_through_binary() {
        for text in [
            format!("{}.{}", "9".repeat(100), "1".repeat(60)),
            format!("-0.{}7", "0".repeat(50)),
            "NaN".to_string(),
            "-Infinity".to_string(),
            format!("1{}", "0".repeat(40)),
        ] {
            let numeric = Numeric::from_canonical(&text).unwrap();
            let mut out = BytesMut::new();
            encode_numeric_text(&numeric, &mut out);
            assert_eq!(
                read_numeric(&out).unwrap(),
                Value::Numeric(numeric),
                "{text}"
            );
        }
        // What fits a decimal is read as one, even from the text path's encoding.
        let mut out = BytesMut::new();
        encode_numeric(&"-12.50".parse().unwrap(), &mut out);
        assert_eq!(
            read_numeric(&out).unwrap(),
            Value::Decimal("-12.50".parse().unwrap())
        );
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
