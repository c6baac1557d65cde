"""The one reader of OpenAI-compatible replies: what a first token, a chunk, ``usage`` and a finish reason are.

The load generator, the ASGI middleware and the gateway all read replies through this module, so they agree
on every definition:

* :class:`SseParser` cuts a ``text/event-stream`` body (Server-Sent Events) into the ``data`` payloads of its
  events as bytes arrive (several ``data:`` lines of one event joined with a line feed, as the SSE
  specification says; comments, ``event:``, ``id:`` and ``retry:`` skipped; ``\\n``, ``\\r\\n`` or ``\\r`` line
  ends split anywhere between two reads);
* :func:`read_event` reads one payload (a streamed chunk) and :func:`read_reply` a whole non-streamed reply
  into a :class:`ReplyEvent`: a **content chunk** is one whose first choice carries non-empty text
  (``text``, or ``delta.content`` / ``reasoning_content`` / ``reasoning``); the first content chunk is the
  first token; ``usage`` gives the prompt and completion tokens (cumulative where a server repeats it);
  the first choice's ``finish_reason`` is the server's word for how the reply ended;
* :func:`classify_finish` maps a server's finish reason onto ours (definitions.md); :func:`classify_status`
  a refusal or failure status with its body's ``error.type``, :func:`classify_error` an error event.

Anything a server sends is data, never a reason to raise. Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from json.scanner import make_scanner
from typing import NamedTuple

from llmslo.telemetry._summary import REJECT_REASONS

_CR, _LF = 13, 10
"""A byte's value is looked for as an integer (``_CR in data``) and several bytes with ``find``: on Python 3.11
``bytes in bytes`` first tries its argument as an integer, and raises and clears a TypeError doing so (143 ns
against 68 for ``find`` and 17 for one byte's value, ``python -m timeit`` on a 100-byte chunk)."""
MAX_EVENT_BYTES = 16 * 1024 * 1024
"""The longest event this parser holds before giving up (:class:`SseTooLarge`), bytes."""


class SseTooLarge(ValueError):
    """An event grew past :data:`MAX_EVENT_BYTES` without ending: not an event stream a server should send."""


class SseParser:
    """Feed bytes with :meth:`feed`; it returns the payloads of the events that completed."""

    __slots__ = ("_buf", "_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._cr = False  # the previous read ended with a lone CR: a LF starting this one belongs to it

    def feed(self, data: bytes) -> list[bytes]:
        """The ``data`` payloads of every event completed by ``data`` (in order; may be empty)."""
        if self._cr and data.startswith(b"\n"):
            data = data[1:]
        self._cr = data.endswith(b"\r")
        if _CR in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + data if self._buf else data
        if buf.find(b"\n\n") < 0:
            if len(buf) > MAX_EVENT_BYTES:
                raise SseTooLarge(f"an event of more than {MAX_EVENT_BYTES} bytes")
            self._buf = buf
            return []
        blocks = buf.split(b"\n\n")
        self._buf = blocks.pop()
        out: list[bytes] = []
        for block in blocks:
            if block.startswith(b"data: ") and _LF not in block:  # the usual shape: one data line
                out.append(block[6:])
                continue
            payload = self._payload(block)
            if payload is not None:
                out.append(payload)
        return out

    @staticmethod
    def _payload(block: bytes) -> bytes | None:
        lines = []
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                value = line[5:]
                lines.append(value[1:] if value.startswith(b" ") else value)
        return b"\n".join(lines) if lines else None

    @property
    def pending(self) -> int:
        """Bytes held of an event not yet complete."""
        return len(self._buf)


_LINE_END = rb"(?>\r\n|\r|\n)"
"""One line end as :class:`SseParser` reads it: CR LF, CR or LF; atomic, so that a CR LF is never read as a CR then
a LF (two line ends)."""
_BLANK_LINE = re.compile(_LINE_END * 2)
_LAST_BLANK_LINE = re.compile(rb"(?s:.*)" + _LINE_END * 2)
"""The last blank line of some bytes: the greedy ``.*`` is tried from the end backwards."""


def events_end(data: bytes, start: int = 0) -> int:
    """Where the last complete event of ``data`` ends, just past the blank line that ends it (a line end right
    after a line end, any of the three), the blank line searched from ``start`` on; -1 when there is none. For a
    proxy that passes events on as they came (their bytes unchanged) while :class:`SseParser` reads them: the same
    framing, offsets kept. ``data`` must not begin with the LF of a CR LF whose CR ended the bytes before it."""
    m = _LAST_BLANK_LINE.match(data, start)
    return -1 if m is None else m.end()


def raw_events(data: bytes) -> tuple[list[bytes], bytes]:
    """The complete events of ``data`` as they came (each with the blank line that ends it; a blank line of no
    event is an event of its own), and the rest: ``b"".join(events) + rest == data``."""
    events: list[bytes] = []
    start = 0
    for m in _BLANK_LINE.finditer(data):
        events.append(data[start:m.end()])
        start = m.end()
    return events, data[start:]


# ---- what one payload says -------------------------------------------------------------------------------

MAX_TEXT = 200
"""Longest server-provided text kept from a reply (error types, finish reasons), characters."""

STOP_SYNONYMS: frozenset[str] = frozenset({
    "stop", "eos", "eos_token", "stop_sequence", "end_turn", "tool_calls", "function_call", "content_filter",
})
"""Finish reasons servers send for a reply that ended normally before its limit; recorded as ``stop``."""
LENGTH_SYNONYMS: frozenset[str] = frozenset({"length", "max_tokens", "model_length"})
"""Finish reasons for a reply cut at its token limit; recorded as ``length``."""
ABORT_REASONS: frozenset[str] = frozenset({"abort", "aborted", "error", "cancelled"})
"""Finish reasons that say the server gave up on the request; recorded as ``error`` / ``stream_error``."""


def bounded_text(value: object) -> str:
    """A server-provided value as bounded text (at most :data:`MAX_TEXT` characters), shown literally by
    whoever prints it."""
    return (value if isinstance(value, str) else json.dumps(value, default=str))[:MAX_TEXT]


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class ReplyEvent(NamedTuple):
    """What one streamed payload (or one whole reply) says.

    ``done``: the ``[DONE]`` sentinel; ``malformed``: not a JSON object; ``content``: the first choice carries
    non-empty text (a content chunk); ``finish_reason``: the first choice's, as the server wrote it (bounded);
    ``prompt_tokens`` / ``completion_tokens``: from ``usage`` (None where absent or not a count);
    ``has_usage``: a ``usage`` object was present; ``error``: an ``error`` object's ``type`` (else the error
    as text); ``drain_reason``: llmslo's own ``drain_reason`` field.
    """

    done: bool = False
    malformed: bool = False
    content: bool = False
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    has_usage: bool = False
    error: str | None = None
    drain_reason: str | None = None


DONE = ReplyEvent(done=True)
MALFORMED = ReplyEvent(malformed=True)


_SCAN: Callable[[str, int], tuple[object, int]] = make_scanner(
    json.JSONDecoder())  # type: ignore[arg-type]  # typeshed types the context as a scanner; it is the decoder
_JSON_SPACE = " \t\n\r"


def json_value(data: bytes) -> object:
    """``json.loads(data)``: the same value, or ``ValueError``. A UTF-8 text that is one JSON value from its first
    character (what servers and clients send) is scanned directly, skipping ``json.loads``' encoding detection and
    whitespace matching; anything else (leading space, another encoding, an error to report) goes through
    ``json.loads`` itself."""
    try:
        text = data.decode("utf-8")
        value, end = _SCAN(text, 0)
        if end == len(text) or not text[end:].strip(_JSON_SPACE):
            return value
    except (UnicodeDecodeError, StopIteration, ValueError):
        pass
    return json.loads(data)


def read_event(payload: bytes) -> ReplyEvent:
    """One SSE ``data`` payload of a streamed completion or chat completion."""
    if payload.strip() == b"[DONE]":
        return DONE
    try:
        obj = json_value(payload)
    except ValueError:
        return MALFORMED
    if not isinstance(obj, dict):
        return MALFORMED
    return _read_object(obj, streamed=True)


def read_reply(body: bytes) -> ReplyEvent:
    """A whole non-streamed reply (a JSON body with ``choices`` and ``usage``); ``content`` is true when its
    first choice carries text."""
    try:
        obj = json_value(body)
    except ValueError:
        return MALFORMED
    if not isinstance(obj, dict):
        return MALFORMED
    return _read_object(obj, streamed=False)


def error_of(obj: dict[str, object]) -> str | None:
    """What an error object says went wrong (bounded text), None when ``obj`` is not an error: an ``error`` object's
    ``type``, else the ``error`` itself as text; a string ``error`` beside a string ``error_type`` (TGI's shape) is the
    ``error_type``; an object of ``"object": "error"`` (vLLM's ``ErrorResponse`` before it nested ``error``) is its
    top-level ``type``, else its ``message``."""
    err = obj.get("error")
    if err is not None:
        kind = err.get("type") if isinstance(err, dict) else obj.get("error_type")
        return bounded_text(kind if isinstance(kind, str) and kind else err)
    if obj.get("object") == "error":
        kind = obj.get("type")
        return bounded_text(kind if isinstance(kind, str) and kind else obj.get("message", "error"))
    return None


def _read_object(obj: dict[str, object], streamed: bool) -> ReplyEvent:
    error = error_of(obj)
    if error is not None:
        return ReplyEvent(error=error)
    content = False
    finish: str | None = None
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        text = choice.get("text")
        if text is None:
            part = choice.get("delta" if streamed else "message")
            if isinstance(part, dict):
                text = part.get("content") or part.get("reasoning_content") or part.get("reasoning")
        content = isinstance(text, str) and bool(text)
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            finish = bounded_text(reason)
    prompt = completion = None
    usage = obj.get("usage")
    has_usage = isinstance(usage, dict)
    if isinstance(usage, dict):
        prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    drain = obj.get("drain_reason")
    return ReplyEvent(content=content, finish_reason=finish, prompt_tokens=prompt, completion_tokens=completion,
                      has_usage=has_usage, drain_reason=None if drain is None else bounded_text(drain))


def classify_finish(reason: str) -> tuple[str, str | None, bool]:
    """A server's finish reason as ``(finish_reason, error_type, unknown)`` of ours: length synonyms are
    ``length``; ``server_draining`` and ``deadline`` keep their names; an abort is ``error`` /
    ``stream_error``; anything else is ``stop`` (``unknown`` true when it is not a known stop synonym)."""
    if reason in LENGTH_SYNONYMS:
        return "length", None, False
    if reason in ("server_draining", "deadline"):
        return reason, None, False
    if reason in ABORT_REASONS:
        return "error", "stream_error", False
    return "stop", None, reason not in STOP_SYNONYMS


def classify_status(status: int, error_type: str | None) -> tuple[str, str | None, str | None]:
    """A response of ``status`` (>= 400) whose body's ``error.type`` is ``error_type`` (None: none) as
    ``(finish_reason, reject_reason, error_type)`` of ours: a 429 or 503 whose type is one of our reject reasons
    is ``rejected`` with it; a ``deadline`` type is ``deadline`` (a queue timeout, a 504); any other 429 is
    ``rejected`` / ``rate_limited``; anything else ``error`` / ``http_<status>``."""
    if status in (429, 503) and error_type in REJECT_REASONS:
        return "rejected", error_type, None
    if error_type == "deadline":
        return "deadline", None, None
    if status == 429:
        return "rejected", "rate_limited", None
    return "error", None, f"http_{status}"


def classify_error(error_type: str) -> tuple[str, str | None]:
    """An error event of a stream (or the error object of a 200 reply) whose type is ``error_type`` as
    ``(finish_reason, error_type)`` of ours: ``server_draining`` and ``deadline`` keep their names, anything
    else is ``error`` / ``stream_error``."""
    if error_type in ("server_draining", "deadline"):
        return error_type, None
    return "error", "stream_error"
