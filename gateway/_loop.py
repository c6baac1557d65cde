"""The event loop the gateway runs on: uvloop's when it is installed (the ``gateway`` extra), else asyncio's.

Every byte of a stream crosses the event loop twice (read from the engine, written to the client), so the loop's
own cost per read and per write is most of the gateway's CPU per chunk; uvloop's loop and transports (libuv, in
C) cost less per call than asyncio's selector loop. The gateway uses nothing either loop lacks. ``LLMSLO_LOOP``
chooses: ``auto`` (default: uvloop when importable), ``uvloop`` (an error without it) or ``asyncio``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

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
