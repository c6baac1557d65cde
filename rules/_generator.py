"""Model -> Prometheus rules: recording rules per window, burn-rate, absent-data and operational alerts.

Every ratio is total bad / total events over its window, from ``rate()`` of counters, never an average of
shorter ratios. A window without events yields no sample (the denominator is filtered with ``> 0``), so
zero traffic never produces NaN. Metric names come from the catalogue (:mod:`llmslo.telemetry`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from llmslo.rules._durations import human_duration, prometheus_duration
from llmslo.rules._model import BurnRateAlert, Model, OperationalAlert, Slo
from llmslo.rules._promql import Matcher, equal, le_forms, le_matcher, number, one_of, quote, selector
from llmslo.rules._spec import Pairs, Spec
from llmslo.telemetry import (
    METRICS_BY_KEY,
    SLO_BUDGET_REMAINING,
    SLO_ERROR_RATIO,
    SLO_OBJECTIVE,
    TARGET_LABELS,
    VERSION_ERROR_RATIO,
    VERSION_TTFT_P95,
    Metric,
)


@dataclass(frozen=True)
class Rule:
    """One recording rule (``record``) or alerting rule (``alert``); ``for_s`` in seconds."""

    expr: str
    record: str | None = None
    alert: str | None = None
    for_s: int = 0
    labels: Pairs = ()
    annotations: Pairs = ()
    """In the order they are written: summary, description, then the rest."""

    def as_dict(self) -> dict[str, object]:
        """The rule as Prometheus's rule-file format, keys in the conventional order."""
        out: dict[str, object] = {"record": self.record} if self.record else {"alert": self.alert}
        out["expr"] = self.expr
        if self.for_s:
            out["for"] = prometheus_duration(self.for_s)
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out


@dataclass(frozen=True)
class RuleGroup:
    """A rule group; rules run in order, so alerts placed after the recording rules read fresh values."""

    name: str
    rules: tuple[Rule, ...]

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "rules": [r.as_dict() for r in self.rules]}


_Maker = Callable[[str, str, int, str, str], Rule]
"""Builds one operational alert rule from (expr, severity, for_s, summary, description)."""


def _sum_rate(metric: str, matchers: list[Matcher], window: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping}(rate({selector(metric, matchers)}[{window}]))"


def _pct(value: Decimal | float) -> str:
    d = value if isinstance(value, Decimal) else Decimal(repr(value))
    return f"{number(d * 100)}%"


def _round_pct(value: float) -> str:
    return f"{value * 100:.3g}%"


def _with(labels: Pairs, *extra: tuple[str, str]) -> Pairs:
    return tuple(sorted({**dict(labels), **dict(extra)}.items()))


def _runbook(spec_url: str | None, alert: str) -> Pairs:
    return (("runbook_url", spec_url.replace("{alert}", alert)),) if spec_url else ()


# --- SLIs -------------------------------------------------------------------------------------------------


def slo_events_noun(slo: Slo) -> str:
    """What one event of the SLO is, in words."""
    spec = slo.spec
    if spec.kind == "saturation":
        return "rule evaluations"
    if slo.sli is not None and slo.sli.kind == "finish":
        return "finished requests"
    if spec.kind == "goodput":
        return "attempted requests"
    if spec.kind == "latency":
        return {
            "ttft": "requests that produced a first token",
            "client_ttft": "requests whose client received a first chunk",
            "tpot": "requests of two or more output tokens",
            "itl": "inter-token gaps (token-weighted)",
            "e2e": "finished requests",
            "queue": "scheduled requests",
        }.get(spec.metric or "", "observations")
    return "requests" if "rejected" in spec.bad else "admitted requests (rejected ones excluded)"


def slo_metrics(slo: Slo) -> tuple[Metric, ...]:
    """The catalogue metrics an SLO reads, events first."""
    spec = slo.spec
    if spec.kind == "goodput":
        return (METRICS_BY_KEY["goodput_attempted"], METRICS_BY_KEY["goodput_good"])
    if spec.kind == "latency":
        return (METRICS_BY_KEY[spec.metric or ""],)
    return (METRICS_BY_KEY["requests"],)


def slo_series_names(slo: Slo) -> set[str]:
    """The names of the series an SLO reads (events first)."""
    if slo.sli is not None:
        return {slo.sli.name}
    return {m.name for m in slo_metrics(slo)}


def slo_indicator_expr(slo: Slo) -> str:
    """A saturation SLO's event at one rule evaluation: 1 when its gauge (the worst series) is above the limit,
    0 when not, absent without the gauge."""
    sli = slo.sli
    assert sli is not None and sli.kind == "gauge"
    return f"max({selector(sli.name, sli.matchers)}) > bool {number(sli.threshold)}"


def _sli_ratio_expr(slo: Slo, window: str) -> str:
    sli = slo.sli
    assert sli is not None
    sel = list(sli.matchers)
    if sli.kind == "histogram":
        return (f"1 - ({_sum_rate(sli.bucket, [*sel, le_matcher(sli.threshold)], window)} or vector(0))"
                f" / ({_sum_rate(sli.count, sel, window)} > 0)")
    if sli.kind == "finish":
        return (f"({_sum_rate(sli.name, [*sel, one_of(sli.label, sli.bad)], window)} or vector(0))"
                f" / ({_sum_rate(sli.name, sel, window)} > 0)")
    raise ValueError("a saturation SLO's ratio averages its recorded events (slo_group)")


def slo_ratio_expr(slo: Slo, window: str) -> str:
    """The error ratio of ``slo`` over ``window``: bad events / all events, absent without events."""
    if slo.sli is not None:
        return _sli_ratio_expr(slo, window)
    spec = slo.spec
    sel = equal(spec.selector)
    if spec.kind == "goodput":
        attempted, good = slo_metrics(slo)
        return (f"1 - ({_sum_rate(good.name, sel, window)} or vector(0))"
                f" / ({_sum_rate(attempted.name, sel, window)} > 0)")
    if spec.kind == "latency":
        histogram = slo_metrics(slo)[0]
        assert spec.threshold_s is not None
        return (f"1 - ({_sum_rate(histogram.bucket, [*sel, le_matcher(spec.threshold_s)], window)} or vector(0))"
                f" / ({_sum_rate(histogram.count, sel, window)} > 0)")
    requests = slo_metrics(slo)[0].name
    events = sel if "rejected" in spec.bad else [*sel, ("finish_reason", "!=", "rejected")]
    return (f"({_sum_rate(requests, [*sel, one_of('finish_reason', spec.bad)], window)} or vector(0))"
            f" / ({_sum_rate(requests, events, window)} > 0)")


def slo_absent_selector(slo: Slo) -> str:
    """The events series whose absence the absent-data alert watches."""
    if slo.sli is not None:
        return selector(slo.sli.events, slo.sli.matchers)
    metric = slo_metrics(slo)[0]
    return selector(metric.count if metric.type == "histogram" else metric.name, equal(slo.spec.selector))


def _sli_source(slo: Slo) -> str:
    sli = slo.sli
    assert sli is not None
    if sli.kind == "histogram":
        spellings = " or ".join(quote(form) for form in le_forms(sli.threshold))
        source = f"{sli.bucket} with le={spellings} / {sli.count}"
    elif sli.kind == "finish":
        source = f"{sli.name} by {sli.label}"
    else:
        source = f"{sli.name} above {number(sli.threshold)} at a rule evaluation, the worst series"
    source = f"{source}, {sli.source}'s own series"
    caveats = [c for c in (sli.difference, *sli.notes) if c]
    return source + "".join(f"; {c}" for c in caveats)


def slo_definition(slo: Slo) -> str:
    """The definition of a good event, with where it is counted."""
    spec = slo.spec
    if slo.sli is not None:
        source = _sli_source(slo)
    elif spec.kind == "goodput":
        attempted, good = slo_metrics(slo)
        source = f"{good.name} / {attempted.name}"
    elif spec.kind == "latency":
        histogram = slo_metrics(slo)[0]
        assert spec.threshold_s is not None
        spellings = " or ".join(quote(form) for form in le_forms(spec.threshold_s))
        source = f"{histogram.bucket} with le={spellings} / {histogram.count}"
    else:
        source = f"{METRICS_BY_KEY['requests'].name} by finish_reason"
    return f"good: {spec.description} (counted from {source}; events: {slo_events_noun(slo)})"


def slo_statement(slo: Slo) -> str:
    """``99% of attempted requests good over 30d``."""
    return f"{number(slo.spec.objective)}% of {slo_events_noun(slo)} good over {slo.period}"


# --- SLO groups -------------------------------------------------------------------------------------------


def _burn_alert_rule(slo: Slo, alert: BurnRateAlert, labels: Pairs, runbook: str | None) -> Rule:
    threshold = number(alert.threshold)
    sel = equal(slo.labels)
    expr = (f"{selector(SLO_ERROR_RATIO.name(alert.long_window), sel)} > {threshold}"
            f" and {selector(SLO_ERROR_RATIO.name(alert.short_window), sel)} > {threshold}")
    burn = number(alert.burn_rate)
    summary = (f"{slo.service}/{slo.name}: error budget burning at {burn}× or faster over {alert.long_window} "
               f"and {alert.short_window}")
    description = (
        f"More than {_pct(alert.threshold)} of {slo_events_noun(slo)} were bad over both the last "
        f"{alert.long_window} and the last {alert.short_window} ({burn}× the {_pct(slo.budget)} budget). "
        f"At {burn}× the {slo.period} budget lasts {human_duration(alert.budget_lasts_s)}. On a total outage "
        f"this alert fires after {human_duration(alert.detection_s)}, having spent "
        f"{_round_pct(alert.budget_spent)} of the budget, and resets {human_duration(alert.reset_s)} after "
        f"recovery.")
    annotations = (("summary", summary), ("description", description), ("slo", slo_statement(slo)),
                   ("definition", slo_definition(slo)), *_runbook(runbook, alert.name))
    return Rule(expr, alert=alert.name, labels=_with(labels, ("severity", alert.severity)),
                annotations=annotations)


def _ratio_rules(slo: Slo, evaluation_s: int) -> list[Rule]:
    """One error ratio per window. A saturation SLO records its event first (the ratio over one evaluation
    interval: 1 or 0), then averages it over each longer window."""
    if slo.sli is None or slo.sli.kind != "gauge":
        return [Rule(slo_ratio_expr(slo, prometheus_duration(w)), record=SLO_ERROR_RATIO.name(prometheus_duration(w)),
                     labels=slo.labels) for w in slo.windows_s]
    event = SLO_ERROR_RATIO.name(prometheus_duration(evaluation_s))
    rules = [Rule(slo_indicator_expr(slo), record=event, labels=slo.labels)]
    recorded = selector(event, equal(slo.labels))
    rules += [Rule(f"avg_over_time({recorded}[{prometheus_duration(w)}])",
                   record=SLO_ERROR_RATIO.name(prometheus_duration(w)), labels=slo.labels)
              for w in slo.windows_s if w != evaluation_s]
    return rules


def _absent_hint(slo: Slo) -> str:
    if slo.sli is not None and slo.sli.source != "llmslo telemetry":
        return f"that the server exposes {slo.sli.source}'s own /metrics"
    return "that the server exposes llmslo metrics"


def slo_group(slo: Slo, evaluation_s: int = 60) -> RuleGroup:
    """Recording rules (one per window, the objective, the budget left) then the alerts of one SLO
    (``evaluation_s``: the rules' evaluation interval, the event of a saturation SLO)."""
    rules = _ratio_rules(slo, evaluation_s)
    rules.append(Rule(f"vector({number(slo.spec.objective / 100)})", record=SLO_OBJECTIVE.name(), labels=slo.labels))
    period_ratio = selector(SLO_ERROR_RATIO.name(slo.period), equal(slo.labels))
    rules.append(Rule(f"1 - {period_ratio} / {number(slo.budget)}", record=SLO_BUDGET_REMAINING.name(),
                      labels=slo.labels))
    runbook = slo.spec.runbook_url
    rules.extend(_burn_alert_rule(slo, a, slo.labels, runbook) for a in slo.alerts)
    absent_labels = _with(slo.labels, ("severity", "ticket"))
    rules.append(Rule(
        f"absent({slo_absent_selector(slo)})", alert=slo.absent_alert, for_s=slo.absent_for_s, labels=absent_labels,
        annotations=(
            ("summary", f"{slo.service}/{slo.name}: no data for {prometheus_duration(slo.absent_for_s)}"),
            ("description", f"{slo_absent_selector(slo)} has no series: the SLO cannot be evaluated and its "
                            f"burn-rate alerts cannot fire. Check the scrape target, the selector and "
                            f"{_absent_hint(slo)}."),
            ("slo", slo_statement(slo)),
            *_runbook(runbook, slo.absent_alert),
        )))
    return RuleGroup(f"llmslo-{slo.service}-{slo.name}", tuple(rules))


# --- operational ------------------------------------------------------------------------------------------


def operational_matchers(spec: Spec, metric: Metric | None) -> list[Matcher]:
    """The service's job plus those selector labels that ``metric`` carries (``None``: the ``up`` series)."""
    pairs = {"job": spec.job}
    for key, value in spec.selector:
        if key in TARGET_LABELS or (metric is not None and key in metric.labels):
            pairs[key] = value
    return equal(sorted(pairs.items()))


def _op(spec: Spec, key: str) -> tuple[Metric, list[Matcher]]:
    metric = METRICS_BY_KEY[key]
    return metric, operational_matchers(spec, metric)


def operational_rules(model: Model, alert: OperationalAlert) -> list[Rule]:
    """The rules of one operational alert (recording rules first when it needs any)."""
    spec = model.spec
    op = spec.operational
    labels = model.labels
    runbook = spec.runbook_url
    name = alert.name
    service = spec.service

    def make(expr: str, severity: str, for_s: int, summary: str, description: str) -> Rule:
        return Rule(expr, alert=name, for_s=for_s, labels=_with(labels, ("severity", severity)),
                    annotations=(("summary", f"{service}: {summary}"), ("description", description),
                                 *_runbook(runbook, name)))

    if alert.kind == "queue_saturation" and op.queue_saturation is not None:
        c = op.queue_saturation
        queued, q_sel = _op(spec, "queued")
        capacity, c_sel = _op(spec, "queue_capacity")
        expr = f"{selector(queued.name, q_sel)} / ({selector(capacity.name, c_sel)} > 0) > {number(c.threshold)}"
        return [make(expr, c.severity, c.for_s, f"request queue above {_pct(c.threshold)} of capacity",
                     f"The bounded request queue has been above {_pct(c.threshold)} of its capacity for "
                     f"{prometheus_duration(c.for_s)}; arrivals will soon be rejected with 429 (queue_full). "
                     f"Add capacity or shed lower-priority traffic.")]
    if alert.kind == "rejections" and op.rejections is not None:
        r = op.rejections
        rejected, r_sel = _op(spec, "rejected_requests")
        requests, t_sel = _op(spec, "requests")
        window = prometheus_duration(r.window_s)
        expr = (f"{_sum_rate(rejected.name, [*r_sel, one_of('reject_reason', r.reasons)], window)}"
                f" / ({_sum_rate(requests.name, t_sel, window)} > 0) > {number(r.threshold)}")
        return [make(expr, r.severity, r.for_s, f"more than {_pct(r.threshold)} of requests rejected",
                     f"Over {window}, more than {_pct(r.threshold)} of requests were rejected for "
                     f"{' or '.join(r.reasons)}, for {prometheus_duration(r.for_s)}; {rejected.name} by "
                     f"reject_reason says which.")]
    if alert.kind == "breaker_open" and op.breaker_open is not None:
        b = op.breaker_open
        breaker, b_sel = _op(spec, "breaker_state")
        # Not closed, rather than open: a breaker whose probes keep failing cycles open -> half_open -> open,
        # and a condition on the open series alone restarts its `for` at every probe, so it never fires.
        tripped = selector(breaker.name, [*b_sel, one_of("state", ("open", "half_open"))])
        expr = f"max without (state) ({tripped}) == 1"
        return [make(expr, b.severity, b.for_s, "circuit breaker open",
                     f"A circuit breaker has been open or half-open (its probes failing) for "
                     f"{prometheus_duration(b.for_s)}: requests on its route are refused (circuit_open) "
                     f"until probes succeed.")]
    if alert.kind == "drain_too_long" and op.drain_too_long is not None:
        d = op.drain_too_long
        draining, d_sel = _op(spec, "draining")
        backend, b_sel = _op(spec, "backend_draining")  # a gateway draining one of its backends
        expr = f"{selector(draining.name, d_sel)} == 1 or {selector(backend.name, b_sel)} == 1"
        return [make(expr, d.severity, d.budget_s, "drain exceeded its budget",
                     f"An instance (or a gateway's backend) has been draining for longer than its budget of "
                     f"{prometheus_duration(d.budget_s)}: terminate the remaining requests or put it back in "
                     f"the pool and skip this update.")]
    if alert.kind == "summaries_dropped" and op.summaries_dropped is not None:
        s = op.summaries_dropped
        dropped, s_sel = _op(spec, "summaries_dropped")
        window = prometheus_duration(s.window_s)
        expr = f"increase({selector(dropped.name, s_sel)}[{window}]) > 0"
        return [make(expr, s.severity, 0, "request summaries dropped",
                     f"Request summaries were dropped in the last {window} (queue full or store errors): the "
                     f"offline analysis is missing requests.")]
    if alert.kind == "scrape_target_missing" and op.scrape_target_missing is not None:
        m = op.scrape_target_missing
        up = selector("up", operational_matchers(spec, None))
        expr = f"{up} == 0 or absent({up})"
        return [make(expr, m.severity, m.for_s, "scrape target down or missing",
                     f"A target of job {quote(spec.job)} has been down, or the job has had no target, "
                     f"for {prometheus_duration(m.for_s)}: every llmslo SLO of this service is blind.")]
    if alert.kind == "gpu_memory" and op.gpu_memory is not None:
        g = op.gpu_memory
        used, u_sel = _op(spec, "gpu_memory_used")
        total, t_sel = _op(spec, "gpu_memory_total")
        expr = f"{selector(used.name, u_sel)} / ({selector(total.name, t_sel)} > 0) > {number(g.threshold)}"
        return [make(expr, g.severity, g.for_s, f"GPU memory above {_pct(g.threshold)}",
                     f"A GPU has used more than {_pct(g.threshold)} of its memory for "
                     f"{prometheus_duration(g.for_s)}: long contexts may soon fail with out-of-memory errors.")]
    if alert.kind == "version_skew" and op.version_skew is not None:
        return _version_skew_rules(model, alert, make)
    raise ValueError(f"unknown operational alert {alert.kind!r}")


def _version_skew_rules(model: Model, alert: OperationalAlert, make: _Maker) -> list[Rule]:
    spec = model.spec
    v = spec.operational.version_skew
    assert v is not None
    window = prometheus_duration(v.window_s)
    factor = number(v.factor)
    if alert.name.endswith("Errors"):
        requests, sel = _op(spec, "requests")
        record = VERSION_ERROR_RATIO.name(window)
        rec = selector(record, equal(model.labels))
        events = _sum_rate(requests.name, sel, window, "model, version")
        errors = _sum_rate(requests.name, [*sel, ("finish_reason", "=", "error")], window, "model, version")
        ratio = Rule(f"({errors} or 0 * {events}) / ({events} > 0)", record=record, labels=model.labels)
        expr = (f"{rec} > {number(v.error_floor)}"
                f" and {rec} > on (model) group_left () ({factor} * min by (model) ({rec}))")
        return [ratio, make(expr, v.severity, v.for_s, "a version fails more often than its peers",
                            f"One version's error ratio over {window} is above {_pct(v.error_floor)} and more "
                            f"than {factor}× the best version's of the same model, for "
                            f"{prometheus_duration(v.for_s)}. Compare the versions before continuing the rollout; "
                            f"roll back if the new version is the worse one.")]
    ttft, sel = _op(spec, "ttft")
    record = VERSION_TTFT_P95.name(window)
    rec = selector(record, equal(model.labels))
    p95 = Rule(f"histogram_quantile(0.95, {_sum_rate(ttft.bucket, sel, window, 'model, version, le')})",
               record=record, labels=model.labels)
    expr = f"{rec} > on (model) group_left () ({factor} * min by (model) ({rec}))"
    return [p95, make(expr, v.severity, v.for_s, "a version's TTFT p95 is worse than its peers'",
                      f"One version's TTFT p95 over {window} (a bucket estimate) is more than {factor}× the best "
                      f"version's of the same model, for {prometheus_duration(v.for_s)}. Compare the versions "
                      f"before continuing the rollout.")]


def generate_groups(model: Model) -> tuple[RuleGroup, ...]:
    """All rule groups of a model: one per SLO, then one for the operational alerts."""
    groups = [slo_group(slo, model.spec.evaluation_interval_s) for slo in model.slos]
    operational: list[Rule] = []
    for alert in model.operational:
        operational.extend(operational_rules(model, alert))
    recording = [r for r in operational if r.record]
    alerting = [r for r in operational if r.alert]
    if operational:
        groups.append(RuleGroup(f"llmslo-{model.spec.service}-operational", tuple(recording + alerting)))
    return tuple(groups)
