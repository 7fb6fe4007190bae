//! PostgreSQL's errors as rowsync's: the driver's error carried in `DbError`, script
//! failures with their SQLSTATE, and which failures a sync may retry.

use tokio_postgres::error::SqlState;

use super::statements::is_stale_statement;
use crate::{DbError, SyncError};

/// This backend's name in errors.
pub const BACKEND: &str = "postgres";

impl From<tokio_postgres::Error> for DbError {
    fn from(error: tokio_postgres::Error) -> DbError {
        DbError::driver(BACKEND, describe_postgres(&error), error)
    }
}

impl From<tokio_postgres::Error> for SyncError {
    fn from(error: tokio_postgres::Error) -> SyncError {
        SyncError::Database(error.into())
    }
}

/// Failures that a second attempt of the whole sync may not meet: a concurrent insert
/// of the same key, a serialization failure, a deadlock.
const RETRYABLE: [SqlState; 3] = [
    SqlState::UNIQUE_VIOLATION,
    SqlState::T_R_SERIALIZATION_FAILURE,
    SqlState::T_R_DEADLOCK_DETECTED,
];

/// Whether a sync failed because a prepared statement no longer fits its tables.
pub fn is_stale(error: &SyncError) -> bool {
    match error {
        SyncError::Script { code, message, .. } => {
            code == SqlState::FEATURE_NOT_SUPPORTED.code()
                && message.contains("cached plan must not change result type")
        }
        other => other
            .driver_error::<tokio_postgres::Error>()
            .is_some_and(is_stale_statement),
    }
}

pub fn is_retryable(error: &SyncError) -> bool {
    error
        .driver_error::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::code)
        .is_some_and(|code| RETRYABLE.contains(code))
}

/// A script's failure, with its SQLSTATE; a failure another attempt may not meet stays
/// a database error, so the sync is retried.
pub fn script_failure(event: &str, table: &str, error: tokio_postgres::Error) -> SyncError {
    if error.code().is_some_and(|code| RETRYABLE.contains(code)) {
        return SyncError::from(error);
    }
    SyncError::Script {
        event: event.to_string(),
        table: table.to_string(),
        row_key: None,
        code: error
            .code()
            .map_or_else(String::new, |code| code.code().to_string()),
        message: describe_postgres(&error),
    }
}

/// The database's own message (with detail and SQLSTATE) where there is one: the
/// driver's `Display` says only "db error".
pub fn describe_postgres(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let mut text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                text.push_str(&format!("; {detail}"));
            }
            text
        }
        None => {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                text.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            text
        }
    }
}
