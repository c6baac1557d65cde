"""``llmslo load`` reads a stream to its end after ``[DONE]``, as OpenAI's client does, so one connection serves
request after request; a server that never ends the body after ``[DONE]`` costs a bounded wait and a new
connection, and the reply still counts as complete."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from llmslo.loadgen import _attempt
from llmslo.tests._loadgen_util import at, llmslo, run

EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}\n\n'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@contextmanager
def sse_server(end_body: bool) -> Iterator[dict[str, int]]:
    """A server of one-event streams on 127.0.0.1 that counts its connections; the body's end comes 20 ms after
    ``[DONE]`` in a write of its own (``end_body``), or never."""
    seen = {"connections": 0, "requests": 0, "port": 0}
    """``connections``: those that carried a generation request (not the command's question for the models)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        served = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET "):  # the command asks which models are served
                    models = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(models), models))
                    continue
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                json.loads(await reader.readexactly(length))
                seen["requests"] += 1
                if not served:
                    served = True
                    seen["connections"] += 1
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                             + _chunk(EVENT) + _chunk(b"data: [DONE]\n\n"))
                await writer.drain()
                if not end_body:
                    await asyncio.sleep(30)
                await asyncio.sleep(0.02)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    stop: list[asyncio.Event] = []

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        seen["port"] = server.sockets[0].getsockname()[1]
        stop.append(asyncio.Event())
        ready.set()
        await stop[0].wait()
        server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in writers:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
        await server.wait_closed()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield seen
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(10)
        loop.close()


def test_one_connection_serves_every_request_of_a_stream_after_another() -> None:
    with sse_server(end_body=True) as seen:
        result, _ = run(f"http://127.0.0.1:{seen['port']}", at(*(0.0,) * 8), max_concurrency=1)
    assert [r["finish_reason"] for r in result.rows] == ["stop"] * 8
    assert seen["requests"] == 8 and seen["connections"] == 1


def test_a_body_that_never_ends_after_done_costs_a_bounded_wait_and_a_new_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_attempt, "AFTER_DONE_S", 0.2)
    with sse_server(end_body=False) as seen:
        result, _ = run(f"http://127.0.0.1:{seen['port']}", at(0.0, 0.0, 0.0), max_concurrency=1)
    assert [r["finish_reason"] for r in result.rows] == ["stop"] * 3  # complete at [DONE]
    assert all(r["e2e_s"] < 0.2 for r in result.rows)  # the wait after [DONE] is not the reply's
    assert seen["requests"] == 3 and seen["connections"] == 3


def test_without_keep_alive_every_request_opens_its_own_connection_closed_at_done(
        monkeypatch: pytest.MonkeyPatch) -> None:
    read_on: list[object] = []
    monkeypatch.setattr(_attempt, "_read_to_end", lambda body: read_on.append(body))  # never awaited: never called
    with sse_server(end_body=True) as seen:
        result, _ = run(f"http://127.0.0.1:{seen['port']}", at(*(0.0,) * 5), max_concurrency=1, keep_alive=False)
    assert [r["finish_reason"] for r in result.rows] == ["stop"] * 5
    assert seen["requests"] == 5 and seen["connections"] == 5
    assert read_on == []  # the connection is not kept: nothing after [DONE] is read


def test_the_command_keeps_connections_unless_told_not_to(tmp_path: Path) -> None:
    for flags, connections in (((), 1), (("--no-keep-alive",), 4)):
        with sse_server(end_body=True) as seen:
            done = llmslo("load", f"http://127.0.0.1:{seen['port']}", "--model", "m", "--max-requests", "4",
                          "--rate", "1000", "--max-concurrency", "1", "--json", "--no-progress", *flags, cwd=tmp_path)
            assert done.returncode == 0, done.stderr
            report = json.loads(done.stdout)
            assert report["run"]["config"]["keep_alive"] is (not flags)
            assert report["load"]["finish"] == {"stop": 4}
            assert seen["requests"] == 4 and seen["connections"] == connections
