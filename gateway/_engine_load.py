"""The engines' own load, read from their ``/metrics`` for routing.

A backend whose spec names an ``engine`` gets an :class:`EngineLoad`: every ``engine_interval_s`` the gateway
reads that backend's Prometheus exposition (one ``GET``, a fresh connection through the upstream client of
``_http``, bounded in time and size, on the gateway's event loop: the request path never waits for it) and keeps
what the engine's profile (:mod:`llmslo.engines`) maps to ``waiting`` and ``running`` (requests, summed over
label sets, e.g. data-parallel engines) and ``kv_usage`` (fraction 0..1, the fullest label set; None where the
engine has no such series, like llama.cpp), with the time it was read.

Figures older than :data:`STALE_INTERVALS` intervals are not used (:meth:`EngineLoad.fresh` is None), and a read
that fails keeps the last figures until they go stale: routing then falls back to outstanding requests. Failed
reads and the picks that fell back are counted in the backend's state (the admin API).

The exposition is parsed by prometheus-client's parser, given only the lines of the series wanted (a vLLM
exposition is mostly histogram buckets the gateway has no use for).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from llmslo.engines import EngineProfile, Series
from llmslo.gateway._http import (
    ChunkedDecoder,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    header_block,
    send_request,
)

STALE_INTERVALS = 3
"""Figures older than this many read intervals are ignored in routing."""
READ_TIMEOUT_S = 2.0
"""The longest one read of ``/metrics`` may take, seconds (less when the interval is shorter)."""
MAX_METRICS_BYTES = 8 * 1024 * 1024
"""The largest exposition read, bytes (beyond: the read fails)."""
MAX_ERROR_CHARS = 200
"""The most characters of a failed read's reason kept for the admin API."""
CONCEPTS_READ = ("waiting", "running", "kv_usage")
"""The profile concepts read: ``waiting`` and ``running`` are required, ``kv_usage`` is read where it exists."""


class EngineReadError(Exception):
    """A ``/metrics`` read that gave no figures (the reason is the message)."""


@dataclass(frozen=True)
class EngineFigures:
    """One read of an engine's own load: ``waiting`` and ``running`` in requests, ``kv_usage`` a fraction 0..1
    (None: the engine has no such series), ``read_s`` when it was read (seconds on the reader's monotonic
    clock)."""

    waiting: float
    running: float
    kv_usage: float | None
    read_s: float


def profile_series(profile: EngineProfile, concept: str) -> tuple[Series, ...]:
    """The series of ``profile`` measuring ``concept``, the current name before deprecated ones."""
    found = [s for s in profile.series if s.concept == concept]
    return tuple(sorted(found, key=lambda s: bool(s.deprecated)))


def wanted_names(profile: EngineProfile) -> frozenset[str]:
    """The sample names read from ``profile``'s exposition (those of :data:`CONCEPTS_READ`)."""
    return frozenset(s.name for c in CONCEPTS_READ for s in profile_series(profile, c))


def _relevant_lines(text: str, names: Iterable[str]) -> str:
    """The sample lines of ``text`` whose metric name is one of ``names`` (with their labels or not)."""
    prefixes = tuple(p for n in names for p in (n + "{", n + " ", n + "\t"))
    return "".join(line + "\n" for line in text.splitlines() if line.startswith(prefixes))


def read_figures(profile: EngineProfile, text: str, read_s: float) -> EngineFigures:
    """The figures of one exposition ``text`` of an engine described by ``profile``, read at ``read_s``
    (seconds, monotonic). Raises :class:`EngineReadError` when it cannot be parsed or lacks ``waiting`` or
    ``running``."""
    names = wanted_names(profile)
    values: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(_relevant_lines(text, names)):
            for sample in family.samples:
                if sample.name in names and not math.isnan(sample.value):
                    values.setdefault(sample.name, []).append(float(sample.value))
    except ValueError as exc:
        raise EngineReadError(f"the exposition cannot be parsed ({exc})") from exc

    def first(concept: str) -> list[float] | None:
        for series in profile_series(profile, concept):
            if series.name in values:
                return values[series.name]
        return None

    waiting, running, kv = first("waiting"), first("running"), first("kv_usage")
    for concept, found in (("waiting", waiting), ("running", running)):
        if found is None:
            wanted = " or ".join(s.name for s in profile_series(profile, concept)) or "none in the profile"
            raise EngineReadError(f"no {concept} series in the exposition (expected {wanted}): is this a "
                                  f"{profile.name} /metrics?")
    assert waiting is not None and running is not None
    return EngineFigures(waiting=max(0.0, sum(waiting)), running=max(0.0, sum(running)),
                         kv_usage=None if kv is None else min(1.0, max(0.0, max(kv))), read_s=read_s)


async def _read_body(reader: asyncio.StreamReader, resp: UpstreamResponse, limit: int) -> bytes:
    """The body of ``resp`` (by length, chunked, or up to the close), at most ``limit`` bytes."""
    too_big = f"the exposition is larger than {limit} bytes"
    if resp.length is not None:
        if resp.length > limit:
            raise EngineReadError(too_big)
        return await reader.readexactly(resp.length)
    parts: list[bytes] = []
    size = 0
    decoder = ChunkedDecoder() if resp.chunked else None
    while decoder is None or not decoder.done:
        data = await reader.read(64 * 1024)
        if not data:
            if decoder is not None:
                raise EngineReadError("the exposition ended before its last chunk")
            break
        payload = decoder.feed(data) if decoder is not None else data
        size += len(payload)
        if size > limit:
            raise EngineReadError(too_big)
        parts.append(payload)
    return b"".join(parts)


class EngineLoad:
    """One backend's engine figures (see the module docstring); ``clock``: monotonic seconds."""

    def __init__(self, profile: EngineProfile, host: str, port: int, path: str, interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.profile = profile
        self.path = path
        self.interval_s = interval_s
        self.clock = clock
        self.figures: EngineFigures | None = None
        self.read_failures = 0
        """Reads that gave no figures so far."""
        self.fallbacks = 0
        """Picks among two backends where this one's figures were missing or stale, so outstanding requests
        decided."""
        self.last_error: str | None = None
        """Why the last read failed (None: it gave figures)."""
        self._upstream = UpstreamPool(host, port, max_idle=0, connect_timeout_s=self.timeout_s)
        self._authority = f"{host}:{port}"

    @property
    def max_age_s(self) -> float:
        """The oldest figures used in routing, seconds."""
        return STALE_INTERVALS * self.interval_s

    @property
    def timeout_s(self) -> float:
        """The longest one read may take, seconds."""
        return min(READ_TIMEOUT_S, self.interval_s)

    def fresh(self, now: float | None = None) -> EngineFigures | None:
        """The figures when read within :attr:`max_age_s` of ``now`` (default: the clock), else None."""
        figures = self.figures
        if figures is None:
            return None
        age = (self.clock() if now is None else now) - figures.read_s
        return figures if age <= self.max_age_s else None

    async def read(self) -> bool:
        """Read the engine's ``/metrics`` once; whether it gave figures (a failure is counted, never raised)."""
        try:
            text = await asyncio.wait_for(self._get(), self.timeout_s)
            self.figures = read_figures(self.profile, text, self.clock())
        except (EngineReadError, UpstreamError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
            self._failed(str(exc) or type(exc).__name__)
            return False
        except TimeoutError:
            self._failed(f"no exposition within {self.timeout_s:g} s")
            return False
        self.last_error = None
        return True

    def _failed(self, why: str) -> None:
        self.read_failures += 1
        self.last_error = f"GET {self.path}: {why}"[:MAX_ERROR_CHARS]

    async def _get(self) -> str:
        """``GET`` the exposition on a new connection (closed after): its text."""
        conn, _ = await self._upstream.acquire()
        try:
            resp = await send_request(conn, "GET", self.path, self._authority,
                                      header_block([(b"accept", b"text/plain"), (b"connection", b"close")]), b"")
            if resp.status != 200:
                raise EngineReadError(f"answered {resp.status}, not 200")
            body = await _read_body(conn.reader, resp, MAX_METRICS_BYTES)
        finally:
            conn.abort()
        return body.decode("utf-8", errors="replace")

    def status(self) -> dict[str, object]:
        """What the admin API shows of it (``engine_*`` keys; the figures even when stale, with their age)."""
        f = self.figures
        return {
            "engine": self.profile.key,
            "engine_waiting": None if f is None else f.waiting,
            "engine_running": None if f is None else f.running,
            "engine_kv_usage": None if f is None else f.kv_usage,
            "engine_read_age_s": None if f is None else round(self.clock() - f.read_s, 3),
            "engine_fresh": self.fresh() is not None,
            "engine_read_failures": self.read_failures,
            "engine_fallbacks": self.fallbacks,
            "engine_last_error": self.last_error,
        }


NO_ENGINE_STATUS: dict[str, object] = {
    "engine": None, "engine_waiting": None, "engine_running": None, "engine_kv_usage": None,
    "engine_read_age_s": None, "engine_fresh": False, "engine_read_failures": 0, "engine_fallbacks": 0,
    "engine_last_error": None,
}
"""The ``engine_*`` keys of a backend whose engine is not read."""


async def read_loop(loads: Callable[[], Iterable[EngineLoad]], interval_s: float) -> None:
    """Read every load ``loads()`` gives (asked anew each round: backends come and go), then wait
    ``interval_s`` seconds; until cancelled. Each read is bounded by its own timeout."""
    while True:
        await asyncio.gather(*(load.read() for load in loads()), return_exceptions=True)
        await asyncio.sleep(interval_s)
