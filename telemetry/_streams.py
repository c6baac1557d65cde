"""Bounded per-request streams with true backpressure, and a deterministic tick simulator to size them.

A :class:`SendQueue` sits between one request's producer (the engine's commits) and its consumer (the
transport). The producer awaits send credit before generating: once the queue holds ``high`` chunks, no
token is generated for this request until the consumer drains it down to ``low`` (other requests are not
held). A slow-consumer policy ends the request with ``deadline`` (``server_draining`` while the server
drains) when no chunk was sent for ``idle_s`` seconds or the request has been in flight ``max_duration_s``
seconds, whichever comes first.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from llmslo.telemetry import _names as N
from llmslo.telemetry._errors import ConfigurationError, LlmsloError
from llmslo.telemetry._lifecycle import RequestTracker

T = TypeVar("T")


class StreamClosed(LlmsloError):
    """The stream ended (terminal state committed); stop producing or consuming. ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"stream closed: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class StreamPolicy:
    """Sizes and limits of a per-request send queue.

    ``capacity`` (chunks) bounds the queue; the producer pauses at ``high`` (default ``capacity``) and
    resumes at ``low`` (default ``capacity // 2``). ``idle_s``: end the stream when no chunk was sent for
    this long; ``max_duration_s``: end it once the request has been in flight this long (seconds; ``None``
    disables). Raises :class:`ConfigurationError` naming the field.
    """

    capacity: int = 32
    high: int | None = None
    low: int | None = None
    idle_s: float | None = 30.0
    max_duration_s: float | None = 300.0

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, int) or isinstance(self.capacity, bool) or self.capacity < 1:
            raise ConfigurationError(f"StreamPolicy.capacity: must be an integer >= 1, got {self.capacity!r}")
        high = self.capacity if self.high is None else self.high
        low = high // 2 if self.low is None else self.low
        if not isinstance(high, int) or not 1 <= high <= self.capacity:
            raise ConfigurationError(f"StreamPolicy.high: must be in 1..capacity ({self.capacity}), got {high!r}")
        if not isinstance(low, int) or not 0 <= low < high:
            raise ConfigurationError(f"StreamPolicy.low: must be in 0..high-1 ({high - 1}), got {low!r}")
        object.__setattr__(self, "high", high)
        object.__setattr__(self, "low", low)
        for fname in ("idle_s", "max_duration_s"):
            v = getattr(self, fname)
            if v is not None and not (isinstance(v, (int, float)) and v > 0 and v == v and v != float("inf")):
                raise ConfigurationError(f"StreamPolicy.{fname}: must be a positive number of seconds or None")


class SendQueue(Generic[T]):
    """The bounded send queue of one request (asyncio, one producer and one consumer).

    The producer calls ``await q.wait_credit()`` before generating a token and ``q.put(chunk, tokens)``
    after committing it (or ``await q.send(chunk)`` for both); the consumer calls ``await q.get()`` until
    it returns ``None``. Counted on the tracker: sent tokens, paused seconds, deepest queue; generated
    minus sent at the end is the backpressure waste. When the slow-consumer policy fires, the request
    finishes and the waiting side gets :class:`StreamClosed`.

    Example::

        q = SendQueue(tracker, StreamPolicy(capacity=8, idle_s=30))
        async def produce():
            while not done:
                await q.wait_credit()
                tok = await engine.step(); tracker.commit(); q.put(tok)
            q.close()
        async for chunk in q:  # the transport
            await websocket.send(chunk)
    """

    def __init__(self, tracker: RequestTracker, policy: StreamPolicy | None = None) -> None:
        self.tracker = tracker
        self.policy = policy if policy is not None else StreamPolicy()
        self._tel = tracker._tel
        self._clock = self._tel.clock_ns
        self._items: deque[tuple[T, int]] = deque()
        self._closed = False
        self._paused = False
        self._credit = asyncio.Event()
        self._credit.set()
        self._data = asyncio.Event()
        self._last_sent_ns = self._clock()
        self.max_queued = 0
        self.paused_ns = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        """Whether no more chunks will be put (closed by the producer or the terminal state)."""
        return self._closed or self.tracker.done

    # ---- producer ----------------------------------------------------------------------------------------

    async def wait_credit(self) -> None:
        """Return once the producer may generate the next token; raise :class:`StreamClosed` when the stream
        ended (by the policy, or another terminal signal)."""
        if self.tracker.done:
            raise StreamClosed(self.tracker.finish_reason or "finished")
        if self._credit.is_set():
            self._enforce()
            return
        start = self._clock()
        self._set_paused(True)
        try:
            while not self._credit.is_set():
                timeout = self._remaining_s()
                try:
                    if timeout is None:
                        await self._credit.wait()
                    else:
                        await asyncio.wait_for(self._credit.wait(), timeout=max(timeout, 0.0))
                except TimeoutError:
                    pass
                self._enforce()
        finally:
            paused = self._clock() - start
            self.paused_ns += paused
            self.tracker.stream_paused_ns += paused
            self._set_paused(False)

    def put(self, chunk: T, tokens: int = 1) -> None:
        """Queue a committed chunk of ``tokens`` tokens for the transport (call after ``wait_credit``)."""
        if self.closed:
            return
        self._items.append((chunk, tokens))
        n = len(self._items)
        if n > self.max_queued:
            self.max_queued = n
            self.tracker.stream_max_queued = n
        if n >= (self.policy.high or self.policy.capacity):
            self._credit.clear()
        self._data.set()

    async def send(self, chunk: T, tokens: int = 1) -> None:
        """``wait_credit()`` then ``put(chunk, tokens)``: for producers that cannot wait before generating."""
        await self.wait_credit()
        self.put(chunk, tokens)

    def close(self) -> None:
        """The producer has nothing more; the consumer drains what is queued, then gets ``None``."""
        self._closed = True
        self._data.set()

    # ---- consumer ----------------------------------------------------------------------------------------

    async def get(self) -> T | None:
        """The next chunk (counted as sent), or ``None`` once the stream is closed and drained, or ended."""
        while not self._items:
            if self.closed:
                return None
            self._data.clear()
            timeout = self._remaining_s()
            try:
                if timeout is None:
                    await self._data.wait()
                else:
                    await asyncio.wait_for(self._data.wait(), timeout=max(timeout, 0.0))
            except TimeoutError:
                pass
            try:
                self._enforce()
            except StreamClosed:
                return None
        if self.tracker.done and not self._closed:
            self._items.clear()
            return None
        chunk, tokens = self._items.popleft()
        self.tracker.send(tokens)
        self._last_sent_ns = self._clock()
        if len(self._items) <= (self.policy.low or 0):
            self._credit.set()
        return chunk

    def __aiter__(self) -> SendQueue[T]:
        return self

    async def __anext__(self) -> T:
        chunk = await self.get()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    # ---- policy ------------------------------------------------------------------------------------------

    def _remaining_s(self) -> float | None:
        now = self._clock()
        limits: list[float] = []
        if self.policy.idle_s is not None:
            limits.append(self.policy.idle_s - (now - self._last_sent_ns) / 1e9)
        if self.policy.max_duration_s is not None:
            limits.append(self.policy.max_duration_s - (now - self.tracker.arrival_ns) / 1e9)
        return min(limits) if limits else None

    def _enforce(self) -> None:
        """Finish the request when the slow-consumer policy fires; raise :class:`StreamClosed` once ended."""
        if not self.tracker.done:
            remaining = self._remaining_s()
            if remaining is not None and remaining <= 0:
                self.tracker.finish("server_draining" if self._tel.draining else "deadline")
        if self.tracker.done:
            self._credit.set()
            self._data.set()
            raise StreamClosed(self.tracker.finish_reason or "finished")

    def _set_paused(self, paused: bool) -> None:
        if paused == self._paused:
            return
        self._paused = paused
        try:
            self._tel.metrics.gauge_add(N.PAUSED_STREAMS.key, {"model": self.tracker.model}, 1 if paused else -1)
        except Exception as exc:
            self._tel.guard.error("stream.paused", exc)


# ---- the deterministic simulator ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamTick:
    """One tick of a simulated stream: tokens sent and generated this tick, queue length after it, paused."""

    tick: int
    sent: int
    generated: int
    queued: int
    paused: bool


@dataclass(frozen=True)
class TerminalRecord:
    """How the simulated request ended: the finish reason, later signals ignored, resources released."""

    reason: str
    signals_ignored: int
    cleanup_count: int


@dataclass(frozen=True)
class StreamSimulation:
    """The result of :func:`simulate_stream` (token counts; ticks)."""

    sent: int
    generated: int
    unsent: int
    paused_ticks: int
    max_queued: int
    ticks: int
    trace: tuple[StreamTick, ...] = field(repr=False)
    terminal: TerminalRecord

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "sent": self.sent, "generated": self.generated, "unsent": self.unsent,
            "paused_ticks": self.paused_ticks, "max_queued": self.max_queued, "ticks": self.ticks,
            "terminal": {"reason": self.terminal.reason, "signals_ignored": self.terminal.signals_ignored,
                         "cleanup_count": self.terminal.cleanup_count},
            "trace": [[t.tick, t.sent, t.generated, t.queued, t.paused] for t in self.trace],
        }


class _Terminal:
    """A single-owner terminal state: the first signal wins, later ones are counted, cleanup runs once."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.ignored = 0
        self.cleanups = 0

    def signal(self, reason: str) -> None:
        if self.reason is not None:
            self.ignored += 1
            return
        self.reason = reason
        self.cleanups += 1


def simulate_stream(tokens: int, drain_per_tick: int | Sequence[int], capacity: int | None,
                    deadline_tick: int | None = None) -> StreamSimulation:
    """Simulate one request's send queue tick by tick (deterministic; for sizing buffers).

    Each tick ``t`` (from 0): if ``deadline_tick`` is set and ``t >= deadline_tick`` the request ends
    (``deadline``) and the tick does nothing else; otherwise the transport first sends up to
    ``drain_per_tick[t]`` queued tokens, then the producer generates one token if tokens remain and the
    queue is unbounded (``capacity=None``) or shorter than ``capacity``; a tick where tokens remain but the
    queue is full is paused. The request ends ``stop`` once every token is generated and sent.
    ``drain_per_tick`` is a constant or a per-tick sequence whose last value repeats.

    Raises :class:`ConfigurationError` naming the argument when it is invalid or the stream could never end.

    Example::

        >>> simulate_stream(3, 1, capacity=1).sent
        3
    """
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise ConfigurationError(f"tokens: must be an integer >= 0, got {tokens!r}")
    drains: tuple[int, ...] = (drain_per_tick,) if isinstance(drain_per_tick, int) else tuple(drain_per_tick)
    if not drains or any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in drains):
        raise ConfigurationError("drain_per_tick: give an integer >= 0 or a non-empty sequence of them")
    if capacity is not None and (not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1):
        raise ConfigurationError(f"capacity: must be an integer >= 1 or None (unbounded), got {capacity!r}")
    if deadline_tick is not None and (not isinstance(deadline_tick, int) or deadline_tick < 0):
        raise ConfigurationError(f"deadline_tick: must be an integer >= 0 or None, got {deadline_tick!r}")
    if deadline_tick is None and tokens > 0 and drains[-1] == 0:
        raise ConfigurationError("deadline_tick: needed when the drain ends at 0 (the stream could never finish)")
    terminal = _Terminal()
    queued = sent = generated = paused_ticks = max_queued = 0
    trace: list[StreamTick] = []
    t = 0
    while terminal.reason is None:
        if generated == tokens and queued == 0:
            terminal.signal("stop")
            break
        if deadline_tick is not None and t >= deadline_tick:
            terminal.signal("deadline")
            break
        d = min(drains[min(t, len(drains) - 1)], queued)
        queued -= d
        sent += d
        g = 0
        paused = False
        if generated < tokens:
            if capacity is None or queued < capacity:
                g = 1
                generated += 1
                queued += 1
            else:
                paused = True
                paused_ticks += 1
        max_queued = max(max_queued, queued)
        trace.append(StreamTick(t, d, g, queued, paused))
        t += 1
    return StreamSimulation(sent, generated, generated - sent, paused_ticks, max_queued, t, tuple(trace),
                            TerminalRecord(terminal.reason or "stop", terminal.ignored, terminal.cleanups))
