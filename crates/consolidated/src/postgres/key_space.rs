//! `rowsync keys` on PostgreSQL: the table's sequence (serial or identity) moved above
//! the keys handed to clients (see `crate::key_space`).

use tokio_postgres::{Client, Transaction};

use crate::key_space::{chosen_key, refuse_key, split, KeyRangeInit, KeySpace};
use crate::{quote_identifier, DbError};

const KEY_SPACE_DDL: &str = "
CREATE TABLE IF NOT EXISTS rs_key_space (
    table_name text PRIMARY KEY,
    key_column text NOT NULL,
    space_start bigint NOT NULL,
    space_end bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS rs_key_range (
    table_name text NOT NULL,
    range_start bigint NOT NULL,
    range_end bigint NOT NULL,
    client_id text NOT NULL,
    PRIMARY KEY (table_name, range_start)
);
LOCK TABLE rs_key_space IN EXCLUSIVE MODE;
";

/// The primary key's columns, each with its type and its sequence (if any).
const KEY_COLUMNS: &str = "
SELECT a.attname::text, format_type(a.atttypid, a.atttypmod),
       pg_get_serial_sequence($1, a.attname)
FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = $1::regclass AND i.indisprimary ORDER BY a.attnum";

pub async fn init_key_ranges(
    client: &mut Client,
    init: &KeyRangeInit,
) -> Result<KeySpace, DbError> {
    let transaction = client.transaction().await?;
    transaction.batch_execute(KEY_SPACE_DDL).await?;
    let existing = transaction
        .query_opt(
            "SELECT key_column, space_start, space_end FROM rs_key_space WHERE table_name = $1",
            &[&init.table],
        )
        .await?;
    let space = match existing {
        Some(row) => KeySpace {
            key_column: row.get(0),
            space_start: row.get(1),
            space_end: row.get(2),
            generator: None,
            existed: true,
        },
        None => new_space(&transaction, init).await?,
    };
    transaction.commit().await?;
    Ok(space)
}

async fn new_space(
    transaction: &Transaction<'_>,
    init: &KeyRangeInit,
) -> Result<KeySpace, DbError> {
    let table = quote_identifier(&init.table);
    let keys = transaction.query(KEY_COLUMNS, &[&table]).await?;
    let names: Vec<String> = keys.iter().map(|row| row.get(0)).collect();
    let key = &keys[chosen_key(init, &names)?];
    let (column, key_type, sequence): (String, String, Option<String>) =
        (key.get(0), key.get(1), key.get(2));
    let key_max = match key_type.as_str() {
        "bigint" => i64::MAX,
        "integer" => i32::MAX.into(),
        "smallint" => i16::MAX.into(),
        other => {
            return Err(refuse_key(
                &init.table,
                &names,
                &format!("is of type {other}"),
            ))
        }
    };
    let largest_used = largest_used(transaction, &table, &column, sequence.as_deref()).await?;
    let (space_start, space_end) = split(&init.table, largest_used, key_max, init.range_keys)?;
    if let Some(sequence) = &sequence {
        transaction
            .execute(
                "SELECT setval($1::text::regclass, $2, false)",
                &[sequence, &space_end],
            )
            .await?;
    }
    transaction
        .execute(
            "INSERT INTO rs_key_space (table_name, key_column, space_start, space_end)
             VALUES ($1, $2, $3, $4)",
            &[&init.table, &column, &space_start, &space_end],
        )
        .await?;
    Ok(KeySpace {
        key_column: column,
        space_start,
        space_end,
        generator: sequence.map(|sequence| format!("sequence {sequence}")),
        existed: false,
    })
}

/// The largest key in use: the table's, or its sequence's if that went further.
async fn largest_used(
    transaction: &Transaction<'_>,
    table: &str,
    column: &str,
    sequence: Option<&str>,
) -> Result<i64, DbError> {
    let largest: i64 = transaction
        .query_one(
            &format!(
                "SELECT coalesce(max({})::bigint, 0) FROM {table}",
                quote_identifier(column)
            ),
            &[],
        )
        .await?
        .get(0);
    let used_by_sequence: i64 = match sequence {
        Some(sequence) => transaction
            .query_one(
                &format!(
                    "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {sequence}"
                ),
                &[],
            )
            .await?
            .get(0),
        None => 0,
    };
    Ok(largest.max(used_by_sequence))
}
