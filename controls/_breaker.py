"""A circuit breaker: closed → open → half-open with a bounded number of probes, for a server or a client.

``closed``: every request is let through and its outcome recorded. The breaker trips (→ ``open``) on
``consecutive_failures`` failures in a row, or when the error rate of ``windows`` consecutive windows of
``window_s`` seconds each is above ``error_rate`` (a window with fewer than ``min_requests`` outcomes is
not judged and breaks the streak, so one failure in a quiet window never trips it).

``open``: every request is refused ``circuit_open`` (HTTP 503) with ``retry_after_s`` = the seconds until
half-open. After ``open_s`` seconds the breaker turns ``half_open``.

``half_open``: at most ``half_open_probes`` requests are let through. When every probe succeeds the
breaker closes; the first failed probe opens it again (for another ``open_s``). A probe that reports no
outcome within ``probe_timeout_s`` seconds counts as failed, so a lost probe cannot hold the breaker
half-open forever.

What counts as a failure is a set of kinds (:data:`DEFAULT_FAILURE_KINDS`: ``5xx``, ``timeout``, ``oom``);
:func:`classify_status` and :func:`classify_exception` map an HTTP status or an exception to a kind.

The same class serves the client side (a load generator): :meth:`CircuitBreaker.honour_retry_after`
refuses every request until the ``Retry-After`` a 429/503 answer carried has passed.

Each state change is an audit event (:class:`BreakerEvent`, the last ``audit_size`` kept) and, with a
telemetry, sets ``llmslo_breaker_state`` and counts ``llmslo_breaker_transitions_total``.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Protocol

from llmslo.controls._decision import ADMIT, MONOTONIC, Clock, Decision, Rejectable
from llmslo.telemetry import ConfigurationError

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

DEFAULT_FAILURE_KINDS: frozenset[str] = frozenset({"5xx", "timeout", "oom"})
"""The outcomes counted as failures unless configured otherwise: 5xx answers, timeouts, out-of-memory."""

RETRY_AFTER_MAX_S = 3600.0
"""The longest ``Retry-After`` (seconds) :meth:`CircuitBreaker.honour_retry_after` obeys; longer is capped."""


class BreakerTelemetry(Protocol):
    """What the breaker reports to (:class:`llmslo.telemetry.Telemetry` has these methods; none raises)."""

    def set_breaker_state(self, breaker: str, state: str) -> None: ...

    def count_breaker_transition(self, breaker: str, from_state: str, to_state: str) -> None: ...

    def observe_retry_after(self, model: str, reject_reason: str, seconds: float) -> None: ...


@dataclass(frozen=True, slots=True)
class BreakerEvent:
    """One state change: at ``time_s`` (the breaker's clock, seconds) from ``from_state`` to ``to_state``,
    and ``why`` (a one-line reason for the audit log)."""

    time_s: float
    from_state: str
    to_state: str
    why: str

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {"time_s": self.time_s, "from_state": self.from_state, "to_state": self.to_state, "why": self.why}


def classify_status(status: int) -> str | None:
    """The outcome kind of an HTTP status: ``5xx`` (500–599), ``4xx`` (400–499), None for anything else."""
    if not isinstance(status, int) or isinstance(status, bool):
        return None
    if 500 <= status <= 599:
        return "5xx"
    if 400 <= status <= 499:
        return "4xx"
    return None


def classify_exception(exc: BaseException) -> str:
    """The outcome kind of an exception: ``timeout`` (``TimeoutError``, any class named ``*Timeout*``),
    ``oom`` (``MemoryError``, any class named ``*OutOfMemory*`` such as CUDA's), else ``exception``."""
    names = [c.__name__.lower() for c in type(exc).__mro__]
    if isinstance(exc, TimeoutError) or any("timeout" in n for n in names):
        return "timeout"
    if isinstance(exc, MemoryError) or any("outofmemory" in n for n in names):
        return "oom"
    return "exception"


def _positive_int(owner: str, name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"{owner}.{name}: must be an integer >= 1, got {value!r}")
    return value


def _positive_s(owner: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{owner}.{name}: must be a finite number of seconds > 0, got {value!r}")
    return float(value)


class CircuitBreaker:
    """A thread-safe circuit breaker named ``name`` (the ``breaker`` label: one per upstream or route).

    Parameters (keyword-only after ``name``):

    - ``consecutive_failures``: trip after this many failures in a row (None: never on a streak).
    - ``error_rate``: trip when the failed fraction of a window is above this (0 < rate < 1; None: never on
      a rate) for ``windows`` consecutive windows of ``window_s`` seconds, each with at least
      ``min_requests`` outcomes.
    - ``open_s``: seconds open before half-open. ``half_open_probes``: requests let through half-open.
    - ``probe_timeout_s``: seconds from the first probe until unreported probes count as failed (default
      ``open_s``).
    - ``failure_kinds``: the outcome kinds that count as failures (default :data:`DEFAULT_FAILURE_KINDS`).
    - ``audit_size``: how many audit events are kept (the oldest are dropped).
    - ``telemetry``: reports state and transitions (None: decide, report nothing).
    - ``clock`` (monotonic seconds) and ``wall_clock`` (Unix seconds, for HTTP-date ``Retry-After``).

    Raises :class:`ConfigurationError` naming the field for a bad configuration.

    Example::

        breaker = CircuitBreaker("engine", telemetry=tel)
        decision = breaker.allow()
        if not decision.admitted:
            tracker.reject(decision.reason)          # circuit_open, answered 503 with Retry-After
        else:
            try:
                reply = await engine.generate(prompt)
                breaker.record_status(reply.status)
            except Exception as exc:
                breaker.record_exception(exc)
                raise
    """

    def __init__(self, name: str, *, consecutive_failures: int | None = 5, error_rate: float | None = 0.6,
                 windows: int = 3, window_s: float = 10.0, min_requests: int = 5, open_s: float = 30.0,
                 half_open_probes: int = 1, probe_timeout_s: float | None = None,
                 failure_kinds: Collection[str] = DEFAULT_FAILURE_KINDS, audit_size: int = 64,
                 telemetry: BreakerTelemetry | None = None, clock: Clock = MONOTONIC,
                 wall_clock: Clock = time.time) -> None:
        owner = "CircuitBreaker"
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"{owner}.name: must be a non-empty string, got {name!r}")
        if consecutive_failures is not None:
            _positive_int(owner, "consecutive_failures", consecutive_failures)
        if error_rate is not None and (isinstance(error_rate, bool) or not isinstance(error_rate, (int, float))
                                       or not 0 < error_rate < 1):
            raise ConfigurationError(f"{owner}.error_rate: must be a fraction in (0, 1) or None, got {error_rate!r}")
        if consecutive_failures is None and error_rate is None:
            raise ConfigurationError(f"{owner}.consecutive_failures: give it or error_rate, or the breaker never trips")
        if isinstance(failure_kinds, str) or not all(isinstance(k, str) and k for k in failure_kinds):
            raise ConfigurationError(f"{owner}.failure_kinds: must be a collection of kind names such as "
                                     f"{sorted(DEFAULT_FAILURE_KINDS)}, got {failure_kinds!r}")
        self.name = name
        self.consecutive_failures = consecutive_failures
        self.error_rate = None if error_rate is None else float(error_rate)
        self.windows = _positive_int(owner, "windows", windows)
        self.window_s = _positive_s(owner, "window_s", window_s)
        self.min_requests = _positive_int(owner, "min_requests", min_requests)
        self.open_s = _positive_s(owner, "open_s", open_s)
        self.half_open_probes = _positive_int(owner, "half_open_probes", half_open_probes)
        self.probe_timeout_s = self.open_s if probe_timeout_s is None else _positive_s(
            owner, "probe_timeout_s", probe_timeout_s)
        self.failure_kinds = frozenset(failure_kinds)
        self._telemetry = telemetry
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._events: deque[BreakerEvent] = deque(maxlen=_positive_int(owner, "audit_size", audit_size))
        self._state = CLOSED
        self._since = clock()          # when the current state began (seconds)
        self._streak = 0               # consecutive failures while closed
        self._window_start: float | None = None
        self._window_total = 0
        self._window_failed = 0
        self._bad_windows = 0          # consecutive judged windows above the rate
        self._probes_issued = 0        # half-open: probes let through in this half-open period
        self._probes_passed = 0        # half-open: probes reported successful
        self._probe_deadline = math.inf  # half-open: when unreported probes count as failed (seconds)
        self._hold_until = -math.inf   # client side: refuse until then (an honoured Retry-After)
        self.ignored_outcomes = 0      # outcomes reported half-open with no probe outstanding
        self.report_errors = 0         # reports to the telemetry that raised
        if telemetry is not None:
            telemetry.set_breaker_state(name, CLOSED)

    # ---- reading ---------------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """The current state (``closed``, ``open``, ``half_open``), the timers applied."""
        with self._lock:
            self._advance(self._clock())
            return self._state

    def retry_after_s(self) -> float | None:
        """Seconds until a request may be tried again without taking anything (no probe is used); None when
        one may be tried now (closed, or half-open)."""
        with self._lock:
            now = self._clock()
            self._advance(now)
            if now < self._hold_until:
                return self._hold_until - now
            if self._state == OPEN:
                return max(0.0, self._since + self.open_s - now)
            return None

    def events(self) -> list[BreakerEvent]:
        """The audit events kept (oldest first)."""
        with self._lock:
            return list(self._events)

    # ---- deciding --------------------------------------------------------------------------------------

    def allow(self, tracker: Rejectable | None = None) -> Decision:
        """Admit, or refuse ``circuit_open`` with the seconds until a request may be tried again.

        With ``tracker``, a refusal also rejects it (``circuit_open``) and observes its ``Retry-After`` on the
        telemetry, as the other controls do. Half-open, each admitted request is a probe: report its outcome
        with ``record_*``.
        """
        decision = self._decide()
        if tracker is not None and not decision.admitted:
            tracker.reject("circuit_open")
            tel = self._telemetry
            if tel is not None and decision.retry_after_s is not None:
                try:
                    tel.observe_retry_after(tracker.model, "circuit_open", decision.retry_after_s)
                except Exception:  # a reporter that raises never reaches the server
                    self.report_errors += 1
        return decision

    def _decide(self) -> Decision:
        with self._lock:
            now = self._clock()
            self._advance(now)
            if now < self._hold_until:
                return Decision.refuse("circuit_open", self._hold_until - now,
                                       f"breaker {self.name}: honouring the upstream's Retry-After")
            if self._state == CLOSED:
                return ADMIT
            if self._state == OPEN:
                return Decision.refuse("circuit_open", max(0.0, self._since + self.open_s - now),
                                       f"breaker {self.name} is open")
            if self._probes_issued < self.half_open_probes:
                if self._probes_issued == 0:
                    self._probe_deadline = now + self.probe_timeout_s
                self._probes_issued += 1
                return ADMIT
            return Decision.refuse("circuit_open", max(0.0, self._probe_deadline - now),
                                   f"breaker {self.name} is half-open, its probes are out")

    def honour_retry_after(self, retry_after: float | str) -> bool:
        """Refuse every request for ``retry_after`` (seconds, or a ``Retry-After`` header value: seconds or an
        HTTP date) from now, capped at :data:`RETRY_AFTER_MAX_S`. A value that cannot be read is ignored
        (returns False): nothing an upstream sends can raise here."""
        seconds = self._retry_after_s(retry_after)
        if seconds is None:
            return False
        with self._lock:
            self._hold_until = max(self._hold_until, self._clock() + min(seconds, RETRY_AFTER_MAX_S))
        return True

    def _retry_after_s(self, value: object) -> float | None:
        if isinstance(value, bool):
            return None
        if isinstance(value, (int, float)):
            return float(value) if math.isfinite(value) and value >= 0 else None
        if not isinstance(value, str) or len(value) > 64:
            return None
        text = value.strip()
        if text.isdigit():
            return float(text)
        try:
            when = parsedate_to_datetime(text).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        return max(0.0, when - self._wall_clock())

    # ---- recording -------------------------------------------------------------------------------------

    def record(self, success: bool) -> BreakerEvent | None:
        """Record one outcome (``False``: a failure, whatever ``failure_kinds`` says); the state change it
        caused, if any."""
        return self._record(bool(success), self._clock())

    def record_success(self) -> BreakerEvent | None:
        """Record a successful outcome; the state change it caused, if any."""
        return self._record(True, self._clock())

    def record_failure(self, kind: str = "5xx") -> BreakerEvent | None:
        """Record an outcome of ``kind``: a failure when ``kind`` is one of ``failure_kinds``, otherwise a
        success (the upstream answered; e.g. a ``4xx`` is the client's fault). The state change, if any."""
        return self._record(kind not in self.failure_kinds, self._clock())

    def record_status(self, status: int) -> BreakerEvent | None:
        """Record an HTTP answer by :func:`classify_status`; the state change it caused, if any."""
        kind = classify_status(status)
        return self._record(kind is None or kind not in self.failure_kinds, self._clock())

    def record_exception(self, exc: BaseException) -> BreakerEvent | None:
        """Record a raised exception by :func:`classify_exception`; the state change it caused, if any."""
        return self.record_failure(classify_exception(exc))

    def _record(self, ok: bool, now: float) -> BreakerEvent | None:
        with self._lock:
            before = len(self._events)
            self._advance(now)
            if self._state == CLOSED:
                self._record_closed(ok, now)
            elif self._state == HALF_OPEN:
                self._record_probe(ok, now)
            # open: an outcome of a request let through before the trip changes nothing
            return self._events[-1] if len(self._events) > before else None

    def _record_closed(self, ok: bool, now: float) -> None:
        self._window_total += 1
        self._window_failed += 0 if ok else 1
        self._streak = 0 if ok else self._streak + 1
        if self.consecutive_failures is not None and self._streak >= self.consecutive_failures:
            self._move(OPEN, now, f"{self._streak} consecutive failures")

    def _record_probe(self, ok: bool, now: float) -> None:
        if self._probes_passed >= self._probes_issued:
            self.ignored_outcomes += 1  # not a probe's outcome (a request let through before the trip)
            return
        if not ok:
            self._move(OPEN, now, "a half-open probe failed")
            return
        self._probes_passed += 1
        if self._probes_passed >= self.half_open_probes:
            self._move(CLOSED, now, f"all {self.half_open_probes} half-open probes succeeded")

    # ---- time ------------------------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        """Apply the timers: close finished rate windows, open → half-open, a lost probe → open."""
        if self._state == CLOSED:
            self._close_windows(now)
        elif self._state == OPEN:
            if now >= self._since + self.open_s:
                self._move(HALF_OPEN, self._since + self.open_s, f"open for {self.open_s:g} s")
        elif self._probes_passed < self._probes_issued and now >= self._probe_deadline:
            self._move(OPEN, now, f"no probe outcome within {self.probe_timeout_s:g} s")

    def _close_windows(self, now: float) -> None:
        if self.error_rate is None:
            return
        if self._window_start is None:
            self._window_start = now
            return
        if now < self._window_start + self.window_s:
            return
        total, failed = self._window_total, self._window_failed
        ended = int((now - self._window_start) // self.window_s)  # windows that ended: the judged one, then empty
        self._window_start += ended * self.window_s
        self._window_total = self._window_failed = 0
        bad = total >= self.min_requests and failed / total > self.error_rate
        self._bad_windows = self._bad_windows + 1 if bad else 0
        if self._bad_windows >= self.windows:
            self._move(OPEN, now, f"error rate above {self.error_rate:g} for {self.windows} consecutive windows "
                                  f"of {self.window_s:g} s")
        elif ended > 1:
            self._bad_windows = 0  # the empty windows after it break the streak

    def _move(self, to: str, now: float, why: str) -> None:
        came = self._state
        self._state = to
        self._since = now
        self._probes_issued = self._probes_passed = 0
        self._probe_deadline = math.inf
        if to == CLOSED:
            self._streak = 0
            self._bad_windows = 0
            self._window_start = None if self.error_rate is None else now
            self._window_total = self._window_failed = 0
        self._events.append(BreakerEvent(now, came, to, why))
        tel = self._telemetry
        if tel is not None:  # under the lock, so the gauge never shows a state older than the last one
            try:
                tel.set_breaker_state(self.name, to)
                tel.count_breaker_transition(self.name, came, to)
            except Exception:  # a reporter that raises never reaches the server (Telemetry itself never does)
                self.report_errors += 1
