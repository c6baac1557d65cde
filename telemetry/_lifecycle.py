"""The request lifecycle: one tracker per request, exactly one terminal state, cleanup exactly once.

A server creates a :class:`Telemetry` once and a :class:`RequestTracker` per request (directly, with the
``request()`` context manager or the ``instrument()`` decorator). The tracker records monotonic
timestamps (nanoseconds, ``time.monotonic_ns`` unless injected): arrival, admitted, scheduled, every token
commit, and the terminal state. Several finish signals may race (deadline, client cancel, backend error,
drain) from threads or asyncio tasks: the first to commit under the tracker's lock wins, every later one
is a no-op counted by reason. The winner releases the registered resources in reverse order (each once,
even when one raises), then emits one request summary, updates the metrics and ends the trace span.

Every entry point is guarded: an exception inside llmslo is caught, counted and logged (rate-limited),
never raised into the server.

On the per-request path locks are taken with ``acquire()`` and released in ``finally`` rather than with
``with lock:``: the same guarantee at about half the cost on CPython 3.11 (measured here: 195 against 437 ns).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ParamSpec, Protocol, TypeVar

from prometheus_client import CollectorRegistry

from llmslo.telemetry import _names as N
from llmslo.telemetry._errors import ConfigurationError
from llmslo.telemetry._guard import Guard
from llmslo.telemetry._labels import LabelPolicy
from llmslo.telemetry._metrics import EXEMPLAR_MAX_CHARS, TelemetryMetrics, exemplar_labels
from llmslo.telemetry._policy import SloPolicy
from llmslo.telemetry._summary import FINISH_REASONS, REJECT_REASONS, tpot_s
from llmslo.telemetry._tokenlog import TokenLogLike, token_log_factory

P = ParamSpec("P")
R = TypeVar("R")

SummaryRow = dict[str, object]
Sink = Callable[[SummaryRow], object]

_EXEMPLAR_ID_CHARS = EXEMPLAR_MAX_CHARS - len("request_id")

_CURRENT: contextvars.ContextVar[RequestTracker | None] = contextvars.ContextVar("llmslo_tracker", default=None)


def current_tracker() -> RequestTracker | None:
    """The tracker of the request handled in this context (set by ``request()`` and ``instrument()``)."""
    return _CURRENT.get()


class Tracing(Protocol):
    """What the lifecycle needs from a tracer (see :class:`llmslo.telemetry.RequestTracing`)."""

    def start_request(self, tracker: RequestTracker) -> object: ...

    def trace_id(self, span: object) -> str | None: ...

    def end_request(self, span: object, tracker: RequestTracker, row: Mapping[str, object],
                    tpot: float | None) -> None: ...


class RequestJournal(Protocol):
    """What the lifecycle needs from a write-ahead journal (see :class:`llmslo.telemetry.Journal`)."""

    def open_request(self, request_id: str, arrival_unix_s: float, model: str, version: str, tenant_class: str,
                     prompt_tokens: int | None = None,
                     progress: Callable[[], Sequence[object]] | None = None) -> None: ...

    def end_request(self, request_id: str) -> None: ...

    def close_request(self, request_id: str) -> None: ...

    def close_rows(self, rows: Iterable[Mapping[str, object]]) -> None: ...


class Telemetry:
    """The telemetry of one server process: configuration, metrics, summary sink, tracing.

    Parameters (all keyword-only):

    - ``registry``: the prometheus-client registry to expose the metrics on (a fresh one when ``None``).
    - ``buckets``: bucket bounds in seconds per interval, overriding the defaults.
    - ``labels``: a :class:`LabelPolicy` bounding label values.
    - ``policies``: the goodput policies (:class:`SloPolicy`), one per SLO class; the first is the default.
    - ``sink``: a callable receiving each request summary (a dict), e.g. a :class:`SummarySink`. A sink
      with an ``attach(telemetry)`` method is attached here: a :class:`SummarySink` then counts its drops on
      ``llmslo_summaries_dropped_total`` and its write failures on ``llmslo_internal_errors_total``.
    - ``tracing``: a tracer (e.g. :class:`RequestTracing`) or ``None``; one with ``attach(telemetry)`` is
      attached here (a :class:`RequestTracing` merges the policies' thresholds into its bucket advisories).
    - ``journal``: a write-ahead journal of the requests (e.g. a :class:`Journal`) or ``None``. Each tracker
      opens an entry at arrival (with a progress callable the journal reads on its own thread), ends it when
      its summary is handed to the sink, and closes it once the summary is written: when the sink tells (a
      :class:`SummarySink` does, through ``on_settled``), else at once. After a crash the entries left
      open become summary rows (:func:`recover_journal`). One with ``attach(telemetry)`` is attached here.
    - ``version``: the server or model version recorded in every summary.
    - ``record_itl``: also put the token-weighted ITL gaps (seconds) into each summary's ``itl_s``.
    - ``clock_ns`` (monotonic nanoseconds) and ``clock_unix_s`` (wall-clock seconds): injectable clocks.

    Raises :class:`ConfigurationError` naming the field for an invalid configuration.

    Example::

        tel = Telemetry(policies=[SloPolicy(ttft_s=2.0, tpot_s=0.1)], version="v1")
        t = tel.start("req-1", model="llama", prompt_tokens=42)
        t.admit(); t.schedule()
        for _ in range(3):
            t.commit(); t.send()
        t.finish("stop")
    """

    def __init__(self, *, registry: CollectorRegistry | None = None,
                 buckets: Mapping[str, Sequence[float]] | None = None,
                 labels: LabelPolicy | None = None,
                 policies: Sequence[SloPolicy] = (SloPolicy(),),
                 sink: Sink | None = None,
                 tracing: Tracing | None = None,
                 journal: RequestJournal | None = None,
                 version: str = "unknown",
                 record_itl: bool = False,
                 clock_ns: Callable[[], int] = time.monotonic_ns,
                 clock_unix_s: Callable[[], float] = time.time,
                 guard: Guard | None = None) -> None:
        if isinstance(policies, SloPolicy):
            policies = (policies,)
        if not policies:
            raise ConfigurationError("Telemetry.policies: needs at least one SloPolicy")
        for p in policies:
            if not isinstance(p, SloPolicy):
                raise ConfigurationError(f"Telemetry.policies: expected SloPolicy objects, got {p!r}")
        names = [p.name for p in policies]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"Telemetry.policies: policy names must be unique, got {names}")
        if not isinstance(version, str) or not version:
            raise ConfigurationError("Telemetry.version: must be a non-empty string")
        if sink is not None and not callable(sink):
            raise ConfigurationError("Telemetry.sink: must be callable with one summary dict")
        if journal is not None and not all(callable(getattr(journal, m, None))
                                           for m in ("open_request", "end_request", "close_request", "close_rows")):
            raise ConfigurationError("Telemetry.journal: expected a Journal (open_request, end_request, "
                                     f"close_request and close_rows), got {journal!r}")
        self.policies: dict[str, SloPolicy] = {p.name: p for p in policies}
        # the (slo_class, good) pairs a finished request reports, made once: indexed [name][good]
        self._verdict_keys: dict[str, tuple[tuple[tuple[str, bool]], tuple[tuple[str, bool]]]] = {
            p.name: (((p.name, False),), ((p.name, True),)) for p in policies}
        self.default_policy = policies[0]
        self.metrics = TelemetryMetrics(registry=registry, buckets=buckets, labels=labels, policies=policies,
                                        clock_unix_s=clock_unix_s)
        self.registry = self.metrics.registry
        self.sink = sink
        self.tracing = tracing
        self.journal = journal
        self._journal_at_finish = False
        """Whether a tracker closes its journal entry at its terminal state (the sink does not tell when it
        wrote a summary)."""
        self.version = version
        self.record_itl = record_itl
        self.clock_ns = clock_ns
        self._new_token_log = token_log_factory(clock_ns)
        self.clock_unix_s = clock_unix_s
        self.guard = guard if guard is not None else Guard()
        self.guard.on_error = lambda site: self.metrics.count(N.INTERNAL_ERRORS.key)
        self.guard.on_drop = lambda reason, n: self.metrics.count(N.OBSERVATIONS_DROPPED.key, {"reason": reason}, n)
        # Trackers not yet terminal. Single dict operations are atomic in CPython, so adding and removing need
        # no lock; readers take a copy.
        self._live: dict[int, RequestTracker] = {}
        self._draining = False
        try:  # a RequestTracing sizes its buckets by the policies (it may refuse), a SummarySink counts here
            for part in (tracing, sink, journal):
                attach = getattr(part, "attach", None)
                if callable(attach):
                    attach(self)
            if journal is not None:
                on_settled = getattr(sink, "on_settled", None)
                if callable(on_settled):
                    on_settled(journal.close_rows)  # closed once written (or counted dropped) by the sink
                else:
                    self._journal_at_finish = True
        except BaseException:
            self.registry.unregister(self.metrics)  # a refused configuration leaves the registry as it was
            raise

    # ---- requests ----------------------------------------------------------------------------------------

    def start(self, request_id: str, *, model: str, version: str | None = None, tenant_class: str = "default",
              prompt_tokens: int = 0, slo_class: str | None = None) -> RequestTracker:
        """A tracker for a request that arrives now. Never raises (a bad argument is recorded as an error)."""
        return RequestTracker(self, request_id, model, version or self.version, tenant_class, prompt_tokens,
                              slo_class)

    def request(self, request_id: str | None = None, *, model: str, version: str | None = None,
                tenant_class: str = "default", prompt_tokens: int = 0, slo_class: str | None = None,
                admit: bool = True) -> RequestScope:
        """A context manager (``with`` or ``async with``) tracking one request.

        On a normal exit the request finishes ``stop`` unless it already has a terminal state (then the exit
        signals nothing, so nothing is counted as ignored); on cancellation
        (``asyncio.CancelledError``, ``GeneratorExit``) ``client_cancel``; on an exception ``error`` with the
        exception's class name as ``error_type``. The exception is never swallowed.

        Example::

            async with tel.request("req-1", model="llama") as t:
                async for token in engine.generate(prompt):
                    t.commit(); await send(token); t.send()
        """
        rid = request_id if request_id is not None else uuid.uuid4().hex
        return RequestScope(self, dict(request_id=rid, model=model, version=version, tenant_class=tenant_class,
                                       prompt_tokens=prompt_tokens, slo_class=slo_class), admit)

    def instrument(self, *, model: str, request_id: Callable[..., str] | None = None,
                   tenant_class: str = "default", slo_class: str | None = None
                   ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Decorate a (sync or async) handler so each call runs inside ``request()``.

        ``request_id`` computes the id from the handler's arguments (a random id when ``None``). Inside,
        :func:`current_tracker` gives the tracker.
        """
        def decorate(fn: Callable[P, R]) -> Callable[P, R]:
            def rid(*args: Any, **kwargs: Any) -> str | None:
                if request_id is None:
                    return None
                try:
                    return str(request_id(*args, **kwargs))
                except Exception as exc:
                    self.guard.error("instrument.request_id", exc)
                    return None

            if inspect.iscoroutinefunction(fn):
                @functools.wraps(fn)
                async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                    async with self.request(rid(*args, **kwargs), model=model, tenant_class=tenant_class,
                                            slo_class=slo_class):
                        return await fn(*args, **kwargs)
                return async_wrapper  # type: ignore[return-value]

            @functools.wraps(fn)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
                with self.request(rid(*args, **kwargs), model=model, tenant_class=tenant_class,
                                  slo_class=slo_class):
                    return fn(*args, **kwargs)
            return wrapper

        return decorate

    # ---- server state ------------------------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        """Whether the server drains (new requests should be rejected with ``draining``)."""
        return self._draining

    def begin_drain(self) -> None:
        """Mark the server draining (gauge 1); streams ended by their policy then finish ``server_draining``."""
        self._draining = True
        self._safe(lambda: self.metrics.gauge_set(N.DRAINING.key, None, 1.0), "begin_drain")

    def end_drain(self) -> None:
        """Mark the server no longer draining (gauge 0)."""
        self._draining = False
        self._safe(lambda: self.metrics.gauge_set(N.DRAINING.key, None, 0.0), "end_drain")

    def in_flight(self) -> list[RequestTracker]:
        """The trackers not yet at their terminal state."""
        return list(self._live.copy().values())

    def finish_all(self, reason: str = "server_draining") -> int:
        """Finish every in-flight request with ``reason`` (e.g. when the drain budget is spent); how many won."""
        return sum(1 for t in self.in_flight() if t.finish(reason))

    def set_queue_capacity(self, model: str, capacity: int) -> None:
        """Expose the capacity of the bounded request queue of ``model`` (requests)."""
        self._safe(lambda: self.metrics.gauge_set(N.QUEUE_CAPACITY.key, {"model": model}, capacity), "queue_capacity")

    def set_breaker_state(self, breaker: str, state: str) -> None:
        """Expose the state (``closed``, ``half_open``, ``open``) of circuit breaker ``breaker``."""
        self._safe(lambda: self.metrics.set_breaker_state(breaker, state), "breaker_state")

    # ---- serving controls (llmslo.controls reports through these; each never raises) -------------------

    def observe_retry_after(self, model: str, reject_reason: str, seconds: float) -> None:
        """Observe the ``Retry-After`` given to a request of ``model`` refused with ``reject_reason``, seconds.

        A NaN, infinite or negative value is dropped and counted by reason; a value that is not a number
        counts an internal error.
        """
        self._safe(lambda: self._observe(N.RETRY_AFTER.key, {"model": model, "reject_reason": reject_reason},
                                         seconds), "retry_after")

    def count_breaker_transition(self, breaker: str, from_state: str, to_state: str) -> None:
        """Count one change of circuit breaker ``breaker`` from ``from_state`` to ``to_state`` (``closed``,
        ``half_open``, ``open``; any other state is exposed as ``other``)."""
        self._safe(lambda: self.metrics.count(N.BREAKER_TRANSITIONS.key, {
            "breaker": breaker, "from_state": from_state, "to_state": to_state}), "breaker_transition")

    def count_shed(self, model: str, signal: str, tenant_class: str) -> None:
        """Count one request of ``model`` and ``tenant_class`` shed by ``signal`` (``queue``, ``latency``,
        ``gpu``). The request itself is rejected ``queue_full`` through its tracker."""
        self._safe(lambda: self.metrics.count(N.SHED_REQUESTS.key, {
            "model": model, "signal": signal, "tenant_class": tenant_class}), "shed")

    def count_degraded(self, model: str, action: str) -> None:
        """Count one request of ``model`` served degraded by ``action`` (the server's name for it, e.g.
        ``cap_max_tokens``; bounded by the label policy) instead of being rejected."""
        self._safe(lambda: self.metrics.count(N.DEGRADED_REQUESTS.key, {"model": model, "action": action}),
                   "degraded")

    def count_rate_limit_store_error(self, fail_mode: str) -> None:
        """Count one rate-limit decision taken without the shared store, under ``fail_mode`` (``open``:
        admitted, ``closed``: refused)."""
        self._safe(lambda: self.metrics.count(N.RATE_LIMIT_STORE_ERRORS.key, {"fail_mode": fail_mode}),
                   "rate_limit_store_error")

    def observe_drain(self, duration_s: float) -> None:
        """Observe the duration of one completed drain, seconds (dropped and counted when NaN, infinite or
        negative)."""
        self._safe(lambda: self._observe(N.DRAIN_DURATION.key, None, duration_s), "drain_duration")

    def count_drain_closed(self, reason: str, n: int = 1) -> None:
        """Count ``n`` streams closed by the drain controller for ``reason`` (``idle``, ``max_inflight``,
        ``budget_exhausted``). An ``n`` that is not a non-negative integer is dropped as ``invalid_count``."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            self.guard.drop("invalid_count")
            return
        self._safe(lambda: self.metrics.count(N.DRAIN_CLOSED_STREAMS.key, {"reason": reason}, n), "drain_closed")

    def _observe(self, key: str, labels: Mapping[str, str] | None, value: float) -> None:
        """Observe a timing on a fixed-bound histogram once the guard accepts it (raises for a non-number)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{N.METRICS_BY_KEY[key].name}: expected seconds as a number, got {value!r}")
        checked = self.guard.timing(float(value))
        if checked is not None:
            self.metrics.observe(key, labels, checked)

    def _safe(self, fn: Callable[[], object], site: str) -> None:
        try:
            fn()
        except Exception as exc:
            self.guard.error(site, exc)


class RequestScope:
    """The context manager returned by :meth:`Telemetry.request` (sync and async)."""

    def __init__(self, tel: Telemetry, kwargs: dict[str, Any], admit: bool) -> None:
        self._tel = tel
        self._kwargs = kwargs
        self._admit = admit
        self._token: contextvars.Token[RequestTracker | None] | None = None
        self.tracker: RequestTracker | None = None

    def __enter__(self) -> RequestTracker:
        t = self._tel.start(**self._kwargs)
        if self._admit:
            t.admit()
        self.tracker = t
        self._token = _CURRENT.set(t)
        return t

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        t = self.tracker
        if self._token is not None:
            with contextlib.suppress(ValueError):  # exited in another context (a generator closed elsewhere)
                _CURRENT.reset(self._token)
        if t is None:
            return
        if et is None:
            if not t.done:  # a normal exit is no signal of its own: it only ends a request still open
                t.finish("stop")
        elif issubclass(et, (asyncio.CancelledError, GeneratorExit, KeyboardInterrupt)):
            t.finish("client_cancel")
        else:
            t.finish("error", error_type=et.__name__)

    async def __aenter__(self) -> RequestTracker:
        return self.__enter__()

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.__exit__(et, exc, tb)


class RequestTracker:
    """One request's lifecycle. Create it with :meth:`Telemetry.start`.

    Timestamps are monotonic nanoseconds. The per-token hot path is two calls, each a single native call
    when the token log's C module is built (see ``_tokenlog.py``), and neither ever raises:

    - ``commit(k=1, proposed=0)``: the engine committed ``k`` output tokens now (``proposed``: draft tokens
      proposed for them). It records one timestamp; a commit of ``k`` tokens gives ``k`` token-weighted
      ITL samples of ``gap / k`` at the terminal state.
    - ``send(n=1)``: ``n`` output tokens were handed to the transport for the client.

    A count that is not a non-negative integer (``k`` from 1 to 2**20) is ignored and counted as a dropped
    observation (reason ``invalid_count``) at the terminal state. After the terminal state,
    :attr:`summary` holds the request summary and :attr:`ignored` the later finish signals counted by reason.
    """

    __slots__ = (
        "_clock", "_labels", "_lock", "_log", "_model_key", "_resources", "_span", "_tel", "admitted_ns", "arrival_ns",
        "arrival_unix_s", "backend", "client_ttft_s", "commit", "commit_plain", "error_type", "expect_plain",
        "finish_ns", "finish_reason", "ignored", "model", "prompt_tokens", "reject_reason", "released", "request_id",
        "scheduled_ns", "send", "slo_class", "stream_max_queued", "stream_paused_ns", "summary", "tenant_class",
        "version",
    )

    commit: Callable[..., None]
    """``commit(k=1, proposed=0)``: ``k`` output tokens committed now (see the class docstring)."""
    send: Callable[..., None]
    """``send(n=1)``: ``n`` output tokens handed to the transport for the client."""
    expect_plain: Callable[[bytes | None, bytes], None]
    """``expect_plain(prefix, suffix)``: the bytes around the text of the stream's plain content chunks (None:
    none); see ``_tokenlog.py``."""
    commit_plain: Callable[[object], bool]
    """``commit_plain(body)``: whether ``body`` is a plain content chunk of that shape; then one token is committed
    now. The per-chunk shortcut of a streamed reply (``_reply_observer.py``)."""

    def __init__(self, tel: Telemetry, request_id: str, model: str, version: str, tenant_class: str,
                 prompt_tokens: int, slo_class: str | None) -> None:
        self._tel = tel
        self._clock = tel.clock_ns
        self.arrival_ns = self._clock()
        self.arrival_unix_s = tel.clock_unix_s()
        log = self._log = tel._new_token_log()
        self.commit = log.commit
        self.send = log.send
        self.expect_plain = log.expect_plain
        self.commit_plain = log.commit_plain
        self._lock = tel.metrics.lock  # shared: see TelemetryMetrics.lock
        self._resources: list[tuple[str, Callable[[], object]]] = []
        self._span: object = None
        self.request_id = request_id if isinstance(request_id, str) and request_id else uuid.uuid4().hex
        self.model = model if isinstance(model, str) and model else "unknown"
        self.version = version
        self.tenant_class = tenant_class if isinstance(tenant_class, str) and tenant_class else "default"
        self.prompt_tokens = prompt_tokens if isinstance(prompt_tokens, int) and prompt_tokens >= 0 else 0
        self.slo_class = slo_class if slo_class in tel.policies else tel.default_policy.name
        labels = self._labels = tel.metrics.request_labels(self.model, version, self.tenant_class)
        self._model_key = labels[:1]  # the per-model gauges' label values
        self.admitted_ns: int | None = None
        self.scheduled_ns: int | None = None
        self.finish_ns: int | None = None
        self.finish_reason: str | None = None
        self.reject_reason: str | None = None
        self.error_type: str | None = None
        self.client_ttft_s: float | None = None
        self.stream_paused_ns = 0
        self.stream_max_queued = 0
        self.backend: str | None = None
        """The backend a gateway routed the request to (:meth:`route`); None without one."""
        self.ignored: dict[str, int] = {}
        self.released = 0
        self.summary: SummaryRow | None = None
        tel._live[id(self)] = self
        journal = tel.journal
        if journal is not None:
            try:
                journal.open_request(self.request_id, self.arrival_unix_s, self.model, version, self.tenant_class,
                                     self.prompt_tokens, self.journal_progress)
            except Exception as exc:
                tel.guard.error("journal.open", exc)
        if tel.tracing is not None:
            try:
                self._span = tel.tracing.start_request(self)
            except Exception as exc:
                tel.guard.error("tracing.start", exc)

    # ---- phases ----------------------------------------------------------------------------------------

    def admit(self) -> None:
        """Admission control accepted the request (it now counts in flight and queued)."""
        try:
            now = self._clock()
            lock = self._lock
            lock.acquire()
            try:
                if self.finish_reason is None and self.admitted_ns is None:
                    self.admitted_ns = now
                    self._tel.metrics.admitted_locked(self._model_key)
            finally:
                lock.release()
        except Exception as exc:
            self._tel.guard.error("admit", exc)

    def schedule(self) -> None:
        """The request joined a batch (the first call counts; later preemptions do not move it)."""
        try:
            now = self._clock()
            lock = self._lock
            lock.acquire()
            try:
                if self.finish_reason is None and self.scheduled_ns is None:
                    self.scheduled_ns = now
                    if self.admitted_ns is not None:
                        self._tel.metrics.scheduled_locked(self._model_key)
            finally:
                lock.release()
        except Exception as exc:
            self._tel.guard.error("schedule", exc)

    def report_client_ttft(self, seconds: float) -> None:
        """The client reported its time to first token (seconds, client clock); bad values are dropped."""
        try:
            self.client_ttft_s = self._tel.guard.timing(float(seconds))
        except Exception as exc:
            self._tel.guard.error("client_ttft", exc)

    def add_resource(self, release: Callable[[], object], name: str = "resource") -> None:
        """Register something to release at the terminal state (released in reverse order, exactly once).

        Registered after the terminal state, it is released at once.
        """
        try:
            with self._lock:
                if self.finish_reason is None:
                    self._resources.append((name, release))
                    return
            self._release([(name, release)])
        except Exception as exc:
            self._tel.guard.error("add_resource", exc)

    def trace_id(self) -> str | None:
        """The trace id of this request's span (hex), or ``None`` without tracing."""
        tracing = self._tel.tracing
        if tracing is None or self._span is None:
            return None
        try:
            return tracing.trace_id(self._span)
        except Exception as exc:
            self._tel.guard.error("tracing.trace_id", exc)
            return None

    def route(self, backend: str, version: str) -> None:
        """A gateway routed the request to ``backend``, an instance of ``version``, after it arrived: its summary
        carries both, its finished-request metrics the version. Ignored after the terminal state."""
        if self.finish_reason is not None or not isinstance(version, str) or not version:
            return
        self.backend = backend if isinstance(backend, str) and backend else None
        self.version = version
        self._labels = self._tel.metrics.request_labels(self.model, version, self.tenant_class)

    @property
    def exposed_model(self) -> str:
        """The model as the metrics expose it (``other`` beyond the label policy's bound)."""
        return self._model_key[0]

    def record_error(self, site: str, exc: BaseException) -> None:
        """Count and (rate-limited) log an exception caught at ``site`` by code working for this request."""
        self._tel.guard.error(site, exc)

    @property
    def span(self) -> object:
        """The request's span when tracing (an OpenTelemetry span), else ``None``."""
        return self._span

    @property
    def done(self) -> bool:
        """Whether the terminal state is committed."""
        return self.finish_reason is not None

    @property
    def generated_tokens(self) -> int:
        """Output tokens committed so far."""
        log = self._log
        return log.generated(len(log))

    @property
    def sent_tokens(self) -> int:
        """Output tokens handed to the transport so far (as counted by ``send``)."""
        return self._log.sent

    @property
    def proposed_tokens(self) -> int:
        """Draft tokens proposed so far (as counted by ``commit``)."""
        return self._log.proposed

    def journal_progress(self) -> tuple[int, int, int, float | None, float | None, float | None]:
        """How far the request got, for a journal (read on its thread): prompt tokens, output tokens
        generated and sent, and seconds since arrival to scheduled, first token and latest token (None where
        not reached; the queue time never exceeds the first token's, as in the summary)."""
        log = self._log
        n = len(log)
        generated = log.generated(n)
        a = self.arrival_ns
        first = (log.time_ns(0) - a) / 1e9 if n else None
        last = (log.time_ns(n - 1) - a) / 1e9 if n else None
        scheduled = self.scheduled_ns
        queue = (scheduled - a) / 1e9 if scheduled is not None else None
        if queue is not None and first is not None and queue > first:
            queue = first
        return self.prompt_tokens, generated, min(log.sent, generated), queue, first, last

    # ---- the terminal state ------------------------------------------------------------------------------

    def reject(self, reason: str) -> bool:
        """Admission control refused the request (``queue_full``, ``rate_limited``, ``circuit_open``,
        ``draining``). Terminal; returns whether this call committed it."""
        if reason not in REJECT_REASONS:
            self._tel.guard.error("reject.reason", ValueError(f"unknown reject reason {reason!r}"))
            return self.finish("error", error_type="invalid_reject_reason")
        return self._terminate("rejected", None, reason)

    def finish(self, reason: str, *, error_type: str | None = None) -> bool:
        """Commit the terminal state ``reason`` (one of the finish reasons) unless one is already committed.

        Returns ``True`` when this call won, ``False`` when it was a no-op (counted by reason). Never raises.
        """
        if reason == "rejected":
            return self.reject("queue_full" if error_type is None else error_type)
        if reason not in FINISH_REASONS:
            self._tel.guard.error("finish.reason", ValueError(f"unknown finish reason {reason!r}"))
            return self._terminate("error", "invalid_finish_reason", None)
        return self._terminate(reason, error_type if reason == "error" else None, None)

    def _terminate(self, reason: str, error_type: str | None, reject_reason: str | None) -> bool:
        tel = self._tel
        try:
            now = self._clock()
            self._lock.acquire()
            try:
                if self.finish_reason is not None:
                    self.ignored[reason] = self.ignored.get(reason, 0) + 1
                    won = False
                else:
                    self.finish_reason = reason
                    self.finish_ns = now
                    self.error_type = (error_type or "unknown")[:64] if reason == "error" else None
                    self.reject_reason = reject_reason
                    resources, self._resources = self._resources, []
                    won = True
            finally:
                self._lock.release()
        except Exception as exc:
            tel.guard.error("finish", exc)
            return False
        if not won:
            try:
                tel.metrics.count(N.TERMINAL_SIGNALS_IGNORED.key, {"model": self.model, "finish_reason": reason})
            except Exception as exc:
                tel.guard.error("finish.ignored", exc)
            return False
        tel._live.pop(id(self), None)
        if resources:
            self._release(resources)
        try:
            self._complete(now)
        except Exception as exc:
            tel.guard.error("finish.summary", exc)
        return True

    def _release(self, resources: list[tuple[str, Callable[[], object]]]) -> None:
        for name, release in reversed(resources):
            try:
                self.released += 1
                release()
            except Exception as exc:
                self._tel.guard.error(f"release:{name}"[:80], exc)

    def _complete(self, finish_ns: int) -> None:
        tel = self._tel
        m = tel.metrics
        log: TokenLogLike = self._log
        n = log.count_until(finish_ns)
        generated = log.generated(n)
        if log.invalid:
            tel.guard.drop("invalid_count", log.invalid)
        a = self.arrival_ns
        ttft = (log.time_ns(0) - a) / 1e9 if n else None
        last = (log.time_ns(n - 1) - a) / 1e9 if n else None
        queue = None
        if self.scheduled_ns is not None:
            queue = (self.scheduled_ns - a) / 1e9
            if ttft is not None and queue > ttft:
                queue = ttft
        sent = min(log.sent, generated)
        e2e = (finish_ns - a) / 1e9
        row: SummaryRow = {
            "request_id": self.request_id,
            "model": self.model,
            "version": self.version,
            "tenant_class": self.tenant_class,
            "arrival_unix_s": self.arrival_unix_s,
            "finish_reason": self.finish_reason,
            "reject_reason": self.reject_reason,
            "error_type": self.error_type,
            "queue_s": queue,
            "ttft_s": ttft,
            "last_token_s": last,
            "e2e_s": e2e,
            "prompt_tokens": self.prompt_tokens,
            "proposed_tokens": log.proposed,
            "generated_tokens": generated,
            "sent_tokens": sent,
            "client_ttft_s": self.client_ttft_s,
            "stream_paused_s": self.stream_paused_ns / 1e9,
            "stream_max_queued": self.stream_max_queued,
        }
        if self.backend is not None:
            row["backend"] = self.backend
        itl = log.itl(n, m.itl_bounds_ns)
        if tel.record_itl:
            row["itl_s"] = log.gaps_s(n) if n >= 2 else None
        tpot = tpot_s(ttft, last, generated)
        self.summary = row
        policy = tel.policies[self.slo_class]
        reason = self.finish_reason or "error"
        good = policy.verdict(reason, ttft, tpot, generated, e2e)
        rid = self.request_id
        ex = (exemplar_labels(rid, self.trace_id()) if self._span is not None
              else {"request_id": rid if len(rid) <= _EXEMPLAR_ID_CHARS else rid[:_EXEMPLAR_ID_CHARS]})
        m.record_finished((self._labels,
                           (reason, self.reject_reason, tel._verdict_keys[policy.name][good]),
                           (ttft, e2e, queue, self.client_ttft_s), tpot, itl,
                           (self.prompt_tokens, log.proposed, generated, sent), ex, tel.clock_unix_s()),
                          self.admitted_ns is not None, self.scheduled_ns is not None)
        journal = tel.journal
        if journal is not None and not tel._journal_at_finish:
            try:  # in flight no more: a crash before the sink writes the row recovers it with the time before
                journal.end_request(rid)
            except Exception as exc:
                tel.guard.error("journal.end", exc)
        if tel.sink is not None:
            try:
                tel.sink(row)
            except Exception as exc:
                tel.guard.error("sink", exc)
        if journal is not None and tel._journal_at_finish:
            try:
                journal.close_request(rid)
            except Exception as exc:
                tel.guard.error("journal.close", exc)
        if tel.tracing is not None and self._span is not None:
            try:
                tel.tracing.end_request(self._span, self, row, tpot)
            except Exception as exc:
                tel.guard.error("tracing.end", exc)

    def timeline_ns(self) -> dict[str, int | None]:
        """The phase timestamps (monotonic ns): arrival, admitted, scheduled, first/last token, finish."""
        log = self._log
        n = len(log)
        return {"arrival": self.arrival_ns, "admitted": self.admitted_ns, "scheduled": self.scheduled_ns,
                "first_token": log.time_ns(0) if n else None, "last_token": log.time_ns(n - 1) if n else None,
                "finish": self.finish_ns}

