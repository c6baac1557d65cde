"""How the gateway frames what it passes on, read as raw bytes on the client's socket: a reply of known length
keeps its ``Content-Length`` and its bytes; an HTTP/1.0 client never gets a chunked body (RFC 9112, 7.1); the
answer to a HEAD request is its head alone, so the next response on the connection is read right; the request's
own headers reach the backend as they came, less those that describe the client's connection."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from llmslo.tests._gateway_support import ScriptedBackend, running


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
