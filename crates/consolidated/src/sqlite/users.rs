//! The built-in users (`rs_user`) on SQLite: listed, removed, disabled.

use rusqlite::{params, Connection};

use crate::{DbError, LoginFailures, SessionKey, UserEntry, LOGIN_FAILURES_SHARED_MAX};

/// A user's password hash for a password login: `None` for no such user, or a disabled one.
pub const PASSWORD_HASH: &str =
    "SELECT password_hash FROM rs_user WHERE name = ?1 AND disabled = 0";

pub fn users(connection: &Connection) -> Result<Vec<UserEntry>, DbError> {
    let mut statement =
        connection.prepare("SELECT name, disabled, created_at FROM rs_user ORDER BY name")?;
    let users = statement
        .query_map([], |row| {
            Ok(UserEntry {
                name: row.get(0)?,
                disabled: row.get(1)?,
                created_at: row.get(2)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(users)
}

pub fn remove_user(connection: &Connection, name: &str) -> Result<bool, DbError> {
    Ok(connection.execute("DELETE FROM rs_user WHERE name = ?1", [name])? > 0)
}

pub fn set_user_disabled(
    connection: &Connection,
    name: &str,
    disabled: bool,
) -> Result<bool, DbError> {
    let changed = connection.execute(
        "UPDATE rs_user SET disabled = ?2 WHERE name = ?1",
        params![name, disabled],
    )?;
    Ok(changed > 0)
}

/// See `ConsolidatedConnection::session_keys`.
pub fn session_keys(connection: &Connection, new_secret: &str) -> Result<Vec<SessionKey>, DbError> {
    connection.execute(
        "INSERT INTO rs_session_key (secret) SELECT ?1 WHERE NOT EXISTS (SELECT 1 FROM rs_session_key)",
        [new_secret],
    )?;
    let mut statement = connection.prepare("SELECT id, secret FROM rs_session_key ORDER BY id")?;
    let keys = statement
        .query_map([], |row| {
            Ok(SessionKey {
                id: row.get(0)?,
                secret: row.get(1)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(keys)
}

/// See `ConsolidatedConnection::share_login_failures`.
pub fn share_login_failures(
    connection: &Connection,
    server_id: &str,
    own: &[LoginFailures],
    since_unix_ms: i64,
) -> Result<Vec<LoginFailures>, DbError> {
    connection.execute(
        "DELETE FROM rs_login_failure WHERE since_ms < ?1",
        [since_unix_ms],
    )?;
    let mut upsert = connection.prepare(
        "INSERT INTO rs_login_failure (server_id, failure_key, failures, since_ms) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (server_id, failure_key) DO UPDATE SET failures = excluded.failures, since_ms = excluded.since_ms",
    )?;
    for counted in own {
        upsert.execute(params![
            server_id,
            counted.key,
            counted.failures,
            counted.since_unix_ms
        ])?;
    }
    let mut statement = connection.prepare(
        "SELECT failure_key, failures, since_ms FROM rs_login_failure
         WHERE server_id <> ?1 AND since_ms >= ?2 LIMIT ?3",
    )?;
    let rows = statement
        .query_map(
            params![server_id, since_unix_ms, LOGIN_FAILURES_SHARED_MAX as i64],
            |row| {
                Ok(LoginFailures {
                    key: row.get(0)?,
                    failures: row.get(1)?,
                    since_unix_ms: row.get(2)?,
                })
            },
        )?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// See `ConsolidatedConnection::farm_servers`.
pub fn farm_servers(
    connection: &Connection,
    server_id: &str,
    now_unix_ms: i64,
    alive_since_unix_ms: i64,
) -> Result<u64, DbError> {
    connection.execute(
        "INSERT INTO rs_server (server_id, beat_ms) VALUES (?1, ?2)
         ON CONFLICT (server_id) DO UPDATE SET beat_ms = excluded.beat_ms",
        params![server_id, now_unix_ms],
    )?;
    connection.execute(
        "DELETE FROM rs_server WHERE beat_ms < ?1",
        [alive_since_unix_ms],
    )?;
    let alive: i64 =
        connection.query_row("SELECT count(*) FROM rs_server", [], |row| row.get(0))?;
    Ok(alive as u64)
}

/// See `ConsolidatedConnection::user_disabled`.
pub fn user_disabled(connection: &Connection, name: &str) -> Result<bool, DbError> {
    Ok(connection.query_row(
        "SELECT EXISTS (SELECT 1 FROM rs_user WHERE name = ?1 AND disabled <> 0)",
        [name],
        |row| row.get(0),
    )?)
}
