//! `rowsync keys` on SQLite: the table's `AUTOINCREMENT` counter (`sqlite_sequence`)
//! moved above the keys handed to clients (see `crate::key_space`).

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use crate::key_space::{chosen_key, refuse_key, split, KeyRangeInit, KeySpace};
use crate::{quote_identifier, DbError};

const KEY_SPACE_DDL: &str = "
CREATE TABLE IF NOT EXISTS rs_key_space (
    table_name TEXT PRIMARY KEY,
    key_column TEXT NOT NULL,
    space_start INTEGER NOT NULL,
    space_end INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS rs_key_range (
    table_name TEXT NOT NULL,
    range_start INTEGER NOT NULL,
    range_end INTEGER NOT NULL,
    client_id TEXT NOT NULL,
    PRIMARY KEY (table_name, range_start)
);
";

pub fn init_key_ranges(
    connection: &mut Connection,
    init: &KeyRangeInit,
) -> Result<KeySpace, DbError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    transaction.execute_batch(KEY_SPACE_DDL)?;
    let existing = transaction
        .query_row(
            "SELECT key_column, space_start, space_end FROM rs_key_space WHERE table_name = ?1",
            [&init.table],
            |row| {
                Ok(KeySpace {
                    key_column: row.get(0)?,
                    space_start: row.get(1)?,
                    space_end: row.get(2)?,
                    generator: None,
                    existed: true,
                })
            },
        )
        .optional()?;
    let space = match existing {
        Some(space) => space,
        None => new_space(&transaction, init)?,
    };
    transaction.commit()?;
    Ok(space)
}

fn new_space(transaction: &Transaction<'_>, init: &KeyRangeInit) -> Result<KeySpace, DbError> {
    let mut statement = transaction
        .prepare("SELECT name, type FROM pragma_table_info(?1) WHERE pk > 0 ORDER BY pk")?;
    let keys = statement
        .query_map([&init.table], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<String> = keys.iter().map(|(name, _)| name.clone()).collect();
    let (column, key_type) = keys[chosen_key(init, &names)?].clone();
    if !key_type.to_ascii_uppercase().contains("INT") {
        return Err(refuse_key(
            &init.table,
            &names,
            &format!("is of type {key_type:?}"),
        ));
    }
    let definition: String = transaction.query_row(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [&init.table],
        |row| row.get(0),
    )?;
    let definition = definition.to_ascii_uppercase();
    let autoincrement = definition.contains("AUTOINCREMENT");
    let row_id = keys.len() == 1
        && key_type.eq_ignore_ascii_case("INTEGER")
        && !definition.contains("WITHOUT ROWID");
    if row_id && !autoincrement {
        return Err(DbError::Invalid(format!(
            "table {:?}: SQLite gives a row inserted without a key max({column}) + 1, which \
             may be a key handed to a client; declare the key INTEGER PRIMARY KEY \
             AUTOINCREMENT (a table rebuild), then run `rowsync keys` again",
            init.table
        )));
    }
    let largest: i64 = transaction.query_row(
        &format!(
            "SELECT coalesce(max({}), 0) FROM {}",
            quote_identifier(&column),
            quote_identifier(&init.table)
        ),
        [],
        |row| row.get(0),
    )?;
    let counted = sequence_value(transaction, &init.table)?;
    let (space_start, space_end) = split(
        &init.table,
        largest.max(counted.unwrap_or(0)),
        i64::MAX,
        init.range_keys,
    )?;
    if autoincrement {
        set_sequence(transaction, &init.table, space_end - 1, counted.is_some())?;
    }
    transaction.execute(
        "INSERT INTO rs_key_space (table_name, key_column, space_start, space_end)
         VALUES (?1, ?2, ?3, ?4)",
        params![init.table, column, space_start, space_end],
    )?;
    Ok(KeySpace {
        key_column: column,
        space_start,
        space_end,
        generator: autoincrement.then(|| "AUTOINCREMENT (sqlite_sequence)".to_string()),
        existed: false,
    })
}

/// The table's `AUTOINCREMENT` counter, if it has counted yet.
fn sequence_value(transaction: &Transaction<'_>, table: &str) -> Result<Option<i64>, DbError> {
    let exists: bool = transaction.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE name = 'sqlite_sequence'",
        [],
        |row| row.get(0),
    )?;
    if !exists {
        return Ok(None);
    }
    Ok(transaction
        .query_row(
            "SELECT seq FROM sqlite_sequence WHERE name = ?1",
            [table],
            |row| row.get(0),
        )
        .optional()?)
}

fn set_sequence(
    transaction: &Transaction<'_>,
    table: &str,
    value: i64,
    counted: bool,
) -> Result<(), DbError> {
    let sql = match counted {
        true => "UPDATE sqlite_sequence SET seq = ?2 WHERE name = ?1",
        false => "INSERT INTO sqlite_sequence (name, seq) VALUES (?1, ?2)",
    };
    transaction.execute(sql, params![table, value])?;
    Ok(())
}
