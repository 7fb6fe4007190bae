//! Held uploads (see `crate::held`) in PostgreSQL.

use tokio_postgres::{Client, GenericClient};

use crate::held::{fits, stored_length, HeldUpload, HELD_UPLOAD_PART_BYTES};
use crate::DbError;

const TABLES: &str = "
SELECT pg_advisory_xact_lock(7262);
CREATE TABLE IF NOT EXISTS rs_held_upload (
    client_id TEXT PRIMARY KEY,
    transfer_id TEXT NOT NULL,
    user_name TEXT NOT NULL,
    length BIGINT NOT NULL,
    sha256 BYTEA NOT NULL,
    created_unix_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS rs_held_upload_part (
    client_id TEXT NOT NULL,
    part INTEGER NOT NULL,
    bytes BYTEA NOT NULL,
    PRIMARY KEY (client_id, part)
);
";

pub async fn install(client: &Client) -> Result<(), DbError> {
    // One implicit transaction: the lock serializes concurrent installers.
    client.batch_execute(TABLES).await?;
    Ok(())
}

async fn remove(client: &impl GenericClient, client_id: &str) -> Result<u64, DbError> {
    client
        .execute(
            "DELETE FROM rs_held_upload_part WHERE client_id = $1",
            &[&client_id],
        )
        .await?;
    Ok(client
        .execute(
            "DELETE FROM rs_held_upload WHERE client_id = $1",
            &[&client_id],
        )
        .await?)
}

pub async fn hold(
    client: &mut Client,
    held: &HeldUpload,
    bytes: &[u8],
    all_bytes_max: u64,
) -> Result<bool, DbError> {
    let length = stored_length(bytes.len() as u64)?;
    let transaction = client.transaction().await?;
    remove(&transaction, &held.client_id).await?;
    let others: i64 = transaction
        .query_one(
            "SELECT coalesce(sum(length), 0)::bigint FROM rs_held_upload",
            &[],
        )
        .await?
        .get(0);
    if !fits(others, bytes.len() as u64, all_bytes_max) {
        transaction.commit().await?;
        return Ok(false);
    }
    transaction
        .execute(
            "INSERT INTO rs_held_upload (client_id, transfer_id, user_name, length, sha256, \
             created_unix_ms) VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &held.client_id,
                &held.transfer_id,
                &held.user,
                &length,
                &held.sha256,
                &held.created_unix_ms,
            ],
        )
        .await?;
    let insert = transaction
        .prepare("INSERT INTO rs_held_upload_part (client_id, part, bytes) VALUES ($1, $2, $3)")
        .await?;
    for (part, chunk) in bytes.chunks(HELD_UPLOAD_PART_BYTES).enumerate() {
        transaction
            .execute(&insert, &[&held.client_id, &(part as i32), &chunk])
            .await?;
    }
    transaction.commit().await?;
    Ok(true)
}

pub async fn held(
    client: &impl GenericClient,
    client_id: &str,
    transfer_id: &str,
) -> Result<Option<HeldUpload>, DbError> {
    let row = client
        .query_opt(
            "SELECT user_name, length, sha256, created_unix_ms FROM rs_held_upload \
             WHERE client_id = $1 AND transfer_id = $2",
            &[&client_id, &transfer_id],
        )
        .await?;
    Ok(row.map(|row| HeldUpload {
        client_id: client_id.to_string(),
        user: row.get(0),
        transfer_id: transfer_id.to_string(),
        length: row.get::<_, i64>(1).max(0) as u64,
        sha256: row.get(2),
        created_unix_ms: row.get(3),
    }))
}

pub async fn held_bytes(
    client: &Client,
    client_id: &str,
    transfer_id: &str,
    length: u64,
) -> Result<Vec<u8>, DbError> {
    let mut bytes = Vec::new();
    if held(client, client_id, transfer_id).await?.is_none() {
        return Ok(bytes);
    }
    let parts = length.div_ceil(HELD_UPLOAD_PART_BYTES as u64);
    let parts = i32::try_from(parts).unwrap_or(i32::MAX);
    let rows = client
        .query(
            "SELECT bytes FROM rs_held_upload_part WHERE client_id = $1 AND part < $2 \
             ORDER BY part",
            &[&client_id, &parts],
        )
        .await?;
    for row in rows {
        bytes.extend_from_slice(row.get::<_, &[u8]>(0));
    }
    bytes.truncate(length.min(bytes.len() as u64) as usize);
    Ok(bytes)
}

pub async fn release(
    client: &mut Client,
    client_id: &str,
    transfer_id: &str,
) -> Result<bool, DbError> {
    let transaction = client.transaction().await?;
    let found = held(&transaction, client_id, transfer_id).await?.is_some();
    if found {
        remove(&transaction, client_id).await?;
    }
    transaction.commit().await?;
    Ok(found)
}

pub async fn expire(client: &mut Client, created_before_unix_ms: i64) -> Result<u64, DbError> {
    let transaction = client.transaction().await?;
    transaction
        .execute(
            "DELETE FROM rs_held_upload_part WHERE client_id IN \
             (SELECT client_id FROM rs_held_upload WHERE created_unix_ms < $1)",
            &[&created_before_unix_ms],
        )
        .await?;
    let removed = transaction
        .execute(
            "DELETE FROM rs_held_upload WHERE created_unix_ms < $1",
            &[&created_before_unix_ms],
        )
        .await?;
    transaction.commit().await?;
    Ok(removed)
}
