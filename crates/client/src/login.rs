//! The session token the server handed out after a password login (protocol v8), kept
//! in `rs_client_login` per server address and user, and sent in the next hellos (with
//! the password) until it expires: those syncs skip the server's password check.

use std::time::{SystemTime, UNIX_EPOCH};

use rowsync_protocol::SessionToken;
use rusqlite::{params, Connection, OptionalExtension};

use crate::ClientError;

/// The client's session tokens: one per server address and user.
pub const LOGIN_DDL: &str = "
CREATE TABLE IF NOT EXISTS rs_client_login (
    server TEXT NOT NULL,
    user_name TEXT NOT NULL,
    token TEXT NOT NULL,
    expires_unix INTEGER NOT NULL,
    PRIMARY KEY (server, user_name)
);
";

/// Seconds before a token's expiry from which the client no longer sends it (a clock
/// that runs slow, or a sync that starts just before the end).
const EXPIRY_MARGIN_SECONDS: i64 = 60;

/// The session token kept for `user` at `server`, unless it is about to expire.
pub fn token(
    connection: &Connection,
    server: &str,
    user: &str,
) -> Result<Option<String>, ClientError> {
    let token = connection
        .query_row(
            "SELECT token FROM rs_client_login
             WHERE server = ?1 AND user_name = ?2 AND expires_unix > ?3",
            params![server, user, unix_now() + EXPIRY_MARGIN_SECONDS],
            |row| row.get(0),
        )
        .optional()?;
    Ok(token)
}

/// Keeps a session token the server handed out for `user` at `server`.
pub fn keep(
    connection: &Connection,
    server: &str,
    user: &str,
    session_token: &SessionToken,
) -> Result<(), ClientError> {
    connection.execute(
        "INSERT OR REPLACE INTO rs_client_login (server, user_name, token, expires_unix)
         VALUES (?1, ?2, ?3, ?4)",
        params![
            server,
            user,
            session_token.token,
            unix_now() + i64::from(session_token.expires_in_seconds)
        ],
    )?;
    Ok(())
}

/// Forgets the session token of `user` at `server`.
pub fn forget(connection: &Connection, server: &str, user: &str) -> Result<(), ClientError> {
    connection.execute(
        "DELETE FROM rs_client_login WHERE server = ?1 AND user_name = ?2",
        params![server, user],
    )?;
    Ok(())
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs() as i64)
}
