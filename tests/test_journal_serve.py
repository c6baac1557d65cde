"""``llmslo serve`` killed under load loses nothing: the installed command on 127.0.0.1, ``llmslo load`` keeping
requests in flight, SIGKILL by pid, and the restart that turns every request the crash left without a summary
into one row, so the client's rows and the server's match one to one by request id again."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration
pytest.importorskip("uvicorn", reason="the serve extra installs uvicorn: pip install 'llmslo[serve]'")

LLMSLO = Path(sys.executable).parent / "llmslo"
READY = re.compile(r"^serving \S+ on (http://127\.0\.0\.1:\d+)$")
RECOVERED = re.compile(r"^journal s\.journal: recovered (\d+) requests? from the journal"
                       r"(?: \((\d+) of them had ended, their summaries unwritten\))?; "
                       r"(\d+) already had (?:summaries|a summary)$")
REQUESTS = 24


class Serve:
    """The installed ``llmslo serve --port 0 ARGS`` in ``cwd``; its output kept; signalled by its pid."""

    def __init__(self, cwd: Path, *args: str) -> None:
        assert LLMSLO.is_file(), f"the command is not installed at {LLMSLO}"
        self.proc = subprocess.Popen([str(LLMSLO), "serve", "--port", "0", *args], cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.url = ""
        self.err: list[str] = []
        ready = threading.Event()

        def out() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                found = READY.match(line.strip())
                if found:
                    self.url = found.group(1)
                    ready.set()
            ready.set()

        def err() -> None:
            assert self.proc.stderr is not None
            self.err.extend(self.proc.stderr)

        self.readers = [threading.Thread(target=f, daemon=True) for f in (out, err)]
        for reader in self.readers:
            reader.start()
        if not ready.wait(timeout=60) or not self.url:
            self.stop()
            raise AssertionError("llmslo serve did not get ready:\n" + "".join(self.err))

    def arrived(self) -> float:
        """Requests the server has seen: finished plus in flight (from its /metrics)."""
        import urllib.request

        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
                   if s.name in ("llmslo_requests_total", "llmslo_in_flight_requests"))

    def end(self, sig: int) -> int:
        """Send ``sig``; the exit status once the process ended."""
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        self.stop()
        return code

    def stop(self) -> None:
        """Kill the process if it still runs (by its pid), then close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for reader in self.readers:
            reader.join(timeout=10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def rows(folder: Path) -> dict[str, dict[str, Any]]:
    found = [json.loads(line) for p in sorted(folder.glob("*.jsonl")) for line in p.read_text().splitlines()]
    by_id = {r["request_id"]: r for r in found}
    assert len(by_id) == len(found), "a request id has two rows"
    return by_id


def test_a_server_killed_mid_load_recovers_every_request_at_its_next_start(tmp_path: Path) -> None:
    args = ("--speed", "2", "--jsonl", "s", "--drain-settle", "0")  # the journal: s.journal, by default
    first = Serve(tmp_path, *args)
    load = subprocess.Popen([str(LLMSLO), "load", first.url, "--rate", "40", "--max-requests", str(REQUESTS),
                             "--output-tokens", "4-400", "--seed", "3", "--jsonl", "c", "--no-progress"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while first.arrived() < REQUESTS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.arrived() == REQUESTS, "the load did not reach the server"
        time.sleep(1.2)  # longer than the journal's flush interval (50 ms) and its progress interval (1 s):
        # every arrival is on disk, with its progress read at least once
        assert first.end(signal.SIGKILL) == -signal.SIGKILL
        out, _ = load.communicate(timeout=120)
    finally:
        first.stop()
        if load.poll() is None:
            load.kill()
            load.wait(timeout=10)
    assert load.returncode == 0, out
    client = rows(tmp_path / "c")
    assert len(client) == REQUESTS and all(r["error_type"] != "connect_error" for r in client.values())
    cut = {rid for rid, r in client.items() if r["error_type"] == "read_error"}
    assert cut, "no request was in flight at the kill"
    before = rows(tmp_path / "s") if (tmp_path / "s").exists() else {}
    assert cut - set(before) == cut  # at the server, the requests in flight never happened

    second = Serve(tmp_path, *args)
    try:
        dup = subprocess.run([str(LLMSLO), "serve", "--port", "0", *args], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)  # a second server on the same journal must refuse at once
        assert dup.returncode == 1, dup.stderr
        assert (f"in use by process {second.proc.pid} (a running server writes it): two servers cannot share a "
                "journal") in " ".join(dup.stderr.split()), dup.stderr
        assert second.end(signal.SIGTERM) == 0
    finally:
        second.stop()
    said = RECOVERED.match(second.err[0].strip())
    assert said, second.err
    server = rows(tmp_path / "s")
    assert set(server) == set(client)  # one to one by request id again
    recovered = {rid: r for rid, r in server.items() if rid not in before}
    assert int(said.group(1)) == len(recovered) == REQUESTS - len(before)
    assert cut <= set(recovered)  # every request in flight at the kill, and those whose summaries were queued
    assert int(said.group(2) or 0) <= len(recovered) - len(cut)  # "N of them had ended"
    for rid, row in recovered.items():
        assert (row["finish_reason"], row["error_type"]) == ("error", "server_crash")
        assert rid in cut or client[rid]["finish_reason"] in ("stop", "length")  # ended, its summary queued
        assert 0 <= row["e2e_s"] <= client[rid]["e2e_s"] + 0.05  # a lower bound: never more than the client waited
        assert row["sent_tokens"] <= row["generated_tokens"]
    assert any(r["sent_tokens"] > 0 for rid, r in recovered.items() if rid in cut), "no progress was journaled"
    assert list((tmp_path / "s.journal").glob("segment-*.wal")) == []  # recovered, then a clean exit

    pytest.importorskip("duckdb", reason="llmslo ingest needs the analysis extra")
    files = [str(p.relative_to(tmp_path)) for p in sorted((tmp_path / "s").glob("*.jsonl"))]
    again = subprocess.run([str(LLMSLO), "ingest", *files, "--db", "x.duckdb", "--recover", "s.journal", "--json"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["recovery"] == {"journal": "s.journal", "recovered": 0, "already_stored": 0, "torn_lines": 0}
    assert report["store_rows"] == REQUESTS  # every recovered row keeps the store's rules


@pytest.mark.parametrize(("argv", "message"), [
    (["--journal", "{tmp}/j"], "--journal: the journal turns requests lost in a crash into summary rows; give --db "
                               "or --jsonl for them too (or leave out --journal)"),
    (["--no-telemetry", "--journal", "{tmp}/j"], "--no-telemetry keeps no summaries: leave out --journal"),
    (["--jsonl", "{tmp}/s", "--journal", ""], "--journal: give a folder, or 'off'"),
])
def test_a_journal_with_nowhere_to_recover_into_is_refused_and_starts_nothing(tmp_path: Path, argv: list[str],
                                                                              message: str) -> None:
    from typer.testing import CliRunner

    from llmslo.cli._app import app

    result = CliRunner().invoke(app, ["serve", "--port", "0", *(a.format(tmp=tmp_path) for a in argv)])
    assert result.exit_code == 2, result.output
    assert " ".join(message.split()) in " ".join(result.output.split())
    assert list(tmp_path.iterdir()) == []
