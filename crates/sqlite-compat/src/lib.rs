//! The SQLite functions rusqlite 0.41 calls that older libraries lack, so a program
//! that links the system's SQLite (the Python package, librowsync built without
//! `bundled-sqlite`) loads with one as old as [`MIN_VERSION`] (Debian 12 has 3.40.1,
//! Ubuntu 22.04 3.37.2; rusqlite 0.41 calls 3.44's client data functions). Defined
//! here, these names are what the program's calls bind to (a program links this crate
//! with `use rowsync_sqlite_compat as _;`); each forwards to the library's own function
//! when it has one (looked up once in the very library `sqlite3_libversion` came from),
//! and otherwise does what rowsync needs:
//!
//! * `sqlite3_changes64` (3.37.0): `sqlite3_changes`, exact below 2^31 rows;
//! * `sqlite3_error_offset` (3.38.0): -1, "no offset" (only error messages use it);
//! * `sqlite3_db_name` (3.39.0): NULL, "no such database", and `sqlite3_is_interrupted`
//!   (3.41.0): 0. rowsync calls neither; a static librowsync.a still refers to them
//!   (rusqlite's `Connection::db_name` and `is_interrupted`);
//! * `sqlite3_set_clientdata` / `sqlite3_get_clientdata` (3.44.0): a table by
//!   connection and name. rusqlite keeps its callbacks there (busy handler, trace,
//!   hooks); rowsync installs none, and only clears the busy handler's slot (every
//!   `busy_timeout`), so nothing is ever kept. Were a callback kept, this table could
//!   not run its destructor when the connection closes (SQLite does, there).
//!
//! Unix only: elsewhere a system SQLite must be at least 3.44. Never with rusqlite's
//! `bundled` (the bundled SQLite defines the same names), nor in a program that links
//! SQLite statically (its own `sqlite3.c`, 3.44 or later: it needs none of this).

/// The oldest SQLite the client works with: `RETURNING` (3.35.0) records an upload's
/// transfer. Measured with the Python package's tests against each library as the
/// whole process's SQLite (`LD_LIBRARY_PATH`): 3.33.0 fails (`near "RETURNING": syntax
/// error`); 3.35.4, 3.36.0, 3.40.1 and 3.54.1 pass. The memory durability mode needs
/// the `memdb` VFS too: built in since 3.36.0, before it only with
/// `SQLITE_ENABLE_DESERIALIZE`.
pub const MIN_VERSION_NUMBER: i32 = 3_035_004;
pub const MIN_VERSION: &str = "3.35.4";

/// The SQLite library this process calls is older than [`MIN_VERSION`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooOld {
    /// The version the library reports.
    pub found: String,
}

impl std::fmt::Display for TooOld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rowsync needs SQLite {MIN_VERSION} or later, and the SQLite library this process \
             loaded is {}",
            self.found
        )
    }
}

impl std::error::Error for TooOld {}

/// Whether the SQLite library this process calls is at least [`MIN_VERSION`].
pub fn check_version() -> Result<(), TooOld> {
    if rusqlite::version_number() < MIN_VERSION_NUMBER {
        return Err(TooOld {
            found: rusqlite::version().to_string(),
        });
    }
    Ok(())
}

// Not in this crate's own test binary, which cargo builds despite `test = false` when
// `cargo test` is given a name filter (`scripts/test some_test`): it links the
// workspace's bundled SQLite, whose names these are.
#[cfg(all(unix, not(test)))]
mod shims;
