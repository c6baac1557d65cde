"""The admission queue: bounded in requests and in waiting time, priority classes, a concurrency limit (in
requests, and optionally in tokens).

A request meets the queue once, through :meth:`AdmissionQueue.acquire` (asyncio) or
:meth:`AdmissionQueue.acquire_blocking` (threads); both work on one lock-protected state, so an asyncio
server and its worker threads may share a queue. What can happen to it, each reported through its
:class:`~llmslo.telemetry.RequestTracker`:

- **a slot now**: a slot is free and nobody waits: ``admit()``, ``schedule()``, :data:`ADMIT`.
- **shed at the door** (a :class:`LoadShedder` says so): ``reject("queue_full")``, never admitted; the
  shedder's degradation stages apply before that (the server's ``degrade`` hook, counted when applied).
- **queue full**: ``reject("queue_full")``, never admitted, HTTP 429 with a ``Retry-After`` from the
  :class:`RetryAfterEstimator` (depth ahead / observed drain rate).
- **waits** (``admit()``: it counts in ``llmslo_queued_requests``), then exactly one of:

  * **a slot**: ``schedule()`` and :data:`ADMIT`. Classes are served in priority order, FIFO within one.
  * **displaced**: the queue is full and a request of a higher class arrives: the *newest* waiter of the
    *lowest* class present leaves, rejected ``queue_full`` (429 + ``Retry-After``). The newest, because it
    has waited least (the least work lost) and the older waiters keep their order. An arrival whose class
    is not above the lowest one waiting is refused instead.
  * **queue timeout** (``queue_timeout_s``, or the call's ``timeout_s``): finished ``deadline``. Not
    ``rejected``: the request was admitted and waited, and definitions.md keeps ``rejected`` outside the
    admitted ones; its wait is a right-censored TTFT that the survivor-bias check must see (a rejected row
    is left out of the censoring-aware estimate). The server still answers 429 with ``Retry-After``: the
    returned :class:`Decision` says ``queue_full`` with the detail ``queue_timeout``.
  * **ended by someone else** (a deadline, the drain, a client cancel finishing the tracker): it leaves the
    queue at once; the decision mirrors the terminal state (``draining`` for ``server_draining``).

**Tokens.** With a ``token_capacity``, each request also weighs its ``tokens`` (a gateway gives ``prompt_tokens +
max_tokens``: the KV cache it may take), and a slot is granted only while the tokens of the requests holding slots
plus its own fit the capacity; a request that alone exceeds it is granted once nobody holds a slot, so the
heaviest request is never held back for good. The queue stays first come, first served within a class: a head
that does not fit holds back the lighter requests behind it (admitting them past it would starve heavy
requests under steady load).

A slot is held from the grant until the request's terminal state: the queue registers
``tracker.add_resource(release, "admission_slot")`` when the request enters, and the lifecycle calls it
exactly once whatever ends the request; it then hands the slot to the next waiter. A waiting
``acquire`` that is cancelled (``asyncio.CancelledError``, ``KeyboardInterrupt``) leaves the queue and
re-raises; the server's request scope then commits the terminal state (``client_cancel``).

An unknown tenant class is treated as the lowest class, never an error.

Wiring a server (asyncio)::

    queue = AdmissionQueue("llama", capacity=1000, concurrency=64, queue_timeout_s=30,
                           shedder=LoadShedder(queue_levels={"interactive": 1.0, "batch": 0.5},
                                               degrade=[("cap_max_tokens", 0.8)]),
                           telemetry=tel)

    async def handle(body, tenant_class):
        async with tel.request(model="llama", tenant_class=tenant_class, admit=False) as t:
            def degrade(action: str) -> bool:           # the shedder's stage, applied by the server
                body["max_tokens"] = min(body.get("max_tokens", 4096), 512)
                return True
            decision = await queue.acquire(t, degrade=degrade)
            if not decision.admitted:
                return Response(decision.body(), decision.http_status, decision.headers())
            ...  # generate; the slot is released when the request finishes
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import threading
from collections import deque
from collections.abc import Callable

from llmslo.controls._decision import ADMIT, MONOTONIC, Clock, Decision
from llmslo.controls._retry_after import RetryAfterEstimator
from llmslo.controls._shedding import LoadShedder, validate_classes
from llmslo.telemetry import ConfigurationError, RequestTracker, Telemetry

DegradeHook = Callable[[str], bool]
"""The server's degradation hook: called with a stage's action name (e.g. ``cap_max_tokens``), returns
whether it applied it (only applied actions are counted)."""

_WAITING = "waiting"
_GRANTED = "granted"  # holds a slot
_RELEASED = "released"  # held a slot, the request ended
_TIMED_OUT = "timed_out"
_DISPLACED = "displaced"
_ENDED = "ended"  # the request ended while waiting
_WITHDRAWN = "withdrawn"  # the waiting call was cancelled

_Report = tuple[str, RequestTracker, Decision]
"""Work done after the lock is released: ``(what, tracker, decision)`` with what = reject | deadline."""


class _Entry:
    """One request's place in the queue. ``state`` and ``decision`` change only under the queue's lock."""

    __slots__ = ("cls", "deadline", "decision", "event", "future", "loop", "rank", "state", "tokens", "tracker")

    def __init__(self, tracker: RequestTracker, cls: str, rank: int, deadline: float, state: str,
                 tokens: int = 0) -> None:
        self.tracker = tracker
        self.tokens = tokens
        self.cls = cls
        self.rank = rank
        self.deadline = deadline
        self.state = state
        self.decision: Decision | None = ADMIT if state == _GRANTED else None
        self.event: threading.Event | None = None
        self.future: asyncio.Future[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None


def _positive_int(field: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"AdmissionQueue.{field}: must be an integer >= 1, got {value!r}")
    return value


def _resolve_future(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _ended_decision(tracker: RequestTracker) -> Decision:
    """The decision for a request that reached its terminal state before it got a slot."""
    if tracker.reject_reason is not None:
        return Decision.refuse(tracker.reject_reason, None, "rejected")
    if tracker.finish_reason == "server_draining":
        return Decision.refuse("draining", None, "server_draining")
    return Decision.refuse("queue_full", None, f"request ended while queued: {tracker.finish_reason}")


class AdmissionQueue:
    """A bounded priority queue in front of ``concurrency`` slots, for one model (see the module docstring).

    Parameters:

    - ``model``: the model this queue serves (its ``llmslo_queue_capacity_requests`` series).
    - ``capacity``: the most requests waiting at once (requests, >= 1).
    - ``concurrency``: the most requests holding a slot at once (>= 1).
    - ``token_capacity``: the most tokens held by slots at once (>= 1; ``None``: no bound in tokens).
    - ``queue_timeout_s``: the longest a request waits for a slot (seconds, > 0).
    - ``classes``: the tenant classes, highest priority first (default ``("interactive", "batch")``).
    - ``shedder``: a :class:`LoadShedder` consulted on entry (its classes must be these), or ``None``.
    - ``retry_after``: the :class:`RetryAfterEstimator` (a default one on this clock when ``None``).
    - ``telemetry``: where decisions are reported (``None``: decide, report nothing).
    - ``clock``: monotonic seconds.

    Raises :class:`ConfigurationError` naming the field, e.g.
    ``AdmissionQueue.capacity: must be an integer >= 1, got 0``.
    """

    def __init__(self, model: str, *, capacity: int, concurrency: int, token_capacity: int | None = None,
                 queue_timeout_s: float = 30.0,
                 classes: tuple[str, ...] = ("interactive", "batch"), shedder: LoadShedder | None = None,
                 retry_after: RetryAfterEstimator | None = None, telemetry: Telemetry | None = None,
                 clock: Clock = MONOTONIC) -> None:
        if not isinstance(model, str) or not model:
            raise ConfigurationError(f"AdmissionQueue.model: must be a non-empty string, got {model!r}")
        self.capacity = _positive_int("capacity", capacity)
        self.concurrency = _positive_int("concurrency", concurrency)
        self.token_capacity = None if token_capacity is None else _positive_int("token_capacity", token_capacity)
        if not (isinstance(queue_timeout_s, int | float) and not isinstance(queue_timeout_s, bool)
                and math.isfinite(queue_timeout_s) and queue_timeout_s > 0):
            raise ConfigurationError(
                f"AdmissionQueue.queue_timeout_s: must be a finite number > 0 seconds, got {queue_timeout_s!r}")
        self.classes = validate_classes("AdmissionQueue", classes)
        if shedder is not None:
            if not isinstance(shedder, LoadShedder):
                raise ConfigurationError(f"AdmissionQueue.shedder: must be a LoadShedder, got {shedder!r}")
            if shedder.classes != self.classes:
                raise ConfigurationError(
                    f"AdmissionQueue.shedder: its classes {list(shedder.classes)} differ from the queue's "
                    f"{list(self.classes)}")
        if retry_after is not None and not isinstance(retry_after, RetryAfterEstimator):
            raise ConfigurationError(f"AdmissionQueue.retry_after: must be a RetryAfterEstimator, got {retry_after!r}")
        if not callable(clock):
            raise ConfigurationError("AdmissionQueue.clock: must be a callable returning seconds")
        self.model = model
        self.queue_timeout_s = float(queue_timeout_s)
        self.shedder = shedder
        self.retry_after = retry_after if retry_after is not None else RetryAfterEstimator(clock=clock)
        self.telemetry = telemetry
        self._clock = clock
        self._lock = threading.Lock()
        self._ranks = {c: i for i, c in enumerate(self.classes)}
        self._queues: tuple[deque[_Entry], ...] = tuple(deque() for _ in self.classes)
        self._depth = 0
        self._running = 0
        self._tokens_running = 0
        if telemetry is not None:
            telemetry.set_queue_capacity(model, self.capacity)

    # ---- state -------------------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Requests waiting for a slot now."""
        return self._depth

    @property
    def running(self) -> int:
        """Slots held now (granted, the request not yet at its terminal state)."""
        return self._running

    @property
    def tokens_running(self) -> int:
        """The tokens of the requests holding slots now (0 when requests are given no tokens)."""
        return self._tokens_running

    def _fits_locked(self, tokens: int) -> bool:
        """Whether a request of ``tokens`` tokens may take a slot now (queue order aside)."""
        if self._running >= self.concurrency:
            return False
        cap = self.token_capacity
        return cap is None or self._tokens_running == 0 or self._tokens_running + tokens <= cap

    def depth_by_class(self) -> dict[str, int]:
        """Requests waiting now, per class."""
        self._lock.acquire()
        try:
            return {c: len(q) for c, q in zip(self.classes, self._queues, strict=True)}
        finally:
            self._lock.release()

    def set_concurrency(self, concurrency: int) -> None:
        """Change the number of slots (an adaptive limit moved). More slots are granted to waiting requests at
        once; fewer take effect as running requests end. Raises :class:`ConfigurationError` below 1."""
        n = _positive_int("concurrency", concurrency)
        self._relimit(lambda: setattr(self, "concurrency", n))

    def set_token_capacity(self, token_capacity: int | None) -> None:
        """Change the bound in tokens (``None``: no bound), as :meth:`set_concurrency` does the slots. Raises
        :class:`ConfigurationError` below 1."""
        n = None if token_capacity is None else _positive_int("token_capacity", token_capacity)
        self._relimit(lambda: setattr(self, "token_capacity", n))

    def _relimit(self, change: Callable[[], None]) -> None:
        """Apply ``change`` to the limits under the lock, then grant what now fits to the waiters."""
        woken: list[_Entry] = []
        self._lock.acquire()
        try:
            change()
            woken = self._dispatch_locked(self._clock())
        finally:
            self._lock.release()
        self._settle([], woken)

    # ---- entry points ------------------------------------------------------------------------------------

    async def acquire(self, tracker: RequestTracker, tenant_class: str | None = None, *,
                      timeout_s: float | None = None, degrade: DegradeHook | None = None, tokens: int = 0) -> Decision:
        """Wait (asyncio) for a slot for ``tracker``'s request; the :class:`Decision` says whether it got one.

        ``tenant_class``: its priority class (the tracker's when ``None``; unknown: the lowest).
        ``timeout_s``: this request's queue timeout (seconds, at most the queue's; ``None``: the queue's;
        ``0``: never wait, refused when no slot is free). ``degrade``: the server's :data:`DegradeHook`.
        ``tokens``: the request's weight against ``token_capacity`` (>= 0; ignored without one).
        Never raises but for the cancellation of the waiting task (re-raised after leaving the queue).
        """
        first = self._enter(tracker, tenant_class, timeout_s, degrade, tokens, blocking=False)
        if isinstance(first, Decision):
            return first
        fut = first.future
        assert fut is not None
        try:
            while first.state == _WAITING:
                remaining = first.deadline - self._clock()
                if remaining <= 0:
                    self._expire(first)
                    continue
                await asyncio.wait((fut,), timeout=remaining)
        except BaseException:
            self._withdraw(first)
            raise
        return self._outcome(first)

    def acquire_blocking(self, tracker: RequestTracker, tenant_class: str | None = None,
                         timeout_s: float | None = None, *, degrade: DegradeHook | None = None,
                         tokens: int = 0) -> Decision:
        """As :meth:`acquire`, blocking the calling thread (for threaded servers; never call it on an
        event loop's thread)."""
        first = self._enter(tracker, tenant_class, timeout_s, degrade, tokens, blocking=True)
        if isinstance(first, Decision):
            return first
        event = first.event
        assert event is not None
        try:
            while first.state == _WAITING:
                remaining = first.deadline - self._clock()
                if remaining <= 0:
                    self._expire(first)
                    continue
                event.wait(remaining)
        except BaseException:
            self._withdraw(first)
            raise
        return self._outcome(first)

    def sweep(self) -> int:
        """Time out every waiter past its queue timeout now; how many. Waiters time themselves out; a server
        may also call this from a timer, and a full queue sweeps before refusing an arrival."""
        now = self._clock()
        self._lock.acquire()
        try:
            expired = self._sweep_locked(now)
        finally:
            self._lock.release()
        self._settle([("deadline", e.tracker, e.decision or ADMIT) for e in expired], expired)  # always set
        return len(expired)

    # ---- entering ----------------------------------------------------------------------------------------

    def _wait_limit(self, timeout_s: float | None) -> float:
        if timeout_s is None:
            return self.queue_timeout_s
        if isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool) and timeout_s >= 0:
            return min(float(timeout_s), self.queue_timeout_s) if math.isfinite(timeout_s) else self.queue_timeout_s
        return self.queue_timeout_s

    def _enter(self, tracker: RequestTracker, tenant_class: str | None, timeout_s: float | None,
               degrade: DegradeHook | None, tokens: int, *, blocking: bool) -> Decision | _Entry:
        """A slot at once (:data:`ADMIT`), a refusal, or the entry of a request that now waits."""
        tokens = tokens if type(tokens) is int and tokens > 0 else 0  # not a count (bool included): no weight
        name = tracker.tenant_class if tenant_class is None else tenant_class
        rank = self._ranks.get(name) if isinstance(name, str) else None
        if rank is None:  # an unknown class is the lowest
            name, rank = self.classes[-1], len(self.classes) - 1
        if tracker.finish_reason is not None:
            return _ended_decision(tracker)
        if self.shedder is not None:
            shed = self._consult_shedder(tracker, name, rank, degrade)
            if shed is not None:
                return shed
        lock = self._lock
        lock.acquire()
        try:
            free = self._depth == 0 and self._fits_locked(tokens)
            if free:  # the common case, kept short: nobody waits and a slot is free
                self._running += 1
                self._tokens_running += tokens
        finally:
            lock.release()
        if free:
            entry = _Entry(tracker, name, rank, 0.0, _GRANTED, tokens)
            tracker.admit()
            tracker.add_resource(functools.partial(self._on_terminal, entry), "admission_slot")
            return self._outcome(entry)
        return self._enter_slow(tracker, name, rank, self._wait_limit(timeout_s), tokens, blocking)

    def _enter_slow(self, tracker: RequestTracker, name: str, rank: int, wait_s: float, tokens: int,
                    blocking: bool) -> Decision | _Entry:
        """No slot was free a moment ago: take one that came free, wait, or be refused."""
        now = self._clock()
        reports: list[_Report] = []
        woken: list[_Entry] = []
        refusal: Decision | None = None
        self._lock.acquire()
        try:
            if self._depth == 0 and self._fits_locked(tokens):  # freed meanwhile
                self._running += 1
                self._tokens_running += tokens
                entry = _Entry(tracker, name, rank, now, _GRANTED, tokens)
            else:
                refusal = self._make_room_locked(rank, wait_s, now, reports, woken)
                entry = _Entry(tracker, name, rank, now + wait_s, _WAITING, tokens)
                if refusal is None:
                    if blocking:
                        entry.event = threading.Event()
                    else:
                        entry.loop = asyncio.get_running_loop()
                        entry.future = entry.loop.create_future()
                    self._queues[rank].append(entry)
                    self._depth += 1
                    self.retry_after.record(0, self._depth, now)
        finally:
            self._lock.release()
        self._settle(reports, woken)
        if refusal is not None:
            self._refuse_at_door(tracker, refusal)
            return refusal
        tracker.admit()
        tracker.add_resource(functools.partial(self._on_terminal, entry), "admission_slot")
        if entry.event is None and entry.future is None:  # a slot at once
            return self._outcome(entry)
        return entry

    def _make_room_locked(self, rank: int, wait_s: float, now: float, reports: list[_Report],
                          woken: list[_Entry]) -> Decision | None:
        """With the lock held and no slot free: None when the arrival may wait (a place is free or was made by
        timing out overdue waiters or displacing a lower class), else its refusal."""
        if wait_s == 0:
            return self._refusal_locked(rank, now, "no slot free and the request may not wait")
        if self._depth >= self.capacity:
            expired = self._sweep_locked(now)
            woken.extend(expired)
            reports.extend(("deadline", e.tracker, e.decision or ADMIT) for e in expired)
        if self._depth < self.capacity:
            return None
        lowest = max(r for r, q in enumerate(self._queues) if q)
        if rank >= lowest:
            return self._refusal_locked(rank, now, "queue full")
        victim = self._queues[lowest].pop()
        self._depth -= 1
        self.retry_after.record(1, self._depth, now)
        victim.state = _DISPLACED
        victim.decision = self._refusal_locked(victim.rank, now, "displaced by a higher-priority request")
        woken.append(victim)
        reports.append(("reject", victim.tracker, victim.decision))
        return None

    def _refusal_locked(self, rank: int, now: float, detail: str) -> Decision:
        ahead = sum(len(q) for q in self._queues[:rank + 1])
        return Decision.refuse("queue_full", self.retry_after.estimate(ahead, now), detail)

    def _consult_shedder(self, tracker: RequestTracker, cls: str, rank: int,
                         degrade: DegradeHook | None) -> Decision | None:
        shedder = self.shedder
        assert shedder is not None
        verdict = shedder.assess(cls, self._depth / self.capacity)
        tel = self.telemetry
        if verdict.shed:
            now = self._clock()
            self._lock.acquire()
            try:
                refusal = self._refusal_locked(rank, now, f"shed: {verdict.signal} signal")
            finally:
                self._lock.release()
            if tel is not None:
                tel.count_shed(self.model, verdict.signal or "queue", cls)
            self._refuse_at_door(tracker, refusal)
            return refusal
        if degrade is not None:
            for action in verdict.actions:
                try:
                    applied = degrade(action) is True
                except Exception as exc:
                    applied = False
                    tracker.record_error("admission.degrade", exc)
                if applied and tel is not None:
                    tel.count_degraded(self.model, action)
        return None

    def _refuse_at_door(self, tracker: RequestTracker, refusal: Decision) -> None:
        tracker.reject("queue_full")
        self._report_retry_after(refusal)

    def _report_retry_after(self, decision: Decision) -> None:
        tel = self.telemetry
        if tel is not None and decision.retry_after_s is not None and decision.reason is not None:
            tel.observe_retry_after(self.model, decision.reason, decision.retry_after_s)

    # ---- leaving -----------------------------------------------------------------------------------------

    def _remove_locked(self, entry: _Entry, state: str, now: float) -> None:
        self._queues[entry.rank].remove(entry)
        self._depth -= 1
        self.retry_after.record(1, self._depth, now)
        entry.state = state

    def _sweep_locked(self, now: float) -> list[_Entry]:
        expired = [e for q in self._queues for e in q if e.deadline <= now]
        for e in expired:
            self._remove_locked(e, _TIMED_OUT, now)
            e.decision = self._refusal_locked(e.rank, now, "queue_timeout")
        return expired

    def _expire(self, entry: _Entry) -> None:
        """The waiter's own timeout: time it out unless something else decided first."""
        now = self._clock()
        self._lock.acquire()
        try:
            if entry.state != _WAITING or now < entry.deadline:
                return
            self._remove_locked(entry, _TIMED_OUT, now)
            entry.decision = self._refusal_locked(entry.rank, now, "queue_timeout")
        finally:
            self._lock.release()
        self._settle([("deadline", entry.tracker, entry.decision)], [])

    def _withdraw(self, entry: _Entry) -> None:
        """The waiting call was cancelled: leave the queue (a granted slot stays until the terminal state)."""
        now = self._clock()
        self._lock.acquire()
        try:
            if entry.state == _WAITING:
                self._remove_locked(entry, _WITHDRAWN, now)
        finally:
            self._lock.release()

    def _on_terminal(self, entry: _Entry) -> None:
        """The request reached its terminal state (called once by the lifecycle): free its slot for the next
        waiter, or take it out of the queue."""
        now = self._clock()
        woken: list[_Entry] = []
        self._lock.acquire()
        try:
            if entry.state == _GRANTED:
                entry.state = _RELEASED
                self._running -= 1
                self._tokens_running -= entry.tokens
                woken = self._dispatch_locked(now)
            elif entry.state == _WAITING:
                self._remove_locked(entry, _ENDED, now)
                entry.decision = _ended_decision(entry.tracker)
                woken = [entry]
        finally:
            self._lock.release()
        self._settle([], woken)

    def _dispatch_locked(self, now: float) -> list[_Entry]:
        granted: list[_Entry] = []
        while self._depth:
            queue = next(q for q in self._queues if q)
            if not self._fits_locked(queue[0].tokens):  # first come, first served: the head waits for room
                break
            entry = queue.popleft()
            entry.state = _GRANTED
            entry.decision = ADMIT
            self._running += 1
            self._tokens_running += entry.tokens
            self._depth -= 1
            granted.append(entry)
        if granted:
            self.retry_after.record(len(granted), self._depth, now)
        return granted

    def _settle(self, reports: list[_Report], woken: list[_Entry]) -> None:
        """Outside the lock: commit the terminal states decided under it, report, then wake the waiters."""
        for what, tracker, decision in reports:
            if what == "deadline":
                tracker.finish("deadline")
            else:
                tracker.reject("queue_full")
            self._report_retry_after(decision)
        for entry in woken:
            self._wake(entry)

    @staticmethod
    def _wake(entry: _Entry) -> None:
        if entry.event is not None:
            entry.event.set()
        elif entry.future is not None and entry.loop is not None:
            with contextlib.suppress(RuntimeError):  # the waiter's loop is closed: nobody is left to wake
                entry.loop.call_soon_threadsafe(_resolve_future, entry.future)

    def _outcome(self, entry: _Entry) -> Decision:
        """The decision of an entry that no longer waits; a granted one is scheduled here."""
        if entry.state == _GRANTED:
            entry.tracker.schedule()
            if entry.tracker.finish_reason is None:
                return ADMIT
        if entry.state in (_GRANTED, _RELEASED):  # the request ended before it could start
            return _ended_decision(entry.tracker)
        return entry.decision or _ended_decision(entry.tracker)
