"""The least a Python proxy does: the baseline ``floor`` of the gateway benchmark (``--proxies ...,floor``).

It runs on the gateway's event loop (uvloop where installed) and does, per request, only what passing a stream
through needs: it finds the end of the request's head and its ``Content-Length`` body, writes head and body as they
came on a kept-alive connection to the upstream (a new one when none is idle), passes every read of the response
back to the client as it arrives, and finds the response's end (its ``Content-Length``, or its chunked framing
through the gateway's own :class:`~llmslo.gateway._http.ChunkedDecoder`) to reuse both connections (unless either
side said ``Connection: close``). No admission,
no routing, no observation, no telemetry, no flow control (a client that does not read makes it buffer), no
checks of what it forwards. It is a measuring stick, not a proxy to deploy: what it adds to a first token is what
any proxy written in Python on this event loop adds at least.

Run: ``python -m llmslo.bench._floor_proxy --upstream http://127.0.0.1:PORT [--port 0]``; it prints
``floor proxy on http://127.0.0.1:PORT`` once it listens (127.0.0.1 only) and runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from urllib.parse import urlsplit

from llmslo.gateway._http import ChunkedDecoder
from llmslo.gateway._loop import event_loop_factory

MAX_HEAD = 64 * 1024
"""The longest request or response head read, bytes: a longer one closes the connection."""


def _length(head: bytes) -> int | None:
    """The ``Content-Length`` of a head (its lines after the first), None when absent."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return None


def _has(head: bytes, header: bytes, word: bytes) -> bool:
    """Whether a head's ``header`` (lower case) carries ``word`` (lower case)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == header and word in value.lower():
            return True
    return False


class Upstream(asyncio.Protocol):
    """One connection to the upstream; while it carries a response, every read goes to :attr:`client`."""

    def __init__(self, proxy: FloorProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.client: Client | None = None
        self.head = b""
        self.in_body = False
        self.left: int | None = None
        self.decoder: ChunkedDecoder | None = None
        self.reuse = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def start(self, client: Client, request: bytes) -> None:
        assert self.transport is not None
        self.client, self.head, self.in_body, self.left, self.decoder = client, b"", False, None, None
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None:
            return
        client.send(data)
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > MAX_HEAD:
                    self._broken()
                return
            self.in_body = True
            head, data = self.head[:end], self.head[end + 4:]
            self.head = b""
            self.reuse = not _has(head, b"connection", b"close")
            if _has(head, b"transfer-encoding", b"chunked"):
                self.decoder = ChunkedDecoder()
            else:
                self.left = _length(head)
        if self.decoder is not None:
            self.decoder.feed(data)
            done = self.decoder.done
        elif self.left is not None:
            self.left -= len(data)
            done = self.left <= 0
        else:
            return  # framed by the close
        if done:
            self.client = None
            if self.reuse:
                self.proxy.idle.append(self)
            elif self.transport is not None:
                self.transport.close()
            client.response_done()

    def _broken(self) -> None:
        client, self.client = self.client, None
        if self.transport is not None:
            self.transport.abort()
        if client is not None:
            client.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.proxy.idle:
            self.proxy.idle.remove(self)
        client, self.client = self.client, None
        if client is not None:
            client.close()


class Client(asyncio.Protocol):
    """One client connection: requests one at a time, each forwarded once whole."""

    def __init__(self, proxy: FloorProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.upstream: Upstream | None = None
        self.close_after = False
        self.connecting: asyncio.Task[None] | None = None
        """The task opening a new upstream connection (kept: the loop holds tasks only weakly)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.upstream is None:
            self._next()

    def _next(self) -> None:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEAD:
                self.close()
            return
        size = end + 4 + (_length(self.buf[:end]) or 0)
        if len(self.buf) < size:
            return
        request, self.buf = self.buf[:size], self.buf[size:]
        self.close_after = _has(request[:end], b"connection", b"close")
        idle = self.proxy.idle
        if idle:
            self.upstream = idle.pop()
            self.upstream.start(self, request)
        else:
            self.upstream = Upstream(self.proxy)
            self.connecting = asyncio.get_running_loop().create_task(self._connect(self.upstream, request))

    async def _connect(self, upstream: Upstream, request: bytes) -> None:
        try:
            await asyncio.get_running_loop().create_connection(lambda: upstream, self.proxy.host, self.proxy.port)
        except OSError:
            self.close()
            return
        upstream.start(self, request)

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def response_done(self) -> None:
        self.upstream = None
        if self.close_after:
            self.close()
        elif self.buf:
            self._next()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        upstream, self.upstream = self.upstream, None
        if upstream is not None and upstream.client is self:
            upstream.client = None
            if upstream.transport is not None:
                upstream.transport.abort()  # the client left mid-response: the upstream request is cancelled


class FloorProxy:
    """The upstream's address and the idle connections to it."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"--upstream: an http://HOST:PORT URL, got {upstream!r}")
        self.host, self.port = parts.hostname, parts.port
        self.idle: list[Upstream] = []


async def serve(upstream: str, port: int) -> None:
    proxy = FloorProxy(upstream)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(proxy), "127.0.0.1", port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"floor proxy on http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await stop.wait()
    server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--upstream", required=True, help="the upstream's URL, http://HOST:PORT")
    ap.add_argument("--port", type=int, default=0, help="the port to listen on, 127.0.0.1 (0: any free one)")
    args = ap.parse_args()
    try:
        FloorProxy(args.upstream)
    except ValueError as exc:
        sys.exit(str(exc))
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(serve(args.upstream, args.port))


if __name__ == "__main__":
    main()
