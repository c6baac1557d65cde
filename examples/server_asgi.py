"""A streaming LLM endpoint instrumented with llmslo, as a plain ASGI app (no framework needed).

Run it with an ASGI server (the ``examples`` extra installs uvicorn: ``pip install 'llmslo[examples]'``)::

    uvicorn --app-dir examples server_asgi:app --port 8000

``GET /metrics`` serves the metrics (OpenMetrics with request-id exemplars when the scraper asks for it),
``POST /generate`` streams tokens. The fake engine produces one token every 20 ms, 64 tokens a request; the
bounded send queue pauses it when the client reads slower. Every request leaves one summary row in JSONL files
under ``summaries/`` (the folder ``LLMSLO_SUMMARIES`` names, if set), written by a ``SummarySink`` in the
background and closed at shutdown (the ASGI lifespan): load them with ``llmslo ingest summaries/*.jsonl --db
s.duckdb``.

Each request reaches exactly one terminal state: ``length`` once all its tokens were sent, ``client_cancel``
when the client hangs up first (the server's ``http.disconnect`` message, or a send that fails), ``deadline``
when the send queue's slow-consumer policy ends it; no second, ignored signal follows any of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from llmslo.telemetry import (
    JsonlWriter,
    RequestTracker,
    SendQueue,
    SloPolicy,
    StreamClosed,
    StreamPolicy,
    SummarySink,
    Telemetry,
    metrics_app,
)

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

sink = SummarySink(JsonlWriter(os.environ.get("LLMSLO_SUMMARIES", "summaries")))  # or DuckDBSummaryWriter(file)
tel = Telemetry(policies=[SloPolicy(ttft_s=2.0, tpot_s=0.1)], version="example-1", sink=sink)
metrics = metrics_app(tel.registry)
STREAM = StreamPolicy(capacity=16, idle_s=30, max_duration_s=300)
MAX_TOKENS = 64
TOKEN_INTERVAL_S = 0.02
"""The fake engine's time per token, seconds."""


async def read_body(receive: Receive) -> bool:
    """Consume the request body; ``False`` when the client disconnected before sending all of it."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        if message["type"] == "http.request" and not message.get("more_body", False):
            return True


async def watch_disconnect(receive: Receive, t: RequestTracker) -> None:
    """Finish the request ``client_cancel`` when the server reports that the client hung up."""
    while (await receive())["type"] != "http.disconnect":
        pass
    t.finish("client_cancel")


async def generate(receive: Receive, send: Send, prompt_tokens: int = 12, max_tokens: int = MAX_TOKENS) -> None:
    async with tel.request(uuid.uuid4().hex, model="tiny-llm", prompt_tokens=prompt_tokens) as t:
        if not await read_body(receive):
            t.finish("client_cancel")
            return
        queue: SendQueue[bytes] = SendQueue(t, STREAM)
        t.add_resource(lambda: None, "kv_blocks")  # release the engine's KV references here

        async def produce() -> None:
            try:
                await asyncio.sleep(0.05)  # queueing and prefill
                t.schedule()
                for i in range(max_tokens):
                    await queue.wait_credit()  # no token is generated while the client is behind
                    await asyncio.sleep(TOKEN_INTERVAL_S)
                    t.commit()
                    queue.put(f"token{i} ".encode())
            except StreamClosed:  # the request ended (client gone, deadline): generate no more
                return
            finally:
                queue.close()

        watcher = asyncio.create_task(watch_disconnect(receive, t))
        producer = asyncio.create_task(produce())
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
            async for chunk in queue:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await producer
            if t.done:  # ended while streaming: nothing more to send
                return
            # The server reports a completed response as a disconnect: stop watching before completing it.
            watcher.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if t.generated_tokens >= max_tokens:
                t.finish("length")
        except OSError:  # a send failed: the client is gone
            if not t.done:
                t.finish("client_cancel")
        finally:
            for task in (watcher, producer):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


async def lifespan(receive: Receive, send: Send) -> None:
    """The ASGI lifespan: at shutdown the sink writes what it holds (at most 2 s) before the process exits."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await asyncio.to_thread(sink.close, timeout_s=2)
            await send({"type": "lifespan.shutdown.complete"})
            return


async def app(scope: Message, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    if scope["path"] == "/metrics":
        await metrics(scope, receive, send)
    elif scope["path"] == "/generate":
        await generate(receive, send)
    else:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"not found"})
