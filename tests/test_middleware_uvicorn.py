"""The ASGI middleware in real processes: under uvicorn on 127.0.0.1, installed as ``vllm serve --middleware``
installs it (``app.add_middleware(cls)``, no arguments: configured by ``LLMSLO_*`` variables), driven by httpx
and by ``llmslo load``.

1. The Starlette test app: a stream with usage, a whole reply, a 429 with ``Retry-After``, a 400 with an
   empty body, a client that hangs up mid-stream, an app that raises; the summaries come from
   ``LLMSLO_SUMMARY_PATH`` once uvicorn exited (the sink is flushed at exit), the metrics from
   ``LLMSLO_METRICS_PORT`` and from the app's own ``/llmslo/metrics``.
2. llmslo's reference server (``llmslo serve``'s app, its own telemetry off) with the middleware around it,
   under ``llmslo load`` (30 % of the clients hang up after 40 ms): one middleware summary per request the
   server got, matching the client's on the request id, with the same finish reason and tokens (a hang-up
   that reached the server after it completed the reply is ``length`` there), and the server's TTFT at most
   the client's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from llmslo.tests._middleware_app import Uvicorn, free_port, read_jsonl

pytestmark = pytest.mark.integration

Row = dict[str, Any]


def _post(client: httpx.Client, path: str, body: dict[str, Any], rid: str, **kwargs: Any) -> httpx.Response:
    return client.post(path, json=body, headers={"x-request-id": rid}, **kwargs)


def _stream_body(tokens: int) -> dict[str, Any]:
    return {"model": "test-model", "prompt": "a b c d e", "max_tokens": tokens, "stream": True,
            "stream_options": {"include_usage": True}}


def _wait_for(check: Any, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def test_under_uvicorn_installed_without_arguments(tmp_path: Path) -> None:
    summaries, port = tmp_path / "summaries", free_port()
    env = {"LLMSLO_TEST_MIDDLEWARE": "1", "LLMSLO_SUMMARY_PATH": str(summaries), "LLMSLO_METRICS_PORT": str(port),
           "LLMSLO_MODEL": "test-model", "LLMSLO_VERSION": "u1"}
    server = Uvicorn("llmslo.tests._middleware_app:app", env=env)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            first_chunk: list[float] = []
            sent = time.monotonic()
            with client.stream("POST", "/v1/chat/completions", json=_stream_body(64),
                               headers={"x-request-id": "s-1"}) as r:
                assert r.headers["x-request-id"] == "s-1" and r.headers["x-app-request-id"] == "s-1"
                data = b""
                for part in r.iter_bytes():
                    if b'"content":"tok"' in part and not first_chunk:
                        first_chunk.append(time.monotonic() - sent)
                    data += part
            assert data.count(b'"content":"tok"') == 64
            r = _post(client, "/v1/completions?finish=stop", {"prompt": "x y", "max_tokens": 5}, "w-1")
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
            r = _post(client, "/v1/completions?status=429&type=queue_full&retry_after=3", {}, "q-1")
            assert r.status_code == 429 and r.headers["retry-after"] == "3" and r.headers["x-request-id"] == "q-1"
            r = _post(client, "/v1/completions?status=400&empty=1", {}, "e-1")
            assert r.status_code == 400 and r.content == b""
            # Starlette's error middleware answers the 500 (no "connection: close") and re-raises, and uvicorn
            # then closes the connection: a request sent on it meanwhile is reset, so this one closes it itself
            r = client.post("/v1/completions?raise=1", json={}, headers={"x-request-id": "x-1", "connection": "close"})
            assert r.status_code == 500
            with client.stream("POST", "/v1/completions?tps=20", json=_stream_body(200),
                               headers={"x-request-id": "c-1"}) as r:
                for part in r.iter_bytes():
                    if part.count(b"tok") >= 1:
                        break  # hang up after the first token
            r = client.get("/other")
            assert r.status_code == 200 and "x-request-id" not in r.headers
            own = client.get("/llmslo/metrics", headers={"accept": "application/openmetrics-text"}).text
        standalone = httpx.get(f"http://127.0.0.1:{port}/metrics",
                               headers={"accept": "application/openmetrics-text"}, timeout=10).text
        # the hang-up reaches the app when uvicorn notices it: wait until the cancelled request ended
        _wait_for(lambda: 'finish_reason="client_cancel"' in httpx.get(f"http://127.0.0.1:{port}/metrics").text)
    finally:
        code = server.stop()
    assert code in (0, -15), "".join(server.log)  # uvicorn re-raises SIGTERM once it has shut down
    rows = {r["request_id"]: r for r in read_jsonl(summaries)}
    assert set(rows) == {"s-1", "w-1", "q-1", "e-1", "x-1", "c-1"}, rows
    assert all(r["version"] == "u1" and r["model"] == "test-model" for r in rows.values())
    s = rows["s-1"]
    assert (s["finish_reason"], s["generated_tokens"], s["sent_tokens"], s["prompt_tokens"]) == ("length", 64, 64, 5)
    assert s["ttft_s"] <= first_chunk[0]  # the server hands the chunk over before the client reads it
    w = rows["w-1"]
    assert (w["finish_reason"], w["generated_tokens"], w["prompt_tokens"]) == ("stop", 5, 2)
    assert (rows["q-1"]["finish_reason"], rows["q-1"]["reject_reason"]) == ("rejected", "queue_full")
    assert (rows["e-1"]["finish_reason"], rows["e-1"]["error_type"]) == ("error", "http_400")
    assert (rows["x-1"]["finish_reason"], rows["x-1"]["error_type"]) == ("error", "RuntimeError")
    c = rows["c-1"]
    assert c["finish_reason"] == "client_cancel" and 1 <= c["generated_tokens"] < 200
    for text in (own, standalone):
        assert 'llmslo_ttft_seconds_bucket{' in text and '# {request_id="s-1"}' in text
        samples = {(x.name, tuple(sorted(x.labels.items()))): x.value
                   for f in text_string_to_metric_families(text) for x in f.samples}
        assert samples[("llmslo_retry_after_seconds_sum",
                        (("model", "test-model"), ("reject_reason", "queue_full")))] == 3.0


def _client_rows(db: Path) -> list[Row]:
    import duckdb

    from llmslo.analysis.store import SUMMARY_TABLE

    con = duckdb.connect(str(db), read_only=True)
    try:
        rel = con.sql(f"SELECT request_id, finish_reason, ttft_s, client_ttft_s, generated_tokens, prompt_tokens "
                      f"FROM {SUMMARY_TABLE}")
        names = rel.columns
        return [dict(zip(names, values, strict=True)) for values in rel.fetchall()]
    finally:
        con.close()


@pytest.mark.slow
def test_the_reference_server_under_llmslo_load_matches_the_client_one_to_one(tmp_path: Path) -> None:
    summaries, db = tmp_path / "server", tmp_path / "client.duckdb"
    env = {"LLMSLO_SUMMARY_PATH": str(summaries), "LLMSLO_MODEL": "llmslo-sim", "LLMSLO_VERSION": "mw-1",
           "LLMSLO_METRICS_PATH": "/llmslo/metrics", "LLMSLO_TEST_SPEED": "10"}
    server = Uvicorn("llmslo.tests._middleware_app:reference_app", env=env, factory=True, lifespan="on")
    try:
        script = Path(sys.executable).with_name("llmslo")  # the installed command, beside the interpreter
        command = [str(script)] if script.exists() else [sys.executable, "-m", "llmslo.cli"]
        load = subprocess.run(
            [*command, "load", server.url, "--rate", "25", "--max-requests", "60",
             "--prompt-tokens", "8-32", "--output-tokens", "32-96", "--cancel", "0.3@40ms", "--seed", "3", "--db",
             str(db), "--json", "--no-progress"], capture_output=True, text=True, timeout=180)
        assert load.returncode == 0, load.stderr
    finally:
        code = server.stop()
    assert code in (0, -15), "".join(server.log)
    doc = json.loads(load.stdout)
    client = {r["request_id"]: r for r in _client_rows(db)}
    mine = {r["request_id"]: r for r in read_jsonl(summaries)}
    assert len(client) == 60 == doc["load"]["attempted"]
    seen = {line.split()[1] for line in server.log if line.startswith("llmslo-test-seen ")}
    assert set(mine) == seen <= set(client)  # one summary for each request the server got, on the client's id
    for rid in set(client) - seen:  # a client that hung up before the server read its request (a busy machine)
        assert client[rid]["finish_reason"] == "client_cancel" and client[rid]["client_ttft_s"] is None
    assert len(seen) >= 50
    client = {rid: c for rid, c in client.items() if rid in seen}
    assert {c["finish_reason"] for c in client.values()} == {"length", "client_cancel"}
    cancelled = 0
    for rid, c in client.items():
        m = mine[rid]
        assert m["version"] == "mw-1" and m["model"] == "llmslo-sim"
        if c["finish_reason"] == "length":
            assert m["finish_reason"] == "length", (m, c)
            assert (m["generated_tokens"], m["prompt_tokens"]) == (c["generated_tokens"], c["prompt_tokens"]), (m, c)
        else:  # the client hung up: the server saw it (having handed over tokens the client never read), or had
            # completed the reply before the hang-up reached it (the client's clock and the server's disagree)
            assert m["finish_reason"] in ("client_cancel", "length"), (m, c)
            assert m["generated_tokens"] >= c["generated_tokens"], (m, c)
            cancelled += m["finish_reason"] == "client_cancel"
        if c["client_ttft_s"] is not None:
            assert m["ttft_s"] is not None and m["ttft_s"] <= c["client_ttft_s"], (rid, m, c)
    assert cancelled >= 5  # the middleware hears hang-ups through the app's receive
