"""Sync a SQLite database with a rowsync server.

    import rowsync, sqlite3
    client = rowsync.Client("app.db")
    client.track("orders")                 # the table needs a primary key
    report = client.sync("tcp://server:2439", user="erin", password="secret")
    print(report.rows_uploaded, report.rows_downloaded, report.conflicted_rows)

The application keeps using the file with ``sqlite3``: changes to tracked tables are
recorded by triggers, whatever the connection. rowsync calls the same SQLite library
as ``sqlite3`` (the shared libsqlite3, at least ``MIN_SQLITE_VERSION``): two SQLite
libraries in one process corrupt a file both open, so ``Client`` raises
``SqliteLibraryError`` where ``sqlite3`` carries a SQLite of its own. Any other library
that brings its own SQLite (apsw, pysqlite3-binary, sqlcipher3) must not open the file.
"""

try:
    # Loaded first, the sqlite3 module's libsqlite3 is the one the extension's
    # dependency on libsqlite3.so.0 resolves to (the loader reuses a loaded soname).
    import sqlite3 as _python_sqlite3  # noqa: F401
except ImportError:  # an interpreter built without sqlite3: no second library either
    pass

from ._rowsync import (
    MIN_SQLITE_VERSION,
    AuthError,
    BusyError,
    Client,
    ConflictedRow,
    SqliteLibraryError,
    SyncError,
    SyncProgress,
    SyncReport,
    __version__,
    sqlite_library,
    sqlite_version,
)

__all__ = [
    "MIN_SQLITE_VERSION",
    "AuthError",
    "BusyError",
    "Client",
    "ConflictedRow",
    "SqliteLibraryError",
    "SyncError",
    "SyncProgress",
    "SyncReport",
    "__version__",
    "sqlite_library",
    "sqlite_version",
]
