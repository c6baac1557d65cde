"""``llmslo check URL``: one request found again in the server's own llmslo metrics.

The installed command, from a plain folder, against the tests' Starlette app under uvicorn: with the middleware
installed as ``vllm serve --middleware`` installs it (recorded: the request's id is an exemplar, and the server's
TTFT is at most the client's), without it (no llmslo metrics), and with a route the middleware does not observe
(llmslo metrics, but no trace of this request); through llmslo gateway in front of llmslo serve; against the real
llama-server, known by its own series; the verdicts from metrics texts; bad options."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmslo.loadgen import MetricsRead, RequestSeen, Target, check_server
from llmslo.loadgen._check import _verdict, parse_metrics
from llmslo.tests._loadgen_util import llmslo
from llmslo.tests._middleware_app import Uvicorn

APP = "llmslo.tests._middleware_app:app"


@pytest.fixture(scope="module")
def with_middleware() -> Iterator[str]:
    server = Uvicorn(APP, env={"LLMSLO_TEST_MIDDLEWARE": "1", "LLMSLO_MODEL": "test-model"})
    try:
        yield server.url
    finally:
        server.stop()


@pytest.mark.integration
def test_the_middleware_records_the_request_and_its_ttft_is_at_most_the_clients(
        with_middleware: str, tmp_path: Path) -> None:
    done = llmslo("check", with_middleware, "--model", "test-model", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "verdict   recorded: the server's llmslo metrics carry this request's id" in out, out
    assert "the response echoes the id" in out and "llmslo_ttft_seconds" in out, out

    done = llmslo("check", with_middleware + "/v1/completions", "--model", "test-model", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    r = json.loads(done.stdout)
    assert (r["verdict"], r["passed"], r["endpoint"]) == ("recorded", True, "completions")
    q = r["request"]
    assert q["echoed_request_id"] == q["request_id"] and q["finish_reason"] == "length"
    assert q["completion_tokens"] == q["content_chunks"] == 16
    assert r["after"]["requests_total"] == r["before"]["requests_total"] + 1
    assert 0 < r["server_ttft_s"] <= q["client_ttft_s"]
    assert r["server_ttft_s"] == r["after"]["exemplars"]["llmslo_ttft_seconds"]


@pytest.mark.integration
def test_a_server_without_llmslo_is_told_how_to_install_it(tmp_path: Path) -> None:
    server = Uvicorn(APP, env={"LLMSLO_TEST_MIDDLEWARE": "0"})
    try:
        done = llmslo("check", server.url, "--model", "test-model", cwd=tmp_path)
    finally:
        server.stop()
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "verdict   NOT recorded: the server has no llmslo metrics where looked" in out, out
    assert f"{server.url}/llmslo/metrics: HTTP 404" in out and f"{server.url}/metrics: HTTP 404" in out, out
    assert "--middleware llmslo.telemetry.LlmsloMiddleware" in out and "the response carries no request id" in out


@pytest.mark.integration
def test_a_route_the_middleware_does_not_observe_is_not_recorded(tmp_path: Path) -> None:
    server = Uvicorn(APP, env={"LLMSLO_TEST_MIDDLEWARE": "1", "LLMSLO_ROUTES": "/v1/completions"})
    try:
        done = llmslo("check", server.url, "--model", "test-model", "--endpoint", "chat", "--json", cwd=tmp_path)
    finally:
        server.stop()
    assert done.returncode == 1, done.stdout + done.stderr
    r = json.loads(done.stdout)
    assert r["verdict"] == "not_recorded" and r["request"]["finish_reason"] == "length"
    assert "LLMSLO_ROUTES" in r["advice"] and "/v1/chat/completions" in r["advice"]


@pytest.mark.integration
def test_the_gateway_records_it_at_metrics_and_its_backend_under_the_same_id(tmp_path: Path) -> None:
    """``/llmslo/metrics`` answers 404 there, so ``/metrics`` is read; ``--metrics`` reads the backend's own."""
    from llmslo.ops._live_processes import GATEWAY_READY, ready_match, ready_port, started
    from llmslo.tests._loadgen_util import LLMSLO

    with started([str(LLMSLO), "serve", "--port", "0"], tmp_path / "serve.log", stdout=subprocess.PIPE) as serve:
        backend = f"http://127.0.0.1:{ready_port(serve)}"
        with started([str(LLMSLO), "gateway", "--backend", backend, "--port", "0", "--admin-port", "0"],
                     tmp_path / "gateway.log", stdout=subprocess.PIPE) as gateway:
            url = f"http://127.0.0.1:{ready_match(gateway, GATEWAY_READY, 'llmslo gateway').group(1)}"
            at_gateway = llmslo("check", url, "--json", cwd=tmp_path)
            at_backend = llmslo("check", url, "--metrics", backend + "/metrics", "--json", cwd=tmp_path)
    for done in (at_gateway, at_backend):
        assert done.returncode == 0, done.stdout + done.stderr
    r = json.loads(at_gateway.stdout)
    assert [(read["url"], read["status"]) for read in r["looked"]] == [(url + "/llmslo/metrics", 404),
                                                                        (url + "/metrics", 200)]
    assert r["verdict"] == "recorded" and r["model"] == "llmslo-sim"
    assert 0 < r["server_ttft_s"] <= r["request"]["client_ttft_s"]
    r = json.loads(at_backend.stdout)
    assert r["verdict"] == "recorded" and r["before"]["url"] == backend + "/metrics"


@pytest.mark.integration
def test_a_llama_server_is_known_by_its_own_series_and_the_gateway_is_the_way_out(tmp_path: Path) -> None:
    from llmslo.ops import running_llama_server
    from llmslo.tests.test_live_llamacpp import require_engine

    require_engine()
    with running_llama_server(tmp_path / "engine", parallel=1) as engine:
        done = llmslo("check", engine.url, "--json", cwd=tmp_path)
        text = llmslo("check", engine.url, cwd=tmp_path)
    assert done.returncode == text.returncode == 1, done.stdout + done.stderr
    r = json.loads(done.stdout)
    assert r["verdict"] == "no_metrics" and r["request"]["finish_reason"] in ("stop", "length")
    assert r["model"] == engine.alias and r["request"]["completion_tokens"] >= 1
    assert (r["engine"]["key"], r["engine"]["url"]) == ("llamacpp", engine.url + "/metrics")
    assert r["engine"]["series"] >= 5
    assert f"llmslo gateway --backend {engine.url}" in r["advice"] and "middleware" not in r["advice"]
    assert f"{engine.url}/metrics is llama.cpp llama-server's own" in text.stdout, text.stdout


@pytest.mark.integration
def test_bad_options_exit_2_and_an_unreachable_server_1(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cases = [
        (("ftp://x",), 2, "URL: not an http(s) URL"),
        (("http://127.0.0.1:1", "--request-id-header", "off"), 2, "needs a header to carry the request's id"),
        (("http://127.0.0.1:1", "--metrics", "127.0.0.1:9464"), 2, "--metrics: an http(s) URL"),
        (("http://127.0.0.1:1", "--max-tokens", "0"), 2, "--max-tokens: must be at least 1"),
        (("http://127.0.0.1:1", "--tries", "0"), 2, "--tries: must be at least 1"),
        ((f"http://127.0.0.1:{port}",), 1, "cannot reach"),
    ]
    for args, code, message in cases:
        done = llmslo("check", *args, cwd=tmp_path)
        assert done.returncode == code, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)


# ---- the verdict, from metrics texts -------------------------------------------------------------------------

RID = "0b5e4c8a-2f1d-4c3e-9a7b-6d5e4f3a2b1c"
OPENMETRICS = f"""# TYPE llmslo_requests counter
llmslo_requests_total{{model="m",finish_reason="length"}} 3.0 # {{request_id="{RID}"}} 1.0 1.7e9
llmslo_requests_total{{model="m",finish_reason="stop"}} 2.0
# TYPE llmslo_ttft_seconds histogram
llmslo_ttft_seconds_bucket{{model="m",le="0.1"}} 4.0 # {{request_id="other"}} 0.05 1.7e9
llmslo_ttft_seconds_bucket{{model="m",le="+Inf"}} 5.0 # {{request_id="{RID}"}} 0.25 1.7e9
llmslo_ttft_seconds_count{{model="m"}} 5.0
llmslo_ttft_seconds_sum{{model="m"}} 0.6
# TYPE other_metric gauge
other_metric 1.0
# EOF
"""


def test_the_exemplars_of_the_request_are_found_and_the_counter_summed() -> None:
    families, total, found, others = parse_metrics(OPENMETRICS, RID, openmetrics=True)
    assert (families, total, others) == (2, 5.0, ("other_metric",))
    assert found == {"llmslo_requests_total": 1.0, "llmslo_ttft_seconds": 0.25}
    assert parse_metrics(OPENMETRICS, "nobody", openmetrics=True)[2] == {}
    with pytest.raises(ValueError):
        parse_metrics("llmslo_requests_total{", RID, openmetrics=True)


def _seen(finish: str = "length") -> RequestSeen:
    return RequestSeen(RID, 200, finish, None if finish == "length" else "HTTP 404 (empty body)", 16, 5, 16, 0.1,
                       0.2, RID)


@pytest.mark.parametrize(("before", "after", "verdict"), [
    (2.0, 3.0, "counted"),  # the counter rose, the exemplars are another request's
    (2.0, 2.0, "not_recorded"),
])
def test_without_the_id_among_the_exemplars_the_counter_decides(before: float, after: float, verdict: str) -> None:
    url = "http://s/metrics"
    got, advice = _verdict(_seen(), MetricsRead(url, 200, 2, before, openmetrics=True),
                           MetricsRead(url, 200, 2, after, openmetrics=True), [], "/v1/chat/completions")
    assert got == verdict and advice is not None


def test_a_failed_request_and_no_metrics_come_first() -> None:
    url = "http://s/metrics"
    ok = MetricsRead(url, 200, 2, 1.0, {"llmslo_ttft_seconds": 0.1}, True)
    assert _verdict(_seen("error"), ok, ok, [ok], "/v1/completions")[0] == "request_failed"
    assert _verdict(_seen(), None, None, [MetricsRead(url, 404, error="HTTP 404")], "/v1/completions")[0] == \
        "no_metrics"
    assert _verdict(_seen(), ok, ok, [ok], "/v1/completions") == ("recorded", None)


class BusyServer:
    """An ASGI server whose other clients replace the exemplars of the first ``replaced`` requests it gets before
    its metrics are read again (every read after a request shows another id), then keep them. It commits a
    request's terminal state only by its ``late``-th read after it (the reads before show another id), while its
    counter counts every request, and one more from another client at every read."""

    def __init__(self, replaced: int, late: int = 1) -> None:
        self.replaced = replaced
        self.late = late
        self.requests: list[str] = []
        self.reads = self.reads_since = 0

    async def __call__(self, scope: dict[str, object], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        if scope["path"] == "/llmslo/metrics":
            self.reads += 1
            self.reads_since += 1
            last = self.requests[-1] if self.requests else "none"
            ours = len(self.requests) > self.replaced and self.reads_since >= self.late
            shown = last if ours else "another-client"
            body = (f"# TYPE llmslo_requests counter\nllmslo_requests_total{{finish_reason=\"stop\"}} "
                    f"{float(len(self.requests) + self.reads)} # {{request_id=\"{shown}\"}} 1.0\n# EOF\n").encode()
            await _answer(send, 200, b"application/openmetrics-text; version=1.0.0; charset=utf-8", [body])
            return
        while (await receive()).get("more_body"):
            pass
        headers = dict(scope["headers"])  # type: ignore[call-overload]
        self.requests.append(headers[b"x-request-id"].decode())
        self.reads_since = 0
        event = {"id": "c", "object": "chat.completion.chunk", "model": "m",
                 "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
        usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
        await _answer(send, 200, b"text/event-stream", [f"data: {json.dumps(event)}\n\n".encode(),
                                                      f"data: {json.dumps(usage)}\n\n".encode(), b"data: [DONE]\n\n"])


async def _answer(send: Any, status: int, content_type: bytes, parts: list[bytes]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]})
    for i, part in enumerate(parts):
        await send({"type": "http.response.body", "body": part, "more_body": i < len(parts) - 1})


@pytest.mark.parametrize(("replaced", "tries", "verdict", "sent"), [
    (0, 3, "recorded", 1),
    (2, 3, "recorded", 3),  # the third request's exemplar stays
    (3, 3, "counted", 3),  # none of the three is found: the counter decides
    (2, 1, "counted", 1),
])
def test_on_a_busy_server_another_request_is_sent_until_one_is_found(replaced: int, tries: int, verdict: str,
                                                                      sent: int) -> None:
    server = BusyServer(replaced)
    target = Target.parse("http://busy.test", "chat")
    result = asyncio.run(check_server(target, model="m", tries=tries, transport=httpx.ASGITransport(app=server)))
    assert (result.verdict, result.sent, len(server.requests)) == (verdict, sent, sent)
    assert len(set(server.requests)) == sent  # each request its own id
    assert result.request.request_id == server.requests[-1]
    assert result.passed


def test_a_request_committed_a_moment_late_on_a_busy_server_is_found_by_reading_again() -> None:
    """The counter rose at once (other clients), but this request's exemplar shows only at the third read after
    it: the check reads on (:data:`AFTER_READS_S`) instead of sending another request."""
    server = BusyServer(0, late=3)
    result = asyncio.run(check_server(Target.parse("http://busy.test", "chat"), model="m",
                                      transport=httpx.ASGITransport(app=server)))
    assert (result.verdict, result.sent, server.reads) == ("recorded", 1, 1 + 3)


def test_the_report_says_how_many_requests_it_took() -> None:
    from llmslo.cli._check import _lines

    server = BusyServer(2)
    result = asyncio.run(check_server(Target.parse("http://busy.test", "chat"), model="m",
                                      transport=httpx.ASGITransport(app=server)))
    text = "\n".join(_lines(result))
    assert "3 requests sent: other requests replaced the exemplars of the first 2" in text
    assert f"request   id {server.requests[-1]}:" in text
    assert result.to_dict()["sent"] == 3
    none_found = asyncio.run(check_server(Target.parse("http://busy.test", "chat"), model="m",
                                          transport=httpx.ASGITransport(app=BusyServer(3))))
    assert "3 requests sent: other requests replaced the exemplars of every one" in "\n".join(_lines(none_found))


def test_tries_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="tries: at least 1"):
        asyncio.run(check_server(Target.parse("http://busy.test", "chat"), model="m", tries=0))
