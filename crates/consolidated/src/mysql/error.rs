//! MySQL's errors as rowsync's: the server's own words with its error number and
//! SQLSTATE, and which failures a sync may meet again on a second attempt.

use crate::{DbError, SyncError};

/// Server error numbers a second attempt of the whole sync may not meet.
const DUPLICATE_KEY: u16 = 1062;
const LOCK_WAIT_TIMEOUT: u16 = 1205;
const DEADLOCK: u16 = 1213;
/// A lock not granted at once (`innodb_lock_wait_timeout = 0`; MySQL's NOWAIT error).
pub const LOCK_NOT_GRANTED: [u16; 2] = [LOCK_WAIT_TIMEOUT, 3572];

/// The database's words: message, error number and SQLSTATE.
pub fn describe(error: &mysql_async::Error) -> String {
    match error {
        mysql_async::Error::Server(server) => format!(
            "{} (error {}, SQLSTATE {})",
            server.message, server.code, server.state
        ),
        other => other.to_string(),
    }
}

/// A driver error as rowsync's database error.
pub fn db(error: mysql_async::Error) -> DbError {
    DbError::driver("mysql", describe(&error), error)
}

/// Whether a sync failed with an error a second attempt may not meet.
pub fn may_retry(error: &SyncError) -> bool {
    error
        .driver_error::<mysql_async::Error>()
        .is_some_and(is_retryable)
}

/// A scratch value its column refused (strict mode's data errors: SQLSTATE class 22, or
/// 1366 "incorrect value", which MariaDB reports as HY000).
pub fn refused_value(table: &str, error: mysql_async::Error) -> SyncError {
    let refused = match &error {
        mysql_async::Error::Server(server) => server.state.starts_with("22") || server.code == 1366,
        _ => false,
    };
    if refused {
        SyncError::Schema(format!(
            "upload of table {table:?} holds a value its column cannot take: {}",
            describe(&error)
        ))
    } else {
        SyncError::Database(db(error))
    }
}

pub fn server_code(error: &mysql_async::Error) -> Option<u16> {
    match error {
        mysql_async::Error::Server(server) => Some(server.code),
        _ => None,
    }
}

/// Whether a failure may pass on a second attempt of the sync: a concurrent insert of
/// the same key, a lock wait timeout, a deadlock.
pub fn is_retryable(error: &mysql_async::Error) -> bool {
    server_code(error)
        .is_some_and(|code| [DUPLICATE_KEY, LOCK_WAIT_TIMEOUT, DEADLOCK].contains(&code))
}

/// A script's failure; failures a second attempt may not meet stay database errors,
/// so the sync runs again.
pub fn script_failure(event: &str, table: &str, error: mysql_async::Error) -> SyncError {
    if is_retryable(&error) {
        return SyncError::Database(db(error));
    }
    row_script_failure(event, table, error)
}

/// A row script's failure: always the script's (a duplicate key is that row's fault).
pub fn row_script_failure(event: &str, table: &str, error: mysql_async::Error) -> SyncError {
    let code = match &error {
        mysql_async::Error::Server(server) => server.state.clone(),
        _ => String::new(),
    };
    SyncError::Script {
        event: event.to_string(),
        table: table.to_string(),
        row_key: None,
        code,
        message: describe(&error),
    }
}
