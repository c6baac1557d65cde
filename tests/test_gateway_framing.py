"""How the gateway frames what it passes on, read as raw bytes on the client's socket: a reply of known length
keeps its ``Content-Length`` and its bytes; an HTTP/1.0 client never gets a chunked body (RFC 9112, 7.1); the
answer to a HEAD request is its head alone, so the next response on the connection is read right; the request's
own headers reach the backend as they came, less those that describe the client's connection. An event stream
whose usage event the gateway withholds is cut into events as the SSE reader cuts them (LF, CR LF or CR line
ends, split anywhere between reads), each passed on as soon as it is whole; a stream the gateway ends gets its
last event wherever the gateway frames the client's body itself, whatever the engine's framing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from llmslo.gateway._http import ChunkedDecoder
from llmslo.tests._gateway_support import ScriptedBackend, Seen, running


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


async def read_response(reader: asyncio.StreamReader, head_only: bool = False) -> tuple[int, dict[bytes, bytes], bytes]:
    """One response: status, headers (lower-case names), body as it came on the wire (framing included for a
    chunked one: this test reads the framing); a body without length or chunking is read to the close."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    assert lines[0].startswith(b"HTTP/1.1 "), lines[0][:80]
    status = int(lines[0].split(b" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    if head_only:
        return status, headers, b""
    if b"content-length" in headers:
        return status, headers, await reader.readexactly(int(headers[b"content-length"]))
    if headers.get(b"transfer-encoding") == b"chunked":
        raw = b""
        while not raw.endswith(b"0\r\n\r\n"):
            raw += await reader.read(65536)
        return status, headers, raw
    return status, headers, await reader.read()  # to the close


def request(method: str, path: str, body: dict[str, object] | None = None, version: str = "1.1",
            *extra: str) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {path} HTTP/{version}", "host: 127.0.0.1", *extra]
    if body is not None:
        lines += ["content-type: application/json", f"content-length: {len(data)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def completion(prompt: str, stream: bool) -> dict[str, object]:
    return {"model": "m", "prompt": prompt, "max_tokens": 4, "stream": stream}


async def one_connection(port: int, *requests: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """Each request on one connection in turn, the next written once the last response was read whole."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers = []
    for data in requests:
        writer.write(data)
        answers.append(await read_response(reader))
    writer.close()
    return answers


def test_a_reply_of_known_length_keeps_it_and_its_bytes_and_the_connection_serves_the_next() -> None:
    async def go() -> None:
        async with running([ScriptedBackend()]) as (gw, rows):
            one = request("POST", "/v1/completions", completion("script:tokens=3", stream=False))
            replies = await one_connection(gw.port, one, one)
            await asyncio.sleep(0.05)
        for status, headers, body in replies:
            assert status == 200 and b"transfer-encoding" not in headers
            assert int(headers[b"content-length"]) == len(body)
            assert json.loads(body)["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        assert [r["finish_reason"] for r in rows] == ["length", "length"]

    run(go())


def test_bytes_a_backend_sends_past_the_length_it_announced_never_reach_the_client() -> None:
    async def go() -> None:
        async with running([ScriptedBackend()]) as (gw, rows):
            # the stray bytes would have been read as the second response's start
            first, second = await one_connection(
                gw.port, request("POST", "/v1/completions", completion("script:tokens=3,overrun=40", stream=False)),
                request("POST", "/v1/completions", completion("script:tokens=2", stream=False)))
            await asyncio.sleep(0.05)
        assert first[0] == second[0] == 200 and [r["finish_reason"] for r in rows] == ["length", "length"]
        assert json.loads(first[2])["usage"]["completion_tokens"] == 3 and b"xxx" not in first[2]
        assert json.loads(second[2])["usage"]["completion_tokens"] == 2

    run(go())


def test_an_http10_client_gets_its_stream_unframed_and_ended_by_the_close() -> None:
    async def go() -> None:
        async with running([ScriptedBackend()]) as (gw, rows):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(request("POST", "/v1/completions", completion("script:tokens=4", stream=True), "1.0"))
            status, headers, body = await asyncio.wait_for(read_response(reader), 10)  # read to the close
            writer.close()
            await asyncio.sleep(0.05)
        assert status == 200 and b"transfer-encoding" not in headers and headers[b"connection"] == b"close"
        assert body.startswith(b"data: {") and body.endswith(b"data: [DONE]\n\n")
        assert body.count(b"data: ") == 6  # 4 tokens, the finish, [DONE]: no chunk sizes among them
        (row,) = rows
        assert row["finish_reason"] == "length" and row["sent_tokens"] == 4

    run(go())


def test_an_http10_client_that_keeps_its_connection_is_told_so_and_served_again() -> None:
    async def go() -> None:
        async with running([ScriptedBackend()]) as (gw, _):
            one = request("POST", "/v1/completions", completion("script:tokens=2", stream=False), "1.0",
                          "connection: keep-alive")
            answers = await one_connection(gw.port, one, one)
        for status, headers, body in answers:
            assert status == 200 and headers[b"connection"] == b"keep-alive" and b"transfer-encoding" not in headers
            assert json.loads(body)["usage"]["completion_tokens"] == 2

    run(go())


def test_a_head_request_is_answered_by_its_head_alone() -> None:
    async def go() -> None:
        async with running([ScriptedBackend()]) as (gw, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(request("HEAD", "/health"))
            head = await read_response(reader, head_only=True)
            writer.write(request("HEAD", "/v1/completions"))
            refused = await read_response(reader, head_only=True)
            writer.write(request("GET", "/health"))
            got = await read_response(reader)  # read right only if no body followed either head
            writer.close()
        assert head[0] == 200 and head[1][b"content-length"] == str(len(got[2])).encode()
        assert refused[0] == 405
        assert got[0] == 200 and json.loads(got[2]) == {"status": "ok"}

    run(go())


def test_a_response_on_a_connection_that_closes_after_it_says_so() -> None:
    async def go() -> None:
        async with running([ScriptedBackend()]) as (gw, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(request("POST", "/v1/completions", completion("script:tokens=2", stream=True), "1.1",
                                 "connection: close"))
            status, headers, raw = await read_response(reader)
            rest = await asyncio.wait_for(reader.read(), 5)  # then the gateway closes it
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(b"GARBAGE\r\n\r\n")
            refused = await read_response(reader)
            writer.close()
        assert status == 200 and headers[b"connection"] == b"close" and raw.endswith(b"0\r\n\r\n") and rest == b""
        assert refused[0] == 400 and refused[1][b"connection"] == b"close"

    run(go())


def test_the_backend_gets_the_clients_headers_as_they_came_less_the_connections_own() -> None:
    async def go() -> None:
        backend = ScriptedBackend()
        async with running([backend]) as (gw, _):
            sent = request("POST", "/v1/completions", completion("script:tokens=2", stream=False), "1.1",
                           "X-Custom:  Mixed Case ", "Connection: keep-alive, X-Hop", "X-Hop: secret",
                           "Keep-Alive: timeout=5",
                           "X-Request-Id: client-1", "Authorization: Bearer k", "TE: trailers")
            ((status, headers, _),) = await one_connection(gw.port, sent)
        assert status == 200 and headers[b"x-request-id"] == b"client-1"
        lines = backend.seen[0].head.split(b"\r\n")
        assert lines[0] == b"POST /v1/completions HTTP/1.1"
        names = [line.partition(b":")[0].lower() for line in lines[1:]]
        assert sorted(names) == sorted([b"host", b"content-length", b"x-custom", b"x-request-id", b"authorization",
                                        b"content-type"])   # one of each; no connection, keep-alive, te, x-hop
        assert b"X-Custom:  Mixed Case " in lines and b"Authorization: Bearer k" in lines   # as they came
        assert b"x-request-id: client-1" in lines and f"host: 127.0.0.1:{backend.port}".encode() in lines

    run(go())


def test_a_header_the_backends_connection_header_names_is_not_passed_to_the_client() -> None:
    async def go() -> None:
        async with running([ScriptedBackend()]) as (gw, _):
            sent = request("POST", "/v1/completions", completion("script:tokens=2,hop=1", stream=True))
            ((status, headers, body),) = await one_connection(gw.port, sent)
        assert status == 200 and b"data: [DONE]" in body
        assert b"x-hop" not in headers and headers.get(b"connection") != b"keep-alive, X-Hop"

    run(go())


# ---- event streams cut into events as the SSE reader cuts them ----------------------------------------------


@dataclass
class SteppedBackend(ScriptedBackend):
    """A :class:`ScriptedBackend` whose generation replies are ``reads``, raw body bytes each written alone (one
    chunk, or as they are when ``framing`` is ``close``: the close ends the body, or ``length``: a Content-Length
    past the reads, with ``hang``), the next only once the test calls :meth:`step`: what the client got before then
    came from the reads before. ``hang``: after the last read, send nothing more until the gateway closes the
    connection (else end the body)."""

    reads: list[bytes] = field(default_factory=list)
    framing: str = "chunked"
    hang: bool = False
    _steps: asyncio.Queue[None] = field(default_factory=asyncio.Queue)

    def step(self) -> None:
        self._steps.put_nowait(None)

    async def _answer(self, method: str, path: str, headers: dict[str, str], raw: bytes,
                      reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> bool:
        if path not in ("/v1/completions", "/v1/chat/completions"):
            return await super()._answer(method, path, headers, raw, reader, writer, head)
        self.seen.append(Seen(path, headers, json.loads(raw), head=head))
        framing = {"chunked": b"transfer-encoding: chunked\r\n", "close": b"connection: close\r\n",
                   "length": b"content-length: %d\r\n" % (sum(map(len, self.reads)) + 1000)}[self.framing]
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n%s\r\n" % framing)
        for i, data in enumerate(self.reads):
            if i:
                await asyncio.wait_for(self._steps.get(), 10)
            writer.write(b"%x\r\n%s\r\n" % (len(data), data) if self.framing == "chunked" else data)
            await writer.drain()
        if self.hang:  # until the gateway closes the connection (its deadline, a drain)
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(reader.read(1), 30)
        elif self.framing == "chunked":
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        return False  # the connection closes (for framing "close", that ends the body)


class ChunkedBody:
    """The body of a chunked response read from the client's socket as it arrives (framing removed)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.decoder = ChunkedDecoder()
        self.body = b""
        self.closed = False

    async def _read(self) -> None:
        try:
            data = await self.reader.read(65536)
        except ConnectionError:
            data = b""
        if not data:
            self.closed = True
        self.body += self.decoder.feed(data)

    async def until(self, n: int) -> bytes:
        """The body once it holds ``n`` bytes or more (or ended), waiting 5 s at most."""
        async def go() -> None:
            while len(self.body) < n and not self.decoder.done and not self.closed:
                await self._read()
        await asyncio.wait_for(go(), 5)
        return self.body

    async def settle(self) -> bytes:
        """The body once 0.1 s passed with nothing more: what arrived meanwhile, if anything, is in it."""
        with contextlib.suppress(TimeoutError):
            while not self.decoder.done and not self.closed:
                await asyncio.wait_for(self._read(), 0.1)
        return self.body

    async def end(self) -> bytes:
        """The whole body: until its last chunk, or the connection's end (then :attr:`decoder` is not done)."""
        return await self.until(1 << 30)


async def response_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head[:-4].split(b"\r\n")
    return int(lines[0].split(b" ")[1]), {k.strip().lower(): v.strip() for k, _, v in
                                          (line.partition(b":") for line in lines[1:])}


def sse(nl: bytes, *objects: object, comment: bool = False) -> list[bytes]:
    """One event per object (``[DONE]`` for a string), each line ended by ``nl``; a comment line (sse-starlette's
    ping) first in the second event when ``comment``."""
    out = []
    for i, obj in enumerate(objects):
        data = obj.encode() if isinstance(obj, str) else json.dumps(obj, separators=(",", ":")).encode()
        lead = b": ping" + nl if comment and i == 1 else b""
        out.append(lead + b"data: " + data + nl + nl)
    return out


def token(text: str, finish: str | None = None) -> dict[str, object]:
    return {"id": "r", "object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


USAGE = {"id": "r", "object": "text_completion", "model": "m", "choices": [],
         "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}


def engine_events(nl: bytes) -> list[bytes]:
    """Two tokens, the finish, the usage-only event, ``[DONE]``: a stream as an engine sends it."""
    return sse(nl, token("a"), token("b"), token("", "length"), USAGE, "[DONE]", comment=True)


async def stepped(backend: SteppedBackend, wants: list[bytes], include_usage: bool = False,
                  **config: object) -> tuple[bytes, list[dict[str, object]]]:
    """Send one stream through the gateway to ``backend``; after each of its reads, the body the client got must
    be ``wants[i]`` exactly (before the next read is sent). The whole body, and the summary rows."""
    async with running([backend], **config) as (gw, rows):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        try:
            body = completion("x", stream=True)
            if include_usage:
                body["stream_options"] = {"include_usage": True}
            writer.write(request("POST", "/v1/completions", body))
            status, headers = await response_head(reader)
            assert status == 200 and headers[b"transfer-encoding"] == b"chunked"
            got = ChunkedBody(reader)
            for i, want in enumerate(wants):
                if i:
                    backend.step()
                # a read that completes no event: wait a while, and nothing may arrive meanwhile
                seen = await (got.settle() if want == (wants[i - 1] if i else b"") else got.until(len(want)))
                assert seen == want, f"after read {i}: {seen!r}, expected {want!r}"
            whole = await got.end()
            assert got.decoder.done
        finally:
            writer.close()
        await asyncio.sleep(0.05)
    return whole, rows


def without_usage(events: list[bytes]) -> list[bytes]:
    """The client's body after each event of ``events`` (one read each): the usage-only event withheld."""
    wants, body = [], b""
    for e in events:
        if b'"choices":[]' not in e:
            body += e
        wants.append(body)
    return wants


def test_a_crlf_stream_reaches_the_client_event_by_event_without_the_usage_it_did_not_ask_for() -> None:
    events = engine_events(b"\r\n")  # sse-starlette's separator (llama-cpp-python's server)

    async def go() -> None:
        wants = without_usage(events)
        whole, rows = await stepped(SteppedBackend(reads=events), wants)
        assert whole == b"".join(e for e in events if b'"usage"' not in e)
        (row,) = rows
        assert row["finish_reason"] == "length" and row["generated_tokens"] == 2 and row["prompt_tokens"] == 7

    run(go())


def test_a_cr_stream_reaches_the_client_event_by_event_without_the_usage_it_did_not_ask_for() -> None:
    events = engine_events(b"\r")

    async def go() -> None:
        whole, rows = await stepped(SteppedBackend(reads=events), without_usage(events))
        assert whole == b"".join(e for e in events if b'"usage"' not in e)
        assert rows[0]["finish_reason"] == "length" and rows[0]["generated_tokens"] == 2

    run(go())


def test_an_lf_stream_passes_unchanged_event_by_event_and_whole_to_a_client_that_asked_for_usage() -> None:
    events = engine_events(b"\n")

    async def go() -> None:
        whole, _ = await stepped(SteppedBackend(reads=events), without_usage(events))
        assert whole == b"".join(e for e in events if b'"usage"' not in e)
        cumulative = [b"".join(events[:i + 1]) for i in range(len(events))]
        whole, rows = await stepped(SteppedBackend(reads=events), cumulative, include_usage=True)
        assert whole == b"".join(events) and rows[0]["prompt_tokens"] == 7

    run(go())


def test_events_split_across_reads_inside_and_between_their_line_ends_are_passed_on_once_whole() -> None:
    one, two, finish, usage, done = sse(b"\r\n", token("a"), token("b"), token("", "length"), USAGE, "[DONE]")
    assert one.endswith(b"}\r\n\r\n") and usage.endswith(b"}\r\n\r\n")
    reads = [
        one[:-3],                 # ...}CR: inside the first CR LF
        one[-3:-2],               # LF: between the two CR LFs
        one[-2:] + two[:10],      # the first event is whole
        two[10:] + finish[:-1],   # the finish is whole at its last CR: its LF comes in the next read
        finish[-1:] + usage[:-1],  # the usage event is whole at its last CR: withheld
        usage[-1:] + done,        # its LF is withheld with it
    ]
    wants = [b"", b"", one, one + two + finish[:-1], one + two + finish, one + two + finish + done]

    async def go() -> None:
        whole, rows = await stepped(SteppedBackend(reads=reads), wants)
        assert whole == one + two + finish + done
        assert rows[0]["finish_reason"] == "length" and rows[0]["prompt_tokens"] == 7

    run(go())


def test_an_event_longer_than_the_readers_limit_is_passed_on_rather_than_held(monkeypatch: Any) -> None:
    from llmslo.gateway import _proxy
    monkeypatch.setattr(_proxy, "MAX_EVENT_BYTES", 64)
    big, finish, usage, done = sse(b"\r\n", token("x" * 100), token("", "length"), USAGE, "[DONE]")
    reads = [big[:90], big[90:], finish, usage + done]
    # past the limit the stream is passed on as it comes: the usage event too
    wants = [big[:90], big, big + finish, big + finish + usage + done]

    async def go() -> None:
        whole, _ = await stepped(SteppedBackend(reads=reads), wants)
        assert whole == b"".join(reads)

    run(go())


# ---- the gateway's last event on an engine's stream delimited by its connection's close ---------------------


def last_event(body: bytes) -> dict[str, Any]:
    blocks = [b for b in body.split(b"\n\n") if b.startswith(b"data: ")]
    return json.loads(blocks[-1][6:])  # type: ignore[no-any-return]


async def close_delimited(prompt: str, version: str = "1.1", **config: object) -> tuple[bytes, bool, list[Any]]:
    """One stream of ``prompt`` (a ScriptedBackend script) whose engine's reply is ended by its connection's close:
    the body the client got, whether it ended whole (the last chunk; HTTP/1.0: a clean close), the rows."""
    async with running([ScriptedBackend()], **config) as (gw, rows):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        try:
            writer.write(request("POST", "/v1/completions", completion(prompt, stream=True), version))
            status, headers = await response_head(reader)
            assert status == 200
            if version == "1.0":
                assert b"transfer-encoding" not in headers
                try:
                    body, whole = await asyncio.wait_for(reader.read(), 5), True  # a clean close ends it
                except ConnectionError:
                    body, whole = b"", False
            else:
                got = ChunkedBody(reader)
                body = await got.end()
                whole = got.decoder.done
        finally:
            writer.close()
        await asyncio.sleep(0.05)
    return body, whole, rows


def test_the_request_timeout_ends_a_close_delimited_stream_with_its_event() -> None:
    body, whole, rows = run(close_delimited("script:tokens=10,plain=1,stall=2", request_timeout_s=0.3))
    assert whole and body.count(b"data: ") == 3 and last_event(body)["error"]["type"] == "deadline"
    assert rows[0]["finish_reason"] == "deadline"


def test_a_backend_that_dies_in_a_close_delimited_stream_ends_it_with_an_error_event() -> None:
    body, whole, rows = run(close_delimited("script:tokens=10,plain=1,die=3"))
    assert whole and body.count(b"data: ") == 4 and last_event(body)["error"]["code"] == "backend_failed"
    assert rows[0]["finish_reason"] == "error" and rows[0]["error_type"] == "backend_failed"


def test_an_http10_client_of_a_close_delimited_stream_the_gateway_ends_gets_the_event_then_the_close() -> None:
    body, whole, rows = run(close_delimited("script:tokens=10,plain=1,stall=2", "1.0", request_timeout_s=0.3))
    assert whole and body.count(b"data: ") == 3 and last_event(body)["error"]["type"] == "deadline"
    assert rows[0]["finish_reason"] == "deadline"


def test_a_drain_ends_a_close_delimited_stream_with_the_drain_event() -> None:
    async def go() -> tuple[bytes, bool, list[Any]]:
        async with running([ScriptedBackend()], drain_idle_s=0.2, drain_budget_s=5.0) as (gw, rows):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            try:
                writer.write(request("POST", "/v1/completions", completion("script:tokens=3,plain=1,stall=1",
                                                                           stream=True)))
                status, _ = await response_head(reader)
                got = ChunkedBody(reader)
                await got.until(1)
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.admin_port}", timeout=10) as admin:
                    drained = await admin.post("/admin/backends/a/drain?wait=1")
                body = await got.end()
            finally:
                writer.close()
            await asyncio.sleep(0.05)
        assert status == 200 and drained.json()["closed_by_reason"]["idle"] == 1
        return body, got.decoder.done, rows

    body, whole, rows = run(go())
    assert whole and last_event(body)["finish_reason"] == "server_draining"
    assert rows[0]["finish_reason"] == "server_draining"


def test_a_stream_with_the_engines_length_ended_by_the_gateway_gets_its_event_when_the_gateway_reframes_it() -> None:
    # the usage event withheld: the client's body is chunked by the gateway, not the engine's Content-Length
    events = sse(b"\n", token("a"), token("b"))

    async def go() -> tuple[bytes, bool]:
        backend = SteppedBackend(reads=[events[0] + events[1]], framing="length", hang=True)
        async with running([backend], request_timeout_s=0.3) as (gw, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            try:
                writer.write(request("POST", "/v1/completions", completion("x", stream=True)))
                status, headers = await response_head(reader)
                assert status == 200 and headers[b"transfer-encoding"] == b"chunked"
                got = ChunkedBody(reader)
                body = await got.end()
            finally:
                writer.close()
            await asyncio.sleep(0.05)
        return body, got.decoder.done

    body, whole = run(go())
    assert whole and body.startswith(b"".join(events)) and last_event(body)["error"]["type"] == "deadline"


def test_a_stream_the_gateway_ends_mid_event_passes_the_whole_events_then_its_own_event_alone() -> None:
    # the start of an event held when the gateway ends the stream is dropped: passed on, it would run into the
    # gateway's last event and make one unreadable event of both
    one, two = sse(b"\r\n", token("a"), token("b"))

    async def go() -> bytes:
        backend = SteppedBackend(reads=[one + two[:20]], hang=True)
        async with running([backend], request_timeout_s=0.3) as (gw, rows):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            try:
                writer.write(request("POST", "/v1/completions", completion("x", stream=True)))
                await response_head(reader)
                got = ChunkedBody(reader)
                body = await got.end()
            finally:
                writer.close()
            await asyncio.sleep(0.05)
        assert got.decoder.done and rows[0]["finish_reason"] == "deadline"
        return body

    body = run(go())
    assert body.startswith(one) and body[len(one):].startswith(b"data: {") and body.endswith(b"}\n\n")
    assert last_event(body[len(one):])["error"]["type"] == "deadline"
