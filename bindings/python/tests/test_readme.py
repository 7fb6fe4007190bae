"""The README's Python block as written (issue 36), but for the server's address: it
runs against a `rowsync serve` set up by the README's own shell block (every line but
the server's, which this test starts on a free port), in an empty directory."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ROWSYNC_BIN = os.environ.get("ROWSYNC_BIN", str(ROOT / "target" / "debug" / "rowsync"))
README_ADDRESS = "127.0.0.1:2439"


def blocks(language):
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^```" + language + r"\n(.*?)^```$", text, re.S | re.M)


def test_the_readme_python_block_syncs(tmp_path):
    (server_block, *_) = blocks("sh")
    setup = "\n".join(line for line in server_block.splitlines() if "rowsync serve" not in line)
    path = f"{Path(ROWSYNC_BIN).parent}:{os.environ.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", setup],
        cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PATH": path},
    )
    assert done.returncode == 0, done.stderr
    server = subprocess.Popen(
        [ROWSYNC_BIN, "serve", "--db", "central.db", "--listen", "127.0.0.1:0"],
        cwd=tmp_path, stderr=subprocess.PIPE, text=True,
    )
    try:
        banner = server.stderr.readline()
        assert banner.startswith("rowsync serving"), banner
        address = banner.split()[-1].removeprefix("tcp://")
        subprocess.run(
            ["sqlite3", "central.db", "INSERT INTO notes VALUES ('n1', 'erin', 'from the office')"],
            cwd=tmp_path, check=True,
        )
        (python_block,) = blocks("python")
        assert README_ADDRESS in python_block
        done = subprocess.run(
            [sys.executable, "-c", python_block.replace(README_ADDRESS, address)],
            cwd=tmp_path, capture_output=True, text=True,
        )
        assert done.returncode == 0, done.stderr
        # rows_uploaded, rows_downloaded, conflicted rows: the office's note came down.
        assert done.stdout.splitlines()[-1] == "0 1 []", done.stdout
    finally:
        server.kill()
        server.wait()
