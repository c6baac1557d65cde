"""The no-telemetry path: a tracker that records nothing and a bounded stream that accounts nothing.

``llmslo serve --no-telemetry`` exists for the overhead benchmark only: it does the same engine and HTTP
work with these stand-ins for :class:`llmslo.telemetry.RequestTracker` and
:class:`llmslo.telemetry.SendQueue`. They keep what the request path needs to stay correct (one terminal
state, resources released once, the stream's credit), nothing else: no timestamps, no metrics, no summary,
no slow-consumer policy.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from llmslo.telemetry import StreamClosed

T = TypeVar("T")


class Ends(Protocol):
    """A request that reaches a terminal state (any tracker)."""

    @property
    def done(self) -> bool: ...

    @property
    def finish_reason(self) -> str | None: ...


class PlainTracker:
    """One terminal state and a release of resources exactly once; no figures."""

    __slots__ = ("_resources", "error_type", "finish_reason", "model", "prompt_tokens", "reject_reason",
                 "request_id", "stream_paused_ns", "tenant_class")

    def __init__(self, request_id: str, model: str, tenant_class: str = "default") -> None:
        self.request_id = request_id
        self.model = model
        self.tenant_class = tenant_class
        self.prompt_tokens = 0
        self.finish_reason: str | None = None
        self.reject_reason: str | None = None
        self.error_type: str | None = None
        self.stream_paused_ns = 0
        self._resources: list[Callable[[], object]] = []

    @property
    def done(self) -> bool:
        """Whether the terminal state is committed."""
        return self.finish_reason is not None

    def commit(self, k: int = 1, proposed: int = 0) -> None:
        """Nothing is recorded."""

    def send(self, n: int = 1) -> None:
        """Nothing is recorded."""

    def admit(self) -> None:
        """Nothing is recorded."""

    def schedule(self) -> None:
        """Nothing is recorded."""

    def add_resource(self, release: Callable[[], object], name: str = "resource") -> None:
        """Release ``release`` at the terminal state (at once when already there)."""
        if self.finish_reason is None:
            self._resources.append(release)
        else:
            release()

    def reject(self, reason: str) -> bool:
        """Terminal ``rejected`` with ``reason``; whether this call committed it."""
        won = self.finish("rejected")
        if won:
            self.reject_reason = reason
        return won

    def finish(self, reason: str, *, error_type: str | None = None) -> bool:
        """Commit ``reason`` unless a terminal state is committed; release the resources (reverse order)."""
        if self.finish_reason is not None:
            return False
        self.finish_reason = reason
        self.error_type = error_type
        resources, self._resources = self._resources, []
        for release in reversed(resources):
            release()
        return True


class PlainQueue(Generic[T]):
    """A bounded asyncio queue with the credit of :class:`llmslo.telemetry.SendQueue` (pause at ``high``
    chunks, resume at ``low``), without its accounting or its slow-consumer policy.

    ``high`` None: unbounded (the producer never waits).
    """

    def __init__(self, tracker: Ends, high: int | None = None, low: int | None = None) -> None:
        self.tracker = tracker
        self.high = high
        self.low = (high // 2 if low is None else low) if high is not None else 0
        self._items: deque[tuple[T, int]] = deque()
        self._closed = False
        self._credit = asyncio.Event()
        self._credit.set()
        self._data = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        """Whether no more chunks will be put."""
        return self._closed or self.tracker.done

    async def wait_credit(self) -> None:
        """Return once the producer may put again; raise :class:`StreamClosed` once the request ended."""
        while not self._credit.is_set():
            if self.tracker.done:
                break
            await self._credit.wait()
        if self.tracker.done:
            raise StreamClosed(self.tracker.finish_reason or "finished")

    def put(self, chunk: T, tokens: int = 1) -> None:
        """Queue a chunk (ignored once closed)."""
        if self.closed:
            return
        self._items.append((chunk, tokens))
        if self.high is not None and len(self._items) >= self.high:
            self._credit.clear()
        self._data.set()

    def close(self) -> None:
        """No more chunks; the consumer drains what is queued, then gets ``None``. Wakes both sides."""
        self._closed = True
        self._data.set()
        self._credit.set()

    async def get(self) -> T | None:
        """The next chunk, or ``None`` once closed and drained (at once when the request ended)."""
        while not self._items:
            if self.closed:
                return None
            self._data.clear()
            await self._data.wait()
        if self.tracker.done and not self._closed:
            self._items.clear()
            return None
        chunk, _ = self._items.popleft()
        if len(self._items) <= self.low:
            self._credit.set()
        return chunk
