"""Observe one OpenAI-compatible response as it is handed on, and feed its request's tracker.

The ASGI middleware (what an app hands to its server) and the gateway (what an engine sends back) both read a
response through :class:`ReplyObserver`, so they record the same things the same way:

- the status line decides what the body is: an event stream (``text/event-stream``), a whole reply, or a
  refusal/failure (status >= 400) whose body's ``error.type`` is read;
- each content chunk of a stream is committed when it is handed on (the tokens ``usage`` says it carries where a
  chunk carries cumulative ``usage``, else one); tokens the final ``usage`` counts beyond the chunks are committed
  with it; a whole reply is one commit of ``usage.completion_tokens``;
- the prompt tokens come from ``usage``, the finish reason from the reply (:func:`classify_finish`), an error
  event ends the request ``server_draining``, ``deadline`` or ``error``/``stream_error``; a stream that completes
  with neither is ``error``/``truncated``;
- a refusal is ``rejected`` with its reason (:func:`classify_status`), its ``Retry-After`` reported.

Per chunk the common case costs a prefix and suffix comparison, in one call to the request's token log: once a
stream's plain content chunk has been read, a chunk that differs from it only in its text is committed without
parsing (see :meth:`_learn`). Memory is
bounded: an error body is kept up to :data:`MAX_ERROR_BODY_BYTES`, a whole reply up to :data:`MAX_REPLY_BYTES`, an
event up to the parser's limit. Standard library only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from llmslo.telemetry._lifecycle import RequestTracker
from llmslo.telemetry._openai_stream import (
    SseParser,
    SseTooLarge,
    classify_error,
    classify_finish,
    classify_status,
    read_event,
    read_reply,
)

MAX_ERROR_BODY_BYTES = 64 * 1024
"""The most bytes of an error response (status >= 400) kept to read its ``error.type``."""
MAX_REPLY_BYTES = 4 * 1024 * 1024
"""The most bytes of a non-streamed reply kept to read it; a longer reply is recorded ``stop`` with its tokens
unknown (no commit)."""

UNKNOWN, SSE, REPLY, REFUSED = 0, 1, 2, 3
"""What a response is, once its status line is known (:attr:`ReplyObserver.kind`)."""

_TEXT_KEYS: tuple[bytes, ...] = tuple(
    f'"{key}":{space}"'.encode() for key in ("text", "content", "reasoning_content", "reasoning")
    for space in ("", " "))
_BACKSLASH = 92
DONE_EVENTS = frozenset({b"data: [DONE]\n\n", b"data: [DONE]\r\n\r\n", b"data:[DONE]\n\n"})
"""The ``[DONE]`` sentinel as one body part, in the spellings servers send."""

RetryAfterReport = Callable[[str, str, float], None]
"""``report(model, reject_reason, seconds)``: a refusal's ``Retry-After`` (e.g. ``Telemetry.observe_retry_after``)."""


class ReplyObserver:
    """Reads one response for ``tracker``: call :meth:`start` with its status line, :meth:`body` with each body
    part before it is handed on (it returns the tokens committed, to count as sent once handed over), and
    :meth:`complete` once the last part was handed over. :attr:`plain` is the per-chunk shortcut.

    ``report_retry_after`` receives a refusal's ``Retry-After`` in seconds. The observer never ends the request
    before :meth:`complete`; the caller ends it otherwise (a client that left, an exception).
    """

    __slots__ = (
        "_commit", "_expect", "_parser", "_plen", "_ppre", "_pre", "_report", "_saved", "_slen", "_suf", "_vlen",
        "_vsuf", "body_parts", "body_size", "error", "finish", "kind", "plain", "retry_after", "status", "t",
    )

    def __init__(self, tracker: RequestTracker, report_retry_after: RetryAfterReport | None = None) -> None:
        self.t = tracker
        self._commit = tracker.commit
        self._expect = tracker.expect_plain
        self.plain: Callable[[object], bool] = tracker.commit_plain
        """``plain(body)``: whether ``body`` is one plain content chunk of the shape learnt (then its token is
        committed now): the per-chunk shortcut, one native call where the token log's C module is built (a prefix
        and suffix comparison, see :meth:`_learn`). False: give the part to :meth:`body`."""
        self._report = report_retry_after
        self.kind = UNKNOWN
        self.status = 0
        self.finish: str | None = None
        """The server's finish reason, as it wrote it (bounded)."""
        self.error: str | None = None
        """The ``error.type`` of an error event or error reply."""
        self.retry_after: bytes | None = None
        self.body_parts: list[bytes] | None = None
        self.body_size = 0
        self._parser: SseParser | None = None
        # the shape of the stream's plain content chunks: every byte but the text (see _learn)
        self._pre: bytes | None = None
        self._suf = b""
        self._plen = self._slen = 0
        self._saved: bytes | None = None
        # the same shape for one event's payload (what the parser returns: no "data: ", no blank line), so that a
        # body of several events skips the parse of each plain one too
        self._ppre: bytes | None = None
        self._vsuf = b""
        self._vlen = 0

    # ---- the status line -------------------------------------------------------------------------------------

    def start(self, status: int, content_type: bytes, retry_after: bytes | None = None) -> None:
        """The response's status, its ``Content-Type`` (bytes, any case) and ``Retry-After`` (None: absent)."""
        self.status = status
        self.retry_after = retry_after
        if status >= 400:
            self.kind = REFUSED
            self.body_parts = []
        elif content_type.lower().startswith(b"text/event-stream"):
            self.kind = SSE
            self._parser = SseParser()
        else:
            self.kind = REPLY
            self.body_parts = []

    # ---- the body --------------------------------------------------------------------------------------------

    def body(self, data: bytes, last: bool) -> int:
        """Read one body part before it is handed on (``last``: no part follows); the tokens it carries
        (committed now)."""
        if self.kind == SSE:
            if not data or (data in DONE_EVENTS and self._parser is not None and not self._parser.pending):
                return 0  # nothing, or the [DONE] sentinel alone: nothing to read
            return self._events(data)
        if self.body_parts is not None and data:
            self._keep(data)
        if last and self.kind == REPLY:
            return self._reply()
        return 0

    def forget(self) -> None:
        """Stop reading (an observer that failed): drop everything held."""
        self._shape(None)
        self._saved = self._ppre = None
        self.body_parts = None
        self._parser = None

    def _keep(self, body: bytes) -> None:
        limit = MAX_ERROR_BODY_BYTES if self.kind == REFUSED else MAX_REPLY_BYTES
        self.body_size += len(body)
        if self.body_size > limit:
            self.body_parts = None if self.kind == REPLY else self.body_parts
            return
        assert self.body_parts is not None
        self.body_parts.append(body)

    def _events(self, body: bytes) -> int:
        """The events completed by ``body``: finish reason, usage, errors; commits. The tokens committed."""
        parser = self._parser
        if parser is None:
            return 0
        try:
            payloads = parser.feed(body)
        except SseTooLarge:  # not an event stream a server should send: stop reading it
            self._parser = None
            return 0
        t = self.t
        committed = 0
        plain: bytes | None = None
        ppre, vsuf, vlen, plen = self._ppre, self._vsuf, self._vlen, self._plen - 6
        for payload in payloads:
            if ppre is not None and payload.startswith(ppre) and payload.endswith(vsuf):
                end = len(payload) - vlen
                if end > plen and payload.find(b'"', plen) == end:  # a plain content chunk: one token
                    self._commit()
                    committed += 1
                    continue
            ev = read_event(payload)
            if ev.done or ev.malformed:
                continue
            if ev.error is not None:
                if self.finish is None and self.error is None:
                    self.error = ev.error
                continue
            if ev.finish_reason is not None and self.finish is None and self.error is None:
                self.finish = ev.finish_reason
            if ev.prompt_tokens is not None:
                t.prompt_tokens = ev.prompt_tokens
            k = 0
            if ev.completion_tokens is not None:
                k = ev.completion_tokens - t.generated_tokens
            if ev.content and k < 1:
                k = 1
            if k >= 1:
                self._commit(k)
                committed += k
            if (ev.content and ev.finish_reason is None and not ev.has_usage and ev.drain_reason is None
                    and len(payloads) == 1):
                plain = payload
        # the shape of plain content chunks holds for a whole body only while no event is left half-read; a plain
        # chunk read here did not have the shape kept (the first content chunk may carry the role too): learn anew
        if parser.pending or not body.endswith(b"\n"):
            if self._pre is not None:
                self._saved = self._pre
                self._shape(None)
        elif plain is not None:
            self._saved = None
            self._learn(body, plain)
        elif self._pre is None and self._saved is not None:
            self._shape(self._saved)
            self._saved = None
        return committed

    def _shape(self, prefix: bytes | None) -> None:
        """Expect plain content chunks of ``prefix`` + text + the suffix learnt (None: expect none)."""
        self._pre = prefix
        self._expect(prefix, self._suf)

    def _learn(self, body: bytes, payload: bytes) -> None:
        """Learn the shape of this stream's plain content chunks from ``body``, one such chunk (one event, no
        finish reason, usage or error) whose text field the reader found: every byte before the text is the
        prefix, every byte from its closing quote the suffix. A later body with that prefix and suffix and a
        non-empty text between them holding no quote says the same as this one but for its text (an escaped
        quote would be a quote; a text ending in an odd run of backslashes would escape the closing quote and
        leave no valid JSON), so it is one content chunk without parsing."""
        if body.find(payload) < 0:  # (find: see _openai_stream._CR)
            return
        start = -1
        for key in _TEXT_KEYS:
            i = body.find(key)
            if i < 0:
                continue
            if start >= 0 or body.find(key, i + 1) >= 0:
                return  # more than one text field: read every chunk
            start = i + len(key)
        if start < 0:
            return
        end = _string_end(body, start)
        if end is None or end == start:
            return
        prefix = body[:start]
        self._plen = start
        self._suf, self._slen = body[end:], len(body) - end
        self._shape(prefix)
        if body == b"data: " + payload + b"\n\n":
            self._ppre, self._vsuf, self._vlen = prefix[6:], self._suf[:-2], self._slen - 2
        else:
            self._ppre = None

    def _reply(self) -> int:
        """The whole non-streamed reply is in: read it, commit its tokens now (before it is handed over)."""
        if self.body_parts is None:
            return 0  # longer than MAX_REPLY_BYTES: its tokens stay unknown
        ev = read_reply(b"".join(self.body_parts))
        self.body_parts = None
        if ev.error is not None:
            self.error = ev.error
            return 0
        self.finish = ev.finish_reason
        if ev.prompt_tokens is not None:
            self.t.prompt_tokens = ev.prompt_tokens
        k = ev.completion_tokens if ev.completion_tokens is not None else (1 if ev.content else 0)
        if k >= 1:
            self._commit(k)
        return k

    # ---- the terminal state ----------------------------------------------------------------------------------

    def complete(self) -> None:
        """The response completed (its last body part was handed over): commit the terminal state."""
        t = self.t
        if t.done:
            return
        if self.kind == REFUSED:
            self._refused()
        elif self.error is not None:
            reason, error_type = classify_error(self.error)
            t.finish(reason, error_type=error_type)
        elif self.finish is not None:
            reason, error_type, _ = classify_finish(self.finish)
            t.finish(reason, error_type=error_type)
        elif self.kind == REPLY and self.body_size > MAX_REPLY_BYTES:
            t.finish("stop")
        else:
            t.finish("error", error_type="truncated")

    def _refused(self) -> None:
        t = self.t
        kind = read_reply(b"".join(self.body_parts)).error if self.body_parts else None
        self.body_parts = None
        finish, reject, error_type = classify_status(self.status, kind)
        if finish == "rejected":
            assert reject is not None
            t.reject(reject)
            seconds = retry_after_seconds(self.retry_after)
            if seconds is not None and self._report is not None:
                self._report(t.model, reject, seconds)
        else:
            t.finish(finish, error_type=error_type)


def retry_after_seconds(value: bytes | str | None, now_unix_s: float | None = None) -> float | None:
    """A ``Retry-After`` header in seconds: a number of seconds, or an HTTP date (seconds from
    ``now_unix_s``, default now; never below 0); None when absent or unreadable."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        from email.utils import parsedate_to_datetime
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        now = time.time() if now_unix_s is None else now_unix_s
        return max(0.0, when.timestamp() - now)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _string_end(data: bytes, start: int) -> int | None:
    """The index of the quote closing the JSON string whose text starts at ``start``; None if it does not
    close."""
    i = start
    while True:
        i = data.find(b'"', i)
        if i < 0:
            return None
        j = i
        while j > start and data[j - 1] == _BACKSLASH:
            j -= 1
        if (i - j) % 2 == 0:
            return i
        i += 1
