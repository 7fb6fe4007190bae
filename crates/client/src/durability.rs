//! How firmly the client database holds a commit: the durability modes, the SQLite
//! settings each maps to, and making everything durable before an upload leaves.
//!
//! What each mode can lose is in docs/client.md §10. The rule that keeps every mode
//! convergent: an upload is never sent unless the in-flight record of it (the upload
//! and its sequence) is as durable as the mode can make it, because a server that
//! applied upload `n` acknowledges any later upload numbered `n` without reading it.

use std::fs::File;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, MAIN_DB};

use crate::ClientError;

/// How the client database stores commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Durability {
    /// WAL, `synchronous=FULL`: a commit is on disk when it returns.
    #[default]
    Full,
    /// WAL, `synchronous=NORMAL`: a commit is in the operating system when it returns
    /// and on disk after the next checkpoint.
    Normal,
    /// WAL, `synchronous=OFF`: SQLite never waits for the disk; the operating system
    /// writes when it chooses.
    Off,
    /// The database lives in this process's memory; the file holds a copy, replaced
    /// atomically before every upload and by [`Client::persist`](crate::Client::persist).
    Memory,
}

impl Durability {
    pub const ALL: [Durability; 4] = [
        Durability::Full,
        Durability::Normal,
        Durability::Off,
        Durability::Memory,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Durability::Full => "full",
            Durability::Normal => "normal",
            Durability::Off => "off",
            Durability::Memory => "memory",
        }
    }

    pub fn parse(text: &str) -> Result<Durability, ClientError> {
        Durability::ALL
            .into_iter()
            .find(|mode| mode.name() == text)
            .ok_or_else(|| {
                ClientError::Option(format!(
                    "unknown durability {text:?}: full, normal, off or memory"
                ))
            })
    }

    /// Whether the client makes everything durable before an upload unless told
    /// otherwise: in every mode weaker than `Full` (where each commit already is).
    pub fn durable_before_sync_default(self) -> bool {
        self != Durability::Full
    }

    /// SQLite's `synchronous` setting for this mode.
    pub fn synchronous(self) -> &'static str {
        match self {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
            Durability::Off | Durability::Memory => "OFF",
        }
    }
}

/// How to open a client database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// Fixes the client id on first open (it must match after); `None` makes a random one.
    pub client_id: Option<String>,
    pub durability: Durability,
    /// Make every commit durable (fsync, or the memory mode's copy) before an upload is
    /// sent, as UltraLite flushed at the start of each synchronization. `Memory` needs it.
    pub durable_before_sync: bool,
}

impl ClientOptions {
    pub fn new(durability: Durability) -> ClientOptions {
        ClientOptions {
            client_id: None,
            durability,
            durable_before_sync: durability.durable_before_sync_default(),
        }
    }
}

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        ClientOptions::new(Durability::default())
    }
}

/// Opens the connection `options.durability` asks for on `path`.
pub fn open(path: &Path, options: &ClientOptions) -> Result<Connection, ClientError> {
    if options.durability == Durability::Memory && !options.durable_before_sync {
        return Err(memory_needs_persist());
    }
    let connection = match options.durability {
        Durability::Memory => open_memory(path)?,
        _ => {
            let connection = Connection::open(path)?;
            connection.busy_timeout(BUSY_TIMEOUT)?;
            connection.pragma_update(None, "journal_mode", "WAL")?;
            connection
        }
    };
    connection.pragma_update(None, "synchronous", options.durability.synchronous())?;
    Ok(connection)
}

pub fn memory_needs_persist() -> ClientError {
    ClientError::Option(
        "the memory mode copies the database to its file before every upload; \
         durable_before_sync cannot be off there"
            .into(),
    )
}

/// How long a statement waits for another connection's lock.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// An in-memory database holding what the file at `path` holds (empty if none).
///
/// It lives in SQLite's `memdb` VFS (an ordinary pager over memory, one private
/// database per connection), not in a `:memory:` database: there the page cache holds
/// every page, and once a B-tree rebalance has parked a page at the lock page's number
/// (which it does whenever it reorders siblings, as inserts into freed pages do), each
/// commit scans the cache's whole hash table, so every transaction costs time in
/// proportion to the database's size (a tracked update at 576,000 records ran at a
/// tenth of its untracked speed). `memdb`'s cache is bounded like a file's.
fn open_memory(path: &Path) -> Result<Connection, ClientError> {
    let mut memory = Connection::open_with_flags_and_vfs(
        memory_database_name(),
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        c"memdb",
    )?;
    if path.exists() {
        // A file last used in WAL mode: fold its log in and drop it, so the copy read
        // is whole and no stale log is left beside the copies written later.
        let file = Connection::open(path)?;
        file.busy_timeout(BUSY_TIMEOUT)?;
        file.pragma_update(None, "journal_mode", "DELETE")?;
        // A memdb database takes a copy only of its own page size.
        let page_size: i64 = file.pragma_query_value(None, "page_size", |row| row.get(0))?;
        drop(file);
        memory.pragma_update(None, "page_size", page_size)?;
        memory.restore(MAIN_DB, path, None::<fn(rusqlite::backup::Progress)>)?;
    }
    Ok(memory)
}

/// A name no other connection of this process uses; without a leading `/`, `memdb`
/// keeps the database private to the connection that opened it.
fn memory_database_name() -> String {
    static OPENED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let number = OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("rowsync-memory-{}-{number}", std::process::id())
}

/// Makes every commit so far durable: the memory mode writes its copy, the file modes
/// sync the database, its log and their directory to disk.
pub fn persist(
    connection: &Connection,
    path: &Path,
    durability: Durability,
) -> Result<(), ClientError> {
    match durability {
        Durability::Memory => write_copy(connection, path),
        _ => sync_files(path),
    }
}

/// Replaces the file with a copy of the in-memory database: written beside it, synced,
/// renamed over it (atomic), so the file is always one whole copy.
fn write_copy(connection: &Connection, path: &Path) -> Result<(), ClientError> {
    let temporary = with_suffix(path, ".rowsync-copy");
    remove_if_present(&temporary)?;
    // The backup API, not `VACUUM INTO`: that would write into the memdb VFS too.
    let mut copy = Connection::open(&temporary)?;
    let backup = rusqlite::backup::Backup::new(connection, &mut copy)?;
    let step = backup.step(-1)?;
    drop(backup);
    drop(copy);
    if step != rusqlite::backup::StepResult::Done {
        let stopped = format!("copying the memory database stopped early ({step:?})");
        return Err(file_error(&temporary, std::io::Error::other(stopped)));
    }
    sync_file(&temporary)?;
    std::fs::rename(&temporary, path).map_err(|source| file_error(path, source))?;
    sync_directory(path)
}

fn sync_files(path: &Path) -> Result<(), ClientError> {
    sync_file(path)?;
    let log = with_suffix(path, "-wal");
    if log.exists() {
        sync_file(&log)?;
    }
    sync_directory(path)
}

fn sync_file(path: &Path) -> Result<(), ClientError> {
    File::open(path)
        .and_then(|file| file.sync_all())
        .map_err(|source| file_error(path, source))
}

fn sync_directory(path: &Path) -> Result<(), ClientError> {
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    sync_file(directory)
}

fn remove_if_present(path: &Path) -> Result<(), ClientError> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(file_error(path, error)),
        _ => Ok(()),
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn file_error(path: &Path, source: std::io::Error) -> ClientError {
    ClientError::File {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(connection: &Connection) -> i64 {
        connection
            .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .unwrap()
    }

    #[test]
    fn the_memory_mode_reads_a_file_of_any_page_size_and_writes_it_back_whole() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("client.db");
        let file = Connection::open(&path).unwrap();
        file.execute_batch(
            "PRAGMA page_size = 8192; PRAGMA journal_mode = WAL;
             CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000)
             INSERT INTO t (v) SELECT 'row' FROM n;",
        )
        .unwrap();
        drop(file);

        let options = ClientOptions::new(Durability::Memory);
        let memory = open(&path, &options).unwrap();
        assert_eq!(count(&memory), 1000);
        memory
            .execute("INSERT INTO t (v) VALUES ('written in memory')", [])
            .unwrap();
        // A second memory connection is a database of its own, not this one.
        let other = open(&directory.path().join("other.db"), &options).unwrap();
        other.execute_batch("CREATE TABLE t (k INTEGER)").unwrap();
        assert_eq!(count(&other), 0);
        persist(&memory, &path, Durability::Memory).unwrap();
        drop(memory);

        let file = Connection::open(&path).unwrap();
        assert_eq!(count(&file), 1001);
        let page_size: i64 = file
            .pragma_query_value(None, "page_size", |row| row.get(0))
            .unwrap();
        assert_eq!(page_size, 8192);
    }
}
