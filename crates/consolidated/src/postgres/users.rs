//! The built-in users (`rs_user`) on PostgreSQL: listed, removed, disabled.

use tokio_postgres::GenericClient;

use crate::{DbError, SessionKey, UserEntry};

/// A user's password hash for a password login: `None` for no such user, or a disabled one.
pub const PASSWORD_HASH: &str =
    "SELECT password_hash FROM rs_user WHERE name = $1 AND NOT disabled";

pub async fn users(client: &impl GenericClient) -> Result<Vec<UserEntry>, DbError> {
    let rows = client
        .query(
            "SELECT name, disabled, created_at::text FROM rs_user ORDER BY name",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| UserEntry {
            name: row.get(0),
            disabled: row.get(1),
            created_at: row.get(2),
        })
        .collect())
}

pub async fn remove_user(client: &impl GenericClient, name: &str) -> Result<bool, DbError> {
    Ok(client
        .execute("DELETE FROM rs_user WHERE name = $1", &[&name])
        .await?
        > 0)
}

pub async fn set_user_disabled(
    client: &impl GenericClient,
    name: &str,
    disabled: bool,
) -> Result<bool, DbError> {
    let changed = client
        .execute(
            "UPDATE rs_user SET disabled = $2 WHERE name = $1",
            &[&name, &disabled],
        )
        .await?;
    Ok(changed > 0)
}

/// See `ConsolidatedConnection::session_keys`.
pub async fn session_keys(
    client: &impl GenericClient,
    new_secret: &str,
) -> Result<Vec<SessionKey>, DbError> {
    client
        .execute(
            "INSERT INTO rs_session_key (secret) SELECT $1 WHERE NOT EXISTS (SELECT 1 FROM rs_session_key)",
            &[&new_secret],
        )
        .await?;
    let rows = client
        .query("SELECT id, secret FROM rs_session_key ORDER BY id", &[])
        .await?;
    Ok(rows
        .iter()
        .map(|row| SessionKey {
            id: row.get(0),
            secret: row.get(1),
        })
        .collect())
}

/// See `ConsolidatedConnection::user_disabled`.
pub async fn user_disabled(client: &impl GenericClient, name: &str) -> Result<bool, DbError> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM rs_user WHERE name = $1 AND disabled)",
            &[&name],
        )
        .await?;
    Ok(row.get(0))
}
