"""An incremental parser of ``text/event-stream`` bodies (Server-Sent Events), as OpenAI-compatible servers send.

Bytes go in as they arrive; out come the ``data`` payloads of the events completed so far (several ``data:``
lines of one event are joined with a line feed, as the SSE specification says). Comments (``:`` lines),
``event:``, ``id:`` and ``retry:`` fields are skipped. Line ends may be ``\\n``, ``\\r\\n`` or ``\\r``, split
anywhere between two reads. Payloads stay bytes (``json.loads`` reads bytes). Standard library only.
"""

from __future__ import annotations

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
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + data if self._buf else data
        if b"\n\n" not in buf:
            if len(buf) > MAX_EVENT_BYTES:
                raise SseTooLarge(f"an event of more than {MAX_EVENT_BYTES} bytes")
            self._buf = buf
            return []
        blocks = buf.split(b"\n\n")
        self._buf = blocks.pop()
        out: list[bytes] = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:  # the usual shape: one data line
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
