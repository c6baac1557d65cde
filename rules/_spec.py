"""The SLO spec (``version: llmslo/v1``): read from YAML, validated, as frozen dataclasses.

Every problem raises :class:`~llmslo.rules.SpecError` whose message starts with the path of the field
(``objectives[1].threshold: ...``). Durations are whole seconds unless named ``*_s`` with a float type;
objectives are percentages held as :class:`~decimal.Decimal` so that budgets and thresholds print exactly.

Example::

    version: llmslo/v1
    service: chat
    selector: {model: chat}
    objectives:
      - name: ttft
        kind: latency
        metric: ttft
        threshold: 2s
        objective: 99
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Literal, cast

from llmslo.rules._durations import parse_duration_s, parse_whole_seconds, prometheus_duration
from llmslo.rules._errors import SpecError, short_repr
from llmslo.rules._yaml import load_yaml
from llmslo.telemetry import (
    FINISH_REASONS,
    LABELS,
    METRICS,
    METRICS_BY_KEY,
    METRICS_BY_NAME,
    REJECT_REASONS,
    SLO_LABELS,
    TARGET_LABELS,
    Metric,
)

SPEC_VERSION = "llmslo/v1"
"""The only spec version this release reads."""

ObjectiveKind = Literal["goodput", "latency", "availability", "saturation"]
Severity = Literal["page", "ticket"]
Pairs = tuple[tuple[str, str], ...]
"""Label name/value pairs, sorted by name."""

OBJECTIVE_KINDS: tuple[ObjectiveKind, ...] = ("goodput", "latency", "availability", "saturation")
SATURATION_METRICS: Mapping[str, str] = {
    "waiting": "requests waiting to be scheduled (queued, deferred)",
    "running": "requests running (in a batch, in a slot)",
    "kv_usage": "KV-cache usage, a ratio 0..1",
}
"""What a saturation objective may read: a gauge, named by its concept (:mod:`llmslo.engines`' names), with what
it holds."""
SEVERITIES: tuple[Severity, ...] = ("page", "ticket")
MIN_SAMPLES_PER_WINDOW = 4
"""A window must hold at least this many scrape intervals (rate() needs two samples; four leave room for a miss)."""

_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RESERVED_LABELS = frozenset({*SLO_LABELS, "severity", "alertname", "le"})


@dataclass(frozen=True)
class BurnAlertSpec:
    """One multi-window multi-burn-rate alert: fires when both windows burn faster than ``burn_rate``."""

    severity: Severity
    burn_rate: Decimal
    long_window_s: int
    short_window_s: int


DEFAULT_BURN_ALERTS: tuple[BurnAlertSpec, ...] = (
    BurnAlertSpec("page", Decimal("14.4"), 3600, 300),
    BurnAlertSpec("page", Decimal("6"), 6 * 3600, 1800),
    BurnAlertSpec("ticket", Decimal("3"), 86400, 7200),
    BurnAlertSpec("ticket", Decimal("1"), 3 * 86400, 6 * 3600),
)
"""The SRE Workbook's alerts for a 30-day period: page 14.4x 1h/5m and 6x 6h/30m, ticket 3x 1d/2h and 1x 3d/6h."""


@dataclass(frozen=True)
class ObjectiveSpec:
    """One SLO.

    ``objective`` is a percentage in (0, 100). ``selector`` holds the label matchers (service selector
    merged with the objective's own). Latency objectives name a histogram ``metric`` (catalogue key) and a
    ``threshold_s`` that is one of its bucket bounds, seconds; availability objectives list the finish
    reasons that count as ``bad``; saturation objectives (a time-slice SLI) name a gauge ``metric`` of
    :data:`SATURATION_METRICS` and the ``limit`` it may read at most: an evaluation of the rules is bad when the
    gauge is above it, and the objective is the share of evaluations that must be good.
    """

    name: str
    kind: ObjectiveKind
    objective: Decimal
    description: str
    selector: Pairs
    runbook_url: str | None
    metric: str | None = None
    threshold_s: float | None = None
    bad: tuple[str, ...] = ()
    limit: Decimal | None = None

    @property
    def budget(self) -> Decimal:
        """The error budget as a ratio: ``1 - objective / 100`` (0.01 for 99%)."""
        return (Decimal(100) - self.objective) / Decimal(100)


@dataclass(frozen=True)
class QueueSaturationSpec:
    """Queue length above ``threshold`` (a ratio of capacity) for ``for_s`` seconds.

    Reads ``llmslo_queued_requests / llmslo_queue_capacity_requests`` per model and instance (the admission
    queue of :mod:`llmslo.controls` sets both); silent where no capacity is exported. The default, 80 % for
    1 minute, is the documents' typical alert: it leaves time to scale before arrivals get 429 queue_full.
    """

    threshold: Decimal = Decimal("0.8")
    for_s: int = 60
    severity: Severity = "page"


@dataclass(frozen=True)
class RejectionsSpec:
    """Share of requests rejected for ``reasons`` over ``window_s`` above ``threshold`` for ``for_s``.

    Reads ``llmslo_rejected_requests_total{reject_reason}`` over ``llmslo_requests_total``: the reasons
    together against one threshold (the share of traffic turned away), the alert's description naming them.
    The default reasons are the client-side ones (queue_full, which load shedding also reports, and
    rate_limited); circuit_open has its own alert and draining is expected during a rollout.
    """

    threshold: Decimal = Decimal("0.05")
    window_s: int = 300
    for_s: int = 300
    reasons: tuple[str, ...] = ("queue_full", "rate_limited")
    severity: Severity = "page"


@dataclass(frozen=True)
class BreakerOpenSpec:
    """A circuit breaker not closed (open, or half-open with its probes failing) for ``for_s`` seconds.

    Reads ``llmslo_breaker_state`` with the ``state`` label aggregated away, one alert per breaker and
    instance. Open and half-open count together because a breaker whose probes keep failing cycles
    open -> half_open -> open every cool-down: a condition on the open series alone would restart its
    ``for`` at each probe and never fire while the upstream stays down.
    """

    for_s: int = 300
    severity: Severity = "ticket"


@dataclass(frozen=True)
class DrainSpec:
    """A drain in progress for longer than ``budget_s`` seconds.

    Reads the ``llmslo_draining`` gauge (1 from the stop of admissions to the end of the drain) held at 1
    for ``budget_s``, not the ``llmslo_drain_duration_seconds`` histogram: the histogram is observed when a
    drain ends, usually just before the process exits, so the scrape that would carry it may never happen,
    and it could only tell after the fact (and only at a bucket bound); the gauge is scraped while the drain
    runs, so the alert fires while the instance is still stuck, for any budget. Set ``budget_s`` to the
    drain controller's ``unregister_settle_s + wait_budget_s`` (or a little above): the controller takes its
    decision by then, so the alert means a drain that outlived its own budget (no decision taken, or a
    shutdown that hangs after it).
    """

    budget_s: int = 120
    severity: Severity = "ticket"


@dataclass(frozen=True)
class SummariesDroppedSpec:
    """Any request summary dropped within the last ``window_s`` seconds."""

    window_s: int = 600
    severity: Severity = "ticket"


@dataclass(frozen=True)
class ScrapeTargetSpec:
    """A scrape target of the service's job down or missing for ``for_s`` seconds."""

    for_s: int = 300
    severity: Severity = "page"


@dataclass(frozen=True)
class GpuMemorySpec:
    """GPU memory in use above ``threshold`` (a ratio of the total) for ``for_s`` seconds."""

    threshold: Decimal = Decimal("0.95")
    for_s: int = 300
    severity: Severity = "ticket"


@dataclass(frozen=True)
class VersionSkewSpec:
    """During a rollout, one version's error ratio or TTFT p95 worse than the best version's by ``factor``.

    Ratios are computed over ``window_s``; the condition must hold ``for_s``. ``error_floor`` is the error
    ratio below which no version counts as worse (so 0.2% against a perfect 0% is not a skew).
    """

    factor: Decimal = Decimal("2")
    window_s: int = 600
    for_s: int = 600
    error_floor: Decimal = Decimal("0.005")
    severity: Severity = "page"


@dataclass(frozen=True)
class OperationalSpec:
    """The operational alerts; ``None`` (``false`` in the YAML) disables one. Each is named
    ``<Service><Suffix>``: queue_saturation -> ``QueueNearCapacity``, rejections -> ``RejectionRatioHigh``,
    breaker_open -> ``BreakerOpen``, drain_too_long -> ``DrainTooLong``, summaries_dropped ->
    ``SummariesDropped``, scrape_target_missing -> ``ScrapeTargetMissing``, gpu_memory ->
    ``GpuMemoryNearLimit``, version_skew -> ``VersionSkewErrors`` and ``VersionSkewTtft``; every one reads
    metrics of the :mod:`llmslo.telemetry` catalogue and has generated promtool tests."""

    queue_saturation: QueueSaturationSpec | None = QueueSaturationSpec()
    rejections: RejectionsSpec | None = RejectionsSpec()
    breaker_open: BreakerOpenSpec | None = BreakerOpenSpec()
    drain_too_long: DrainSpec | None = DrainSpec()
    summaries_dropped: SummariesDroppedSpec | None = SummariesDroppedSpec()
    scrape_target_missing: ScrapeTargetSpec | None = ScrapeTargetSpec()
    gpu_memory: GpuMemorySpec | None = GpuMemorySpec()
    version_skew: VersionSkewSpec | None = VersionSkewSpec()


@dataclass(frozen=True)
class Spec:
    """A validated SLO spec. Durations in whole seconds.

    ``scrape_job`` is the Prometheus job scraping the service (``None``: the service name); operational
    alerts select it.
    """

    service: str
    objectives: tuple[ObjectiveSpec, ...]
    labels: Pairs = ()
    selector: Pairs = ()
    period_s: int = 30 * 86400
    scrape_interval_s: int = 30
    scrape_job: str | None = None
    evaluation_interval_s: int = 60
    absent_for_s: int = 600
    runbook_url: str | None = None
    burn_alerts: tuple[BurnAlertSpec, ...] = DEFAULT_BURN_ALERTS
    operational: OperationalSpec = field(default_factory=OperationalSpec)

    @property
    def job(self) -> str:
        """The Prometheus job of the service's targets."""
        return self.scrape_job or self.service


class _Fields:
    """Reads one YAML mapping, remembering which keys were read so that unknown keys are reported."""

    def __init__(self, raw: object, path: str) -> None:
        if not isinstance(raw, Mapping):
            raise SpecError(path or "spec", f"expected a mapping, got {_kind(raw)}")
        for key in raw:
            if not isinstance(key, str):
                raise SpecError(path or "spec", f"keys must be strings, got {short_repr(key)}")
        self.raw = cast(Mapping[str, object], raw)
        self.path = path
        self.read: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str) -> object:
        self.read.add(key)
        return self.raw.get(key)

    def has(self, key: str) -> bool:
        return key in self.raw

    def text(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        value = self.get(key)
        if value is None:
            if required:
                raise SpecError(self.at(key), "is required")
            return default
        if not isinstance(value, str) or not value.strip():
            raise SpecError(self.at(key), f"expected a non-empty string, got {_kind(value)}")
        return value.strip()

    def name(self, key: str) -> str:
        value = self.text(key, required=True)
        assert value is not None
        if not _NAME.match(value):
            raise SpecError(self.at(key), f"{short_repr(value)} must be lower case letters, digits, '-' or '_', "
                                          "starting with a letter")
        return value

    def seconds(self, key: str, default: int) -> int:
        value = self.get(key)
        return default if value is None else parse_whole_seconds(value, self.at(key))

    def ratio(self, key: str, default: Decimal) -> Decimal:
        """A ratio in (0, 1], written as 0.8 or 80%."""
        value = self.get(key)
        if value is None:
            return default
        percent = isinstance(value, str) and value.strip().endswith("%")
        number = _decimal(value.strip().removesuffix("%") if isinstance(value, str) else value, self.at(key))
        if percent:
            number /= Decimal(100)
        if not Decimal(0) < number <= Decimal(1):
            raise SpecError(self.at(key), f"must be a ratio in (0, 1] such as 0.8 or 80%, got {short_repr(value)}")
        return number

    def positive(self, key: str, default: Decimal) -> Decimal:
        value = self.get(key)
        if value is None:
            return default
        number = _decimal(value, self.at(key))
        if number <= 0:
            raise SpecError(self.at(key), f"must be positive, got {short_repr(value)}")
        return number

    def severity(self, default: Severity) -> Severity:
        value = self.text("severity", default)
        if value not in SEVERITIES:
            raise SpecError(self.at("severity"), f"must be one of {', '.join(SEVERITIES)}, got {short_repr(value)}")
        return value

    def finish(self) -> None:
        unknown = sorted(set(self.raw) - self.read)
        if unknown:
            raise SpecError(self.at(unknown[0]), f"unknown field; expected one of: {', '.join(sorted(self.read))}")


def _kind(value: object) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {short_repr(value)}"


def _decimal(value: object, path: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise SpecError(path, f"expected a number, got {_kind(value)}")
    try:
        number = Decimal(str(value).strip())
    except InvalidOperation:
        raise SpecError(path, f"expected a number, got {short_repr(value)}") from None
    if not number.is_finite():
        raise SpecError(path, f"expected a finite number, got {short_repr(value)}")
    return number


def _plain(value: Decimal) -> str:
    """``Decimal('10.0')`` -> ``'10'``, ``Decimal('99.90')`` -> ``'99.9'`` (no exponent)."""
    return f"{value.normalize():f}"


def _pct(value: Decimal) -> str:
    """``Decimal('99.90')`` -> ``'99.9%'``."""
    return f"{_plain(value)}%"


def _label_pairs(raw: object, path: str) -> Pairs:
    fields = _Fields(raw, path)
    pairs = []
    for key in sorted(fields.raw):
        value = fields.get(key)
        if not _LABEL_NAME.match(key) or key.startswith("__"):
            raise SpecError(fields.at(key), "is not a valid Prometheus label name")
        if not isinstance(value, str):
            raise SpecError(fields.at(key), f"label values must be strings (quote them), got {_kind(value)}")
        pairs.append((key, value))
    return tuple(pairs)


def _labels(raw: object, path: str) -> Pairs:
    pairs = _label_pairs(raw, path)
    for key, _ in pairs:
        if key in _RESERVED_LABELS or key in TARGET_LABELS or key in LABELS:
            raise SpecError(f"{path}.{key}", "is set by llmslo or Prometheus; choose another label name")
    return pairs


def _selector(raw: object, path: str) -> Pairs:
    pairs = _label_pairs(raw, path)
    known = sorted({*LABELS, *TARGET_LABELS})
    for key, value in pairs:
        if key not in LABELS and key not in TARGET_LABELS:
            raise SpecError(f"{path}.{key}", f"unknown label; llmslo metrics carry: {', '.join(known)}")
        allowed = LABELS[key].values if key in LABELS else None
        if allowed is not None and value not in allowed:
            raise SpecError(f"{path}.{key}", f"unknown value {short_repr(value)}; allowed: {', '.join(allowed)}")
        if not value:
            raise SpecError(f"{path}.{key}", "must not be empty")
    return pairs


def _check_selector_fits(selector: Pairs, own: Pairs, metrics: tuple[Metric, ...], path: str) -> None:
    """Every selector label must be carried by every metric the objective reads."""
    for key, _ in selector:
        for metric in metrics:
            if key not in metric.labels and key not in TARGET_LABELS:
                where = f"{path}.selector.{key}" if key in dict(own) else f"selector.{key}"
                raise SpecError(where, f"{metric.name} has no label {short_repr(key)} "
                                       f"(its labels: {', '.join(metric.labels) or 'none'})")


def _latency_histograms() -> list[Metric]:
    """The histograms a latency objective may read: one observation per request (a summary interval), not
    the serving controls' (a Retry-After given, a drain's duration), which count no request's latency."""
    return [m for m in METRICS if m.type == "histogram" and m.source is not None]


def _histogram(raw: object, path: str) -> Metric:
    histograms = _latency_histograms()
    if isinstance(raw, str):
        metric = METRICS_BY_KEY.get(raw) or METRICS_BY_NAME.get(raw)
        if metric is not None and metric in histograms:
            return metric
    names = ", ".join(f"{m.key} ({m.name})" for m in histograms)
    raise SpecError(path, f"unknown latency metric {short_repr(raw)}; known: {names}")


def _threshold(raw: object, metric: Metric, path: str) -> float:
    threshold = parse_duration_s(raw, path)
    if threshold in metric.buckets_s:
        return threshold
    below = [b for b in metric.buckets_s if b < threshold]
    above = [b for b in metric.buckets_s if b > threshold]
    near = " and ".join(f"{b:g}s" for b in (below[-1:] + above[:1]))
    bounds = ", ".join(f"{b:g}" for b in metric.buckets_s)
    raise SpecError(path, f"{threshold:g}s is not a bucket bound of {metric.name}, so no series counts the "
                          f"requests at or under it; nearest bounds: {near} (all bounds, s: {bounds})")


def _limit(raw: object, metric: str, path: str) -> Decimal:
    """A saturation objective's limit: requests (a whole number >= 0), or a ratio for ``kv_usage`` (0.9 or 90%)."""
    if raw is None:
        raise SpecError(path, f"is required: the most {metric} may read in a good evaluation")
    percent = isinstance(raw, str) and raw.strip().endswith("%")
    number = _decimal(raw.strip().removesuffix("%") if isinstance(raw, str) else raw, path)
    if percent:
        number /= Decimal(100)
    if metric == "kv_usage":
        if not Decimal(0) <= number < Decimal(1):
            raise SpecError(path, f"must be a ratio in [0, 1) such as 0.9 or 90%, got {short_repr(raw)}")
    elif percent or number < 0 or number != number.to_integral_value():
        raise SpecError(path, f"must be a whole number of requests (0 or more), got {short_repr(raw)}")
    return number


def _objective(raw: object, path: str, spec_selector: Pairs, runbook: str | None,
               engine: bool = False) -> ObjectiveSpec:
    f = _Fields(raw, path)
    name = f.name("name")
    kind = f.text("kind", required=True)
    if kind not in OBJECTIVE_KINDS:
        raise SpecError(f.at("kind"), f"must be one of {', '.join(OBJECTIVE_KINDS)}, got {short_repr(kind)}")
    objective_raw = f.get("objective")
    if objective_raw is None:
        raise SpecError(f.at("objective"), "is required: a percentage such as 99 or 99.9")
    objective = _decimal(objective_raw.strip().removesuffix("%") if isinstance(objective_raw, str)
                         else objective_raw, f.at("objective"))
    if not Decimal(0) < objective < Decimal(100):
        raise SpecError(f.at("objective"),
                        f"must be a percentage strictly between 0 and 100, got {short_repr(objective_raw)}")
    own = _selector(f.get("selector") or {}, f.at("selector"))
    selector = tuple(sorted({**dict(spec_selector), **dict(own)}.items()))
    metric: str | None = None
    threshold: float | None = None
    bad: tuple[str, ...] = ()
    limit: Decimal | None = None
    if kind == "latency":
        histogram = _histogram(f.get("metric"), f.at("metric"))
        metric = histogram.key
        if not f.has("threshold"):
            raise SpecError(f.at("threshold"), f"is required: one of the bucket bounds of {histogram.name}")
        if engine:  # the bound is checked against the engine's own buckets when the rules are generated
            threshold = parse_duration_s(f.get("threshold"), f.at("threshold"))
        else:
            threshold = _threshold(f.get("threshold"), histogram, f.at("threshold"))
        metrics: tuple[Metric, ...] = (histogram,)
    elif kind == "saturation":
        metric_raw = f.get("metric")
        if metric_raw not in SATURATION_METRICS:
            known = ", ".join(f"{k} ({v})" for k, v in SATURATION_METRICS.items())
            raise SpecError(f.at("metric"), f"unknown gauge {short_repr(metric_raw)}; known: {known}")
        metric = str(metric_raw)
        limit = _limit(f.get("threshold"), metric, f.at("threshold"))
        metrics = ()
    elif kind == "goodput":
        metrics = (METRICS_BY_KEY["goodput_attempted"], METRICS_BY_KEY["goodput_good"])
    else:
        raw_bad = f.get("bad")
        bad = _bad_reasons(["error"] if raw_bad is None else raw_bad, f.at("bad"))
        metrics = (METRICS_BY_KEY["requests"],)
    if not engine:  # an engine's own labels are checked when its rules are generated
        _check_selector_fits(selector, own, metrics, path)
    description = f.text("description") or _default_description(kind, metric, threshold, bad, limit)
    runbook_url = f.text("runbook_url", runbook)
    f.finish()
    return ObjectiveSpec(name, kind, objective, description, selector, runbook_url,
                         metric, threshold, bad, limit)


def _bad_reasons(raw: object, path: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        raise SpecError(path, f"expected a non-empty list of finish reasons, got {_kind(raw)}")
    for i, reason in enumerate(raw):
        if reason not in FINISH_REASONS:
            raise SpecError(f"{path}[{i}]",
                            f"unknown finish reason {short_repr(reason)}; known: {', '.join(FINISH_REASONS)}")
        if reason in ("stop", "length"):
            raise SpecError(f"{path}[{i}]", f"{short_repr(reason)} is a successful finish and cannot count as bad")
    return tuple(r for r in FINISH_REASONS if r in raw)


def _default_description(kind: str, metric: str | None, threshold: float | None, bad: tuple[str, ...],
                         limit: Decimal | None = None) -> str:
    if kind == "saturation":
        return f"evaluations with {metric} at or under {_plain(limit or Decimal(0))}"
    if kind == "goodput":
        return "attempted requests that finished successfully and met every SLO of their goodput policy"
    if kind == "latency":
        return f"requests with {metric} at or under {threshold:g}s"
    return f"requests that did not finish with {' or '.join(bad)}"


def _burn_alerts(raw: object, path: str) -> tuple[BurnAlertSpec, ...]:
    if not isinstance(raw, list) or not raw:
        raise SpecError(path, f"expected a non-empty list of alerts, got {_kind(raw)}")
    alerts = []
    for i, item in enumerate(raw):
        f = _Fields(item, f"{path}[{i}]")
        severity = f.severity("page")
        burn = f.positive("burn_rate", Decimal(0))
        if burn == 0:
            raise SpecError(f.at("burn_rate"), "is required: how many times faster than the budget allows")
        if not f.has("long_window") or not f.has("short_window"):
            raise SpecError(f.at("long_window" if not f.has("long_window") else "short_window"), "is required")
        long_s = f.seconds("long_window", 0)
        short_s = f.seconds("short_window", 0)
        if short_s >= long_s:
            raise SpecError(f.at("short_window"), f"{prometheus_duration(short_s)} must be shorter than the "
                                                  f"long window {prometheus_duration(long_s)}")
        f.finish()
        alerts.append(BurnAlertSpec(severity, burn, long_s, short_s))
    keys = [(a.long_window_s, a.short_window_s) for a in alerts]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            raise SpecError(f"{path}[{i}]", "two alerts use the same windows; keep one")
    return tuple(alerts)


def _operational(raw: object, path: str) -> OperationalSpec:
    if raw is None:
        return OperationalSpec()
    f = _Fields(raw, path)

    def section(key: str) -> _Fields | None:
        value = f.get(key)
        if value is False:
            return None
        return _Fields({} if value is None or value is True else value, f.at(key))

    queue = rejections = breaker = drain = dropped = scrape = gpu = skew = None
    if (s := section("queue_saturation")) is not None:
        queue = QueueSaturationSpec(s.ratio("threshold", Decimal("0.8")), s.seconds("for", 60), s.severity("page"))
        s.finish()
    if (s := section("rejections")) is not None:
        reasons_raw = s.get("reasons")
        reasons = RejectionsSpec().reasons
        if reasons_raw is not None:
            if not isinstance(reasons_raw, list) or not reasons_raw:
                raise SpecError(s.at("reasons"),
                                f"expected a non-empty list of reject reasons, got {_kind(reasons_raw)}")
            for i, r in enumerate(reasons_raw):
                if r not in REJECT_REASONS:
                    raise SpecError(f"{s.at('reasons')}[{i}]",
                                    f"unknown reject reason {short_repr(r)}; known: {', '.join(REJECT_REASONS)}")
            reasons = tuple(r for r in REJECT_REASONS if r in reasons_raw)
        rejections = RejectionsSpec(s.ratio("threshold", Decimal("0.05")), s.seconds("window", 300),
                                    s.seconds("for", 300), reasons, s.severity("page"))
        s.finish()
    if (s := section("breaker_open")) is not None:
        breaker = BreakerOpenSpec(s.seconds("for", 300), s.severity("ticket"))
        s.finish()
    if (s := section("drain_too_long")) is not None:
        drain = DrainSpec(s.seconds("budget", 120), s.severity("ticket"))
        s.finish()
    if (s := section("summaries_dropped")) is not None:
        dropped = SummariesDroppedSpec(s.seconds("window", 600), s.severity("ticket"))
        s.finish()
    if (s := section("scrape_target_missing")) is not None:
        scrape = ScrapeTargetSpec(s.seconds("for", 300), s.severity("page"))
        s.finish()
    if (s := section("gpu_memory")) is not None:
        gpu = GpuMemorySpec(s.ratio("threshold", Decimal("0.95")), s.seconds("for", 300), s.severity("ticket"))
        s.finish()
    if (s := section("version_skew")) is not None:
        skew = VersionSkewSpec(s.positive("factor", Decimal(2)), s.seconds("window", 600), s.seconds("for", 600),
                               s.ratio("error_floor", Decimal("0.005")), s.severity("page"))
        if skew.factor <= 1:
            raise SpecError(s.at("factor"), f"must be above 1 (worse than the best version by this factor), "
                                            f"got {skew.factor}")
        s.finish()
    f.finish()
    return OperationalSpec(queue, rejections, breaker, drain, dropped, scrape, gpu, skew)


def _check_windows(spec: Spec, alerts_path: str) -> None:
    """Every window holds at least MIN_SAMPLES_PER_WINDOW scrape intervals."""
    least = MIN_SAMPLES_PER_WINDOW * spec.scrape_interval_s
    interval = prometheus_duration(spec.scrape_interval_s)

    def check(seconds: int, path: str) -> None:
        if seconds < least:
            raise SpecError(path, f"{prometheus_duration(seconds)} is shorter than {MIN_SAMPLES_PER_WINDOW} × the "
                                  f"scrape interval ({interval}); rate() over it would see too few samples. "
                                  f"Use a window of at least {prometheus_duration(least)} or scrape more often")

    for i, alert in enumerate(spec.burn_alerts):
        check(alert.short_window_s, f"{alerts_path}[{i}].short_window")
        check(alert.long_window_s, f"{alerts_path}[{i}].long_window")
        if alert.long_window_s > spec.period_s:
            raise SpecError(f"{alerts_path}[{i}].long_window",
                            f"{prometheus_duration(alert.long_window_s)} is longer than the period "
                            f"{prometheus_duration(spec.period_s)}")
    op = spec.operational
    if op.rejections is not None:
        check(op.rejections.window_s, "operational.rejections.window")
    if op.summaries_dropped is not None:
        check(op.summaries_dropped.window_s, "operational.summaries_dropped.window")
    if op.version_skew is not None:
        check(op.version_skew.window_s, "operational.version_skew.window")


def _check_burn_rates(spec: Spec, alerts_path: str) -> None:
    """burn rate × budget must stay under 1: an error ratio above 100% cannot happen."""
    for i, objective in enumerate(spec.objectives):
        budget = objective.budget
        for j, alert in enumerate(spec.burn_alerts):
            if alert.burn_rate * budget >= 1:
                verb = "page" if alert.severity == "page" else "open a ticket"
                most = _plain(Decimal(1) / budget)
                raise SpecError(
                    f"objectives[{i}].objective",
                    f"a {_pct(objective.objective)} SLO cannot {verb} at {_plain(alert.burn_rate)}× "
                    f"({alerts_path}[{j}]): that burn rate means {_pct(alert.burn_rate * budget * 100)} of "
                    f"events bad ({_plain(alert.burn_rate)} × the {_pct(budget * 100)} budget), and the "
                    f"error ratio cannot exceed 100%, so the alert could never fire. Burn rates for this "
                    f"objective must stay below {most}×: lower {alerts_path}[{j}].burn_rate or raise the objective")


def parse_spec(data: object, *, engine: bool = False) -> Spec:
    """Validate a spec already read from YAML (a mapping) and return it.

    With ``engine`` (rules over an inference engine's own series, :mod:`llmslo.engines`), a latency threshold
    and the selector's labels are checked against the engine's series when the model is built, not against
    llmslo's catalogue. Raises :class:`SpecError` naming the first invalid field.
    """
    f = _Fields(data, "")
    version = f.get("version")
    if version != SPEC_VERSION:
        raise SpecError("version", f"expected {SPEC_VERSION!r}, got {_kind(version)}")
    service = f.name("service")
    labels = _labels(f.get("labels") or {}, "labels")
    selector = _selector(f.get("selector") or {}, "selector")
    period_s = f.seconds("period", 30 * 86400)
    scrape_raw = f.get("scrape")
    scrape = _Fields(scrape_raw if scrape_raw is not None else {}, "scrape")
    scrape_interval_s = scrape.seconds("interval", 30)
    scrape_job = scrape.text("job")
    scrape.finish()
    evaluation_interval_s = f.seconds("evaluation_interval", 60)
    absent_for_s = f.seconds("absent_for", 600)
    runbook_url = f.text("runbook_url")
    alerts_raw = f.get("burn_alerts")
    alerts_path = "burn_alerts" if alerts_raw is not None else "burn_alerts (default)"
    burn_alerts = DEFAULT_BURN_ALERTS if alerts_raw is None else _burn_alerts(alerts_raw, "burn_alerts")
    objectives_raw = f.get("objectives")
    if not isinstance(objectives_raw, list) or not objectives_raw:
        raise SpecError("objectives", f"expected a non-empty list of objectives, got {_kind(objectives_raw)}")
    objectives = tuple(_objective(o, f"objectives[{i}]", selector, runbook_url, engine)
                       for i, o in enumerate(objectives_raw))
    names = [o.name for o in objectives]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise SpecError(f"objectives[{i}].name", f"{name!r} is used twice; objective names must be unique")
    operational = _operational(f.get("operational"), "operational")
    f.finish()
    if evaluation_interval_s > 300:
        raise SpecError("evaluation_interval", "must be at most 5m, or the 5m windows would be evaluated too rarely")
    spec = Spec(service, objectives, labels, selector, period_s, scrape_interval_s, scrape_job,
                evaluation_interval_s, absent_for_s, runbook_url, burn_alerts, operational)
    _check_windows(spec, alerts_path)
    _check_burn_rates(spec, alerts_path)
    return spec


def parse_spec_text(text: str, source: str = "spec", *, engine: bool = False) -> Spec:
    """Parse YAML text into a validated :class:`Spec` (PyYAML, safe loader, within the limits of
    :func:`~llmslo.rules.load_yaml`: aliases may not expand past 10,000 nodes, nesting not past 32 levels).

    Raises :class:`SpecError` for invalid YAML, YAML beyond the limits, or an invalid field.
    """
    return parse_spec(load_yaml(text, source), engine=engine)


def decode_spec(data: bytes, source: str = "spec") -> str:
    """``data`` as UTF-8 text; :class:`SpecError` naming the line and byte of the first invalid byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SpecError("", f"{source} is not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, byte "
                            f"{column} of the line ({exc.reason}); save the spec as UTF-8") from None


def load_spec(path: str | Path, *, engine: bool = False) -> Spec:
    """Read and validate the spec file at ``path`` (``engine``: see :func:`parse_spec`). Raises
    :class:`SpecError` (or ``OSError``); a problem with the whole file (not UTF-8, not YAML, beyond the limits)
    names ``path`` in the message."""
    file = Path(path)
    return parse_spec_text(decode_spec(file.read_bytes(), str(file)), str(file), engine=engine)
