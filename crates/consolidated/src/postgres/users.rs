//! The built-in users (`rs_user`) on PostgreSQL: listed, removed, disabled.

use tokio_postgres::GenericClient;

use crate::{DbError, LoginFailures, SessionKey, UserEntry, LOGIN_FAILURES_SHARED_MAX};

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

/// See `ConsolidatedConnection::share_login_failures`.
pub async fn share_login_failures(
    client: &impl GenericClient,
    server_id: &str,
    own: &[LoginFailures],
    since_unix_ms: i64,
) -> Result<Vec<LoginFailures>, DbError> {
    client
        .execute(
            "DELETE FROM rs_login_failure WHERE since_ms < $1",
            &[&since_unix_ms],
        )
        .await?;
    if !own.is_empty() {
        let keys: Vec<&str> = own.iter().map(|counted| counted.key.as_str()).collect();
        let failures: Vec<i64> = own.iter().map(|counted| counted.failures).collect();
        let since: Vec<i64> = own.iter().map(|counted| counted.since_unix_ms).collect();
        client
            .execute(
                "INSERT INTO rs_login_failure (server_id, failure_key, failures, since_ms)
                 SELECT $1, * FROM unnest($2::text[], $3::bigint[], $4::bigint[])
                 ON CONFLICT (server_id, failure_key)
                 DO UPDATE SET failures = excluded.failures, since_ms = excluded.since_ms",
                &[&server_id, &keys, &failures, &since],
            )
            .await?;
    }
    let rows = client
        .query(
            "SELECT failure_key, failures, since_ms FROM rs_login_failure
             WHERE server_id <> $1 AND since_ms >= $2 LIMIT $3",
            &[
                &server_id,
                &since_unix_ms,
                &(LOGIN_FAILURES_SHARED_MAX as i64),
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| LoginFailures {
            key: row.get(0),
            failures: row.get(1),
            since_unix_ms: row.get(2),
        })
        .collect())
}

/// See `ConsolidatedConnection::farm_servers`.
pub async fn farm_servers(
    client: &impl GenericClient,
    server_id: &str,
    now_unix_ms: i64,
    alive_since_unix_ms: i64,
) -> Result<u64, DbError> {
    client
        .execute(
            "INSERT INTO rs_server (server_id, beat_ms) VALUES ($1, $2)
             ON CONFLICT (server_id) DO UPDATE SET beat_ms = excluded.beat_ms",
            &[&server_id, &now_unix_ms],
        )
        .await?;
    client
        .execute(
            "DELETE FROM rs_server WHERE beat_ms < $1",
            &[&alive_since_unix_ms],
        )
        .await?;
    let alive: i64 = client
        .query_one("SELECT count(*) FROM rs_server", &[])
        .await?
        .get(0);
    Ok(alive as u64)
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
