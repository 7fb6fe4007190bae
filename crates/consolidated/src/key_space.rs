//! Key ranges for rows made offline (`rowsync keys`, protocol v7), the part every
//! backend shares: where a table's key space is split between the clients and the
//! server, and the `key_range` script that hands the clients' part out.
//!
//! A table's keys from `space_start` up to (not including) `space_end` are handed to
//! clients, `range_keys` at a time, in order; the server's own generator (a sequence,
//! `AUTO_INCREMENT`, SQLite's `AUTOINCREMENT`) is moved to `space_end`, so the rows the
//! server inserts take keys above every client's. Clients stay below the generator:
//! MariaDB moves `AUTO_INCREMENT` past any key inserted above it, never below.
//! `rs_key_space` keeps each table's split; `rs_key_range` every range handed out
//! (which client has which keys), the last one giving where the next starts.

use crate::scripts::KEY_RANGE;
use crate::{DbError, ScriptEntry};

/// Keys per range unless `rowsync keys --range-keys` says otherwise.
pub const RANGE_KEYS_DEFAULT: i64 = 1000;

/// What `rowsync keys` sets up for one table in one script version.
#[derive(Debug, Clone)]
pub struct KeyRangeInit {
    pub table: String,
    /// The key column the ranges are of: the primary key's when it is one column; one
    /// integer column of it otherwise (a partitioned table's key names its partition
    /// column too).
    pub column: Option<String>,
    pub script_version: String,
    /// Keys per range handed to a client.
    pub range_keys: i64,
}

/// A table's key space as set up (or found set up before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    pub key_column: String,
    /// The first key handed to clients.
    pub space_start: i64,
    /// The first key the server's generator hands out; clients get keys below it.
    pub space_end: i64,
    /// What the server generates its keys with, in words (`None`: nothing does, and
    /// writers on the server must take keys from `space_end` up themselves).
    pub generator: Option<String>,
    /// The split was made by an earlier run, and kept.
    pub existed: bool,
}

/// Splits the keys above `largest_used` (the largest key the table or its generator
/// has used) up to `key_max` (the key type's largest): clients get the lower half from
/// the next key on, its end rounded down to two significant digits so it reads well in
/// `rs_key_space`; the server the rest. Refused when the clients' part would hold fewer than 1,000
/// ranges.
pub fn split(
    table: &str,
    largest_used: i64,
    key_max: i64,
    range_keys: i64,
) -> Result<(i64, i64), DbError> {
    if range_keys < 1 {
        return Err(DbError::Invalid(format!(
            "a key range must hold at least one key; {range_keys} were asked"
        )));
    }
    let space_start = largest_used.max(0).saturating_add(1);
    let half = space_start + (key_max - space_start).max(0) / 2;
    // Two significant digits: 1,073,741,824 becomes 1,000,000,000.
    let mut unit = 1i64;
    while unit <= half / 100 {
        unit *= 10;
    }
    let space_end = half / unit * unit;
    if space_end <= space_start || (space_end - space_start) / range_keys < 1000 {
        return Err(DbError::Invalid(format!(
            "table {table:?} has no room for key ranges: its keys reach {largest_used} of at \
             most {key_max}; widen the key column (bigint) or use UUID keys (docs/types.md)"
        )));
    }
    Ok((space_start, space_end))
}

/// The `key_range` script: the next `range_keys` keys of the table's client part, or
/// no row when they would pass its end. The same statement runs on PostgreSQL, MariaDB
/// (10.5 and later: `INSERT ... RETURNING`) and SQLite (3.35 and later).
pub fn key_range_script(init: &KeyRangeInit) -> ScriptEntry {
    let table = init.table.replace('\'', "''");
    let keys = init.range_keys;
    let script = format!(
        "INSERT INTO rs_key_range (table_name, range_start, range_end, client_id)\n\
         SELECT '{table}', n.range_start, n.range_start + {keys}, :client_id\n\
         FROM (SELECT COALESCE((SELECT r.range_end FROM rs_key_range r\n\
                                WHERE r.table_name = '{table}'\n\
                                ORDER BY r.range_start DESC LIMIT 1), s.space_start) AS range_start,\n\
                      s.space_end\n\
               FROM rs_key_space s WHERE s.table_name = '{table}') n\n\
         WHERE n.range_start + {keys} <= n.space_end\n\
         RETURNING range_start, range_end"
    );
    ScriptEntry {
        script_version: init.script_version.clone(),
        table: init.table.clone(),
        event: KEY_RANGE.to_string(),
        script,
    }
}

/// Which of the primary key's columns (`names`) the ranges are of: the one `--column`
/// names, else the only one; refused when neither is there.
pub fn chosen_key(init: &KeyRangeInit, names: &[String]) -> Result<usize, DbError> {
    let chosen = match &init.column {
        Some(column) => names.iter().position(|name| name == column),
        None if names.len() == 1 => Some(0),
        None => None,
    };
    chosen.ok_or_else(|| {
        refuse_key(
            &init.table,
            names,
            "is not one column (name it with --column)",
        )
    })
}

/// Refuses a key column that is not one integer column.
pub fn refuse_key(table: &str, key_columns: &[String], why: &str) -> DbError {
    DbError::Invalid(format!(
        "table {table:?} cannot have key ranges: its primary key ({}) {why}; key ranges \
         need a single integer key column (or use UUID keys: docs/types.md)",
        key_columns.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_get_the_lower_half_rounded_to_two_digits() {
        let int4 = i64::from(i32::MAX);
        assert_eq!(split("t", 600, int4, 1000).unwrap(), (601, 1_000_000_000));
        assert_eq!(
            split("t", 0, i64::MAX, 1000).unwrap(),
            (1, 4_600_000_000_000_000_000)
        );
        assert_eq!(
            split("t", 1_500_000_000, int4, 100).unwrap(),
            (1_500_000_001, 1_800_000_000)
        );
        assert!(split("t", int4 - 10_000, int4, 1000).is_err());
        assert!(split("t", 0, int4, 0).is_err());
    }
}
