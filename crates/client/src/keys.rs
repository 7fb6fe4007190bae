//! Key ranges (protocol v7): keys of a table handed to this client by the server, for
//! the rows it inserts offline (MobiLink's global autoincrement, with the ranges handed
//! out instead of computed). No other client and no writer on the server is handed a
//! key of them, so two devices never make the same key.
//!
//! The client says which ranges it holds, and how far it used each, before each
//! upload's end; the server hands it a new range of a table when less than half of one
//! is left. The application takes keys with [`crate::Client::next_key`], or in SQL
//! (docs/types.md).

use rowsync_protocol::KeyRange;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::ClientError;

/// The ranges this client holds; a range goes when its last key is taken.
pub const KEY_RANGE_DDL: &str = "
CREATE TABLE IF NOT EXISTS rs_client_key_range (
    table_name TEXT NOT NULL,
    range_start INTEGER NOT NULL,
    range_end INTEGER NOT NULL,
    next_key INTEGER NOT NULL,
    PRIMARY KEY (table_name, range_start)
);
";

/// The ranges with keys left, each with its next key past every key of the range the
/// table holds already (one taken in SQL without moving `next_key`).
pub fn held(connection: &Connection) -> Result<Vec<KeyRange>, ClientError> {
    let mut statement = connection.prepare(
        "SELECT table_name, range_start, range_end, next_key FROM rs_client_key_range
         WHERE next_key < range_end ORDER BY table_name, range_start",
    )?;
    let ranges = statement
        .query_map([], |row| {
            Ok(KeyRange {
                table: row.get(0)?,
                start: row.get(1)?,
                end: row.get(2)?,
                next: row.get(3)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    ranges
        .into_iter()
        .map(|range| {
            let next = next_unused(connection, &range)?;
            Ok(KeyRange { next, ..range })
        })
        .collect()
}

/// Keeps the ranges the server handed out (in the download's transaction).
pub fn keep(connection: &Connection, ranges: &[KeyRange]) -> Result<(), ClientError> {
    for range in ranges {
        connection.execute(
            "INSERT OR IGNORE INTO rs_client_key_range (table_name, range_start, range_end, next_key)
             VALUES (?1, ?2, ?3, ?2)",
            params![range.table, range.start, range.end],
        )?;
    }
    Ok(())
}

/// Takes the next key of `table` from the ranges this client holds, lowest first.
pub fn next_key(connection: &mut Connection, table: &str) -> Result<i64, ClientError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    loop {
        let range = transaction
            .query_row(
                "SELECT range_start, range_end, next_key FROM rs_client_key_range
                 WHERE table_name = ?1 AND next_key < range_end ORDER BY range_start LIMIT 1",
                [table],
                |row| {
                    Ok(KeyRange {
                        table: table.to_string(),
                        start: row.get(0)?,
                        end: row.get(1)?,
                        next: row.get(2)?,
                    })
                },
            )
            .optional()?;
        let Some(range) = range else {
            return Err(ClientError::NoKeys {
                table: table.to_string(),
            });
        };
        let key = next_unused(&transaction, &range)?;
        // Past the range's end, the range is used up and the loop takes the next one.
        transaction.execute(
            "UPDATE rs_client_key_range SET next_key = min(?3, range_end)
             WHERE table_name = ?1 AND range_start = ?2",
            params![table, range.start, key.saturating_add(1)],
        )?;
        if key < range.end {
            transaction.commit()?;
            return Ok(key);
        }
    }
}

/// The range's next key, moved past the largest key of the range the table holds. A
/// table without a single-column key, or not in this database, keeps `next` as it is.
fn next_unused(connection: &Connection, range: &KeyRange) -> Result<i64, ClientError> {
    let Some(column) = single_key_column(connection, &range.table)? else {
        return Ok(range.next);
    };
    let largest: Option<i64> = connection.query_row(
        &format!(
            "SELECT max({column}) FROM {table} WHERE {column} >= ?1 AND {column} < ?2",
            column = quoted(&column),
            table = quoted(&range.table),
        ),
        params![range.start, range.end],
        |row| row.get(0),
    )?;
    Ok(largest.map_or(range.next, |largest| {
        range.next.max(largest.saturating_add(1))
    }))
}

/// An SQLite identifier, quoted.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn single_key_column(connection: &Connection, table: &str) -> Result<Option<String>, ClientError> {
    let mut statement =
        connection.prepare("SELECT name FROM pragma_table_info(?1) WHERE pk > 0")?;
    let columns = statement
        .query_map([table], |row| row.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(match <[String; 1]>::try_from(columns) {
        Ok([column]) => Some(column),
        Err(_) => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database() -> Connection {
        let connection = Connection::open_in_memory().unwrap();
        connection.execute_batch(KEY_RANGE_DDL).unwrap();
        connection
            .execute_batch("CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT)")
            .unwrap();
        connection
    }

    fn range(start: i64, end: i64) -> KeyRange {
        KeyRange {
            table: "customer".into(),
            start,
            end,
            next: start,
        }
    }

    #[test]
    fn keys_are_taken_in_order_across_ranges_then_refused() {
        let mut connection = database();
        assert!(matches!(
            next_key(&mut connection, "customer"),
            Err(ClientError::NoKeys { .. })
        ));
        keep(&connection, &[range(20, 22), range(10, 12)]).unwrap();
        let keys: Vec<i64> = (0..4)
            .map(|_| next_key(&mut connection, "customer").unwrap())
            .collect();
        assert_eq!(keys, vec![10, 11, 20, 21]);
        assert!(matches!(
            next_key(&mut connection, "customer"),
            Err(ClientError::NoKeys { .. })
        ));
        assert!(held(&connection).unwrap().is_empty());
    }

    #[test]
    fn a_key_taken_in_sql_is_not_handed_out_again() {
        let mut connection = database();
        keep(&connection, &[range(100, 200)]).unwrap();
        connection
            .execute_batch("INSERT INTO customer VALUES (100, 'a'), (101, 'b'), (7, 'other')")
            .unwrap();
        assert_eq!(held(&connection).unwrap()[0].next, 102);
        assert_eq!(next_key(&mut connection, "customer").unwrap(), 102);
        assert_eq!(next_key(&mut connection, "customer").unwrap(), 103);
    }

    #[test]
    fn a_range_handed_out_twice_is_kept_once() {
        let mut connection = database();
        keep(&connection, &[range(1, 3)]).unwrap();
        assert_eq!(next_key(&mut connection, "customer").unwrap(), 1);
        keep(&connection, &[range(1, 3)]).unwrap();
        assert_eq!(next_key(&mut connection, "customer").unwrap(), 2);
    }
}
