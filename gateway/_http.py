"""HTTP/1.1 as the gateway speaks it: a front server on asyncio protocols, an upstream client, chunked framing.

The front side is an :class:`asyncio.Protocol` per connection (:class:`FrontConnection`): it parses one request at
a time (keep-alive, no pipelining: bytes that arrive while a response is in flight wait for it), hands it to the
handler as a :class:`Request`, and lets the handler answer through :class:`Responder`. It notices a client that
hangs up at once (``connection_lost``), whatever the handler is waiting for, and tells the handler through
:attr:`Responder.on_close`. Writes honour the transport's flow control: once the kernel and
:data:`WRITE_HIGH_BYTES` of the transport's buffer are full, :meth:`Responder.write_chunk` waits for the client
to read, so a client that never reads holds at most that much memory. A body of known length goes after its
``Content-Length``, one of unknown length chunked (to an HTTP/1.0 client: ended by the close), and a HEAD request
gets the head alone. A client that is late (a request that never finishes arriving, a connection left idle) is
closed by :meth:`FrontConnection.expire`, which the server calls from one periodic sweep.

The upstream side opens plain TCP connections (kept alive per backend by :class:`UpstreamPool`), writes a request
and reads the response head with :class:`asyncio.StreamReader`; :class:`ChunkedDecoder` cuts a chunked body into
its payloads without copying more than once.

Limits: a request head of at most :data:`MAX_HEAD_BYTES`; a body by ``Content-Length`` only (a chunked request
body is answered 411); methods and paths as sent (the handler routes). Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, SupportsIndex, cast

from llmslo.gateway._loop import start_eagerly

MAX_HEAD_BYTES = 64 * 1024
"""The longest request or response head (request line and headers), bytes."""
WRITE_HIGH_BYTES = 64 * 1024
"""The transport's write buffer above which a stream waits for its client, bytes (per connection)."""
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade", b"content-length", b"host",
})
"""Headers that describe one connection, never forwarded (``content-length`` and ``host`` are rewritten)."""

STATUS_TEXT = {200: "OK", 202: "Accepted", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
               408: "Request Timeout", 409: "Conflict", 411: "Length Required", 413: "Content Too Large",
               429: "Too Many Requests", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
               502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


class HttpError(Exception):
    """A request the gateway cannot read: answered with ``status`` and ``message``, then the connection closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Headed:
    """A request or a response head: ``headers`` with lower-case names, in order."""

    __slots__ = ()
    headers: list[tuple[bytes, bytes]]

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(slots=True)
class Request(_Headed):
    """One request as read: ``headers`` with lower-case names, in order; ``body`` whole (by Content-Length)."""

    method: str
    target: str
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytes
    keep_alive: bool = True
    http10: bool = False
    """Whether the request line said HTTP/1.0: its response is never chunked (RFC 9112, 7.1)."""
    lines: list[bytes] = field(default_factory=list)
    """The header lines as received (without their CRLF), one per item of :attr:`headers`."""
    connection_options: frozenset[bytes] = frozenset()
    """The header names (lower case) the ``Connection`` header lists besides ``close`` and ``keep-alive``: they
    describe the client's connection only, and a proxy removes them (RFC 9110, 7.6.1)."""

    def header_lines(self, drop: frozenset[bytes]) -> bytes:
        """The header lines as received, each ending in CRLF, but those whose (lower-case) name is in ``drop``:
        what a proxy passes on, without formatting each header again."""
        kept = [line for (key, _), line in zip(self.headers, self.lines, strict=True) if key not in drop]
        return b"\r\n".join(kept) + b"\r\n" if kept else b""


Handler = Callable[[Request, "Responder"], Awaitable[None]]


_NO_OPTIONS: frozenset[bytes] = frozenset()

_HEAD_FIELDS = frozenset({b"content-length", b"transfer-encoding", b"connection"})
"""The request headers the head parser itself reads."""


def _keeps(value: bytes, keep_alive: bool, named: set[bytes]) -> bool:
    """A ``Connection`` header's ``value`` (lower case), a list of options such as ``keep-alive, Upgrade``: whether
    the connection is kept after this message (``close`` anywhere in it: no; ``keep-alive``: yes; else as
    ``keep_alive`` was); the other options, header names that describe this connection only, join ``named``."""
    options = {t.strip() for t in value.split(b",")} - {b""}
    named |= options - {b"close", b"keep-alive"}
    if b"close" in options:
        return False
    return True if b"keep-alive" in options else keep_alive


def _bad_byte(head: bytes, lines: list[bytes], what: str) -> str | None:
    """Why ``head`` (split into ``lines`` at CRLF) may not be passed on, naming the line, when it holds a CR, LF or
    NUL inside a line (a reader that took a bare LF for a line's end would see a header the gateway never read);
    else None."""
    ends = len(lines) - 1
    # NUL looked for by its value, 0: faster than b"\0" on Python 3.11 (see _CR in telemetry/_openai_stream.py)
    if head.count(b"\n") == ends and head.count(b"\r") == ends and 0 not in head:
        return None
    bad = next(line for line in lines if b"\n" in line or b"\r" in line or b"\0" in line)
    return f"{what}: a CR, LF or NUL byte inside a line: {bad[:80].decode('latin-1')!r}"


def _parse_head(head: bytes, max_body: int) -> tuple[Request, int]:
    """The request of a head (without its final blank line) and the body length it announces. Read as bytes:
    header names lower-cased, values without the whitespace around them, each line also kept as it came
    (:attr:`Request.lines`); a CR, LF or NUL inside a line is refused (400)."""
    lines = head.split(b"\r\n")
    why = _bad_byte(head, lines, "request head")
    if why is not None:
        raise HttpError(400, why)
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        shown = lines[0][:80].decode("latin-1")
        raise HttpError(400, f"request line: expected 'METHOD /path HTTP/1.1', got {shown!r}")
    method, target, version = parts
    headers: list[tuple[bytes, bytes]] = []
    named: set[bytes] = set()
    length = 0
    keep_alive = version == b"HTTP/1.1"
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, f"request header: expected 'Name: value', got {line[:80].decode('latin-1')!r}")
        key = name.lower()
        val = value.strip()
        headers.append((key, val))
        if key in _HEAD_FIELDS:
            if key == b"content-length":
                if not val.isdigit():
                    raise HttpError(400, f"Content-Length: expected a number of bytes, got {val[:40]!r}")
                length = int(val)
            elif key == b"transfer-encoding":
                raise HttpError(411, "Transfer-Encoding: a chunked request body is not taken; send Content-Length")
            else:
                low = val.lower()
                if low == b"close":
                    keep_alive = False
                elif low == b"keep-alive":
                    keep_alive = True
                else:
                    keep_alive = _keeps(low, keep_alive, named)
    if length > max_body:
        raise HttpError(413, f"body: {length} bytes is more than the limit of {max_body} bytes")
    text = target.decode("latin-1")
    del lines[0]
    return Request(method.decode("latin-1"), text, text.partition("?")[0], headers, b"", keep_alive,
                   version == b"HTTP/1.0", lines, frozenset(named) if named else _NO_OPTIONS), length


_BUSY, _IDLE, _READING = range(3)
"""What a client connection is doing when a sweep looks: answering a request, waiting for one, reading one."""


class FrontConnection(asyncio.Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, handler: Handler, max_body: int, on_open: Callable[[FrontConnection], None] | None = None,
                 on_done: Callable[[FrontConnection], None] | None = None) -> None:
        self._handler = handler
        self._max_body = max_body
        self._on_open = on_open
        self._on_done = on_done
        self._buf = bytearray()
        self._pending: Request | None = None
        self._need = 0
        self._busy = False
        self._starting = False
        """Whether :meth:`_next` is running a request's first part (a request that ends there is followed by the
        next in its loop)."""
        self._paused = False
        self._resumed: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.responder: Responder | None = None
        self._swept = _BUSY
        """What :meth:`expire` last found this connection doing (:data:`_IDLE`, :data:`_READING`), since
        :attr:`_swept_at`; :data:`_BUSY` once a request starts (no clock is read on a request's path)."""
        self._swept_at = 0.0

    # ---- asyncio.Protocol ---------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (asyncio's, or uvloop's, which is not a subclass of asyncio.Transport)
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=WRITE_HIGH_BYTES)
        if self._on_open is not None:
            self._on_open(self)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) > MAX_HEAD_BYTES + self._max_body + 1024:
            assert self.transport is not None
            self.transport.pause_reading()  # a client sending ahead: read on once this request is answered
        if not self._busy:
            self._next()

    def eof_received(self) -> bool:
        return False  # a half-closed client is a client that left: close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)
        r, self.responder = self.responder, None  # (a responder refers to its connection: no cycle left behind)
        if r is not None and r.on_close is not None:
            callback, r.on_close = r.on_close, None
            callback()
        if self._on_done is not None:
            self._on_done(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    # ---- requests -----------------------------------------------------------------------------------------

    def _next(self) -> None:
        """Start the requests whose head and body are in, one at a time. Each runs in this callback until it first
        waits (:func:`start_eagerly`), then as a task; one answered without waiting is followed by the next here,
        in this loop (not by recursion: a client may send thousands of small requests at once)."""
        while not self._busy and not self.closed and not (self.transport is not None and self.transport.is_closing()):
            request = self._complete_request()
            if request is None:
                return
            self._busy = True
            self._swept = _BUSY
            self.responder = Responder(self, request)
            self._starting = True
            try:
                start_eagerly(self._run(request, self.responder))
            finally:
                self._starting = False

    def _complete_request(self) -> Request | None:
        """The next request once its head and body are in (None: not yet, or the head was refused)."""
        if self._pending is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD_BYTES:
                    self._fail(HttpError(431, f"request head: more than {MAX_HEAD_BYTES} bytes"))
                return None
            if end > MAX_HEAD_BYTES:
                self._fail(HttpError(431, f"request head: more than {MAX_HEAD_BYTES} bytes"))
                return None
            try:
                self._pending, self._need = _parse_head(bytes(self._buf[:end]), self._max_body)
            except HttpError as exc:
                self._fail(exc)
                return None
            del self._buf[:end + 4]
            expect = self._pending.header(b"expect")
            if expect is not None and expect.lower() == b"100-continue" and self._need > len(self._buf):
                assert self.transport is not None
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits for it before the body
        if len(self._buf) < self._need:
            return None
        request, self._pending = self._pending, None
        request.body = bytes(self._buf[:self._need])
        del self._buf[:self._need]
        return request

    async def _run(self, request: Request, responder: Responder) -> None:
        try:
            await self._handler(request, responder)
        except Exception:  # the handler answers its own errors; this is a bug: close rather than hang
            responder.abort()
        finally:
            responder.on_close = None
            self._busy = False
            if not responder.keep_alive or not responder.complete:
                responder.close()
            elif not self.closed:
                assert self.transport is not None
                self.transport.resume_reading()
                if self._buf and not self._starting:  # (while starting, _next's loop goes on)
                    self._next()

    def expire(self, now: float, read_timeout_s: float, idle_timeout_s: float | None) -> None:
        """Close this connection if its client is late (``now``: monotonic seconds; called every sweep): answer 408
        when the request being read has not all come ``read_timeout_s`` after a sweep first found it coming; close
        it when no request has been on it for ``idle_timeout_s`` (None: never) since a sweep first found it idle.
        A timeout thus ends up to two sweeps' intervals late (one to notice, one to act). A request being answered
        never expires."""
        if self._busy or self.closed or self.transport is None or self.transport.is_closing():
            return
        state = _READING if self._buf or self._pending is not None else _IDLE
        if state != self._swept:
            self._swept, self._swept_at = state, now
        elif state == _READING:
            if now - self._swept_at > read_timeout_s:
                self._fail(HttpError(408, f"request: not all of it came within {read_timeout_s:g} s"))
        elif idle_timeout_s is not None and now - self._swept_at > idle_timeout_s:
            self.transport.close()

    def _fail(self, exc: HttpError) -> None:
        responder = Responder(self)
        responder.keep_alive = False
        body = error_body(exc.message, "invalid_request_error", exc.status)
        responder.send(exc.status, [(b"content-type", b"application/json")], body)
        responder.close()

    async def writable(self) -> None:
        """Wait until the client has read enough (or left)."""
        while self._paused and not self.closed:
            self._resumed = asyncio.get_running_loop().create_future()
            await self._resumed


_CHUNKED, _LENGTH, _CLOSE, _NO_BODY = range(4)
"""How a started response's body is framed: chunked; by the ``Content-Length`` given; by the connection's close
(an HTTP/1.0 client, the length unknown); no body at all (the answer to a HEAD request)."""


class Responder:
    """How a handler answers one request: :meth:`send` a whole response, or :meth:`start` a streamed one,
    :meth:`write_chunk` its parts and :meth:`end` it. ``on_close``: called once if the client hangs up first.

    A streamed body is chunked, unless its length is given (then it goes as it is, after ``Content-Length``) or the
    client spoke HTTP/1.0 (then it goes as it is and the connection's close ends it). The answer to a HEAD request
    is the head alone."""

    __slots__ = ("_conn", "_framing", "_http10", "_transport", "complete", "keep_alive", "on_close", "started")

    def __init__(self, conn: FrontConnection, request: Request | None = None) -> None:
        self._conn = conn
        self._transport = conn.transport
        self._framing = _CHUNKED
        self._http10 = False
        self.keep_alive = True
        """Whether the connection may serve another request after this response (the request's wish, unless the
        response must end with the close)."""
        if request is not None:
            self.keep_alive = request.keep_alive
            if request.http10:
                self._http10 = True
            if request.method == "HEAD":
                self._framing = _NO_BODY
        self.started = False
        self.complete = False
        self.on_close: Callable[[], None] | None = None

    @property
    def closed(self) -> bool:
        """Whether the client has gone."""
        return self._conn.closed

    def _persistence(self) -> bytes:
        """The ``Connection`` header the response needs: ``close`` when the connection closes after it (RFC 9112,
        9.6), ``keep-alive`` for an HTTP/1.0 client whose connection is kept (its default is the close)."""
        if not self.keep_alive:
            return b"connection: close\r\n"
        return b"connection: keep-alive\r\n" if self._http10 else b""

    def send(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole response (``Content-Length`` added)."""
        self.started = True
        head = _head(status, headers) + self._persistence() + b"content-length: %d\r\n\r\n" % len(body)
        if not self._conn.closed and self._transport is not None:
            self._transport.write(head if self._framing == _NO_BODY else head + body)
        self.complete = True

    def start(self, status: int, headers: list[tuple[bytes, bytes]], length: int | None = None) -> None:
        """The head of a streamed response: its body of ``length`` bytes when given, else of a length not known
        yet (chunked; for an HTTP/1.0 client, ended by the connection's close)."""
        self.started = True
        if length is not None:
            framing = b"content-length: %d\r\n" % length
            if self._framing != _NO_BODY:
                self._framing = _LENGTH
        elif self._http10:
            framing = b""
            self.keep_alive = False
            if self._framing != _NO_BODY:
                self._framing = _CLOSE
        else:
            framing = b"transfer-encoding: chunked\r\n"
        if not self._conn.closed and self._transport is not None:
            self._transport.write(_head(status, headers) + self._persistence() + framing + b"\r\n")

    async def write_chunk(self, data: bytes) -> None:
        """One part of the body (empty data: nothing); waits while the client reads too slowly."""
        if self.put_chunk(data):
            await self._conn.writable()

    def put_chunk(self, data: bytes) -> bool:
        """One part of the body (empty data: nothing), not waiting: whether the client now reads too slowly (then
        wait for :meth:`writable` before the next)."""
        if data and not self._conn.closed and self._transport is not None:
            framing = self._framing
            if framing == _CHUNKED:
                self._transport.write(b"%x\r\n%s\r\n" % (len(data), data))
            elif framing != _NO_BODY:
                self._transport.write(data)
            return self._conn._paused
        return False

    async def writable(self) -> None:
        """Wait until the client has read enough (or left)."""
        await self._conn.writable()

    def end(self, last: bytes = b"") -> None:
        """End a streamed response, ``last`` its final part (not waiting for the client): it is complete."""
        if not self._conn.closed and self._transport is not None:
            framing = self._framing
            if framing == _CHUNKED:
                self._transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last) if last else b"0\r\n\r\n")
            elif last and framing != _NO_BODY:
                self._transport.write(last)
        self.complete = True

    def close(self) -> None:
        """Close the connection once what was written is sent."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def abort(self) -> None:
        """Close the connection now (a response cut short must not look complete)."""
        if self._transport is not None:
            self._transport.abort()


def _head(status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
    return b"HTTP/1.1 %d %s\r\n%s" % (status, STATUS_TEXT.get(status, "Status").encode(), header_block(headers))


def error_body(message: str, kind: str, status: int, code: str | None = None) -> bytes:
    """An OpenAI-style error body: ``{"error": {"message", "type", "code"}}``."""
    import json
    return json.dumps({"error": {"message": message, "type": kind, "code": code if code is not None else status}},
                      ensure_ascii=True).encode()


# ---- upstream ---------------------------------------------------------------------------------------------


class UpstreamError(Exception):
    """The backend could not be reached, or sent something that is not an HTTP response."""


class PumpReader(asyncio.StreamReader):
    """A stream reader that, while a pump is attached (:meth:`attach`), hands each read straight to it from the
    connection's callback: no buffer, no task woken per read. Detached, it is asyncio's reader."""

    _pump: Callable[[bytes], None] | None = None
    _pump_end: Callable[[BaseException | None], None] | None = None
    if TYPE_CHECKING:  # asyncio.StreamReader's own state (CPython 3.8 to 3.13)
        _buffer: bytearray
        _eof: bool
        _exception: BaseException | None

        def _maybe_resume_transport(self) -> None: ...

    def attach(self, pump: Callable[[bytes], None], end: Callable[[BaseException | None], None]) -> None:
        """From now on, call ``pump(data)`` with what arrives (what is buffered first) and ``end(exc)`` once at
        the end of the stream (``exc`` None for a plain end, else the connection's error)."""
        self._pump, self._pump_end = pump, end
        if self._buffer:
            data = bytes(self._buffer)
            self._buffer.clear()
            self._maybe_resume_transport()
            pump(data)
        if self._eof or self._exception is not None:
            self._ended(self._exception)

    def detach(self) -> None:
        """Buffer again, as asyncio's reader."""
        self._pump = self._pump_end = None

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        pump = self._pump
        if pump is None:
            super().feed_data(data)
        else:
            pump(bytes(data))  # the protocol's bytes (bytes() of a bytes object is that object)

    def feed_eof(self) -> None:
        super().feed_eof()
        self._ended(None)

    def set_exception(self, exc: Exception) -> None:
        super().set_exception(exc)
        self._ended(exc)

    def _ended(self, exc: BaseException | None) -> None:
        end = self._pump_end
        if end is not None:
            self._pump = self._pump_end = None
            end(exc)


async def open_upstream(host: str, port: int, limit: int) -> tuple[PumpReader, asyncio.StreamWriter]:
    """``asyncio.open_connection`` with a :class:`PumpReader`."""
    loop = asyncio.get_running_loop()
    reader = PumpReader(limit=limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.create_connection(lambda: protocol, host, port)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


@dataclass(slots=True)
class UpstreamConnection:
    """One open connection to a backend."""

    reader: PumpReader
    writer: asyncio.StreamWriter

    def abort(self) -> None:
        """Close it now (the backend sees the request cancelled)."""
        with contextlib.suppress(Exception):
            self.writer.transport.abort()


@dataclass(slots=True)
class UpstreamResponse(_Headed):
    """A backend's response head: ``headers`` with lower-case names; how its body is framed."""

    status: int
    headers: list[tuple[bytes, bytes]]
    length: int | None
    chunked: bool
    keep_alive: bool
    connection_options: frozenset[bytes] = frozenset()
    """The header names its ``Connection`` header lists besides ``close`` and ``keep-alive`` (not passed on)."""


@dataclass
class UpstreamPool:
    """Idle keep-alive connections to one backend (at most ``max_idle``)."""

    host: str
    port: int
    max_idle: int = 64
    connect_timeout_s: float = 2.0
    _idle: list[UpstreamConnection] = field(default_factory=list)

    async def acquire(self) -> tuple[UpstreamConnection, bool]:
        """A connection, and whether it was reused (a reused one may have been closed by the backend)."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.writer.transport.is_closing() and not conn.reader.at_eof():
                return conn, True
            conn.abort()  # the backend closed it meanwhile
        try:
            reader, writer = await asyncio.wait_for(
                open_upstream(self.host, self.port, MAX_HEAD_BYTES), self.connect_timeout_s)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"connect to {self.host}:{self.port}: {exc or type(exc).__name__}") from exc
        return UpstreamConnection(reader, writer), False

    def release(self, conn: UpstreamConnection) -> None:
        """Keep ``conn`` for the next request (or close it when enough are kept)."""
        if len(self._idle) < self.max_idle and not conn.writer.transport.is_closing():
            self._idle.append(conn)
        else:
            conn.abort()

    def close(self) -> None:
        """Close every idle connection."""
        for conn in self._idle:
            conn.abort()
        self._idle.clear()


def header_block(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """``Name: value`` lines, each ending in CRLF, one per pair: the ``headers`` of :func:`send_request`."""
    return b"".join([b"%s: %s\r\n" % kv for kv in headers])


async def send_request(conn: UpstreamConnection, method: str, target: str, host: str, headers: bytes,
                       body: bytes) -> UpstreamResponse:
    """Write a request on ``conn`` and read the response head. ``headers``: its header lines besides ``host`` and
    ``content-length``, each ending in CRLF (:func:`header_block`, :meth:`Request.header_lines`). Raises
    :class:`UpstreamError`."""
    try:
        conn.writer.write(b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n%s\r\n%s" % (
            method.encode(), target.encode("latin-1"), host.encode(), len(body), headers, body))
        head = await conn.reader.readuntil(b"\r\n\r\n")
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise UpstreamError(f"no response: {exc or type(exc).__name__}") from exc
    return parse_response_head(head[:-4])


def parse_response_head(head: bytes) -> UpstreamResponse:
    """A response head (without its blank line). Raises :class:`UpstreamError`."""
    lines = head.split(b"\r\n")
    why = _bad_byte(head, lines, "response head")
    if why is not None:
        raise UpstreamError(why)
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise UpstreamError(f"not an HTTP response: {lines[0][:80]!r}")
    status = int(parts[1])
    headers: list[tuple[bytes, bytes]] = []
    named: set[bytes] = set()
    length: int | None = None
    chunked = False
    keep_alive = parts[0] == b"HTTP/1.1"
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        key, val = name.strip().lower(), value.strip()
        headers.append((key, val))
        if key == b"content-length" and val.isdigit():
            length = int(val)
        elif key == b"transfer-encoding" and b"chunked" in val.lower():
            chunked = True
        elif key == b"connection":
            keep_alive = _keeps(val.lower(), keep_alive, named)
    if chunked:
        length = None
    return UpstreamResponse(status, headers, length, chunked, keep_alive, frozenset(named) if named else _NO_OPTIONS)


class ChunkedDecoder:
    """Cuts a chunked body into its payloads as bytes arrive: :meth:`feed` returns the payload bytes completed
    (joined), :attr:`done` once the last chunk and its trailers were read."""

    __slots__ = ("_buf", "_crlf", "_left", "_trailers", "done")

    def __init__(self) -> None:
        self._buf = b""
        self._left = 0  # payload bytes of the current chunk still to come
        self._crlf = 0  # bytes of the CRLF after that payload still to come
        self._trailers = False
        self.done = False

    def feed(self, data: bytes) -> bytes:
        """The payload bytes completed by ``data``. Raises :class:`UpstreamError` on bad framing."""
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos, n = 0, len(buf)
        while pos < n and not self.done:
            if self._left:
                take = min(self._left, n - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._crlf = 2
                continue
            if self._crlf:
                take = min(self._crlf, n - pos)
                pos += take
                self._crlf -= take
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > 1024:
                    raise UpstreamError("chunked body: a line longer than 1024 bytes")
                break
            line = buf[pos:eol]
            pos = eol + 2
            if self._trailers:
                self.done = not line
                continue
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError as exc:
                raise UpstreamError(f"chunked body: bad chunk size {size_text[:20]!r}") from exc
            if size == 0:
                self._trailers = True
            else:
                self._left = size
        self._buf = buf[pos:] if pos < n else b""
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)
