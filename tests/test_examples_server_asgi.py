"""The example server (examples/server_asgi.py) as a person runs it: under uvicorn, a real process on 127.0.0.1
(started on a free port, stopped by its pid), and through its ASGI callable for what uvicorn never does
(a send that fails).

A normal request ends ``length`` with exactly one terminal signal; a client that hangs up mid-stream ends
it ``client_cancel``, never ``length``; no request leaves an ignored terminal signal behind. Everything is
read from the server's ``/metrics`` text (the lifecycle's counter of ignored signals included)."""

from __future__ import annotations

import asyncio
import http.client
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmslo.telemetry import render_metrics

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "server_asgi.py"
MODEL = "tiny-llm"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _requests(samples: Samples) -> dict[str, float]:
    """``llmslo_requests_total`` of the example's model by finish reason."""
    out: dict[str, float] = {}
    for (name, labels), value in samples.items():
        label = dict(labels)
        if name == "llmslo_requests_total" and label.get("model") == MODEL:
            out[label["finish_reason"]] = value
    return out


def _ignored(samples: Samples) -> float:
    """Every ignored terminal signal the lifecycle counted, all reasons together."""
    return sum(v for (name, _), v in samples.items() if name == "llmslo_terminal_signals_ignored_total")


class Uvicorn:
    """``python -m uvicorn`` serving the example on 127.0.0.1 (a port the OS picks), its log kept in memory; its
    summaries go to ``summaries`` (``LLMSLO_SUMMARIES``), a folder of the test's."""

    def __init__(self, summaries: Path, *, lifespan: bool = False) -> None:
        self.log: list[str] = []
        env = {**os.environ, "LLMSLO_SUMMARIES": str(summaries)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(EXAMPLE.parent), "--host", "127.0.0.1",
             "--port", "0", *([] if lifespan else ["--lifespan", "off"]), "--no-access-log", "server_asgi:app"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=summaries.parent)
        self.port = 0
        started = threading.Event()

        def read_log() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)
                found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
                if found:
                    self.port = int(found.group(1))
                    started.set()
            started.set()  # the process ended: stop waiting

        self._reader = threading.Thread(target=read_log, daemon=True)
        self._reader.start()
        if not started.wait(timeout=60) or not self.port:
            self.stop()
            raise AssertionError("uvicorn did not start:\n" + "".join(self.log))

    def get(self, path: str) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def metrics(self) -> Samples:
        return _samples(self.get("/metrics"))

    def wait_for(self, finish_reason: str, count: float, timeout_s: float = 30.0) -> Samples:
        """The metrics once ``count`` requests finished ``finish_reason`` (or the last scrape, at the timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            samples = self.metrics()
            if _requests(samples).get(finish_reason, 0) >= count or time.monotonic() > deadline:
                return samples
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the process this object started, by its pid (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Uvicorn]:
    pytest.importorskip("uvicorn", reason="the examples extra installs uvicorn: pip install 'llmslo[examples]'")
    running = Uvicorn(tmp_path / "summaries")
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.integration
def test_a_normal_request_under_uvicorn_streams_every_token_and_ends_length_with_one_terminal_signal(
        server: Uvicorn) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/generate", body=b"")
        response = conn.getresponse()
        body = response.read().decode()
    finally:
        conn.close()
    assert response.status == 200
    assert body.split() == [f"token{i}" for i in range(64)]
    samples = server.wait_for("length", 1)
    assert _requests(samples) == {"length": 1}
    assert _ignored(samples) == 0
    labels = (("model", MODEL), ("tenant_class", "default"), ("version", "example-1"))
    assert samples[("llmslo_sent_tokens_total", labels)] == samples[("llmslo_generated_tokens_total", labels)] == 64


@pytest.mark.integration
def test_a_client_that_hangs_up_mid_stream_under_uvicorn_ends_client_cancel(server: Uvicorn) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
        received = b""
        while received.count(b"token") < 3:  # a few tokens arrived: the stream is under way
            chunk = sock.recv(4096)
            assert chunk, "the server closed the stream early"
            received += chunk
    samples = server.wait_for("client_cancel", 1)
    assert _requests(samples) == {"client_cancel": 1}, "".join(server.log)
    labels = (("model", MODEL), ("tenant_class", "default"), ("version", "example-1"))
    assert samples[("llmslo_generated_tokens_total", labels)] < 64  # the engine stopped generating for nobody
    # The handler unwinds within a token interval (20 ms) of the cancel; after 1.5 s, past the whole stream's
    # 1.3 s, a later terminal signal (a `length`, an ignored `stop`) would have shown.
    time.sleep(1.5)
    samples = server.metrics()
    assert _requests(samples) == {"client_cancel": 1}
    assert _ignored(samples) == 0


def _load_example() -> Any:
    """A fresh copy of the example module (its own Telemetry and registry)."""
    spec = importlib.util.spec_from_file_location("llmslo_example_server_asgi", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_send_that_fails_mid_stream_ends_the_request_client_cancel(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Driven through the ASGI callable: the server raises from ``send`` once the client is gone (as some
    servers do) and never reports ``http.disconnect``."""
    monkeypatch.setenv("LLMSLO_SUMMARIES", str(tmp_path / "summaries"))
    example = _load_example()
    example.TOKEN_INTERVAL_S = 0.001
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not sent:
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # no disconnect message ever comes
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if sum(1 for m in sent if m["type"] == "http.response.body") >= 3:
            raise ConnectionResetError("client gone")
        sent.append(message)

    scope = {"type": "http", "path": "/generate", "method": "POST", "headers": []}
    asyncio.run(asyncio.wait_for(example.app(scope, receive, send), timeout=30))
    samples = _samples(render_metrics(example.tel.registry)[0].decode())
    assert _requests(samples) == {"client_cancel": 1}
    assert _ignored(samples) == 0
    assert example.tel.guard.errors == {}
    example.sink.close(timeout_s=5)
    (row,) = [json.loads(line) for f in (tmp_path / "summaries").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert row["finish_reason"] == "client_cancel"


@pytest.mark.integration
def test_run_as_the_readme_says_every_request_leaves_one_summary_that_llmslo_ingest_loads(tmp_path: Path) -> None:
    """``uvicorn --app-dir examples server_asgi:app`` (lifespan on, as uvicorn runs it by default): the README's
    snippet, ``SummarySink`` included, is the example's; at shutdown the sink is closed and every summary is
    written."""
    pytest.importorskip("uvicorn", reason="the examples extra installs uvicorn: pip install 'llmslo[examples]'")
    summaries = tmp_path / "summaries"
    server = Uvicorn(summaries, lifespan=True)
    try:
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            conn.request("POST", "/generate", body=b"")
            assert len(conn.getresponse().read().split()) == 64
            conn.close()
    finally:
        server.stop()
    assert any("Application shutdown complete" in line for line in server.log), "".join(server.log)
    rows = [json.loads(line) for f in sorted(summaries.glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert [(r["finish_reason"], r["generated_tokens"], r["model"]) for r in rows] == [("length", 64, MODEL)] * 2
    readme = (EXAMPLE.parents[1] / "README.md").read_text()
    snippet = readme[readme.index("```python\nsink = SummarySink("):]
    example = EXAMPLE.read_text()
    assert "sink = SummarySink(" in example and "Telemetry(" in example and "sink=sink)" in example
    assert "sink.close" in example
    assert snippet.index("sink.close(timeout_s=2)") < snippet.index("```", 10)
    exe = Path(sys.executable).parent / "llmslo"
    if exe.is_file():
        done = subprocess.run([str(exe), "ingest", *map(str, sorted(summaries.glob("*.jsonl"))), "--db",
                               str(tmp_path / "s.duckdb"), "--json"], capture_output=True, text=True, check=True)
        assert json.loads(done.stdout)["store_rows"] == 2


def test_a_disconnect_message_before_the_body_ends_the_request_client_cancel_without_a_response() -> None:
    example = _load_example()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": "/generate", "method": "POST", "headers": []}
    asyncio.run(asyncio.wait_for(example.app(scope, receive, send), timeout=30))
    samples = _samples(render_metrics(example.tel.registry)[0].decode())
    assert sent == [] and _requests(samples) == {"client_cancel": 1} and _ignored(samples) == 0
