"""The event loop the gateway runs on: uvloop's when it is installed (the ``gateway`` extra), else asyncio's; and
:func:`start_eagerly`, which runs a request's handler from the connection's callback until it first waits.

Every byte of a stream crosses the event loop twice (read from the engine, written to the client), so the loop's
own cost per read and per write is most of the gateway's CPU per chunk; uvloop's loop and transports (libuv, in
C) cost less per call than asyncio's selector loop. The gateway uses nothing either loop lacks. ``LLMSLO_LOOP``
chooses: ``auto`` (default: uvloop when importable), ``uvloop`` (an error without it) or ``asyncio``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from llmslo.telemetry import ConfigurationError

LOOP_CHOICES: tuple[str, ...] = ("auto", "uvloop", "asyncio")
"""The values of ``LLMSLO_LOOP``."""


def event_loop_factory(choice: str | None = None) -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of the event loop the gateway runs on, for ``asyncio.Runner(loop_factory=...)``.

    ``choice`` (default: ``LLMSLO_LOOP``, else ``auto``) is one of :data:`LOOP_CHOICES`. Raises
    :class:`ConfigurationError` for another value, or for ``uvloop`` where uvloop is not installed."""
    chosen = (choice if choice is not None else os.environ.get("LLMSLO_LOOP", "auto")).strip().lower() or "auto"
    if chosen not in LOOP_CHOICES:
        raise ConfigurationError(f"LLMSLO_LOOP: one of {', '.join(LOOP_CHOICES)}, got {chosen!r}")
    if chosen == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if chosen == "uvloop":
            raise ConfigurationError("LLMSLO_LOOP=uvloop: uvloop is not installed (pip install 'llmslo[gateway]', "
                                     "or LLMSLO_LOOP=asyncio)") from None
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: the kind of ``loop``, as the gateway's ready line says it."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def start_eagerly(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coro`` now, on the caller's stack, until it first waits; from there on, as a task of the running loop
    (returned). None when it finished without waiting. Exceptions of that first part are raised here.

    As Python 3.12's eager tasks, on 3.11: a request read in a connection's callback is parsed, admitted, routed
    and written to its backend in that callback, instead of waiting for its task's turn behind every callback
    the loop has queued (0.25-0.4 ms at the median, up to 2 ms at p99, in per-request probes of a gateway
    under ``bench_gateway``'s load at 64 streams). During that first part ``asyncio.current_task()`` is the
    caller's (None in a protocol's callback)."""
    try:
        waiting_for = coro.send(None)
    except StopIteration:
        return None
    if getattr(waiting_for, "_asyncio_future_blocking", None) is True:
        # a future's await marks it for the task that takes it, and that task unmarks it at once; until the task
        # below takes it, unmark it here, so that another coroutine may await the same future meanwhile
        waiting_for._asyncio_future_blocking = False
    return asyncio.get_running_loop().create_task(_Resumed(coro, waiting_for))  # type: ignore[arg-type]


_FIRST_GIVEN = object()


class _Resumed:
    """A started coroutine, as a task takes it: its first ``send`` gives the task what the coroutine is waiting for
    (what its first part yielded); every later ``send`` and ``throw`` (a cancellation, before the task's first
    step too) goes to the coroutine."""

    __slots__ = ("_coro", "_waiting_for")

    def __init__(self, coro: Coroutine[Any, Any, None], waiting_for: object) -> None:
        self._coro = coro
        self._waiting_for = waiting_for

    def send(self, value: object) -> object:
        waiting_for = self._waiting_for
        if waiting_for is not _FIRST_GIVEN:
            self._waiting_for = _FIRST_GIVEN
            if getattr(waiting_for, "_asyncio_future_blocking", None) is False:
                waiting_for._asyncio_future_blocking = True  # type: ignore[attr-defined]  # (marked again)
            return waiting_for
        return self._coro.send(value)

    def throw(self, exc: BaseException) -> object:
        self._waiting_for = _FIRST_GIVEN
        return self._coro.throw(exc)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, None]:
        return self  # type: ignore[return-value]

    def __iter__(self) -> _Resumed:
        return self

    def __next__(self) -> object:
        return self.send(None)
