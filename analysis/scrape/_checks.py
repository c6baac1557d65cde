"""One scrape's analysis: per-series reports, SLO attainment and the consistency checks.

From one scrape, :func:`analyze_scrape` gives, per histogram series, the bucket-estimated quantiles
and SLO attainment of :mod:`llmslo.analysis.scrape._buckets`, **the exact mean** ``sum / count``
(seconds for latency histograms), and **consistency checks** that reveal survivor bias: a TTFT count
below the e2e count means requests ended without a first token (the TTFT histogram leaves them out);
requests still queued have neither; observations above the highest finite bound make the tail
unknowable from buckets; TGI's request counters show requests that did not succeed (its histograms
hold successful requests only); malformed histograms (non-cumulative buckets, count ≠ ``+Inf``
bucket) are reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmslo.analysis.scrape._buckets import (
    QuantileEstimate,
    SloAttainment,
    bucket_quantile,
    fmt_count,
    slo_attainment,
)
from llmslo.analysis.scrape._names import KNOWN_METRICS, QUEUE_GAUGES, SUCCESS_COUNTERS, known_metric
from llmslo.analysis.scrape._parse import Exemplar, HistogramSeries, Labels, Scrape

__all__ = [
    "DEFAULT_SCRAPE_QUANTILES",
    "Finding",
    "HistogramReport",
    "ScrapeAnalysis",
    "all_series",
    "analyze_scrape",
    "analyze_series",
    "attainment_dict",
    "finding_dict",
    "histogram_dict",
    "jsonable",
    "sample_values",
    "series_name",
    "slo_table",
]

DEFAULT_SCRAPE_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
"""Quantiles estimated from every histogram series unless told otherwise."""


@dataclass(frozen=True)
class HistogramReport:
    """One histogram series read as a distribution.

    ``interval``/``server``/``per``/``difference`` come from :data:`KNOWN_METRICS` (None when the
    name is not known). ``mean`` = sum / count (exact, same unit as the histogram). ``quantiles`` are
    bucket estimates. ``above_highest_bound`` counts observations above the highest finite bound.
    """

    metric: str
    labels: Labels
    interval: str | None
    server: str | None
    per: str | None
    difference: str | None
    count: float
    sum: float | None
    mean: float | None
    bounds: tuple[float, ...]
    quantiles: tuple[QuantileEstimate, ...]
    above_highest_bound: float
    exemplars: tuple[tuple[float, Exemplar], ...]
    problems: tuple[str, ...]


@dataclass(frozen=True)
class Finding:
    """A consistency check's result: ``check`` (a stable key), ``severity`` (``warning`` or ``info``),
    a sentence, and the numbers behind it."""

    check: str
    severity: str
    message: str
    numbers: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ScrapeAnalysis:
    """Everything one scrape says: histograms, SLO attainment, checks, counters and gauges."""

    source: str
    format: str
    timestamp_s: float | None
    servers: tuple[str, ...]
    family_types: Mapping[str, int]
    histograms: tuple[HistogramReport, ...]
    attainment: tuple[SloAttainment, ...]
    findings: tuple[Finding, ...]
    counters: tuple[tuple[str, Labels, float], ...]
    gauges: tuple[tuple[str, Labels, float], ...]
    exemplars: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (labels become objects; infinities become the string ``+Inf``)."""
        out: dict[str, Any] = jsonable({
            "source": self.source,
            "format": self.format,
            "timestamp_s": self.timestamp_s,
            "servers": list(self.servers),
            "family_types": dict(self.family_types),
            "histograms": [histogram_dict(h) for h in self.histograms],
            "slo_attainment": [attainment_dict(a) for a in self.attainment],
            "findings": [finding_dict(f) for f in self.findings],
            "counters": [{"name": n, "labels": dict(lb), "value": v} for n, lb, v in self.counters],
            "gauges": [{"name": n, "labels": dict(lb), "value": v} for n, lb, v in self.gauges],
            "exemplars": self.exemplars,
            "quantile_note": "quantiles are bucket estimates (linear interpolation inside the bucket, as "
                             "PromQL's histogram_quantile); means are exact (sum / count)",
        })
        return out


def jsonable(value: Any) -> Any:
    """``value`` with infinities as ``"+Inf"``/``"-Inf"``, NaN as None, mappings and sequences walked."""
    if isinstance(value, float):
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        if math.isnan(value):
            return None
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def histogram_dict(h: HistogramReport) -> dict[str, Any]:
    """The JSON form of one histogram report."""
    return {
        "metric": h.metric, "labels": dict(h.labels), "interval": h.interval, "server": h.server,
        "per": h.per, "definition_difference": h.difference, "count": h.count, "sum": h.sum, "mean": h.mean,
        "bounds": list(h.bounds),
        "quantiles": {f"p{q.q * 100:g}": {"value": q.value, "kind": q.kind, "bucket_lower": q.bucket_lower,
                                          "bucket_upper": q.bucket_upper, "label": q.label()}
                      for q in h.quantiles},
        "above_highest_bound": h.above_highest_bound,
        "exemplars": [{"le": le, "labels": dict(e.labels), "value": e.value, "timestamp_s": e.timestamp_s}
                      for le, e in h.exemplars],
        "problems": list(h.problems),
    }


def attainment_dict(a: SloAttainment) -> dict[str, Any]:
    """The JSON form of one SLO attainment."""
    out = {k: getattr(a, k) for k in a.__dataclass_fields__}
    out["labels"] = dict(a.labels)
    return out


def finding_dict(f: Finding) -> dict[str, Any]:
    """The JSON form of one finding."""
    return {"check": f.check, "severity": f.severity, "message": f.message, "numbers": dict(f.numbers)}


def _labels_text(labels: Labels) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels)


def series_name(name: str, labels: Labels) -> str:
    """``name{k="v",...}`` as PromQL writes a series (``name`` alone without labels)."""
    return f"{name}{{{_labels_text(labels)}}}" if labels else name


def _report(series: HistogramSeries, quantiles: Sequence[float]) -> HistogramReport:
    known = known_metric(series.family)
    total = series.total
    trusted = not series.problems
    est = tuple(
        bucket_quantile(q, series.buckets) if trusted else QuantileEstimate(q, None, None, None, "none")
        for q in quantiles
    )
    finite = [c for le, c in series.buckets if math.isfinite(le)]
    above = total - finite[-1] if finite and series.buckets and math.isinf(series.buckets[-1][0]) else 0.0
    count = series.count if series.count is not None else total
    mean = series.sum / count if series.sum is not None and count > 0 else None
    return HistogramReport(
        metric=series.family, labels=series.labels,
        interval=known.interval if known else None, server=known.server if known else None,
        per=known.per if known else None, difference=known.difference if known else None,
        count=count, sum=series.sum, mean=mean, bounds=series.finite_bounds, quantiles=est,
        above_highest_bound=above, exemplars=series.exemplars, problems=series.problems,
    )


def _matching_totals(a: Sequence[HistogramSeries], b: Sequence[HistogramSeries]) -> list[tuple[Labels, float, float]]:
    """Pairs of series totals with equal label sets; the sums of all series when no label set matches."""
    by_labels = {s.labels: s.total for s in b}
    pairs = [(s.labels, s.total, by_labels[s.labels]) for s in a if s.labels in by_labels]
    if not pairs and a and b:
        pairs = [((), sum(s.total for s in a), sum(s.total for s in b))]
    return pairs


def _checks(
    series: Sequence[HistogramSeries], counters: Sequence[tuple[str, Labels, float]],
    gauges: Sequence[tuple[str, Labels, float]], *, over_interval: bool,
) -> tuple[list[Finding], dict[tuple[str, Labels], float]]:
    """Survivor-bias and sanity checks; also the requests without a first token per TTFT series."""
    findings: list[Finding] = []
    missing: dict[tuple[str, Labels], float] = {}
    scope = "over the interval" if over_interval else "since the server started"
    by_family: dict[str, list[HistogramSeries]] = {}
    for s in series:
        by_family.setdefault(s.family, []).append(s)
    for s in series:
        if s.problems:
            findings.append(Finding("malformed_histogram", "warning",
                                    f"{series_name(s.family, s.labels)}: {'; '.join(s.problems)}; "
                                    "no quantiles are estimated from it"))
    servers = sorted({m.server for m in KNOWN_METRICS if m.name in by_family})
    for server in servers:
        fams = {m.interval: m.name for m in KNOWN_METRICS if m.server == server and m.name in by_family}
        if "ttft_s" in fams and "e2e_s" in fams:
            for labels, ttft, e2e in _matching_totals(by_family[fams["ttft_s"]], by_family[fams["e2e_s"]]):
                where = series_name("", labels)
                if ttft < e2e:
                    gap = e2e - ttft
                    missing[(fams["ttft_s"], labels)] = gap
                    findings.append(Finding(
                        "requests_without_first_token", "warning",
                        f"{fams['e2e_s']}{where} counts {fmt_count(e2e)} finished requests but "
                        f"{fams['ttft_s']} only {fmt_count(ttft)} first tokens {scope}: at least {fmt_count(gap)} "
                        "requests ended without a first token (aborted, timed out or failed). TTFT quantiles and "
                        "attainment from this histogram leave them out (survivor bias); the gap is a lower bound, "
                        "since requests in flight that already have a first token count in TTFT but not yet in e2e",
                        {"ttft_count": ttft, "e2e_count": e2e, "requests_without_first_token_at_least": gap},
                    ))
                elif ttft > e2e:
                    findings.append(Finding(
                        "first_tokens_exceed_finished", "info",
                        f"{fams['ttft_s']}{where} counts {fmt_count(ttft - e2e)} more first tokens than "
                        f"{fams['e2e_s']} counts finished requests {scope}: requests in flight (or a restart of one "
                        "histogram); requests without a first token cannot be counted from these two",
                        {"ttft_count": ttft, "e2e_count": e2e},
                    ))
        if server == "tgi":
            findings.extend(_tgi_checks(counters, by_family.get("tgi_request_duration", []), scope))
        for name, srv in SUCCESS_COUNTERS.items():
            if srv == server and "e2e_s" in fams:
                ok = sum(v for n, _, v in counters if n == name)
                e2e_total = sum(s.total for s in by_family[fams["e2e_s"]])
                if any(n == name for n, _, _ in counters) and e2e_total > ok:
                    findings.append(Finding(
                        "unsuccessful_requests", "info",
                        f"{fams['e2e_s']} counts {fmt_count(e2e_total)} finished requests, {name} "
                        f"{fmt_count(ok)} successes {scope}: {fmt_count(e2e_total - ok)} did not succeed",
                        {"finished": e2e_total, "succeeded": ok},
                    ))
    for s in series:
        known = known_metric(s.family)
        if known is None or s.problems or not s.buckets:
            continue
        finite = [c for le, c in s.buckets if math.isfinite(le)]
        total = s.total
        above = total - finite[-1] if finite else total
        if total > 0 and above > 0:
            share = above / total
            highest = s.finite_bounds[-1] if s.finite_bounds else math.nan
            findings.append(Finding(
                "tail_above_highest_bound", "warning" if share > 0.01 else "info",
                f"{series_name(s.family, s.labels)}: {fmt_count(above)} of {fmt_count(total)} observations "
                f"({share:.1%}) are above the highest bucket bound ({highest:g} s): quantiles above "
                f"p{(1 - share) * 100:.4g} are only known to be at least {highest:g} s",
                {"above": above, "total": total, "highest_bound_s": highest},
            ))
    for name, labels, value in gauges:
        if name in QUEUE_GAUGES and value > 0:
            when = "at the later scrape" if over_interval else "at scrape time"
            findings.append(Finding(
                "queued_requests", "warning",
                f"{series_name(name, labels)} = {fmt_count(value)} requests waiting {when}: they have no first "
                "token yet and are in no latency histogram; under overload the histograms describe only "
                "the requests that got through",
                {"queued": value},
            ))
    return findings, missing


def _tgi_checks(counters: Sequence[tuple[str, Labels, float]], durations: Sequence[HistogramSeries],
                scope: str) -> list[Finding]:
    def total(name: str) -> float | None:
        vals = [v for n, _, v in counters if n == name]
        return sum(vals) if vals else None

    requests = total("tgi_request_count")
    success = total("tgi_request_success")
    failure = total("tgi_request_failure")
    out: list[Finding] = []
    if requests is not None and success is not None and requests > success:
        fail_text = f" ({fmt_count(failure)} counted as failures)" if failure is not None else ""
        out.append(Finding(
            "unsuccessful_requests", "warning",
            f"tgi_request_count {fmt_count(requests)} but tgi_request_success {fmt_count(success)} {scope}: "
            f"{fmt_count(requests - success)} requests did not succeed{fail_text}; TGI's latency histograms "
            "cover successful requests only (survivor bias)",
            {"requests": requests, "succeeded": success, **({"failed": failure} if failure is not None else {})},
        ))
    if requests is not None and durations:
        observed = sum(s.total for s in durations)
        if observed < requests:
            out.append(Finding(
                "requests_without_duration", "info",
                f"tgi_request_duration has {fmt_count(observed)} observations for {fmt_count(requests)} requests "
                f"{scope}: {fmt_count(requests - observed)} requests have no latency (failed or in flight)",
                {"observed": observed, "requests": requests},
            ))
    return out


def sample_values(scrape: Scrape, kind: str) -> list[tuple[str, Labels, float]]:
    """(name, labels, value) of every sample of the families of type ``kind`` (``_created`` left out)."""
    out = []
    for _, s in scrape.samples(kind):
        if kind == "counter" and s.name.endswith("_created"):
            continue
        out.append((s.name, s.labels, s.value))
    return out


def slo_table(slo: Mapping[str, float] | None) -> dict[str, float]:
    """The SLO thresholds (interval name → seconds), checked. Raises ``ValueError`` for one ≤ 0 or not finite."""
    table = dict(slo or {})
    for interval, threshold in table.items():
        if not threshold > 0 or not math.isfinite(threshold):
            raise ValueError(f"SLO threshold for {interval} must be a positive number of seconds, got {threshold!r}")
    return table


_Analysis = tuple[tuple[HistogramReport, ...], tuple[SloAttainment, ...], tuple[Finding, ...]]


def analyze_series(series: Sequence[HistogramSeries], counters: Sequence[tuple[str, Labels, float]],
                   gauges: Sequence[tuple[str, Labels, float]], slo: Mapping[str, float],
                   quantiles: Sequence[float], *, over_interval: bool,
                   declared_empty: frozenset[str] = frozenset()) -> _Analysis:
    """Reports, SLO attainment and findings of histogram series with the counters and gauges beside them."""
    for q in quantiles:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within [0, 1], got {q!r}")
    reports = tuple(_report(s, quantiles) for s in series)
    findings, missing = _checks(series, counters, gauges, over_interval=over_interval)
    attained: list[SloAttainment] = []
    for interval, threshold in slo.items():
        matched = [s for s in series if (k := known_metric(s.family)) is not None and k.interval == interval]
        for s in matched:
            known = known_metric(s.family)
            assert known is not None
            a = slo_attainment(s, known, threshold, missing.get((s.family, s.labels), 0.0))
            if a is not None:
                attained.append(a)
    for interval, threshold in slo.items():
        if not any(a.interval == interval for a in attained):
            declared = sorted(m.name for m in KNOWN_METRICS if m.interval == interval and m.name in declared_empty)
            extra = (f" ({', '.join(declared)} is declared but has no series yet: no observation since start)"
                     if declared else "")
            findings.append(Finding(
                "no_histogram_for_slo", "info",
                f"no usable histogram of a known {interval} metric in this scrape{extra}: the {threshold:g} s SLO "
                f"on {interval} cannot be checked",
            ))
    return reports, tuple(attained), tuple(findings)


def _servers(scrape: Scrape) -> tuple[str, ...]:
    found: set[str] = set()
    for name in scrape.families:
        if name.startswith("vllm:"):
            found.add("vllm")
        elif name.startswith("sglang:"):
            found.add("sglang")
        elif name.startswith("tgi_"):
            found.add("tgi")
        elif name.startswith("llmslo_"):
            found.add("llmslo")
    return tuple(sorted(found))


def analyze_scrape(
    scrape: Scrape,
    *,
    slo: Mapping[str, float] | None = None,
    quantiles: Sequence[float] = DEFAULT_SCRAPE_QUANTILES,
) -> ScrapeAnalysis:
    """Read one scrape: bucket-estimated quantiles, SLO attainment and consistency checks.

    ``slo`` maps interval names (``ttft_s``, ``tpot_s``, ``e2e_s``, ...) to thresholds in seconds;
    attainment is computed on every series of a :data:`KNOWN_METRICS` histogram of that interval.
    Counts are cumulative since the server started. Raises ``ValueError`` for a threshold ≤ 0 or a
    quantile outside [0, 1].

    >>> analysis = analyze_scrape(read_scrape("metrics.txt"), slo={"ttft_s": 2.0})  # doctest: +SKIP
    """
    table = slo_table(slo)
    series = all_series(scrape)
    counters = sample_values(scrape, "counter")
    gauges = sample_values(scrape, "gauge")
    empty = frozenset(f.name for f in scrape.families.values() if not f.samples)
    reports, attained, findings = analyze_series(series, counters, gauges, table, quantiles, over_interval=False,
                                                 declared_empty=empty)
    types: dict[str, int] = {}
    for fam in scrape.families.values():
        types[fam.type] = types.get(fam.type, 0) + 1
    exemplars = sum(1 for _, s in scrape.samples() if s.exemplar is not None)
    return ScrapeAnalysis(
        source=scrape.source, format=scrape.format, timestamp_s=scrape.timestamp_s, servers=_servers(scrape),
        family_types=types, histograms=reports, attainment=attained, findings=findings,
        counters=tuple(counters), gauges=tuple(gauges), exemplars=exemplars,
    )


def all_series(scrape: Scrape) -> list[HistogramSeries]:
    """Every histogram series of a scrape, in file order."""
    return scrape.histograms()
