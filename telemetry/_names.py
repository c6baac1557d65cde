"""The metric name catalogue: every metric and recording rule llmslo exposes, in one place.

Instruments, generated rules and dashboards all read their names here; no metric name is written as a
literal anywhere else. Standard library only.

Conventions (checked by the test suite):

- metric names are ``llmslo_<what>_<unit>`` in base units (``seconds``, ``bytes``, ``tokens``, ``requests``),
  counters end in ``_total`` and no metric name holds a colon;
- recording rules are ``llmslo:<what>:<operation>`` where a windowed rule ends in ``_rate<window>``
  (``llmslo:slo_error:ratio_rate5m``);
- every label declares its values: a closed set (``finish_reason``, ``reject_reason``) or an open set with a
  bound on how many distinct values one process may expose (``model``, ``version``); a value beyond the
  bound is exposed as :data:`OVERFLOW_VALUE`;
- histogram buckets are in seconds and ``+Inf`` is implied: the per-request latencies take the defaults of
  :mod:`llmslo.telemetry._buckets` (overridable per :class:`~llmslo.telemetry.Telemetry`); the histograms of
  the serving controls (``Retry-After`` given, drain duration) have fixed bounds declared here, chosen from
  their domain (see :data:`RETRY_AFTER_BUCKETS_S` and :data:`DRAIN_DURATION_BUCKETS_S`).

:attr:`Metric.name` is the name as it appears in Prometheus queries (with ``_total`` for counters); a client
library that appends ``_total`` itself takes :attr:`Metric.instrument_name`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from llmslo.telemetry._buckets import DEFAULT_BUCKETS_S
from llmslo.telemetry._summary import FINISH_REASONS, REJECT_REASONS

MetricType = Literal["counter", "gauge", "histogram"]

OVERFLOW_VALUE = "other"
"""The value an open label takes once its bound of distinct values is reached."""

BREAKER_STATES: tuple[str, ...] = ("closed", "half_open", "open")
"""States of a circuit breaker, exposed one-hot on :data:`BREAKER_STATE` (1 for the current state)."""

SUMMARY_DROP_REASONS: tuple[str, ...] = ("queue_full", "store_error")
"""Why a request summary never reached the store."""

OBSERVATION_DROP_REASONS: tuple[str, ...] = ("nan", "infinite", "negative", "invalid_count")
"""Why a timing handed to the telemetry was dropped instead of observed."""

SHED_SIGNALS: tuple[str, ...] = ("gpu", "latency", "queue")
"""What made load shedding refuse a request: queue length, recent p99 latency, or a GPU utilisation reading."""

RATE_LIMIT_FAIL_MODES: tuple[str, ...] = ("closed", "open")
"""What a rate limiter does while its shared store (Redis) is unreachable: admit (``open``) or refuse
(``closed``)."""

DRAIN_CLOSE_REASONS: tuple[str, ...] = ("budget_exhausted", "idle", "max_inflight")
"""Why the drain controller closed a stream: idle for its threshold, alive for its maximum, or the drain's
wait budget ran out (the stream was terminated)."""

RETRY_AFTER_BUCKETS_S: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Bounds of the ``Retry-After`` histogram, seconds. The header carries whole seconds (RFC 9110), so a
computed value is at least about a second; 0.5 s still separates sub-second hints before rounding. The
controls bound their hints: a queue's drain-rate estimate gives seconds to tens of seconds, a token bucket
refills within its window (a minute for per-minute limits), an open breaker's cool-down is tens of seconds
to a few minutes; 300 s is a ceiling no client should be asked to wait beyond, so ``+Inf`` only counts
misconfiguration."""

DRAIN_DURATION_BUCKETS_S: tuple[float, ...] = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
"""Bounds of the drain-duration histogram, seconds. A drain lasts the discovery settle time (seconds) plus
the longest in-flight stream: a few seconds for short chats, tens of seconds to minutes for long generations;
wait budgets are set below the caller's timeout (30 s to 10 min) and Kubernetes' default grace period is
30 s. 1800 s bounds the longest budget seen in practice (half-hour batch jobs)."""


@dataclass(frozen=True)
class Label:
    """A metric label and the values it may take.

    ``values`` closes the set (any other value is a bug in llmslo or the server); ``None`` declares an open
    set bounded by ``max_values`` distinct values per process, beyond which the value is
    :data:`OVERFLOW_VALUE`.
    """

    name: str
    doc: str
    values: tuple[str, ...] | None = None
    max_values: int = 0

    @property
    def closed(self) -> bool:
        """Whether the label takes its values from a fixed set."""
        return self.values is not None

    @property
    def bound(self) -> int:
        """The most distinct values one process exposes for this label (overflow value included)."""
        return len(self.values) if self.values is not None else self.max_values + 1


LABELS: Mapping[str, Label] = {
    label.name: label
    for label in (
        Label("model", "served model name", max_values=16),
        Label("version", "server or model version (two or three serve together during a rollout)", max_values=8),
        Label("tenant_class", "tenant or priority class, e.g. interactive or batch", max_values=8),
        Label("slo_class", "name of the goodput policy the verdict was computed under", max_values=8),
        Label("finish_reason", "terminal state of the request", values=FINISH_REASONS),
        Label("reject_reason", "why admission control refused the request", values=REJECT_REASONS),
        Label("breaker", "the circuit breaker (one per upstream or route)", max_values=16),
        Label("state", "circuit-breaker state", values=BREAKER_STATES),
        Label("from_state", "circuit-breaker state before a transition", values=BREAKER_STATES),
        Label("to_state", "circuit-breaker state after a transition", values=BREAKER_STATES),
        Label("signal", "the load signal that made shedding refuse a request", values=SHED_SIGNALS),
        Label("action", "the degradation the server applied instead of a rejection, e.g. cap_max_tokens",
              max_values=8),
        Label("fail_mode", "what a rate limiter does while its shared store is unreachable",
              values=RATE_LIMIT_FAIL_MODES),
        Label("reason", "why something was dropped or closed (each metric narrows the set)",
              values=SUMMARY_DROP_REASONS + OBSERVATION_DROP_REASONS + DRAIN_CLOSE_REASONS),
        Label("gpu", "GPU index on the host", max_values=16),
        Label("backend", "a backend (engine instance) of a gateway's pool, by its id", max_values=16),
    )
}
"""Every label name a llmslo metric may carry, by name."""

TARGET_LABELS: tuple[str, ...] = ("job", "instance")
"""Labels Prometheus attaches to every scraped series (not exposed by llmslo itself)."""


@dataclass(frozen=True)
class Metric:
    """One metric: its query name, type, unit, help text, labels and (histograms) bucket bounds.

    ``unit`` is the base unit the name ends with (``seconds``, ``bytes``, ``tokens``, ``requests``), empty for
    plain counts of events and for states. ``key`` is the short name rules and dashboards use (``ttft``);
    ``source`` names the request-summary field the value comes from when there is one (``ttft_s``).
    ``buckets_s`` are upper bounds in seconds. ``narrowed`` restricts a closed label to a subset of its
    values on this metric.
    """

    key: str
    name: str
    type: MetricType
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    buckets_s: tuple[float, ...] = ()
    source: str | None = None
    narrowed: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def allowed_values(self, label: str) -> tuple[str, ...] | None:
        """The closed set of values ``label`` takes on this metric (``None`` for an open label).

        Raises ``KeyError`` when the metric has no such label.
        """
        if label not in self.labels:
            raise KeyError(f"{self.name} has no label {label!r}; its labels: {', '.join(self.labels) or 'none'}")
        return dict(self.narrowed).get(label, LABELS[label].values)

    @property
    def instrument_name(self) -> str:
        """The name to give a client library that appends ``_total`` to counters itself."""
        return self.name.removesuffix("_total") if self.type == "counter" else self.name

    @property
    def bucket(self) -> str:
        """The ``_bucket`` series of a histogram."""
        return self._series("bucket")

    @property
    def count(self) -> str:
        """The ``_count`` series of a histogram (observations)."""
        return self._series("count")

    @property
    def sum(self) -> str:
        """The ``_sum`` series of a histogram (in the metric's unit)."""
        return self._series("sum")

    def _series(self, suffix: str) -> str:
        if self.type != "histogram":
            raise AttributeError(f"{self.name} is a {self.type}, it has no _{suffix} series")
        return f"{self.name}_{suffix}"


_REQUEST_LABELS = ("model", "version", "tenant_class")


def _histogram(key: str, what: str, help_: str) -> Metric:
    source = f"{key}_s"
    return Metric(key, f"llmslo_{what}_seconds", "histogram", "seconds", help_, _REQUEST_LABELS,
                  DEFAULT_BUCKETS_S[source], source)


def _tokens(key: str, help_: str) -> Metric:
    return Metric(key, f"llmslo_{key}_total", "counter", "tokens", help_, _REQUEST_LABELS, source=key)


TTFT = _histogram("ttft", "ttft", "Server time to first token: first token committed - arrival, seconds.")
CLIENT_TTFT = _histogram(
    "client_ttft", "client_ttft",
    "Client time to first token: first content chunk received - request sent, client clock, seconds.")
TPOT = _histogram(
    "tpot", "tpot",
    "Time per output token after the first: (last - first token) / (generated tokens - 1), seconds; "
    "requests of one token are not observed.")
ITL = _histogram(
    "itl", "itl",
    "Inter-token latency, token-weighted: a commit of k tokens after a gap g adds k samples of g/k, seconds.")
E2E = _histogram("e2e", "e2e", "End-to-end latency: terminal state committed - arrival, seconds.")
QUEUE = _histogram("queue", "queue", "Queue time: first scheduled - arrival, seconds.")

PROMPT_TOKENS = _tokens("prompt_tokens", "Input tokens of finished requests.")
PROPOSED_TOKENS = _tokens("proposed_tokens", "Draft tokens proposed by speculative decoding.")
GENERATED_TOKENS = _tokens("generated_tokens", "Output tokens the engine committed (accepted).")
SENT_TOKENS = _tokens("sent_tokens", "Output tokens handed to the transport for the client.")

REQUESTS = Metric(
    "requests", "llmslo_requests_total", "counter", "requests",
    "Requests that reached their terminal state, by finish reason (rejected ones included).",
    (*_REQUEST_LABELS, "finish_reason"), source="finish_reason")
REJECTED_REQUESTS = Metric(
    "rejected_requests", "llmslo_rejected_requests_total", "counter", "requests",
    "Requests refused by admission control, by reason.", (*_REQUEST_LABELS, "reject_reason"),
    source="reject_reason")
TERMINAL_SIGNALS_IGNORED = Metric(
    "terminal_signals_ignored", "llmslo_terminal_signals_ignored_total", "counter", "",
    "Finish signals that arrived after the request's terminal state was committed (no-ops), by the reason "
    "they carried.", ("model", "finish_reason"))
GOODPUT_GOOD = Metric(
    "goodput_good", "llmslo_goodput_good_requests_total", "counter", "requests",
    "Attempted requests that were good under the goodput policy of their SLO class.",
    (*_REQUEST_LABELS, "slo_class"))
GOODPUT_ATTEMPTED = Metric(
    "goodput_attempted", "llmslo_goodput_attempted_requests_total", "counter", "requests",
    "Attempted requests (every arrival, rejected, cancelled and failed ones included), by SLO class.",
    (*_REQUEST_LABELS, "slo_class"))
SUMMARIES_DROPPED = Metric(
    "summaries_dropped", "llmslo_summaries_dropped_total", "counter", "",
    "Request summaries that never reached the store.", ("reason",),
    narrowed=(("reason", SUMMARY_DROP_REASONS),))
OBSERVATIONS_DROPPED = Metric(
    "observations_dropped", "llmslo_observations_dropped_total", "counter", "",
    "Observations dropped: NaN, infinite or negative timings; token counts that are not non-negative integers.",
    ("reason",),
    narrowed=(("reason", OBSERVATION_DROP_REASONS),))
INTERNAL_ERRORS = Metric(
    "internal_errors", "llmslo_internal_errors_total", "counter", "errors",
    "Exceptions raised inside llmslo, caught before they reached the server.")

IN_FLIGHT = Metric(
    "in_flight", "llmslo_in_flight_requests", "gauge", "requests",
    "Requests admitted and not yet at their terminal state.", ("model",))
QUEUED = Metric(
    "queued", "llmslo_queued_requests", "gauge", "requests",
    "Requests admitted and waiting to be scheduled.", ("model",))
QUEUE_CAPACITY = Metric(
    "queue_capacity", "llmslo_queue_capacity_requests", "gauge", "requests",
    "Capacity of the bounded request queue; arrivals beyond it are rejected (queue_full).", ("model",))
PAUSED_STREAMS = Metric(
    "paused_streams", "llmslo_paused_streams", "gauge", "streams",
    "Streams whose producer waits for send credit (the client reads slower than the engine generates).",
    ("model",))
DRAINING = Metric(
    "draining", "llmslo_draining", "gauge", "",
    "1 while the server drains (no new requests admitted, in-flight ones finishing), else 0.")
BREAKER_STATE = Metric(
    "breaker_state", "llmslo_breaker_state", "gauge", "",
    "Circuit-breaker state, one-hot: 1 on the series of the current state, 0 on the others.",
    ("breaker", "state"))
RETRY_AFTER = Metric(
    "retry_after", "llmslo_retry_after_seconds", "histogram", "seconds",
    "Retry-After given to refused requests, by reject reason, seconds.", ("model", "reject_reason"),
    RETRY_AFTER_BUCKETS_S)
BREAKER_TRANSITIONS = Metric(
    "breaker_transitions", "llmslo_breaker_transitions_total", "counter", "",
    "Circuit-breaker state changes, by the state left and the state entered.",
    ("breaker", "from_state", "to_state"))
SHED_REQUESTS = Metric(
    "shed_requests", "llmslo_shed_requests_total", "counter", "requests",
    "Requests refused by load shedding (also counted as rejected queue_full), by the signal that shed them.",
    ("model", "signal", "tenant_class"))
DEGRADED_REQUESTS = Metric(
    "degraded_requests", "llmslo_degraded_requests_total", "counter", "requests",
    "Requests served degraded (e.g. max_tokens capped) instead of rejected under load, by action.",
    ("model", "action"))
RATE_LIMIT_STORE_ERRORS = Metric(
    "rate_limit_store_errors", "llmslo_rate_limit_store_errors_total", "counter", "errors",
    "Rate-limit decisions taken without the shared store (unreachable or failing), by the fail mode applied.",
    ("fail_mode",))
DRAIN_DURATION = Metric(
    "drain_duration", "llmslo_drain_duration_seconds", "histogram", "seconds",
    "Duration of each completed drain, from the stop of admissions to its decision, seconds.",
    buckets_s=DRAIN_DURATION_BUCKETS_S)
DRAIN_CLOSED_STREAMS = Metric(
    "drain_closed_streams", "llmslo_drain_closed_streams_total", "counter", "streams",
    "Streams the drain controller closed, by reason (budget_exhausted: terminated when the budget ran out).",
    ("reason",), narrowed=(("reason", DRAIN_CLOSE_REASONS),))
GPU_MEMORY_USED = Metric(
    "gpu_memory_used", "llmslo_gpu_memory_used_bytes", "gauge", "bytes",
    "GPU memory in use (NVML), bytes.", ("gpu",))
GPU_MEMORY_TOTAL = Metric(
    "gpu_memory_total", "llmslo_gpu_memory_total_bytes", "gauge", "bytes",
    "GPU memory installed (NVML), bytes.", ("gpu",))

GPU_UTILIZATION = Metric(
    "gpu_utilization", "llmslo_gpu_utilization_ratio", "gauge", "ratio",
    "Share of the last sample period during which a kernel ran on the GPU (NVML utilisation / 100).", ("gpu",))
GPU_POWER = Metric(
    "gpu_power", "llmslo_gpu_power_watts", "gauge", "watts", "GPU board power draw (NVML), watts.", ("gpu",))
GPU_TEMPERATURE = Metric(
    "gpu_temperature", "llmslo_gpu_temperature_celsius", "gauge", "celsius",
    "GPU core temperature (NVML), degrees Celsius.", ("gpu",))
GPU_SM_CLOCK = Metric(
    "gpu_sm_clock", "llmslo_gpu_sm_clock_hertz", "gauge", "hertz", "Current SM clock (NVML), hertz.", ("gpu",))
GPU_THROTTLE_REASONS = Metric(
    "gpu_throttle_reasons", "llmslo_gpu_throttle_reasons", "gauge", "",
    "NVML clocks-event (throttle) reason bit mask; 0 when the clocks are not held back.", ("gpu",))

# ---- the gateway's backends (exposed by llmslo.gateway's pool collector, read at each scrape) ---------------
BACKEND_ROUTABLE = Metric(
    "backend_routable", "llmslo_backend_routable", "gauge", "",
    "1 while the gateway routes requests to the backend (in the pool, healthy, breaker not open), else 0.",
    ("backend",))
BACKEND_DRAINING = Metric(
    "backend_draining", "llmslo_backend_draining", "gauge", "",
    "1 while the gateway drains the backend (out of the pool, its requests finishing), else 0.", ("backend",))
BACKEND_OUTSTANDING = Metric(
    "backend_outstanding", "llmslo_backend_outstanding_requests", "gauge", "requests",
    "Requests the gateway has forwarded to the backend and not yet ended.", ("backend",))
BACKEND_LIMIT = Metric(
    "backend_limit", "llmslo_backend_concurrency_limit_requests", "gauge", "requests",
    "The backend's adaptive concurrency limit: requests the gateway sends it at once before trying others.",
    ("backend",))
BACKEND_TOKEN_LIMIT = Metric(
    "backend_token_limit", "llmslo_backend_concurrency_limit_tokens", "gauge", "tokens",
    "The backend's adaptive limit on tokens in flight (prompt tokens and expected output of each request forwarded "
    "and not yet ended); absent until a window within its latency tolerance carried tokens.", ("backend",))
BACKEND_TOKENS = Metric(
    "backend_tokens", "llmslo_backend_in_flight_tokens", "gauge", "tokens",
    "Tokens in flight on the backend: prompt tokens and expected output (max_tokens, or less once the model's "
    "recent replies say so) of each request it holds a place in its limit for.",
    ("backend",))
BACKEND_REQUESTS = Metric(
    "backend_requests", "llmslo_backend_requests_total", "counter", "requests",
    "Requests forwarded to the backend (a retried request counts once per backend tried).", ("backend",))
BACKEND_POOL_CHANGES = Metric(
    "backend_pool_changes", "llmslo_backend_pool_changes_total", "counter", "",
    "Changes of the backend's routability: into or out of the pool, healthy or not.", ("backend",))
BACKEND_ENGINE_READ_FAILURES = Metric(
    "backend_engine_read_failures", "llmslo_backend_engine_read_failures_total", "counter", "",
    "Reads of the backend engine's own /metrics that failed (no answer in time, a status other than 200, no "
    "figure the engine's profile names); 0 where the gateway does not read the engine.", ("backend",))
BACKEND_ENGINE_FALLBACKS = Metric(
    "backend_engine_fallbacks", "llmslo_backend_engine_fallbacks_total", "counter", "",
    "Routing choices between two backends that weighed this one by outstanding requests alone, its engine's "
    "figures being missing or stale; 0 where the gateway does not read the engine.", ("backend",))
GATEWAY_METRICS: tuple[Metric, ...] = (
    BACKEND_ROUTABLE, BACKEND_DRAINING, BACKEND_OUTSTANDING, BACKEND_LIMIT, BACKEND_TOKEN_LIMIT, BACKEND_TOKENS,
    BACKEND_REQUESTS, BACKEND_POOL_CHANGES, BACKEND_ENGINE_READ_FAILURES, BACKEND_ENGINE_FALLBACKS)
"""The gateway's per-backend series (label ``backend``)."""

METRICS: tuple[Metric, ...] = (
    TTFT, CLIENT_TTFT, TPOT, ITL, E2E, QUEUE,
    PROMPT_TOKENS, PROPOSED_TOKENS, GENERATED_TOKENS, SENT_TOKENS,
    REQUESTS, REJECTED_REQUESTS, TERMINAL_SIGNALS_IGNORED, GOODPUT_GOOD, GOODPUT_ATTEMPTED,
    SUMMARIES_DROPPED, OBSERVATIONS_DROPPED, INTERNAL_ERRORS,
    IN_FLIGHT, QUEUED, QUEUE_CAPACITY, PAUSED_STREAMS, DRAINING, BREAKER_STATE,
    RETRY_AFTER, BREAKER_TRANSITIONS, SHED_REQUESTS, DEGRADED_REQUESTS, RATE_LIMIT_STORE_ERRORS,
    DRAIN_DURATION, DRAIN_CLOSED_STREAMS,
    GPU_MEMORY_USED, GPU_MEMORY_TOTAL,
    GPU_UTILIZATION, GPU_POWER, GPU_TEMPERATURE, GPU_SM_CLOCK, GPU_THROTTLE_REASONS,
    *GATEWAY_METRICS,
)
"""Every metric llmslo exposes."""

METRICS_BY_KEY: Mapping[str, Metric] = {m.key: m for m in METRICS}
METRICS_BY_NAME: Mapping[str, Metric] = {m.name: m for m in METRICS}


@dataclass(frozen=True)
class RecordingRule:
    """A family of recording rules: ``llmslo:<what>:<operation>``, suffixed ``_rate<window>`` when windowed.

    ``labels`` are the labels the recorded series carry besides those the rule's spec adds.
    """

    what: str
    operation: str
    doc: str
    windowed: bool = True
    labels: tuple[str, ...] = ()

    def name(self, window: str | None = None) -> str:
        """The rule name, e.g. ``llmslo:slo_error:ratio_rate5m`` for window ``"5m"`` (a Prometheus duration)."""
        if self.windowed != (window is not None):
            raise ValueError(f"llmslo:{self.what}:{self.operation} {'needs' if self.windowed else 'takes no'} window")
        suffix = f"_rate{window}" if window is not None else ""
        return f"llmslo:{self.what}:{self.operation}{suffix}"


SLO_LABELS: tuple[str, ...] = ("llmslo_service", "llmslo_slo")
"""Labels every SLO recording rule and alert carries: the service and the objective's name."""

SLO_ERROR_RATIO = RecordingRule(
    "slo_error", "ratio",
    "Bad events / all events of one SLO over the window (total over total, never an average of ratios); "
    "absent when the window saw no event.", labels=SLO_LABELS)
SLO_OBJECTIVE = RecordingRule(
    "slo_objective", "ratio", "The objective of one SLO as a ratio (0.99 for 99%).", windowed=False,
    labels=SLO_LABELS)
SLO_BUDGET_REMAINING = RecordingRule(
    "slo_error_budget", "remaining_ratio",
    "Share of the period's error budget left: 1 - error ratio over the period / (1 - objective); "
    "negative once overspent.", windowed=False, labels=SLO_LABELS)
VERSION_ERROR_RATIO = RecordingRule(
    "version_error", "ratio", "Requests finished with error / all requests, per model and version.",
    labels=("model", "version"))
VERSION_TTFT_P95 = RecordingRule(
    "version_ttft_seconds", "p95",
    "95th percentile of server TTFT per model and version, seconds (a bucket estimate).",
    labels=("model", "version"))

RECORDING_RULES: tuple[RecordingRule, ...] = (
    SLO_ERROR_RATIO, SLO_OBJECTIVE, SLO_BUDGET_REMAINING, VERSION_ERROR_RATIO, VERSION_TTFT_P95,
)
"""Every recording-rule family llmslo generates."""
