"""A store that a server holds open for writing (DuckDB lets no other process open it meanwhile) is read
through a snapshot the page names, never a lock traceback; the writer here is a real second process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from llmslo.app._source import SNAPSHOT_KEY, SourceError, take_snapshot
from llmslo.tests._app_store import ENTRY, app_rows, argv, cli_json, ingest

pytestmark = pytest.mark.integration

WRITER = """
import sys
from llmslo.analysis import DuckDBSummaryWriter
from llmslo.telemetry import COLUMNS
from llmslo.tests._rows import ok_row

writer = DuckDBSummaryWriter(sys.argv[1])  # what a server's sink uses: holds the file open until close()
n = 0
for line in sys.stdin:
    count = int(line)
    rows = [ok_row(10_000 + n + i, arrival_unix_s=1_700_000_200.0 + i) for i in range(count)]
    writer.write([{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows])  # whole summaries
    n += count
    print("written", writer.rows_written, flush=True)
writer.close()
"""


class Writer:
    """A second process that writes rows into the store through the server's writer and keeps it open."""

    def __init__(self, db: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.written = 0

    def write(self, count: int) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{count}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().split() == ["written", str(self.written + count)], "nothing written"
        self.written += count

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[tuple[Path, Writer]]:
    db = ingest(tmp_path / "live.duckdb", app_rows())
    w = Writer(db)
    try:
        yield db, w
    finally:
        w.close()


def _run(at: AppTest, db: Path) -> AppTest:
    with argv(db):
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _attempted(at: AppTest) -> str:
    return {m.label: m.value for m in at.metric}["Attempted"]


def test_a_store_held_by_a_writer_is_read_through_a_named_snapshot(writer: tuple[Path, Writer]) -> None:
    db, w = writer
    w.write(7)  # committed, and held open: another process cannot even read the file now
    locked = subprocess.run([sys.executable, "-m", "llmslo.cli", "report", "--db", str(db), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert locked.returncode == 1 and "lock" in locked.stderr  # what the app must not show
    at = _run(AppTest.from_file(str(ENTRY), default_timeout=60), db)
    (note,) = [x.value for x in at.warning]
    assert "held open for writing" in note and "snapshot taken at" in note and "UTC" in note
    assert not at.error and "Traceback" not in note
    assert _attempted(at) == f"{len(app_rows()) + 7:,}"  # the writer's committed rows are in the snapshot
    snapshot = at.session_state[SNAPSHOT_KEY]
    w.write(5)
    at = _run(at, db)
    assert _attempted(at) == f"{len(app_rows()) + 7:,}"  # the same snapshot until a new one is asked for
    at.button(key="new_snapshot").click()
    at = _run(at, db)
    assert _attempted(at) == f"{len(app_rows()) + 12:,}"
    assert not snapshot.folder.exists()  # the old copy is gone
    w.close()
    at = _run(at, db)  # the writer has gone: the store itself is read again, and the page says nothing
    assert not at.warning
    expected = cli_json("report", "--db", str(db), "--json")["totals"]
    assert _attempted(at) == f"{expected['attempted']:,}" == f"{len(app_rows()) + 12:,}"
    assert SNAPSHOT_KEY not in at.session_state


def test_a_copy_that_does_not_open_gives_a_message_for_a_person(tmp_path: Path) -> None:
    garbage = tmp_path / "x.duckdb"
    garbage.write_bytes(b"\0" * 4096)
    with pytest.raises(SourceError) as caught:
        take_snapshot(garbage, "another process (PID 1)")
    message = str(caught.value)
    assert "held open for writing by another process (PID 1)" in message and "Reload the page" in message
