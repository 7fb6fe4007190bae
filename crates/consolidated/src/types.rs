use rowsync_protocol::{KeyRange, SyncSummary, SyncTables, TableUpload};

use crate::parameters::Parameters;

/// One sync's database work, assembled by the server once the whole upload is in hand.
#[derive(Debug, Clone)]
pub struct SyncRequest {
    pub client_id: String,
    /// The authenticated user: the only identity scripts ever see.
    pub user: String,
    pub script_version: String,
    pub last_download_watermark: i64,
    pub upload_sequence: u64,
    /// At most one entry per table (the server merges chunks).
    pub tables: Vec<TableUpload>,
    /// Custom authentication parameters from the hello (`:auth_1`, ...).
    pub auth_parameters: Vec<String>,
    /// Client ids (subscriptions) one user may have; a sync of a new client id beyond
    /// it is refused (`None`: no limit).
    pub client_ids_per_user_max: Option<u64>,
    /// The upload's transfer id (protocol v3 and later), recorded with the subscription
    /// when the upload is applied.
    pub transfer_id: Option<String>,
    /// The client keeps an upload's transfer id until it is acknowledged (protocol v5):
    /// an upload that is not the one applied under its sequence, or is below it, is
    /// refused as from a copied or restored database.
    pub check_identity: bool,
    /// Protocol v6: when the upload fails for some of its rows, the most rows the sync
    /// names (`RowsRefused`) before failing as a whole; 0 (older clients) fails the
    /// sync with the first row's error, as before.
    pub refused_rows_max: u64,
    /// Protocol v7: the key ranges the client holds (`None` for older clients, which
    /// are handed none).
    pub key_ranges: Option<Vec<KeyRange>>,
    /// Protocol v9: the tables the sync covers (a subset) and the watermark each was
    /// last downloaded to where it is not `last_download_watermark`, which is then the
    /// lowest of the client's tables. Whole (the default): every table from it.
    pub sync_tables: SyncTables,
}

impl SyncRequest {
    pub fn upload_operation_count(&self) -> u64 {
        self.tables
            .iter()
            .map(|table| (table.inserts.len() + table.updates.len() + table.deletes.len()) as u64)
            .sum()
    }
}

/// What a sync did, once its transaction committed; its download went to the
/// `DownloadSender`.
#[derive(Debug, Clone, Default)]
pub struct SyncOutcome {
    pub watermark: i64,
    pub summary: SyncSummary,
    /// Rows (upserts and deletes) streamed to the download.
    pub download_rows: u64,
    /// Key ranges handed to the client by this sync (protocol v7).
    pub key_ranges: Vec<KeyRange>,
    /// Time from the transaction's start until the upload was applied (the rest of the
    /// sync's database time went to the download).
    pub apply_time: std::time::Duration,
}

/// `rowsync init`: make an existing table synchronizable in a script version, or run
/// again after the table's columns changed (see `docs/schema-changes.md`).
#[derive(Debug, Clone)]
pub struct TableInit {
    pub table: String,
    /// Rows whose partition column equals the authenticated user name belong to that
    /// user's clients.
    pub partition_column: String,
    /// The version whose default scripts for the table are written. `None`: derived
    /// (`reinit::choose_version`): the newest version while no client uses it or the
    /// table is unchanged in it, else a new one named after it (`v1` → `v2`).
    pub script_version: Option<String>,
    /// When the version does not exist yet, it starts as a copy of this one (every
    /// table's scripts and the connection events), so a client moving to it keeps
    /// syncing every table. Ignored for a version that exists.
    pub based_on: Option<String>,
}

impl TableInit {
    /// Init of `table` into the named version, created empty if missing.
    pub fn new(table: &str, partition_column: &str, script_version: &str) -> TableInit {
        TableInit {
            table: table.to_string(),
            partition_column: partition_column.to_string(),
            script_version: Some(script_version.to_string()),
            based_on: None,
        }
    }
}

/// What `init_table` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitOutcome {
    /// The version whose default scripts for the table were written.
    pub script_version: String,
    /// The version was created by this init, as a copy of `based_on` if given.
    pub created: bool,
    pub based_on: Option<String>,
    /// Older versions whose default scripts for the table named columns the table no
    /// longer has, rewritten without them: (version, the dropped columns). Their
    /// clients' uploads of those columns are ignored from now on.
    pub rewritten: Vec<(String, Vec<String>)>,
    /// Scripts of older versions that name a dropped column but are not the defaults
    /// `init` wrote, left as they are for their author to change: (version, event).
    pub left_alone: Vec<(String, String)>,
}

/// A login to check with the version's `authenticate_user` script, if it has one.
#[derive(Debug, Clone)]
pub struct AuthRequest {
    pub client_id: String,
    pub user: String,
    pub password: String,
    pub script_version: String,
    pub auth_parameters: Vec<String>,
}

impl AuthRequest {
    pub fn parameters(&self) -> Parameters<'_> {
        Parameters {
            user: &self.user,
            client_id: &self.client_id,
            auth_parameters: &self.auth_parameters,
            ..Parameters::for_connection(&self.script_version)
        }
    }
}

/// Who decides a login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthCheck {
    /// The version's `authenticate_user` script returned this status.
    Script(i64),
    /// No script: the built-in user's stored argon2id hash (`None`: no such user).
    BuiltIn(Option<String>),
}

/// A client's confirmation that it applied a download (`Hello::download_ack`).
#[derive(Debug, Clone)]
pub struct DownloadAckRequest {
    pub client_id: String,
    /// The authenticated user.
    pub user: String,
    pub script_version: String,
    pub watermark: i64,
    pub auth_parameters: Vec<String>,
}

impl DownloadAckRequest {
    pub fn parameters(&self) -> Parameters<'_> {
        Parameters {
            user: &self.user,
            client_id: &self.client_id,
            last_download: self.watermark,
            table_watermarks: &[],
            auth_parameters: &self.auth_parameters,
            ..Parameters::for_connection(&self.script_version)
        }
    }
}

/// A new secret for a session key: 32 bytes from the operating system's generator, hex.
pub fn new_session_secret() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A key session tokens are signed with (`rs_session_key`): any server of a farm
/// accepts a token another one signed.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionKey {
    pub id: i64,
    pub secret: String,
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("SessionKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Refused logins one server counted under one throttle key since `since_unix_ms`
/// (`rs_login_failure`), shared so that a farm throttles as one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginFailures {
    pub key: String,
    pub failures: i64,
    pub since_unix_ms: i64,
}

/// The most rows of other servers' refused logins one read returns.
pub const LOGIN_FAILURES_SHARED_MAX: usize = 10_000;

/// A built-in user (`rs_user`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserEntry {
    pub name: String,
    pub disabled: bool,
    /// When it was added, as the database writes the time.
    pub created_at: String,
}

/// One stored script, as `rowsync script` lists and sets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptEntry {
    pub script_version: String,
    /// Empty for connection events.
    pub table: String,
    pub event: String,
    pub script: String,
}

/// What a backend answers for an acknowledgement that matched no subscription: the
/// client id registered to another user is refused as for a sync (code 10); otherwise
/// the watermark was not the last one sent (`false`, nothing recorded).
pub fn refused_acknowledgement(
    request: &DownloadAckRequest,
    owner: Option<String>,
) -> Result<bool, crate::SyncError> {
    match owner {
        Some(owner) if owner != request.user => Err(crate::SyncError::ClientIdTaken {
            client_id: request.client_id.clone(),
        }),
        _ => Ok(false),
    }
}

/// How a server applies large uploads over several connections (apply streams, see
/// docs/operations.md): one stream per `rows_per_stream_min` operations of an upload, at
/// most `streams_max`. Only PostgreSQL with `max_prepared_transactions` above 0 uses
/// more than one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApplyStreamSettings {
    /// Streams one upload is applied over at most (1: never more than the sync's own).
    pub streams_max: usize,
    /// Operations (rows) of an upload for each stream.
    pub rows_per_stream_min: u64,
    /// The longest a stream, or the sync's transaction while streams are prepared,
    /// waits for a lock, in milliseconds; beyond it the streams are aborted and the
    /// upload is applied on one stream (a prepared stream never releases its locks to
    /// a sibling, so a wait between them would never end).
    pub lock_timeout_ms: u64,
}

impl ApplyStreamSettings {
    /// One stream: uploads applied as they always were.
    pub const OFF: ApplyStreamSettings = ApplyStreamSettings {
        streams_max: 1,
        rows_per_stream_min: 10_000,
        lock_timeout_ms: 10_000,
    };

    /// The streams an upload of `rows` operations is applied over.
    pub fn streams_for(&self, rows: u64) -> usize {
        let wanted = rows / self.rows_per_stream_min.max(1);
        usize::try_from(wanted)
            .unwrap_or(usize::MAX)
            .clamp(1, self.streams_max.max(1))
    }
}

impl Default for ApplyStreamSettings {
    fn default() -> ApplyStreamSettings {
        ApplyStreamSettings::OFF
    }
}
