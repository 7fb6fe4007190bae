//! The `rowsync` Python package's extension module: `rowsync-client` wrapped with PyO3.
//! Nothing of the client is written here; this file converts arguments, results and
//! errors, and releases the GIL while a sync runs.

mod sqlite;

// The SQLite functions older libraries lack (defined there, forwarding when present).
#[cfg(unix)]
use rowsync_sqlite_compat as _;

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use rowsync_client::{
    Client, ClientError, ClientOptions, Compression, ConflictedRow, Durability, ExistingRows,
    FailureKind, SyncOptions, SyncProgress, SyncReport,
};
use rowsync_protocol::{ErrorCode, Value};

create_exception!(
    rowsync,
    SyncError,
    PyException,
    "A sync or an operation on the client database failed."
);
create_exception!(
    rowsync,
    BusyError,
    SyncError,
    "The server stayed busy through every retry: try again later."
);
create_exception!(
    rowsync,
    AuthError,
    SyncError,
    "The server did not accept the user's credentials."
);

create_exception!(
    rowsync,
    SqliteLibraryError,
    SyncError,
    "The SQLite library in this process is not one rowsync can share the file with."
);

fn python_error(error: ClientError) -> PyErr {
    let message = error.to_string();
    if error.server_code() == Some(ErrorCode::AuthenticationFailed) {
        return AuthError::new_err(message);
    }
    match error.kind() {
        FailureKind::Busy => BusyError::new_err(message),
        FailureKind::Refused | FailureKind::Failed => SyncError::new_err(message),
    }
}

fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
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
        .map_err(|message| SyncError::new_err(message.clone()))
}

/// A client database: a SQLite file whose tracked tables sync with a rowsync server.
///
/// ``Client(path, client_id=None, durability="full", durable_before_sync=None)`` opens
/// or creates the file. ``client_id`` fixes the id on first open and must match
/// afterwards; by default a random id is made. ``durability`` is ``"full"`` (every
/// commit on disk), ``"normal"`` (on disk at checkpoints), ``"off"`` (the operating
/// system decides) or ``"memory"`` (the database in memory, copied to the file before
/// every upload and by :meth:`persist`); ``durable_before_sync`` (default: on in every
/// mode but full) makes every commit durable before an upload leaves. The application
/// reads and writes the file with any SQLite library (``sqlite3``), and in the memory
/// mode through :meth:`execute` only; every change to a tracked table is recorded by
/// triggers. The mode sets rowsync's own connection: give yours the same ``PRAGMA
/// synchronous``. rowsync calls the SQLite library ``sqlite3`` loaded, as two libraries in
/// one process corrupt a file both open: :class:`SqliteLibraryError` is raised, before the
/// file is opened, when ``sqlite3`` uses another one or it is older than
/// ``MIN_SQLITE_VERSION``.
#[pyclass(module = "rowsync", name = "Client")]
struct PyClient {
    client: Mutex<Client>,
    client_id: String,
}

impl PyClient {
    /// Runs `work` on the client without the GIL (a sync in another thread may hold
    /// the client, and its progress callback needs the GIL).
    fn with_client<T: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut Client) -> Result<T, ClientError> + Send,
    ) -> PyResult<T> {
        py.allow_threads(|| {
            let mut client = self
                .client
                .lock()
                .map_err(|_| SyncError::new_err("an earlier call on this client panicked"))?;
            work(&mut client).map_err(python_error)
        })
    }
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (path, client_id=None, durability="full", durable_before_sync=None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        client_id: Option<String>,
        durability: &str,
        durable_before_sync: Option<bool>,
    ) -> PyResult<PyClient> {
        if let Err(problem) = sqlite::check(py)? {
            return Err(SqliteLibraryError::new_err(problem.to_string()));
        }
        let durability = Durability::parse(durability)
            .map_err(|error| pyo3::exceptions::PyValueError::new_err(error.to_string()))?;
        let mut options = ClientOptions::new(durability);
        options.client_id = client_id;
        options.durable_before_sync = durable_before_sync.unwrap_or(options.durable_before_sync);
        let client = py
            .allow_threads(|| Client::open_with(&path, &options))
            .map_err(python_error)?;
        Ok(PyClient {
            client_id: client.client_id().to_string(),
            client: Mutex::new(client),
        })
    }

    /// This database's client id.
    #[getter]
    fn client_id(&self) -> &str {
        &self.client_id
    }

    /// Records every later change of ``table`` for upload. The table needs a primary
    /// key. Idempotent; call it again after changing the table's unique indexes.
    ///
    /// ``existing`` says where the rows the table holds when it is first tracked came
    /// from: ``"upload"`` (the default: they are this app's own writes, uploaded as
    /// inserts at the next sync) or ``"from_server"`` (a database seeded by a download
    /// or shipped pre-synced: not uploaded).
    #[pyo3(signature = (table, existing="upload"))]
    fn track(&self, py: Python<'_>, table: String, existing: &str) -> PyResult<()> {
        let existing: ExistingRows = existing
            .parse()
            .map_err(|error: ClientError| PyValueError::new_err(error.to_string()))?;
        self.with_client(py, |client| client.track_with(&table, existing))
    }

    /// The losing side of every conflict this database met and the app has not removed,
    /// oldest first: a list of dicts with ``id``, ``table``, ``operation`` (``"insert"``,
    /// ``"update"``, ``"delete"``), ``key``, ``client_row`` (the row this client uploaded;
    /// ``None`` for a delete), ``server_row`` (the server's winning row; ``None`` when the
    /// server has no such row this user may see), ``upload_sequence``, ``recorded_at``.
    /// Values are as the client's table stores them (a blob as ``{"blob": "<hex>"}``).
    fn kept_conflicts(&self, py: Python<'_>) -> PyResult<PyObject> {
        let kept = self.with_client(py, |client| client.kept_conflicts())?;
        json_list(py, kept.iter().map(|kept| kept.to_json()))
    }

    /// Removes the kept conflict ``id`` once the app has dealt with it; returns whether
    /// it was there.
    fn remove_kept_conflict(&self, py: Python<'_>, id: i64) -> PyResult<bool> {
        self.with_client(py, |client| client.remove_kept_conflict(id))
    }

    /// Every change the server refused and this client set aside (the rest of its upload
    /// went up), oldest first: a list of dicts with ``id``, ``table``, ``operation``,
    /// ``key``, ``client_row`` (``None`` for a delete), ``old_row`` (for an update, the
    /// row it started from), ``code``, ``reason`` (the server's words),
    /// ``upload_sequence``, ``recorded_at``.
    fn rejected_rows(&self, py: Python<'_>) -> PyResult<PyObject> {
        let rejected = self.with_client(py, |client| client.rejected_rows())?;
        json_list(py, rejected.iter().map(|rejected| rejected.to_json()))
    }

    /// Puts the rejected change ``id`` back in line for the next sync (after the app
    /// fixed its row); returns whether it was there.
    fn requeue_rejected(&self, py: Python<'_>, id: i64) -> PyResult<bool> {
        self.with_client(py, |client| client.requeue_rejected(id))
    }

    /// Removes the rejected change ``id`` for good; returns whether it was there.
    fn remove_rejected(&self, py: Python<'_>, id: i64) -> PyResult<bool> {
        self.with_client(py, |client| client.remove_rejected(id))
    }

    /// Stops tracking ``table``; changes it logged that were not uploaded yet are set
    /// aside as rejected. Returns how many.
    fn untrack(&self, py: Python<'_>, table: String) -> PyResult<u64> {
        self.with_client(py, |client| client.untrack(&table))
    }

    /// The next key of ``table`` from the key ranges the server handed this client: a
    /// key no other client and no writer on the server is handed, for a row inserted
    /// offline. Raises when none is left: sync first.
    fn next_key(&self, py: Python<'_>, table: String) -> PyResult<i64> {
        self.with_client(py, |client| client.next_key(&table))
    }

    /// The durability mode: ``"full"``, ``"normal"``, ``"off"`` or ``"memory"``.
    #[getter]
    fn durability(&self, py: Python<'_>) -> PyResult<&'static str> {
        self.with_client(py, |client| Ok(client.durability().name()))
    }

    /// Makes every commit so far durable: syncs the files to disk, or in the memory
    /// mode replaces the file with a copy of the database.
    fn persist(&self, py: Python<'_>) -> PyResult<()> {
        self.with_client(py, |client| client.persist())
    }

    /// Runs SQL statements (no parameters, no results) on rowsync's own connection:
    /// the way to write in the memory mode, which no other connection reaches.
    fn execute(&self, py: Python<'_>, sql: String) -> PyResult<()> {
        self.with_client(py, |client| Ok(client.connection().execute_batch(&sql)?))
    }

    /// Whether changes wait for upload.
    fn pending_changes(&self, py: Python<'_>) -> PyResult<bool> {
        self.with_client(py, |client| client.has_pending_changes())
    }

    /// One synchronization: uploads the recorded changes and applies the server's
    /// download in one transaction; returns a :class:`SyncReport`.
    ///
    /// ``url`` is ``tcp://host:port``, ``tls://host:port``, ``http://host:port/path`` or
    /// ``https://host:port/path``. Give ``password`` or a signed ``token`` (JWT).
    /// ``version`` is the server's script version (``"v1"``), ``compression`` one of
    /// ``"none"``, ``"zlib"``, ``"zstd"``, ``ca_file`` a PEM file of CAs to trust for
    /// TLS. ``on_progress(progress)`` is called with a :class:`SyncProgress` as the sync
    /// moves; an exception it raises is raised after the sync. The GIL is released while
    /// the sync runs. Raises :class:`BusyError`, :class:`AuthError` or
    /// :class:`SyncError`. Conflicts are not errors: the report lists them. ``tables``
    /// (a list of names) syncs only those tables; ``priorities`` (a list of lists)
    /// syncs each level's tables first, committed before the next (protocol v9).
    #[pyo3(signature = (url, user=None, password=None, token=None, version=None,
                        compression=None, ca_file=None, on_progress=None, tables=None,
                        priorities=None))]
    #[allow(clippy::too_many_arguments)] // The Python signature the package documents.
    fn sync(
        &self,
        py: Python<'_>,
        url: String,
        user: Option<String>,
        password: Option<String>,
        token: Option<String>,
        version: Option<String>,
        compression: Option<String>,
        ca_file: Option<PathBuf>,
        on_progress: Option<PyObject>,
        tables: Option<Vec<String>>,
        priorities: Option<Vec<Vec<String>>>,
    ) -> PyResult<PySyncReport> {
        let mut options = SyncOptions {
            tables: tables.unwrap_or_default(),
            priorities: priorities.unwrap_or_default(),
            ..SyncOptions::new(url, user.unwrap_or_default(), password.unwrap_or_default())
        };
        options.token = token;
        if let Some(version) = version {
            options.script_version = version;
        }
        if let Some(compression) = compression {
            options.transport.compression = compression
                .parse::<Compression>()
                .map_err(pyo3::exceptions::PyValueError::new_err)?;
        }
        options.transport.tls.ca_file = ca_file;
        let runtime = runtime()?;
        let mut callback_error: Option<PyErr> = None;
        let report = {
            let callback_error = &mut callback_error;
            let on_progress = on_progress.as_ref();
            self.with_client(py, move |client| {
                let mut tell = |progress: &SyncProgress| {
                    let Some(callback) = on_progress else { return };
                    if callback_error.is_some() {
                        return;
                    }
                    Python::with_gil(|py| {
                        if let Err(error) = callback.call1(py, (PySyncProgress::from(progress),)) {
                            *callback_error = Some(error);
                        }
                    });
                };
                runtime.block_on(client.sync_with_progress(&options, &mut tell))
            })?
        };
        if let Some(error) = callback_error {
            return Err(error);
        }
        PySyncReport::new(py, &report)
    }

    fn __repr__(&self) -> String {
        format!("rowsync.Client(client_id={:?})", self.client_id)
    }
}

/// How far a sync has come: bytes on the wire and rows, up and down.
#[pyclass(module = "rowsync", name = "SyncProgress", frozen, get_all)]
struct PySyncProgress {
    bytes_sent: u64,
    bytes_received: u64,
    /// Upload operations sent so far, out of ``rows_to_upload``.
    rows_uploaded: u64,
    rows_to_upload: u64,
    /// Rows applied from the download so far.
    rows_downloaded: u64,
}

impl From<&SyncProgress> for PySyncProgress {
    fn from(progress: &SyncProgress) -> PySyncProgress {
        PySyncProgress {
            bytes_sent: progress.bytes_sent,
            bytes_received: progress.bytes_received,
            rows_uploaded: progress.rows_uploaded,
            rows_to_upload: progress.rows_to_upload,
            rows_downloaded: progress.rows_downloaded,
        }
    }
}

#[pymethods]
impl PySyncProgress {
    fn __repr__(&self) -> String {
        format!(
            "rowsync.SyncProgress(rows_uploaded={}/{}, rows_downloaded={}, bytes_sent={}, bytes_received={})",
            self.rows_uploaded, self.rows_to_upload, self.rows_downloaded, self.bytes_sent, self.bytes_received
        )
    }
}

/// A row this client uploaded that the server did not take as sent: ``table``, ``key``
/// (a tuple in primary-key order), and ``server_row``, the server's row that won (a
/// dict by column), or ``None`` when the server deleted it.
#[pyclass(module = "rowsync", name = "ConflictedRow", frozen, get_all)]
struct PyConflictedRow {
    table: String,
    key: Py<PyTuple>,
    server_row: Option<Py<PyDict>>,
}

impl PyConflictedRow {
    fn new(py: Python<'_>, conflict: &ConflictedRow) -> PyResult<PyConflictedRow> {
        let key: Vec<PyObject> = conflict
            .key
            .iter()
            .map(|value| value_to_python(py, value))
            .collect::<PyResult<_>>()?;
        let server_row = match &conflict.server_row {
            None => None,
            Some(row) => {
                let dict = PyDict::new(py);
                for (column, value) in conflict.columns.iter().zip(row) {
                    dict.set_item(column, value_to_python(py, value)?)?;
                }
                Some(dict.unbind())
            }
        };
        Ok(PyConflictedRow {
            table: conflict.table.clone(),
            key: PyTuple::new(py, key)?.unbind(),
            server_row,
        })
    }
}

#[pymethods]
impl PyConflictedRow {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "rowsync.ConflictedRow(table={:?}, key={}, server_row={})",
            self.table,
            self.key.bind(py),
            self.server_row
                .as_ref()
                .map_or("None".to_string(), |row| row.bind(py).to_string())
        )
    }
}

/// What one sync did.
#[pyclass(module = "rowsync", name = "SyncReport", frozen, get_all)]
struct PySyncReport {
    rows_uploaded: u64,
    rows_downloaded: u64,
    /// Uploaded changes the server did not take as sent (it kept its own rows).
    conflicts: u64,
    /// The :class:`ConflictedRow` behind ``conflicts``.
    conflicted_rows: Py<PyList>,
    /// Conflicts whose losing side this sync kept (:meth:`Client.kept_conflicts`).
    conflicts_kept: u64,
    /// Round trips: 2 when an unacknowledged upload was resent first.
    rounds: u32,
    watermark: i64,
    elapsed_seconds: f64,
    bytes_sent: u64,
    bytes_received: u64,
    busy_retries: u32,
    /// ``"copied"`` or ``"restored"`` when the server found this database was a copy or
    /// a restored backup and it took a new client id in this sync; else None.
    identity: Option<&'static str>,
    /// Changes the server refused, set aside (:meth:`Client.rejected_rows`) while the
    /// rest of the upload went up.
    rows_rejected: u64,
}

impl PySyncReport {
    fn new(py: Python<'_>, report: &SyncReport) -> PyResult<PySyncReport> {
        let conflicted: Vec<PyConflictedRow> = report
            .conflicted_rows
            .iter()
            .map(|conflict| PyConflictedRow::new(py, conflict))
            .collect::<PyResult<_>>()?;
        let conflicted_rows = PyList::empty(py);
        for conflict in conflicted {
            conflicted_rows.append(Py::new(py, conflict)?)?;
        }
        Ok(PySyncReport {
            rows_uploaded: report.rows_uploaded,
            rows_downloaded: report.rows_downloaded,
            conflicts: report.conflicts,
            conflicted_rows: conflicted_rows.unbind(),
            conflicts_kept: report.conflicts_kept,
            rounds: report.rounds,
            watermark: report.watermark,
            elapsed_seconds: report.elapsed.as_secs_f64(),
            bytes_sent: report.wire.sent,
            bytes_received: report.wire.received,
            busy_retries: report.busy_retries,
            identity: report.identity.map(|identity| identity.as_str()),
            rows_rejected: report.rows_rejected,
        })
    }
}

#[pymethods]
impl PySyncReport {
    fn __repr__(&self) -> String {
        format!(
            "rowsync.SyncReport(rows_uploaded={}, rows_downloaded={}, conflicts={}, elapsed_seconds={:.3})",
            self.rows_uploaded, self.rows_downloaded, self.conflicts, self.elapsed_seconds
        )
    }
}

/// A protocol value as Python: None, int, float, decimal.Decimal, str, bytes; a
/// timestamp as int microseconds since 1970-01-01 UTC; a v2 value in its v1 form (a
/// boolean as 0 or 1, a uuid, date, array... as its text form, docs/types.md).
fn value_to_python(py: Python<'_>, value: &Value) -> PyResult<PyObject> {
    Ok(match value {
        Value::Null => py.None(),
        Value::Int(v) | Value::Timestamp(v) => v.into_pyobject(py)?.into_any().unbind(),
        Value::Double(v) => v.into_pyobject(py)?.into_any().unbind(),
        Value::Decimal(v) => py
            .import("decimal")?
            .getattr("Decimal")?
            .call1((v.to_string(),))?
            .unbind(),
        Value::Text(v) => v.into_pyobject(py)?.into_any().unbind(),
        Value::Blob(v) => PyBytes::new(py, v).into_any().unbind(),
        other => return value_to_python(py, &other.to_v1()),
    })
}

#[pymodule]
fn _rowsync(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add_class::<PyClient>()?;
    module.add_class::<PySyncReport>()?;
    module.add_class::<PySyncProgress>()?;
    module.add_class::<PyConflictedRow>()?;
    module.add("SyncError", py.get_type::<SyncError>())?;
    module.add("BusyError", py.get_type::<BusyError>())?;
    module.add("AuthError", py.get_type::<AuthError>())?;
    module.add("SqliteLibraryError", py.get_type::<SqliteLibraryError>())?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    module.add("sqlite_version", rusqlite::version())?;
    module.add("sqlite_library", sqlite::rowsync_library())?;
    module.add("MIN_SQLITE_VERSION", sqlite::MIN_VERSION)?;
    Ok(())
}

/// A list of Python objects made from JSON `items` (by the `json` module).
fn json_list(py: Python<'_>, items: impl Iterator<Item = serde_json::Value>) -> PyResult<PyObject> {
    let json = serde_json::Value::Array(items.collect()).to_string();
    Ok(py.import("json")?.call_method1("loads", (json,))?.unbind())
}
