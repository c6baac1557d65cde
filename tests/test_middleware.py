"""The ASGI middleware in process: a Starlette app (tests/_middleware_app.py) called through its ASGI callable,
the client played by this test (its receive and send), so a disconnect can come at any chunk.

Each case checks the summary row the middleware hands to the sink against what the app sent, the response
against what the app sent without the middleware, and the metrics for ``request_id`` exemplars."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from llmslo.telemetry import (
    LlmsloMiddleware,
    MiddlewareConfig,
    Telemetry,
    render_metrics,
    valid_request_id,
    validate_summary,
)
from llmslo.telemetry import _middleware as M
from llmslo.telemetry import _reply_observer as reply_observer
from llmslo.telemetry._openai_stream import SseParser, read_event
from llmslo.tests._middleware_app import make_app

Row = dict[str, Any]


@dataclass
class Exchange:
    """What the client saw of one call: status, headers, body, the time each body message arrived."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    body_ns: list[int] = field(default_factory=list)
    start_ns: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)
    raised: BaseException | None = None

    def header(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k.lower() == name]


def call(app: Any, path: str, body: object = None, *, query: str = "", headers: Sequence[tuple[bytes, bytes]] = (),
         method: str = "POST", disconnect_after: int | None = None, send_s: float = 0.0) -> Exchange:
    """Call ``app`` as uvicorn does (ASGI spec 2.3); with ``disconnect_after`` the client hangs up once that many
    body messages arrived (the server then drops whatever the app sends, and ``receive`` says so); ``send_s``:
    each body message takes that long to hand over (a transport that pushes back)."""
    out = Exchange()
    raw = b"" if body is None else json.dumps(body).encode()

    async def main() -> None:
        gone = asyncio.Event()
        read = False

        async def receive() -> dict[str, Any]:
            nonlocal read
            if not read:
                read = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if gone.is_set():
                return
            out.messages.append(message)
            if message["type"] == "http.response.start":
                out.status = message["status"]
                out.headers = list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                out.body += message.get("body", b"")
                out.body_ns.append(time.monotonic_ns())
                if send_s:
                    await asyncio.sleep(send_s)
                if not message.get("more_body", False):
                    gone.set()  # a completed response: receive() now reports a disconnect
                elif disconnect_after is not None and len(out.body_ns) >= disconnect_after:
                    gone.set()

        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": query.encode(), "root_path": "",
                 "headers": [(b"host", b"test"), (b"content-type", b"application/json"), *headers],
                 "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
        out.start_ns = time.monotonic_ns()
        try:
            await app(scope, receive, send)
        except Exception as exc:
            out.raised = exc

    asyncio.run(main())
    return out


class Setup:
    """A Starlette app with the middleware and its telemetry, the summaries in a list."""

    def __init__(self, **kwargs: Any) -> None:
        self.rows: list[Row] = []
        self.tel = Telemetry(version="t1", sink=self.rows.append)
        self.app = make_app()
        self.app.add_middleware(LlmsloMiddleware, telemetry=self.tel, model="test-model", **kwargs)

    def call(self, path: str, body: object = None, **kwargs: Any) -> tuple[Exchange, Row]:
        before = len(self.rows)
        ex = call(self.app, path, body, **kwargs)
        assert len(self.rows) == before + 1, f"expected one summary, got {self.rows[before:]}"
        assert not self.tel.in_flight()
        return ex, self.rows[-1]

    def metrics(self) -> str:
        return render_metrics(self.tel.registry, "application/openmetrics-text")[0].decode()


def stream_body(tokens: int = 8, usage: bool = True, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "test-model", "prompt": "one two three four", "max_tokens": tokens,
                            "stream": True, **extra}
    if usage:
        body["stream_options"] = {"include_usage": True}
    return body


def content_chunks(data: bytes) -> int:
    """Content chunks of an event stream, as the one reader reads them."""
    return sum(1 for p in SseParser().feed(data) if read_event(p).content)


def _no_ignored_signals(s: Setup) -> None:
    assert "llmslo_terminal_signals_ignored_total{" not in s.metrics()


# ---- streams -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_stream_with_usage_gives_one_valid_summary(path: str) -> None:
    s = Setup()
    ex, row = s.call(path, stream_body(64))
    assert ex.status == 200 and ex.raised is None
    assert content_chunks(ex.body) == 64
    assert validate_summary(row) == []
    assert row["finish_reason"] == "length" and row["error_type"] is None
    assert row["generated_tokens"] == row["sent_tokens"] == 64
    assert row["prompt_tokens"] == 4  # from usage
    assert row["model"] == "test-model" and row["version"] == "t1"
    assert row["ttft_s"] is not None and row["ttft_s"] <= row["last_token_s"] <= row["e2e_s"]
    assert row["queue_s"] is None  # the middleware cannot see the engine's queue
    _no_ignored_signals(s)


def test_ttft_is_the_first_content_chunk_not_the_role_chunk() -> None:
    """The chat stream's role chunk (empty content) goes out at once, the first token 0.2 s later."""
    s = Setup()
    ex, row = s.call("/v1/chat/completions", stream_body(4), query="first_delay=0.2")
    assert ex.status == 200
    assert row["ttft_s"] >= 0.2
    assert row["generated_tokens"] == 4


def test_a_token_is_committed_when_handed_over_not_when_the_transport_took_it() -> None:
    """Each body message takes 0.1 s to hand over: every token counts from the moment the app hands it (read or
    matched), not 0.1 s later when the transport took it, so the commits' gaps are the hand-overs' gaps."""
    s = Setup()
    s.tel.record_itl = True
    ex, row = s.call("/v1/completions", stream_body(4, usage=False), send_s=0.1)
    assert row["generated_tokens"] == 4
    assert row["ttft_s"] * 1e9 <= ex.body_ns[0] - ex.start_ns  # committed before it was handed over
    handed = [(b - a) / 1e9 for a, b in zip(ex.body_ns, ex.body_ns[1:4], strict=False)]
    assert min(handed) >= 0.1
    assert len(row["itl_s"]) == 3 and all(abs(g - h) < 0.02 for g, h in zip(row["itl_s"], handed, strict=True)), (
        row["itl_s"], handed)


def test_the_response_is_untouched_but_for_the_request_id() -> None:
    """Byte for byte what the app sends without the middleware (the stream's varying ``created`` aside)."""
    s = Setup()
    bare = call(make_app(), "/v1/completions", stream_body(16), headers=[(b"x-request-id", b"r-1")])
    ex, _ = s.call("/v1/completions", stream_body(16), headers=[(b"x-request-id", b"r-1")])
    strip = re.compile(rb'"created":\d+')
    assert strip.sub(b"", ex.body) == strip.sub(b"", bare.body)
    assert [m.get("more_body", False) for m in ex.messages[1:]] == [m.get("more_body", False)
                                                                   for m in bare.messages[1:]]
    assert sorted(h for h in ex.headers if h[0] != b"x-request-id") == sorted(
        h for h in bare.headers if h[0] != b"x-request-id")
    assert ex.header(b"x-request-id") == [b"r-1"]


def test_chunks_of_several_tokens_count_the_usage_tokens() -> None:
    """Three tokens a chunk, usage only at the end: 30 tokens generated, 10 commits before the usage."""
    s = Setup()
    ex, row = s.call("/v1/completions", stream_body(30), query="k=3")
    assert content_chunks(ex.body) == 10
    assert row["generated_tokens"] == 30 and row["sent_tokens"] == 30
    assert row["finish_reason"] == "length"


def test_per_chunk_usage_gives_token_weighted_commits() -> None:
    """Cumulative usage on every chunk: each chunk is one commit of 3 tokens, so 3 ITL samples per gap."""
    s = Setup()
    s.tel.record_itl = True
    _, row = s.call("/v1/completions", stream_body(12), query="k=3&per_chunk_usage=1&tps=200")
    assert row["generated_tokens"] == 12
    gaps = row["itl_s"]
    assert len(gaps) == 9  # 3 gaps between 4 commits, 3 samples each
    assert all(gaps[i] == gaps[i + 1] == gaps[i + 2] for i in range(0, 9, 3))


def test_a_stream_without_usage_counts_one_token_per_content_chunk() -> None:
    s = Setup()
    _, row = s.call("/v1/chat/completions", stream_body(7, usage=False), query="finish=stop")
    assert row["generated_tokens"] == 7 and row["finish_reason"] == "stop"
    assert row["prompt_tokens"] == 0  # no usage: unknown


def test_spaced_json_and_crlf_events_are_read_too() -> None:
    """llama-cpp-python's shape: json.dumps with spaces, sse-starlette's CRLF line ends."""
    s = Setup()
    ex, row = s.call("/v1/chat/completions", stream_body(20), query="spaced=1&finish=stop")
    assert b"\r\n\r\n" in ex.body and b'"content": "tok"' in ex.body
    assert row["generated_tokens"] == 20 and row["finish_reason"] == "stop"


@pytest.mark.parametrize(("error_type", "finish", "error"), [
    ("error", "error", "stream_error"),
    ("server_draining", "server_draining", None),
    ("deadline", "deadline", None),
])
def test_an_error_event_ends_the_stream(error_type: str, finish: str, error: str | None) -> None:
    s = Setup()
    ex, row = s.call("/v1/completions", stream_body(10), query=f"error_after=4&error_type={error_type}")
    assert ex.status == 200
    assert row["finish_reason"] == finish and row["error_type"] == error
    assert row["generated_tokens"] == 4


def test_a_stream_that_completes_without_a_finish_reason_is_truncated() -> None:
    s = Setup()
    _, row = s.call("/v1/completions", stream_body(5, usage=False), query="finish=")
    assert row["finish_reason"] == "error" and row["error_type"] == "truncated"
    assert row["generated_tokens"] == 5


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(max_size=6), min_size=1, max_size=12), chat=st.booleans(), spaced=st.booleans())
def test_every_chunk_is_counted_as_the_one_reader_reads_it(texts: list[str], chat: bool, spaced: bool) -> None:
    """Whatever the texts (quotes, backslashes, newlines, empty ones, any character), the commits are the
    content chunks the reader finds, whether the middleware parsed a chunk or matched its learnt shape."""
    end = "\r\n\r\n" if spaced else "\n\n"

    def dumps(obj: object) -> str:
        return json.dumps(obj) if spaced else json.dumps(obj, separators=(",", ":"))

    def chunk(text: str, reason: str | None) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
        choice["finish_reason"] = reason
        return f"data: {dumps({'id': 'x', 'object': 'chunk', 'choices': [choice]})}{end}".encode()

    bodies = [chunk(t, None) for t in texts] + [chunk("", "stop"), f"data: [DONE]{end}".encode()]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for b in bodies:
            await send({"type": "http.response.body", "body": b, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    rows: list[Row] = []
    tel = Telemetry(sink=rows.append)
    ex = call(LlmsloMiddleware(app, telemetry=tel), "/v1/completions", {})
    assert ex.body == b"".join(bodies)
    assert rows[0]["generated_tokens"] == content_chunks(ex.body) == sum(1 for t in texts if t)
    assert rows[0]["finish_reason"] == "stop"


def test_a_chunk_that_keeps_the_shape_ends_but_not_its_structure_is_read() -> None:
    """After plain chunks, one with the same first and last bytes whose middle holds a structure (a top-level
    usage) rather than text: the reader's reading counts (10 tokens), not the shape's (one more)."""
    head = b'data: {"id":"x","choices":[{"index":0,"text":"'
    tail = b'","finish_reason":null}]}\n\n'
    middle = b'a","finish_reason":null}],"usage":{"completion_tokens":10},"choices":[{"index":0,"text":"b'
    crafted = head + middle + tail

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for body in (head + b"one" + tail, head + b"two" + tail, crafted,
                     b'data: {"id":"x","choices":[{"index":0,"text":"","finish_reason":"stop"}]}\n\n'):
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    assert read_event(crafted[6:-2]).completion_tokens == 10
    rows: list[Row] = []
    call(LlmsloMiddleware(app, telemetry=Telemetry(sink=rows.append)), "/v1/completions", {})
    assert rows[0]["generated_tokens"] == 10


# ---- whole replies -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_whole_reply_is_one_commit_of_its_usage_tokens(path: str) -> None:
    s = Setup()
    ex, row = s.call(path, {"model": "test-model", "prompt": "a b c", "max_tokens": 9}, query="finish=stop")
    assert ex.status == 200 and json.loads(ex.body)["usage"]["completion_tokens"] == 9
    assert row["finish_reason"] == "stop"
    assert row["generated_tokens"] == row["sent_tokens"] == 9 and row["prompt_tokens"] == 3
    assert row["ttft_s"] == row["last_token_s"] <= row["e2e_s"]
    assert validate_summary(row) == []


def test_a_reply_beyond_the_bound_passes_whole_and_its_tokens_stay_unknown(monkeypatch: pytest.MonkeyPatch
                                                                           ) -> None:
    monkeypatch.setattr(reply_observer, "MAX_REPLY_BYTES", 100)
    s = Setup()
    ex, row = s.call("/v1/completions", {"model": "m", "prompt": "a", "max_tokens": 50}, query="finish=stop")
    assert json.loads(ex.body)["usage"]["completion_tokens"] == 50
    assert row["finish_reason"] == "stop" and row["generated_tokens"] == 0


# ---- refusals and errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("query", "finish", "reject", "error"), [
    ("status=429&type=queue_full&retry_after=2", "rejected", "queue_full", None),
    ("status=429&retry_after=2", "rejected", "rate_limited", None),
    ("status=429&type=invalid_request_error", "rejected", "rate_limited", None),
    ("status=503&type=draining&retry_after=1", "rejected", "draining", None),
    ("status=503&type=circuit_open", "rejected", "circuit_open", None),
    ("status=503", "error", None, "http_503"),
    ("status=504&type=deadline", "deadline", None, None),
    ("status=400&empty=1", "error", None, "http_400"),
    ("status=500&type=internal_error", "error", None, "http_500"),
])
def test_a_status_of_400_or_more(query: str, finish: str, reject: str | None, error: str | None) -> None:
    s = Setup()
    ex, row = s.call("/v1/completions", stream_body(), query=query)
    assert ex.status == int(query.split("&")[0].split("=")[1])
    assert (row["finish_reason"], row["reject_reason"], row["error_type"]) == (finish, reject, error)
    assert row["generated_tokens"] == 0 and row["ttft_s"] is None
    assert validate_summary(row) == []
    if "empty=1" in query:
        assert ex.body == b""


def test_a_429_observes_its_retry_after() -> None:
    s = Setup()
    ex, _ = s.call("/v1/completions", stream_body(), query="status=429&type=queue_full&retry_after=2")
    assert ex.header(b"retry-after") == [b"2"]
    samples = {(x.name, tuple(sorted(x.labels.items()))): x.value for f in text_string_to_metric_families(
        render_metrics(s.tel.registry)[0].decode()) for x in f.samples}
    assert samples[("llmslo_retry_after_seconds_count",
                    (("model", "test-model"), ("reject_reason", "queue_full")))] == 1
    assert samples[("llmslo_retry_after_seconds_sum",
                    (("model", "test-model"), ("reject_reason", "queue_full")))] == 2


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert reply_observer.retry_after_seconds(b"2") == 2.0
    assert reply_observer.retry_after_seconds(" 1.5 ") == 1.5
    assert reply_observer.retry_after_seconds("Wed, 21 Oct 2015 07:28:10 GMT", now_unix_s=1445412480.0) == 10.0
    assert reply_observer.retry_after_seconds("Wed, 21 Oct 2015 07:28:10 GMT", now_unix_s=1445412500.0) == 0.0
    for bad in (None, "", "soon", "-1", "nan", "inf"):
        assert reply_observer.retry_after_seconds(bad) is None


def test_an_error_body_is_kept_only_up_to_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 503 whose body is longer than the bound: its type past the bound is not read (http_503)."""
    monkeypatch.setattr(reply_observer, "MAX_ERROR_BODY_BYTES", 10)
    s = Setup()
    ex, row = s.call("/v1/completions", stream_body(), query="status=503&type=draining")
    assert b"draining" in ex.body
    assert row["finish_reason"] == "error" and row["error_type"] == "http_503"


def test_an_app_that_raises_before_answering() -> None:
    s = Setup()
    ex, row = s.call("/v1/completions", stream_body(), query="raise=1")
    assert isinstance(ex.raised, RuntimeError)
    assert ex.status == 500  # Starlette's outermost layer answers it, outside the middleware
    assert row["finish_reason"] == "error" and row["error_type"] == "RuntimeError"
    _no_ignored_signals(s)


def test_an_app_that_raises_mid_stream() -> None:
    s = Setup()
    ex, row = s.call("/v1/completions", stream_body(10), query="raise_after=3")
    assert isinstance(ex.raised, RuntimeError) and ex.status == 200
    assert row["finish_reason"] == "error" and row["error_type"] == "RuntimeError"
    assert row["generated_tokens"] == 3


# ---- client disconnects ------------------------------------------------------------------------------------


def test_a_client_that_hangs_up_mid_stream_is_client_cancel() -> None:
    """The client leaves after the 5th body message (4 tokens, paced); Starlette hears it through receive."""
    s = Setup()
    ex, row = s.call("/v1/completions", stream_body(50), query="tps=100", disconnect_after=5)
    assert content_chunks(ex.body) == 5
    assert row["finish_reason"] == "client_cancel"
    assert 5 <= row["generated_tokens"] < 50 and row["sent_tokens"] <= row["generated_tokens"]
    _no_ignored_signals(s)


def test_a_disconnect_ends_the_request_when_the_app_hears_it() -> None:
    """An app that hears the disconnect but streams on (its sends are dropped by the server): the request ends
    at the disconnect, with the tokens handed over by then, not when the app stops."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()

        async def watch() -> None:
            await receive()

        watcher = asyncio.get_running_loop().create_task(watch())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(30):
            data = json.dumps({"choices": [{"text": f"t{i}", "finish_reason": None if i < 29 else "length"}]})
            await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        await watcher

    rows: list[Row] = []
    tel = Telemetry(sink=rows.append)
    call(LlmsloMiddleware(app, telemetry=tel), "/v1/completions", {}, disconnect_after=5)
    assert rows[0]["finish_reason"] == "client_cancel"
    assert 5 <= rows[0]["generated_tokens"] <= 7 and rows[0]["e2e_s"] < 0.25  # the app streams on for 0.3 s
    assert "llmslo_terminal_signals_ignored_total{" not in render_metrics(tel.registry)[0].decode()


def test_a_disconnect_after_the_response_completed_is_no_cancel() -> None:
    """uvicorn answers every receive after a completed response with http.disconnect; the request stays
    ``length`` and no ignored signal is counted."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b'data: {"choices":[{"text":"a","finish_reason":"length"}]}'
                    b"\n\n", "more_body": False})
        assert (await receive())["type"] == "http.disconnect"

    rows: list[Row] = []
    tel = Telemetry(sink=rows.append)
    call(LlmsloMiddleware(app, telemetry=tel), "/v1/completions", {})
    assert rows[0]["finish_reason"] == "length"
    assert "llmslo_terminal_signals_ignored_total{" not in render_metrics(tel.registry)[0].decode()


def test_a_send_that_fails_is_client_cancel() -> None:
    """With ASGI spec 2.4 a server raises OSError from send once the client is gone."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b'data: {"choices":[{"text":"a"}]}\n\n', "more_body": True})

    async def failing(message: Any) -> None:
        if message["type"] == "http.response.body":
            raise OSError("gone")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}"}

    rows: list[Row] = []
    mw = LlmsloMiddleware(app, telemetry=Telemetry(sink=rows.append))
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    with pytest.raises(OSError):
        asyncio.run(mw(scope, receive, failing))
    assert rows[0]["finish_reason"] == "client_cancel"


# ---- request ids -------------------------------------------------------------------------------------------


def test_an_incoming_request_id_is_kept_and_echoed_once() -> None:
    s = Setup()
    ex, row = s.call("/v1/completions", stream_body(2), headers=[(b"x-request-id", b"abc-123")])
    assert row["request_id"] == "abc-123"
    assert ex.header(b"x-request-id") == [b"abc-123"] and ex.header(b"x-app-request-id") == [b"abc-123"]
    assert 'request_id="abc-123"' in s.metrics()  # an exemplar names it


def test_without_a_request_id_a_uuid4_is_made_given_to_the_app_and_echoed() -> None:
    s = Setup()
    ex, row = s.call("/v1/completions", stream_body(2))
    rid = row["request_id"]
    assert uuid.UUID(rid).version == 4 and str(uuid.UUID(rid)) == rid
    assert ex.header(b"x-request-id") == [rid.encode()] and ex.header(b"x-app-request-id") == [rid.encode()]


def test_an_unusable_request_id_is_replaced() -> None:
    s = Setup()
    ex, row = s.call("/v1/completions", stream_body(2), headers=[(b"x-request-id", b"bad id with spaces")])
    assert uuid.UUID(row["request_id"]).version == 4
    assert ex.header(b"x-request-id") == [row["request_id"].encode()]


def test_a_request_id_is_taken_as_it_is_only_when_it_is_1_to_128_safe_characters() -> None:
    assert valid_request_id("abc-123") and valid_request_id("a.b_c:d-E9") and valid_request_id("x" * 128)
    assert not any(valid_request_id(v) for v in (None, "", "x" * 129, "bad id", "bad\x01id", "é", "a/b"))


def test_the_request_id_header_name_is_configurable() -> None:
    s = Setup(request_id_header="X-Correlation-Id")
    ex, row = s.call("/v1/completions", stream_body(2), headers=[(b"x-correlation-id", b"c-9")])
    assert row["request_id"] == "c-9" and ex.header(b"x-correlation-id") == [b"c-9"]


def test_an_id_the_app_sets_itself_is_replaced_by_the_middleware_one() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"X-Request-Id", b"app-own")]})
        await send({"type": "http.response.body", "body": b'{"choices":[{"text":"a","finish_reason":"stop"}]}'})

    rows: list[Row] = []
    ex = call(LlmsloMiddleware(app, telemetry=Telemetry(sink=rows.append)), "/v1/completions", {},
              headers=[(b"x-request-id", b"client-1")])
    assert ex.header(b"x-request-id") == [b"client-1"] and rows[0]["request_id"] == "client-1"


# ---- what it leaves alone ----------------------------------------------------------------------------------


def test_routes_it_does_not_observe_pass_through_without_a_tracker() -> None:
    s = Setup()
    for path, method in (("/other", "GET"), ("/other", "POST"), ("/v1/completions", "GET")):
        ex = call(s.app, path, method=method)
        assert ex.status in (200, 405)
        assert ex.header(b"x-request-id") == []
    assert s.rows == [] and "llmslo_requests_total{" not in s.metrics()


def test_configured_routes_are_the_ones_observed() -> None:
    s = Setup(routes=["/other"])
    call(s.app, "/v1/completions", stream_body(2))
    assert s.rows == []
    call(s.app, "/other", {})
    assert len(s.rows) == 1


def test_lifespan_and_websocket_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    mw = LlmsloMiddleware(app, telemetry=Telemetry())
    for kind in ("lifespan", "websocket"):
        asyncio.run(mw({"type": kind, "path": "/v1/completions"}, None, None))  # type: ignore[arg-type]
    assert seen == ["lifespan", "websocket"]


def test_metrics_path_serves_the_telemetry() -> None:
    s = Setup(metrics_path="/llmslo/metrics")
    s.call("/v1/completions", stream_body(2), headers=[(b"x-request-id", b"m-1")])
    ex = call(s.app, "/llmslo/metrics", method="GET", headers=[(b"accept", b"application/openmetrics-text")])
    text = ex.body.decode()
    assert ex.status == 200 and 'llmslo_requests_total{' in text and 'request_id="m-1"' in text


# ---- it never breaks the app -------------------------------------------------------------------------------


def test_an_internal_error_is_counted_and_the_response_passes_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(payload: bytes) -> Any:
        raise ZeroDivisionError("a bug in the reader")

    monkeypatch.setattr(reply_observer, "read_event", broken)
    s = Setup()
    bare = call(make_app(), "/v1/completions", stream_body(6), headers=[(b"x-request-id", b"r-2")])
    ex, row = s.call("/v1/completions", stream_body(6), headers=[(b"x-request-id", b"r-2")])
    strip = re.compile(rb'"created":\d+')
    assert ex.status == 200 and strip.sub(b"", ex.body) == strip.sub(b"", bare.body)
    assert row["finish_reason"] == "error" and row["error_type"] == "middleware_error"
    assert "llmslo_internal_errors_total 1.0" in s.metrics()
    assert s.tel.guard.errors == {"middleware.send": 1}


def test_a_failure_at_the_start_leaves_the_request_to_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Setup()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("cannot start")

    monkeypatch.setattr(s.tel, "start", broken)
    ex = call(s.app, "/v1/completions", stream_body(3))
    assert ex.status == 200 and content_chunks(ex.body) == 3
    assert s.rows == [] and s.tel.guard.errors == {"middleware.start": 1}


def test_a_failure_after_the_tracker_was_made_leaves_no_request_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("cannot wrap")

    monkeypatch.setattr(M._Exchange, "__init__", broken)
    s = Setup()
    ex = call(s.app, "/v1/completions", stream_body(3))
    assert ex.status == 200 and content_chunks(ex.body) == 3
    assert not s.tel.in_flight() and s.tel.guard.errors == {"middleware.start": 1}
    assert [(r["finish_reason"], r["error_type"]) for r in s.rows] == [("error", "middleware_error")]


def test_a_memoryview_body_is_read() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for text, reason in (("a", None), ("b", None), ("", "stop")):
            data = json.dumps({"choices": [{"text": text, "finish_reason": reason}]}).encode()
            await send({"type": "http.response.body", "body": memoryview(b"data: " + data + b"\n\n"),
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    rows: list[Row] = []
    tel = Telemetry(sink=rows.append)
    call(LlmsloMiddleware(app, telemetry=tel), "/v1/completions", {})
    assert rows[0]["generated_tokens"] == 2 and tel.guard.error_count == 0


# ---- configuration -----------------------------------------------------------------------------------------


def test_the_environment_configures_it() -> None:
    env = {"LLMSLO_MODEL": "llama", "LLMSLO_VERSION": "v9", "LLMSLO_ROUTES": "/a, /b",
           "LLMSLO_REQUEST_ID_HEADER": "X-Trace", "LLMSLO_TENANT_HEADER": "x-tenant", "LLMSLO_METRICS_PATH": "off",
           "LLMSLO_METRICS_PORT": "9464", "LLMSLO_METRICS_HOST": "0.0.0.0", "LLMSLO_METRICS_REGISTRY": "GLOBAL",
           "LLMSLO_SUMMARY_PATH": "/tmp/s", "LLMSLO_SLO_TTFT": "500ms", "LLMSLO_SLO_TPOT": "off"}
    assert set(env) == set(M.ENVIRONMENT)
    config, problems = MiddlewareConfig.from_env(env)
    assert problems == []
    assert config == MiddlewareConfig(model="llama", version="v9", routes=("/a", "/b"), request_id_header="x-trace",
                                      tenant_header="x-tenant", metrics_path="", metrics_port=9464,
                                      metrics_host="0.0.0.0", metrics_registry="global", summary_path="/tmp/s",
                                      slo_ttft_s=0.5, slo_tpot_s=None)


def test_a_bad_variable_is_reported_and_its_default_used() -> None:
    config, problems = MiddlewareConfig.from_env({"LLMSLO_METRICS_PORT": "nine", "LLMSLO_ROUTES": "v1/x",
                                                   "LLMSLO_SLO_TTFT": "2 parsecs", "LLMSLO_MODEL": "m"})
    assert config == MiddlewareConfig(model="m")
    assert sorted(p.split("=")[0] for p in problems) == ["LLMSLO_METRICS_PORT", "LLMSLO_ROUTES", "LLMSLO_SLO_TTFT"]


def test_a_bad_argument_raises() -> None:
    from llmslo.telemetry import ConfigurationError

    for kwargs in ({"routes": "/v1/completions"}, {"request_id_header": "x id"}, {"metrics_path": "metrics"}):
        with pytest.raises(ConfigurationError):
            LlmsloMiddleware(make_app(), telemetry=Telemetry(), **kwargs)


def test_a_bad_variable_with_a_telemetry_passed_in_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSLO_METRICS_PORT", "-1")
    tel = Telemetry()
    LlmsloMiddleware(make_app(), telemetry=tel)
    assert tel.guard.errors == {"middleware.environment": 1}


def test_the_tenant_header_gives_the_tenant_class() -> None:
    s = Setup(tenant_header="x-tenant-class")
    _, row = s.call("/v1/completions", stream_body(2), headers=[(b"x-tenant-class", b"batch")])
    assert row["tenant_class"] == "batch"
    _, row = s.call("/v1/completions", stream_body(2), headers=[(b"x-tenant-class", b"t" * 500)])
    assert row["tenant_class"] == "t" * M.MAX_TENANT_CHARS


def test_the_process_wide_telemetry_comes_from_the_environment(tmp_path: Any, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    monkeypatch.setenv("LLMSLO_SUMMARY_PATH", str(tmp_path / "summaries"))
    monkeypatch.setenv("LLMSLO_VERSION", "env-v")
    monkeypatch.setenv("LLMSLO_MODEL", "env-model")
    monkeypatch.setenv("LLMSLO_SLO_TTFT", "bad")
    M._reset_default()
    try:
        app = make_app()
        app.add_middleware(LlmsloMiddleware)
        call(app, "/v1/completions", stream_body(3), headers=[(b"x-request-id", b"d-1")])
        tel = M.default_telemetry()
        assert tel.version == "env-v" and tel.guard.errors == {"middleware.environment": 1}
        ex = call(app, "/llmslo/metrics", method="GET")
        assert 'llmslo_requests_total{finish_reason="length",model="env-model"' in ex.body.decode()
    finally:
        M._reset_default()  # closes the sink: the summary is written
    from llmslo.tests._middleware_app import read_jsonl

    (row,) = read_jsonl(tmp_path / "summaries")
    assert row["request_id"] == "d-1" and row["version"] == "env-v" and row["model"] == "env-model"


def test_importing_telemetry_loads_no_middleware_and_the_middleware_no_framework() -> None:
    code = ("import sys, llmslo.telemetry as t\n"
            "assert 'llmslo.telemetry._middleware' not in sys.modules\n"
            "t.LlmsloMiddleware\n"
            "print(','.join(m for m in ('starlette', 'fastapi', 'uvicorn', 'httpx', 'anyio', 'llmslo.loadgen') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_variable_is_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "middleware.md").read_text()
    missing = [v for v in M.ENVIRONMENT if f"`{v}`" not in doc]
    assert missing == []

