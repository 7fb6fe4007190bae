"""Type stubs of the rowsync package (the extension module rowsync._rowsync)."""

import decimal
import os
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

__version__: str
sqlite_version: str
"""The version of the SQLite library rowsync calls (the one ``sqlite3`` loads)."""
sqlite_library: Optional[str]
"""The file that library was loaded from (None where the loader cannot tell)."""
MIN_SQLITE_VERSION: str
"""The oldest SQLite rowsync works with."""

Value = Union[None, int, float, decimal.Decimal, str, bytes]

class SyncError(Exception):
    """A sync or an operation on the client database failed."""

class SqliteLibraryError(SyncError):
    """Python's sqlite3 uses another SQLite library than rowsync, or it is too old."""

class BusyError(SyncError):
    """The server stayed busy through every retry: try again later."""

class AuthError(SyncError):
    """The server did not accept the user's credentials."""

class SyncProgress:
    """How far a sync has come: bytes on the wire and rows, up and down."""

    @property
    def bytes_sent(self) -> int: ...
    @property
    def bytes_received(self) -> int: ...
    @property
    def rows_uploaded(self) -> int: ...
    @property
    def rows_to_upload(self) -> int: ...
    @property
    def rows_downloaded(self) -> int: ...

class ConflictedRow:
    """An uploaded row the server did not take as sent, with the server's winning row."""

    @property
    def table(self) -> str: ...
    @property
    def key(self) -> Tuple[Value, ...]: ...
    @property
    def server_row(self) -> Optional[Dict[str, Value]]:
        """The server's row by column, or None when the server deleted it."""

class SyncReport:
    """What one sync did."""

    @property
    def rows_uploaded(self) -> int: ...
    @property
    def rows_downloaded(self) -> int: ...
    @property
    def conflicts(self) -> int: ...
    @property
    def conflicted_rows(self) -> List[ConflictedRow]: ...
    @property
    def conflicts_kept(self) -> int: ...
    @property
    def rows_rejected(self) -> int: ...
    @property
    def rounds(self) -> int: ...
    @property
    def watermark(self) -> int: ...
    @property
    def elapsed_seconds(self) -> float: ...
    @property
    def bytes_sent(self) -> int: ...
    @property
    def bytes_received(self) -> int: ...
    @property
    def busy_retries(self) -> int: ...
    @property
    def identity(self) -> Optional[str]:
        """``'copied'`` or ``'restored'`` when the server found this database was a
        copy or a restored backup and it took a new client id in this sync; else None."""

class Client:
    """A client database: a SQLite file whose tracked tables sync with a server."""

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        client_id: Optional[str] = None,
        durability: str = "full",
        durable_before_sync: Optional[bool] = None,
    ) -> None: ...
    @property
    def client_id(self) -> str: ...
    @property
    def durability(self) -> str:
        """"full", "normal", "off" or "memory"."""
    def persist(self) -> None:
        """Make every commit so far durable (the memory mode: copy it to the file)."""
    def execute(self, sql: str) -> None:
        """Run SQL statements on rowsync's connection (the memory mode's only writer)."""
    def track(self, table: str, existing: str = "upload") -> None:
        """Record every later change of `table` for upload (it needs a primary key).

        `existing`: the rows the table holds when first tracked are this app's own
        writes, uploaded as inserts ("upload"), or came from the server ("from_server")."""
    def kept_conflicts(self) -> List[Dict[str, Any]]:
        """The losing side of every conflict kept and not removed, oldest first."""
    def remove_kept_conflict(self, id: int) -> bool:
        """Remove a kept conflict the app has dealt with; whether it was there."""
    def rejected_rows(self) -> List[Dict[str, Any]]:
        """Changes the server refused and this client set aside, oldest first."""
    def requeue_rejected(self, id: int) -> bool:
        """Put a rejected change back in line for the next sync; whether it was there."""
    def remove_rejected(self, id: int) -> bool:
        """Remove a rejected change for good; whether it was there."""
    def untrack(self, table: str) -> int:
        """Stop tracking `table`; its changes not uploaded yet are set aside as rejected."""
    def next_key(self, table: str) -> int:
        """The next key of `table` from the key ranges the server handed this client."""
    def pending_changes(self) -> bool:
        """Whether changes wait for upload."""
    def sync(
        self,
        url: str,
        user: Optional[str] = None,
        password: Optional[str] = None,
        token: Optional[str] = None,
        version: Optional[str] = None,
        compression: Optional[str] = None,
        ca_file: Optional[Union[str, "os.PathLike[str]"]] = None,
        on_progress: Optional[Callable[[SyncProgress], None]] = None,
        tables: Optional[List[str]] = None,
        priorities: Optional[List[List[str]]] = None,
    ) -> SyncReport:
        """Upload recorded changes, apply the download; the GIL is released meanwhile.

        `tables` syncs only those tables; `priorities` syncs each level's tables
        first, each level committed before the next (protocol v9).

        Raises BusyError, AuthError or SyncError; conflicts are listed in the report.
        """
