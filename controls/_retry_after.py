"""``Retry-After`` from what the queue really does: the observed drain rate and the depth ahead.

A constant ``Retry-After`` sends every refused client back at the same moment (a retry storm) and tells
nothing about how long the wait really is. :class:`RetryAfterEstimator` estimates

    wait ≈ depth_ahead / drain_rate        (seconds = requests / (requests per second))

where ``drain_rate`` is the rate at which requests leave the queue (scheduled, timed out, displaced or
ended while waiting: each frees a place), smoothed by an exponentially weighted moving average over
**busy time** only (time with at least one request waiting). Idle time says nothing about how fast the
queue drains, so an empty queue does not decay the estimate; a queue that stays full while nobody leaves
closes windows with a rate of 0, so a stalled engine drives ``Retry-After`` to ``max_s``.

The estimate is then jittered by ``±jitter`` (a fraction, from an injectable :class:`random.Random`) and
bounded to ``[min_s, max_s]``. Fallback: before any drain has been observed (no closed window and no
departure yet) the wait is ``fallback_s`` (jittered and bounded likewise); the estimator never guesses a
rate it has not seen.
"""

from __future__ import annotations

import math
import random
import threading

from llmslo.controls._decision import MONOTONIC, Clock
from llmslo.telemetry import ConfigurationError


def _positive(owner: str, field: str, value: float, *, zero_ok: bool = False) -> float:
    ok = (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
          and (value >= 0 if zero_ok else value > 0))
    if not ok:
        bound = ">= 0" if zero_ok else "> 0"
        raise ConfigurationError(f"{owner}.{field}: must be a finite number {bound}, got {value!r}")
    return float(value)


class RetryAfterEstimator:
    """Seconds a refused client should wait, from the observed drain rate and the queue depth ahead of it.

    Parameters (keyword-only; every time in seconds):

    - ``min_s`` / ``max_s``: the bounds of every estimate (defaults 1 and 60).
    - ``fallback_s``: the wait before any drain has been observed (default 5; within the bounds).
    - ``jitter``: the estimate is multiplied by a uniform factor in ``[1 - jitter, 1 + jitter]`` (default
      0.2; 0 disables it), drawn from ``rng`` (a :class:`random.Random`; a fresh one when ``None``).
    - ``window_s``: busy seconds per rate sample (default 1).
    - ``smoothing_s``: the time constant of the moving average, in busy seconds (default 5): a sample
      covering ``b`` busy seconds gets the weight ``1 - exp(-b / smoothing_s)``.
    - ``clock``: monotonic seconds, used when a call passes no ``now``.

    Thread-safe. Raises :class:`ConfigurationError` naming the field for a bad value.

    Example::

        est = RetryAfterEstimator(min_s=1, max_s=30)
        est.record(departed=0, depth_after=1)     # a request entered an empty queue
        est.record(departed=1, depth_after=0)     # it left
        est.estimate(depth_ahead=40)              # seconds, bounded and jittered
    """

    def __init__(self, *, min_s: float = 1.0, max_s: float = 60.0, fallback_s: float = 5.0,
                 jitter: float = 0.2, window_s: float = 1.0, smoothing_s: float = 5.0,
                 rng: random.Random | None = None, clock: Clock = MONOTONIC) -> None:
        owner = "RetryAfterEstimator"
        self.min_s = _positive(owner, "min_s", min_s, zero_ok=True)
        self.max_s = _positive(owner, "max_s", max_s)
        if self.max_s < self.min_s:
            raise ConfigurationError(f"{owner}.max_s: must be >= min_s ({self.min_s}), got {max_s!r}")
        self.fallback_s = _positive(owner, "fallback_s", fallback_s, zero_ok=True)
        if not self.min_s <= self.fallback_s <= self.max_s:
            raise ConfigurationError(
                f"{owner}.fallback_s: must lie within [min_s, max_s] = [{self.min_s}, {self.max_s}], "
                f"got {fallback_s!r}")
        self.jitter = _positive(owner, "jitter", jitter, zero_ok=True)
        if self.jitter >= 1:
            raise ConfigurationError(f"{owner}.jitter: must be a fraction in [0, 1), got {jitter!r}")
        self.window_s = _positive(owner, "window_s", window_s)
        self.smoothing_s = _positive(owner, "smoothing_s", smoothing_s)
        if rng is not None and not isinstance(rng, random.Random):
            raise ConfigurationError(f"{owner}.rng: must be a random.Random, got {type(rng).__name__}")
        if not callable(clock):
            raise ConfigurationError(f"{owner}.clock: must be a callable returning seconds")
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._lock = threading.Lock()
        self._rate: float | None = None  # smoothed requests per second; None until a window closed
        self._count = 0  # departures in the open window
        self._busy = 0.0  # busy seconds in the open window
        self._depth = 0  # queue depth after the last record
        self._last: float | None = None  # time of the last record

    # ---- observations ------------------------------------------------------------------------------------

    def record(self, departed: int, depth_after: int, now: float | None = None) -> None:
        """``departed`` requests left the queue at ``now`` (seconds; the clock when ``None``), leaving
        ``depth_after`` waiting. Call it on every change of depth (an arrival into the queue: ``departed=0``),
        so busy time is known. Bad values are ignored."""
        for n in (departed, depth_after):
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                return
        t = self._clock() if now is None else now
        self._lock.acquire()
        try:
            self._accumulate(t)
            self._count += departed  # departures at ``now`` belong to the busy time up to ``now``
            self._depth = depth_after
            self._close_window()
        finally:
            self._lock.release()

    def _advance(self, now: float) -> None:
        self._accumulate(now)
        self._close_window()

    def _accumulate(self, now: float) -> None:
        """Add the busy time (a request waiting) since the last record up to ``now``."""
        last = self._last
        if last is not None and now > last and self._depth > 0:
            self._busy += now - last
        if last is None or now > last:
            self._last = now

    def _close_window(self) -> None:
        """Close the window once it holds ``window_s`` busy seconds: fold its rate into the average."""
        busy = self._busy
        if busy >= self.window_s:
            sample = self._count / busy
            weight = 1.0 - math.exp(-busy / self.smoothing_s)
            self._rate = sample if self._rate is None else weight * sample + (1.0 - weight) * self._rate
            self._count = 0
            self._busy = 0.0

    # ---- estimates ---------------------------------------------------------------------------------------

    def drain_rate(self, now: float | None = None) -> float | None:
        """The smoothed drain rate (requests per second); before the first window closes, departures over
        busy time so far; ``None`` when no departure and no window has been observed."""
        t = self._clock() if now is None else now
        self._lock.acquire()
        try:
            self._advance(t)
            return self._rate_locked()
        finally:
            self._lock.release()

    def _rate_locked(self) -> float | None:
        if self._rate is not None:
            return self._rate
        if self._count > 0 and self._busy > 0:
            return self._count / self._busy
        return None

    def estimate(self, depth_ahead: int, now: float | None = None) -> float:
        """Seconds to wait for ``depth_ahead`` requests (waiting ahead of the refused one) to drain, jittered
        and bounded to ``[min_s, max_s]``; ``fallback_s`` (jittered, bounded) before any drain was seen,
        ``max_s`` when the queue drains at rate 0. Never raises."""
        t = self._clock() if now is None else now
        valid = isinstance(depth_ahead, int) and not isinstance(depth_ahead, bool) and depth_ahead > 0
        ahead = depth_ahead if valid else 0
        self._lock.acquire()
        try:
            self._advance(t)
            rate = self._rate_locked()
            factor = 1.0 + self._rng.uniform(-self.jitter, self.jitter) if self.jitter else 1.0
        finally:
            self._lock.release()
        if rate is None:
            base = self.fallback_s
        elif rate <= 0:
            base = self.max_s
        else:
            base = ahead / rate
        return min(self.max_s, max(self.min_s, base * factor))
