//! The consolidated database: the central store every client synchronizes with.
//!
//! The server sees it only through [`Consolidated`] (a connection factory) and
//! [`ConsolidatedConnection`] (what one pooled connection can do). Each backend
//! implements both and must pass the conformance suite in `tests/conformance`.
//! The SQLite backend is the embedded default.

mod cancel;
mod conflicts;
mod dialect;
mod download;
mod driver;
mod echo;
mod error;
#[cfg(feature = "failpoints")]
pub mod failpoints;
mod foreign_keys;
mod held;
mod history;
mod key_space;
pub mod mysql;
mod names;
mod parameters;
pub mod postgres;
mod reinit;
pub mod rules;
pub mod scripts;
mod shape;
pub mod shared_download;
pub mod sqlite;
pub mod stored;
mod types;
mod upload_rows;
mod url_query;
mod version_scripts;

use std::future::Future;

/// `failpoint!("name")` does nothing without the `failpoints` feature (see `failpoints`).
#[cfg(not(feature = "failpoints"))]
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {};
    (blocking $name:literal) => {};
}
use std::sync::Arc;

pub use cancel::Canceller;
pub use download::{
    download_channel, sync_and_collect, sync_and_collect_shared, CollectedSync, CursorBatch,
    DownloadMessage, DownloadSender, DOWNLOAD_BATCH_BYTES, DOWNLOAD_BATCH_ROWS,
    DOWNLOAD_CHANNEL_CHUNKS,
};
pub use error::{DbError, SyncError};
pub use held::{Direction, HeldTransfer, HoldBounds, HELD_TRANSFER_PART_BYTES};
pub use history::HistoryRecord;
pub use key_space::{key_range_script, KeyRangeInit, KeySpace, RANGE_KEYS_DEFAULT};
pub use names::quote_identifier;
/// Named parameters as a tool binds them outside a sync (`rowsync profile` runs single
/// scripts with the values a sync would give them).
pub use parameters::{positional_parameters, positional_parameters_with, Parameters, RowImages};
pub use types::new_session_secret;
pub use types::{
    ApplyStreamSettings, AuthCheck, AuthRequest, DownloadAckRequest, InitOutcome, LoginFailures,
    ScriptEntry, SessionKey, SyncOutcome, SyncRequest, TableInit, UserEntry,
    LOGIN_FAILURES_SHARED_MAX,
};

/// A table as a client declares it: each column with its SQLite affinity (`INTEGER`,
/// `REAL`, `TEXT` or `BLOB`, docs/types.md), and the primary key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTable {
    pub columns: Vec<(String, &'static str)>,
    pub key_columns: Vec<String>,
}

/// A consolidated database: hands out connections. Cheap to clone.
pub trait Consolidated: Clone + Send + Sync + 'static {
    type Connection: ConsolidatedConnection;

    fn connect(&self) -> impl Future<Output = Result<Self::Connection, DbError>> + Send;
}

/// One connection to the consolidated database. A server worker holds one only while
/// it runs a sync's database work.
pub trait ConsolidatedConnection: Send + 'static {
    /// Creates the `rs_` system tables if they are missing. Idempotent.
    fn install_system_tables(&mut self) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Adds a user or replaces its password hash (an argon2id PHC string).
    fn set_user(
        &mut self,
        name: &str,
        password_hash: &str,
    ) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Appends ended syncs to the monitor's history table (`rs_sync_history`), then
    /// drops its oldest rows beyond `rows_max`.
    fn append_sync_history(
        &mut self,
        records: &[HistoryRecord],
        rows_max: u64,
    ) -> impl Future<Output = Result<(), DbError>> + Send;

    /// The newest `limit` records of the history table, oldest first.
    fn sync_history(
        &mut self,
        limit: u64,
    ) -> impl Future<Output = Result<Vec<HistoryRecord>, DbError>> + Send;

    /// The built-in users (`rs_user`), by name.
    fn users(&mut self) -> impl Future<Output = Result<Vec<UserEntry>, DbError>> + Send;

    /// Removes a built-in user; false when there is none. Its client ids stay, and come
    /// back to it if the name is added again.
    fn remove_user(&mut self, name: &str) -> impl Future<Output = Result<bool, DbError>> + Send;

    /// Disables (or enables again) a built-in user: a disabled user's password logins
    /// are refused as a wrong password is. False when there is no such user.
    fn set_user_disabled(
        &mut self,
        name: &str,
        disabled: bool,
    ) -> impl Future<Output = Result<bool, DbError>> + Send;

    /// The stored password hash of a user, `None` if there is no such user or it is
    /// disabled.
    fn password_hash(
        &mut self,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, DbError>> + Send;

    /// Whether a built-in user of this name exists and is disabled (a token's subject
    /// need not be a built-in user; a disabled one is refused).
    fn user_disabled(&mut self, name: &str) -> impl Future<Output = Result<bool, DbError>> + Send;

    /// The keys servers sign session tokens with (`rs_session_key`), oldest first; when
    /// there is none yet, `new_secret` is stored as the first (two servers starting at
    /// once may both store one: each token names its key).
    fn session_keys(
        &mut self,
        new_secret: &str,
    ) -> impl Future<Output = Result<Vec<SessionKey>, DbError>> + Send;

    /// Shares one server's refused logins with the other servers of its database
    /// (`rs_login_failure`): stores `own` under `server_id` (each key's count replaced),
    /// drops every row counted before `since_unix_ms`, and returns the other servers'
    /// rows counted since then (at most `LOGIN_FAILURES_SHARED_MAX`).
    fn share_login_failures(
        &mut self,
        server_id: &str,
        own: &[LoginFailures],
        since_unix_ms: i64,
    ) -> impl Future<Output = Result<Vec<LoginFailures>, DbError>> + Send;

    /// Records that server `server_id` is alive at `now_unix_ms` (`rs_server`), forgets
    /// every server not heard of since `alive_since_unix_ms`, and returns how many are
    /// alive, this one included: the servers a farm's worker budget is split between.
    fn farm_servers(
        &mut self,
        server_id: &str,
        now_unix_ms: i64,
        alive_since_unix_ms: i64,
    ) -> impl Future<Output = Result<u64, DbError>> + Send;

    /// Runs the version's `authenticate_user` script in its own committed transaction, or
    /// returns the built-in user's password hash when the version has no such script.
    fn authenticate(
        &mut self,
        request: &AuthRequest,
    ) -> impl Future<Output = Result<AuthCheck, SyncError>> + Send;

    /// Records that a client applied the download ending at `request.watermark` and runs
    /// `download_ack`, in one transaction. False when that is not the watermark last sent
    /// to the client (nothing is recorded then).
    fn acknowledge_download(
        &mut self,
        request: &DownloadAckRequest,
    ) -> impl Future<Output = Result<bool, SyncError>> + Send;

    /// Every stored script, of one version or of all.
    fn scripts(
        &mut self,
        script_version: Option<&str>,
    ) -> impl Future<Output = Result<Vec<ScriptEntry>, DbError>> + Send;

    /// Stores a script (replacing the one for the same version, table and event). The
    /// version must exist and the event must be one rowsync runs.
    fn set_script(
        &mut self,
        entry: &ScriptEntry,
    ) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Removes a script; false if there was none.
    fn remove_script(
        &mut self,
        script_version: &str,
        table: &str,
        event: &str,
    ) -> impl Future<Output = Result<bool, DbError>> + Send;

    /// Adds a script version (idempotent; the description is updated).
    fn add_script_version(
        &mut self,
        name: &str,
        description: &str,
    ) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Every script version with its description.
    fn script_versions(
        &mut self,
    ) -> impl Future<Output = Result<Vec<(String, String)>, DbError>> + Send;

    /// Prepares an existing table for synchronization: change tracking (row versions and
    /// tombstones kept by triggers) and the default set scripts in the given (or derived)
    /// version, recording the columns they carry. Run again after the table changed, it
    /// refreshes the tracking, refuses to change a version clients use whose columns for
    /// the table differ (they would break), and rewrites older versions' default scripts
    /// that name a dropped column (`reinit`).
    fn init_table(
        &mut self,
        init: &TableInit,
    ) -> impl Future<Output = Result<InitOutcome, DbError>> + Send;

    /// `init_table` with the table's scripts made from its sync rule (`rules`,
    /// `rowsync rules apply`): the rule's columns only, tracking partitioned by the
    /// rule's column, and the table recorded as ruled (its partition column is then no
    /// user name).
    fn init_rule_table(
        &mut self,
        init: &TableInit,
        rules: &rules::RuleSet,
    ) -> impl Future<Output = Result<InitOutcome, DbError>> + Send;

    /// A table's columns with the SQLite affinity a client's table declares for each
    /// (docs/types.md), and its key columns; `None` when there is no such table.
    fn client_columns(
        &mut self,
        table: &str,
    ) -> impl Future<Output = Result<Option<ClientTable>, DbError>> + Send;

    /// The columns of each index of a table (the primary key's included), each in its
    /// index's order: `rowsync rules check` advises the ones a rule's joins lack.
    fn index_columns(
        &mut self,
        table: &str,
    ) -> impl Future<Output = Result<Vec<Vec<String>>, DbError>> + Send;

    /// Splits a table's key space between the clients and the server for key ranges
    /// (`rowsync keys`, see `key_space`): the server's key generator moved above the
    /// clients' part, recorded in `rs_key_space`. Run again, it keeps the split it made.
    /// The version's `key_range` script ([`key_range_script`]) is stored apart.
    fn init_key_ranges(
        &mut self,
        init: &KeyRangeInit,
    ) -> impl Future<Output = Result<KeySpace, DbError>> + Send;

    /// Runs one sync's database work in one transaction: applies the upload unless its
    /// sequence was already applied, records the sequence, and streams the download to
    /// `download` in chunks as it reads it. On any error nothing of the upload stays
    /// applied (and whatever was streamed must be discarded).
    fn run_sync_transaction(
        &mut self,
        request: Arc<SyncRequest>,
        download: DownloadSender,
    ) -> impl Future<Output = Result<SyncOutcome, SyncError>> + Send;

    /// A trivial round trip (`SELECT 1`): whether the database answers (readiness).
    fn ping(&mut self) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Whether the database is known to have closed this connection (a failover, a
    /// restart, a terminated backend), without a round trip: a pool makes a new one
    /// instead of reusing it. False where the driver cannot tell.
    fn is_closed(&self) -> bool {
        false
    }

    /// What stops this connection's statement from another task (the client of the
    /// sync it runs went away); the connection is discarded afterwards.
    fn canceller(&self) -> Canceller;

    /// Drops tombstones every subscribed client has passed: those below the lowest
    /// download watermark any client acknowledged (by sending it in its hello). Returns
    /// the number removed.
    fn cleanup(&mut self) -> impl Future<Output = Result<u64, DbError>> + Send;

    /// Resolves the apply streams a crashed server left prepared (see
    /// `driver::streams`): a group whose decision is recorded is committed, any other
    /// rolled back. Run by a server as it starts; returns the transactions resolved.
    fn resolve_prepared_streams(&mut self) -> impl Future<Output = Result<u64, DbError>> + Send {
        async { Ok(0) }
    }

    /// Holds a cut transfer of a direction (`bytes`, whose length and digest `held`
    /// gives: for an upload what the server received, for a download its whole stream):
    /// replaces whatever the client held before in that direction, if its user's. False
    /// when the client holds another user's transfer (it stays), or when the held
    /// transfers of the direction, all or the user's, would then exceed their `bounds`:
    /// nothing is held then, and the client's earlier transfer is removed too.
    fn hold_transfer(
        &mut self,
        direction: Direction,
        held: &HeldTransfer,
        bytes: &[u8],
        bounds: impl Into<HoldBounds> + Send,
    ) -> impl Future<Output = Result<bool, DbError>> + Send;

    /// What is held of a client's transfer (not its bytes), if anything.
    fn held_transfer(
        &mut self,
        direction: Direction,
        client_id: &str,
        transfer_id: &str,
    ) -> impl Future<Output = Result<Option<HeldTransfer>, DbError>> + Send;

    /// The client that holds a transfer of a direction, found by its transfer id alone
    /// (a download's receipt names only its transfer; ids are random, 128 bits), if any.
    fn held_transfer_client(
        &mut self,
        direction: Direction,
        transfer_id: &str,
    ) -> impl Future<Output = Result<Option<String>, DbError>> + Send;

    /// The first `length` bytes held of a client's transfer (fewer when less is held).
    fn held_transfer_bytes(
        &mut self,
        direction: Direction,
        client_id: &str,
        transfer_id: &str,
        length: u64,
    ) -> impl Future<Output = Result<Vec<u8>, DbError>> + Send;

    /// Removes a client's held transfer; false if there was none.
    fn release_held_transfer(
        &mut self,
        direction: Direction,
        client_id: &str,
        transfer_id: &str,
    ) -> impl Future<Output = Result<bool, DbError>> + Send;

    /// Removes the held transfers of a direction created before
    /// `created_before_unix_ms`; returns how many.
    fn expire_held_transfers(
        &mut self,
        direction: Direction,
        created_before_unix_ms: i64,
    ) -> impl Future<Output = Result<u64, DbError>> + Send;

    /// Runs administrative SQL (one or more statements, no parameters), for tools such
    /// as the demo and the benchmark. Never used with client input.
    fn execute_sql(&mut self, sql: &str) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Runs an administrative query and returns its rows.
    fn query_sql(
        &mut self,
        sql: &str,
    ) -> impl Future<Output = Result<Vec<rowsync_protocol::Row>, DbError>> + Send;
}
