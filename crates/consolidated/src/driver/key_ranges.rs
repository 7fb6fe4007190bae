//! Key ranges (protocol v7): a client running low on keys of a table whose script
//! version has a `key_range` script gets a new range from it, in the sync's transaction,
//! so the range is the client's once the sync commits.

use rowsync_protocol::{KeyRange, Value};

use crate::dialect::Dialect;
use crate::parameters::Parameters;
use crate::scripts::KEY_RANGE;
use crate::version_scripts::Scripts;
use crate::{SyncError, SyncRequest};

/// Runs the `key_range` script of each table the client holds less than half a range
/// of keys for (all of them at its first sync), and returns the ranges handed out.
pub async fn hand_out<D: Dialect>(
    transaction: &mut D,
    scripts: &Scripts,
    parameters: &Parameters<'_>,
    request: &SyncRequest,
) -> Result<Vec<KeyRange>, SyncError> {
    let Some(held) = &request.key_ranges else {
        return Ok(Vec::new());
    };
    let mut handed = Vec::new();
    for table in scripts.tables_with(&[KEY_RANGE]) {
        if !runs_low(held, table) {
            continue;
        }
        let rows = transaction
            .run_table_query(scripts, table, KEY_RANGE, parameters)
            .await?
            .map(|(_, rows)| rows)
            .unwrap_or_default();
        if rows.is_empty() {
            tracing::error!(
                table,
                client_id = request.client_id,
                "the key_range script handed out no range: the table's key space is used up \
                 (widen it with `rowsync keys`, or move the table to UUID keys)"
            );
        }
        for row in rows {
            handed.push(range_of(table, &row)?);
        }
    }
    Ok(handed)
}

/// Whether the client holds less than half a range of `table`'s keys: the size of the
/// largest range it holds is what one range is.
fn runs_low(held: &[KeyRange], table: &str) -> bool {
    let of_table = || held.iter().filter(|range| range.table == table);
    let keys_left: u64 = of_table().map(KeyRange::keys_left).sum();
    let range_keys = of_table()
        .map(|range| {
            KeyRange {
                next: range.start,
                ..range.clone()
            }
            .keys_left()
        })
        .max()
        .unwrap_or(0);
    keys_left.saturating_mul(2) < range_keys || range_keys == 0
}

/// The range a `key_range` script's row names: its first key and the key after its
/// last, both integers, the first below the second.
fn range_of(table: &str, row: &[Value]) -> Result<KeyRange, SyncError> {
    let integer = |value: Option<&Value>| match value {
        Some(Value::Int(key)) => Some(*key),
        Some(Value::Decimal(decimal)) if decimal.scale == 0 => i64::try_from(decimal.mantissa).ok(),
        _ => None,
    };
    match (integer(row.first()), integer(row.get(1))) {
        (Some(start), Some(end)) if start < end => Ok(KeyRange {
            table: table.to_string(),
            start,
            end,
            next: start,
        }),
        _ => Err(SyncError::script(
            KEY_RANGE,
            table,
            format!(
                "the script must return the range's first key and the key after its last, \
                 two integers, the first below the second; it returned {row:?}"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(table: &str, start: i64, end: i64, next: i64) -> KeyRange {
        KeyRange {
            table: table.into(),
            start,
            end,
            next,
        }
    }

    #[test]
    fn a_range_is_handed_out_when_less_than_half_of_one_is_left() {
        assert!(runs_low(&[], "customer"));
        assert!(runs_low(&[range("rental", 1, 1001, 1)], "customer"));
        assert!(!runs_low(&[range("customer", 1, 1001, 500)], "customer"));
        assert!(runs_low(&[range("customer", 1, 1001, 502)], "customer"));
        assert!(runs_low(&[range("customer", 1, 1001, 1001)], "customer"));
        let two = [
            range("customer", 1, 1001, 900),
            range("customer", 1001, 2001, 1001),
        ];
        assert!(!runs_low(&two, "customer"));
    }

    #[test]
    fn a_script_row_must_be_two_ordered_integers() {
        let good = range_of("t", &[Value::Int(10), Value::Int(20)]).unwrap();
        assert_eq!(good, range("t", 10, 20, 10));
        assert!(range_of("t", &[Value::Int(20), Value::Int(10)]).is_err());
        assert!(range_of("t", &[Value::Text("1".into())]).is_err());
    }
}
