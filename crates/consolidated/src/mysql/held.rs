//! Held uploads (see `crate::held`) in MySQL and MariaDB.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, TxOpts};

use super::error::db;
use crate::held::{fits, stored_length, HeldUpload, HELD_UPLOAD_PART_BYTES};
use crate::DbError;

/// Text columns compare byte for byte, as the other system tables' do.
const NAME: &str = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";

pub async fn install(connection: &mut Conn) -> Result<(), DbError> {
    for statement in [
        format!(
            "CREATE TABLE IF NOT EXISTS rs_held_upload (client_id {NAME} PRIMARY KEY,
             transfer_id {NAME} NOT NULL, user_name {NAME} NOT NULL, length BIGINT NOT NULL,
             sha256 VARBINARY(32) NOT NULL, created_unix_ms BIGINT NOT NULL) ENGINE = InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS rs_held_upload_part (client_id {NAME} NOT NULL,
             part INT NOT NULL, bytes LONGBLOB NOT NULL, PRIMARY KEY (client_id, part))
             ENGINE = InnoDB"
        ),
    ] {
        connection.query_drop(statement).await.map_err(db)?;
    }
    Ok(())
}

async fn remove(connection: &mut impl Queryable, client_id: &str) -> Result<(), DbError> {
    connection
        .exec_drop(
            "DELETE FROM rs_held_upload_part WHERE client_id = ?",
            (client_id,),
        )
        .await
        .map_err(db)?;
    connection
        .exec_drop(
            "DELETE FROM rs_held_upload WHERE client_id = ?",
            (client_id,),
        )
        .await
        .map_err(db)
}

pub async fn hold(
    connection: &mut Conn,
    held: &HeldUpload,
    bytes: &[u8],
    all_bytes_max: u64,
) -> Result<bool, DbError> {
    let length = stored_length(bytes.len() as u64)?;
    let mut transaction = connection
        .start_transaction(TxOpts::default())
        .await
        .map_err(db)?;
    remove(&mut transaction, &held.client_id).await?;
    let others: Option<i64> = transaction
        .query_first("SELECT CAST(coalesce(sum(length), 0) AS SIGNED) FROM rs_held_upload")
        .await
        .map_err(db)?;
    if !fits(others.unwrap_or(0), bytes.len() as u64, all_bytes_max) {
        transaction.commit().await.map_err(db)?;
        return Ok(false);
    }
    transaction
        .exec_drop(
            "INSERT INTO rs_held_upload (client_id, transfer_id, user_name, length, sha256, \
             created_unix_ms) VALUES (?, ?, ?, ?, ?, ?)",
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
    for (part, chunk) in bytes.chunks(HELD_UPLOAD_PART_BYTES).enumerate() {
        transaction
            .exec_drop(
                "INSERT INTO rs_held_upload_part (client_id, part, bytes) VALUES (?, ?, ?)",
                (&held.client_id, part as i64, chunk),
            )
            .await
            .map_err(db)?;
    }
    transaction.commit().await.map_err(db)?;
    Ok(true)
}

pub async fn held(
    connection: &mut impl Queryable,
    client_id: &str,
    transfer_id: &str,
) -> Result<Option<HeldUpload>, DbError> {
    let row: Option<(String, i64, Vec<u8>, i64)> = connection
        .exec_first(
            "SELECT user_name, length, sha256, created_unix_ms FROM rs_held_upload \
             WHERE client_id = ? AND transfer_id = ?",
            (client_id, transfer_id),
        )
        .await
        .map_err(db)?;
    Ok(
        row.map(|(user, length, sha256, created_unix_ms)| HeldUpload {
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
    client_id: &str,
    transfer_id: &str,
    length: u64,
) -> Result<Vec<u8>, DbError> {
    let mut bytes = Vec::new();
    if held(connection, client_id, transfer_id).await?.is_none() {
        return Ok(bytes);
    }
    let parts = length.div_ceil(HELD_UPLOAD_PART_BYTES as u64);
    let rows: Vec<Vec<u8>> = connection
        .exec(
            "SELECT bytes FROM rs_held_upload_part WHERE client_id = ? AND part < ? \
             ORDER BY part",
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
    client_id: &str,
    transfer_id: &str,
) -> Result<bool, DbError> {
    let mut transaction = connection
        .start_transaction(TxOpts::default())
        .await
        .map_err(db)?;
    let found = held(&mut transaction, client_id, transfer_id)
        .await?
        .is_some();
    if found {
        remove(&mut transaction, client_id).await?;
    }
    transaction.commit().await.map_err(db)?;
    Ok(found)
}

pub async fn expire(connection: &mut Conn, created_before_unix_ms: i64) -> Result<u64, DbError> {
    let mut transaction = connection
        .start_transaction(TxOpts::default())
        .await
        .map_err(db)?;
    transaction
        .exec_drop(
            "DELETE FROM rs_held_upload_part WHERE client_id IN \
             (SELECT client_id FROM rs_held_upload WHERE created_unix_ms < ?)",
            (created_before_unix_ms,),
        )
        .await
        .map_err(db)?;
    transaction
        .exec_drop(
            "DELETE FROM rs_held_upload WHERE created_unix_ms < ?",
            (created_before_unix_ms,),
        )
        .await
        .map_err(db)?;
    let removed = transaction.affected_rows();
    transaction.commit().await.map_err(db)?;
    Ok(removed)
}
