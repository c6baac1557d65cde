"""The backends a gateway routes to: their state, the choice of one per request, their health and their drain.

A backend is **routable** while it is in the pool (not removed by a drain), its last health check passed, and its
breaker is not open. :meth:`Pool.pick` takes two routable backends that serve the model at random and keeps the one
with fewer outstanding requests per slot (power of two choices, weighted by slots); a half-open breaker lets
through only its probes. Where both have fresh figures of their engine's own load (a backend with an ``engine``,
see :mod:`llmslo.gateway._engine_load`), it keeps the one with less ``(engine waiting + outstanding) / slots``,
the lower KV usage on a tie. Every change of a backend's routability (in or out of the pool, healthy or not, its
breaker opening or half-opening) is logged once and counted (:attr:`Backend.changes`), and :meth:`Pool.status` is
what the admin API shows.

A backend's drain is a :class:`DrainController` over that backend's requests alone (:class:`BackendDrain`): it
removes the backend from the pool first, waits the settle time, waits for the requests in flight under the idle
and age rules, and at the budget terminates the rest or returns the backend to the pool; its
:class:`DrainRecord` is what ``llmslo rollout record`` takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from llmslo.controls import CircuitBreaker, DrainConfig, DrainController, DrainRecord
from llmslo.gateway._concurrency import AdaptiveLimit
from llmslo.gateway._config import DRAIN_KEYS, ENGINE_PROFILES, BackendSpec, GatewayConfig
from llmslo.gateway._engine_load import NO_ENGINE_STATUS, EngineLoad, read_loop
from llmslo.gateway._http import UpstreamError, UpstreamPool, send_request
from llmslo.telemetry import ConfigurationError, RequestTracker, Telemetry

log = logging.getLogger("llmslo.gateway")

HEALTH_TIMEOUT_S = 2.0
"""The longest wait for a health check's answer, seconds."""
MAX_SMALL_BODY = 256 * 1024
"""The most bytes of a health or model-list answer read, bytes."""
MAX_LISTED_MODELS = 64
"""The most model ids kept from one backend's list."""
RETRY_AFTER_FLOOR_S = 1.0
"""The shortest ``Retry-After`` of a 503 ``circuit_open``, seconds (the header's own unit)."""

_DRAIN_CONFIG_FIELDS = dict(zip(DRAIN_KEYS, ("wait_budget_s", "unregister_settle_s", "idle_threshold_s",
                                             "max_inflight_s", "on_budget"), strict=True))
"""Each drain rule's field of :class:`DrainConfig`."""

FAILURE_KINDS = frozenset({"connect", "5xx", "stream", "stall", "slow_ttft", "timeout"})
"""What counts against a backend's breaker: it could not be reached, answered 5xx, broke a stream, stalled
mid-stream, or was slower to a first token than the bound."""


@dataclass
class Backend:
    """One backend's state (one event loop: no locks)."""

    spec: BackendSpec
    breaker: CircuitBreaker
    upstream: UpstreamPool
    limit: AdaptiveLimit
    """How many requests it takes at once, following its latency per unit of work."""
    healthy: bool = True
    in_pool: bool = True
    outstanding: int = 0
    requests: dict[int, RequestTracker] = field(default_factory=dict)
    """The requests forwarded to it and not yet ended, by ``id(tracker)``."""
    drain: DrainController | None = None
    last_drain: DrainRecord | None = None
    changes: int = 0
    """Changes of routability so far (each logged)."""
    served: int = 0
    """Requests forwarded to it so far."""
    listed: tuple[str, ...] | None = None
    """The models its ``/v1/models`` lists (None: not read yet)."""
    removed_unix_s: float | None = None
    """When it last left the pool (Unix seconds; None: never)."""
    last_routed_unix_s: float | None = None
    """When the last request was forwarded to it (Unix seconds; None: none yet)."""
    engine: EngineLoad | None = None
    """Its engine's own load, read from its ``/metrics`` (None: its spec names no engine)."""

    @property
    def id(self) -> str:
        return self.spec.id

    def routable(self) -> bool:
        return self.in_pool and self.healthy and self.breaker.state != "open"

    def status(self) -> dict[str, object]:
        """What the admin API shows of it."""
        return {
            "id": self.id, "url": self.spec.url, "version": self.spec.version, "slots": self.spec.slots,
            "models": list(self.spec.models), "in_pool": self.in_pool, "healthy": self.healthy,
            "breaker": self.breaker.state, "routable": self.routable(), "outstanding": self.outstanding,
            "served": self.served, "limit": self.limit.to_dict(),
            "streaming": sum(1 for t in self.requests.values() if t.generated_tokens),
            "draining": self.drain is not None and self.drain.phase in ("settling", "waiting"),
            "last_drain": None if self.last_drain is None else self.last_drain.to_dict(),
            "removed_unix_s": self.removed_unix_s, "last_routed_unix_s": self.last_routed_unix_s,
            **(NO_ENGINE_STATUS if self.engine is None else self.engine.status()),
        }


def _model_ids(body: bytes) -> tuple[str, ...]:
    """The model ids of an OpenAI ``/v1/models`` answer (bounded; anything else: none)."""
    try:
        data = json.loads(body).get("data")
    except (ValueError, AttributeError):
        return ()
    if not isinstance(data, list):
        return ()
    ids = [m.get("id") for m in data[:MAX_LISTED_MODELS] if isinstance(m, dict)]
    return tuple(i[:256] for i in ids if isinstance(i, str) and i)


class BackendDrain:
    """The :class:`DrainTelemetry` of one backend: its in-flight requests; the drain's start removes it from the
    pool, a return to the pool puts it back; durations and closes are reported to the gateway's telemetry."""

    def __init__(self, pool: Pool, backend: Backend, tel: Telemetry) -> None:
        self._pool = pool
        self._backend = backend
        self._tel = tel
        self.clock_ns = tel.clock_ns

    def in_flight(self) -> list[RequestTracker]:
        return list(self._backend.requests.values())

    def begin_drain(self) -> None:
        self._pool.set_in_pool(self._backend, False, "drain")

    def end_drain(self) -> None:
        self._pool.set_in_pool(self._backend, True, "drain returned it to the pool")

    def count_drain_closed(self, reason: str, n: int = 1) -> None:
        self._tel.count_drain_closed(reason, n)

    def observe_drain(self, duration_s: float) -> None:
        self._tel.observe_drain(duration_s)


class BreakerReport:
    """What one backend's breaker reports (:class:`llmslo.controls.BreakerTelemetry`): passed on to the gateway's
    telemetry (``llmslo_breaker_state``, ``llmslo_breaker_transitions_total``, the refusals' ``Retry-After``), and
    each transition to the pool (:meth:`Pool.breaker_moved`), so that a breaker that takes the backend out of
    routing, or lets it back in, is a change of the pool as a health check's is. The breaker calls it under its
    own lock: nothing here reads the breaker."""

    def __init__(self, pool: Pool, tel: Telemetry) -> None:
        self._pool = pool
        self._tel = tel
        self.backend: Backend | None = None
        """The backend whose breaker reports here (set once the backend is made)."""

    def set_breaker_state(self, breaker: str, state: str) -> None:
        self._tel.set_breaker_state(breaker, state)

    def count_breaker_transition(self, breaker: str, from_state: str, to_state: str) -> None:
        self._tel.count_breaker_transition(breaker, from_state, to_state)
        if self.backend is not None:
            self._pool.breaker_moved(self.backend, from_state, to_state)

    def observe_retry_after(self, model: str, reject_reason: str, seconds: float) -> None:
        self._tel.observe_retry_after(model, reject_reason, seconds)


class Pool:
    """Every backend of a gateway (see the module docstring)."""

    def __init__(self, config: GatewayConfig, tel: Telemetry, *, rng: random.Random | None = None,
                 on_change: Callable[[Backend, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.tel = tel
        self._rng = rng or random.Random()
        self._on_change = on_change
        self._clock = clock
        """Monotonic seconds: when engine figures were read, and how old they are."""
        self.backends: dict[str, Backend] = {}
        for spec in config.backends:
            self.backends[spec.id] = self._backend(spec)
        self._health_task: asyncio.Task[None] | None = None
        self._engine_task: asyncio.Task[None] | None = None

    def _backend(self, spec: BackendSpec) -> Backend:
        cfg = self.config
        report = BreakerReport(self, self.tel)
        breaker = CircuitBreaker(spec.id, consecutive_failures=cfg.breaker_failures, error_rate=None,
                                 open_s=cfg.breaker_open_s, failure_kinds=FAILURE_KINDS, telemetry=report)
        limit = AdaptiveLimit(initial=2 * spec.slots, min_limit=1, max_limit=max(4, 64 * spec.slots))
        engine = None
        if spec.engine is not None:
            engine = EngineLoad(ENGINE_PROFILES[spec.engine], spec.host, spec.port, spec.metrics_path,
                                cfg.engine_interval_s, clock=self._clock)
        backend = Backend(spec, breaker, UpstreamPool(spec.host, spec.port), limit, engine=engine)
        report.backend = backend
        return backend

    def add(self, spec: BackendSpec) -> Backend:
        """Add a backend (unhealthy until its first health check passes). Raises :class:`ConfigurationError`
        when the id is taken or the backend does not serve the gateway's models."""
        if spec.id in self.backends:
            raise ConfigurationError(f"backend id {spec.id!r} is taken; pick another")
        served = self.config.served_models()
        if spec.models and served and not set(spec.models) <= set(served):
            raise ConfigurationError(f"backend {spec.id!r}: models {', '.join(spec.models)} are not all among "
                                     f"the gateway's ({', '.join(served)})")
        backend = self._backend(spec)
        backend.healthy = False
        self.backends[spec.id] = backend
        self._changed(backend, f"added ({spec.url}, version {spec.version}); routable once healthy")
        return backend

    def remove(self, backend: Backend) -> str | None:
        """Take ``backend`` out of the gateway for good; None, or why not (it is draining or has requests)."""
        if backend.drain is not None and backend.drain.phase in ("settling", "waiting"):
            return "it is draining"
        if backend.outstanding or backend.requests:
            return f"{backend.outstanding} request(s) are in flight on it: drain it first"
        if backend.in_pool:
            self.set_in_pool(backend, False, "removed")
        del self.backends[backend.id]
        backend.upstream.close()
        self._changed(backend, "removed from the gateway")
        return None

    # ---- choosing --------------------------------------------------------------------------------------------

    def pick(self, model: str, exclude: frozenset[str] = frozenset(), tokens: int = 0) -> Backend | None:
        """A backend for a request for ``model`` of ``tokens`` tokens (not one of ``exclude``), or None when none is
        routable. Those with room for it under their concurrency limit (requests and tokens in flight) come first;
        when none has, the least loaded is taken.
        Of the two drawn, :meth:`_lighter` keeps one."""
        routable: list[Backend] = []
        below: list[Backend] = []
        for b in self.backends.values():
            if b.id not in exclude and b.spec.serves(model) and b.routable():
                routable.append(b)
                if b.limit.has_room(tokens):
                    below.append(b)
        candidates = below or routable
        while candidates:
            if len(candidates) == 1:
                choice = candidates[0]
            else:
                a, b = self._rng.sample(candidates, 2)
                choice = self._lighter(a, b)
            if choice.breaker.allow().admitted:  # closed, or one of its half-open probes
                return choice
            candidates.remove(choice)
        return None

    def _lighter(self, a: Backend, b: Backend) -> Backend:
        """The less loaded of two backends: by ``(engine waiting + outstanding) / slots`` and then the lower KV
        usage where both have fresh engine figures, else by outstanding requests per slot; ``a`` on a tie."""
        fa = fb = None
        if a.engine is not None or b.engine is not None:
            now = self._clock()
            fa = None if a.engine is None else a.engine.fresh(now)
            fb = None if b.engine is None else b.engine.fresh(now)
            for backend, figures in ((a, fa), (b, fb)):
                if backend.engine is not None and figures is None:
                    backend.engine.fallbacks += 1
        if fa is None or fb is None:
            return a if a.outstanding * b.spec.slots <= b.outstanding * a.spec.slots else b
        load_a = (fa.waiting + a.outstanding) * b.spec.slots
        load_b = (fb.waiting + b.outstanding) * a.spec.slots
        if load_a != load_b:
            return a if load_a < load_b else b
        if fa.kv_usage is not None and fb.kv_usage is not None and fb.kv_usage < fa.kv_usage:
            return b
        return a

    def has_other(self, model: str, exclude: frozenset[str]) -> bool:
        """Whether a routable backend for ``model`` is left besides ``exclude``."""
        return any(b.id not in exclude and b.spec.serves(model) and b.routable() for b in self.backends.values())

    def retry_after_s(self, model: str) -> float:
        """Seconds until the first open breaker of a backend in the pool for ``model`` half-opens (what each one's
        refusal says is left of its open time), at least :data:`RETRY_AFTER_FLOOR_S`; that floor when none is
        open. Read without taking anything: a half-open breaker keeps its probes."""
        waits = [b.breaker.retry_after_s() for b in self.backends.values()
                 if b.in_pool and b.spec.serves(model)]
        return max(RETRY_AFTER_FLOOR_S, min((w for w in waits if w is not None), default=RETRY_AFTER_FLOOR_S))

    def concurrency(self) -> int:
        """The requests the routable backends take at once: the sum of their limits (at least 1)."""
        return max(1, sum(b.limit.limit for b in self.backends.values() if b.routable()))

    def token_capacity(self) -> int | None:
        """The tokens the routable backends take at once: the sum of their token limits; None while any has none
        (no bound: the requests' count alone limits them)."""
        caps = [b.limit.token_limit for b in self.backends.values() if b.routable()]
        if not caps or any(c is None for c in caps):
            return None
        return max(1, sum(c for c in caps if c is not None))

    def routable_slots(self) -> int:
        return sum(b.spec.slots for b in self.backends.values() if b.routable())

    # ---- changes ---------------------------------------------------------------------------------------------

    def set_in_pool(self, backend: Backend, in_pool: bool, why: str) -> None:
        if backend.in_pool != in_pool:
            backend.in_pool = in_pool
            if not in_pool:
                backend.removed_unix_s = time.time()
            self._changed(backend, f"{'added to' if in_pool else 'removed from'} the pool: {why}")

    def set_healthy(self, backend: Backend, healthy: bool, why: str) -> None:
        if backend.healthy != healthy:
            backend.healthy = healthy
            self._changed(backend, f"{'healthy' if healthy else 'unhealthy'}: {why}")

    def breaker_moved(self, backend: Backend, came: str, to: str) -> None:
        """``backend``'s breaker went from ``came`` to ``to``: a change of its routability where it opened or left
        open (half-open lets its probe through), one log line and one count as a health change; nothing for a
        half-open breaker that closes (routable before and after). Called under the breaker's lock (see
        :class:`BreakerReport`): it reads nothing of the breaker, and the ``on_change`` hook, which may, runs
        after it on the event loop."""
        if (came == "open") == (to == "open"):
            return
        cfg = self.config
        if to == "open":
            why = f"{cfg.breaker_failures} failures in a row" if came == "closed" else "its half-open probe failed"
            what = f"breaker open: {why}; one probe in {cfg.breaker_open_s:g} s"
        else:
            what = f"breaker half-open after {cfg.breaker_open_s:g} s open: routable for one probe"
        self._changed(backend, what, hook_later=True)

    def _changed(self, backend: Backend, what: str, *, hook_later: bool = False) -> None:
        backend.changes += 1
        log.warning("backend %s %s", backend.id, what)
        if self._on_change is None:
            return
        if not hook_later:
            self._on_change(backend, what)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a test driving the pool alone): no queue to follow the pool
            return
        loop.call_soon(self._on_change, backend, what)

    def status(self) -> list[dict[str, object]]:
        return [b.status() for b in self.backends.values()]

    # ---- health ----------------------------------------------------------------------------------------------

    async def check_health(self, backend: Backend) -> bool:
        """One health check: ``GET /health`` answered 200 within :data:`HEALTH_TIMEOUT_S`; the first one that
        passes also reads the models the backend lists (``GET /v1/models``)."""
        try:
            status, _ = await self._get(backend, "/health")
        except (UpstreamError, TimeoutError, asyncio.IncompleteReadError, OSError) as exc:
            self.set_healthy(backend, False, f"health check: {exc or type(exc).__name__}")
            return False
        ok = status == 200
        self.set_healthy(backend, ok, f"health check answered {status}")
        if ok and backend.listed is None:
            with contextlib.suppress(UpstreamError, TimeoutError, asyncio.IncompleteReadError, OSError):
                status, body = await self._get(backend, "/v1/models")
                backend.listed = _model_ids(body) if status == 200 else ()
        return ok

    async def _get(self, backend: Backend, path: str) -> tuple[int, bytes]:
        """``GET path`` on ``backend``: the status and at most :data:`MAX_SMALL_BODY` bytes of body."""
        conn, _ = await backend.upstream.acquire()
        try:
            resp = await asyncio.wait_for(send_request(conn, "GET", path, f"{backend.spec.host}:{backend.spec.port}",
                                                       b"", b""), HEALTH_TIMEOUT_S)
            if resp.length is not None:
                body = await asyncio.wait_for(conn.reader.readexactly(min(resp.length, MAX_SMALL_BODY)),
                                              HEALTH_TIMEOUT_S)
            else:
                body = b""
        except BaseException:
            conn.abort()
            raise
        if resp.length is None or resp.length > MAX_SMALL_BODY or not resp.keep_alive:
            conn.abort()
        else:
            backend.upstream.release(conn)
        return resp.status, body

    def listed_models(self) -> tuple[str, ...]:
        """The models the backends list (sorted, each once)."""
        return tuple(sorted({m for b in self.backends.values() for m in (b.listed or ())}))

    def start_health_checks(self) -> None:
        """Check every backend every ``health_interval_s`` (needs a running event loop)."""
        if self._health_task is None:
            self._health_task = asyncio.get_running_loop().create_task(self._health_loop(), name="llmslo-health")

    async def _health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self.check_health(b) for b in self.backends.values()))
            for b in list(self.backends.values()):
                b.breaker.retry_after_s()  # applies its timers: an open breaker half-opens (and says so) on time
            await asyncio.sleep(self.config.health_interval_s)

    def start_engine_reads(self) -> None:
        """Read the ``/metrics`` of every backend with an engine every ``engine_interval_s`` (needs a running
        event loop; nothing to do while no backend has one, but backends added later are read too)."""
        if self._engine_task is None:
            self._engine_task = asyncio.get_running_loop().create_task(
                read_loop(self._engine_loads, self.config.engine_interval_s), name="llmslo-engine-load")

    def _engine_loads(self) -> list[EngineLoad]:
        return [b.engine for b in self.backends.values() if b.engine is not None]

    async def close(self) -> None:
        for task in (self._health_task, self._engine_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for b in self.backends.values():
            b.upstream.close()

    # ---- drain -----------------------------------------------------------------------------------------------

    def drain_config(self, rules: Mapping[str, float | str | None] | None = None) -> DrainConfig:
        """The gateway's drain rules, those of ``rules`` (keys :data:`DRAIN_KEYS`, as :func:`drain_rules` gives
        them: None switches ``idle_s`` or ``max_inflight_s`` off) in their place."""
        cfg = self.config
        values: dict[str, object] = {
            "wait_budget_s": cfg.drain_budget_s, "unregister_settle_s": cfg.drain_settle_s,
            "idle_threshold_s": cfg.drain_idle_s, "max_inflight_s": cfg.drain_max_inflight_s,
            "on_budget": cfg.on_budget, "poll_interval_s": 0.1}
        values.update({_DRAIN_CONFIG_FIELDS[k]: v for k, v in (rules or {}).items()})
        return DrainConfig(**values)  # type: ignore[arg-type]

    def begin_drain(self, backend: Backend, on_close: Callable[[RequestTracker, str], object],
                    config: DrainConfig | None = None) -> DrainController | None:
        """Start draining ``backend`` (None: it is draining already)."""
        if backend.drain is not None and backend.drain.phase in ("settling", "waiting"):
            return None
        drain = DrainController(BackendDrain(self, backend, self.tel), config or self.drain_config(),
                                on_close=on_close)
        backend.drain = drain
        drain.begin(from_version=backend.spec.version)
        return drain

    async def run_drain(self, backend: Backend, drain: DrainController) -> DrainRecord:
        """Drive ``backend``'s drain to its end; the record (kept as ``backend.last_drain``)."""
        record = await drain.run()
        backend.last_drain = record
        log.warning("backend %s drained: %s in %.2f s, %d in flight at start, %d terminated, decision %s",
                    backend.id, record.decision, record.actual_drain_s, record.in_flight_at_start,
                    record.terminated, record.decision)
        return record

    def undrain(self, backend: Backend) -> None:
        """Put a drained backend back in the pool."""
        self.set_in_pool(backend, True, "returned by the admin API")
