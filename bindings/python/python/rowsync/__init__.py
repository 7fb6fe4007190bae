"""Sync a SQLite database with a rowsync server.

    import rowsync, sqlite3
    client = rowsync.Client("app.db")
    client.track("orders")                 # the table needs a primary key
    report = client.sync("tcp://server:2439", user="erin", password="secret")
    print(report.rows_uploaded, report.rows_downloaded, report.conflicted_rows)

The application keeps using the file with ``sqlite3`` (or any SQLite library):
changes to tracked tables are recorded by triggers, whatever the connection.
"""

from ._rowsync import (
    AuthError,
    BusyError,
    Client,
    ConflictedRow,
    SyncError,
    SyncProgress,
    SyncReport,
    __version__,
)

__all__ = [
    "AuthError",
    "BusyError",
    "Client",
    "ConflictedRow",
    "SyncError",
    "SyncProgress",
    "SyncReport",
    "__version__",
]
