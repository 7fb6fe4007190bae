//! One SQLite library per process. The extension links `libsqlite3.so.0` (rowsync-client
//! without `bundled-sqlite`), the library Python's `sqlite3` module loads, so the app's
//! connections and rowsync's share SQLite's per-file lock and WAL-index state. Two
//! libraries in one process do not see each other's POSIX locks: the one closing its
//! last connection checkpoints and deletes the `-wal` and `-shm` files the other still
//! uses (sqlite.org, "How To Corrupt An SQLite Database File", 2.2.1). Before a client
//! opens, [`check`] proves the library is the interpreter's (the address `sqlite3`'s
//! module resolves `sqlite3_libversion` to is rowsync's) and recent enough.

use std::ffi::{c_void, CStr};
use std::fmt;

use pyo3::prelude::*;
use rusqlite::ffi;

pub use rowsync_sqlite_compat::{MIN_VERSION, MIN_VERSION_NUMBER};

/// Set to `1`, the check that `sqlite3` and rowsync share one SQLite library is skipped:
/// for an app on an interpreter whose `sqlite3` carries its own SQLite that never opens
/// the client file through `sqlite3` (only through `Client.execute`).
pub const ALLOW_SEPARATE_ENV: &str = "ROWSYNC_ALLOW_SEPARATE_SQLITE";

/// Why rowsync refuses to open a client database in this process.
#[derive(Debug)]
pub enum LibraryProblem {
    /// The SQLite library loaded is older than [`MIN_VERSION`].
    TooOld { found: String, library: String },
    /// Python's `sqlite3` module uses another SQLite library than rowsync.
    Separate {
        sqlite3_version: String,
        rowsync_version: String,
        rowsync_library: String,
    },
}

impl fmt::Display for LibraryProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LibraryProblem::TooOld { found, library } => write!(
                f,
                "rowsync needs SQLite {MIN_VERSION} or later, and the SQLite library this \
                 process loaded ({library}) is {found}. rowsync uses the interpreter's SQLite, \
                 the one Python's sqlite3 module loads, so that both see each other's locks: \
                 install a newer libsqlite3 (or use a Python linked with one)"
            ),
            LibraryProblem::Separate {
                sqlite3_version,
                rowsync_version,
                rowsync_library,
            } => write!(
                f,
                "Python's sqlite3 module uses another SQLite library (SQLite {sqlite3_version}) \
                 than rowsync (SQLite {rowsync_version}, {rowsync_library}). Two SQLite libraries in one process do not see each \
                 other's locks and corrupt a database file both open, so rowsync refuses. \
                 Use a Python whose sqlite3 module loads the shared libsqlite3 (Debian's, \
                 Ubuntu's, Fedora's and other distributions' Pythons, pyenv's and conda's \
                 do; python-build-standalone, which uv installs, links SQLite statically). An app that \
                 never opens this file through sqlite3 (only Client.execute) may set \
                 {ALLOW_SEPARATE_ENV}=1"
            ),
        }
    }
}

/// The file the SQLite library rowsync calls was loaded from, as the dynamic loader
/// says; `None` where it cannot tell.
pub fn rowsync_library() -> Option<String> {
    #[cfg(unix)]
    {
        let address = ffi::sqlite3_libversion as *const c_void;
        // SAFETY: dladdr only reads the loader's tables; `info` is written on success.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        if unsafe { libc::dladdr(address, &mut info) } != 0 && !info.dli_fname.is_null() {
            // SAFETY: on success dli_fname is a NUL-terminated path owned by the loader.
            let name = unsafe { CStr::from_ptr(info.dli_fname) };
            return Some(name.to_string_lossy().into_owned());
        }
    }
    None
}

/// Whether Python's `_sqlite3` module calls the same `sqlite3_libversion` as rowsync:
/// the loader resolves the symbol from the module's file (or, for a module built into
/// the interpreter, the global scope). `None` where that cannot be asked.
fn same_library_as(module_file: Option<&str>) -> Option<bool> {
    #[cfg(unix)]
    {
        let ours = ffi::sqlite3_libversion as *const c_void;
        let file = match module_file {
            Some(file) => Some(std::ffi::CString::new(file).ok()?),
            None => None,
        };
        // SAFETY: dlopen of a module already loaded only counts a reference (closed
        // below); a null name is the program itself. dlsym only looks a name up.
        unsafe {
            let handle = libc::dlopen(
                file.as_ref().map_or(std::ptr::null(), |file| file.as_ptr()),
                libc::RTLD_LAZY | libc::RTLD_LOCAL,
            );
            if handle.is_null() {
                return Some(false);
            }
            let theirs = libc::dlsym(handle, c"sqlite3_libversion".as_ptr()) as *const c_void;
            libc::dlclose(handle);
            Some(theirs == ours)
        }
    }
    #[cfg(not(unix))]
    {
        let _ = module_file;
        None
    }
}

/// Checks, before a client opens, that the SQLite library is recent enough and is the
/// one Python's `sqlite3` module uses.
pub fn check(py: Python<'_>) -> PyResult<Result<(), LibraryProblem>> {
    let library = || rowsync_library().unwrap_or_else(|| "a library of this process".into());
    if rusqlite::version_number() < MIN_VERSION_NUMBER {
        return Ok(Err(LibraryProblem::TooOld {
            found: rusqlite::version().to_string(),
            library: library(),
        }));
    }
    if std::env::var(ALLOW_SEPARATE_ENV).is_ok_and(|value| value == "1") {
        return Ok(Ok(()));
    }
    // An interpreter without the module has no second SQLite through it.
    let Ok(module) = py.import("_sqlite3") else {
        return Ok(Ok(()));
    };
    let sqlite3_version: String = module.getattr("sqlite_version")?.extract()?;
    let file: Option<String> = match module.getattr("__file__") {
        Ok(file) => Some(file.extract()?),
        Err(_) => None,
    };
    let same = match same_library_as(file.as_deref()) {
        Some(same) => same,
        None => sqlite3_version == rusqlite::version(),
    };
    if same {
        Ok(Ok(()))
    } else {
        Ok(Err(LibraryProblem::Separate {
            sqlite3_version,
            rowsync_version: rusqlite::version().to_string(),
            rowsync_library: library(),
        }))
    }
}
