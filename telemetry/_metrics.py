"""Prometheus instruments built from the name catalogue, with bounded labels and request-id exemplars.

One collector holds every llmslo metric of a process: histograms (TTFT, TPOT, ITL, e2e, queue, client TTFT;
the serving controls' Retry-After given and drain duration), counters (the four token counts, requests by
finish reason, rejections, ignored terminal signals, goodput, drops, internal errors; breaker transitions,
shed and degraded requests, rate-limit store errors, streams closed by a drain) and gauges (in flight, queued,
queue capacity, paused streams, draining, breaker state). A finished request is buffered and folded with the
others in batches (``FOLD_BATCH``, and before every scrape or read, so nothing finished is ever missing from
the exposition); the inter-token gaps of a request arrive already counted per bucket, so a 256-token reply
costs one merge, not 256 observations. Exemplars (``request_id``, ``trace_id``) ride on histogram buckets (the
largest observation of the latest batch in that bucket, with its value) and counters (the batch's latest
request with an increment, e.g. its 256 generated tokens) and are exposed only in the OpenMetrics format; they
are not available in prometheus-client's multiprocess mode (one collector per process, which is what this is).
They are kept as plain tuples and turned into prometheus-client exemplars only when scraped. The GPU gauges of
the catalogue belong to :class:`llmslo.telemetry.GpuSampler`, not to this collector.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from operator import add, itemgetter
from typing import cast

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
from llmslo.telemetry._guard import LOGGER
from llmslo.telemetry._labels import LabelPolicy
from llmslo.telemetry._policy import SloPolicy

EXEMPLAR_MAX_CHARS = 128
"""OpenMetrics bound on the characters of an exemplar's label names and values together."""

_THRESHOLD_BUCKETS = {"ttft_s": "ttft_s", "tpot_s": "tpot_s", "e2e_s": "e2e_s"}

LabelValues = tuple[str, ...]
ExemplarData = tuple[dict[str, str], float, float]
"""An exemplar as stored: its labels, the observed value or increment, its Unix timestamp (seconds)."""

_OWNED: tuple[N.Metric, ...] = tuple(m for m in N.METRICS if "gpu" not in m.labels and "backend" not in m.labels)
"""The catalogue metrics this collector exposes (the GPU gauges are the GPU sampler's, the backends' series the
gateway's)."""

_SERIES_HISTOGRAMS: tuple[str, ...] = (N.TTFT.key, N.E2E.key, N.QUEUE.key, N.CLIENT_TTFT.key, N.TPOT.key, N.ITL.key)
"""The per-request histograms, in the order of :class:`_Series` (the first four are ``intervals``)."""
_TOKEN_COUNTERS: tuple[str, ...] = (
    N.PROMPT_TOKENS.key, N.PROPOSED_TOKENS.key, N.GENERATED_TOKENS.key, N.SENT_TOKENS.key)
_LABEL_CACHE_MAX = 4096


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
        self.exemplars: list[ExemplarData | None] = [None] * (n + 1)


class _Counter:
    __slots__ = ("exemplar", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.exemplar: ExemplarData | None = None


class _Series:
    """Direct references to the children of one request-label combination (no per-request dict lookups).

    Histogram and token-counter children are created at their first observation, as the exposition shows
    only children that were observed; ``outcomes`` maps (finish reason, reject reason, verdicts) to the
    counters such a request increments by one.
    """

    __slots__ = ("hists", "outcomes", "tokens")

    def __init__(self) -> None:
        self.hists: list[_Hist | None] = [None] * len(_SERIES_HISTOGRAMS)
        self.tokens: list[_Counter | None] = [None] * len(_TOKEN_COUNTERS)
        self.outcomes: dict[tuple[object, ...], tuple[_Counter, ...]] = {}


FOLD_BATCH = 256
"""Finished requests buffered before they are folded into the instruments on the request path. A scrape (and
every read) folds whatever is buffered first, so the exposition always includes every finished request.
Folding a batch costs a few C-level passes per column instead of hundreds of bytecodes per request; with it
(and the trackers sharing this collector's lock) the fixed cost per request of ``bench/bench_telemetry.py``
went from 20.5-21.8 us to 14-20 us on this project's machine. The request that fills a batch folds it:
about 0.5 ms for 255 requests here."""

FinishedRequest = tuple[LabelValues, tuple[str, str | None, tuple[tuple[str, bool], ...]],
                        tuple[float | None, float | None, float | None, float | None], float | None,
                        tuple[Sequence[int], float, float] | None, tuple[int, int, int, int], dict[str, str] | None,
                        float]
"""A finished request as the metrics take it (a plain tuple: made once per request, folded in batches):

0. its resolved request labels (``model``, ``version``, ``tenant_class``);
1. its outcome: finish reason, reject reason, ``(slo_class, good)`` verdicts;
2. its TTFT, e2e, queue and client TTFT, seconds or ``None``;
3. its TPOT, seconds (``None`` for a reply of at most one token);
4. its token-weighted inter-token gaps counted per ITL bucket (non-cumulative, ``+Inf`` last), their sum
   and the largest gap, seconds (``None`` with fewer than two commits);
5. its prompt, proposed, generated and sent token counts;
6. its exemplar labels (``request_id``, ``trace_id``) or ``None``;
7. the exemplar's Unix timestamp, seconds.
"""


def _bucket_batch(bounds: Sequence[float], column: Sequence[float | None],
                  exemplars: Sequence[dict[str, str] | None], stamps: Sequence[float]
                  ) -> tuple[list[int], float, list[tuple[int, ExemplarData]]] | None:
    """The observations of ``column`` (``None`` skipped) counted per bucket (non-cumulative, ``+Inf`` last,
    a value equal to a bound in that bound's bucket), their sum, and for each non-empty bucket the exemplar
    of its largest observation (the worst example of the batch).

    The values are sorted once (in C) and each bound found by bisection; the request behind a bucket's
    largest value is found again with ``index`` (a C scan per non-empty bucket).
    """
    missing = column.count(None)
    if missing == len(column):
        return None
    values = [v for v in column if v is not None] if missing else list(cast(Sequence[float], column))
    values.sort()
    counts: list[int] = []
    chosen: list[tuple[int, ExemplarData]] = []
    prev = 0
    ends = [*map(partial(bisect_right, values), bounds), len(values)]  # observations <= each bound, then all
    for j, c in enumerate(ends):
        counts.append(c - prev)
        if c > prev:
            top = values[c - 1]
            i = column.index(top)
            ex = exemplars[i]
            if ex is not None:
                chosen.append((j, (ex, top, stamps[i])))
        prev = c
    return counts, sum(values), chosen


def _merge(h: _Hist, counts: list[int], total: float, chosen: list[tuple[int, ExemplarData]]) -> None:
    h.counts = list(map(add, h.counts, counts))
    h.sum += total
    for j, ex in chosen:
        h.exemplars[j] = ex


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
        self.lock = self._lock
        """The lock guarding the instruments; the request trackers of this process share it for their own
        state changes (admitted, scheduled, terminal), so a transition and its gauges change together."""
        self._hist: dict[str, dict[LabelValues, _Hist]] = {
            m.key: {} for m in N.METRICS if m.type == "histogram"
        }
        self._counters: dict[str, dict[LabelValues, _Counter]] = {
            m.key: {} for m in N.METRICS if m.type == "counter"
        }
        self._gauges: dict[str, dict[LabelValues, float]] = {m.key: {} for m in N.METRICS if m.type == "gauge"}
        self._counters[N.INTERNAL_ERRORS.key][()] = _Counter()
        self._gauges[N.DRAINING.key][()] = 0.0
        # Per-request label resolution is cached: LabelPolicy.resolve gives a value the same answer forever
        # (an open label's set of seen values only grows), so a cached answer never goes stale.
        self._request_label_cache: dict[tuple[str, str, str], LabelValues] = {}
        self._series: dict[LabelValues, _Series] = {}
        self._pending: list[FinishedRequest] = []
        self._fold_failed = False
        self._hist_bounds: tuple[tuple[float, ...], ...] = tuple(
            chosen[N.METRICS_BY_KEY[key].source or key] for key in _SERIES_HISTOGRAMS)
        self._narrowed: dict[str, dict[str, tuple[str, ...]]] = {m.key: dict(m.narrowed) for m in N.METRICS}
        self._itl_bounds = chosen["itl_s"]
        self._event_bounds: dict[str, tuple[float, ...]] = {
            m.key: m.buckets_s for m in N.METRICS if m.type == "histogram" and m.source is None}
        """Bounds (seconds) of the histograms observed one event at a time (:meth:`observe`), from the
        catalogue."""
        self.registry = registry if registry is not None else CollectorRegistry()
        self.registry.register(self)

    # ---- label resolution ------------------------------------------------------------------------------

    def request_labels(self, model: str, version: str, tenant_class: str) -> LabelValues:
        """The exposed ``(model, version, tenant_class)`` of a request (``other`` beyond the bounds)."""
        key = (model, version, tenant_class)
        cached = self._request_label_cache.get(key)
        if cached is not None:
            return cached
        r = self.labels.resolve
        values = (r("model", model), r("version", version), r("tenant_class", tenant_class))
        cache = self._request_label_cache
        if len(cache) >= _LABEL_CACHE_MAX:
            cache.clear()  # bounded memory whatever the servers sends
        cache[key] = values
        return values

    def exemplar(self, labels: dict[str, str], value: float) -> Exemplar:
        """An exemplar with ``labels`` for an observation ``value``, stamped with the injected wall clock."""
        return Exemplar(labels, value, self._clock_unix_s())

    # ---- updates (callers guard them) ------------------------------------------------------------------

    def _inc(self, key: str, labels: LabelValues, amount: float, ex: ExemplarData | None = None) -> None:
        children = self._counters[key]
        c = children.get(labels)
        if c is None:
            c = children[labels] = _Counter()
        c.value += amount
        if ex is not None:
            c.exemplar = ex

    # The per-request updates take the lock with acquire()/finally: half the cost of ``with`` (see
    # _lifecycle.py's docstring). The two below run with :attr:`lock` already held by the request tracker,
    # which commits its own state change in the same critical section.

    def admitted_locked(self, model: LabelValues) -> None:
        """A request of ``model`` (the resolved ``(model,)``, the first of its request labels) was admitted: in
        flight and queued +1."""
        gauges = self._gauges
        g = gauges["in_flight"]
        g[model] = g.get(model, 0.0) + 1
        g = gauges["queued"]
        g[model] = g.get(model, 0.0) + 1

    def scheduled_locked(self, model: LabelValues) -> None:
        """An admitted request of ``model`` joined a batch: queued -1."""
        g = self._gauges["queued"]
        g[model] = g.get(model, 0.0) - 1

    def _series_of(self, labels: LabelValues) -> _Series:
        series = self._series.get(labels)
        if series is None:  # at most one per exposed label combination: bounded by the label policy
            series = self._series[labels] = _Series()
        return series

    def record_finished(self, record: FinishedRequest, admitted: bool, scheduled: bool) -> None:
        """Record one finished request (see :data:`FinishedRequest`); it reaches the instruments with the next
        fold (see :data:`FOLD_BATCH`). ``admitted`` and ``scheduled`` say which gauges the request still holds
        (in flight; queued when never scheduled); those are released at once."""
        labels = record[0]
        gauges = self._gauges
        self._lock.acquire()
        try:
            pending = self._pending
            pending.append(record)
            if admitted:
                model = labels[:1]
                g = gauges["in_flight"]
                g[model] = g.get(model, 0.0) - 1
                if not scheduled:
                    g = gauges["queued"]
                    g[model] = g.get(model, 0.0) - 1
            if len(pending) >= FOLD_BATCH:
                self._fold()
        finally:
            self._lock.release()

    def _fold(self) -> None:
        """Fold the buffered finished requests into the instruments (the lock is held). Never raises: a
        failure here (a bug) loses this batch of observations, counts an internal error and is logged the first
        time (the guard cannot log it: its counting takes this lock)."""
        batch = self._pending
        if not batch:
            return
        self._pending = []
        try:
            if len(set(map(itemgetter(0), batch))) == 1:
                groups: Iterable[tuple[LabelValues, list[FinishedRequest]]] = ((batch[0][0], batch),)
            else:
                by_labels: dict[LabelValues, list[FinishedRequest]] = {}
                for record in batch:
                    by_labels.setdefault(record[0], []).append(record)
                groups = by_labels.items()
            for labels, records in groups:
                self._fold_series(labels, records)
        except Exception as exc:
            self._inc(N.INTERNAL_ERRORS.key, (), 1)
            if not self._fold_failed:
                self._fold_failed = True
                LOGGER.warning("llmslo: folding %d finished requests into the metrics failed: %r", len(batch), exc)

    def _fold_series(self, labels: LabelValues, records: list[FinishedRequest]) -> None:
        series = self._series_of(labels)
        _, outcome_keys, intervals, tpots, itls, tokens, exemplars, stamps = zip(*records, strict=True)
        hists = series.hists
        for k, column in enumerate((*zip(*intervals, strict=True), tpots)):
            observed = _bucket_batch(self._hist_bounds[k], column, exemplars, stamps)
            if observed is not None:
                h = hists[k]
                if h is None:
                    h = hists[k] = self._new_hist(k, labels)
                _merge(h, *observed)
        present = [r for r in itls if r is not None]
        if present:
            h = hists[5]
            if h is None:
                h = hists[5] = self._new_hist(5, labels)
            h.counts = list(map(add, h.counts, map(sum, zip(*map(itemgetter(0), present), strict=True))))
            h.sum += sum(map(itemgetter(1), present))
            maxima = [r[2] if r is not None else None for r in itls]
            chosen = _bucket_batch(self._itl_bounds, maxima, exemplars, stamps)
            if chosen is not None:
                for j, ex in chosen[2]:
                    h.exemplars[j] = ex
        counters = series.tokens
        for k, total in enumerate(map(sum, zip(*tokens, strict=True))):
            if total:
                c = counters[k]
                if c is None:
                    c = counters[k] = self._counters[_TOKEN_COUNTERS[k]].setdefault(labels, _Counter())
                c.value += total
                last = len(tokens) - 1  # the batch's most recent request with some of these tokens
                while not tokens[last][k]:
                    last -= 1
                if exemplars[last] is not None:
                    c.exemplar = (exemplars[last], float(tokens[last][k]), stamps[last])
        for outcome_key, n in Counter(outcome_keys).items():
            outcome = series.outcomes.get(outcome_key)
            if outcome is None:
                finish_reason, reject_reason, verdicts = outcome_key
                outcome = series.outcomes[outcome_key] = tuple(
                    self._counters[ckey].setdefault(clabels, _Counter())
                    for ckey, clabels in self._derive(labels, finish_reason, reject_reason, verdicts))
            last = len(outcome_keys) - 1  # the batch's most recent request with this outcome
            while outcome_keys[last] != outcome_key:
                last -= 1
            one = (exemplars[last], 1.0, stamps[last]) if exemplars[last] is not None else None
            for c in outcome:
                c.value += n
                if one is not None:
                    c.exemplar = one

    def _new_hist(self, k: int, labels: LabelValues) -> _Hist:
        return self._hist[_SERIES_HISTOGRAMS[k]].setdefault(labels, _Hist(len(self._hist_bounds[k])))

    def _derive(self, labels: LabelValues, finish_reason: object, reject_reason: object,
                verdicts: tuple[tuple[str, bool], ...]) -> tuple[tuple[str, LabelValues], ...]:
        """The counters (catalogue key, label values) a request with these labels and outcome increments by 1."""
        resolve = self.labels.resolve
        incs: list[tuple[str, LabelValues]] = [("requests", (*labels, resolve("finish_reason", finish_reason)))]
        if finish_reason == "rejected":
            incs.append(("rejected_requests", (*labels, resolve("reject_reason", reject_reason))))
        for slo_class, good in verdicts:
            sl = (*labels, resolve("slo_class", slo_class))
            incs.append(("goodput_attempted", sl))
            if good:
                incs.append(("goodput_good", sl))
        derived = tuple(incs)
        return derived

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

    def observe(self, key: str, labels: Mapping[str, str] | None, value: float) -> None:
        """Observe ``value`` (a finite non-negative number in the metric's unit, checked by the caller) on
        histogram ``key``, one of the catalogue histograms with fixed bounds (``retry_after``,
        ``drain_duration``); a value equal to a bound counts in that bound's bucket."""
        bounds = self._event_bounds[key]
        values = self._resolve(key, labels or {})
        i = bisect_left(bounds, value)
        with self._lock:
            children = self._hist[key]
            h = children.get(values)
            if h is None:
                h = children[values] = _Hist(len(bounds))
            h.counts[i] += 1
            h.sum += value

    def set_breaker_state(self, breaker: str, state: str) -> None:
        """Expose ``state`` (one of ``closed``, ``half_open``, ``open``) of ``breaker`` one-hot."""
        for s in N.BREAKER_STATES:
            self.gauge_set(N.BREAKER_STATE.key, {"breaker": breaker, "state": s}, 1.0 if s == state else 0.0)

    def _resolve(self, key: str, labels: Mapping[str, str]) -> LabelValues:
        narrowed = self._narrowed[key]
        return tuple(
            self.labels.resolve(name, labels.get(name, ""), narrowed.get(name))
            for name in N.METRICS_BY_KEY[key].labels
        )

    # ---- reading -----------------------------------------------------------------------------------------

    def series_count(self) -> int:
        """Number of labelled children across all metrics (the cardinality this process exposes)."""
        with self._lock:
            self._fold()
            return (sum(len(c) for c in self._hist.values()) + sum(len(c) for c in self._counters.values())
                    + sum(len(c) for c in self._gauges.values()))

    def value(self, key: str, **labels: str) -> float:
        """Current value of a counter or gauge child, or the observation count of a histogram child (tests)."""
        metric = N.METRICS_BY_KEY[key]
        values = tuple(labels.get(n, "") for n in metric.labels)
        with self._lock:
            self._fold()
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
            self._fold()
            families: list[PromMetric] = []
            for metric in _OWNED:
                if metric.type == "histogram":
                    bounds = (self.bounds_s[metric.source] if metric.source is not None
                              else self._event_bounds[metric.key])
                    hf = HistogramMetricFamily(metric.name, metric.help, labels=metric.labels)
                    for values, h in sorted(self._hist[metric.key].items()):
                        running = 0
                        buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
                        for i, le in enumerate((*bounds, math.inf)):
                            running += h.counts[i]
                            ex = h.exemplars[i]
                            le_s = "+Inf" if le == math.inf else repr(le)
                            buckets.append((le_s, running, Exemplar(*ex)) if ex is not None else (le_s, running))
                        hf.add_metric(values, buckets, h.sum)
                    families.append(hf)
                elif metric.type == "counter":
                    cf = CounterMetricFamily(metric.name, metric.help, labels=metric.labels)
                    for values, c in sorted(self._counters[metric.key].items()):
                        cf.add_metric(values, c.value,
                                      exemplar=Exemplar(*c.exemplar) if c.exemplar is not None else None)
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
