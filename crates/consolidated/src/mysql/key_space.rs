//! `rowsync keys` on MariaDB: the table's `AUTO_INCREMENT` moved above the keys handed
//! to clients (see `crate::key_space`). MariaDB moves it past any key inserted above
//! it, never below, so the clients' keys stay below it.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Transaction, TxOpts};

use super::error::db;
use crate::key_space::{chosen_key, refuse_key, split, KeyRangeInit, KeySpace};
use crate::DbError;

const KEY_SPACE_DDL: &str = "
CREATE TABLE IF NOT EXISTS rs_key_space (
    table_name VARCHAR(255) PRIMARY KEY,
    key_column VARCHAR(255) NOT NULL,
    space_start BIGINT NOT NULL,
    space_end BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS rs_key_range (
    table_name VARCHAR(255) NOT NULL,
    range_start BIGINT NOT NULL,
    range_end BIGINT NOT NULL,
    client_id VARCHAR(255) NOT NULL,
    PRIMARY KEY (table_name, range_start)
);
";

/// The primary key's columns: name, type (`int unsigned`), whether `AUTO_INCREMENT`.
const KEY_COLUMNS: &str = "
SELECT COLUMN_NAME, COLUMN_TYPE, EXTRA LIKE '%auto_increment%'
FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_KEY = 'PRI'
ORDER BY ORDINAL_POSITION";

pub async fn init_key_ranges(
    connection: &mut Conn,
    init: &KeyRangeInit,
) -> Result<KeySpace, DbError> {
    connection.query_drop(KEY_SPACE_DDL).await.map_err(db)?;
    let mut transaction = connection
        .start_transaction(TxOpts::default())
        .await
        .map_err(db)?;
    if let Some(space) = existing_space(&mut transaction, &init.table).await? {
        transaction.commit().await.map_err(db)?;
        return Ok(space);
    }
    let space = new_space(&mut transaction, init).await?;
    transaction.commit().await.map_err(db)?;
    if space.generator.is_some() {
        // DDL: commits on its own, after the split is recorded.
        connection
            .query_drop(format!(
                "ALTER TABLE {} AUTO_INCREMENT = {}",
                quote(&init.table),
                space.space_end
            ))
            .await
            .map_err(db)?;
    }
    Ok(space)
}

/// The split `rowsync keys` made for the table before, if it did.
async fn existing_space(
    transaction: &mut Transaction<'_>,
    table: &str,
) -> Result<Option<KeySpace>, DbError> {
    let existing: Option<(String, i64, i64)> = transaction
        .exec_first(
            "SELECT key_column, space_start, space_end FROM rs_key_space WHERE table_name = ? FOR UPDATE",
            (table,),
        )
        .await
        .map_err(db)?;
    Ok(
        existing.map(|(key_column, space_start, space_end)| KeySpace {
            key_column,
            space_start,
            space_end,
            generator: None,
            existed: true,
        }),
    )
}

/// Splits the table's keys and records the split; the caller moves `AUTO_INCREMENT`
/// once the transaction commits (when `generator` is set).
async fn new_space(
    transaction: &mut Transaction<'_>,
    init: &KeyRangeInit,
) -> Result<KeySpace, DbError> {
    let keys: Vec<(String, String, bool)> = transaction
        .exec(KEY_COLUMNS, (&init.table,))
        .await
        .map_err(db)?;
    let names: Vec<String> = keys.iter().map(|(name, ..)| name.clone()).collect();
    let (column, key_type, auto_increment) = keys[chosen_key(init, &names)?].clone();
    let key_max = key_max(&key_type)
        .ok_or_else(|| refuse_key(&init.table, &names, &format!("is of type {key_type}")))?;
    let largest: Option<i64> = transaction
        .query_first(format!(
            "SELECT CAST(coalesce(max({}), 0) AS SIGNED) FROM {}",
            quote(&column),
            quote(&init.table)
        ))
        .await
        .map_err(db)?;
    let next_auto: Option<Option<i64>> = transaction
        .exec_first(
            "SELECT CAST(AUTO_INCREMENT AS SIGNED) FROM information_schema.TABLES
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
            (&init.table,),
        )
        .await
        .map_err(db)?;
    let used_by_counter = next_auto.flatten().map_or(0, |next| next - 1);
    let (space_start, space_end) = split(
        &init.table,
        largest.unwrap_or(0).max(used_by_counter),
        key_max,
        init.range_keys,
    )?;
    transaction
        .exec_drop(
            "INSERT INTO rs_key_space (table_name, key_column, space_start, space_end)
             VALUES (?, ?, ?, ?)",
            (&init.table, &column, space_start, space_end),
        )
        .await
        .map_err(db)?;
    Ok(KeySpace {
        key_column: column,
        space_start,
        space_end,
        generator: auto_increment.then(|| "AUTO_INCREMENT".to_string()),
        existed: false,
    })
}

/// A MariaDB identifier quoted.
fn quote(identifier: &str) -> String {
    format!("`{}`", identifier.replace('`', "``"))
}

/// The largest value of an integer column type as `information_schema` spells it.
fn key_max(column_type: &str) -> Option<i64> {
    let unsigned = column_type.contains("unsigned");
    let base = column_type.split(['(', ' ']).next().unwrap_or_default();
    Some(match (base, unsigned) {
        ("tinyint", false) => i8::MAX.into(),
        ("tinyint", true) => u8::MAX.into(),
        ("smallint", false) => i16::MAX.into(),
        ("smallint", true) => u16::MAX.into(),
        ("mediumint", false) => 8_388_607,
        ("mediumint", true) => 16_777_215,
        ("int", false) => i32::MAX.into(),
        ("int", true) => u32::MAX.into(),
        ("bigint", _) => i64::MAX,
        _ => return None,
    })
}
