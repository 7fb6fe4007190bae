use proptest::prelude::*;

use super::*;
use crate::Numeric;

#[test]
fn forms_match_what_postgresql_writes() {
    assert_eq!(format_date(0), "1970-01-01");
    assert_eq!(format_date(19_782), "2024-02-29");
    assert_eq!(format_date(-719_529), "-0001-12-31");
    assert_eq!(format_date(i32::MAX), "infinity");
    assert_eq!(format_time(86_400_000_000), "24:00:00.000000");
    assert_eq!(
        format_timestamp(1_700_000_000_123_456),
        "2023-11-14 22:13:20.123456"
    );
    assert_eq!(format_timestamp(-1), "1969-12-31 23:59:59.999999");
    assert_eq!(
        format_interval(&Interval {
            months: 14,
            days: -3,
            micros: 14_706_500_000
        }),
        "P1Y2M-3DT4H5M6.5S"
    );
    assert_eq!(
        format_interval(&Interval {
            months: 0,
            days: 0,
            micros: -1
        }),
        "PT-0.000001S"
    );
    assert_eq!(
        format_interval(&Interval {
            months: 0,
            days: 0,
            micros: 0
        }),
        "PT0S"
    );
    assert_eq!(
        format_uuid(&[0xab; 16]),
        "abababab-abab-abab-abab-abababababab"
    );
}

#[test]
fn bad_text_is_refused_with_its_reason() {
    for (kind, text, reason) in [
        (
            ValueKind::Date,
            "2023-02-29",
            "2023-02-29 is not a day of the calendar",
        ),
        (ValueKind::Date, "23-02-01", "expected [-]YYYY-MM-DD"),
        (ValueKind::Time, "24:00:01", "outside 00:00:00 to 24:00:00"),
        (
            ValueKind::Timestamp,
            "2023-01-01 24:00:00",
            "24:00:00 is not a time of a timestamp",
        ),
        (ValueKind::Uuid, "abc", "expected 8-4-4-4-12 hex digits"),
        (
            ValueKind::Interval,
            "P1D2Y",
            "expected P[nY][nM][nD][T[nH][nM][n.ffffffS]]",
        ),
        (
            ValueKind::Array(Box::new(ValueKind::Int)),
            "[1.5]",
            "an element is not a 64-bit integer",
        ),
        (
            ValueKind::Array(Box::new(ValueKind::Int)),
            "[[[[[[[1]]]]]]]",
            "more than 6 levels of arrays",
        ),
    ] {
        let error = parse_text_form(&kind, text).unwrap_err();
        assert_eq!(error.reason, reason, "{text}");
    }
}

#[test]
fn v1_forms_are_text_except_booleans() {
    assert_eq!(*Value::Bool(true).to_v1(), Value::Int(1));
    assert_eq!(*Value::Date(0).to_v1(), Value::Text("1970-01-01".into()));
    assert_eq!(
        *Value::Array(vec![
            Value::Double(f64::NAN),
            Value::Null,
            Value::Text("a\"".into())
        ])
        .to_v1(),
        Value::Text(r#"["NaN",null,"a\""]"#.into())
    );
    assert_eq!(*Value::Timestamp(5).to_v1(), Value::Timestamp(5));
    assert_eq!(
        *Value::Timestamp(5).identity_form(),
        Value::Text("1970-01-01 00:00:00.000005".into())
    );
}

fn scalar(kind: u8) -> BoxedStrategy<(ValueKind, Value)> {
    match kind {
        0 => any::<bool>()
            .prop_map(|b| (ValueKind::Bool, Value::Bool(b)))
            .boxed(),
        1 => any::<i64>()
            .prop_map(|n| (ValueKind::Int, Value::Int(n)))
            .boxed(),
        2 => any::<f64>()
            .prop_filter("NaN never equals itself", |d| !d.is_nan())
            .prop_map(|d| (ValueKind::Double, Value::Double(d)))
            .boxed(),
        3 => any::<i64>()
            .prop_map(|t| (ValueKind::Timestamp, Value::Timestamp(t)))
            .boxed(),
        4 => any::<i32>()
            .prop_map(|d| (ValueKind::Date, Value::Date(d)))
            .boxed(),
        5 => (0..=86_400_000_000i64)
            .prop_map(|t| (ValueKind::Time, Value::Time(t)))
            .boxed(),
        6 => (any::<i32>(), any::<i32>(), any::<i64>())
            .prop_map(|(months, days, micros)| {
                (
                    ValueKind::Interval,
                    Value::Interval(Interval {
                        months,
                        days,
                        micros,
                    }),
                )
            })
            .boxed(),
        7 => any::<[u8; 16]>()
            .prop_map(|b| (ValueKind::Uuid, Value::Uuid(b)))
            .boxed(),
        8 => ("-?[0-9]{1,60}(\\.[0-9]{1,50})?")
            .prop_map(|text| {
                let value = parse_decimal_value(&text).unwrap();
                (ValueKind::Decimal, value)
            })
            .boxed(),
        9 => proptest::collection::vec(any::<u8>(), 0..8)
            .prop_map(|b| (ValueKind::Blob, Value::Blob(b)))
            .boxed(),
        _ => ".{0,12}"
            .prop_map(|t| (ValueKind::Text, Value::Text(t)))
            .boxed(),
    }
}

fn typed() -> impl Strategy<Value = (ValueKind, Value)> {
    (0u8..11).prop_flat_map(|kind| {
        prop_oneof![
            scalar(kind),
            proptest::collection::vec(
                prop_oneof![scalar(kind).prop_map(|(_, v)| v), Just(Value::Null)],
                0..4
            )
            .prop_map(move |elements| {
                let element_kind = match kind {
                    0 => ValueKind::Bool,
                    1 => ValueKind::Int,
                    2 => ValueKind::Double,
                    3 => ValueKind::Timestamp,
                    4 => ValueKind::Date,
                    5 => ValueKind::Time,
                    6 => ValueKind::Interval,
                    7 => ValueKind::Uuid,
                    8 => ValueKind::Decimal,
                    9 => ValueKind::Blob,
                    _ => ValueKind::Text,
                };
                (
                    ValueKind::Array(Box::new(element_kind)),
                    Value::Array(elements),
                )
            }),
        ]
    })
}

proptest! {
    #[test]
    fn every_value_comes_back_from_its_text_form((kind, value) in typed()) {
        let text = match value.text_form() {
            Some(text) => text,
            None => match &value {
                Value::Int(n) => n.to_string(),
                Value::Double(d) => d.to_string(),
                Value::Text(t) => t.clone(),
                Value::Blob(b) => hex::encode(b),
                other => unreachable!("{other:?}"),
            },
        };
        let back = parse_text_form(&kind, &text).unwrap();
        prop_assert_eq!(back, value, "{}", text);
    }
}

#[test]
fn numerics_keep_every_digit_through_text() {
    let text = format!("-{}.{}", "7".repeat(1000), "1".repeat(500));
    let value = parse_text_form(&ValueKind::Decimal, &text).unwrap();
    assert_eq!(
        value,
        Value::Numeric(Numeric::from_canonical(&text).unwrap())
    );
    assert_eq!(value.text_form().unwrap(), text);
}
