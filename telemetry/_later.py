"""Records written a little later: the bookkeeping of a request's end, off the path of the requests beside it.

A request's terminal state is committed at once (its clock reading, its resources released: the admission slot
is free again). Its *record* (the summary row for the sink, the metrics with their exemplars, the span) is work
nobody waits for. On a server whose clients move in step (streams of one length, started together, end
together and send their next requests together), writing each record as its request ends puts that work ahead
of every request that arrives meanwhile. :class:`LaterRecords` holds the records and writes them on the event
loop a little later, a few at a time between the loop's reads, so a burst of ends does not delay a burst of
starts.

Nothing is lost or reordered: records are written in the order their requests ended, every one within
``delay_s`` of the first one waiting, and at once on :meth:`LaterRecords.flush` (a scrape of the metrics, the
server's close) or when :data:`MAX_WAITING` are waiting. The record's times are the request's own (its
terminal state's clock readings), not the time it is written.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable

SLICE = 16
"""The most records written in one turn of the event loop; the rest in the next turns."""
MAX_WAITING = 1024
"""The most records waiting: one more is written at once (with the ones before it), so memory stays bounded
when ends come faster than the loop's idle turns."""


class LaterRecords:
    """Writes the records given to :meth:`add` on ``loop``, up to ``delay_s`` seconds later (see the module).

    :meth:`add` is for the loop's own thread only (:meth:`on_loop_thread` tells); :meth:`flush` may run on any
    thread (a scrape's): each record is written once, by whoever takes it first.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, delay_s: float) -> None:
        if not delay_s > 0:
            raise ValueError(f"delay_s: expected seconds > 0, got {delay_s!r}")
        self.loop = loop
        self.delay_s = delay_s
        self._waiting: deque[Callable[[], None]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._turn: asyncio.Handle | None = None
        self._thread = threading.get_ident()

    def on_loop_thread(self) -> bool:
        """Whether the caller runs on the loop's thread (the one that made this object)."""
        return threading.get_ident() == self._thread

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, write: Callable[[], None]) -> None:
        """Write one record later (``write`` never raises: its caller guards it)."""
        waiting = self._waiting
        waiting.append(write)
        if len(waiting) > MAX_WAITING:
            self._write(len(waiting) - MAX_WAITING + SLICE)
        elif self._timer is None and self._turn is None:
            self._timer = self.loop.call_later(self.delay_s, self._due)

    def flush(self) -> None:
        """Write every record waiting, now."""
        self._write(len(self._waiting))

    def close(self) -> None:
        """Write every record waiting and stop the timers."""
        for handle in (self._timer, self._turn):
            if handle is not None:
                handle.cancel()
        self._timer = self._turn = None
        self.flush()

    def _due(self) -> None:
        self._timer = None
        self._slice()

    def _slice(self) -> None:
        self._turn = None
        self._write(SLICE)
        if self._waiting:
            self._turn = self.loop.call_soon(self._slice)

    def _write(self, n: int) -> None:
        waiting = self._waiting
        for _ in range(n):
            try:
                write = waiting.popleft()
            except IndexError:  # empty, or emptied by another thread's flush
                return
            write()
