"""``llmslo serve`` as a person runs it: a real process under uvicorn on 127.0.0.1 (``--port 0``, the port read
from its ready line), stopped by its pid. Server-sent events over a socket, a client that hangs up, a slow
reader that the engine feels (``stream_paused_s``), and SIGTERM: readiness 503, in-flight streams closed by the
drain or finished, exit 0, every request's summary written, a drain record ``llmslo rollout record`` takes."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
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

pytestmark = pytest.mark.integration
pytest.importorskip("uvicorn", reason="the serve extra installs uvicorn: pip install 'llmslo[serve]'")

MODEL = "llmslo-sim"
READY = re.compile(r"^serving (\S+) on http://127\.0\.0\.1:(\d+)$")


class Served:
    """``python -m llmslo.cli serve ARGS --port 0``; its output kept; stopped by its pid."""

    def __init__(self, *args: str) -> None:
        self.out: list[str] = []
        self.err: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "llmslo.cli", "serve", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.port = 0
        ready = threading.Event()

        def read(stream: Any, into: list[str], watch: bool) -> None:
            for line in stream:
                into.append(line)
                found = READY.match(line.strip())
                if watch and found:
                    self.port = int(found.group(2))
                    ready.set()
            ready.set()

        self._readers = [threading.Thread(target=read, args=(self.proc.stdout, self.out, True), daemon=True),
                         threading.Thread(target=read, args=(self.proc.stderr, self.err, False), daemon=True)]
        for reader in self._readers:
            reader.start()
        if not ready.wait(timeout=60) or not self.port:
            self.stop()
            raise AssertionError("llmslo serve did not get ready:\n" + "".join(self.out + self.err))

    def connection(self, timeout: float = 30) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def get(self, path: str) -> tuple[int, dict[str, str], str]:
        conn = self.connection()
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
        finally:
            conn.close()

    def post(self, body: dict[str, Any], rid: str, path: str = "/v1/completions") -> tuple[int, dict[str, str], str]:
        conn = self.connection()
        try:
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json",
                                                                       "X-Request-Id": rid})
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
        finally:
            conn.close()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = self.get("/metrics")[2]
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def requests_by_reason(self) -> dict[str, float]:
        return {dict(labels)["finish_reason"]: v for (name, labels), v in self.metrics().items()
                if name == "llmslo_requests_total" and v}

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, then wait for the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """Stop the process this object started, by its pid (SIGTERM, then SIGKILL after 20 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for reader in self._readers:
            reader.join(timeout=10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[Served] = []

    def start(*args: str) -> Served:
        served = Served(*args)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


def events(text: str) -> list[Any]:
    out: list[Any] = []
    for block in text.split("\n\n"):
        if block.strip():
            payload = block.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def summaries(folder: Path) -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
    by_id = {row["request_id"]: row for row in rows}
    assert len(by_id) == len(rows), "a request id has two summaries"
    return by_id


def wait_until(check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def test_a_stream_over_a_real_socket_and_a_client_that_hangs_up(serve: Any, tmp_path: Path) -> None:
    served = serve("--speed", "20", "--jsonl", str(tmp_path / "j"), "--drain-settle", "0")
    status, headers, text = served.post({"model": MODEL, "prompt": "a b c d", "max_tokens": 7, "stream": True,
                                         "ignore_eos": True, "stream_options": {"include_usage": True}}, "whole")
    evs = events(text)
    assert status == 200 and headers["x-request-id"] == "whole" and headers["content-type"] == "text/event-stream"
    assert [e["choices"][0]["finish_reason"] for e in evs[:7]] == [None] * 6 + ["length"]
    assert evs[7]["usage"] == {"prompt_tokens": 4, "completion_tokens": 7, "total_tokens": 11}
    assert evs[8] == "[DONE]"

    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2000, "stream": True, "ignore_eos": True})
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: gone\r\nContent-Type: "
                     f"application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
        received = b""
        while received.count(b"data: ") < 3:  # the stream is under way
            chunk = sock.recv(4096)
            assert chunk, "the server closed the stream early"
            received += chunk
    assert wait_until(lambda: served.requests_by_reason().get("client_cancel")) == 1
    time.sleep(0.5)  # any later terminal signal of the cancelled request would show by now
    samples = served.metrics()
    assert sum(v for (name, _), v in samples.items() if name == "llmslo_terminal_signals_ignored_total") == 0
    assert served.requests_by_reason() == {"length": 1, "client_cancel": 1}
    assert served.terminate() == 0
    rows = summaries(tmp_path / "j")
    assert rows["gone"]["finish_reason"] == "client_cancel" and rows["gone"]["generated_tokens"] < 2000


@pytest.mark.slow
def test_a_slow_reader_pauses_its_stream_in_the_engine(serve: Any, tmp_path: Path) -> None:
    served = serve("--speed", "20", "--stream-capacity", "4", "--jsonl", str(tmp_path / "j"), "--drain-settle", "0")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window stays small
    sock.settimeout(30)
    sock.connect(("127.0.0.1", served.port))
    try:
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1000, "stream": True, "ignore_eos": True})
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: slow\r\nContent-Type: "
                     f"application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}".encode())
        received = bytearray()
        for _ in range(40):  # 2 s reading 256 bytes each 50 ms: far slower than the engine writes
            received += sock.recv(256)
            time.sleep(0.05)
        while chunk := sock.recv(65536):
            received += chunk
    finally:
        sock.close()
    assert b"data: [DONE]\n\n" in received[-40:]  # the whole stream arrived (chunked: its end follows)
    assert served.terminate() == 0
    row = summaries(tmp_path / "j")["slow"]
    assert row["finish_reason"] == "length" and row["generated_tokens"] == row["sent_tokens"] == 1000
    assert row["stream_paused_s"] > 0.5, row  # the engine held the request back while the client was behind
    assert row["stream_max_queued"] == 4


@pytest.mark.slow
def test_sigterm_drains_then_exits_0_with_every_summary_and_a_drain_record(serve: Any, tmp_path: Path) -> None:
    jsonl, record_path = tmp_path / "j", tmp_path / "drain.json"
    served = serve("--speed", "1", "--jsonl", str(jsonl), "--drain-settle", "1s", "--drain-idle", "off",
                   "--drain-max-inflight", "2s", "--drain-poll", "50ms", "--drain-record", str(record_path),
                   "--version", "v1", "--next-version", "v2")
    replies: dict[str, tuple[int, dict[str, str], str]] = {}

    def ask(rid: str, max_tokens: int) -> None:
        replies[rid] = served.post({"model": MODEL, "prompt": "a b", "max_tokens": max_tokens, "stream": True,
                                    "ignore_eos": True, "stream_options": {"include_usage": True}}, rid)

    clients = [threading.Thread(target=ask, args=(f"long{i}", 5000)) for i in range(3)]
    clients += [threading.Thread(target=ask, args=("short", 30))]
    for c in clients:
        c.start()
    assert wait_until(lambda: served.metrics().get(("llmslo_in_flight_requests", (("model", MODEL),))) == 4)
    served.proc.send_signal(signal.SIGTERM)
    assert wait_until(lambda: served.get("/ready")[0] == 503, 5)  # within the settle time
    time.sleep(0.3)  # still in the settle time (1 s): the instance keeps listening, answering 503
    assert served.get("/ready")[0] == 503
    status, headers, text = served.post({"model": MODEL, "prompt": "late"}, "late")
    assert status == 503 and json.loads(text)["error"]["type"] == "draining" and headers["retry-after"] == "1"
    assert served.proc.wait(timeout=60) == 0
    for c in clients:
        c.join(timeout=30)
    for reader in served._readers:
        reader.join(timeout=10)

    assert replies["short"][0] == 200 and events(replies["short"][2])[-3]["choices"][0]["finish_reason"] == "length"
    for i in range(3):
        evs = events(replies[f"long{i}"][2])
        final, usage, done = evs[-3], evs[-2], evs[-1]
        assert final["choices"][0]["finish_reason"] == "server_draining" and final["drain_reason"] == "max_inflight"
        assert final["retryable"] is True and done == "[DONE]"
        assert usage["usage"]["completion_tokens"] == len(evs) - 3 < 5000
    rows = summaries(jsonl)
    assert set(rows) == {"long0", "long1", "long2", "short", "late"}  # nothing lost on SIGTERM
    assert [rows[f"long{i}"]["finish_reason"] for i in range(3)] == ["server_draining"] * 3
    assert (rows["late"]["finish_reason"], rows["late"]["reject_reason"]) == ("rejected", "draining")

    record = json.loads(record_path.read_text())
    drain = record["drain"]
    assert (drain["from_version"], drain["to_version"], drain["decision"]) == ("v1", "v2", "drained")
    assert drain["closed_by_reason"]["max_inflight"] == 3 and drain["unregister_settle_s"] == 1.0

    # the person at the terminal saw each step on standard error, in order, as the record tells it
    said = [line.rstrip("\n") for line in served.err]
    assert [line for line in served.out if line.strip()] == [served.out[0]]  # stdout: the ready line only
    n, ended = drain["in_flight_at_start"], sum(drain["ended_by_reason"].values())
    assert said == [
        "SIGTERM: draining: /ready is 503 and new requests get 503 draining; settle 1s (a second SIGTERM ends "
        "every request at once)",
        f"settled: draining {n} requests in flight (budget 2m, then terminate; closing requests in flight for 2s)",
        f"drain ended (drained) after {drain['actual_drain_s']:.2f}s: closed 3 (max_inflight 3), {ended} finished "
        f"on {'its' if ended == 1 else 'their'} own",
        f"exit 0: 5 summaries written, drain record {record_path}",
    ], said
    pytest.importorskip("duckdb", reason="llmslo rollout record needs the analysis extra")
    out = subprocess.run([sys.executable, "-m", "llmslo.cli", "rollout", "record", str(record_path), "--db",
                          str(tmp_path / "s.duckdb"), "--json"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["records"][0]["update_id"] == record["update_id"]


def test_summaries_reach_the_duckdb_store_given_with_db(serve: Any, tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb", reason="--db needs the analysis extra")
    db = tmp_path / "s.duckdb"
    served = serve("--speed", "50", "--db", str(db), "--drain-settle", "0")
    for i in range(5):
        assert served.post({"model": MODEL, "prompt": "p q", "max_tokens": 3}, f"d{i}")[0] == 200
    assert served.terminate() == 0
    con = duckdb.connect(str(db), read_only=True)
    try:
        ids = sorted(r[0] for r in con.sql("select request_id from request_summaries").fetchall())
    finally:
        con.close()
    assert ids == [f"d{i}" for i in range(5)]


def test_openai_prompt_shapes_over_a_real_socket(serve: Any, tmp_path: Path) -> None:
    """``prompt`` as OpenAI's /v1/completions takes it: a list of one string, token ids, a list of one list of
    token ids; a batch of several is a 400 that says to send one request each."""
    served = serve("--speed", "50", "--jsonl", str(tmp_path / "j"), "--drain-settle", "0")
    for rid, prompt, tokens in (("one", ["a b c"], 3), ("ids", [15496, 995, 0], 3), ("nested", [[1, 2, 3, 4, 5]], 5)):
        status, _, text = served.post({"model": MODEL, "prompt": prompt, "max_tokens": 2, "ignore_eos": True}, rid)
        assert status == 200, text
        assert json.loads(text)["usage"]["prompt_tokens"] == tokens
    status, _, text = served.post({"model": MODEL, "prompt": ["a", "b"], "max_tokens": 2}, "batch")
    assert status == 400 and json.loads(text)["error"]["message"].startswith(
        "prompt: a batch of 2 prompts is not served here: send one request per prompt")
    assert served.terminate() == 0
    rows = summaries(tmp_path / "j")
    assert {rid: rows[rid]["prompt_tokens"] for rid in ("one", "ids", "nested")} == {"one": 3, "ids": 3, "nested": 5}
    assert rows["batch"]["finish_reason"] == "error"
