//! Script events and the named parameters rowsync binds into scripts.
//!
//! Table scripts are *set scripts*: one statement over the whole staged upload of a
//! table. Placeholders in braces name staging tables, never values:
//! `{upload}` is the staged upload of the event's kind, `{keys}` the staged keys for
//! `upload_fetch`. Values reach scripts only as bound named parameters.

pub const UPLOAD_INSERT: &str = "upload_insert";
pub const UPLOAD_UPDATE: &str = "upload_update";
pub const UPLOAD_DELETE: &str = "upload_delete";
/// Fetches the current server rows, within the client's partition, for staged keys;
/// used to resolve conflicts (server wins).
pub const UPLOAD_FETCH: &str = "upload_fetch";
pub const DOWNLOAD_CURSOR: &str = "download_cursor";
pub const DOWNLOAD_DELETE_CURSOR: &str = "download_delete_cursor";

pub const TABLE_EVENTS: [&str; 6] = [
    UPLOAD_INSERT,
    UPLOAD_UPDATE,
    UPLOAD_DELETE,
    UPLOAD_FETCH,
    DOWNLOAD_CURSOR,
    DOWNLOAD_DELETE_CURSOR,
];

pub const UPLOAD_PLACEHOLDER: &str = "{upload}";
pub const KEYS_PLACEHOLDER: &str = "{keys}";

/// Prefix of the old-image columns in the staged upload of `upload_update`.
pub const OLD_IMAGE_PREFIX: &str = "rs_old_";

/// Named parameters a script may use, and what they hold.
pub const PARAMETERS: [(&str, &str); 6] = [
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
];
