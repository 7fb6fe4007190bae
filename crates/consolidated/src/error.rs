use rowsync_protocol::{ErrorCode, RefusedRow, WireError};
use thiserror::Error;

/// A failure of the consolidated database itself or of an administrative request.
/// The database driver's error is carried, not enumerated: a new backend adds no variant.
#[derive(Debug, Error)]
pub enum DbError {
    #[error("{backend}: {message}")]
    Driver {
        /// The backend's name: `sqlite`, `postgres`, `mysql`.
        backend: &'static str,
        /// The database's own words (with SQLSTATE and detail where it gives them).
        message: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("database task failed: {0}")]
    Task(String),
}

/// Why a sync's database work failed. In every case its transaction was rolled back.
#[derive(Debug, Error)]
pub enum SyncError {
    #[error("script version {0:?} does not exist")]
    UnknownScriptVersion(String),
    #[error("client id {client_id:?} is registered to another user")]
    ClientIdTaken { client_id: String },
    #[error(
        "user {user:?} already has {limit} client ids, the most the server allows \
         (client_ids_per_user_max); client id {client_id:?} is refused"
    )]
    ClientIdsExceeded {
        user: String,
        client_id: String,
        limit: u64,
    },
    #[error("{0}")]
    Schema(String),
    #[error(
        "client id {client_id:?} is already synchronizing; try again when that sync has ended"
    )]
    AlreadySynchronizing { client_id: String },
    #[error("script {event}{} failed{}: {message}", describe_table(.table), describe_row_key(.row_key))]
    Script {
        event: String,
        /// Empty for connection scripts.
        table: String,
        /// The key of the row a row script failed on, as text: `(5, 'a')`.
        row_key: Option<String>,
        /// The database's error code (SQLSTATE on PostgreSQL), empty when unknown.
        code: String,
        message: String,
    },
    #[error(
        "upload sequence {sequence} of client id {client_id:?} is out of order: expected {expected} \
         (or at most {applied}, an upload already applied); sequences start at 1 and grow by 1"
    )]
    UploadSequence {
        client_id: String,
        sequence: u64,
        /// The last sequence applied for the client (0 before its first upload).
        applied: u64,
        /// The one sequence a new upload may carry: `applied + 1`.
        expected: u64,
    },
    /// Protocol v5: the upload carries the sequence applied last under another transfer
    /// id: another copy of the client's database synced under its client id.
    #[error(
        "client id {client_id:?}: upload {sequence} was applied before as another transfer; \
         this database is a copy of the one that sent it, and needs a client id of its own"
    )]
    ClientCopied { client_id: String, sequence: u64 },
    /// Protocol v5: the upload's sequence is below the last applied: the client's
    /// database is behind its own acknowledged syncs (a restored backup, or a copy the
    /// other copy synced past).
    #[error(
        "client id {client_id:?}: upload {sequence} is below {applied}, the last applied; \
         this database was restored from a backup or copied, and needs a client id of its own"
    )]
    ClientRestored {
        client_id: String,
        sequence: u64,
        applied: u64,
    },
    #[error("authentication failed: {0}")]
    AuthenticationRefused(String),
    /// The scripts a sync started with are not its version's current ones: a backend
    /// that checks the revision inside the sync's transaction (with the client's lock)
    /// found it moved. Nothing was done; the backend loads the scripts and starts again.
    #[error("the scripts of version {version:?} changed while the sync began; try again")]
    ScriptsChanged { version: String },
    /// The apply streams' prepared transactions were rolled back by a server starting
    /// (its recovery found no decision) before this sync could record its decision; the
    /// driver applies the upload again on one stream.
    #[error("a starting server rolled back the apply streams of group {group:?}")]
    StreamsRolledBack { group: String },
    /// Protocol v6: rows of the upload failed, each tried alone (nothing was applied);
    /// `first` is the error the sync failed with.
    #[error("the upload was refused for {} of its rows (nothing was applied); the first: {first}", .rows.len())]
    RowsRefused {
        rows: Vec<RefusedRow>,
        first: Box<SyncError>,
    },
    #[error("the download's receiver went away before the sync ended")]
    DownloadAbandoned,
    #[error("the download could not be taken: {0}")]
    DownloadRefused(String),
    #[error(transparent)]
    Database(#[from] DbError),
}

impl DbError {
    /// A driver's error, described in the database's own words.
    pub fn driver(
        backend: &'static str,
        message: String,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> DbError {
        DbError::Driver {
            backend,
            message,
            source: Box::new(source),
        }
    }

    /// The driver's error of type `E`, when this is one.
    pub fn driver_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            DbError::Driver { source, .. } => source.downcast_ref::<E>(),
            _ => None,
        }
    }
}

impl SyncError {
    /// The driver's error of type `E` behind a database failure, when this is one.
    pub fn driver_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            SyncError::Database(error) => error.driver_error(),
            _ => None,
        }
    }
}

fn describe_table(table: &str) -> String {
    if table.is_empty() {
        String::new()
    } else {
        format!(" for table {table:?}")
    }
}

fn describe_row_key(row_key: &Option<String>) -> String {
    match row_key {
        Some(key) => format!(" on the row with key {key}"),
        None => String::new(),
    }
}

impl SyncError {
    /// A script failure not tied to one row.
    pub fn script(event: &str, table: &str, message: impl Into<String>) -> SyncError {
        SyncError::Script {
            event: event.to_string(),
            table: table.to_string(),
            row_key: None,
            code: String::new(),
            message: message.into(),
        }
    }

    /// This failure, pinned to the row (by its key) a row script failed on.
    pub fn with_row_key(self, key: String) -> SyncError {
        match self {
            SyncError::Script {
                event,
                table,
                code,
                message,
                ..
            } => SyncError::Script {
                event,
                table,
                row_key: Some(key),
                code,
                message,
            },
            other => other,
        }
    }

    /// What the client receives for this failure: its code and message, and for
    /// refused rows each row.
    pub fn to_wire(&self) -> WireError {
        let wire = WireError::new(self.code(), self.to_string());
        match self {
            SyncError::RowsRefused { rows, .. } => WireError {
                refused: rows.clone(),
                ..wire
            },
            _ => wire,
        }
    }

    /// The wire error code a client receives for this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            SyncError::UnknownScriptVersion(_) => ErrorCode::UnknownScriptVersion,
            SyncError::ClientIdTaken { .. } => ErrorCode::ClientIdTaken,
            SyncError::ClientIdsExceeded { .. } => ErrorCode::ClientIdsExceeded,
            SyncError::Schema(_) => ErrorCode::Schema,
            SyncError::UploadSequence { .. } => ErrorCode::Protocol,
            SyncError::ClientCopied { .. } => ErrorCode::ClientCopied,
            SyncError::ClientRestored { .. } => ErrorCode::ClientRestored,
            SyncError::AlreadySynchronizing { .. } => ErrorCode::AlreadySynchronizing,
            SyncError::Script { .. } => ErrorCode::Script,
            SyncError::RowsRefused { .. } => ErrorCode::RowsRefused,
            SyncError::AuthenticationRefused(_) => ErrorCode::AuthenticationFailed,
            SyncError::DownloadAbandoned | SyncError::Database(_) => ErrorCode::Internal,
            SyncError::DownloadRefused(_)
            | SyncError::StreamsRolledBack { .. }
            | SyncError::ScriptsChanged { .. } => ErrorCode::Internal,
        }
    }
}

impl From<crate::rules::RuleError> for DbError {
    fn from(error: crate::rules::RuleError) -> DbError {
        DbError::Invalid(error.to_string())
    }
}
