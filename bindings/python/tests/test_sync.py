"""The rowsync package against a real `rowsync serve` (the binary cargo built; set
ROWSYNC_BIN to use another): rows both ways, writes through Python's sqlite3, the
conflicted rows, progress, typed errors, and the GIL released while syncing."""

import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from contextlib import closing
from pathlib import Path

import pytest

import rowsync

ROOT = Path(__file__).resolve().parents[3]
ROWSYNC_BIN = os.environ.get("ROWSYNC_BIN", str(ROOT / "target" / "debug" / "rowsync"))
ORDERS = (
    "CREATE TABLE orders (id TEXT PRIMARY KEY, rep TEXT NOT NULL, "
    "item TEXT NOT NULL, quantity INTEGER NOT NULL)"
)
SEED_ROWS = 20_000


def run(*args, stdin=""):
    done = subprocess.run(
        [ROWSYNC_BIN, *args], input=stdin, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def server(tmp_path):
    """A consolidated SQLite database with SEED_ROWS orders of alice's, user alice,
    and `rowsync serve` on a free port; yields (url, consolidated path)."""
    central = tmp_path / "central.db"
    with sqlite3.connect(central) as db:
        db.execute(ORDERS)
        db.executemany(
            "INSERT INTO orders VALUES (?, 'alice', 'seed', ?)",
            ((f"seed-{n}", n) for n in range(SEED_ROWS)),
        )
    run("init", "--db", str(central), "--table", "orders", "--partition-column", "rep")
    run("user", "add", "--db", str(central), "--name", "alice", stdin="alice-password\n")
    process = subprocess.Popen(
        [ROWSYNC_BIN, "serve", "--db", str(central), "--listen", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = process.stderr.readline()
        assert banner.startswith("rowsync serving"), banner
        yield banner.split()[-1], central
    finally:
        process.kill()
        process.wait()


def new_client(tmp_path, name):
    path = tmp_path / f"{name}.db"
    with sqlite3.connect(path) as db:
        db.execute(ORDERS)
    client = rowsync.Client(str(path))
    client.track("orders")
    return client, path


def rows(path):
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT id, rep, item, quantity FROM orders WHERE rep = 'alice' ORDER BY id"
        ).fetchall()


def test_python_writes_including_insert_or_replace_reach_the_server(server, tmp_path):
    url, central = server
    client, path = new_client(tmp_path, "app")
    seen = []
    report = client.sync(url, user="alice", password="alice-password", on_progress=seen.append)
    assert report.rows_downloaded == SEED_ROWS
    assert seen and seen[-1].rows_downloaded == SEED_ROWS
    assert all(a.bytes_received <= b.bytes_received for a, b in zip(seen, seen[1:]))

    # The application writes with Python's sqlite3 (recursive triggers off).
    with sqlite3.connect(path) as db:
        db.execute("INSERT OR REPLACE INTO orders VALUES ('seed-0', 'alice', 'replaced', 100)")
        db.execute("INSERT INTO orders VALUES ('py-1', 'alice', 'new', 1)")
        db.execute("DELETE FROM orders WHERE id = 'seed-1'")
    assert client.pending_changes()
    report = client.sync(url, user="alice", password="alice-password", compression="zstd")
    assert (report.rows_uploaded, report.conflicts) == (3, 0)
    assert not client.pending_changes()
    assert rows(central) == rows(path)
    assert ("seed-0", "alice", "replaced", 100) in rows(central)


def test_tables_and_priorities_reach_the_client(server, tmp_path):
    url, central = server
    client, path = new_client(tmp_path, "some")
    report = client.sync(url, user="alice", password="alice-password", tables=["orders"])
    assert report.rows_downloaded == SEED_ROWS
    report = client.sync(
        url, user="alice", password="alice-password", priorities=[["orders"]]
    )
    assert report.rounds == 2
    with pytest.raises(rowsync.SyncError, match='"invoices"'):
        client.sync(url, user="alice", password="alice-password", tables=["invoices"])
    assert rows(central) == rows(path)


def test_conflicts_name_the_row_and_the_servers_winner(server, tmp_path):
    url, _ = server
    first, first_path = new_client(tmp_path, "first")
    second, second_path = new_client(tmp_path, "second")
    for client in (first, second):
        client.sync(url, user="alice", password="alice-password")
    with sqlite3.connect(first_path) as db:
        db.execute("UPDATE orders SET quantity = 1000 WHERE id = 'seed-5'")
    first.sync(url, user="alice", password="alice-password")
    with sqlite3.connect(second_path) as db:
        db.execute("UPDATE orders SET quantity = 2000 WHERE id = 'seed-5'")
    report = second.sync(url, user="alice", password="alice-password")
    assert report.conflicts == 1
    [conflict] = report.conflicted_rows
    assert (conflict.table, conflict.key) == ("orders", ("seed-5",))
    assert conflict.server_row["quantity"] == 1000
    assert ("seed-5", "alice", "seed", 1000) in rows(second_path)


def test_rows_written_before_tracking_go_up_and_losing_rows_are_kept(server, tmp_path):
    url, central = server
    # A table that held a row before it was tracked: the row is the app's own.
    path = tmp_path / "early.db"
    with sqlite3.connect(path) as db:
        db.execute(ORDERS)
        db.execute("INSERT INTO orders VALUES ('early-1', 'alice', 'mine', 1)")
        # A row the server has (as a pre-synced copy would), and this app changed.
        db.execute("INSERT INTO orders VALUES ('seed-7', 'alice', 'stale', 70)")
    client = rowsync.Client(str(path))
    with pytest.raises(ValueError, match="from_server"):
        client.track("orders", existing="server")
    client.track("orders")
    report = client.sync(url, user="alice", password="alice-password")
    assert report.rows_uploaded == 2
    assert ("early-1", "alice", "mine", 1) in rows(central)
    # seed-7 was already on the server: the insert lost, and is kept.
    assert (report.conflicts, report.conflicts_kept) == (1, 1)
    [kept] = client.kept_conflicts()
    assert (kept["table"], kept["operation"], kept["key"]) == ("orders", "insert", {"id": "seed-7"})
    assert kept["client_row"] == {"id": "seed-7", "rep": "alice", "item": "stale", "quantity": 70}
    assert kept["server_row"]["item"] == "seed"
    assert client.remove_kept_conflict(kept["id"])
    assert client.kept_conflicts() == []


def test_a_table_the_server_refuses_is_set_aside_and_untracked(server, tmp_path):
    url, central = server
    client, path = new_client(tmp_path, "todo-app")
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE todo (id INTEGER PRIMARY KEY, title TEXT)")
    client.track("todo")
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO todo VALUES (1, 'buy milk')")
        db.execute("INSERT INTO orders VALUES ('t-1', 'alice', 'kept going', 1)")
    report = client.sync(url, user="alice", password="alice-password")
    assert report.rows_rejected == 1
    assert ("t-1", "alice", "kept going", 1) in rows(central)
    [rejected] = client.rejected_rows()
    assert (rejected["table"], rejected["operation"], rejected["key"]) == ("todo", "insert", {"id": 1})
    assert rejected["client_row"] == {"id": 1, "title": "buy milk"}
    assert "not synchronized" in rejected["reason"]
    assert client.untrack("todo") == 0
    assert client.remove_rejected(rejected["id"])
    assert client.rejected_rows() == []
    assert client.sync(url, user="alice", password="alice-password").rows_rejected == 0


def test_failures_raise_typed_errors(server, tmp_path):
    url, _ = server
    client, _ = new_client(tmp_path, "app")
    with pytest.raises(rowsync.AuthError):
        client.sync(url, user="alice", password="wrong")
    with pytest.raises(rowsync.SyncError) as refused:
        client.sync(url, user="alice", password="alice-password", version="v9")
    assert not isinstance(refused.value, rowsync.AuthError)
    with pytest.raises(rowsync.SyncError):
        client.sync("tcp://127.0.0.1:1", user="alice", password="alice-password")
    with pytest.raises(rowsync.SyncError):
        client.track("no_such_table")
    with pytest.raises(ValueError):
        client.sync(url, user="alice", password="alice-password", compression="lz4")
    assert issubclass(rowsync.BusyError, rowsync.SyncError)


def test_an_exception_in_the_progress_callback_is_raised_after_the_sync(server, tmp_path):
    url, path = server
    client, _ = new_client(tmp_path, "app")

    def fail(progress):
        raise RuntimeError("from the callback")

    with pytest.raises(RuntimeError, match="from the callback"):
        client.sync(url, user="alice", password="alice-password", on_progress=fail)


def test_the_gil_is_released_while_syncing(server, tmp_path):
    url, _ = server
    client, _ = new_client(tmp_path, "app")
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(
            report=client.sync(url, user="alice", password="alice-password")
        )
    )
    thread.start()
    spins = 0
    while thread.is_alive():
        spins += 1
    thread.join()
    assert result["report"].rows_downloaded == SEED_ROWS
    # Held for the whole sync, the GIL would let this loop run only between the
    # interpreter's switch intervals of the syncing thread.
    assert spins > 10_000, spins


@pytest.mark.parametrize("durability", ["full", "normal", "off", "memory"])
def test_each_durability_mode_syncs_and_keeps_what_it_promises(server, tmp_path, durability):
    url, central = server
    path = tmp_path / f"{durability}.db"
    client = rowsync.Client(str(path), durability=durability)
    assert client.durability == durability
    client.execute(ORDERS.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"))
    client.track("orders")
    client.execute("INSERT INTO orders VALUES ('mode-1', 'alice', 'written', 1)")
    report = client.sync(url, user="alice", password="alice-password")
    assert (report.rows_uploaded, report.rows_downloaded) == (1, SEED_ROWS)
    assert ("mode-1", "alice", "written", 1) in rows(central)
    client.persist()
    # The file holds the data in every mode once persisted (the memory mode's copy).
    assert ("mode-1", "alice", "written", 1) in rows(path)
    with pytest.raises(ValueError):
        rowsync.Client(str(tmp_path / "bad.db"), durability="sometimes")
    with pytest.raises(rowsync.SyncError):
        rowsync.Client(str(tmp_path / "m.db"), durability="memory", durable_before_sync=False)


def test_sqlite3_and_rowsync_write_one_file_in_one_process(server, tmp_path):
    """The README's pattern: the app writes with `sqlite3` (WAL) while `rowsync.Client`
    syncs the same file, each side opening and closing connections while the other's
    stay open. Two SQLite libraries in one process do not see each other's POSIX locks,
    so the side that closes its last connection takes itself for the file's last user:
    it checkpoints and deletes the -wal and -shm files the other side still writes into
    (sqlite.org, "How To Corrupt An SQLite Database File", 2.2.1). One library shares
    them; then every row written either way is synced and the file is sound."""
    url, central = server
    path = tmp_path / "shared.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as app:
        app.execute("PRAGMA journal_mode=WAL")
        app.execute(ORDERS)
    client = rowsync.Client(str(path))
    client.track("orders")
    client.sync(url, user="alice", password="alice-password")
    del client
    written = []

    def write(connection, round, what):
        row = (f"r{round}-{what}", "alice", what, round)
        connection.execute("INSERT INTO orders VALUES (?, ?, ?, ?)", row)
        written.append(row)

    rounds = 3
    for round in range(rounds):
        # The app's long-lived connection, with frames in the WAL not yet checkpointed.
        app = sqlite3.connect(path, isolation_level=None)
        write(app, round, "held")
        # rowsync opens, syncs and closes while the app's connection stays open.
        client = rowsync.Client(str(path))
        client.sync(url, user="alice", password="alice-password")
        del client
        write(app, round, "after-close")
        app.execute("UPDATE orders SET quantity = quantity + 1 WHERE id = ?", (f"seed-{round}",))
        # rowsync opens again and stays open while the app's connections come and go.
        client = rowsync.Client(str(path))
        with closing(sqlite3.connect(path, isolation_level=None)) as short:
            write(short, round, "short")
        client.sync(url, user="alice", password="alice-password")
        app.close()
        with closing(sqlite3.connect(path, isolation_level=None)) as short:
            write(short, round, "reopened")
        client.execute(
            f"INSERT INTO orders VALUES ('r{round}-rowsync', 'alice', 'rowsync', {round})"
        )
        written.append((f"r{round}-rowsync", "alice", "rowsync", round))
        client.sync(url, user="alice", password="alice-password")
        del client
    client = rowsync.Client(str(path))
    client.sync(url, user="alice", password="alice-password")
    assert not client.pending_changes()
    del client

    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    on_server = rows(central)
    assert rows(path) == on_server
    missing = [row for row in written if row not in on_server]
    assert not missing
    for round in range(rounds):
        assert (f"seed-{round}", "alice", "seed", round + 1) in on_server
    assert len(on_server) == SEED_ROWS + len(written)


def test_rowsync_calls_the_sqlite_library_the_sqlite3_module_loaded():
    assert rowsync.sqlite_version == sqlite3.sqlite_version
    if sys.platform.startswith("linux"):
        maps = Path("/proc/self/maps").read_text()
        assert rowsync.sqlite_library in maps
        # One SQLite library mapped in this process, shared by sqlite3 and rowsync.
        libraries = {line.split()[-1] for line in maps.splitlines() if "sqlite3" in line}
        ours = os.path.realpath(rowsync.sqlite_library)
        assert {os.path.realpath(lib) for lib in libraries if "libsqlite3" in lib} == {ours}


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_a_sqlite3_module_with_its_own_sqlite_is_refused(tmp_path):
    """As on an interpreter whose sqlite3 module has SQLite compiled in: the module's
    file resolves sqlite3_libversion to another library than rowsync's. Client refuses
    before opening the file; ROWSYNC_ALLOW_SEPARATE_SQLITE=1 lets it open."""
    source = tmp_path / "own_sqlite.c"
    source.write_text('const char *sqlite3_libversion(void) { return "3.40.1"; }\n')
    library = tmp_path / "own_sqlite.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", library, source], check=True)
    database = tmp_path / "app.db"
    script = f"""
import _sqlite3, rowsync
_sqlite3.__file__ = {str(library)!r}
try:
    rowsync.Client({str(database)!r})
    print("opened")
except rowsync.SqliteLibraryError as error:
    print("refused:", error)
"""
    environment = {k: v for k, v in os.environ.items() if k != "ROWSYNC_ALLOW_SEPARATE_SQLITE"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environment
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: Python's sqlite3 module uses another SQLite"), done.stdout
    assert "ROWSYNC_ALLOW_SEPARATE_SQLITE=1" in done.stdout
    assert not database.exists()
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**environment, "ROWSYNC_ALLOW_SEPARATE_SQLITE": "1"},
    )
    assert (done.returncode, done.stdout) == (0, "opened\n"), done.stderr
    assert database.exists()


def test_rows_made_offline_take_keys_from_the_range_the_server_handed_out(tmp_path):
    """`rowsync keys` as the docs give it, then Client.next_key."""
    notes = "CREATE TABLE notes (id INTEGER PRIMARY KEY{}, owner TEXT NOT NULL, body TEXT)"
    central = tmp_path / "central.db"
    with sqlite3.connect(central) as db:
        db.execute(notes.format(" AUTOINCREMENT"))
        db.execute("INSERT INTO notes (owner, body) VALUES ('alice', 'from the office')")
    run("init", "--db", str(central), "--table", "notes", "--partition-column", "owner")
    said = run("keys", "--db", str(central), "--table", "notes", "--range-keys", "100")
    assert "clients are handed keys of id from 2 to" in said, said
    run("user", "add", "--db", str(central), "--name", "alice", stdin="alice-password\n")
    process = subprocess.Popen(
        [ROWSYNC_BIN, "serve", "--db", str(central), "--listen", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = process.stderr.readline().split()[-1]
        path = tmp_path / "phone.db"
        with sqlite3.connect(path) as db:
            db.execute(notes.format(""))
        client = rowsync.Client(str(path))
        client.track("notes")
        with pytest.raises(rowsync.SyncError, match="sync to be handed a new range"):
            client.next_key("notes")
        client.sync(url, user="alice", password="alice-password")
        keys = [client.next_key("notes") for _ in range(2)]
        assert keys == [2, 3]
        with sqlite3.connect(path) as db:
            db.executemany(
                "INSERT INTO notes VALUES (?, 'alice', 'made offline')", ((k,) for k in keys)
            )
        report = client.sync(url, user="alice", password="alice-password")
        assert (report.rows_uploaded, report.conflicts) == (2, 0)
        with sqlite3.connect(central) as db:
            db.execute("INSERT INTO notes (owner, body) VALUES ('alice', 'office again')")
            ids = [row[0] for row in db.execute("SELECT id FROM notes ORDER BY id")]
        assert ids[:3] == [1, 2, 3] and ids[3] > 100, ids
    finally:
        process.kill()
        process.wait()
