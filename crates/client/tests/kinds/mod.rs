//! The tables of the type round-trip tests: each column's type on the server, its type
//! in the client's SQLite table, and the values to try (extremes and NULL included).

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

use proptest::prelude::*;
use proptest::strategy::BoxedStrategy;
use rowsync_protocol::{parse_decimal_value, Decimal, Interval, Value};

pub struct Column {
    pub name: &'static str,
    pub server_type: &'static str,
    /// SQLite's affinity for the column in the client: INTEGER for integers and
    /// booleans, REAL for floats, BLOB for bytes, TEXT for the rest (text forms).
    pub client_type: &'static str,
    values: BoxedStrategy<Value>,
}

pub struct Table {
    pub name: String,
    /// DDL the table needs first (an enum type).
    prelude: &'static str,
    pub columns: Vec<Column>,
}

const ROWS_PER_CASE_MAX: usize = 6;

impl Table {
    pub fn server_ddl(&self) -> String {
        let columns: Vec<String> = self
            .columns
            .iter()
            .map(|c| format!("{} {}", c.name, c.server_type))
            .collect();
        format!(
            "{} CREATE TABLE {} ({})",
            self.prelude,
            self.name,
            columns.join(", ")
        )
    }

    pub fn client_ddl(&self) -> String {
        let columns: Vec<String> = self
            .columns
            .iter()
            .map(|c| format!("{} {}", c.name, c.client_type))
            .collect();
        format!("CREATE TABLE {} ({})", self.name, columns.join(", "))
    }

    pub fn rows_strategy(&self) -> BoxedStrategy<Vec<Vec<Value>>> {
        let row: Vec<BoxedStrategy<Value>> =
            self.columns.iter().map(|c| c.values.clone()).collect();
        proptest::collection::vec(row, 1..=ROWS_PER_CASE_MAX).boxed()
    }
}

/// Equal values, doubles bit for bit, element by element in arrays.
pub fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Double(a), Value::Double(b)) => a.to_bits() == b.to_bits(),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same(a, b))
        }
        (a, b) => a == b,
    }
}

fn column(
    name: &'static str,
    server_type: &'static str,
    client_type: &'static str,
    values: BoxedStrategy<Value>,
) -> Column {
    Column {
        name,
        server_type,
        client_type,
        values,
    }
}

/// NULL one time in eight, else `values`.
fn nullable(values: BoxedStrategy<Value>) -> BoxedStrategy<Value> {
    prop_oneof![1 => Just(Value::Null), 7 => values].boxed()
}

fn key() -> BoxedStrategy<Value> {
    any::<[u8; 16]>().prop_map(Value::Uuid).boxed()
}

/// UUIDs MariaDB's `UUID` type takes: it refuses some bit patterns (10.11 refused
/// `75cf1555-58dc-b64d-5a57-d3c178e6ae6a`, whose variant is not RFC 4122's), so random
/// RFC 4122 version 4 values.
fn mariadb_uuid() -> BoxedStrategy<Value> {
    any::<[u8; 16]>()
        .prop_map(|mut bytes| {
            bytes[6] = (bytes[6] & 0x0f) | 0x40;
            bytes[8] = (bytes[8] & 0x3f) | 0x80;
            Value::Uuid(bytes)
        })
        .boxed()
}

fn ints(min: i64, max: i64) -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Int(min)),
        Just(Value::Int(max)),
        Just(Value::Int(0)),
        (min..=max).prop_map(Value::Int)
    ]
    .boxed()
}

fn doubles() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(f64::MAX),
        Just(f64::MIN),
        Just(f64::MIN_POSITIVE),
        Just(5e-324),
        any::<f64>().prop_filter("NaN payloads and -0 are not kept", |d| !d.is_nan()
            && d.to_bits() != (-0.0f64).to_bits()),
    ]
    .prop_map(Value::Double)
    .boxed()
}

fn reals() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(f32::MAX),
        Just(f32::MIN_POSITIVE),
        any::<f32>().prop_filter("NaN payloads and -0 are not kept", |d| !d.is_nan()
            && d.to_bits() != (-0.0f32).to_bits()),
    ]
    .prop_map(|real| Value::Double(f64::from(real)))
    .boxed()
}

/// Decimals of up to `whole` digits before the point and `fraction` after.
fn decimals(whole: usize, fraction: usize) -> BoxedStrategy<Value> {
    let pattern = format!("-?[0-9]{{1,{whole}}}(\\.[0-9]{{1,{fraction}}})?");
    proptest::string::string_regex(&pattern)
        .expect("a regex")
        .prop_map(|text| parse_decimal_value(&text).unwrap())
        .boxed()
}

fn decimals_of_scale(scale: u8, digits: u32) -> BoxedStrategy<Value> {
    let limit = 10i128.pow(digits) - 1;
    prop_oneof![Just(limit), Just(-limit), -limit..=limit]
        .prop_map(move |mantissa| Value::Decimal(Decimal { mantissa, scale }))
        .boxed()
}

fn texts(pattern: &'static str) -> BoxedStrategy<Value> {
    pattern.prop_map(Value::Text).boxed()
}

fn json() -> BoxedStrategy<Value> {
    (any::<i32>(), "[a-z \"\\\\é]{0,8}", any::<bool>(), " {0,2}")
        .prop_map(|(n, s, b, space)| {
            Value::Text(format!(
                "{{\"n\":{space}{n}, \"s\": {}, \"b\":{b},\"a\":[1.5,{space}null]}}",
                serde_json::Value::from(s)
            ))
        })
        .boxed()
}

/// PostgreSQL's dates: 4713 BC to 5874897 AD, and the infinities.
fn dates() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(i32::MAX),
        Just(i32::MIN),
        Just(-2_440_588),
        Just(2_145_042_905),
        -2_440_588..2_145_042_906i32
    ]
    .prop_map(Value::Date)
    .boxed()
}

fn times() -> BoxedStrategy<Value> {
    prop_oneof![Just(0), Just(86_400_000_000), 0..=86_400_000_000i64]
        .prop_map(Value::Time)
        .boxed()
}

/// PostgreSQL's timestamps from 4713 BC to where microseconds since 1970 end (294247
/// AD), and the infinities.
fn timestamps() -> BoxedStrategy<Value> {
    const FIRST: i64 = -210_866_803_200_000_000;
    prop_oneof![
        Just(i64::MAX),
        Just(i64::MIN),
        Just(FIRST),
        Just(i64::MAX - 1),
        FIRST..i64::MAX - 1
    ]
    .prop_map(Value::Timestamp)
    .boxed()
}

fn intervals() -> BoxedStrategy<Value> {
    (any::<i32>(), any::<i32>(), any::<i64>())
        .prop_map(|(months, days, micros)| {
            Value::Interval(Interval {
                months,
                days,
                micros,
            })
        })
        .boxed()
}

fn arrays(element: BoxedStrategy<Value>) -> BoxedStrategy<Value> {
    proptest::collection::vec(nullable(element), 0..4)
        .prop_map(Value::Array)
        .boxed()
}

fn matrices(element: BoxedStrategy<Value>) -> BoxedStrategy<Value> {
    (1usize..3, 1usize..3)
        .prop_flat_map(move |(rows, columns)| {
            proptest::collection::vec(
                proptest::collection::vec(nullable(element.clone()), columns)
                    .prop_map(Value::Array),
                rows,
            )
        })
        .prop_map(Value::Array)
        .boxed()
}

fn fixed() -> [Column; 3] {
    [
        column("id", "uuid PRIMARY KEY", "TEXT PRIMARY KEY", key()),
        column(
            "owner",
            "text NOT NULL",
            "TEXT NOT NULL",
            Just(Value::Text("alice".into())).boxed(),
        ),
        column(
            "touched",
            "integer NOT NULL",
            "INTEGER NOT NULL",
            Just(Value::Int(0)).boxed(),
        ),
    ]
}

/// Every type of issue 16 on PostgreSQL.
pub fn postgres() -> Table {
    let mut columns = Vec::from(fixed());
    columns.extend([
        column(
            "b",
            "boolean",
            "INTEGER",
            nullable(any::<bool>().prop_map(Value::Bool).boxed()),
        ),
        column(
            "i2",
            "smallint",
            "INTEGER",
            nullable(ints(i16::MIN.into(), i16::MAX.into())),
        ),
        column(
            "i4",
            "integer",
            "INTEGER",
            nullable(ints(i32::MIN.into(), i32::MAX.into())),
        ),
        column(
            "i8",
            "bigint",
            "INTEGER",
            nullable(ints(i64::MIN, i64::MAX)),
        ),
        column("r4", "real", "REAL", nullable(reals())),
        column("r8", "double precision", "REAL", nullable(doubles())),
        column(
            "n",
            "numeric",
            "TEXT",
            nullable(
                prop_oneof![
                    decimals(80, 60),
                    Just(parse_decimal_value("NaN").unwrap()),
                    Just(parse_decimal_value("-Infinity").unwrap()),
                ]
                .boxed(),
            ),
        ),
        column(
            "n30",
            "numeric(30,6)",
            "TEXT",
            nullable(decimals_of_scale(6, 30)),
        ),
        column("t", "text", "TEXT", nullable(texts("[^\\x00]{0,40}"))),
        column(
            "vc",
            "varchar(20)",
            "TEXT",
            nullable(texts("[a-zé✓ ]{0,20}")),
        ),
        column("c", "char(5)", "TEXT", nullable(texts("[a-z]{5}"))),
        column(
            "bin",
            "bytea",
            "BLOB",
            nullable(
                proptest::collection::vec(any::<u8>(), 0..40)
                    .prop_map(Value::Blob)
                    .boxed(),
            ),
        ),
        column("u", "uuid", "TEXT", nullable(key())),
        column("j", "json", "TEXT", nullable(json())),
        column("jb", "jsonb", "TEXT", nullable(json())),
        column("d", "date", "TEXT", nullable(dates())),
        column("tm", "time", "TEXT", nullable(times())),
        column("ts", "timestamp", "TEXT", nullable(timestamps())),
        column("tz", "timestamptz", "TEXT", nullable(timestamps())),
        column("iv", "interval", "TEXT", nullable(intervals())),
        column(
            "m",
            "mood",
            "TEXT",
            nullable(prop_oneof![texts("sad"), texts("ok"), texts("happy")].boxed()),
        ),
        column(
            "ai",
            "integer[]",
            "TEXT",
            nullable(arrays(ints(i32::MIN.into(), i32::MAX.into()))),
        ),
        column(
            "am",
            "bigint[][]",
            "TEXT",
            nullable(matrices(ints(i64::MIN, i64::MAX))),
        ),
        column(
            "at",
            "text[]",
            "TEXT",
            nullable(arrays(texts("[^\\x00]{0,8}"))),
        ),
        column("an", "numeric[]", "TEXT", nullable(arrays(decimals(45, 3)))),
        column(
            "af",
            "double precision[]",
            "TEXT",
            nullable(arrays(doubles())),
        ),
        column("ad", "date[]", "TEXT", nullable(arrays(dates()))),
        column("au", "uuid[]", "TEXT", nullable(arrays(key()))),
        column(
            "ab",
            "boolean[]",
            "TEXT",
            nullable(arrays(any::<bool>().prop_map(Value::Bool).boxed())),
        ),
        column("aiv", "interval[]", "TEXT", nullable(arrays(intervals()))),
    ]);
    Table {
        name: "kinds".into(),
        prelude: "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');",
        columns,
    }
}

/// MariaDB's dates: 1000-01-01 to 9999-12-31.
fn mysql_dates() -> BoxedStrategy<Value> {
    (-354_285i32..=2_932_896).prop_map(Value::Date).boxed()
}

/// DATETIME(6) from 1000-01-01 to 9999-12-31, microseconds.
fn mysql_datetimes() -> BoxedStrategy<Value> {
    (-30_610_224_000_000_000i64..253_402_300_800_000_000)
        .prop_map(Value::Timestamp)
        .boxed()
}

/// TIMESTAMP(6): 1970-01-01 00:00:01 to 2038-01-19 03:14:07 UTC.
fn mysql_timestamps() -> BoxedStrategy<Value> {
    (1_000_000i64..2_147_483_647_000_000)
        .prop_map(Value::Timestamp)
        .boxed()
}

fn finite_doubles() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(f64::MAX),
        Just(f64::MIN_POSITIVE),
        any::<f64>().prop_filter("finite, not -0", |d| d.is_finite()
            && d.to_bits() != (-0.0f64).to_bits()),
    ]
    .prop_map(Value::Double)
    .boxed()
}

/// Every type of issue 16 that MariaDB has.
pub fn mysql() -> Table {
    let mut columns = Vec::from(fixed());
    columns[0] = column("id", "UUID PRIMARY KEY", "TEXT PRIMARY KEY", mariadb_uuid());
    columns[1] = column(
        "owner",
        "VARCHAR(64) NOT NULL",
        "TEXT NOT NULL",
        Just(Value::Text("alice".into())).boxed(),
    );
    columns[2] = column(
        "touched",
        "INT NOT NULL",
        "INTEGER NOT NULL",
        Just(Value::Int(0)).boxed(),
    );
    columns.extend([
        column("b", "BOOLEAN", "INTEGER", nullable(ints(0, 1))),
        column(
            "i2",
            "SMALLINT",
            "INTEGER",
            nullable(ints(i16::MIN.into(), i16::MAX.into())),
        ),
        column(
            "i4",
            "INT",
            "INTEGER",
            nullable(ints(i32::MIN.into(), i32::MAX.into())),
        ),
        column(
            "i8",
            "BIGINT",
            "INTEGER",
            nullable(ints(i64::MIN, i64::MAX)),
        ),
        column("r8", "DOUBLE", "REAL", nullable(finite_doubles())),
        column(
            "n",
            "DECIMAL(65,30)",
            "TEXT",
            nullable(
                "-?[0-9]{1,35}\\.[0-9]{30}"
                    .prop_map(|t| parse_decimal_value(&t).unwrap())
                    .boxed(),
            ),
        ),
        column(
            "n30",
            "DECIMAL(30,6)",
            "TEXT",
            nullable(decimals_of_scale(6, 30)),
        ),
        column("t", "TEXT", "TEXT", nullable(texts("[^\\x00]{0,40}"))),
        column(
            "vc",
            "VARCHAR(20)",
            "TEXT",
            nullable(texts("[a-zé✓ ]{0,19}[a-z]")),
        ),
        column("c", "CHAR(5)", "TEXT", nullable(texts("[a-z]{5}"))),
        column(
            "bin",
            "BLOB",
            "BLOB",
            nullable(
                proptest::collection::vec(any::<u8>(), 0..40)
                    .prop_map(Value::Blob)
                    .boxed(),
            ),
        ),
        column(
            "u",
            "UUID",
            "TEXT",
            nullable(
                mariadb_uuid()
                    .prop_map(|u| Value::Text(u.text_form().unwrap()))
                    .boxed(),
            ),
        ),
        column("j", "JSON", "TEXT", nullable(json())),
        column("d", "DATE", "TEXT", nullable(mysql_dates())),
        column("tm", "TIME(6)", "TEXT", nullable(times())),
        column("dt", "DATETIME(6)", "TEXT", nullable(mysql_datetimes())),
        column(
            "ts",
            "TIMESTAMP(6) NULL",
            "TEXT",
            nullable(mysql_timestamps()),
        ),
        column(
            "m",
            "ENUM('sad','ok','happy')",
            "TEXT",
            nullable(prop_oneof![texts("sad"), texts("ok"), texts("happy")].boxed()),
        ),
    ]);
    Table {
        name: "kinds".into(),
        prelude: "",
        columns,
    }
}

/// SQLite as the consolidated database: its storage classes, and the declared types
/// whose values it keeps in their text form.
pub fn sqlite() -> Table {
    let mut columns = Vec::from(fixed());
    columns[0] = column("id", "TEXT PRIMARY KEY", "TEXT PRIMARY KEY", key());
    columns.extend([
        column(
            "b",
            "BOOLEAN",
            "INTEGER",
            nullable(any::<bool>().prop_map(Value::Bool).boxed()),
        ),
        column(
            "i8",
            "INTEGER",
            "INTEGER",
            nullable(ints(i64::MIN, i64::MAX)),
        ),
        column("r8", "REAL", "REAL", nullable(finite_doubles())),
        column("n", "TEXT", "TEXT", nullable(decimals(80, 60))),
        column("t", "TEXT", "TEXT", nullable(texts("[^\\x00]{0,40}"))),
        column(
            "bin",
            "BLOB",
            "BLOB",
            nullable(
                proptest::collection::vec(any::<u8>(), 0..40)
                    .prop_map(Value::Blob)
                    .boxed(),
            ),
        ),
        column("u", "UUID", "TEXT", nullable(key())),
        column("j", "JSON", "TEXT", nullable(json())),
        column("d", "DATE", "TEXT", nullable(dates())),
        column("tm", "TIME", "TEXT", nullable(times())),
        column("iv", "INTERVAL", "TEXT", nullable(intervals())),
        column(
            "ai",
            "TEXT",
            "TEXT",
            nullable(arrays(ints(i64::MIN, i64::MAX))),
        ),
    ]);
    Table {
        name: "kinds".into(),
        prelude: "",
        columns,
    }
}
