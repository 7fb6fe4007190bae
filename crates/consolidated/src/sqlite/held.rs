//! Held uploads (see `crate::held`) in SQLite.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::held::{
    fits, replaceable_by, stored_length, Direction, HeldTransfer, HoldBounds,
    HELD_TRANSFER_PART_BYTES,
};
use crate::DbError;

/// The tables of both directions' held transfers.
pub fn tables_sql() -> String {
    Direction::ALL
        .iter()
        .map(|direction| {
            let (table, part_table) = direction.tables();
            format!(
                "CREATE TABLE IF NOT EXISTS {table} (
                    client_id TEXT PRIMARY KEY,
                    transfer_id TEXT NOT NULL,
                    user_name TEXT NOT NULL,
                    length INTEGER NOT NULL,
                    sha256 BLOB NOT NULL,
                    created_unix_ms INTEGER NOT NULL
                );
                CREATE TABLE IF NOT EXISTS {part_table} (
                    client_id TEXT NOT NULL,
                    part INTEGER NOT NULL,
                    bytes BLOB NOT NULL,
                    PRIMARY KEY (client_id, part)
                );"
            )
        })
        .collect()
}

fn remove(
    connection: &Connection,
    direction: Direction,
    client_id: &str,
) -> Result<usize, DbError> {
    let (table, part_table) = direction.tables();
    connection.execute(
        &format!("DELETE FROM {part_table} WHERE client_id = ?1"),
        [client_id],
    )?;
    Ok(connection.execute(
        &format!("DELETE FROM {table} WHERE client_id = ?1"),
        [client_id],
    )?)
}

pub fn hold(
    connection: &mut Connection,
    direction: Direction,
    held: &HeldTransfer,
    bytes: &[u8],
    bounds: HoldBounds,
) -> Result<bool, DbError> {
    let (table, part_table) = direction.tables();
    let length = stored_length(bytes.len() as u64)?;
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let owner: Option<String> = transaction
        .query_row(
            &format!("SELECT user_name FROM {table} WHERE client_id = ?1"),
            [&held.client_id],
            |row| row.get(0),
        )
        .optional()?;
    if !replaceable_by(owner.as_deref(), &held.user) {
        return Ok(false);
    }
    remove(&transaction, direction, &held.client_id)?;
    let (others, users): (i64, i64) = transaction.query_row(
        &format!(
            "SELECT coalesce(sum(length), 0), \
             coalesce(sum(CASE WHEN user_name = ?1 THEN length ELSE 0 END), 0) FROM {table}"
        ),
        [&held.user],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    if !fits(others, users, bytes.len() as u64, bounds) {
        transaction.commit()?;
        return Ok(false);
    }
    transaction.execute(
        &format!(
            "INSERT INTO {table} (client_id, transfer_id, user_name, length, sha256, \
         created_unix_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
        ),
        params![
            held.client_id,
            held.transfer_id,
            held.user,
            length,
            held.sha256,
            held.created_unix_ms
        ],
    )?;
    {
        let mut insert = transaction.prepare_cached(&format!(
            "INSERT INTO {part_table} (client_id, part, bytes) VALUES (?1, ?2, ?3)"
        ))?;
        for (part, chunk) in bytes.chunks(HELD_TRANSFER_PART_BYTES).enumerate() {
            insert.execute(params![held.client_id, part as i64, chunk])?;
        }
    }
    transaction.commit()?;
    Ok(true)
}

/// The client holding a transfer, by its id alone (a table of few rows: no index).
pub fn held_client(
    connection: &Connection,
    direction: Direction,
    transfer_id: &str,
) -> Result<Option<String>, DbError> {
    let (table, _) = direction.tables();
    Ok(connection
        .query_row(
            &format!("SELECT client_id FROM {table} WHERE transfer_id = ?1 LIMIT 1"),
            [transfer_id],
            |row| row.get(0),
        )
        .optional()?)
}

pub fn held(
    connection: &Connection,
    direction: Direction,
    client_id: &str,
    transfer_id: &str,
) -> Result<Option<HeldTransfer>, DbError> {
    let (table, _) = direction.tables();
    Ok(connection
        .query_row(
            &format!(
                "SELECT user_name, length, sha256, created_unix_ms FROM {table} \
             WHERE client_id = ?1 AND transfer_id = ?2"
            ),
            [client_id, transfer_id],
            |row| {
                Ok(HeldTransfer {
                    client_id: client_id.to_string(),
                    user: row.get(0)?,
                    transfer_id: transfer_id.to_string(),
                    length: row.get::<_, i64>(1)?.max(0) as u64,
                    sha256: row.get(2)?,
                    created_unix_ms: row.get(3)?,
                })
            },
        )
        .optional()?)
}

pub fn held_bytes(
    connection: &Connection,
    direction: Direction,
    client_id: &str,
    transfer_id: &str,
    length: u64,
) -> Result<Vec<u8>, DbError> {
    let (_, part_table) = direction.tables();
    let mut bytes = Vec::new();
    if held(connection, direction, client_id, transfer_id)?.is_none() {
        return Ok(bytes);
    }
    let mut query = connection.prepare_cached(&format!(
        "SELECT bytes FROM {part_table} WHERE client_id = ?1 ORDER BY part"
    ))?;
    let mut rows = query.query([client_id])?;
    while (bytes.len() as u64) < length {
        let Some(row) = rows.next()? else { break };
        let part: Vec<u8> = row.get(0)?;
        bytes.extend_from_slice(&part);
    }
    bytes.truncate(length.min(bytes.len() as u64) as usize);
    Ok(bytes)
}

pub fn release(
    connection: &mut Connection,
    direction: Direction,
    client_id: &str,
    transfer_id: &str,
) -> Result<bool, DbError> {
    // IMMEDIATE: a deferred transaction that reads first cannot then write once another
    // connection has committed (SQLite's stale snapshot, "database is locked" at once,
    // no busy timeout waits for it).
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found = held(&transaction, direction, client_id, transfer_id)?.is_some();
    if found {
        remove(&transaction, direction, client_id)?;
    }
    transaction.commit()?;
    Ok(found)
}

pub fn expire(
    connection: &mut Connection,
    direction: Direction,
    created_before_unix_ms: i64,
) -> Result<u64, DbError> {
    let (table, part_table) = direction.tables();
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    transaction.execute(
        &format!(
            "DELETE FROM {part_table} WHERE client_id IN \
         (SELECT client_id FROM {table} WHERE created_unix_ms < ?1)"
        ),
        [created_before_unix_ms],
    )?;
    let removed = transaction.execute(
        &format!("DELETE FROM {table} WHERE created_unix_ms < ?1"),
        [created_before_unix_ms],
    )?;
    transaction.commit()?;
    Ok(removed as u64)
}
