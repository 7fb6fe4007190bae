//! Held uploads (see `crate::held`) in MySQL and MariaDB.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, TxOpts};

use super::error::db;
use crate::held::{
    fits, replaceable_by, stored_length, Direction, HeldTransfer, HoldBounds,
    HELD_TRANSFER_PART_BYTES,
};
use crate::DbError;

/// Text columns compare byte for byte, as the other system tables' do.
const NAME: &str = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";

pub async fn install(connection: &mut Conn) -> Result<(), DbError> {
    for direction in Direction::ALL {
        install_direction(connection, direction).await?;
    }
    Ok(())
}

async fn install_direction(connection: &mut Conn, direction: Direction) -> Result<(), DbError> {
    let (table, part_table) = direction.tables();
    for statement in [
        format!(
            "CREATE TABLE IF NOT EXISTS {table} (client_id {NAME} PRIMARY KEY,
             transfer_id {NAME} NOT NULL, user_name {NAME} NOT NULL, length BIGINT NOT NULL,
             sha256 VARBINARY(32) NOT NULL, created_unix_ms BIGINT NOT NULL) ENGINE = InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {part_table} (client_id {NAME} NOT NULL,
             part INT NOT NULL, bytes LONGBLOB NOT NULL, PRIMARY KEY (client_id, part))
             ENGINE = InnoDB"
        ),
    ] {
        connection.query_drop(statement).await.map_err(db)?;
    }
    Ok(())
}

async fn remove(
    connection: &mut impl Queryable,
    direction: Direction,
    client_id: &str,
) -> Result<(), DbError> {
    let (table, part_table) = direction.tables();
    connection
        .exec_drop(
            format!("DELETE FROM {part_table} WHERE client_id = ?"),
            (client_id,),
        )
        .await
        .map_err(db)?;
    connection
        .exec_drop(
            format!("DELETE FROM {table} WHERE client_id = ?"),
            (client_id,),
        )
        .await
        .map_err(db)
}

pub async fn hold(
    connection: &mut Conn,
    direction: Direction,
    held: &HeldTransfer,
    bytes: &[u8],
    bounds: HoldBounds,
) -> Result<bool, DbError> {
    let (table, part_table) = direction.tables();
    let length = stored_length(bytes.len() as u64)?;
    let mut transaction = connection
        .start_transaction(TxOpts::default())
        .await
        .map_err(db)?;
    let owner: Option<String> = transaction
        .exec_first(
            format!("SELECT user_name FROM {table} WHERE client_id = ? FOR UPDATE"),
            (&held.client_id,),
        )
        .await
        .map_err(db)?;
    if !replaceable_by(owner.as_deref(), &held.user) {
        transaction.rollback().await.map_err(db)?;
        return Ok(false);
    }
    remove(&mut transaction, direction, &held.client_id).await?;
    let sums: Option<(i64, i64)> = transaction
        .exec_first(
            format!(
                "SELECT CAST(coalesce(sum(length), 0) AS SIGNED), \
                 CAST(coalesce(sum(CASE WHEN user_name = ? THEN length ELSE 0 END), 0) AS SIGNED) \
                 FROM {table}"
            ),
            (&held.user,),
        )
        .await
        .map_err(db)?;
    let (others, users) = sums.unwrap_or((0, 0));
    if !fits(others, users, bytes.len() as u64, bounds) {
        transaction.commit().await.map_err(db)?;
        return Ok(false);
    }
    transaction
        .exec_drop(
            format!(
                "INSERT INTO {table} (client_id, transfer_id, user_name, length, sha256, \
             created_unix_ms) VALUES (?, ?, ?, ?, ?, ?)"
            ),
            (
                &held.client_id,
                &held.transfer_id,
                &held.user,
                length,
                &held.sha256,
                held.created_unix_ms,
            ),
        )
        .await
        .map_err(db)?;
    for (part, chunk) in bytes.chunks(HELD_TRANSFER_PART_BYTES).enumerate() {
        transaction
            .exec_drop(
                format!("INSERT INTO {part_table} (client_id, part, bytes) VALUES (?, ?, ?)"),
                (&held.client_id, part as i64, chunk),
            )
            .await
            .map_err(db)?;
    }
    transaction.commit().await.map_err(db)?;
    Ok(true)
}

/// The client holding a transfer, by its id alone (a table of few rows: no index).
pub async fn held_client(
    connection: &mut impl Queryable,
    direction: Direction,
    transfer_id: &str,
) -> Result<Option<String>, DbError> {
    let (table, _) = direction.tables();
    connection
        .exec_first(
            format!("SELECT client_id FROM {table} WHERE transfer_id = ? LIMIT 1"),
            (transfer_id,),
        )
        .await
        .map_err(db)
}

pub async fn held(
    connection: &mut impl Queryable,
    direction: Direction,
    client_id: &str,
    transfer_id: &str,
) -> Result<Option<HeldTransfer>, DbError> {
    let (table, _) = direction.tables();
    let row: Option<(String, i64, Vec<u8>, i64)> = connection
        .exec_first(
            format!(
                "SELECT user_name, length, sha256, created_unix_ms FROM {table} \
             WHERE client_id = ? AND transfer_id = ?"
            ),
            (client_id, transfer_id),
        )
        .await
        .map_err(db)?;
    Ok(
        row.map(|(user, length, sha256, created_unix_ms)| HeldTransfer {
            client_id: client_id.to_string(),
            user,
            transfer_id: transfer_id.to_string(),
            length: length.max(0) as u64,
            sha256,
            created_unix_ms,
        }),
    )
}

pub async fn held_bytes(
    connection: &mut Conn,
    direction: Direction,
    client_id: &str,
    transfer_id: &str,
    length: u64,
) -> Result<Vec<u8>, DbError> {
    let (_, part_table) = direction.tables();
    let mut bytes = Vec::new();
    if held(connection, direction, client_id, transfer_id)
        .await?
        .is_none()
    {
        return Ok(bytes);
    }
    let parts = length.div_ceil(HELD_TRANSFER_PART_BYTES as u64);
    let rows: Vec<Vec<u8>> = connection
        .exec(
            format!(
                "SELECT bytes FROM {part_table} WHERE client_id = ? AND part < ? \
             ORDER BY part"
            ),
            (client_id, parts),
        )
        .await
        .map_err(db)?;
    for part in rows {
        bytes.extend_from_slice(&part);
    }
    bytes.truncate(length.min(bytes.len() as u64) as usize);
    Ok(bytes)
}

pub async fn release(
    connection: &mut Conn,
    direction: Direction,
    client_id: &str,
    transfer_id: &str,
) -> Result<bool, DbError> {
    let mut transaction = connection
        .start_transaction(TxOpts::default())
        .await
        .map_err(db)?;
    let found = held(&mut transaction, direction, client_id, transfer_id)
        .await?
        .is_some();
    if found {
        remove(&mut transaction, direction, client_id).await?;
    }
    transaction.commit().await.map_err(db)?;
    Ok(found)
}

pub async fn expire(
    connection: &mut Conn,
    direction: Direction,
    created_before_unix_ms: i64,
) -> Result<u64, DbError> {
    let (table, part_table) = direction.tables();
    let mut transaction = connection
        .start_transaction(TxOpts::default())
        .await
        .map_err(db)?;
    transaction
        .exec_drop(
            format!(
                "DELETE FROM {part_table} WHERE client_id IN \
             (SELECT client_id FROM {table} WHERE created_unix_ms < ?)"
            ),
            (created_before_unix_ms,),
        )
        .await
        .map_err(db)?;
    transaction
        .exec_drop(
            format!("DELETE FROM {table} WHERE created_unix_ms < ?"),
            (created_before_unix_ms,),
        )
        .await
        .map_err(db)?;
    let removed = transaction.affected_rows();
    transaction.commit().await.map_err(db)?;
    Ok(removed)
}
