//! Wire values <-> PostgreSQL binary values.
//!
//! Binding converts a [`Value`] to the column's type (an integer into `int2/4/8`,
//! `numeric` or `float`, a decimal into exact `numeric`, a timestamp into `timestamp[tz]`,
//! text in a value's text form into the type it names, ...), and refuses, naming both
//! types, what would lose information. Reading maps each supported type to its natural
//! value ([`kind_of`] says which types those are); `numeric` is decoded exactly.

use std::error::Error;

use bytes::{BufMut, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::types::{array_from_sql, array_to_sql, ArrayDimension};
use postgres_types::{FromSql, IsNull, Kind, ToSql, Type};
use rowsync_protocol::{parse_text_form, Decimal, Interval, Value, ValueKind};

use super::numeric::{encode_numeric, encode_numeric_text, read_numeric};

type BoxError = Box<dyn Error + Sync + Send>;

/// Microseconds from the Unix epoch to PostgreSQL's epoch, 2000-01-01.
const POSTGRES_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;
/// Days from the Unix epoch to PostgreSQL's epoch.
const POSTGRES_EPOCH_OFFSET_DAYS: i32 = 10_957;
/// The version byte in front of a binary `jsonb`.
const JSONB_VERSION: u8 = 1;

/// What values of a PostgreSQL type are, `None` for a type rowsync cannot carry.
/// `init` refuses a table with a column of such a type.
pub fn kind_of(ty: &Type) -> Option<ValueKind> {
    Some(match *ty {
        Type::BOOL => ValueKind::Bool,
        Type::INT2 | Type::INT4 | Type::INT8 | Type::OID => ValueKind::Int,
        Type::FLOAT4 | Type::FLOAT8 => ValueKind::Double,
        Type::NUMERIC => ValueKind::Decimal,
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::JSON | Type::JSONB => {
            ValueKind::Text
        }
        Type::BYTEA => ValueKind::Blob,
        Type::TIMESTAMP | Type::TIMESTAMPTZ => ValueKind::Timestamp,
        Type::DATE => ValueKind::Date,
        Type::TIME => ValueKind::Time,
        Type::INTERVAL => ValueKind::Interval,
        Type::UUID => ValueKind::Uuid,
        _ => match ty.kind() {
            Kind::Enum(_) => ValueKind::Text,
            Kind::Domain(base) => return kind_of(base),
            Kind::Array(member) => match kind_of(member)? {
                ValueKind::Array(_) => return None,
                element => ValueKind::Array(Box::new(element)),
            },
            _ => return None,
        },
    })
}

/// A value bound as a query or COPY parameter.
#[derive(Debug)]
pub struct Bind<'a>(pub &'a Value);

fn mismatch(value: &Value, ty: &Type) -> BoxError {
    format!(
        "a {} value cannot be stored in a column of type {ty}",
        value.kind_name()
    )
    .into()
}

fn narrow<T: TryFrom<i64>>(n: i64, ty: &Type) -> Result<T, BoxError> {
    T::try_from(n).map_err(|_| format!("{n} does not fit {ty}").into())
}

impl ToSql for Bind<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        let value = self.0;
        match (value, ty) {
            (Value::Null, _) => return Ok(IsNull::Yes),
            (Value::Int(n), &Type::INT8) => out.put_i64(*n),
            (Value::Int(n), &Type::INT4) => out.put_i32(narrow(*n, ty)?),
            (Value::Int(n), &Type::INT2) => out.put_i16(narrow(*n, ty)?),
            (Value::Int(n), &Type::BOOL) => out.put_u8(match n {
                0 | 1 => *n as u8,
                _ => return Err(format!("{n} is not a boolean (0 or 1)").into()),
            }),
            (Value::Bool(flag), &Type::BOOL) => out.put_u8(u8::from(*flag)),
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
            (Value::Numeric(n), &Type::NUMERIC) => encode_numeric_text(n, out),
            (Value::Text(t), &Type::JSONB) => {
                out.put_u8(JSONB_VERSION);
                out.put_slice(t.as_bytes());
            }
            (Value::Text(t), &Type::UNKNOWN) => out.put_slice(t.as_bytes()),
            (Value::Text(t), _) if kind_of(ty) == Some(ValueKind::Text) => {
                out.put_slice(t.as_bytes())
            }
            // Numbers into text columns keep their exact digits, as SQLite stores them.
            (
                Value::Decimal(_) | Value::Numeric(_),
                &Type::TEXT | &Type::VARCHAR | &Type::BPCHAR,
            ) => out.put_slice(value.text_form().unwrap_or_default().as_bytes()),
            (Value::Int(n), &Type::TEXT | &Type::VARCHAR | &Type::BPCHAR) => {
                out.put_slice(n.to_string().as_bytes())
            }
            (Value::Blob(b), &Type::BYTEA) => out.put_slice(b),
            (Value::Timestamp(micros), &Type::TIMESTAMP | &Type::TIMESTAMPTZ) => {
                out.put_i64(to_postgres_micros(*micros)?)
            }
            (Value::Uuid(bytes), &Type::UUID) => out.put_slice(bytes),
            (Value::Date(days), &Type::DATE) => out.put_i32(to_postgres_days(*days)?),
            (Value::Time(micros), &Type::TIME) => out.put_i64(*micros),
            (Value::Interval(interval), &Type::INTERVAL) => {
                out.put_i64(interval.micros);
                out.put_i32(interval.days);
                out.put_i32(interval.months);
            }
            _ => return bind_other(value, ty, out),
        }
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    postgres_types::to_sql_checked!();
}

/// Arrays, text in a value's text form (what a SQLite client stores where SQLite has no
/// type: `rowsync_protocol::text_form`), domains; anything else is refused.
fn bind_other(value: &Value, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
    match (value, ty.kind()) {
        (_, Kind::Domain(base)) => Bind(value).to_sql(base, out),
        (Value::Array(elements), Kind::Array(member)) => {
            bind_array(elements, member, out)?;
            Ok(IsNull::No)
        }
        (Value::Text(text), _) => match kind_of(ty) {
            Some(kind) if stored_as_text(&kind, text) => {
                Bind(&parse_text_form(&kind, text)?).to_sql(ty, out)
            }
            _ => Err(mismatch(value, ty)),
        },
        _ => Err(mismatch(value, ty)),
    }
}

/// Whether a SQLite client stores values of `kind` as text, so that text is their form:
/// not integers, booleans and blobs (which it stores as such: text there would be a
/// value changed), and of doubles only NaN (a REAL column cannot hold it).
fn stored_as_text(kind: &ValueKind, text: &str) -> bool {
    match kind {
        ValueKind::Int | ValueKind::Bool | ValueKind::Blob | ValueKind::Text => false,
        ValueKind::Double => text == "NaN",
        _ => true,
    }
}

fn to_postgres_micros(micros: i64) -> Result<i64, BoxError> {
    match micros {
        i64::MAX | i64::MIN => Ok(micros),
        _ => micros
            .checked_sub(POSTGRES_EPOCH_OFFSET_MICROS)
            .filter(|micros| *micros != i64::MIN)
            .ok_or_else(|| "timestamp out of range".into()),
    }
}

fn from_postgres_micros(since_2000: i64) -> Result<i64, BoxError> {
    match since_2000 {
        i64::MAX | i64::MIN => Ok(since_2000),
        _ => since_2000
            .checked_add(POSTGRES_EPOCH_OFFSET_MICROS)
            .filter(|micros| *micros != i64::MAX)
            .ok_or_else(|| "timestamp out of range".into()),
    }
}

fn to_postgres_days(days: i32) -> Result<i32, BoxError> {
    match days {
        i32::MAX | i32::MIN => Ok(days),
        _ => days
            .checked_sub(POSTGRES_EPOCH_OFFSET_DAYS)
            .filter(|days| *days != i32::MIN)
            .ok_or_else(|| "date out of range".into()),
    }
}

fn from_postgres_days(since_2000: i32) -> Result<i32, BoxError> {
    match since_2000 {
        i32::MAX | i32::MIN => Ok(since_2000),
        _ => since_2000
            .checked_add(POSTGRES_EPOCH_OFFSET_DAYS)
            .filter(|days| *days != i32::MAX)
            .ok_or_else(|| "date out of range".into()),
    }
}

/// A (possibly nested, rectangular) array value as PostgreSQL's binary array.
fn bind_array(elements: &[Value], member: &Type, out: &mut BytesMut) -> Result<(), BoxError> {
    let mut dimensions = Vec::new();
    let mut flat = Vec::new();
    flatten(elements, 0, &mut dimensions, &mut flat)?;
    if flat.is_empty() {
        dimensions.clear();
    }
    let dimensions = dimensions.into_iter().map(|len| ArrayDimension {
        len,
        lower_bound: 1,
    });
    array_to_sql(
        dimensions,
        member.oid(),
        flat,
        |value, buffer| match Bind(value).to_sql(member, buffer)? {
            IsNull::Yes => Ok(postgres_protocol::IsNull::Yes),
            IsNull::No => Ok(postgres_protocol::IsNull::No),
        },
        out,
    )
}

fn flatten<'v>(
    elements: &'v [Value],
    depth: usize,
    dimensions: &mut Vec<i32>,
    flat: &mut Vec<&'v Value>,
) -> Result<(), BoxError> {
    let unequal =
        || -> BoxError { "a multidimensional array needs sub-arrays of equal length".into() };
    let length = i32::try_from(elements.len())?;
    match dimensions.get(depth) {
        None => dimensions.push(length),
        Some(&expected) if expected != length => return Err(unequal()),
        Some(_) => {}
    }
    let nested = matches!(elements.first(), Some(Value::Array(_)));
    for element in elements {
        match (element, nested) {
            (Value::Array(inner), true) => flatten(inner, depth + 1, dimensions, flat)?,
            (Value::Array(_), false) | (_, true) => {
                return Err("an array mixes sub-arrays and elements".into())
            }
            (element, false) => flat.push(element),
        }
    }
    if !nested && !elements.is_empty() && dimensions.len() > depth + 1 {
        return Err(unequal());
    }
    Ok(())
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
            Type::BOOL => Value::Bool(bool::from_sql(ty, raw)?),
            Type::FLOAT8 => Value::Double(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Double(f32::from_sql(ty, raw)?.into()),
            Type::NUMERIC => read_numeric(raw)?,
            Type::BYTEA => Value::Blob(raw.to_vec()),
            Type::JSONB => match raw.split_first() {
                Some((&JSONB_VERSION, text)) => Value::Text(std::str::from_utf8(text)?.into()),
                _ => return Err("unknown jsonb version".into()),
            },
            Type::TIMESTAMP | Type::TIMESTAMPTZ => {
                Value::Timestamp(from_postgres_micros(i64::from_sql(&Type::INT8, raw)?)?)
            }
            Type::DATE => Value::Date(from_postgres_days(i32::from_sql(&Type::INT4, raw)?)?),
            Type::TIME => Value::Time(i64::from_sql(&Type::INT8, raw)?),
            Type::INTERVAL => Value::Interval(read_interval(raw)?),
            Type::UUID => Value::Uuid(raw.try_into().map_err(|_| "a uuid is 16 bytes")?),
            _ => match (kind_of(ty), ty.kind()) {
                (Some(_), Kind::Array(member)) => read_array(member, raw)?,
                (Some(_), Kind::Domain(base)) => return Read::from_sql(base, raw),
                (Some(ValueKind::Text), _) => Value::Text(std::str::from_utf8(raw)?.to_string()),
                _ => return Err(format!("columns of type {ty} cannot be synchronized").into()),
            },
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

/// Binary `interval`: microseconds, days, months.
fn read_interval(raw: &[u8]) -> Result<Interval, BoxError> {
    let raw: &[u8; 16] = raw.try_into().map_err(|_| "an interval is 16 bytes")?;
    let (micros, rest) = raw.split_at(8);
    let (days, months) = rest.split_at(4);
    Ok(Interval {
        micros: i64::from_be_bytes(micros.try_into()?),
        days: i32::from_be_bytes(days.try_into()?),
        months: i32::from_be_bytes(months.try_into()?),
    })
}

/// A binary array as nested arrays, one level per dimension (lower bounds dropped).
fn read_array(member: &Type, raw: &[u8]) -> Result<Value, BoxError> {
    let array = array_from_sql(raw)?;
    let lengths: Vec<usize> = array
        .dimensions()
        .map(|dimension| Ok(usize::try_from(dimension.len).unwrap_or(0)))
        .collect()?;
    let mut level = Vec::new();
    let mut values = array.values();
    while let Some(element) = values.next()? {
        level.push(match element {
            None => Value::Null,
            Some(bytes) => Read::from_sql(member, bytes)?.0,
        });
    }
    for &length in lengths.iter().skip(1).rev() {
        let mut grouped = Vec::with_capacity(level.len() / length.max(1));
        let mut items = level.into_iter().peekable();
        while items.peek().is_some() {
            grouped.push(Value::Array(items.by_ref().take(length.max(1)).collect()));
        }
        level = grouped;
    }
    Ok(Value::Array(level))
}
