"""Draining an instance for an update, in the one safe order: unregister → wait for in-flight → stop.

:meth:`DrainController.begin` stops admitting (readiness false, :meth:`DrainController.allow` refuses
``draining`` with HTTP 503, the telemetry's draining gauge 1) so discovery removes the instance; the
controller then waits ``unregister_settle_s`` seconds for the upstreams' cached instance lists to converge
before it judges anything, and only then polls the in-flight requests (:meth:`Telemetry.in_flight`) every
``poll_interval_s`` seconds:

- a stream is closed at the first of: **idle** (no token sent for ``idle_threshold_s`` seconds, observed
  as the tracker's sent-token count not moving between polls, so the resolution is one poll interval) or
  **max_inflight** (in flight ``max_inflight_s`` seconds since its arrival, on the telemetry's clock);
  closing finishes it ``server_draining`` (distinct from a normal end, so the client can retry or resume);
- a request of a tenant class in ``requeue_tenant_classes`` (async batch jobs) is finished
  ``server_draining`` at once and handed to the ``requeue`` hook instead of being waited for;
- the drain ends when nothing is in flight (decision ``drained``) or, at ``wait_budget_s`` seconds of
  waiting, by the configured decision: ``terminate`` (finish the rest ``server_draining``, closed
  ``budget_exhausted``: the client gets a retryable error event, see :func:`drain_terminal_event`) or
  ``return_to_pool`` (stop draining, admit again, skip this update). Never both.

The controller never stops the server itself: after ``drained`` or ``terminate`` the caller stops listening
and exits. Each drain yields a :class:`DrainRecord` for the rollout analysis to store.

:meth:`DrainController.poll` is the one step function; :meth:`DrainController.run` (asyncio) and
:meth:`DrainController.run_blocking` (threads) loop over it, and tests drive it with an injected clock.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from llmslo.controls._decision import ADMIT, MONOTONIC, Clock, Decision
from llmslo.telemetry import DRAIN_CLOSE_REASONS, ConfigurationError, RequestTracker

ON_BUDGET: tuple[str, ...] = ("terminate", "return_to_pool")
"""What to do when the wait budget is spent with requests still in flight."""

DRAIN_DECISIONS: tuple[str, ...] = ("drained", *ON_BUDGET)
"""How a drain ended: nothing left in flight, or the budget decision taken."""

DRAIN_PHASES: tuple[str, ...] = ("serving", "settling", "waiting", "stopped")
"""The controller's phases: admitting; draining, waiting for discovery; waiting for in-flight; drained
(ready to stop). ``return_to_pool`` goes back to ``serving``."""


class DrainTelemetry(Protocol):
    """What the drain needs from :class:`llmslo.telemetry.Telemetry` (every method is safe: never raises)."""

    clock_ns: Callable[[], int]

    def in_flight(self) -> list[RequestTracker]: ...

    def begin_drain(self) -> None: ...

    def end_drain(self) -> None: ...

    def count_drain_closed(self, reason: str, n: int = 1) -> None: ...

    def observe_drain(self, duration_s: float) -> None: ...


def _seconds(name: str, value: object, *, zero: bool = False, optional: bool = False) -> None:
    if value is None and optional:
        return
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value >= 0 if zero else value > 0))
    if not ok:
        bound = ">= 0" if zero else "> 0"
        none = " or None" if optional else ""
        raise ConfigurationError(f"DrainConfig.{name}: must be a finite number of seconds {bound}{none}, "
                                 f"got {value!r}")


@dataclass(frozen=True)
class DrainConfig:
    """How one drain waits (every time in seconds). Raises :class:`ConfigurationError` naming the field.

    - ``wait_budget_s``: the longest wait for in-flight requests after the settle time; at most
      ``caller_timeout_s`` when that is given (waiting longer than the caller does is pointless).
    - ``unregister_settle_s``: the wait for discovery to converge after unregistering (0 allowed).
    - ``idle_threshold_s``: close a stream that sent nothing this long (None: never for idleness); above
      ``normal_gap_s``, the normal largest gap between chunks, when that is given.
    - ``max_inflight_s``: close a stream in flight this long since its arrival (None: never for age).
    - ``on_budget``: ``terminate`` or ``return_to_pool`` (see :data:`ON_BUDGET`).
    - ``poll_interval_s``: seconds between polls of the in-flight requests (the idle check's resolution).
    - ``requeue_tenant_classes``: tenant classes (e.g. ``batch``) re-queued through the controller's
      ``requeue`` hook instead of being waited for.
    """

    wait_budget_s: float = 120.0
    unregister_settle_s: float = 5.0
    idle_threshold_s: float | None = 30.0
    max_inflight_s: float | None = 300.0
    caller_timeout_s: float | None = None
    normal_gap_s: float | None = None
    on_budget: str = "terminate"
    poll_interval_s: float = 0.5
    requeue_tenant_classes: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        _seconds("wait_budget_s", self.wait_budget_s)
        _seconds("unregister_settle_s", self.unregister_settle_s, zero=True)
        for name in ("idle_threshold_s", "max_inflight_s", "caller_timeout_s", "normal_gap_s"):
            _seconds(name, getattr(self, name), optional=True)
        _seconds("poll_interval_s", self.poll_interval_s)
        if self.caller_timeout_s is not None and self.wait_budget_s > self.caller_timeout_s:
            raise ConfigurationError(
                f"DrainConfig.wait_budget_s: {self.wait_budget_s:g} s exceeds caller_timeout_s "
                f"({self.caller_timeout_s:g} s): the callers give up before the drain does; lower it to at most "
                f"{self.caller_timeout_s:g}")
        if self.normal_gap_s is not None and self.idle_threshold_s is not None \
                and self.idle_threshold_s <= self.normal_gap_s:
            raise ConfigurationError(
                f"DrainConfig.idle_threshold_s: {self.idle_threshold_s:g} s is not above the normal inter-chunk "
                f"gap normal_gap_s ({self.normal_gap_s:g} s): healthy streams would be closed as idle; raise it")
        if self.on_budget not in ON_BUDGET:
            raise ConfigurationError(
                f"DrainConfig.on_budget: must be one of {', '.join(ON_BUDGET)}, got {self.on_budget!r}")
        classes = self.requeue_tenant_classes
        if isinstance(classes, str) or not isinstance(classes, Collection) \
                or not all(isinstance(c, str) and c for c in classes):
            raise ConfigurationError(
                f"DrainConfig.requeue_tenant_classes: must be a collection of tenant class names, got {classes!r}")
        object.__setattr__(self, "requeue_tenant_classes", frozenset(classes))
        for name in ("wait_budget_s", "unregister_settle_s", "idle_threshold_s", "max_inflight_s",
                     "caller_timeout_s", "normal_gap_s", "poll_interval_s"):
            if (value := getattr(self, name)) is not None:
                object.__setattr__(self, name, float(value))


@dataclass(frozen=True)
class DrainRecord:
    """What one drain did, as the rollout analysis stores it (seconds; counts of requests).

    ``closed_by_reason``: streams the drain closed, by :data:`DRAIN_CLOSE_REASONS` (every key present);
    ``ended_by_reason``: requests that reached a terminal state of their own while the drain waited, by
    finish reason. ``terminated`` = streams the drain closed (all reasons); ``timed_out`` = requests that
    ended ``deadline`` while it waited; ``requeued`` = requests handed to the re-queue hook
    (``requeue_failed`` of them raised there); ``remaining`` = requests still in flight when the instance
    returned to the pool. ``in_flight_at_start`` is counted when the wait began (after the settle time).
    ``actual_drain_s`` is the wait for in-flight requests (compare it with ``wait_budget_s``); the time from
    :meth:`DrainController.begin` to the end is ``unregister_settle_s + actual_drain_s``.
    """

    from_version: str
    to_version: str
    batch: int | None
    batches: int | None
    started_unix_s: float
    wait_budget_s: float
    unregister_settle_s: float
    actual_drain_s: float
    in_flight_at_start: int
    closed_by_reason: dict[str, int]
    ended_by_reason: dict[str, int]
    terminated: int
    timed_out: int
    requeued: int
    requeue_failed: int
    remaining: int
    decision: str

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the dicts copied)."""
        return {
            "from_version": self.from_version, "to_version": self.to_version, "batch": self.batch,
            "batches": self.batches, "started_unix_s": self.started_unix_s, "wait_budget_s": self.wait_budget_s,
            "unregister_settle_s": self.unregister_settle_s, "actual_drain_s": self.actual_drain_s,
            "in_flight_at_start": self.in_flight_at_start, "closed_by_reason": dict(self.closed_by_reason),
            "ended_by_reason": dict(self.ended_by_reason), "terminated": self.terminated,
            "timed_out": self.timed_out, "requeued": self.requeued, "requeue_failed": self.requeue_failed,
            "remaining": self.remaining, "decision": self.decision,
        }


def drain_terminal_event(reason: str) -> dict[str, object]:
    """The last event a server sends on a stream the drain closed for ``reason`` (JSON-ready).

    ``idle`` and ``max_inflight`` give an early finish, ``{"finish_reason": "server_draining", ...}``;
    ``budget_exhausted`` gives an error event, ``{"error": {"type": "server_draining", "code":
    "drain_budget_exhausted", ...}}``. Both say ``retryable``: a client must not show the output as complete.
    An unknown reason is treated as ``budget_exhausted`` (never raises).
    """
    if reason in ("idle", "max_inflight"):
        return {"finish_reason": "server_draining", "drain_reason": reason, "retryable": True}
    return {"error": {"type": "server_draining", "code": "drain_budget_exhausted", "retryable": True,
                      "message": "the server is draining for an update and its wait budget ran out: retry"}}


@dataclass
class _Watch:
    """One in-flight request the drain watches: the sent-token count last seen and when it last moved."""

    tracker: RequestTracker
    sent: int
    active_at: float


@dataclass
class _Tally:
    """The counts of the current drain."""

    closed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DRAIN_CLOSE_REASONS, 0))
    ended: dict[str, int] = field(default_factory=dict)
    requeued: int = 0
    requeue_failed: int = 0
    in_flight_at_start: int = 0


_DRAINING = Decision.refuse("draining", None, "the server is draining for an update: retry on another instance")
"""The one refusal of a draining instance (decisions are immutable, so it is shared)."""


class DrainController:
    """Drains the server of ``telemetry`` by :class:`DrainConfig` (thread-safe; one drain at a time).

    - ``clock``: monotonic seconds for the settle time, the budget and idleness; ``clock_unix_s``: the
      record's start time. The age of a request is read on the telemetry's own clock (``clock_ns``).
    - ``requeue``: called once with each tracker of a re-queued class after the drain finished it
      ``server_draining``; it must put the job back on a queue (an exception is counted as
      ``requeue_failed``). Required when ``config.requeue_tenant_classes`` is not empty.
    - ``on_close``: called once with ``(tracker, reason)`` for each stream the drain closed (``reason`` in
      :data:`DRAIN_CLOSE_REASONS`), e.g. to send :func:`drain_terminal_event` on it; exceptions are counted.

    Callbacks and the trackers' resource releases run inside :meth:`poll` and must not call :meth:`poll`.

    Example::

        drain = DrainController(tel, DrainConfig(wait_budget_s=120, caller_timeout_s=300))
        # admission: refuse while draining
        if not (d := drain.allow()).admitted:
            tracker.reject(d.reason)
        # on SIGTERM
        drain.begin(from_version="v1", to_version="v2")
        record = await drain.run()
        if record.decision != "return_to_pool":
            server.stop()
    """

    def __init__(self, telemetry: DrainTelemetry, config: DrainConfig | None = None, *, clock: Clock = MONOTONIC,
                 clock_unix_s: Clock = time.time, requeue: Callable[[RequestTracker], object] | None = None,
                 on_close: Callable[[RequestTracker, str], object] | None = None) -> None:
        self.config = config if config is not None else DrainConfig()
        if not isinstance(self.config, DrainConfig):
            raise ConfigurationError(f"DrainController.config: expected a DrainConfig, got {config!r}")
        if self.config.requeue_tenant_classes and requeue is None:
            raise ConfigurationError("DrainController.requeue: needed when DrainConfig.requeue_tenant_classes is "
                                     "set (a job without a re-queue path is silently lost)")
        self._tel = telemetry
        self._clock = clock
        self._clock_unix_s = clock_unix_s
        self._requeue = requeue
        self._on_close = on_close
        self._lock = threading.Lock()
        self._phase = "serving"
        self._began = 0.0
        self._wait_start = 0.0
        self._labels: tuple[str, str, int | None, int | None, float] = ("", "", None, None, 0.0)
        self._watched: dict[int, _Watch] = {}
        self._tally = _Tally()
        self.record: DrainRecord | None = None
        """The record of the last finished drain."""
        self.report_errors = 0
        """Reports and callbacks that raised (none of them reaches the caller)."""

    # ---- admission ---------------------------------------------------------------------------------------

    @property
    def phase(self) -> str:
        """One of :data:`DRAIN_PHASES`."""
        return self._phase

    @property
    def ready(self) -> bool:
        """Readiness: True while serving, False from :meth:`begin` on (until returned to the pool)."""
        return self._phase == "serving"

    @property
    def in_flight_at_start(self) -> int:
        """Requests in flight when the current drain's wait began, after the settle time (0 before; the last
        drain's once it ended): what a server prints as it starts waiting, the record's figure later."""
        return self._tally.in_flight_at_start

    def allow(self, tracker: RequestTracker | None = None) -> Decision:
        """Admit while serving; refuse ``draining`` (HTTP 503) from :meth:`begin` on, rejecting ``tracker``
        (``draining``) when one is given."""
        if self._phase == "serving":
            return ADMIT
        if tracker is not None:
            tracker.reject("draining")
        return _DRAINING

    # ---- the drain ---------------------------------------------------------------------------------------

    def begin(self, *, from_version: str = "", to_version: str = "", batch: int | None = None,
              batches: int | None = None, now: float | None = None) -> bool:
        """Stop admitting and start the settle time; False (and nothing changes) when already draining.

        ``from_version`` / ``to_version``, ``batch`` (1-based) of ``batches`` label the record.
        """
        with self._lock:
            if self._phase != "serving":
                return False
            self._phase = "settling"
            self._began = self._clock() if now is None else now
            self._labels = (str(from_version), str(to_version), batch, batches, self._clock_unix_s())
            self._watched = {}
            self._tally = _Tally()
            self._report(self._tel.begin_drain)
        return True

    def poll(self, now: float | None = None) -> DrainRecord | None:
        """One step at ``now`` (seconds, the controller's clock): the record once the drain ended, else None.

        Serving (no drain begun, or returned to the pool): None. Stopped: the record of the finished drain.
        """
        with self._lock:
            t = self._clock() if now is None else now
            if self._phase == "serving":
                return None
            if self._phase == "stopped":
                return self.record
            if self._phase == "settling":
                if t < self._began + self.config.unregister_settle_s:
                    return None
                self._phase = "waiting"
                self._wait_start = t
                self._scan(t)
                self._tally.in_flight_at_start = len(self._watched) + self._tally.requeued + \
                    self._tally.requeue_failed + sum(self._tally.ended.values())
            else:
                self._scan(t)
            self._close_due(t)
            if not self._watched:
                return self._finish(t, "drained")
            if t >= self._wait_start + self.config.wait_budget_s:
                return self._finish(t, self.config.on_budget)
            return None

    def next_poll_s(self, now: float | None = None) -> float:
        """Seconds until the next useful poll (at most ``poll_interval_s``, never negative)."""
        t = self._clock() if now is None else now
        step = self.config.poll_interval_s
        if self._phase == "settling":
            step = min(step, self._began + self.config.unregister_settle_s - t)
        elif self._phase == "waiting":
            step = min(step, self._wait_start + self.config.wait_budget_s - t)
        return max(0.0, step)

    async def run(self, *, sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> DrainRecord:
        """Drain to the end in asyncio (begins the drain if not begun); the record."""
        self.begin()
        while (record := self.poll()) is None:
            await sleep(self.next_poll_s())
        return record

    def run_blocking(self, *, sleep: Callable[[float], object] = time.sleep) -> DrainRecord:
        """Drain to the end, blocking this thread (begins the drain if not begun); the record."""
        self.begin()
        while (record := self.poll()) is None:
            sleep(self.next_poll_s())
        return record

    # ---- steps (under the lock) --------------------------------------------------------------------------

    def _scan(self, now: float) -> None:
        """Forget the requests that ended on their own, watch new ones, note which sent tokens since."""
        for key, w in list(self._watched.items()):
            if w.tracker.done:
                del self._watched[key]
                self._ended(w.tracker)
        requeue = self.config.requeue_tenant_classes
        for tracker in self._tel.in_flight():
            if tracker.done:
                continue
            seen = self._watched.get(id(tracker))  # a watched tracker is referenced, so its id is not reused
            if seen is not None:
                sent = tracker.sent_tokens
                if sent != seen.sent:
                    seen.sent, seen.active_at = sent, now
            elif self._requeue is not None and tracker.tenant_class in requeue:
                self._requeue_one(tracker, self._requeue)
            else:
                self._watched[id(tracker)] = _Watch(tracker, tracker.sent_tokens, now)

    def _close_due(self, now: float) -> None:
        """Close every stream idle for ``idle_threshold_s`` or in flight for ``max_inflight_s``."""
        cfg = self.config
        if cfg.idle_threshold_s is None and cfg.max_inflight_s is None:
            return
        now_ns = self._tel.clock_ns()
        for key, w in list(self._watched.items()):
            late: list[tuple[float, str]] = []
            if cfg.idle_threshold_s is not None:
                late.append((now - w.active_at - cfg.idle_threshold_s, "idle"))
            if cfg.max_inflight_s is not None:
                late.append(((now_ns - w.tracker.arrival_ns) / 1e9 - cfg.max_inflight_s, "max_inflight"))
            over, reason = max(late)  # the condition that became true first
            if over >= 0:
                del self._watched[key]
                self._close(w.tracker, reason)

    def _close(self, tracker: RequestTracker, reason: str) -> None:
        if not tracker.finish("server_draining"):
            self._ended(tracker)  # it reached a terminal state of its own meanwhile
            return
        self._tally.closed[reason] += 1
        self._report(self._tel.count_drain_closed, reason)
        if self._on_close is not None:
            self._report(self._on_close, tracker, reason)

    def _requeue_one(self, tracker: RequestTracker, requeue: Callable[[RequestTracker], object]) -> None:
        if not tracker.finish("server_draining"):
            self._ended(tracker)
            return
        try:
            requeue(tracker)
        except Exception:
            self._tally.requeue_failed += 1
        else:
            self._tally.requeued += 1

    def _ended(self, tracker: RequestTracker) -> None:
        reason = tracker.finish_reason or "unknown"
        self._tally.ended[reason] = self._tally.ended.get(reason, 0) + 1

    def _finish(self, now: float, decision: str) -> DrainRecord:
        remaining = 0
        if decision == "terminate":
            for w in list(self._watched.values()):
                self._close(w.tracker, "budget_exhausted")
        elif decision == "return_to_pool":
            remaining = len(self._watched)
        self._watched = {}
        waited = max(0.0, now - self._wait_start)
        tally = self._tally
        from_v, to_v, batch, batches, started = self._labels
        record = DrainRecord(
            from_version=from_v, to_version=to_v, batch=batch, batches=batches, started_unix_s=started,
            wait_budget_s=self.config.wait_budget_s, unregister_settle_s=self.config.unregister_settle_s,
            actual_drain_s=waited, in_flight_at_start=tally.in_flight_at_start,
            closed_by_reason=dict(tally.closed), ended_by_reason=dict(sorted(tally.ended.items())),
            terminated=sum(tally.closed.values()), timed_out=tally.ended.get("deadline", 0),
            requeued=tally.requeued, requeue_failed=tally.requeue_failed, remaining=remaining, decision=decision)
        self.record = record
        self._report(self._tel.observe_drain, waited)
        if decision == "return_to_pool":
            self._phase = "serving"
            self._report(self._tel.end_drain)
        else:
            self._phase = "stopped"
        return record

    def _report(self, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except Exception:
            self.report_errors += 1
