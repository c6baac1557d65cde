"""Prometheus instruments built from the name catalogue, with bounded labels and request-id exemplars.

One collector holds every llmslo metric of a process: histograms (TTFT, TPOT, ITL, e2e, queue, client
TTFT), counters (the four token counts, requests by finish reason, rejections, ignored terminal signals,
goodput, drops, internal errors) and gauges (in flight, queued, queue capacity, paused streams, draining,
breaker state). A request updates them in one step at its terminal state, under one lock; the inter-token
gaps of a request arrive already counted per bucket, so a 256-token reply costs one merge, not 256
observations. Exemplars (``request_id``, ``trace_id``) ride on histogram buckets and counters and are
exposed only in the OpenMetrics format; they are not available in prometheus-client's multiprocess mode
(one collector per process, which is what this is).
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import (
    Metric as PromMetric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from llmslo.telemetry import _names as N
from llmslo.telemetry._buckets import DEFAULT_BUCKETS_S
from llmslo.telemetry._errors import ConfigurationError
from llmslo.telemetry._labels import LabelPolicy
from llmslo.telemetry._policy import SloPolicy

EXEMPLAR_MAX_CHARS = 128
"""OpenMetrics bound on the characters of an exemplar's label names and values together."""

_THRESHOLD_BUCKETS = {"ttft_s": "ttft_s", "tpot_s": "tpot_s", "e2e_s": "e2e_s"}

LabelValues = tuple[str, ...]


def validate_buckets(field: str, bounds: Sequence[float]) -> tuple[float, ...]:
    """``bounds`` as a tuple when they are finite, positive and strictly increasing; else raise naming ``field``."""
    if isinstance(bounds, (str, bytes)) or not isinstance(bounds, Sequence) or not bounds:
        raise ConfigurationError(f"{field}: give a non-empty list of bucket upper bounds in seconds")
    out: list[float] = []
    for b in bounds:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
            raise ConfigurationError(f"{field}: bound {b!r} is not a finite positive number of seconds")
        if out and b <= out[-1]:
            raise ConfigurationError(f"{field}: bounds must increase strictly ({out[-1]!r} then {b!r})")
        out.append(float(b))
    return tuple(out)


def exemplar_labels(request_id: str, trace_id: str | None = None) -> dict[str, str]:
    """Exemplar labels for a request, the request id cut to fit the OpenMetrics 128-character bound."""
    labels: dict[str, str] = {}
    room = EXEMPLAR_MAX_CHARS - len("request_id")
    if trace_id:
        labels["trace_id"] = trace_id
        room -= len("trace_id") + len(trace_id)
    labels["request_id"] = request_id[: max(room, 0)]
    return labels


class _Hist:
    __slots__ = ("counts", "exemplars", "sum")

    def __init__(self, n: int) -> None:
        self.counts = [0] * (n + 1)
        self.sum = 0.0
        self.exemplars: list[Exemplar | None] = [None] * (n + 1)


class _Counter:
    __slots__ = ("exemplar", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.exemplar: Exemplar | None = None


class TelemetryMetrics(Collector):
    """Every llmslo metric of one process, registered on ``registry`` (a fresh one when ``None``).

    ``buckets`` overrides the default bucket bounds (seconds) per interval (``ttft_s``, ``client_ttft_s``,
    ``tpot_s``, ``itl_s``, ``e2e_s``, ``queue_s``); every threshold of every policy must be a bound of the
    instrument it reads. ``labels`` bounds the label values. ``clock_unix_s`` stamps exemplars (Unix
    seconds).

    Raises :class:`ConfigurationError` naming the field: bad bounds, an SLO threshold that is not a bound,
    a forbidden label.

    Example::

        metrics = TelemetryMetrics(policies=[SloPolicy(ttft_s=0.5)], registry=prometheus_client.REGISTRY)
    """

    def __init__(self, *, registry: CollectorRegistry | None = None,
                 buckets: Mapping[str, Sequence[float]] | None = None,
                 labels: LabelPolicy | None = None,
                 policies: Sequence[SloPolicy] = (SloPolicy(),),
                 clock_unix_s: Callable[[], float] = time.time) -> None:
        chosen = dict(DEFAULT_BUCKETS_S)
        for key, bounds in (buckets or {}).items():
            if key not in DEFAULT_BUCKETS_S:
                raise ConfigurationError(
                    f"buckets[{key!r}]: unknown interval; choose from {', '.join(DEFAULT_BUCKETS_S)}")
            chosen[key] = validate_buckets(f"buckets[{key!r}]", bounds)
        for policy in policies:
            for fname, value in policy.thresholds().items():
                bounds = chosen[_THRESHOLD_BUCKETS[fname]]
                if not any(math.isclose(value, b, rel_tol=0, abs_tol=1e-12) for b in bounds):
                    raise ConfigurationError(
                        f"SloPolicy.{fname}={value!r} (policy {policy.name!r}) is not a bound of the "
                        f"{fname} buckets ({', '.join(f'{b:g}' for b in bounds)}); add it to buckets[{fname!r}]")
        self.bounds_s: dict[str, tuple[float, ...]] = chosen
        self.itl_bounds_ns: tuple[int, ...] = tuple(round(b * 1e9) for b in chosen["itl_s"])
        self.labels = labels if labels is not None else LabelPolicy()
        self.policies = tuple(policies)
        self._clock_unix_s = clock_unix_s
        self._lock = threading.Lock()
        self._hist: dict[str, dict[LabelValues, _Hist]] = {
            m.key: {} for m in N.METRICS if m.type == "histogram"
        }
        self._counters: dict[str, dict[LabelValues, _Counter]] = {
            m.key: {} for m in N.METRICS if m.type == "counter"
        }
        self._gauges: dict[str, dict[LabelValues, float]] = {m.key: {} for m in N.METRICS if m.type == "gauge"}
        self._counters[N.INTERNAL_ERRORS.key][()] = _Counter()
        self._gauges[N.DRAINING.key][()] = 0.0
        self.registry = registry if registry is not None else CollectorRegistry()
        self.registry.register(self)

    # ---- label resolution ------------------------------------------------------------------------------

    def request_labels(self, model: str, version: str, tenant_class: str) -> LabelValues:
        """The exposed ``(model, version, tenant_class)`` of a request (``other`` beyond the bounds)."""
        r = self.labels.resolve
        return (r("model", model), r("version", version), r("tenant_class", tenant_class))

    def exemplar(self, labels: dict[str, str], value: float) -> Exemplar:
        """An exemplar with ``labels`` for an observation ``value``, stamped with the injected wall clock."""
        return Exemplar(labels, value, self._clock_unix_s())

    # ---- updates (callers guard them) ------------------------------------------------------------------

    def _observe(self, key: str, labels: LabelValues, value: float, ex: dict[str, str] | None) -> None:
        bounds = self.bounds_s[N.METRICS_BY_KEY[key].source or key]
        children = self._hist[key]
        h = children.get(labels)
        if h is None:
            h = children[labels] = _Hist(len(bounds))
        i = bisect_left(bounds, value)
        h.counts[i] += 1
        h.sum += value
        if ex is not None:
            h.exemplars[i] = self.exemplar(ex, value)

    def _inc(self, key: str, labels: LabelValues, amount: float, ex: Exemplar | None = None) -> None:
        children = self._counters[key]
        c = children.get(labels)
        if c is None:
            c = children[labels] = _Counter()
        c.value += amount
        if ex is not None:
            c.exemplar = ex

    def record_request(self, row: Mapping[str, object], *, tpot: float | None, labels: LabelValues,
                       itl_counts: Sequence[int] | None, itl_sum_s: float, itl_max_s: float,
                       exemplar: dict[str, str] | None, verdicts: Iterable[tuple[str, bool]]) -> None:
        """Fold one finished request into the metrics in one step.

        ``row`` is its request summary (intervals in seconds), ``tpot`` its TPOT (seconds, ``None`` for a
        reply of at most one token), ``labels`` its resolved request labels,
        ``itl_counts`` its token-weighted inter-token gaps counted per ITL bucket (non-cumulative, ``+Inf``
        last), ``itl_sum_s`` their sum and ``itl_max_s`` the largest gap (the exemplar's value), seconds.
        ``verdicts`` are ``(slo_class, good)`` pairs.
        """
        resolve = self.labels.resolve
        reason = resolve("finish_reason", row["finish_reason"])
        ex_obj = self.exemplar(exemplar, 1.0) if exemplar is not None else None
        with self._lock:
            for key in ("ttft", "e2e", "queue", "client_ttft"):
                source = N.METRICS_BY_KEY[key].source
                value = row.get(source) if source else None
                if isinstance(value, (int, float)):
                    self._observe(key, labels, float(value), exemplar)
            if tpot is not None:
                self._observe("tpot", labels, tpot, exemplar)
            if itl_counts is not None:
                children = self._hist["itl"]
                h = children.get(labels)
                if h is None:
                    h = children[labels] = _Hist(len(self.itl_bounds_ns))
                counts = h.counts
                for i, n in enumerate(itl_counts):
                    if n:
                        counts[i] += n
                h.sum += itl_sum_s
                if exemplar is not None:
                    i = bisect_left(self.bounds_s["itl_s"], itl_max_s)
                    h.exemplars[i] = self.exemplar(exemplar, itl_max_s)
            for key in ("prompt_tokens", "proposed_tokens", "generated_tokens", "sent_tokens"):
                amount = row.get(key)
                if isinstance(amount, int) and amount:
                    self._inc(key, labels, amount, ex_obj)
            self._inc("requests", (*labels, reason), 1, ex_obj)
            if row["finish_reason"] == "rejected":
                self._inc("rejected_requests", (*labels, resolve("reject_reason", row.get("reject_reason"))), 1,
                          ex_obj)
            for slo_class, good in verdicts:
                sl = (*labels, resolve("slo_class", slo_class))
                self._inc("goodput_attempted", sl, 1, ex_obj)
                if good:
                    self._inc("goodput_good", sl, 1, ex_obj)

    def count(self, key: str, labels: Mapping[str, str] | None = None, amount: float = 1) -> None:
        """Add ``amount`` to counter ``key`` (a catalogue key) with ``labels`` resolved under the policy."""
        values = self._resolve(key, labels or {})
        with self._lock:
            self._inc(key, values, amount)

    def gauge_add(self, key: str, labels: Mapping[str, str] | None, delta: float) -> None:
        """Add ``delta`` to gauge ``key``."""
        values = self._resolve(key, labels or {})
        with self._lock:
            g = self._gauges[key]
            g[values] = g.get(values, 0.0) + delta

    def gauge_set(self, key: str, labels: Mapping[str, str] | None, value: float) -> None:
        """Set gauge ``key`` to ``value``."""
        values = self._resolve(key, labels or {})
        with self._lock:
            self._gauges[key][values] = float(value)

    def set_breaker_state(self, breaker: str, state: str) -> None:
        """Expose ``state`` (one of ``closed``, ``half_open``, ``open``) of ``breaker`` one-hot."""
        for s in N.BREAKER_STATES:
            self.gauge_set(N.BREAKER_STATE.key, {"breaker": breaker, "state": s}, 1.0 if s == state else 0.0)

    def _resolve(self, key: str, labels: Mapping[str, str]) -> LabelValues:
        metric = N.METRICS_BY_KEY[key]
        return tuple(
            self.labels.resolve(name, labels.get(name, ""), dict(metric.narrowed).get(name))
            for name in metric.labels
        )

    # ---- reading -----------------------------------------------------------------------------------------

    def series_count(self) -> int:
        """Number of labelled children across all metrics (the cardinality this process exposes)."""
        with self._lock:
            return (sum(len(c) for c in self._hist.values()) + sum(len(c) for c in self._counters.values())
                    + sum(len(c) for c in self._gauges.values()))

    def value(self, key: str, **labels: str) -> float:
        """Current value of a counter or gauge child, or the observation count of a histogram child (tests)."""
        metric = N.METRICS_BY_KEY[key]
        values = tuple(labels.get(n, "") for n in metric.labels)
        with self._lock:
            if metric.type == "histogram":
                h = self._hist[key].get(values)
                return float(sum(h.counts)) if h else 0.0
            if metric.type == "counter":
                c = self._counters[key].get(values)
                return c.value if c else 0.0
            return self._gauges[key].get(values, 0.0)

    def collect(self) -> Iterator[PromMetric]:
        """The metric families, in catalogue order, children sorted by label values (deterministic text)."""
        with self._lock:
            families: list[PromMetric] = []
            for metric in N.METRICS:
                if metric.type == "histogram":
                    bounds = self.bounds_s[metric.source or metric.key]
                    hf = HistogramMetricFamily(metric.name, metric.help, labels=metric.labels)
                    for values, h in sorted(self._hist[metric.key].items()):
                        running = 0
                        buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
                        for i, le in enumerate((*bounds, math.inf)):
                            running += h.counts[i]
                            ex = h.exemplars[i]
                            le_s = "+Inf" if le == math.inf else repr(le)
                            buckets.append((le_s, running, ex) if ex is not None else (le_s, running))
                        hf.add_metric(values, buckets, h.sum)
                    families.append(hf)
                elif metric.type == "counter":
                    cf = CounterMetricFamily(metric.name, metric.help, labels=metric.labels)
                    for values, c in sorted(self._counters[metric.key].items()):
                        cf.add_metric(values, c.value, exemplar=c.exemplar)
                    families.append(cf)
                else:
                    gf = GaugeMetricFamily(metric.name, metric.help, labels=metric.labels)
                    for values, v in sorted(self._gauges[metric.key].items()):
                        gf.add_metric(values, v)
                    families.append(gf)
        return iter(families)

    def describe(self) -> Iterator[PromMetric]:
        """No description ahead of collection (avoids calling :meth:`collect` at registration)."""
        return iter(())
