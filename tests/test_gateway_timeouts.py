"""Clients that are late, on raw sockets: a request whose head or body never finishes arriving is answered 408
and its connection closed (a slow sender cannot hold connections for ever); a connection left idle is closed; a
request being answered, however long, is not touched by either timeout."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from llmslo.gateway import BackendSpec, GatewayConfig
from llmslo.telemetry import ConfigurationError
from llmslo.tests._gateway_support import ScriptedBackend, running

TIMEOUTS = {"read_timeout_s": 0.2, "idle_timeout_s": 0.3}


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


async def until_closed(reader: asyncio.StreamReader, within_s: float = 5.0) -> bytes:
    """Everything the gateway sends until it closes the connection (TimeoutError if it does not)."""
    return await asyncio.wait_for(reader.read(), within_s)


def body(prompt: str, stream: bool = True) -> bytes:
    return json.dumps({"model": "m", "prompt": prompt, "max_tokens": 8, "stream": stream}).encode()


def head(length: int) -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % length)


@pytest.mark.parametrize("part", ["head", "body"])
def test_a_request_that_never_finishes_arriving_is_answered_408_and_closed(part: str) -> None:
    async def go() -> None:
        b = ScriptedBackend()
        async with running([b], **TIMEOUTS) as (gw, rows):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            data = head(len(body("hi"))) + body("hi")
            writer.write(data[:30] if part == "head" else data[:-10])
            answer = await until_closed(reader)
            writer.close()
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b"\r\nconnection: close\r\n" in answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["message"] == (
            "request: not all of it came within 0.2 s")
        assert b.seen == [] and rows == []  # never a request: nothing forwarded, no summary

    run(go())


def test_a_connection_left_idle_is_closed_and_one_answered_then_idle_too() -> None:
    async def go() -> None:
        async with running([ScriptedBackend()], **TIMEOUTS) as (gw, rows):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            assert await until_closed(reader) == b""  # nothing sent on it: closed without a word
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(head(len(body("hi", stream=False))) + body("hi", stream=False))
            answer = await until_closed(reader)
            writer.close()
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b'"completion_tokens": 5' in answer
        assert [r["finish_reason"] for r in rows] == ["length"]

    run(go())


def test_a_stream_longer_than_both_timeouts_is_answered_whole() -> None:
    async def go() -> None:
        async with running([ScriptedBackend()], **TIMEOUTS) as (gw, rows):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(head(len(body("script:tokens=8,gap=0.1"))) + body("script:tokens=8,gap=0.1"))
            raw = b""
            while not raw.endswith(b"0\r\n\r\n"):  # 0.8 s of tokens
                part = await asyncio.wait_for(reader.read(65536), 5)
                assert part, "the connection closed mid-stream"
                raw += part
            writer.close()
            await asyncio.sleep(0.05)
        assert raw.count(b"data: ") == 10  # 8 tokens, the finish, [DONE]
        assert [r["finish_reason"] for r in rows] == ["length"]

    run(go())


@pytest.mark.parametrize(("field", "value", "says"), [
    ("read_timeout_s", 0, "read_timeout_s: must be a number of seconds > 0, got 0"),
    ("idle_timeout_s", -1.0, "idle_timeout_s: must be a number of seconds > 0 or off, got -1.0"),
])
def test_a_bad_timeout_is_refused_naming_it(field: str, value: float, says: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^{says}$"):
        GatewayConfig(backends=(BackendSpec("a", "http://127.0.0.1:9"),), **{field: value})  # type: ignore[arg-type]
