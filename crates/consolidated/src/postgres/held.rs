//! Held uploads (see `crate::held`) in PostgreSQL.

use tokio_postgres::{Client, GenericClient};

use crate::held::{
    fits, replaceable_by, stored_length, Direction, HeldTransfer, HoldBounds,
    HELD_TRANSFER_PART_BYTES,
};
use crate::DbError;

/// The tables of both directions' held transfers, created under a lock that serializes
/// concurrent installers.
fn tables_sql() -> String {
    let mut sql = String::from("SELECT pg_advisory_xact_lock(7262);");
    for direction in Direction::ALL {
        let (table, part_table) = direction.tables();
        sql.push_str(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (
                client_id TEXT PRIMARY KEY,
                transfer_id TEXT NOT NULL,
                user_name TEXT NOT NULL,
                length BIGINT NOT NULL,
                sha256 BYTEA NOT NULL,
                created_unix_ms BIGINT NOT NULL
            );
            CREATE TABLE IF NOT EXISTS {part_table} (
                client_id TEXT NOT NULL,
                part INTEGER NOT NULL,
                bytes BYTEA NOT NULL,
                PRIMARY KEY (client_id, part)
            );"
        ));
    }
    sql
}

pub async fn install(client: &Client) -> Result<(), DbError> {
    // One implicit transaction: the lock serializes concurrent installers.
    client.batch_execute(&tables_sql()).await?;
    Ok(())
}

async fn remove(
    client: &impl GenericClient,
    direction: Direction,
    client_id: &str,
) -> Result<u64, DbError> {
    let (table, part_table) = direction.tables();
    client
        .execute(
            &format!("DELETE FROM {part_table} WHERE client_id = $1"),
            &[&client_id],
        )
        .await?;
    Ok(client
        .execute(
            &format!("DELETE FROM {table} WHERE client_id = $1"),
            &[&client_id],
        )
        .await?)
}

pub async fn hold(
    client: &mut Client,
    direction: Direction,
    held: &HeldTransfer,
    bytes: &[u8],
    bounds: HoldBounds,
) -> Result<bool, DbError> {
    let (table, part_table) = direction.tables();
    let length = stored_length(bytes.len() as u64)?;
    let transaction = client.transaction().await?;
    let owner: Option<String> = transaction
        .query_opt(
            &format!("SELECT user_name FROM {table} WHERE client_id = $1"),
            &[&held.client_id],
        )
        .await?
        .map(|row| row.get(0));
    if !replaceable_by(owner.as_deref(), &held.user) {
        return Ok(false);
    }
    remove(&transaction, direction, &held.client_id).await?;
    let row = transaction
        .query_one(
            &format!(
                "SELECT coalesce(sum(length), 0)::bigint, \
                 coalesce(sum(CASE WHEN user_name = $1 THEN length ELSE 0 END), 0)::bigint \
                 FROM {table}"
            ),
            &[&held.user],
        )
        .await?;
    if !fits(row.get(0), row.get(1), bytes.len() as u64, bounds) {
        transaction.commit().await?;
        return Ok(false);
    }
    transaction
        .execute(
            &format!(
                "INSERT INTO {table} (client_id, transfer_id, user_name, length, sha256, \
             created_unix_ms) VALUES ($1, $2, $3, $4, $5, $6)"
            ),
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
        .prepare(&format!(
            "INSERT INTO {part_table} (client_id, part, bytes) VALUES ($1, $2, $3)"
        ))
        .await?;
    for (part, chunk) in bytes.chunks(HELD_TRANSFER_PART_BYTES).enumerate() {
        transaction
            .execute(&insert, &[&held.client_id, &(part as i32), &chunk])
            .await?;
    }
    transaction.commit().await?;
    Ok(true)
}

/// The client holding a transfer, by its id alone (a table of few rows: no index).
pub async fn held_client(
    client: &impl GenericClient,
    direction: Direction,
    transfer_id: &str,
) -> Result<Option<String>, DbError> {
    let (table, _) = direction.tables();
    let row = client
        .query_opt(
            &format!("SELECT client_id FROM {table} WHERE transfer_id = $1 LIMIT 1"),
            &[&transfer_id],
        )
        .await?;
    Ok(row.map(|row| row.get(0)))
}

pub async fn held(
    client: &impl GenericClient,
    direction: Direction,
    client_id: &str,
    transfer_id: &str,
) -> Result<Option<HeldTransfer>, DbError> {
    let (table, _) = direction.tables();
    let row = client
        .query_opt(
            &format!(
                "SELECT user_name, length, sha256, created_unix_ms FROM {table} \
             WHERE client_id = $1 AND transfer_id = $2"
            ),
            &[&client_id, &transfer_id],
        )
        .await?;
    Ok(row.map(|row| HeldTransfer {
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
    direction: Direction,
    client_id: &str,
    transfer_id: &str,
    length: u64,
) -> Result<Vec<u8>, DbError> {
    let (_, part_table) = direction.tables();
    let mut bytes = Vec::new();
    if held(client, direction, client_id, transfer_id)
        .await?
        .is_none()
    {
        return Ok(bytes);
    }
    let parts = length.div_ceil(HELD_TRANSFER_PART_BYTES as u64);
    let parts = i32::try_from(parts).unwrap_or(i32::MAX);
    let rows = client
        .query(
            &format!(
                "SELECT bytes FROM {part_table} WHERE client_id = $1 AND part < $2 \
             ORDER BY part"
            ),
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
    direction: Direction,
    client_id: &str,
    transfer_id: &str,
) -> Result<bool, DbError> {
    let transaction = client.transaction().await?;
    let found = held(&transaction, direction, client_id, transfer_id)
        .await?
        .is_some();
    if found {
        remove(&transaction, direction, client_id).await?;
    }
    transaction.commit().await?;
    Ok(found)
}

pub async fn expire(
    client: &mut Client,
    direction: Direction,
    created_before_unix_ms: i64,
) -> Result<u64, DbError> {
    let (table, part_table) = direction.tables();
    let transaction = client.transaction().await?;
    transaction
        .execute(
            &format!(
                "DELETE FROM {part_table} WHERE client_id IN \
             (SELECT client_id FROM {table} WHERE created_unix_ms < $1)"
            ),
            &[&created_before_unix_ms],
        )
        .await?;
    let removed = transaction
        .execute(
            &format!("DELETE FROM {table} WHERE created_unix_ms < $1"),
            &[&created_before_unix_ms],
        )
        .await?;
    transaction.commit().await?;
    Ok(removed)
}
