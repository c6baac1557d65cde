"""A scripted OpenAI-compatible backend for the gateway's tests, and helpers to run a gateway in front of it.

The backend is a small asyncio HTTP/1.1 server. Each reply follows a script written in the request's prompt (or its
last message, or its ``x-script`` header): ``script:tokens=5,gap=0.01,die=3`` — ``tokens`` content chunks
``gap`` seconds apart (default 5, 0), then a finish event (``length``), the usage event when the request asked
for it, and ``[DONE]``.
``plain=1``: no chunked framing (the body ends when the connection closes); ``overrun=N``: N bytes more after a
non-streamed reply than its ``Content-Length`` says; ``status=503``: answer that status
with an error body; ``die=N``: close the connection after N chunks;
``stall=N``: after N chunks send nothing more (until the gateway gives up); ``ttft=S``: wait S seconds before the
first chunk. It stands in for an engine where a test needs a failure a real engine cannot be made to show on
demand; the real engines run in ``test_gateway_engines.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from llmslo.gateway import BackendSpec, Gateway, GatewayConfig
from llmslo.telemetry import Telemetry


@dataclass
class Seen:
    """One request the backend received."""

    path: str
    headers: dict[str, str]
    body: dict[str, object]
    cancelled: bool = False
    chunks_sent: int = 0
    head: bytes = b""
    """The request's head as it came (without its blank line)."""


@dataclass
class ScriptedBackend:
    """See the module docstring. ``healthy``: what ``/health`` answers (200 or 503)."""

    model: str = "m"
    healthy: bool = True
    seen: list[Seen] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None
    _conns: set[asyncio.StreamWriter] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._conns):
            w.transport.abort()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ")
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if not await self._answer(method, path, headers, body, reader, writer, head[:-4]):
                    return
        finally:
            self._conns.discard(writer)
            self._tasks.discard(task)
            writer.transport.abort()

    async def _answer(self, method: str, path: str, headers: dict[str, str], raw: bytes,
                      reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> bool:
        if path == "/health":
            status = 200 if self.healthy else 503
            _write_whole(writer, status, b'{"status": "ok"}')
            return True
        if path == "/v1/models":
            _write_whole(writer, 200, json.dumps({"object": "list", "data": [{"id": self.model}]}).encode())
            return True
        body = json.loads(raw)
        seen = Seen(path, headers, body, head=head)
        self.seen.append(seen)
        script = _script(body, headers.get("x-script"))
        if "status" in script:
            _write_whole(writer, int(script["status"]), b'{"error": {"type": "engine_error", "message": "scripted"}}')
            return True
        tokens = int(script.get("tokens", 5))
        gap = float(script.get("gap", 0))
        prompt_tokens = 7
        if not body.get("stream"):
            await asyncio.sleep(float(script.get("ttft", 0)))
            reply = {"id": "r", "object": "text_completion", "model": self.model,
                     "choices": [{"index": 0, "text": "x " * tokens, "finish_reason": "length"}],
                     "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                               "total_tokens": prompt_tokens + tokens}}
            # overrun: bytes past the body's announced length, in the same write
            _write_whole(writer, 200, json.dumps(reply).encode(), b"x" * int(script.get("overrun", 0)))
            return True
        plain = "plain" in script  # no chunked framing: the body ends when the connection closes
        if plain:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        else:  # hop: a header only for this connection, named by the Connection header
            hop = b"connection: keep-alive, X-Hop\r\nx-hop: secret\r\n" if "hop" in script else b""
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n%s\r\n"
                         % hop)

        def emit(data: bytes) -> None:
            if plain:
                writer.write(data)
            else:
                _chunk(writer, data)

        gone = asyncio.get_running_loop().create_task(reader.read(1))  # EOF: the gateway closed the connection
        try:
            await asyncio.sleep(float(script.get("ttft", 0)))
            for i in range(tokens):
                if "die" in script and i == int(script["die"]):
                    writer.transport.abort()
                    return False
                if "stall" in script and i == int(script["stall"]):
                    await asyncio.wait((gone,), timeout=30)
                    seen.cancelled = gone.done()
                    return False
                if gone.done():
                    seen.cancelled = True
                    return False
                event = {"id": "r", "object": "text_completion", "model": self.model,
                         "choices": [{"index": 0, "text": f"t{i} ", "finish_reason": None}]}
                emit(b"data: " + json.dumps(event).encode() + b"\n\n")
                seen.chunks_sent += 1
                try:
                    await writer.drain()
                except ConnectionError:
                    seen.cancelled = True
                    return False
                if gap:
                    await asyncio.wait((gone,), timeout=gap)
            last = {"id": "r", "object": "text_completion", "model": self.model,
                    "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
            emit(b"data: " + json.dumps(last).encode() + b"\n\n")
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):
                usage = {"id": "r", "object": "text_completion", "model": self.model, "choices": [],
                         "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                                   "total_tokens": prompt_tokens + tokens}}
                emit(b"data: " + json.dumps(usage).encode() + b"\n\n")
            emit(b"data: [DONE]\n\n")
            if not plain:
                writer.write(b"0\r\n\r\n")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            if plain:  # the close ends the body: a clean one (FIN), not a reset
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()
            return not plain
        finally:
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone


def _script(body: dict[str, object], header: str | None) -> dict[str, str]:
    text = header if header is not None else body.get("prompt")
    if text is None and isinstance(body.get("messages"), list) and body["messages"]:
        last = body["messages"][-1]  # type: ignore[index]
        text = last.get("content") if isinstance(last, dict) else None
    if isinstance(text, list):
        text = next((t for t in text if isinstance(t, str)), "")
    if not isinstance(text, str) or not text.startswith("script:"):
        return {}
    return dict(kv.split("=", 1) for kv in text[len("script:"):].split(",") if "=" in kv)


def _write_whole(writer: asyncio.StreamWriter, status: int, body: bytes, extra: bytes = b"") -> None:
    writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s%s"
                 % (status, len(body), body, extra))


def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


@contextlib.asynccontextmanager
async def running(backends: list[ScriptedBackend],
                  **config: object) -> AsyncIterator[tuple[Gateway, list[dict[str, object]]]]:
    """A gateway in front of ``backends`` (ids a, b, c, ...), its summary rows collected in the list yielded."""
    for b in backends:
        if not b.port:
            await b.start()
    specs = tuple(BackendSpec(chr(ord("a") + i), b.url, version=f"v{i + 1}") for i, b in enumerate(backends))
    rows: list[dict[str, object]] = []
    tel = Telemetry(version="gateway", sink=rows.append)
    settings: dict[str, object] = {"port": 0, "admin_port": 0, "drain_settle_s": 0.0, "health_interval_s": 60.0}
    settings.update(config)
    gw = Gateway(GatewayConfig(backends=specs, **settings), tel)  # type: ignore[arg-type]
    await gw.start()
    try:
        yield gw, rows
    finally:
        await gw.close()
        for b in backends:
            await b.close()
