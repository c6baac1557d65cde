"""``llmslo app``: the help that teaches, clear refusals, the Streamlit command line, and a server that stops
with the command."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmslo.cli import _ui
from llmslo.cli._app import app
from llmslo.tests._app_store import app_rows, free_port, ingest, wait_healthy


def test_help_names_every_page_the_options_and_the_extra() -> None:
    out = CliRunner().invoke(app, ["app", "--help"])
    assert out.exit_code == 0
    text = " ".join(out.stdout.split())
    for words in ("Overview", "Latency", "Survivor bias", "Anomalies", "GPU", "Rollouts", "Data", "--db", "--port",
                  "127.0.0.1", "pip install 'llmslo[app]'", "read", "llmslo app --db summaries.duckdb"):
        assert words in text, words


def test_a_missing_store_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    db = tmp_path / "none.duckdb"
    out = CliRunner().invoke(app, ["app", "--db", str(db)])
    assert out.exit_code == 1 and "no store at" in out.stderr and "llmslo ingest" in out.stderr
    assert not db.exists()


@pytest.mark.parametrize("port", ["0", "70000"])
def test_a_port_out_of_range_is_a_usage_error(tmp_path: Path, port: str) -> None:
    db = ingest(tmp_path / "s.duckdb", app_rows()[:3])
    out = CliRunner().invoke(app, ["app", "--db", str(db), "--port", port])
    assert out.exit_code == 2 and "--port" in out.stderr


def test_without_streamlit_the_command_says_which_extra_to_install(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    db = ingest(tmp_path / "s.duckdb", app_rows()[:3])
    real = importlib.util.find_spec
    monkeypatch.setattr(_ui.importlib.util, "find_spec", lambda name, *a: None if name == "streamlit" else real(name))
    out = CliRunner().invoke(app, ["app", "--db", str(db)])
    assert out.exit_code == 1 and "pip install 'llmslo[app]'" in out.stderr


def test_the_server_listens_on_127_0_0_1_headless_and_sends_no_statistics(tmp_path: Path) -> None:
    argv = _ui.streamlit_argv(tmp_path / "s.duckdb", 8600)
    assert argv[1:4] == ["-m", "streamlit", "run"] and Path(argv[4]) == _ui.ENTRY_SCRIPT and _ui.ENTRY_SCRIPT.is_file()
    options = dict(zip(argv[5:argv.index("--"):2], argv[6:argv.index("--"):2], strict=True))
    assert options["--server.address"] == "127.0.0.1" and options["--server.port"] == "8600"
    assert options["--server.headless"] == "true" and options["--browser.gatherUsageStats"] == "false"
    assert argv[argv.index("--") + 1:] == ["--db", str(tmp_path / "s.duckdb")]


def _servers_on(port: int, db: Path) -> list[int]:
    """Process ids of Streamlit servers this test started (their command line names its port and store)."""
    found: list[int] = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"streamlit" in args and str(port).encode() in args and str(db).encode() in args:
            found.append(int(cmdline.parent.name))
    return found


@pytest.mark.integration
def test_stopping_the_command_stops_the_server(tmp_path: Path) -> None:
    db = ingest(tmp_path / "s.duckdb", app_rows()[:3])
    port = free_port()
    log = tmp_path / "app.log"
    with log.open("wb") as err:  # a file, not a pipe: a server left behind could hold a pipe open forever
        proc = subprocess.Popen([sys.executable, "-m", "llmslo.cli", "app", "--db", str(db), "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_healthy(port, proc)
        assert _servers_on(port, db), "the server is not a child process of the command"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert not _servers_on(port, db), "the server outlived the command"
        with pytest.raises(OSError):  # nothing listens any more
            urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
    finally:
        for pid in _servers_on(port, db):  # pragma: no cover - only when the test failed
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:  # pragma: no cover - only when the test failed
            proc.kill()
            proc.wait()
    assert f"http://127.0.0.1:{port}" in log.read_text()
