//! librowsync: the rowsync client (`rowsync-client`) behind a C ABI.
//!
//! Every entry point catches panics and turns them into `ROWSYNC_PANIC`; errors become a
//! status code and a message for `rowsync_last_error()` (per thread). Calls block on a
//! runtime the library owns. The header `include/rowsync.h` is generated from this file
//! by cbindgen and checked by `tests/header.rs`.

#![allow(non_camel_case_types)]

// The bundled SQLite defines the functions the compatibility crate does.
#[cfg(all(feature = "bundled-sqlite", feature = "system-sqlite-compat"))]
compile_error!("`system-sqlite-compat` is for builds without `bundled-sqlite`");

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use ::rowsync_client::{
    BusyRetry, Client, ClientError, ClientOptions, Compression, Durability, ExistingRows,
    FailureKind, SyncOptions, SyncProgress, SyncReport,
};

/// What a call did.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rowsync_status {
    ROWSYNC_OK = 0,
    /// Network, TLS, the local database, the server's scripts, anything else.
    ROWSYNC_ERROR = 1,
    /// A NULL where a value is needed, text that is not UTF-8, an unknown name.
    ROWSYNC_INVALID_ARGUMENT = 2,
    /// The server stayed busy through every retry: try again later.
    ROWSYNC_BUSY = 3,
    /// The server refused the sync (credentials, script version, ...): retrying
    /// unchanged will not help.
    ROWSYNC_REFUSED = 4,
    /// A bug in the library; the handle used may be unusable.
    ROWSYNC_PANIC = 5,
}

/// How the client database stores commits (docs/client.md §10 says what each can lose).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rowsync_durability {
    /// Every commit is on disk when it returns (SQLite WAL, synchronous=FULL).
    ROWSYNC_DURABILITY_FULL = 0,
    /// Commits reach the disk at checkpoints (WAL, synchronous=NORMAL).
    ROWSYNC_DURABILITY_NORMAL = 1,
    /// The operating system decides when (WAL, synchronous=OFF).
    ROWSYNC_DURABILITY_OFF = 2,
    /// The database lives in memory; its file gets a copy before every upload and at
    /// `rowsync_persist`. Write through `rowsync_execute`: no other connection reaches it.
    ROWSYNC_DURABILITY_MEMORY = 3,
}

/// The mode a C caller passed (an `int`, so a value outside the enum is an error, not
/// undefined behaviour).
fn durability_of(value: c_int) -> Result<Durability, Failure> {
    use rowsync_durability::*;
    [
        (ROWSYNC_DURABILITY_FULL, Durability::Full),
        (ROWSYNC_DURABILITY_NORMAL, Durability::Normal),
        (ROWSYNC_DURABILITY_OFF, Durability::Off),
        (ROWSYNC_DURABILITY_MEMORY, Durability::Memory),
    ]
    .into_iter()
    .find(|(mode, _)| *mode as c_int == value)
    .map(|(_, durability)| durability)
    .ok_or_else(|| Failure::invalid(format!("durability {value} is none of rowsync_durability")))
}

/// Where the rows a table holds when first tracked came from (`rowsync_track_with`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rowsync_existing_rows {
    /// This client's own writes: uploaded as inserts at the next sync.
    ROWSYNC_EXISTING_ROWS_UPLOAD = 0,
    /// A copy of the server's rows (seeded by a download, shipped pre-synced): not uploaded.
    ROWSYNC_EXISTING_ROWS_FROM_SERVER = 1,
}

fn existing_rows_of(value: c_int) -> Result<ExistingRows, Failure> {
    use rowsync_existing_rows::*;
    match value {
        v if v == ROWSYNC_EXISTING_ROWS_UPLOAD as c_int => Ok(ExistingRows::Upload),
        v if v == ROWSYNC_EXISTING_ROWS_FROM_SERVER as c_int => Ok(ExistingRows::FromServer),
        other => Err(Failure::invalid(format!(
            "existing rows {other} is none of rowsync_existing_rows"
        ))),
    }
}

/// A client database (opaque).
pub struct rowsync_client {
    client: Client,
    client_id: CString,
    /// The text `rowsync_kept_conflicts` last returned (valid until the next call).
    kept_conflicts: CString,
    /// The text `rowsync_rejected_rows` last returned (valid until the next call).
    rejected_rows: CString,
}

/// Where and how to sync (opaque); made by `rowsync_options_new`.
pub struct rowsync_options {
    options: SyncOptions,
}

/// What a sync did (opaque); read with the `rowsync_report_*` functions.
pub struct rowsync_report {
    report: SyncReport,
    json: CString,
}

/// How far a sync has come, given to a progress callback.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rowsync_progress {
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Upload operations sent so far, out of `rows_to_upload`.
    pub rows_uploaded: u64,
    pub rows_to_upload: u64,
    /// Rows applied from the download so far.
    pub rows_downloaded: u64,
}

/// Called on the syncing thread after each piece of the upload is sent and each
/// download message is applied. `progress` is valid during the call only.
pub type rowsync_progress_fn =
    Option<extern "C" fn(progress: *const rowsync_progress, user_data: *mut c_void)>;

struct Failure {
    status: rowsync_status,
    message: String,
    /// The server's error code, when the server ended the sync with an error.
    server_code: Option<c_int>,
}

impl Failure {
    fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(rowsync_status::ROWSYNC_INVALID_ARGUMENT, message)
    }

    fn new(status: rowsync_status, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
            server_code: None,
        }
    }
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Failure {
        let status = match error.kind() {
            FailureKind::Busy => rowsync_status::ROWSYNC_BUSY,
            FailureKind::Refused => rowsync_status::ROWSYNC_REFUSED,
            FailureKind::Failed => rowsync_status::ROWSYNC_ERROR,
        };
        Failure {
            status,
            message: error.to_string(),
            server_code: error.server_code().map(|code| code as c_int),
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    static LAST_SERVER_CODE: Cell<c_int> = const { Cell::new(NO_SERVER_CODE) };
}

/// `rowsync_last_server_code` when the last failure was not the server's.
const NO_SERVER_CODE: c_int = -1;

fn set_last_error(message: &str, server_code: Option<c_int>) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
    LAST_SERVER_CODE.with(|last| last.set(server_code.unwrap_or(NO_SERVER_CODE)));
}

/// Runs one entry point: its error or panic becomes a status and the last error.
fn guard(body: impl FnOnce() -> Result<(), Failure>) -> rowsync_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => rowsync_status::ROWSYNC_OK,
        Ok(Err(failure)) => {
            set_last_error(&failure.message, failure.server_code);
            failure.status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_last_error(&format!("internal error in librowsync: {what}"), None);
            rowsync_status::ROWSYNC_PANIC
        }
    }
}

fn runtime() -> Result<&'static tokio::runtime::Runtime, Failure> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("rowsync")
                .enable_all()
                .build()
                .map_err(|error| format!("starting the async runtime: {error}"))
        })
        .as_ref()
        .map_err(|message| Failure::new(rowsync_status::ROWSYNC_ERROR, message.clone()))
}

/// A C string argument: `None` for NULL.
///
/// # Safety
/// `text` is NULL or a NUL-terminated string valid for the call.
unsafe fn optional_text<'a>(text: *const c_char, what: &str) -> Result<Option<&'a str>, Failure> {
    if text.is_null() {
        return Ok(None);
    }
    CStr::from_ptr(text)
        .to_str()
        .map(Some)
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// # Safety
/// As [`optional_text`].
unsafe fn text<'a>(text: *const c_char, what: &str) -> Result<&'a str, Failure> {
    optional_text(text, what)?.ok_or_else(|| Failure::invalid(format!("{what} is NULL")))
}

/// # Safety
/// `handle` is NULL or a live pointer from this library of that type, not in use by
/// another thread.
unsafe fn handle<'a, T>(handle: *mut T, what: &str) -> Result<&'a mut T, Failure> {
    handle
        .as_mut()
        .ok_or_else(|| Failure::invalid(format!("{what} is NULL")))
}

/// The message of the last call on this thread that did not return `ROWSYNC_OK`
/// (empty if none). Valid until the next call on this thread.
#[no_mangle]
pub extern "C" fn rowsync_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// The server's error code (docs/protocol.md section 6: 3 `AuthenticationFailed`, 6
/// `UnknownScriptVersion`, ...) of the last call on this thread that did not return
/// `ROWSYNC_OK`, or -1 when that failure was not the server's answer (the network, the
/// client database, an argument). Lets an app tell a wrong password from other refusals
/// without reading the message.
#[no_mangle]
pub extern "C" fn rowsync_last_server_code() -> c_int {
    LAST_SERVER_CODE.with(Cell::get)
}

/// The library's version, e.g. "0.1.0" (static).
#[no_mangle]
pub extern "C" fn rowsync_version() -> *const c_char {
    static VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(version) => version,
            Err(_) => c"",
        };
    VERSION.as_ptr()
}

/// Opens (or creates) a client database. `client_id` may be NULL (a random id on first
/// open); given, it must match the database's. Free `*out` with `rowsync_close`.
///
/// # Safety
/// `path` and `client_id` are NULL or NUL-terminated; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rowsync_open(
    path: *const c_char,
    client_id: *const c_char,
    out: *mut *mut rowsync_client,
) -> rowsync_status {
    rowsync_open_with(
        path,
        client_id,
        rowsync_durability::ROWSYNC_DURABILITY_FULL as c_int,
        out,
    )
}

/// `rowsync_open` with a durability mode. Every mode but FULL makes all commits durable
/// before each upload (`rowsync_set_durable_before_sync` changes that).
///
/// `durability` is a `rowsync_durability` value; another is ROWSYNC_INVALID_ARGUMENT.
///
/// # Safety
/// As `rowsync_open`.
#[no_mangle]
pub unsafe extern "C" fn rowsync_open_with(
    path: *const c_char,
    client_id: *const c_char,
    durability: c_int,
    out: *mut *mut rowsync_client,
) -> rowsync_status {
    guard(|| {
        let out = handle(out, "out")?;
        // The app's SQLite, with the functions it lacks defined: it may be too old.
        #[cfg(feature = "system-sqlite-compat")]
        rowsync_sqlite_compat::check_version()
            .map_err(|too_old| Failure::new(rowsync_status::ROWSYNC_ERROR, too_old.to_string()))?;
        let mut options = ClientOptions::new(durability_of(durability)?);
        options.client_id = optional_text(client_id, "client_id")?.map(str::to_owned);
        let client = Client::open_with(text(path, "path")?, &options)?;
        let client_id = CString::new(client.client_id()).unwrap_or_default();
        *out = Box::into_raw(Box::new(rowsync_client {
            client,
            client_id,
            kept_conflicts: CString::default(),
            rejected_rows: CString::default(),
        }));
        Ok(())
    })
}

/// Whether every commit is made durable before an upload is sent. The memory mode
/// refuses `false` (ROWSYNC_ERROR).
///
/// # Safety
/// `client` is live.
#[no_mangle]
pub unsafe extern "C" fn rowsync_set_durable_before_sync(
    client: *mut rowsync_client,
    on: bool,
) -> rowsync_status {
    guard(|| {
        handle(client, "client")?
            .client
            .set_durable_before_sync(on)?;
        Ok(())
    })
}

/// Makes every commit so far durable: syncs the files to disk, or in the memory mode
/// replaces the file with a copy of the database.
///
/// # Safety
/// `client` is live.
#[no_mangle]
pub unsafe extern "C" fn rowsync_persist(client: *mut rowsync_client) -> rowsync_status {
    guard(|| {
        handle(client, "client")?.client.persist()?;
        Ok(())
    })
}

/// Runs SQL statements (no parameters, no results) on the client's own connection: the
/// way to write in the memory mode, where no other connection reaches the database.
///
/// # Safety
/// `client` is live; `sql` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn rowsync_execute(
    client: *mut rowsync_client,
    sql: *const c_char,
) -> rowsync_status {
    guard(|| {
        let client = handle(client, "client")?;
        let sql = text(sql, "sql")?;
        client
            .client
            .connection()
            .execute_batch(sql)
            .map_err(ClientError::from)?;
        Ok(())
    })
}

/// Closes a client database. NULL is ignored.
///
/// # Safety
/// `client` is NULL or from `rowsync_open`, and not used again.
#[no_mangle]
pub unsafe extern "C" fn rowsync_close(client: *mut rowsync_client) {
    guard(|| {
        if !client.is_null() {
            drop(Box::from_raw(client));
        }
        Ok(())
    });
}

/// The database's client id (owned by `client`, valid until `rowsync_close`); NULL if
/// `client` is NULL.
///
/// # Safety
/// `client` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rowsync_client_id(client: *const rowsync_client) -> *const c_char {
    client
        .as_ref()
        .map_or(std::ptr::null(), |client| client.client_id.as_ptr())
}

/// Records every later change of `table` for upload (the table needs a primary key).
/// Idempotent; call it again after changing the table's unique indexes.
///
/// # Safety
/// `client` is live; `table` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn rowsync_track(
    client: *mut rowsync_client,
    table: *const c_char,
) -> rowsync_status {
    guard(|| {
        let client = handle(client, "client")?;
        client.client.track(text(table, "table")?)?;
        Ok(())
    })
}

/// `rowsync_track`, saying where the rows the table already holds came from (only the
/// first call for a table looks at it). `existing` is a `rowsync_existing_rows` value;
/// another is ROWSYNC_INVALID_ARGUMENT.
///
/// # Safety
/// `client` is live; `table` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn rowsync_track_with(
    client: *mut rowsync_client,
    table: *const c_char,
    existing: c_int,
) -> rowsync_status {
    guard(|| {
        let client = handle(client, "client")?;
        let existing = existing_rows_of(existing)?;
        client.client.track_with(text(table, "table")?, existing)?;
        Ok(())
    })
}

/// Sets `*out` to the losing sides of conflicts the client database keeps, as a JSON
/// array (docs/client.md): each `{id, table, operation, key, client_row, server_row,
/// upload_sequence, recorded_at}`. The text is owned by `client` and valid until the
/// next call of this function or `rowsync_close`.
///
/// # Safety
/// `client` is live; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rowsync_kept_conflicts(
    client: *mut rowsync_client,
    out: *mut *const c_char,
) -> rowsync_status {
    guard(|| {
        let client = handle(client, "client")?;
        let out = handle(out, "out")?;
        let kept = client.client.kept_conflicts()?;
        client.kept_conflicts = json_list(kept.iter().map(|kept| kept.to_json()));
        *out = client.kept_conflicts.as_ptr();
        Ok(())
    })
}

/// Removes the kept conflict `id` (the application has dealt with it); sets `*removed`
/// to whether it was there.
///
/// # Safety
/// `client` is live; `removed` is writable.
#[no_mangle]
pub unsafe extern "C" fn rowsync_remove_kept_conflict(
    client: *mut rowsync_client,
    id: i64,
    removed: *mut bool,
) -> rowsync_status {
    guard(|| {
        let client = handle(client, "client")?;
        *handle(removed, "removed")? = client.client.remove_kept_conflict(id)?;
        Ok(())
    })
}

/// A JSON array of `items` as a C string (JSON text holds no NUL byte).
fn json_list(items: impl Iterator<Item = serde_json::Value>) -> CString {
    CString::new(serde_json::Value::Array(items.collect()).to_string()).unwrap_or_default()
}

/// Sets `*out` to the changes the server refused and the client set aside, as a JSON
/// array (docs/client.md): each `{id, table, operation, key, client_row, old_row, code,
/// reason, upload_sequence, recorded_at}`. The text is owned by `client` and valid until
/// the next call of this function or `rowsync_close`.
///
/// # Safety
/// `client` is live; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rowsync_rejected_rows(
    client: *mut rowsync_client,
    out: *mut *const c_char,
) -> rowsync_status {
    guard(|| {
        let client = handle(client, "client")?;
        let out = handle(out, "out")?;
        let rejected = client.client.rejected_rows()?;
        client.rejected_rows = json_list(rejected.iter().map(|rejected| rejected.to_json()));
        *out = client.rejected_rows.as_ptr();
        Ok(())
    })
}

/// Puts the rejected change `id` back in line for the next sync (after the application
/// fixed its row); sets `*requeued` to whether it was there.
///
/// # Safety
/// `client` is live; `requeued` is writable.
#[no_mangle]
pub unsafe extern "C" fn rowsync_requeue_rejected(
    client: *mut rowsync_client,
    id: i64,
    requeued: *mut bool,
) -> rowsync_status {
    guard(|| {
        let client = handle(client, "client")?;
        *handle(requeued, "requeued")? = client.client.requeue_rejected(id)?;
        Ok(())
    })
}

/// Removes the rejected change `id` for good; sets `*removed` to whether it was there.
///
/// # Safety
/// `client` is live; `removed` is writable.
#[no_mangle]
pub unsafe extern "C" fn rowsync_remove_rejected(
    client: *mut rowsync_client,
    id: i64,
    removed: *mut bool,
) -> rowsync_status {
    guard(|| {
        let client = handle(client, "client")?;
        *handle(removed, "removed")? = client.client.remove_rejected(id)?;
        Ok(())
    })
}

/// Stops tracking `table`; changes it logged that were not uploaded yet are set aside
/// as rejected (`rowsync_rejected_rows`), and `*set_aside` says how many.
///
/// # Safety
/// `client` is live; `table` is a NUL-terminated UTF-8 string; `set_aside` is writable.
#[no_mangle]
pub unsafe extern "C" fn rowsync_untrack(
    client: *mut rowsync_client,
    table: *const c_char,
    set_aside: *mut u64,
) -> rowsync_status {
    guard(|| {
        let client = handle(client, "client")?;
        let table = text(table, "table")?;
        *handle(set_aside, "set_aside")? = client.client.untrack(table)?;
        Ok(())
    })
}

/// Sets `*out` to the next key of `table` from the key ranges the server handed this
/// client (protocol v7, `rowsync keys` on the server): a key no other client and no
/// writer on the server is handed, for a row inserted offline. `ROWSYNC_ERROR` when no
/// key is left: sync first.
///
/// # Safety
/// `client` is live; `table` is a NUL-terminated UTF-8 string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rowsync_next_key(
    client: *mut rowsync_client,
    table: *const c_char,
    out: *mut i64,
) -> rowsync_status {
    guard(|| {
        let client = handle(client, "client")?;
        let table = text(table, "table")?;
        *handle(out, "out")? = client.client.next_key(table)?;
        Ok(())
    })
}

/// Sets `*out` to whether changes wait for upload.
///
/// # Safety
/// `client` is live; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rowsync_pending_changes(
    client: *mut rowsync_client,
    out: *mut bool,
) -> rowsync_status {
    guard(|| {
        let client = handle(client, "client")?;
        *handle(out, "out")? = client.client.has_pending_changes()?;
        Ok(())
    })
}

/// Options for syncing with the server at `url` (`tcp://host:port`, `tls://host:port`,
/// `http://host:port/path`, `https://host:port/path`): script version "v1", no
/// compression, the public web roots for TLS, busy answers retried as the server hints.
/// Free with `rowsync_options_free`.
///
/// # Safety
/// `url` is NUL-terminated; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rowsync_options_new(
    url: *const c_char,
    out: *mut *mut rowsync_options,
) -> rowsync_status {
    guard(|| {
        let out = handle(out, "out")?;
        let options = SyncOptions::new(text(url, "url")?, "", "");
        *out = Box::into_raw(Box::new(rowsync_options { options }));
        Ok(())
    })
}

/// Frees options. NULL is ignored.
///
/// # Safety
/// `options` is NULL or from `rowsync_options_new`, and not used again.
#[no_mangle]
pub unsafe extern "C" fn rowsync_options_free(options: *mut rowsync_options) {
    guard(|| {
        if !options.is_null() {
            drop(Box::from_raw(options));
        }
        Ok(())
    });
}

/// Sets one text option by name; NULL `value` clears it (to empty or to the default).
///
/// `user`, `password`, `token` (a signed JWT instead of the password), `version` (the
/// script version), `compression` (`none`, `zlib`, `zstd`), `ca_file` (PEM CAs to trust
/// instead of the web roots), `client_cert` and `client_key` (PEM files presented when
/// the server asks), `server_name` (the name the server's certificate must carry),
/// `tables` (sync only these, comma-separated; protocol v9) and `priorities` (tables
/// synced first, each level committed before the next: levels separated by `;`, tables
/// by `,`, e.g. `film;customer,rental`).
///
/// # Safety
/// `options` is live; `name` and `value` are NUL-terminated (`value` may be NULL).
#[no_mangle]
pub unsafe extern "C" fn rowsync_options_set(
    options: *mut rowsync_options,
    name: *const c_char,
    value: *const c_char,
) -> rowsync_status {
    guard(|| {
        let options = &mut handle(options, "options")?.options;
        let name = text(name, "name")?;
        let value = optional_text(value, name)?;
        let owned = value.map(str::to_owned);
        let tls = &mut options.transport.tls;
        match name {
            "user" => options.user = owned.unwrap_or_default(),
            "password" => options.password = owned.unwrap_or_default(),
            "token" => options.token = owned,
            "version" => options.script_version = owned.unwrap_or_else(|| "v1".into()),
            "compression" => {
                options.transport.compression = match value {
                    None => Compression::None,
                    Some(value) => value.parse().map_err(Failure::invalid)?,
                }
            }
            "ca_file" => tls.ca_file = owned.map(PathBuf::from),
            "client_cert" => tls.client_cert = owned.map(PathBuf::from),
            "client_key" => tls.client_key = owned.map(PathBuf::from),
            "server_name" => tls.server_name = owned,
            "tables" => options.tables = value.map(table_list).unwrap_or_default(),
            "priorities" => {
                options.priorities = value
                    .map(|levels| levels.split(';').map(table_list).collect())
                    .unwrap_or_default();
            }
            other => return Err(Failure::invalid(format!("no text option named {other:?}"))),
        }
        Ok(())
    })
}

/// Table names separated by commas, each trimmed, empty ones left out.
fn table_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|table| !table.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Retries of a sync the server answers busy (0: fail with `ROWSYNC_BUSY` at once).
///
/// # Safety
/// `options` is live.
#[no_mangle]
pub unsafe extern "C" fn rowsync_options_set_busy_retries(
    options: *mut rowsync_options,
    attempts_max: u32,
) -> rowsync_status {
    guard(|| {
        let options = &mut handle(options, "options")?.options;
        options.busy_retry = match attempts_max {
            0 => BusyRetry::Never,
            attempts_max => BusyRetry::ServerHint {
                attempts_max,
                jitter_fraction: 0.5,
            },
        };
        Ok(())
    })
}

/// Confirm each applied download to the server in a short exchange of its own.
///
/// # Safety
/// `options` is live.
#[no_mangle]
pub unsafe extern "C" fn rowsync_options_set_download_ack(
    options: *mut rowsync_options,
    enabled: bool,
) -> rowsync_status {
    guard(|| {
        handle(options, "options")?.options.download_ack = enabled;
        Ok(())
    })
}

/// Limit on connecting and on each wait for the server, in milliseconds (default 60000).
///
/// # Safety
/// `options` is live.
#[no_mangle]
pub unsafe extern "C" fn rowsync_options_set_timeout_ms(
    options: *mut rowsync_options,
    timeout_ms: u64,
) -> rowsync_status {
    guard(|| {
        handle(options, "options")?.options.timeout = Duration::from_millis(timeout_ms);
        Ok(())
    })
}

/// The C caller's progress callback, called on the thread that syncs.
struct ProgressTarget {
    callback: rowsync_progress_fn,
    user_data: *mut c_void,
}

// The callback runs on the calling thread only (the sync is driven by `block_on` there);
// `Send` is needed because the client's progress hook may be moved between polls.
unsafe impl Send for ProgressTarget {}

impl ProgressTarget {
    fn tell(&self, progress: &SyncProgress) {
        if let Some(callback) = self.callback {
            let progress = rowsync_progress {
                bytes_sent: progress.bytes_sent,
                bytes_received: progress.bytes_received,
                rows_uploaded: progress.rows_uploaded,
                rows_to_upload: progress.rows_to_upload,
                rows_downloaded: progress.rows_downloaded,
            };
            callback(&progress, self.user_data);
        }
    }
}

/// One synchronization: uploads local changes, applies the download (in one
/// transaction), and on success sets `*report_out` (free with `rowsync_report_free`).
/// Blocks until done. `progress` may be NULL; `user_data` is passed to it as is.
/// Conflicts are not an error: the sync succeeded and the report lists them.
///
/// # Safety
/// `client` and `options` are live; `report_out` is writable; `progress`, if set, is
/// safe to call with `user_data` from this thread.
#[no_mangle]
pub unsafe extern "C" fn rowsync_sync(
    client: *mut rowsync_client,
    options: *const rowsync_options,
    progress: rowsync_progress_fn,
    user_data: *mut c_void,
    report_out: *mut *mut rowsync_report,
) -> rowsync_status {
    guard(|| {
        let client = &mut handle(client, "client")?.client;
        let options = &options
            .as_ref()
            .ok_or_else(|| Failure::invalid("options is NULL"))?
            .options;
        let report_out = handle(report_out, "report_out")?;
        let mut target = ProgressTarget {
            callback: progress,
            user_data,
        };
        let target = &mut target;
        let report = runtime()?.block_on(
            client.sync_with_progress(options, &mut move |progress| target.tell(progress)),
        )?;
        let json = CString::new(report.to_json().to_string()).unwrap_or_default();
        *report_out = Box::into_raw(Box::new(rowsync_report { report, json }));
        Ok(())
    })
}

/// Frees a report. NULL is ignored.
///
/// # Safety
/// `report` is NULL or from `rowsync_sync`, and not used again.
#[no_mangle]
pub unsafe extern "C" fn rowsync_report_free(report: *mut rowsync_report) {
    guard(|| {
        if !report.is_null() {
            drop(Box::from_raw(report));
        }
        Ok(())
    });
}

/// Upload operations the server received in this sync (0 for NULL).
///
/// # Safety
/// `report` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rowsync_report_rows_uploaded(report: *const rowsync_report) -> u64 {
    report.as_ref().map_or(0, |r| r.report.rows_uploaded)
}

/// Rows the download changed here (0 for NULL).
///
/// # Safety
/// `report` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rowsync_report_rows_downloaded(report: *const rowsync_report) -> u64 {
    report.as_ref().map_or(0, |r| r.report.rows_downloaded)
}

/// Uploaded changes the server did not take as sent (it kept its own rows; 0 for NULL).
///
/// # Safety
/// `report` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rowsync_report_conflicts(report: *const rowsync_report) -> u64 {
    report.as_ref().map_or(0, |r| r.report.conflicts)
}

/// Bytes on the wire, both directions (0 for NULL).
///
/// # Safety
/// `report` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rowsync_report_bytes(
    report: *const rowsync_report,
    sent: *mut u64,
    received: *mut u64,
) {
    let wire = report.as_ref().map(|r| r.report.wire).unwrap_or_default();
    if let Some(sent) = sent.as_mut() {
        *sent = wire.sent;
    }
    if let Some(received) = received.as_mut() {
        *received = wire.received;
    }
}

/// The whole report as one JSON object, with each conflicted row (table, key, the
/// server's winning row) and `identity`: `"copied"` or `"restored"` when the server
/// found this database was a copy or a restored backup and it took a new client id in
/// this sync, else null; owned by `report`. NULL for NULL.
///
/// # Safety
/// `report` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rowsync_report_json(report: *const rowsync_report) -> *const c_char {
    report
        .as_ref()
        .map_or(std::ptr::null(), |r| r.json.as_ptr())
}
