"""The guard around every entry point a server calls: errors inside llmslo never reach the host.

An exception raised inside llmslo is caught, counted and logged at most once per ``log_interval_s``
(seconds) per site; a NaN, infinite or negative timing is dropped and counted by reason.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable

LOGGER = logging.getLogger("llmslo.telemetry")


class Guard:
    """Counts and rate-limits the logging of failures inside llmslo.

    ``clock_s`` (monotonic seconds) is injectable for tests; ``log_interval_s`` is the least time between
    two log records of the same site, seconds. ``on_error`` and ``on_drop`` let the metrics count them.
    """

    def __init__(self, *, log_interval_s: float = 60.0, clock_s: Callable[[], float] = time.monotonic,
                 logger: logging.Logger = LOGGER) -> None:
        self.log_interval_s = log_interval_s
        self._clock_s = clock_s
        self._logger = logger
        self._lock = threading.Lock()
        self._last_log: dict[str, float] = {}
        self.errors: dict[str, int] = {}
        self.dropped: dict[str, int] = {}
        self.on_error: Callable[[str], None] | None = None
        self.on_drop: Callable[[str, int], None] | None = None

    def error(self, site: str, exc: BaseException) -> None:
        """Record an exception caught at ``site``; never raises."""
        try:
            with self._lock:
                self.errors[site] = self.errors.get(site, 0) + 1
                now = self._clock_s()
                last = self._last_log.get(site)
                should_log = last is None or now - last >= self.log_interval_s
                if should_log:
                    self._last_log[site] = now
                count = self.errors[site]
            if should_log:
                self._logger.warning("llmslo: internal error in %s (%d so far): %r", site, count, exc)
            if self.on_error is not None:
                self.on_error(site)
        except Exception:
            pass

    def drop(self, reason: str, n: int = 1) -> None:
        """Count ``n`` dropped observations (``nan``, ``infinite``, ``negative`` or ``invalid_count``)."""
        try:
            with self._lock:
                self.dropped[reason] = self.dropped.get(reason, 0) + n
            if self.on_drop is not None:
                self.on_drop(reason, n)
        except Exception:
            pass

    def timing(self, value: float | None) -> float | None:
        """``value`` when it is a finite non-negative number of seconds, else ``None`` (dropped, counted)."""
        if value is None:
            return None
        if value != value:
            self.drop("nan")
            return None
        if math.isinf(value):
            self.drop("infinite")
            return None
        if value < 0:
            self.drop("negative")
            return None
        return value

    @property
    def error_count(self) -> int:
        """Exceptions caught so far, all sites together."""
        return sum(self.errors.values())


def never_raising(say: Callable[[str], None] | None) -> Callable[[str], None]:
    """A server's ``say`` (its progress lines; None: none), with a line it cannot write dropped: a server's own
    work, a drain above all, never stops for its log (a standard error whose reader has gone raises)."""
    if say is None:
        return silent

    def guarded(line: str) -> None:
        with contextlib.suppress(Exception):
            say(line)

    return guarded


def silent(_: str) -> None:
    """The ``say`` of a server given none: every line dropped."""
