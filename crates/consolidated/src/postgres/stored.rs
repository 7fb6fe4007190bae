//! Which uploaded rows a PostgreSQL table may store otherwise than sent (see
//! `crate::stored`): every row where a trigger other than rowsync's, a generated or
//! identity column, or a default (a column the upload lacks) can change it; otherwise
//! only rows holding a value whose column stores another form of it (`5` in a
//! `numeric(5,2)`, a timestamp written without its fraction, a `real` rounding a
//! double). A column type not known here reads every row back.

use rowsync_protocol::{parse_decimal_value, parse_text_form, Row, TableUpload, Value, ValueKind};

use super::shapes::CachedTable;
use crate::stored::{keys_of, upserted_rows, KeysToCheck};

pub fn keys_to_check(
    table: &CachedTable,
    upload: &TableUpload,
    key_positions: &[usize],
) -> KeysToCheck {
    let shape = &table.shape;
    let lacks_a_column = shape
        .columns
        .iter()
        .any(|column| !upload.columns.contains(&column.name));
    if table.server_writes || lacks_a_column {
        return KeysToCheck::All;
    }
    let mut checks = Vec::new();
    for (index, column) in upload.columns.iter().enumerate() {
        let Some(position) = shape.columns.iter().position(|c| &c.name == column) else {
            continue;
        };
        match table.types.get(position).map(|name| Form::of(name)) {
            Some(Form::AsSent) => {}
            Some(Form::Unknown) | None => return KeysToCheck::All,
            Some(form) => checks.push((index, form)),
        }
    }
    let changed = upserted_rows(upload).filter(|row| {
        checks
            .iter()
            .any(|(index, form)| row.get(*index).is_some_and(|value| form.changes(value)))
    });
    let keys: Vec<Row> = keys_of(changed, key_positions);
    match keys.is_empty() {
        true => KeysToCheck::None,
        false => KeysToCheck::Only(keys),
    }
}

/// What a column of a type does to the values it is given.
#[derive(Debug, PartialEq)]
enum Form {
    /// Stored as given (or refused): integers, text, bytea, double precision, boolean.
    AsSent,
    /// A text form parsed and stored typed: read back in its canonical form.
    Parsed(ValueKind),
    /// `numeric`, rounded to `scale` digits when the type names one.
    Numeric { scale: Option<u8> },
    /// `real`: a double rounded to single precision.
    Real,
    /// `character(n)`: padded with spaces to `n`.
    Padded(usize),
    /// Not known here: every row is read back.
    Unknown,
}

impl Form {
    /// From a type as `format_type` names it.
    fn of(type_name: &str) -> Form {
        let argument = |prefix: &str| {
            type_name
                .strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix(')'))
                .map(str::to_owned)
        };
        match type_name {
            "bigint" | "integer" | "smallint" | "text" | "bytea" | "double precision"
            | "boolean" => return Form::AsSent,
            "timestamp without time zone" | "timestamp with time zone" => {
                return Form::Parsed(ValueKind::Timestamp)
            }
            "date" => return Form::Parsed(ValueKind::Date),
            "time without time zone" => return Form::Parsed(ValueKind::Time),
            "uuid" => return Form::Parsed(ValueKind::Uuid),
            "numeric" => return Form::Numeric { scale: None },
            "real" => return Form::Real,
            _ => {}
        }
        if type_name.starts_with("character varying") {
            return Form::AsSent;
        }
        if let Some(arguments) = argument("numeric(") {
            let scale = arguments.split(',').nth(1).map(str::trim).unwrap_or("0");
            if let Ok(scale) = scale.parse() {
                return Form::Numeric { scale: Some(scale) };
            }
        }
        if let Some(Ok(length)) = argument("character(").map(|n| n.parse()) {
            return Form::Padded(length);
        }
        Form::Unknown
    }

    /// Whether the column stores `value` in another form than it was sent in (when in
    /// doubt, yes: the row is then read back and compared).
    fn changes(&self, value: &Value) -> bool {
        match (self, value) {
            (_, Value::Null) | (Form::AsSent, _) => false,
            (Form::Parsed(kind), Value::Text(text)) => match parse_text_form(kind, text) {
                Ok(parsed) => parsed.identity_form().as_ref() != value,
                Err(_) => true,
            },
            // Sent typed (protocol v2): already the canonical form.
            (Form::Parsed(_), _) => false,
            (Form::Numeric { scale }, value) => numeric_changes(*scale, value),
            (Form::Real, Value::Double(number)) => f64::from(*number as f32) != *number,
            (Form::Padded(length), Value::Text(text)) => text.chars().count() < *length,
            _ => true,
        }
    }
}

fn numeric_changes(scale: Option<u8>, value: &Value) -> bool {
    let parsed = match value {
        Value::Text(text) => match parse_decimal_value(text) {
            Ok(parsed) if parsed.identity_form().as_ref() == value => parsed,
            _ => return true,
        },
        Value::Int(_) => return scale.is_some_and(|scale| scale > 0),
        Value::Decimal(_) => value.clone(),
        _ => return true,
    };
    match (parsed, scale) {
        (Value::Decimal(decimal), Some(scale)) => decimal.scale != scale,
        (Value::Decimal(_), None) => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use rowsync_protocol::{Decimal, RowUpdate};

    use super::*;
    use crate::shape::{Column, TableShape};

    fn text(value: &str) -> Value {
        Value::Text(value.into())
    }

    #[test]
    fn types_are_known_by_what_they_do_to_a_value() {
        assert_eq!(Form::of("integer"), Form::AsSent);
        assert_eq!(Form::of("character varying(64)"), Form::AsSent);
        assert_eq!(Form::of("numeric(30,6)"), Form::Numeric { scale: Some(6) });
        assert_eq!(Form::of("numeric(5)"), Form::Numeric { scale: Some(0) });
        assert_eq!(Form::of("character(3)"), Form::Padded(3));
        assert_eq!(Form::of("jsonb"), Form::Unknown);
        assert_eq!(Form::of("timestamp(3) with time zone"), Form::Unknown);
        let numeric = Form::of("numeric(5,2)");
        assert!(numeric.changes(&text("5")));
        assert!(numeric.changes(&Value::Double(5.5)));
        assert!(numeric.changes(&text("5.5")));
        assert!(!numeric.changes(&text("5.50")));
        assert!(!numeric.changes(&Value::Decimal(Decimal::new(550, 2).unwrap())));
        assert!(!Form::of("numeric").changes(&text("5.5")));
        assert!(Form::of("numeric").changes(&text("05.5")));
        let timestamp = Form::of("timestamp with time zone");
        assert!(timestamp.changes(&text("2026-11-27T10:00:02Z")));
        assert!(!timestamp.changes(&Value::Null));
        assert!(Form::Real.changes(&Value::Double(5.1)));
        assert!(!Form::Real.changes(&Value::Double(5.5)));
        assert!(Form::Padded(3).changes(&text("ab")));
        assert!(!Form::Padded(3).changes(&text("abc")));
    }

    fn table(types: &[&str], server_writes: bool) -> CachedTable {
        let names = ["id", "price", "note"];
        CachedTable {
            shape: TableShape {
                name: "t".into(),
                columns: names[..types.len()]
                    .iter()
                    .map(|name| Column {
                        name: name.to_string(),
                    })
                    .collect(),
                key_columns: vec!["id".into()],
            },
            types: types.iter().map(|t| t.to_string()).collect(),
            partition: None,
            foreign_keys: Vec::new(),
            tombstone_batches: true,
            server_writes,
        }
    }

    #[test]
    fn only_rows_a_table_may_store_otherwise_are_read_back() {
        let upload = TableUpload {
            table: "t".into(),
            columns: vec!["id".into(), "price".into()],
            key_columns: vec!["id".into()],
            inserts: vec![
                vec![Value::Int(1), text("5")],
                vec![Value::Int(2), text("5.00")],
            ],
            updates: vec![RowUpdate {
                old: vec![Value::Int(3), text("1.00")],
                new: vec![Value::Int(3), text("2.5")],
            }],
            deletes: Vec::new(),
        };
        let numeric = table(&["integer", "numeric(5,2)"], false);
        assert_eq!(
            keys_to_check(&numeric, &upload, &[0]),
            KeysToCheck::Only(vec![vec![Value::Int(1)], vec![Value::Int(3)]])
        );
        let plain = table(&["integer", "text"], false);
        assert_eq!(keys_to_check(&plain, &upload, &[0]), KeysToCheck::None);
        let triggered = table(&["integer", "text"], true);
        assert_eq!(keys_to_check(&triggered, &upload, &[0]), KeysToCheck::All);
        let with_default = table(&["integer", "text", "text"], false);
        assert_eq!(
            keys_to_check(&with_default, &upload, &[0]),
            KeysToCheck::All
        );
        let json = table(&["integer", "jsonb"], false);
        assert_eq!(keys_to_check(&json, &upload, &[0]), KeysToCheck::All);
    }
}
