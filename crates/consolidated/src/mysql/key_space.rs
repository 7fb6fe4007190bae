//! `rowsync keys` on MariaDB: the table's `AUTO_INCREMENT` moved above the keys handed
//! to clients (see `crate::key_space`). MariaDB moves it past any key inserted above
//! it, never below, so the clients' keys stay below it.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, TxOpts};

use super::error::db;
use crate::key_space::{refuse_key, split, KeyRangeInit, KeySpace};
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
    let existing: Option<(String, i64, i64)> = transaction
        .exec_first(
            "SELECT key_column, space_start, space_end FROM rs_key_space WHERE table_name = ? FOR UPDATE",
            (&init.table,),
        )
        .await
        .map_err(db)?;
    if let Some((key_column, space_start, space_end)) = existing {
        transaction.commit().await.map_err(db)?;
        return Ok(KeySpace {
            key_column,
            space_start,
            space_end,
            generator: None,
            existed: true,
        });
    }
    let keys: Vec<(String, String, bool)> = transaction
        .exec(KEY_COLUMNS, (&init.table,))
        .await
        .map_err(db)?;
    let names: Vec<String> = keys.iter().map(|(name, ..)| name.clone()).collect();
    let chosen = match &init.column {
        Some(column) => keys.iter().find(|(name, ..)| name == column),
        None if keys.len() == 1 => keys.first(),
        None => None,
    };
    let Some((column, key_type, auto_increment)) = chosen.cloned() else {
        return Err(refuse_key(
            &init.table,
            &names,
            "is not one column (name it with --column)",
        ));
    };
    let key_max = key_max(&key_type)
        .ok_or_else(|| refuse_key(&init.table, &names, &format!("is of type {key_type}")))?;
    let table = format!("`{}`", init.table.replace('`', "``"));
    let largest: Option<i64> = transaction
        .query_first(format!(
            "SELECT CAST(coalesce(max(`{}`), 0) AS SIGNED) FROM {table}",
            column.replace('`', "``")
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
    transaction.commit().await.map_err(db)?;
    if auto_increment {
        // DDL: commits on its own, after the split is recorded.
        connection
            .query_drop(format!("ALTER TABLE {table} AUTO_INCREMENT = {space_end}"))
            .await
            .map_err(db)?;
    }
    Ok(KeySpace {
        key_column: column,
        space_start,
        space_end,
        generator: auto_increment.then(|| "AUTO_INCREMENT".to_string()),
        existed: false,
    })
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
