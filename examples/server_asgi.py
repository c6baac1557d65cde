"""A streaming LLM endpoint instrumented with llmslo, as a plain ASGI app (no framework needed).

Run with any ASGI server, e.g. ``uvicorn examples.server_asgi:app``; ``GET /metrics`` serves the metrics
(OpenMetrics with request-id exemplars when the scraper asks for it), ``POST /generate`` streams tokens.
The fake engine produces one token every 20 ms; the bounded send queue pauses it when the client reads slower.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from llmslo.telemetry import SendQueue, SloPolicy, StreamClosed, StreamPolicy, Telemetry, metrics_app

tel = Telemetry(policies=[SloPolicy(ttft_s=2.0, tpot_s=0.1)], version="example-1")
metrics = metrics_app(tel.registry)
STREAM = StreamPolicy(capacity=16, idle_s=30, max_duration_s=300)


async def generate(send: Any, prompt_tokens: int = 12, max_tokens: int = 64) -> None:
    async with tel.request(uuid.uuid4().hex, model="tiny-llm", prompt_tokens=prompt_tokens) as t:
        queue: SendQueue[bytes] = SendQueue(t, STREAM)
        t.add_resource(lambda: None, "kv_blocks")  # release the engine's KV references here

        async def produce() -> None:
            try:
                await asyncio.sleep(0.05)  # queueing and prefill
                t.schedule()
                for i in range(max_tokens):
                    await queue.wait_credit()  # no token is generated while the client is behind
                    await asyncio.sleep(0.02)
                    t.commit()
                    queue.put(f"token{i} ".encode())
            except StreamClosed:
                return
            finally:
                queue.close()

        producer = asyncio.create_task(produce())
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
        async for chunk in queue:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await producer
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if t.generated_tokens >= max_tokens:
            t.finish("length")


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/metrics":
        await metrics(scope, receive, send)
    elif scope["path"] == "/generate":
        await generate(send)
    else:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"not found"})
