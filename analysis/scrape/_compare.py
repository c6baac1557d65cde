"""Two scrapes of one server: counter rates and the distribution of the observations in between.

From two scrapes, :func:`compare_scrapes` gives rates over the interval: counter increase ÷ seconds,
with a reset detected when a value falls (or an OpenMetrics ``_created`` changes; the increase is then
the value after the reset), and the same quantiles, attainment and checks as
:func:`~llmslo.analysis.scrape.analyze_scrape` over the histogram increase. The interval is given in
seconds or taken from the scrapes' sample timestamps (Unix seconds). A series an engine profile marks as a
high-water mark (llama.cpp's ``llamacpp:n_tokens_max``, typed counter) is never read as a rate: it is
reported apart with its two values (:attr:`RateReport.high_water`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmslo.analysis.scrape._buckets import SloAttainment
from llmslo.analysis.scrape._checks import (
    DEFAULT_SCRAPE_QUANTILES,
    Finding,
    HistogramReport,
    MappedSeries,
    all_series,
    analyze_series,
    attainment_dict,
    finding_dict,
    histogram_dict,
    jsonable,
    mapped_dict,
    mapped_series,
    resolution_of,
    sample_values,
    series_name,
    slo_table,
)
from llmslo.analysis.scrape._parse import HistogramSeries, Labels, Scrape, ScrapeFormatError

__all__ = [
    "HighWaterMark",
    "RateReport",
    "SeriesRate",
    "compare_scrapes",
]


@dataclass(frozen=True)
class HighWaterMark:
    """A series that holds the largest value seen so far (whatever its exposed type): its values before and
    after, never a rate. ``fell``: the later value is smaller, so the server restarted in between."""

    name: str
    labels: Labels
    before: float | None
    after: float
    fell: bool


@dataclass(frozen=True)
class SeriesRate:
    """A counter series over the interval: values before and after, increase and rate (per second).

    ``reset``: the counter restarted in between (its value fell, or its ``_created`` changed); the
    increase is then the value after. ``appeared``: absent from the first scrape (counted from 0).
    """

    name: str
    labels: Labels
    before: float | None
    after: float
    increase: float
    rate_per_s: float
    reset: bool
    appeared: bool


@dataclass(frozen=True)
class RateReport:
    """What changed between two scrapes of the same server.

    ``interval_s`` and its ``interval_basis`` (``sample timestamps`` or ``given``); counter rates; the
    histograms of the observations made during the interval (bucket increases) with their quantiles,
    SLO attainment and checks; gauges before and after; series that vanished; high-water marks (never
    rates); which engine series measures which concept (``mapped``).
    """

    before: str
    after: str
    interval_s: float
    interval_basis: str
    counters: tuple[SeriesRate, ...]
    histograms: tuple[HistogramReport, ...]
    attainment: tuple[SloAttainment, ...]
    findings: tuple[Finding, ...]
    gauges: tuple[tuple[str, Labels, float | None, float], ...]
    vanished: tuple[str, ...]
    high_water: tuple[HighWaterMark, ...] = ()
    mapped: tuple[MappedSeries, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        out: dict[str, Any] = jsonable({
            "before": self.before, "after": self.after, "interval_s": self.interval_s,
            "interval_basis": self.interval_basis,
            "counters": [{"name": c.name, "labels": dict(c.labels), "before": c.before, "after": c.after,
                          "increase": c.increase, "rate_per_s": c.rate_per_s, "reset": c.reset,
                          "appeared": c.appeared} for c in self.counters],
            "histograms": [histogram_dict(h) for h in self.histograms],
            "slo_attainment": [attainment_dict(a) for a in self.attainment],
            "findings": [finding_dict(f) for f in self.findings],
            "gauges": [{"name": n, "labels": dict(lb), "before": b, "after": a} for n, lb, b, a in self.gauges],
            "vanished": list(self.vanished),
            "high_water_marks": [{"name": h.name, "labels": dict(h.labels), "before": h.before, "after": h.after,
                                  "fell": h.fell, "note": "largest value seen so far: not a rate"}
                                 for h in self.high_water],
            "mapped_series": [mapped_dict(m) for m in self.mapped],
            "quantile_note": "over the interval: bucket increases between the two scrapes; quantiles are bucket "
                             "estimates, means exact",
        })
        return out


def _created(scrape: Scrape) -> dict[tuple[str, Labels], float]:
    out: dict[tuple[str, Labels], float] = {}
    for fam, s in scrape.samples("counter", "histogram", "summary"):
        if s.name.endswith("_created"):
            out[(fam.name, s.labels)] = s.value
    return out


def _interval(before: Scrape, after: Scrape, interval_s: float | None) -> tuple[float, str]:
    if interval_s is not None:
        if not interval_s > 0 or not math.isfinite(interval_s):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
        return float(interval_s), "given"
    missing = [s.source for s in (before, after) if s.timestamp_s is None]
    if missing:
        raise ScrapeFormatError(
            missing[0], None, None,
            "its samples carry no timestamps, so the time between the scrapes is unknown: give it "
            "(--interval-s SECONDS)")
    assert before.timestamp_s is not None and after.timestamp_s is not None
    gap = after.timestamp_s - before.timestamp_s
    if not gap > 0:
        raise ScrapeFormatError(after.source, None, None,
                                f"its latest sample timestamp is not later than {before.source}'s "
                                f"({gap:+g} s): pass the earlier scrape first")
    return gap, "sample timestamps"


def compare_scrapes(
    before: Scrape,
    after: Scrape,
    *,
    interval_s: float | None = None,
    slo: Mapping[str, float] | None = None,
    quantiles: Sequence[float] = DEFAULT_SCRAPE_QUANTILES,
) -> RateReport:
    """Rates and interval distributions between two scrapes of one server (``before`` first).

    The interval is ``interval_s`` seconds when given, else the difference of the scrapes' latest
    sample timestamps. Counter rate = increase / interval (per second); a value that fell, or a changed
    ``_created``, is a reset and the increase is the value after it. Histograms are differenced bucket
    by bucket (reset: the later histogram is taken whole) and read as in :func:`analyze_scrape`.
    Raises :class:`ScrapeFormatError` when the interval is unknown or not positive.
    """
    table = slo_table(slo)
    span, basis = _interval(before, after, interval_s)
    created_before, created_after = _created(before), _created(after)

    def was_reset(family: str, labels: Labels) -> bool:
        a, b = created_before.get((family, labels)), created_after.get((family, labels))
        return a is not None and b is not None and a != b

    res = resolution_of(all_series(after), sample_values(after, "counter"), sample_values(after, "gauge"),
                        set(after.families))

    def high_water(name: str) -> bool:
        m = res.get(name)
        return m is not None and m.series.high_water

    old_counters = {(n, lb): v for n, lb, v in sample_values(before, "counter")}
    rates: list[SeriesRate] = []
    marks: list[HighWaterMark] = []
    new_keys: set[tuple[str, Labels]] = set()
    for fam, s in after.samples("counter"):
        if s.name.endswith("_created"):
            continue
        key = (s.name, s.labels)
        new_keys.add(key)
        old = old_counters.get(key)
        if high_water(s.name) or high_water(fam.name):
            marks.append(HighWaterMark(s.name, s.labels, old, s.value, old is not None and s.value < old))
            continue
        reset = old is not None and (s.value < old or was_reset(fam.name, s.labels))
        increase = s.value if old is None or reset else s.value - old
        rates.append(SeriesRate(s.name, s.labels, old, s.value, increase, increase / span, reset, old is None))
    old_series = {(h.family, h.labels): h for h in all_series(before)}
    deltas: list[HistogramSeries] = []
    restarted: list[HistogramSeries] = []
    seen_hist: set[tuple[str, Labels]] = set()
    for h in all_series(after):
        seen_hist.add((h.family, h.labels))
        delta, reset = _delta(old_series.get((h.family, h.labels)), h, was_reset(h.family, h.labels))
        deltas.append(delta)
        if reset:
            restarted.append(delta)
    counters = [(r.name, r.labels, r.increase) for r in rates]
    old_gauges = {(n, lb): v for n, lb, v in sample_values(before, "gauge")}
    gauges = tuple((n, lb, old_gauges.get((n, lb)), v) for n, lb, v in sample_values(after, "gauge"))
    later_gauges = [(n, lb, v) for n, lb, _, v in gauges]
    reports, attained, findings = analyze_series(deltas, counters, later_gauges, table, quantiles, over_interval=True,
                                                 resolution=res)
    extra = [
        Finding("counter_reset", "warning",
                f"{series_name(r.name, r.labels)} restarted between the scrapes ({r.before:g} → {r.after:g}): "
                "its increase is taken as the value after the restart, which misses whatever was counted "
                "before the restart", {"before": r.before or 0.0, "after": r.after})
        for r in rates if r.reset
    ]
    extra += [Finding("high_water_mark", "info",
                      f"{series_name(h.name, h.labels)} is a high-water mark (the largest value seen, though "
                      f"typed counter): {'-' if h.before is None else f'{h.before:g}'} → {h.after:g}; "
                      + ("it fell, so the server restarted in between" if h.fell else
                         "its rise is not a rate and is not shown as one"),
                      {"after": h.after, **({"before": h.before} if h.before is not None else {})})
              for h in marks]
    extra += [Finding("histogram_reset", "warning",
                      f"{series_name(h.family, h.labels)} restarted between the scrapes: the interval "
                      "distribution is the later histogram whole") for h in restarted]
    vanished = sorted({series_name(n, lb) for n, lb in old_counters if (n, lb) not in new_keys}
                      | {series_name(f, lb) for f, lb in old_series if (f, lb) not in seen_hist})
    return RateReport(
        before=before.source, after=after.source, interval_s=span, interval_basis=basis, counters=tuple(rates),
        histograms=tuple(reports), attainment=attained, findings=tuple(extra) + findings,
        gauges=gauges, vanished=tuple(vanished), high_water=tuple(marks), mapped=mapped_series(res),
    )


def _delta(old: HistogramSeries | None, new: HistogramSeries, created_changed: bool) -> tuple[HistogramSeries, bool]:
    """The observations made between two states of one histogram series, and whether it restarted.

    After a restart (a bucket or the count fell, or ``_created`` changed) the later histogram is taken whole.
    """
    if old is None or new.problems or old.problems:
        return new, False
    if [le for le, _ in old.buckets] != [le for le, _ in new.buckets]:
        return HistogramSeries(new.family, new.labels, new.buckets, new.count, new.sum, new.created_s,
                               new.exemplars, ("bucket bounds changed between the scrapes",)), False
    old_buckets = dict(old.buckets)
    fell = any(c < old_buckets[le] for le, c in new.buckets) or (
        new.count is not None and old.count is not None and new.count < old.count)
    if fell or created_changed:
        return new, True
    buckets = tuple((le, c - old_buckets[le]) for le, c in new.buckets)
    count = new.count - old.count if new.count is not None and old.count is not None else None
    total_sum = new.sum - old.sum if new.sum is not None and old.sum is not None else None
    old_ex = set(old.exemplars)
    return HistogramSeries(new.family, new.labels, buckets, count, total_sum, new.created_s,
                           tuple(e for e in new.exemplars if e not in old_ex), ()), False
