//! The rowsync client library.
//!
//! A [`Client`] owns one SQLite file. [`Client::track`] installs triggers that record
//! each change of a table in a change log (several changes to one row collapse into
//! one operation). [`Client::sync`] moves the log into an in-flight upload, sends it,
//! and applies the download in one SQLite transaction together with the upload's
//! acknowledgement. The message exchange itself is the I/O-free [`ClientSession`];
//! [`transport`] only moves bytes.

mod client;
mod durability;
mod error;
mod kept;
mod keys;
mod login;
mod rejected;
mod report;
mod session;
mod store;
mod tables;
pub mod transport;

pub use client::{
    BusyRetry, Client, SyncOptions, BUSY_RETRY_ATTEMPTS_MAX_DEFAULT,
    DOWNLOAD_KEPT_BYTES_MAX_DEFAULT, REJECTED_ROWS_MAX_DEFAULT,
};
pub use durability::{ClientOptions, Durability};
pub use error::{ClientError, FailureKind};
pub use kept::KeptConflict;
pub use rejected::RejectedRow;
pub use report::{ConflictedRow, Identity, SyncProgress, SyncReport, CONFLICTED_ROWS_REPORTED_MAX};
pub use rowsync_protocol::Compression;
pub use session::{ClientSession, CompletedSync, Received, SessionEvent};
pub use store::{ExistingRows, CLIENT_ID_BYTES, UPLOAD_MESSAGE_BYTES_MAX, UPLOAD_ROW_BYTES_MAX};
pub use transport::{HttpVersion, TlsOptions, TransportOptions, WireBytes};
