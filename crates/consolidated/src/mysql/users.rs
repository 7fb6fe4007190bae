//! The built-in users (`rs_user`) on MariaDB: listed, removed, disabled.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::error::db;
use crate::{DbError, LoginFailures, SessionKey, UserEntry, LOGIN_FAILURES_SHARED_MAX};

/// A user's password hash for a password login: `None` for no such user, or a disabled one.
pub const PASSWORD_HASH: &str = "SELECT password_hash FROM rs_user WHERE name = ? AND disabled = 0";

pub async fn users(connection: &mut Conn) -> Result<Vec<UserEntry>, DbError> {
    let rows: Vec<(String, bool, String)> = connection
        .query("SELECT name, disabled <> 0, CAST(created_at AS CHAR) FROM rs_user ORDER BY name")
        .await
        .map_err(db)?;
    Ok(rows
        .into_iter()
        .map(|(name, disabled, created_at)| UserEntry {
            name,
            disabled,
            created_at,
        })
        .collect())
}

pub async fn remove_user(connection: &mut Conn, name: &str) -> Result<bool, DbError> {
    connection
        .exec_drop("DELETE FROM rs_user WHERE name = ?", (name,))
        .await
        .map_err(db)?;
    Ok(connection.affected_rows() > 0)
}

pub async fn set_user_disabled(
    connection: &mut Conn,
    name: &str,
    disabled: bool,
) -> Result<bool, DbError> {
    // The session counts matched rows (`client_found_rows`): disabling a disabled user
    // still finds it.
    connection
        .exec_drop(
            "UPDATE rs_user SET disabled = ? WHERE name = ?",
            (disabled, name),
        )
        .await
        .map_err(db)?;
    Ok(connection.affected_rows() > 0)
}

/// See `ConsolidatedConnection::session_keys`.
pub async fn session_keys(
    connection: &mut Conn,
    new_secret: &str,
) -> Result<Vec<SessionKey>, DbError> {
    connection
        .exec_drop(
            "INSERT INTO rs_session_key (secret) SELECT ? FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM rs_session_key)",
            (new_secret,),
        )
        .await
        .map_err(db)?;
    let rows: Vec<(i64, String)> = connection
        .query("SELECT id, secret FROM rs_session_key ORDER BY id")
        .await
        .map_err(db)?;
    Ok(rows
        .into_iter()
        .map(|(id, secret)| SessionKey { id, secret })
        .collect())
}

/// See `ConsolidatedConnection::share_login_failures`.
pub async fn share_login_failures(
    connection: &mut Conn,
    server_id: &str,
    own: &[LoginFailures],
    since_unix_ms: i64,
) -> Result<Vec<LoginFailures>, DbError> {
    connection
        .exec_drop(
            "DELETE FROM rs_login_failure WHERE since_ms < ?",
            (since_unix_ms,),
        )
        .await
        .map_err(db)?;
    connection
        .exec_batch(
            "INSERT INTO rs_login_failure (server_id, failure_key, failures, since_ms) VALUES (?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE failures = VALUES(failures), since_ms = VALUES(since_ms)",
            own.iter().map(|counted| {
                (server_id, counted.key.as_str(), counted.failures, counted.since_unix_ms)
            }),
        )
        .await
        .map_err(db)?;
    let rows: Vec<(String, i64, i64)> = connection
        .exec(
            "SELECT failure_key, failures, since_ms FROM rs_login_failure
             WHERE server_id <> ? AND since_ms >= ? LIMIT ?",
            (server_id, since_unix_ms, LOGIN_FAILURES_SHARED_MAX as u64),
        )
        .await
        .map_err(db)?;
    Ok(rows
        .into_iter()
        .map(|(key, failures, since_unix_ms)| LoginFailures {
            key,
            failures,
            since_unix_ms,
        })
        .collect())
}

/// See `ConsolidatedConnection::farm_servers`.
pub async fn farm_servers(
    connection: &mut Conn,
    server_id: &str,
    now_unix_ms: i64,
    alive_since_unix_ms: i64,
) -> Result<u64, DbError> {
    connection
        .exec_drop(
            "INSERT INTO rs_server (server_id, beat_ms) VALUES (?, ?)
             ON DUPLICATE KEY UPDATE beat_ms = VALUES(beat_ms)",
            (server_id, now_unix_ms),
        )
        .await
        .map_err(db)?;
    connection
        .exec_drop(
            "DELETE FROM rs_server WHERE beat_ms < ?",
            (alive_since_unix_ms,),
        )
        .await
        .map_err(db)?;
    let alive: Option<i64> = connection
        .query_first("SELECT count(*) FROM rs_server")
        .await
        .map_err(db)?;
    Ok(alive.unwrap_or(0) as u64)
}

/// See `ConsolidatedConnection::user_disabled`.
pub async fn user_disabled(connection: &mut Conn, name: &str) -> Result<bool, DbError> {
    let found: Option<i64> = connection
        .exec_first(
            "SELECT EXISTS (SELECT 1 FROM rs_user WHERE name = ? AND disabled <> 0)",
            (name,),
        )
        .await
        .map_err(db)?;
    Ok(found == Some(1))
}
