//! Script events, the two forms of table script, and the named parameters rowsync binds
//! into scripts.
//!
//! A *set script* works on a whole scratch upload at once: placeholders in braces name
//! scratch tables, never values (`{upload}` is the scratch upload of the event's kind,
//! `{keys}` the scratch keys for `upload_fetch`, `{conflicts}` the scratch conflicts for
//! `resolve_conflict`). A *row script* is run once per uploaded row, with that row's
//! values bound as `:new.<column>` and `:old.<column>`. Values reach scripts only as
//! bound parameters, never as text.

// Connection events (stored with an empty table name), in the order they run.
pub const BEGIN_CONNECTION: &str = "begin_connection";
pub const AUTHENTICATE_USER: &str = "authenticate_user";
pub const BEGIN_SYNCHRONIZATION: &str = "begin_synchronization";
pub const BEGIN_UPLOAD: &str = "begin_upload";
pub const END_UPLOAD: &str = "end_upload";
pub const MODIFY_NEXT_LAST_DOWNLOAD: &str = "modify_next_last_download";
pub const BEGIN_DOWNLOAD: &str = "begin_download";
pub const END_DOWNLOAD: &str = "end_download";
pub const END_SYNCHRONIZATION: &str = "end_synchronization";
pub const DOWNLOAD_ACK: &str = "download_ack";
pub const HANDLE_ERROR: &str = "handle_error";
pub const REPORT_ERROR: &str = "report_error";

pub const CONNECTION_EVENTS: [&str; 12] = [
    BEGIN_CONNECTION,
    AUTHENTICATE_USER,
    BEGIN_SYNCHRONIZATION,
    BEGIN_UPLOAD,
    END_UPLOAD,
    MODIFY_NEXT_LAST_DOWNLOAD,
    BEGIN_DOWNLOAD,
    END_DOWNLOAD,
    END_SYNCHRONIZATION,
    DOWNLOAD_ACK,
    HANDLE_ERROR,
    REPORT_ERROR,
];

// Table events.
pub const UPLOAD_INSERT: &str = "upload_insert";
pub const UPLOAD_UPDATE: &str = "upload_update";
pub const UPLOAD_DELETE: &str = "upload_delete";
/// A set script tried before `upload_insert` where the backend runs it (PostgreSQL): a
/// plain insert with no conflict check, under a savepoint. On a unique violation the
/// sync rolls back to the savepoint and runs `upload_insert`, so conflicts are found
/// as without it; when it inserts fewer rows than were put in scratch, the scratch rows are
/// compared with the table as after any set script.
pub const UPLOAD_INSERT_FAST: &str = "upload_insert_fast";
/// Fetches the current server rows, within the client's partition, for scratch keys;
/// what the client receives for each conflict.
pub const UPLOAD_FETCH: &str = "upload_fetch";
/// Runs for conflicting uploaded rows (old, new and current images) before
/// `upload_fetch`; without it the server's row wins.
pub const RESOLVE_CONFLICT: &str = "resolve_conflict";
pub const DOWNLOAD_CURSOR: &str = "download_cursor";
pub const DOWNLOAD_DELETE_CURSOR: &str = "download_delete_cursor";
/// A query that hands the client a new range of the table's keys (protocol v7): it
/// returns one row, the range's first key and the key after its last (or no row when
/// the table's key space is used up). Run when the client has less than half a range
/// left; `rowsync keys` writes it.
pub const KEY_RANGE: &str = "key_range";
/// A query returning the groups the user belongs to (`:user`), one value per row in
/// its first column: a group-rule table's rows in those groups are the user's
/// (`rowsync rules`, docs/rules.md). Run before `begin_download`; each client's groups
/// are kept in `rs_client_group`, so that a group joined brings all its rows and a
/// group left takes them away.
pub const USER_GROUPS: &str = "user_groups";

pub const TABLE_EVENTS: [&str; 10] = [
    UPLOAD_INSERT,
    UPLOAD_INSERT_FAST,
    UPLOAD_UPDATE,
    UPLOAD_DELETE,
    RESOLVE_CONFLICT,
    UPLOAD_FETCH,
    DOWNLOAD_CURSOR,
    DOWNLOAD_DELETE_CURSOR,
    KEY_RANGE,
    USER_GROUPS,
];

pub const UPLOAD_PLACEHOLDER: &str = "{upload}";
pub const KEYS_PLACEHOLDER: &str = "{keys}";
pub const CONFLICTS_PLACEHOLDER: &str = "{conflicts}";

/// Prefix of the old-image columns in the scratch upload of `upload_update` and in
/// `{conflicts}`.
pub const OLD_IMAGE_PREFIX: &str = "rs_old_";
/// Column of `{conflicts}` naming the operation that conflicted: insert, update, delete.
pub const CONFLICT_OPERATION_COLUMN: &str = "rs_operation";

/// `authenticate_user` returns a status, as in MobiLink: 1000 valid, 2000 valid but
/// expiring soon; anything else (3000 invalid, 4000 expired, 5000 in use) refuses.
pub const AUTH_STATUS_VALID: i64 = 1000;
pub const AUTH_STATUS_VALID_EXPIRING: i64 = 2000;

/// `handle_error` returns an action, as in MobiLink: 1000 skips the offending row and
/// goes on; 3000 (and anything else) rolls the whole upload back.
pub const ERROR_ACTION_SKIP_ROW: i64 = 1000;
pub const ERROR_ACTION_ROLLBACK: i64 = 3000;

/// Whether `event` is one rowsync runs, for `table` (empty for connection events).
pub fn check_event(table: &str, event: &str) -> Result<(), String> {
    let (events, scope): (&[&str], &str) = if table.is_empty() {
        (&CONNECTION_EVENTS, "connection")
    } else {
        (&TABLE_EVENTS, "table")
    };
    if events.contains(&event) {
        return Ok(());
    }
    let hint = if table.is_empty() && TABLE_EVENTS.contains(&event) {
        " (it is a table event: name the table)"
    } else if !table.is_empty() && CONNECTION_EVENTS.contains(&event) {
        " (it is a connection event: name no table)"
    } else {
        ""
    };
    Err(format!(
        "{event:?} is not a {scope} event{hint}; {scope} events are {}",
        events.join(", ")
    ))
}

/// A table script with a scratch placeholder works on the whole upload at once; any
/// other upload or conflict script runs once per row.
pub fn is_set_script(sql: &str) -> bool {
    [UPLOAD_PLACEHOLDER, KEYS_PLACEHOLDER, CONFLICTS_PLACEHOLDER]
        .iter()
        .any(|placeholder| sql.contains(placeholder))
}

/// The download cursors' parameter naming rows the client's own upload wrote in this
/// sync (`Dialect::echo_xids`).
pub const ECHO_XID: &str = "echo_xid";

/// Named parameters every script may use, and what they hold.
pub const PARAMETERS: [(&str, &str); 7] = [
    ("user", "the authenticated user name"),
    ("client_id", "the client id from the hello"),
    ("script_version", "the script version the client syncs with"),
    (
        "last_download",
        "the watermark of the client's last applied download",
    ),
    ("upload_sequence", "the sequence number of this upload"),
    (
        "last_sync_xid",
        "PostgreSQL: the transaction id of the client's previous sync if the client applied its download, else 0",
    ),
    (
        "auth_1",
        "custom authentication parameters the client sent: :auth_1, :auth_2, ... (NULL when absent)",
    ),
];

/// Named parameters of particular events.
pub const EVENT_PARAMETERS: [(&str, &str); 11] = [
    ("new.<column>", "row scripts: the uploaded row's new values"),
    (
        "old.<column>",
        "row scripts: the row's values before the client changed it (updates, deletes)",
    ),
    (
        "current.<column>",
        "resolve_conflict row script: the row as the server holds it (NULL when gone)",
    ),
    (
        "operation",
        "resolve_conflict row script: insert, update or delete",
    ),
    (
        "password",
        "authenticate_user: the password the client sent",
    ),
    (
        "next_last_download",
        "modify_next_last_download: the watermark rowsync would send",
    ),
    (
        "watermark",
        "download_ack: the watermark the client acknowledged",
    ),
    (
        ECHO_XID,
        "download cursors, PostgreSQL: this sync's transaction id when all it wrote to the table (or its tombstones) is the client's own upload, else 0 (the default cursors leave those rows out)",
    ),
    (
        "error_message",
        "handle_error, report_error: the database's message",
    ),
    (
        "error_code",
        "handle_error, report_error: the SQLSTATE (or SQLite's error name)",
    ),
    (
        "error_event",
        "handle_error, report_error: the failing script's event; also :error_table, :error_row_key",
    ),
];
