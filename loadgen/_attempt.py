"""One attempt: send a request to an OpenAI-compatible endpoint, time what comes back, classify how it ended.

Every moment is a ``time.monotonic_ns()`` reading of the client (the wall clock is read once, for
``arrival_unix_s``): ``sent_ns`` just before the request is handed to the connection, the receive time of
each read that completed an event, the first and last byte, the end of the attempt (the last byte, or the
moment the client hung up). Events are decoded defensively: anything a server sends is data, never a reason
to raise.

How an attempt ends (the wire contract's table; the first terminal signal received wins):

=============================================================  ================  ==========================
what the client saw                                            finish_reason     reject_reason / error_type
=============================================================  ================  ==========================
a choice's ``finish_reason`` stop / length (and synonyms)      stop / length
``finish_reason`` server_draining, or an error event of type   server_draining
server_draining
an error event of type deadline                                deadline
the client hung up (its cancel delay, its timeout, a stop)     client_cancel
429 / 503 whose body's ``error.type`` is a reject reason       rejected          that reason
429 otherwise                                                  rejected          rate_limited
another status                                                 error             ``http_<status>``
another error event                                            error             stream_error
no connection                                                  error             connect_error
the connection failed after it was made                        error             read_error
the body ended cleanly without a finish_reason                 error             truncated
=============================================================  ================  ==========================

A refusal by the client's own breaker is never sent; the runner records it (rejected, ``circuit_open``).
:func:`attempt_row` turns an :class:`Attempt` into a request-summary row, :func:`attempt_log_entry` into a
line of the attempts log.

A failed attempt keeps why (:meth:`Attempt.cause`): the HTTP status and the first
:data:`ERROR_BODY_KEPT_BYTES` bytes of the answer's body as received (an empty body as empty), the class of
the exception that broke the connection, the server's error event or finish reason, or the client's own
hang-up.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from llmslo.loadgen._behaviour import RequestPlan
from llmslo.telemetry._openai_stream import (
    SseParser,
    SseTooLarge,
    bounded_text,
    classify_error,
    classify_finish,
    classify_status,
    read_event,
    read_reply,
)

NS = 1_000_000_000
MAX_ERROR_BODY_BYTES = 65_536
"""How much of a refusal's or an error's body is read, bytes (the rest is not needed to classify it)."""
ERROR_BODY_KEPT_BYTES = 200
"""How much of a non-200 answer's body an attempt keeps (``Attempt.error_body``), bytes."""
CAUSE_BODY_CHARS = 100
"""How much of that body a cause shows (:meth:`Attempt.cause`), characters."""
STREAM_OPTIONS_REFUSALS: tuple[int, ...] = (400, 422)
"""The statuses that, with a body naming ``stream_options``, say the server refuses that field."""
MAX_REPLY_BYTES = 64 * 1024 * 1024
"""The largest non-streamed reply read, bytes."""
AFTER_DONE_BYTES = 64 * 1024
AFTER_DONE_S = 1.0
"""After a stream's ``[DONE]``, the most bytes and seconds its body's rest is read for, so that its connection is
kept alive; past either the connection is closed (a server that sends on, or never ends the body)."""
ERROR_TYPES: tuple[str, ...] = ("connect_error", "read_error", "stream_error", "truncated")
"""The client's error classes besides ``http_<status>``."""

_text = bounded_text


@dataclass(slots=True)
class Attempt:
    """Everything the client saw of one request. Times are ``time.monotonic_ns()`` readings (ns)."""

    request_id: str
    index: int
    scheduled_offset_s: float
    prompt_words: int
    max_tokens: int
    plan: RequestPlan = field(default_factory=RequestPlan)
    scheduled_ns: int = 0
    sent_unix_s: float | None = None
    sent_ns: int | None = None
    status: int | None = None
    retry_after: str | None = None
    server_request_id: str | None = None
    headers_ns: int | None = None
    first_byte_ns: int | None = None
    last_byte_ns: int | None = None
    end_ns: int | None = None
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] | None = field(default_factory=list)
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    server_finish_reason: str | None = None
    server_error: str | None = None
    drain_reason: str | None = None
    terminal: str | None = None
    terminal_ns: int | None = None
    tokens_read: int = 0
    saw_done: bool = False
    malformed_events: int = 0
    hangup_cause: str | None = None
    transport_error: str | None = None
    transport_detail: str | None = None
    breaker_refused: bool = False
    finish_reason: str = "error"
    reject_reason: str | None = None
    error_type: str | None = None
    unknown_finish: bool = False
    saw_usage: bool = False
    asked_usage: bool = False
    error_body: str | None = None
    error_body_bytes: int = 0
    error_class: str | None = None
    refused_stream_options: bool = False

    # ---- what the summary row needs ------------------------------------------------------------------

    @property
    def received_any(self) -> bool:
        """Whether any byte of an answer arrived (its status line and headers count)."""
        return self.headers_ns is not None or self.first_byte_ns is not None

    @property
    def last_received_ns(self) -> int | None:
        """When the last byte of the answer arrived: its body's last byte, else its headers (an empty body);
        None when nothing arrived."""
        return self.last_byte_ns if self.last_byte_ns is not None else self.headers_ns

    @property
    def replied(self) -> bool:
        """Whether the server answered 200 (a reply, however it then ended)."""
        return self.status == 200 and not self.breaker_refused

    @property
    def token_source(self) -> str | None:
        """Where the row's ``generated_tokens`` comes from: ``usage`` (the server's ``usage.completion_tokens``),
        ``chunks`` (the content chunks counted: the reply carried no usage), or None (no reply, or a reply
        with neither content nor usage)."""
        if not self.replied:
            return None
        usage, counted = self.usage_completion_tokens, self.counted_tokens
        if usage is not None and (usage > 0 or counted == 0):
            return "usage"
        return "chunks" if counted > 0 else None

    @property
    def counted_tokens(self) -> int:
        """Output tokens received, counted from the content chunks (a chunk's own usage when it carries one,
        else one token per chunk)."""
        if self.chunk_tokens is not None and len(self.chunk_tokens) == len(self.chunk_ns) and self.chunk_ns:
            return sum(self.chunk_tokens)
        return len(self.chunk_ns)

    @property
    def tokens_known_per_chunk(self) -> bool:
        """True when each content chunk's token count is known (per-chunk usage, or usage equal to the count
        of chunks)."""
        if self.chunk_tokens is not None and self.chunk_ns and len(self.chunk_tokens) == len(self.chunk_ns):
            return True
        return self.usage_completion_tokens is not None and self.usage_completion_tokens == len(self.chunk_ns)

    def per_chunk_tokens(self) -> list[int] | None:
        """Tokens in each content chunk, when known."""
        if self.chunk_tokens is not None and self.chunk_ns and len(self.chunk_tokens) == len(self.chunk_ns):
            return list(self.chunk_tokens)
        if self.usage_completion_tokens is not None and self.usage_completion_tokens == len(self.chunk_ns):
            return [1] * len(self.chunk_ns)
        return None

    # ---- reading events ------------------------------------------------------------------------------

    def on_payload(self, payload: bytes, now_ns: int) -> bool:
        """Take one event's data; True when it was ``[DONE]`` (the stream is over)."""
        ev = read_event(payload)
        if ev.done:
            self.saw_done = True
            return True
        if ev.malformed:
            self.malformed_events += 1
            return False
        if ev.error is not None:
            if self.server_error is None:
                self.server_error = ev.error
            if self.terminal is None:
                self.terminal, self.terminal_ns = "error", now_ns
            return False
        if ev.content:
            self.chunk_ns.append(now_ns)
        if ev.finish_reason is not None and self.server_finish_reason is None:
            self.server_finish_reason = ev.finish_reason
            if self.terminal is None:
                self.terminal, self.terminal_ns = "finish", now_ns
        k = 0
        if ev.has_usage:
            self.saw_usage = True
        if ev.prompt_tokens is not None:
            self.usage_prompt_tokens = ev.prompt_tokens
        if ev.completion_tokens is not None:
            k = ev.completion_tokens - (self.usage_completion_tokens or 0)
            self.usage_completion_tokens = ev.completion_tokens
        if ev.content:
            if self.chunk_tokens is not None:
                if k >= 1:
                    self.chunk_tokens.append(k)
                else:
                    self.chunk_tokens = None
            self.tokens_read += k if k >= 1 else 1
        if ev.drain_reason is not None:
            self.drain_reason = ev.drain_reason
        return False

    def on_reply(self, body: bytes, now_ns: int) -> None:
        """Take a non-streamed reply (a JSON body with ``choices`` and ``usage``)."""
        ev = read_reply(body)
        if ev.malformed:
            self.malformed_events += 1
            return
        if ev.error is not None:
            self.server_error = ev.error
            self.terminal, self.terminal_ns = "error", now_ns
            return
        if ev.finish_reason is not None:
            self.server_finish_reason = ev.finish_reason
            self.terminal, self.terminal_ns = "finish", now_ns
        self.saw_usage = ev.has_usage
        self.usage_completion_tokens = ev.completion_tokens
        self.usage_prompt_tokens = ev.prompt_tokens
        if self.usage_completion_tokens:  # a reply in one piece: its tokens arrived at once
            self.chunk_ns = [now_ns]
            self.chunk_tokens = [self.usage_completion_tokens]
            self.tokens_read = self.usage_completion_tokens
        elif ev.content:  # text without usage: one content chunk, counted as one token
            self.chunk_ns = [now_ns]
            self.chunk_tokens = None
            self.tokens_read = 1

    # ---- classification ------------------------------------------------------------------------------

    def classify(self, error_body: bytes | None = None) -> None:
        """Set ``finish_reason``, ``reject_reason``, ``error_type`` from what was seen (the contract's table)."""
        self.reject_reason = self.error_type = None
        if self.breaker_refused:
            self.finish_reason, self.reject_reason = "rejected", "circuit_open"
        elif self.status is not None and self.status != 200:
            self._classify_status(error_body)
        elif self.terminal == "error":
            self._classify_error_event()
        elif self.terminal == "finish" and self.server_finish_reason is not None:
            self._classify_finish(self.server_finish_reason)
        elif self.hangup_cause is not None:
            self.finish_reason = "client_cancel"
        elif self.transport_error is not None:
            self.finish_reason, self.error_type = "error", self.transport_error
        else:
            self.finish_reason, self.error_type = "error", "truncated"

    def _classify_status(self, body: bytes | None) -> None:
        # the body's error type as the middleware and the gateway read it (read_reply: the one reader)
        kind = read_reply(body).error if body else None
        self.finish_reason, self.reject_reason, self.error_type = classify_status(self.status or 0, kind)

    def _classify_error_event(self) -> None:
        self.finish_reason, self.error_type = classify_error(self.server_error or "")

    def _classify_finish(self, reason: str) -> None:
        self.finish_reason, self.error_type, self.unknown_finish = classify_finish(reason)

    def cause(self) -> str | None:
        """Why an attempt that did not finish ``stop`` / ``length`` ended so, in a few words that group
        (None for a success): ``HTTP 400 (empty body)``, ``HTTP 503 {"error":...`` (the body as received, its
        control characters written as escapes, cut at :data:`CAUSE_BODY_CHARS` characters with ``…``),
        ``ConnectError`` (the class of the exception that broke the connection), ``error event: T``,
        ``finish_reason R``, a hang-up of the client, ``refused by the client breaker (not sent)``. The same
        order as :meth:`classify`."""
        if self.finish_reason in ("stop", "length"):
            return None
        if self.breaker_refused:
            return "refused by the client breaker (not sent)"
        if self.status is not None and self.status != 200:
            return f"HTTP {self.status} {body_shown(self.error_body, self.error_body_bytes, self.error_class)}"
        if self.terminal == "error":
            return f"error event: {printable(self.server_error or '')}"
        if self.terminal == "finish" and self.server_finish_reason is not None:
            drain = f" (drain_reason {printable(self.drain_reason)})" if self.drain_reason is not None else ""
            return f"finish_reason {printable(self.server_finish_reason)}{drain}"
        if self.hangup_cause is not None:
            return {"cancel": "the client hung up (--cancel)", "timeout": "client timeout (--timeout)",
                    "stop": "hung up at the stop"}.get(self.hangup_cause, f"hung up ({self.hangup_cause})")
        if self.transport_error is not None:
            return self.error_class or self.transport_error
        return "the body ended without a finish reason"


def printable(text: str) -> str:
    """``text`` with every character that is not printable (control characters, line ends, invisible format
    characters) written as its escape (``\\x1b``, ``\\n``, ``\\u202e``), everything else as it is: one
    line that no terminal interprets."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    if c in "\n\r\t":
        return repr(c)[1:-1]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def body_shown(body: str | None, size: int, error_class: str | None = None) -> str:
    """A non-200 answer's body as a cause shows it: ``(empty body)``; the text as received (see
    :func:`printable`), cut at :data:`CAUSE_BODY_CHARS` characters with ``…`` when there was more (``size``:
    the bytes read); or, when it could not be read, ``(body not read: <exception class>)``."""
    if body is None:
        return f"(body not read: {error_class})" if error_class else "(body not read)"
    if not body and size == 0:
        return "(empty body)"
    more = len(body) > CAUSE_BODY_CHARS or size > ERROR_BODY_KEPT_BYTES
    return printable(body[:CAUSE_BODY_CHARS]) + ("…" if more else "")


def keep_body(body: bytes) -> str:
    """The first :data:`ERROR_BODY_KEPT_BYTES` bytes of ``body`` as text: UTF-8, a character cut by the limit
    left out, bytes that are not UTF-8 written as ``\\xNN``."""
    decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")
    return decoder.decode(body[:ERROR_BODY_KEPT_BYTES], final=len(body) <= ERROR_BODY_KEPT_BYTES)


# ---- the summary row and the log line --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Identity:
    """The identity columns of every row of a run."""

    model: str
    version: str = "client"
    tenant_class: str = "default"


def _s(ns: int, origin: int) -> float:
    return max(0, ns - origin) / NS


def token_weighted_gaps(chunk_ns: list[int], tokens: list[int] | None) -> list[float] | None:
    """Inter-token gaps, seconds: a chunk carrying ``k`` tokens after a gap ``g`` gives ``k`` gaps of ``g / k``
    (``tokens`` None: one gap per chunk). None when fewer than two chunks arrived."""
    if len(chunk_ns) < 2:
        return None
    out: list[float] = []
    for i in range(1, len(chunk_ns)):
        gap = (chunk_ns[i] - chunk_ns[i - 1]) / NS
        k = tokens[i] if tokens is not None else 1
        if k <= 1:
            out.append(gap)
        else:
            out.extend([gap / k] * k)
    return out


def attempt_row(a: Attempt, identity: Identity) -> dict[str, Any]:
    """The request-summary row of attempt ``a``, measured on the client.

    ``arrival_unix_s`` is the wall-clock moment of the send; ``ttft_s`` / ``last_token_s`` are the first and
    last content chunk's receive times after the send, ``e2e_s`` the end of the attempt (last byte, or the
    hang-up); ``client_ttft_s`` repeats ``ttft_s`` and ``client_e2e_s`` is the last byte received (the
    headers' when the body was empty; null when nothing was received: no connection, a refusal of the
    client's breaker, a hang-up before any byte).
    ``queue_s`` is null (the client cannot see the server's queue). ``generated_tokens`` is the server's
    ``usage.completion_tokens`` when it sent one, else the tokens counted; ``sent_tokens`` the tokens
    received, never above ``generated_tokens``. ``itl_s`` holds the token-weighted chunk gaps.
    """
    origin = a.sent_ns if a.sent_ns is not None else a.end_ns or 0
    end = a.end_ns if a.end_ns is not None else origin
    rejected = a.finish_reason == "rejected"
    counted = 0 if rejected else a.counted_tokens
    usage = None if rejected else a.usage_completion_tokens
    generated = usage if usage is not None and (usage > 0 or counted == 0) else counted
    complete = a.server_finish_reason is not None and usage is not None
    sent = generated if complete else min(counted, generated)
    first = last = None
    if generated > 0:
        if a.chunk_ns:
            first, last = _s(a.chunk_ns[0], origin), _s(a.chunk_ns[-1], origin)
        else:  # tokens the server counted but sent as empty text: at the event that ended the reply
            first = last = _s(a.terminal_ns if a.terminal_ns is not None else end, origin)
    e2e = max(_s(end, origin), last or 0.0)
    gaps = None
    if generated > 1 and len(a.chunk_ns) > 1:
        gaps = token_weighted_gaps(a.chunk_ns, a.per_chunk_tokens())
    return {
        "request_id": a.request_id,
        "model": identity.model,
        "version": identity.version,
        "tenant_class": identity.tenant_class,
        "arrival_unix_s": a.sent_unix_s if a.sent_unix_s is not None else time.time(),
        "finish_reason": a.finish_reason,
        "reject_reason": a.reject_reason,
        "error_type": a.error_type,
        "queue_s": None,
        "ttft_s": first,
        "last_token_s": last,
        "e2e_s": e2e,
        "prompt_tokens": a.usage_prompt_tokens if a.usage_prompt_tokens is not None else a.prompt_words,
        "proposed_tokens": 0,
        "generated_tokens": generated,
        "sent_tokens": sent,
        "client_ttft_s": first,
        "client_e2e_s": _s(received, origin) if (received := a.last_received_ns) is not None else None,
        "stream_paused_s": 0.0,
        "stream_max_queued": 0,
        "itl_s": gaps,
    }


def attempt_log_entry(a: Attempt) -> dict[str, Any]:
    """One line of the attempts log (JSON-ready): identity, schedule, send time (Unix s and monotonic ns),
    status, ``Retry-After`` as received, the outcome and its cause (a non-200 body's first bytes, the
    exception's class), and every content chunk's receive time (monotonic ns)."""
    late = None if a.sent_ns is None else (a.sent_ns - a.scheduled_ns) / NS
    return {
        "request_id": a.request_id,
        "index": a.index,
        "scheduled_offset_s": a.scheduled_offset_s,
        "scheduled_ns": a.scheduled_ns,
        "sent_unix_s": a.sent_unix_s,
        "sent_ns": a.sent_ns,
        "late_s": late,
        "status": a.status,
        "retry_after": a.retry_after,
        "server_request_id": a.server_request_id,
        "finish_reason": a.finish_reason,
        "reject_reason": a.reject_reason,
        "error_type": a.error_type,
        "server_finish_reason": a.server_finish_reason,
        "server_error": a.server_error,
        "drain_reason": a.drain_reason,
        "hangup": a.hangup_cause,
        "cause": a.cause(),
        "error_body": a.error_body,
        "error_body_bytes": a.error_body_bytes,
        "error_class": a.error_class,
        "transport_error": a.transport_detail,
        "breaker_refused": a.breaker_refused,
        "prompt_words": a.prompt_words,
        "max_tokens": a.max_tokens,
        "asked_usage": a.asked_usage,
        "refused_stream_options": a.refused_stream_options,
        "usage_prompt_tokens": a.usage_prompt_tokens,
        "usage_completion_tokens": a.usage_completion_tokens,
        "token_source": a.token_source,
        "slow_reader_tokens_per_s": a.plan.slow_tokens_per_s,
        "cancel_after_s": a.plan.cancel_after_s,
        "timeout_s": a.plan.timeout_s,
        "headers_ns": a.headers_ns,
        "first_byte_ns": a.first_byte_ns,
        "last_byte_ns": a.last_byte_ns,
        "end_ns": a.end_ns,
        "saw_done": a.saw_done,
        "malformed_events": a.malformed_events,
        "chunk_ns": a.chunk_ns,
        "chunk_tokens": a.per_chunk_tokens(),
    }


# ---- sending ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """What to send: the URL of the endpoint, the JSON body, the headers; ``stream`` says whether the body
    asks for a stream; ``id_header`` names the header that carries the request id (None: none does);
    ``keep_alive``: whether the connection is to be kept for another request (then a stream is read to its end
    after ``[DONE]``; else it is closed there)."""

    url: str
    body: bytes
    headers: Mapping[str, str]
    stream: bool
    id_header: str | None = "X-Request-Id"
    keep_alive: bool = True


class HangUps:
    """The attempts in flight and their hang-up timers, so a stop can hang every one of them up at once."""

    def __init__(self) -> None:
        self._open: dict[int, tuple[Attempt, asyncio.Timeout]] = {}
        self._closed = False
        self.hung_up = 0
        """Attempts hung up by :meth:`hang_up_all` (or registered after it), each counted once."""

    def add(self, a: Attempt, timer: asyncio.Timeout) -> None:
        """Register an attempt just sent; after :meth:`hang_up_all` it is hung up at once."""
        self._open[id(a)] = (a, timer)
        if self._closed:
            self._hang_up(a, timer, "stop", asyncio.get_running_loop().time())

    def _hang_up(self, a: Attempt, timer: asyncio.Timeout, cause: str, now: float) -> None:
        if a.hangup_cause is None:
            a.hangup_cause = cause
            self.hung_up += 1
        timer.reschedule(now)

    def discard(self, a: Attempt) -> None:
        self._open.pop(id(a), None)

    def __len__(self) -> int:
        return len(self._open)

    def hang_up_all(self, cause: str = "stop") -> None:
        """Hang up every attempt in flight now, and every one registered later (``cause`` goes to the log of
        each one not already hanging up for a cause of its own)."""
        self._closed = True
        now = asyncio.get_running_loop().time()
        for a, timer in list(self._open.values()):
            self._hang_up(a, timer, cause, now)


async def send_attempt(client: httpx.AsyncClient, request: Request, a: Attempt, hangups: HangUps,
                       on_headers: Callable[[Attempt], None] | None = None) -> None:
    """Send ``request``, read the answer into ``a``, classify it; ``on_headers(a)`` is called as soon as the
    status and headers are in. Never raises but for cancellation of the calling task (which the runner never
    does: it hangs up through ``hangups``)."""
    loop = asyncio.get_running_loop()
    deadline = a.plan.deadline_s
    error_body: bytes | None = None
    built = client.build_request("POST", request.url, content=request.body, headers=dict(request.headers))
    a.sent_unix_s = time.time()
    a.sent_ns = time.monotonic_ns()
    timer = asyncio.timeout_at(None if deadline is None else loop.time() + deadline)
    try:
        async with timer:
            hangups.add(a, timer)  # entered: a stop can reschedule it
            error_body = await _exchange(client, built, request, a, on_headers)
    except TimeoutError:
        if not timer.expired():  # pragma: no cover - a TimeoutError from elsewhere: a read that failed
            a.transport_error, a.transport_detail, a.error_class = "read_error", "TimeoutError", "TimeoutError"
        elif a.hangup_cause is None:
            a.hangup_cause = a.plan.deadline_cause or "timeout"
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        _failed(a, "connect_error", exc)
    except SseTooLarge as exc:
        _failed(a, "stream_error", exc)
        a.transport_detail = _text(str(exc))
    except Exception as exc:  # httpx's read and protocol errors, OSError, anything else: data, never a crash
        _failed(a, "read_error", exc)
    finally:
        hangups.discard(a)
        a.end_ns = time.monotonic_ns()
        last = a.last_received_ns
        if last is not None and a.hangup_cause is None and a.transport_error is None:
            a.end_ns = last  # the attempt ended with its last byte, not when the client noticed
    a.classify(error_body)


def _failed(a: Attempt, error_type: str, exc: BaseException) -> None:
    """Record the exception that ended ``a``: its error class, the exception's class and message."""
    a.transport_error, a.error_class = error_type, type(exc).__name__
    a.transport_detail = _text(f"{type(exc).__name__}: {exc}")


async def _exchange(client: httpx.AsyncClient, built: httpx.Request, request: Request, a: Attempt,
                    on_headers: Callable[[Attempt], None] | None) -> bytes | None:
    """Send ``built`` (made from ``request``) and read; the body of a non-200 answer (bounded) for
    classification, else None."""
    stream, id_header = request.stream, request.id_header
    response = await client.send(built, stream=True)
    try:
        a.headers_ns = time.monotonic_ns()
        a.status = response.status_code
        retry_after = response.headers.get("retry-after")
        a.retry_after = _text(retry_after) if retry_after is not None else None
        rid = response.headers.get(id_header) if id_header is not None else None
        a.server_request_id = _text(rid) if rid is not None else None
        if on_headers is not None:
            on_headers(a)
        if response.status_code != 200:
            body = await _read_bounded(response, a, MAX_ERROR_BODY_BYTES)
            a.error_body, a.error_body_bytes = keep_body(body), len(body)
            a.refused_stream_options = (a.asked_usage and a.status in STREAM_OPTIONS_REFUSALS
                                        and b"stream_options" in body)
            return body
        if not stream:
            body = await _read_bounded(response, a, MAX_REPLY_BYTES)
            a.on_reply(body, a.last_byte_ns or time.monotonic_ns())
            return None
        await _read_stream(response, a, request.keep_alive)
        return None
    finally:
        await response.aclose()


async def _read_bounded(response: httpx.Response, a: Attempt, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for data in response.aiter_bytes():
        now = time.monotonic_ns()
        if a.first_byte_ns is None:
            a.first_byte_ns = now
        a.last_byte_ns = now
        parts.append(data)
        size += len(data)
        if size >= limit:
            break
    return b"".join(parts)


async def _read_to_end(body: AsyncIterator[bytes]) -> None:
    """After ``[DONE]``, read what is left of the body (its chunked end, usually nothing more), as OpenAI's client
    does, so that the connection is kept for the next request instead of closed: at most :data:`AFTER_DONE_BYTES`
    within :data:`AFTER_DONE_S`, else the connection is closed as before. The reply is complete at ``[DONE]``:
    nothing read here counts."""
    left = AFTER_DONE_BYTES
    with contextlib.suppress(httpx.HTTPError, httpx.StreamError, OSError, TimeoutError):
        async with asyncio.timeout(AFTER_DONE_S):
            async for data in body:
                left -= len(data)
                if left < 0:
                    return


async def _read_stream(response: httpx.Response, a: Attempt, keep_alive: bool) -> None:
    parser = SseParser()
    pace = a.plan.slow_tokens_per_s
    monotonic_ns = time.monotonic_ns
    body = response.aiter_bytes()
    async for data in body:
        now = monotonic_ns()
        if a.first_byte_ns is None:
            a.first_byte_ns = now
        a.last_byte_ns = now
        done = False
        for payload in parser.feed(data):
            if a.on_payload(payload, now):
                done = True
                break
        if done:
            if keep_alive:
                await _read_to_end(body)
            return
        if pace is not None and a.chunk_ns:
            due = a.chunk_ns[0] + int((a.tokens_read - 1) * NS / pace)
            wait = due - monotonic_ns()
            if wait > 0:
                await asyncio.sleep(wait / NS)
