//! SQLite's errors as rowsync's: the driver's error carried in `DbError`, script
//! failures with SQLite's result code.

use crate::{DbError, SyncError};

/// This backend's name in errors.
pub const BACKEND: &str = "sqlite";

impl From<rusqlite::Error> for DbError {
    fn from(error: rusqlite::Error) -> DbError {
        DbError::driver(BACKEND, error.to_string(), error)
    }
}

impl From<rusqlite::Error> for SyncError {
    fn from(error: rusqlite::Error) -> SyncError {
        SyncError::Database(error.into())
    }
}

pub fn script_failure(event: &str, table: &str, error: rusqlite::Error) -> SyncError {
    let code = match &error {
        rusqlite::Error::SqliteFailure(failure, _) => format!("{:?}", failure.code),
        _ => String::new(),
    };
    SyncError::Script {
        event: event.to_string(),
        table: table.to_string(),
        row_key: None,
        code,
        message: error.to_string(),
    }
}
