"""Model -> ``promtool test rules`` files proving how every generated alert behaves.

For every burn-rate alert of every SLO, two test groups with synthetic counters:

- **total outage**: one long window of healthy traffic (half the budget burned), then every event bad. The
  alert is silent before the outage and (when the slack leaves room) shortly before the Workbook detection
  time, firing by the detection time plus slack, and resolved once the short window has cleared after
  recovery;
- **partial outage**: healthy traffic, then a bad ratio 10% above the alert's threshold (the budget burned
  at the alert's own rate): silent before, firing by the time the long window crosses plus slack.

Then a **no traffic** group (counters present and flat: nothing fires, no NaN) and an **absent data** group
(the series vanish: the absent-data alert fires after its ``for``, and resolves when they return). SLOs that
read disjoint series share their groups, so promtool evaluates the rules once for all of them.
Every operational alert gets a group: silent when idle and when healthy, firing after its condition held
for its ``for`` (plus slack), resolved after recovery.

Cost and resolution: promtool evaluates every rule at every evaluation step, so a test of a 3-day window at
a 1-minute step takes minutes. A group is therefore sampled every twelfth of its alert's short window (at
least the scrape interval) and evaluated at that step (at least the spec's evaluation interval); groups are
split into one file per evaluation interval. Slack is one sample interval plus one evaluation interval: a
change shows in the first sample after it, and in the first evaluation after that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from llmslo.rules._durations import human_duration, prometheus_duration
from llmslo.rules._errors import SpecError
from llmslo.rules._generator import Rule, RuleGroup, operational_matchers, slo_metrics, slo_series_names
from llmslo.rules._model import BurnRateAlert, Model, OperationalAlert, Slo
from llmslo.rules._promql import Matcher, equal, le_forms, selector
from llmslo.telemetry import METRICS_BY_KEY

STALE = "stale"
Value = float | int | str | None
"""A sample: a number, ``None`` for no sample, or :data:`STALE` for a staleness marker."""
LabelSet = tuple[tuple[str, str], ...]
SAMPLES_PER_SHORT_WINDOW = 12
"""Test series are sampled this many times per short window of the alert under test."""
INSTANCE = "server-1:8000"
"""The ``instance`` label of synthetic per-process series."""
MAX_PROOF_STEPS = 50_000
"""Most samples in one phase of a test series. A spec whose windows or ``for`` durations need more (say a
``for`` of 30d at a 30 s scrape interval: 86,400) is refused before any list is built: its tests would take
promtool hours, and building them would take minutes and gigabytes here."""


@dataclass(frozen=True)
class Check:
    """At ``at_s`` seconds, alert ``alert`` fires with exactly ``firing`` (label sets); empty: silent."""

    alert: str
    at_s: int
    firing: tuple[LabelSet, ...] = ()


@dataclass(frozen=True)
class Proof:
    """One promtool test group: series sampled every ``interval_s``, rules evaluated every ``eval_s``."""

    name: str
    interval_s: int
    eval_s: int
    series: tuple[tuple[str, tuple[Value, ...]], ...]
    checks: tuple[Check, ...]


# --- series text ------------------------------------------------------------------------------------------


def _num(value: float | int) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else repr(value)


def _number(value: Value) -> float | None:
    return None if value is None or isinstance(value, str) else value


def encode(values: Sequence[Value]) -> str:
    """promtool's expanding notation: ``0+10x5`` for six values of an arithmetic run, ``_x3`` for three
    missing samples, ``stale`` for a staleness marker."""
    tokens: list[str] = []
    i, n = 0, len(values)
    while i < n:
        v = values[i]
        if v is None:
            j = i
            while j < n and values[j] is None:
                j += 1
            tokens.append("_" if j - i == 1 else f"_x{j - i}")
            i = j
            continue
        if isinstance(v, str):
            tokens.append(v)
            i += 1
            continue
        j = i + 1
        step: float = 0
        following = _number(values[j]) if j < n else None
        if following is not None:
            step = following - v
            while j < n:
                current, previous = _number(values[j]), _number(values[j - 1])
                if current is None or previous is None or current - previous != step:
                    break
                j += 1
        if j - i == 1:
            tokens.append(_num(v))
        else:
            tokens.append(f"{_num(v)}{'+' if step >= 0 else '-'}{_num(abs(step))}x{j - i - 1}")
        i = j
    return " ".join(tokens)


def counter(phases: Sequence[tuple[int, float | int]]) -> list[Value]:
    """Cumulative counter values from 0 at time 0, one per step: ``phases`` are (steps, increment per step)."""
    values: list[Value] = [0]
    total: float | int = 0
    for steps, increment in phases:
        for _ in range(steps):
            total += increment
            values.append(total)
    return values


def gauge(phases: Sequence[tuple[int, Value]]) -> list[Value]:
    """Gauge values, one per step from time 0 (the first phase also sets the value at time 0)."""
    values: list[Value] = [phases[0][1]] if phases else []
    for steps, value in phases:
        values.extend([value] * steps)
    return values


# --- timing -----------------------------------------------------------------------------------------------


def _ceil_to(seconds: float, step: int) -> int:
    return math.ceil(seconds / step - 1e-9) * step


def _floor_to(seconds: float, step: int) -> int:
    return math.floor(seconds / step + 1e-9) * step


class _TooLong(Exception):
    """A proof would need more than :data:`MAX_PROOF_STEPS` samples in one phase."""

    def __init__(self, steps: int, interval_s: int) -> None:
        super().__init__(steps, interval_s)
        self.steps = steps
        self.interval_s = interval_s

    def refuse(self, field: str, alert: str) -> SpecError:
        """The spec error naming ``field`` (what to shorten) for ``alert``'s tests."""
        return SpecError(field, f"the promtool tests of {alert} would sample a series {self.steps:,} times, "
                                f"every {prometheus_duration(self.interval_s)} (at most {MAX_PROOF_STEPS:,}): "
                                "shorten it, scrape less often (scrape.interval), or generate the rules "
                                "without --tests")


@dataclass(frozen=True)
class _Clock:
    """Sample interval and evaluation interval of one test group, seconds."""

    interval_s: int
    eval_s: int

    @classmethod
    def for_window(cls, model: Model, short_window_s: int) -> _Clock:
        scrape = model.spec.scrape_interval_s
        interval = scrape * max(1, short_window_s // (SAMPLES_PER_SHORT_WINDOW * scrape))
        return cls(interval, max(interval, model.spec.evaluation_interval_s))

    @property
    def slack_s(self) -> int:
        return self.interval_s + self.eval_s

    def steps(self, seconds: float) -> int:
        """Whole sample steps covering ``seconds``; :class:`_TooLong` beyond :data:`MAX_PROOF_STEPS`."""
        steps = _ceil_to(seconds, self.interval_s) // self.interval_s
        if steps > MAX_PROOF_STEPS:
            raise _TooLong(steps, self.interval_s)
        return steps

    def at(self, seconds: float) -> int:
        """The last evaluation at or before ``seconds``."""
        return _floor_to(seconds, self.eval_s)

    def after(self, seconds: float) -> int:
        """The first evaluation at or after ``seconds`` plus slack."""
        return _ceil_to(seconds + self.slack_s, self.eval_s)

    def before(self, seconds: float) -> int:
        """The last evaluation at or before ``seconds`` minus slack."""
        return _floor_to(seconds - self.slack_s, self.eval_s)

    def starts(self, lengths_s: Sequence[float]) -> tuple[list[int], list[int]]:
        """Steps of consecutive phases of ``lengths_s`` seconds, and the time each starts (plus the end)."""
        steps = [self.steps(x) for x in lengths_s]
        times = [sum(steps[:i]) * self.interval_s for i in range(len(steps) + 1)]
        return steps, times


def _proof(name: str, clock: _Clock, series: Sequence[tuple[str, Sequence[Value]]],
           checks: Sequence[Check]) -> Proof:
    kept = tuple(sorted({c for c in checks if c.at_s > 0}, key=lambda c: (c.at_s, c.alert)))
    return Proof(name, clock.interval_s, clock.eval_s, tuple((s, tuple(v)) for s, v in series), kept)


def _labels(*parts: LabelSet | Sequence[Matcher]) -> LabelSet:
    """Merge label pairs and equality matchers into one sorted label set (later parts win)."""
    merged: dict[str, str] = {}
    for part in parts:
        for item in part:
            merged[item[0]] = item[-1]
    return tuple(sorted(merged.items()))


# --- SLO proofs -------------------------------------------------------------------------------------------


def _events_per_step(budget: Decimal) -> int:
    """A power of ten that makes half the budget a whole number of bad events per step."""
    n = 1000
    while (Decimal(n) * budget / 2) % 1 and n < 10**9:
        n *= 10
    return n


def _time_slice(slo: Slo) -> bool:
    """Whether ``slo`` counts rule evaluations of a gauge (saturation), not events of counters."""
    return slo.sli is not None and slo.sli.kind == "gauge"


def _gauge_values(slo: Slo, phases: Sequence[tuple[int, int, int]]) -> list[Value]:
    """A saturation SLO's gauge: 0 in phases without bad events, above its limit in phases of only bad ones."""
    sli = slo.sli
    assert sli is not None
    above = sli.threshold + 1 if sli.threshold >= 1 or slo.spec.metric != "kv_usage" else (sli.threshold + 1) / 2
    levels: list[tuple[int, Value]] = []
    for steps, events, bad in phases:
        if bad not in (0, events) or (bad and not events):
            raise ValueError("a saturation SLO's gauge is either under its limit or above it for a whole phase")
        levels.append((steps, above if bad else 0))
    return gauge(levels)


def _sli_series(slo: Slo, phases: Sequence[tuple[int, int, int]], le_form: int) -> list[tuple[str, list[Value]]]:
    sli = slo.sli
    assert sli is not None
    sel = list(sli.matchers)
    if sli.kind == "gauge":
        return [(selector(sli.name, sel), _gauge_values(slo, phases))]
    events = counter([(s, n) for s, n, _ in phases])
    good = counter([(s, n - b) for s, n, b in phases])
    if sli.kind == "histogram":
        forms = le_forms(sli.threshold)
        le: Matcher = ("le", "=", forms[le_form % len(forms)])
        return [(selector(sli.bucket, [*sel, le]), good), (selector(sli.count, sel), events)]
    bad = counter([(s, b) for s, _, b in phases])
    return [(selector(sli.name, [*sel, (sli.label, "=", sli.good)]), good),
            (selector(sli.name, [*sel, (sli.label, "=", sli.bad[0])]), bad)]


def slo_series(slo: Slo, phases: Sequence[tuple[int, int, int]], le_form: int = 0) -> list[tuple[str, list[Value]]]:
    """The counters of ``slo`` for ``phases`` of (steps, events per step, bad events per step).

    Availability SLOs that do not count rejections get as many rejected requests as events besides. Latency
    SLOs write the threshold bucket's ``le`` in spelling ``le_form`` of :func:`le_forms`, so the tests cover
    both ``le="2"`` and ``le="2.0"``. A saturation SLO gets its gauge instead, under or above its limit.
    """
    if slo.sli is not None:
        return _sli_series(slo, phases, le_form)
    spec = slo.spec
    sel = equal(spec.selector)
    events = counter([(s, n) for s, n, _ in phases])
    good = counter([(s, n - b) for s, n, b in phases])
    if spec.kind == "goodput":
        attempted, good_metric = slo_metrics(slo)
        return [(selector(attempted.name, sel), events), (selector(good_metric.name, sel), good)]
    if spec.kind == "latency":
        histogram = slo_metrics(slo)[0]
        assert spec.threshold_s is not None
        forms = le_forms(spec.threshold_s)
        le: Matcher = ("le", "=", forms[le_form % len(forms)])
        return [(selector(histogram.bucket, [*sel, le]), good), (selector(histogram.count, sel), events)]
    requests = slo_metrics(slo)[0].name
    bad = counter([(s, b) for s, _, b in phases])
    series = [(selector(requests, [*sel, ("finish_reason", "=", "stop")]), good),
              (selector(requests, [*sel, ("finish_reason", "=", spec.bad[0])]), bad)]
    if "rejected" not in spec.bad:  # as many rejections as events: they must count on neither side
        series.append((selector(requests, [*sel, ("finish_reason", "=", "rejected")]), events))
    return series


def _crossing_s(window_s: int, threshold: float, healthy: float, outage: float) -> float:
    """Seconds after an outage starts until the ratio over ``window_s`` (full of healthy traffic before)
    exceeds ``threshold``: ``(h (W - t) + f t) / W > thr``."""
    return window_s * (threshold - healthy) / (outage - healthy)


@dataclass(frozen=True)
class _Burn:
    """One SLO's alert under test, with its numbers."""

    slo: Slo
    alert: BurnRateAlert
    rule: Rule

    @property
    def n(self) -> int:
        return _events_per_step(self.slo.budget)

    @property
    def h_bad(self) -> int:
        """Bad events per step of healthy traffic: half the budget (none for a gauge, under its limit or not)."""
        return 0 if _time_slice(self.slo) else int(Decimal(self.n) * self.slo.budget / 2)

    @property
    def healthy(self) -> float:
        return self.h_bad / self.n

    @property
    def p_bad(self) -> int:
        return min(self.n, math.ceil(self.n * float(self.alert.threshold) * 1.1))

    def crossing_s(self, outage: float) -> float:
        """Seconds until both windows exceed the threshold under a bad ratio ``outage``."""
        thr = float(self.alert.threshold)
        return max(_crossing_s(w, thr, self.healthy, outage)
                   for w in (self.alert.long_window_s, self.alert.short_window_s))

    @property
    def reset_s(self) -> float:
        """Seconds after a total outage (longer than the short window) ends until the short window clears."""
        return self.alert.short_window_s * (1 - float(self.alert.threshold)) / (1 - self.healthy)


def _burn_proofs(burns: Sequence[_Burn], model: Model) -> list[Proof]:
    """The total- and partial-outage groups of one burn-rate alert, for every SLO at once (their series are
    independent, so one group drives them all and promtool evaluates the rules once)."""
    alert = burns[0].alert
    clock = _Clock.for_window(model, alert.short_window_s)
    slack = prometheus_duration(clock.slack_s)
    windows = f"{alert.long_window}/{alert.short_window} alerts of {', '.join(b.slo.name for b in burns)}"
    healthy_s = clock.steps(alert.long_window_s) * clock.interval_s

    # total outage after one long window of healthy traffic, then recovery
    fire = {b.alert.name: clock.after(healthy_s + b.crossing_s(1.0)) for b in burns}
    outage_s = max(max(fire.values()) - healthy_s, alert.short_window_s + clock.interval_s)
    (h_steps, o_steps, _), (_, t0, t1, _) = clock.starts([healthy_s, outage_s, 0])
    resets = {b.alert.name: clock.after(t1 + b.reset_s) for b in burns}
    tail_steps = clock.steps(max(resets.values()) + clock.eval_s - t1)
    series: list[tuple[str, list[Value]]] = []
    checks: list[Check] = []
    for b in burns:
        name, firing = b.alert.name, (b.rule.labels,)
        series += slo_series(b.slo, [(h_steps, b.n, b.h_bad), (o_steps, b.n, b.n), (tail_steps, b.n, b.h_bad)])
        checks += [Check(name, clock.at(t0)), Check(name, fire[name], firing), Check(name, resets[name])]
        if clock.before(t0 + b.crossing_s(1.0)) > t0:
            checks.append(Check(name, clock.before(t0 + b.crossing_s(1.0))))
        if clock.before(t1 + b.reset_s) > fire[name]:
            checks.append(Check(name, clock.before(t1 + b.reset_s), firing))
    times = "; ".join(f"{b.alert.name} {human_duration(b.crossing_s(1.0))}, resets after "
                      f"{human_duration(b.reset_s)}" for b in burns)
    total = _proof(f"{windows}: a total outage after {prometheus_duration(t0)} of healthy traffic fires "
                   f"within the detection time + {slack} slack and resets after recovery ({times})",
                   clock, series, checks)

    if any(_time_slice(b.slo) for b in burns):  # a gauge has no partial outage within a step
        return [total]

    # partial outage burning 10% above each alert's rate
    fire = {b.alert.name: clock.after(t0 + b.crossing_s(b.p_bad / b.n)) for b in burns}
    p_steps = clock.steps(max(fire.values()) + clock.eval_s - t0)
    series, checks = [], []
    for b in burns:
        name = b.alert.name
        series += slo_series(b.slo, [(h_steps, b.n, b.h_bad), (p_steps, b.n, b.p_bad)], le_form=1)
        checks += [Check(name, clock.at(t0)), Check(name, fire[name], (b.rule.labels,))]
        if clock.before(t0 + b.crossing_s(b.p_bad / b.n)) > t0:
            checks.append(Check(name, clock.before(t0 + b.crossing_s(b.p_bad / b.n))))
    times = "; ".join(f"{b.alert.name} at {b.p_bad / b.n / float(b.slo.budget):.3g}× within "
                      f"{human_duration(b.crossing_s(b.p_bad / b.n))}" for b in burns)
    partial = _proof(f"{windows}: a partial outage burning the budget just above the alert's rate fires "
                     f"within the time the windows take to cross + {slack} slack ({times})", clock, series, checks)
    return [total, partial]


def _no_traffic_proof(slos: Sequence[Slo], model: Model) -> Proof:
    """Flat counters: every rate is 0 whatever the window, so the longest short window shows it."""
    alerts = slos[0].alerts
    clock = _Clock.for_window(model, max(a.short_window_s for a in alerts))
    end = _ceil_to(max(a.short_window_s for a in alerts) + clock.slack_s, clock.eval_s)
    times = {_ceil_to(a.short_window_s + clock.slack_s, clock.eval_s) for a in alerts} | {end}
    series: list[tuple[str, list[Value]]] = []
    checks: list[Check] = []
    for slo in slos:
        series += slo_series(slo, [(clock.steps(end), 0, 0)])
        checks += [Check(a.name, min(t, end)) for a in slo.alerts for t in times] + [Check(slo.absent_alert, end)]
    names = ", ".join(slo.name for slo in slos)
    idle = "idle gauges" if any(_time_slice(slo) for slo in slos) else "flat counters"
    return _proof(f"alerts of {names}: with no traffic ({idle}) none fires", clock, series, checks)


def _absent_proof(slos: Sequence[tuple[Slo, Rule]], model: Model) -> Proof:
    """Every SLO's series vanish (staleness marker, then no sample) and come back."""
    clock = _Clock(model.spec.scrape_interval_s, model.spec.evaluation_interval_s)
    for_s = model.spec.absent_for_s
    (live_steps, gone_steps, back_steps), (_, gone_at, back_at, _) = clock.starts(
        [max(for_s, 600), for_s + clock.slack_s + clock.eval_s, 600])
    series: list[tuple[str, list[Value]]] = []
    checks: list[Check] = []
    for slo, rule in slos:
        for text, values in slo_series(slo, [(live_steps, 1000, 0)]):
            restart = [0] * back_steps if _time_slice(slo) else counter([(back_steps - 1, 1000)])
            series.append((text, [*values, STALE, *([None] * (gone_steps - 1)), *restart]))
        name = slo.absent_alert
        selected = slo.sli.matchers if slo.sli is not None else slo.spec.selector
        checks += [Check(name, clock.at(gone_at)), Check(name, clock.before(gone_at + for_s)),
                   Check(name, clock.after(gone_at + for_s), (_labels(rule.labels, selected),)),
                   Check(name, clock.after(back_at))]
    names = ", ".join(slo.name for slo, _ in slos)
    return _proof(f"absent-data alerts of {names}: series vanishing for {prometheus_duration(for_s)} fire, "
                  "their return resolves", clock, series, checks)


def _selected(slo: Slo) -> dict[str, str]:
    if slo.sli is not None:
        return {k: v for k, op, v in slo.sli.matchers if op == "="}
    return dict(slo.spec.selector)


def _overlap(a: Slo, b: Slo) -> bool:
    """Whether two SLOs may read the same series (same metric, selectors that do not exclude each other), or
    cannot share test groups (a saturation SLO's gauge and another's counters)."""
    if _time_slice(a) != _time_slice(b):
        return True
    if not slo_series_names(a) & slo_series_names(b):
        return False
    sa, sb = _selected(a), _selected(b)
    return all(sa[k] == sb[k] for k in sa.keys() & sb.keys())


def _batches(slos: Sequence[Slo]) -> list[list[Slo]]:
    """SLOs grouped so that no two in a batch read the same series: a batch shares its test groups."""
    batches: list[list[Slo]] = []
    for slo in slos:
        for batch in batches:
            if not any(_overlap(slo, other) for other in batch):
                batch.append(slo)
                break
        else:
            batches.append([slo])
    return batches


def _slo_proofs(model: Model, groups: Sequence[RuleGroup]) -> list[Proof]:
    by_name = {g.name: g for g in groups}
    rules = {r.alert: r for slo in model.slos for r in by_name[f"llmslo-{slo.service}-{slo.name}"].rules if r.alert}
    proofs: list[Proof] = []
    for batch in _batches(model.slos):
        for i in range(len(model.spec.burn_alerts)):
            try:
                proofs.extend(_burn_proofs([_Burn(slo, slo.alerts[i], rules[slo.alerts[i].name])
                                            for slo in batch], model))
            except _TooLong as exc:
                raise exc.refuse(f"burn_alerts[{i}]", batch[0].alerts[i].name) from None
        try:
            proofs.append(_no_traffic_proof(batch, model))
        except _TooLong as exc:
            raise exc.refuse("burn_alerts", f"the no-traffic group of {batch[0].name}") from None
        try:
            proofs.append(_absent_proof([(slo, rules[slo.absent_alert]) for slo in batch], model))
        except _TooLong as exc:
            raise exc.refuse("absent_for", batch[0].absent_alert) from None
    return proofs


# --- operational proofs -----------------------------------------------------------------------------------


def _target(model: Model, key: str | None, *extra: Matcher) -> list[Matcher]:
    """Matchers of a synthetic series scraped from one instance of the service's job."""
    metric = METRICS_BY_KEY[key] if key is not None else None
    return [*operational_matchers(model.spec, metric), ("instance", "=", INSTANCE), *extra]


def _series_of(key: str, matchers: Sequence[Matcher], bucket: bool = False) -> str:
    metric = METRICS_BY_KEY[key]
    return selector(metric.bucket if bucket else metric.name, matchers)


def _queue_proof(model: Model, alert: OperationalAlert, rule: Rule, clock: _Clock) -> Proof:
    c = model.spec.operational.queue_saturation
    assert c is not None
    cap = 1000
    high = math.ceil(cap * min(1.0, float(c.threshold) + 0.1))
    steps, (_, ok, bad, rec, _) = clock.starts([300, 300, c.for_s + clock.slack_s + 120, 300])
    queued = _target(model, "queued")
    series = [(_series_of("queued", queued), gauge(list(zip(steps, (0, cap // 2, high, cap // 2), strict=True)))),
              (_series_of("queue_capacity", _target(model, "queue_capacity")), gauge([(sum(steps), cap)]))]
    name = alert.name
    checks = [Check(name, clock.at(ok - 1)), Check(name, clock.at(bad - 1)),
              Check(name, clock.after(bad + c.for_s), (_labels(queued, rule.labels),)),
              Check(name, clock.after(rec))]
    if clock.before(bad + c.for_s) > bad:
        checks.append(Check(name, clock.before(bad + c.for_s)))
    return _proof(f"{name}: idle and half-full queues are silent, {high} queued of {cap} fires after "
                  f"{prometheus_duration(c.for_s)}, draining the queue resets", clock, series, checks)


def _rejections_proof(model: Model, alert: OperationalAlert, rule: Rule, clock: _Clock) -> Proof:
    r = model.spec.operational.rejections
    assert r is not None
    n = 1000
    ok_rej = max(1, int(n * float(r.threshold) / 4))
    bad_rej = math.ceil(n * min(0.9, float(r.threshold) * 3))
    steps, (_, ok, bad, rec, _) = clock.starts([r.window_s, 2 * r.window_s, r.window_s + r.for_s + clock.slack_s + 120,
                                                2 * r.window_s])
    per_step = (0, ok_rej, bad_rej, ok_rej)
    totals = (0, n, n, n)
    rejected = counter(list(zip(steps, per_step, strict=True)))
    served = counter([(s, t - x) for s, t, x in zip(steps, totals, per_step, strict=True)])
    req = operational_matchers(model.spec, METRICS_BY_KEY["requests"])
    rej = [*operational_matchers(model.spec, METRICS_BY_KEY["rejected_requests"]), ("reject_reason", "=", r.reasons[0])]
    series = [(_series_of("rejected_requests", rej), rejected),
              (_series_of("requests", [*req, ("finish_reason", "=", "rejected")]), rejected),
              (_series_of("requests", [*req, ("finish_reason", "=", "stop")]), served)]
    thr, f_ok, f_bad = float(r.threshold), ok_rej / n, bad_rej / n
    cross = r.window_s * (thr - f_ok) / (f_bad - f_ok)
    clear = r.window_s * (f_bad - thr) / (f_bad - f_ok)
    name = alert.name
    checks = [Check(name, clock.at(ok - 1)), Check(name, clock.at(bad - 1)),
              Check(name, clock.after(bad + cross + r.for_s), (rule.labels,)), Check(name, clock.after(rec + clear))]
    return _proof(f"{name}: no traffic and {f_ok:.1%} rejected are silent, {f_bad:.0%} rejected fires once the "
                  f"{prometheus_duration(r.window_s)} ratio crossed and held {prometheus_duration(r.for_s)}, "
                  "recovery resets", clock, series, checks)


def _probe_period(clock: _Clock) -> int:
    """Samples per open/half-open cycle of a failing breaker in its proof: at least 3, and prime to the number
    of samples per evaluation, so the evaluations see every phase of the cycle (the half-open probe too)."""
    per_eval = max(1, clock.eval_s // clock.interval_s)
    period = 3
    while math.gcd(period, per_eval) != 1:
        period += 1
    return period


def _breaker_proof(model: Model, alert: OperationalAlert, rule: Rule, clock: _Clock) -> Proof:
    """A breaker open for ``for`` fires; so does one cycling open -> half-open (failed probe) -> open for
    ``for``, which never stays open that long; a closed breaker is silent."""
    b = model.spec.operational.breaker_open
    assert b is not None
    hold = b.for_s + clock.slack_s + 120
    steps, (_, opened, closed, flapping, recovered, _) = clock.starts([600, hold, 600, hold, 600])
    period = _probe_period(clock)
    cycle = ["open"] * (period - 1) + ["half_open"]
    states = (["closed"] * (steps[0] + 1) + ["open"] * steps[1] + ["closed"] * steps[2]
              + [cycle[i % period] for i in range(steps[3])] + ["closed"] * steps[4])
    base = _target(model, "breaker_state", ("breaker", "=", "upstream-a"))
    series = [(_series_of("breaker_state", [*base, ("state", "=", st)]), [1 if x == st else 0 for x in states])
              for st in ("closed", "half_open", "open")]
    name = alert.name
    firing = (_labels(base, rule.labels),)
    checks = [Check(name, clock.at(opened - 1)), Check(name, clock.after(opened + b.for_s), firing),
              Check(name, clock.after(closed)), Check(name, clock.at(flapping - 1)),
              Check(name, clock.after(flapping + b.for_s), firing), Check(name, clock.after(recovered))]
    for start in (opened, flapping):
        if clock.before(start + b.for_s) > start:
            checks.append(Check(name, clock.before(start + b.for_s)))
    return _proof(f"{name}: a breaker open, or cycling open and half-open (probes failing), for "
                  f"{prometheus_duration(b.for_s)} fires; closing resets", clock, series, checks)


def _state_proof(model: Model, alert: OperationalAlert, rule: Rule, clock: _Clock) -> Proof:
    """Drain too long, GPU memory: a gauge condition held for ``for``, then cleared."""
    op = model.spec.operational
    series_values: list[tuple[str, tuple[Value, Value]]]
    also: list[list[Matcher]] = []
    if alert.kind == "drain_too_long" and op.drain_too_long is not None:
        hold_for = op.drain_too_long.budget_s
        fired = _target(model, "draining")
        backend = _target(model, "backend_draining", ("backend", "=", "llama-a"))
        also = [backend]
        series_values = [(_series_of("draining", fired), (0, 1)), (_series_of("backend_draining", backend), (0, 1))]
        what = "a drain (an instance's and a gateway backend's)"
    elif alert.kind == "gpu_memory" and op.gpu_memory is not None:
        hold_for = op.gpu_memory.for_s
        total = 80 * 2**30
        high = math.ceil(total * (1 + float(op.gpu_memory.threshold)) / 2)
        fired = _target(model, "gpu_memory_used", ("gpu", "=", "0"))
        total_sel = _series_of("gpu_memory_total", _target(model, "gpu_memory_total", ("gpu", "=", "0")))
        series_values = [(_series_of("gpu_memory_used", fired), (total // 2, high)), (total_sel, (total, total))]
        what = "GPU memory near its limit"
    else:
        raise ValueError(f"no state proof for {alert.kind!r}")
    steps, (_, bad, ok, _) = clock.starts([600, hold_for + clock.slack_s + 120, 600])
    series = [(text, gauge([(steps[0], normal), (steps[1], tripped), (steps[2], normal)]))
              for text, (normal, tripped) in series_values]
    name = alert.name
    firing = tuple(_labels(m, rule.labels) for m in (fired, *also))
    checks = [Check(name, clock.at(bad - 1)), Check(name, clock.after(bad + hold_for), firing),
              Check(name, clock.after(ok))]
    if clock.before(bad + hold_for) > bad:
        checks.append(Check(name, clock.before(bad + hold_for)))
    return _proof(f"{name}: {what} for {prometheus_duration(hold_for)} fires, recovery resets", clock, series, checks)


def _dropped_proof(model: Model, alert: OperationalAlert, rule: Rule, clock: _Clock) -> Proof:
    s = model.spec.operational.summaries_dropped
    assert s is not None
    m = _target(model, "summaries_dropped", ("reason", "=", "queue_full"))
    steps, (_, drops, after, _) = clock.starts([s.window_s, 300, s.window_s + 600])
    series = [(_series_of("summaries_dropped", m), counter(list(zip(steps, (0, 5, 0), strict=True))))]
    name = alert.name
    checks = [Check(name, clock.at(drops - 1)), Check(name, clock.after(drops), (_labels(m, rule.labels),)),
              Check(name, clock.after(after + s.window_s))]
    return _proof(f"{name}: a flat counter is silent, drops fire at once, silence returns "
                  f"{prometheus_duration(s.window_s)} after the last drop", clock, series, checks)


def _scrape_proof(model: Model, alert: OperationalAlert, rule: Rule, clock: _Clock) -> Proof:
    t = model.spec.operational.scrape_target_missing
    assert t is not None
    m = _target(model, None)
    hold = t.for_s + clock.slack_s + 120
    steps, (_, down, back, gone, again, _) = clock.starts([600, hold, 600, hold, 600])
    values = gauge([(steps[0], 1), (steps[1], 0), (steps[2], 1)])
    values += [STALE, *([None] * (steps[3] - 1)), *([1] * steps[4])]
    name = alert.name
    job = [x for x in m if x[0] == "job"]
    checks = [Check(name, clock.at(down - 1)), Check(name, clock.after(down + t.for_s), (_labels(m, rule.labels),)),
              Check(name, clock.after(back)), Check(name, clock.after(gone + t.for_s), (_labels(job, rule.labels),)),
              Check(name, clock.after(again))]
    return _proof(f"{name}: a target down, or no target at all, for {prometheus_duration(t.for_s)} fires; its "
                  "return resets", clock, [(selector("up", m), values)], checks)


def _version_skew_proof(model: Model, alert: OperationalAlert, rule: Rule, clock: _Clock) -> Proof:
    v = model.spec.operational.version_skew
    assert v is not None
    steps, (_, equal_at, skew_at, rec_at, _) = clock.starts(
        [v.window_s, v.window_s, v.window_s + v.for_s + clock.slack_s + 120, v.window_s + 2 * clock.slack_s])
    n = 1000
    series: list[tuple[str, list[Value]]] = []
    key = "requests" if alert.name.endswith("Errors") else "ttft"
    base = operational_matchers(model.spec, METRICS_BY_KEY[key])
    for version in ("v1", "v2"):
        sel = [*base, ("instance", "=", f"{version}:8000"), ("version", "=", version)]
        if key == "requests":
            ok = max(1, int(n * float(v.error_floor) / 2))
            bad = math.ceil(n * min(0.9, float(v.error_floor) * 2 * float(v.factor)))
            errors = (0, ok, bad if version == "v2" else ok, ok)
            totals = (0, n, n, n)
            series.append((_series_of(key, [*sel, ("finish_reason", "=", "error")]),
                           counter(list(zip(steps, errors, strict=True)))))
            series.append((_series_of(key, [*sel, ("finish_reason", "=", "stop")]),
                           counter([(s, t - e) for s, t, e in zip(steps, totals, errors, strict=True)])))
            what = f"v2 failing {bad / n:.1%} against {ok / n:.1%}"
        else:
            bounds = METRICS_BY_KEY["ttft"].buckets_s
            for bound in (*bounds, math.inf):
                fast = n if bound >= 0.5 else (n // 2 if bound >= 0.3 else 0)
                slow = n if bound >= 2.0 else (n // 2 if bound >= 1.0 else 0)
                per_step = (0, fast, slow if version == "v2" else fast, fast)
                le = "+Inf" if bound == math.inf else le_forms(bound)[-1]
                series.append((_series_of(key, [*sel, ("le", "=", le)], bucket=True),
                               counter(list(zip(steps, per_step, strict=True)))))
            what = "v2 with a TTFT p95 near 2s against 0.5s"
    fired = [(k, "=", val) for k, _, val in base if k == "model"] + [("version", "=", "v2")]
    name = alert.name
    checks = [Check(name, clock.at(equal_at - 1)), Check(name, clock.at(skew_at - 1)),
              Check(name, clock.after(skew_at + v.window_s + v.for_s), (_labels(fired, rule.labels),)),
              Check(name, clock.after(rec_at + v.window_s))]
    return _proof(f"{name}: no traffic and two equal versions are silent, {what} fires after "
                  f"{prometheus_duration(v.for_s)}, recovery resets", clock, series, checks)


_OPERATIONAL_PROOFS = {
    "queue_saturation": _queue_proof,
    "rejections": _rejections_proof,
    "breaker_open": _breaker_proof,
    "drain_too_long": _state_proof,
    "gpu_memory": _state_proof,
    "summaries_dropped": _dropped_proof,
    "scrape_target_missing": _scrape_proof,
    "version_skew": _version_skew_proof,
}


# --- the files --------------------------------------------------------------------------------------------


def generate_proofs(model: Model, groups: Sequence[RuleGroup]) -> tuple[Proof, ...]:
    """Every proof of a model: the SLOs in spec order, then the operational alerts.

    Raises :class:`SpecError` naming the spec field to shorten when a proof would need more than
    :data:`MAX_PROOF_STEPS` samples in one phase.
    """
    by_name = {g.name: g for g in groups}
    proofs = _slo_proofs(model, groups)
    operational = by_name.get(f"llmslo-{model.spec.service}-operational")
    if operational is not None:
        rules = {r.alert: r for r in operational.rules if r.alert}
        clock = _Clock(model.spec.scrape_interval_s, model.spec.evaluation_interval_s)
        for alert in model.operational:
            try:
                proofs.append(_OPERATIONAL_PROOFS[alert.kind](model, alert, rules[alert.name], clock))
            except _TooLong as exc:
                raise exc.refuse(f"operational.{alert.kind}", alert.name) from None
    return tuple(proofs)


def proof_documents(model: Model, groups: Sequence[RuleGroup], rule_file: str) -> dict[int, dict[str, object]]:
    """promtool test files as plain data, one per evaluation interval (seconds), the spec's first.

    ``rule_file`` is the rules file relative to the test files' folder.
    """
    annotations = {r.alert: dict(r.annotations) for g in groups for r in g.rules if r.alert}
    by_eval: dict[int, list[dict[str, object]]] = {model.spec.evaluation_interval_s: []}
    for proof in generate_proofs(model, groups):
        alert_tests = [{"eval_time": prometheus_duration(c.at_s), "alertname": c.alert,
                        "exp_alerts": [{"exp_labels": dict(labels), "exp_annotations": annotations[c.alert]}
                                       for labels in c.firing]}
                       for c in proof.checks]
        by_eval.setdefault(proof.eval_s, []).append({
            "name": proof.name,
            "interval": prometheus_duration(proof.interval_s),
            "input_series": [{"series": s, "values": encode(v)} for s, v in proof.series],
            "alert_rule_test": alert_tests,
        })
    return {
        eval_s: {"rule_files": [rule_file], "evaluation_interval": prometheus_duration(eval_s), "tests": tests}
        for eval_s, tests in by_eval.items() if tests
    }
