"""One scrape's analysis: per-series reports, SLO attainment and the consistency checks.

From one scrape, :func:`analyze_scrape` gives, per histogram series, the bucket-estimated quantiles
and SLO attainment of :mod:`llmslo.analysis.scrape._buckets`, **the exact mean** ``sum / count``
(seconds for latency histograms), and **consistency checks** that reveal survivor bias: a TTFT count
below the e2e count means requests ended without a first token (the TTFT histogram leaves them out);
requests still queued have neither; observations above the highest finite bound make the tail
unknowable from buckets; request counters show requests that did not succeed (TGI's histograms hold
successful requests only; vLLM's and TensorRT-LLM's finish counters carry the reason); abort and failure
counters are read where an engine has them; where an engine's series do not allow a check (llama.cpp has no
histogram, TGI no TTFT, vLLM counts no aborts) a finding says so and names the way out; malformed histograms
(non-cumulative buckets, count ≠ ``+Inf`` bucket) are reported. Which series measures what comes from the
engine profiles (:mod:`llmslo.engines`) through :func:`~llmslo.analysis.scrape._names.resolve`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmslo.analysis.scrape._buckets import (
    QuantileEstimate,
    SloAttainment,
    bucket_quantile,
    fmt_count,
    slo_attainment,
)
from llmslo.analysis.scrape._names import (
    INTERVALS,
    SUCCESS_REASONS,
    KnownMetric,
    Resolution,
    known_metric,
    resolve,
)
from llmslo.analysis.scrape._parse import Exemplar, HistogramSeries, Labels, Scrape
from llmslo.engines import EngineProfile

__all__ = [
    "DEFAULT_SCRAPE_QUANTILES",
    "Finding",
    "HistogramReport",
    "MappedSeries",
    "ScrapeAnalysis",
    "all_series",
    "analyze_scrape",
    "analyze_series",
    "attainment_dict",
    "finding_dict",
    "histogram_dict",
    "jsonable",
    "mapped_dict",
    "mapped_series",
    "resolution_of",
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
class MappedSeries:
    """A series of the scrape that an engine profile maps: its engine, our concept (``extra`` beyond them),
    its type as the profile gives it, whether it is a high-water mark (never a rate), and how its definition
    differs from ours."""

    name: str
    engine: str
    concept: str
    type: str
    unit: str
    high_water: bool
    difference: str
    deprecated: str


@dataclass(frozen=True)
class ScrapeAnalysis:
    """Everything one scrape says: histograms, SLO attainment, checks, counters and gauges, and which engine
    series measures which of llmslo's concepts (``mapped``)."""

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
    mapped: tuple[MappedSeries, ...] = ()

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
            "mapped_series": [mapped_dict(m) for m in self.mapped],
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


def mapped_dict(m: MappedSeries) -> dict[str, Any]:
    """The JSON form of one mapped series."""
    return {k: getattr(m, k) for k in m.__dataclass_fields__}


def mapped_series(resolution: Resolution) -> tuple[MappedSeries, ...]:
    """The mapped series of a resolution, by engine then concept order of the profile."""
    out = []
    for p in resolution.engines:
        for s in p.series:
            m = resolution.by_name.get(s.name)
            if m is not None and m.profile is p:
                out.append(MappedSeries(s.name, p.key, s.concept, s.type, s.unit, s.high_water, s.difference,
                                        s.deprecated))
    return tuple(out)


def finding_dict(f: Finding) -> dict[str, Any]:
    """The JSON form of one finding."""
    return {"check": f.check, "severity": f.severity, "message": f.message, "numbers": dict(f.numbers)}


def _labels_text(labels: Labels) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels)


def series_name(name: str, labels: Labels) -> str:
    """``name{k="v",...}`` as PromQL writes a series (``name`` alone without labels)."""
    return f"{name}{{{_labels_text(labels)}}}" if labels else name


def _known_for(family: str, resolution: Resolution) -> KnownMetric | None:
    """The latency mapping of a histogram family: from the engine that owns it in this scrape, else from
    llmslo's catalogue (None when it is neither a known latency histogram)."""
    m = resolution.get(family)
    if m is not None:
        s = m.series
        if s.type == "histogram" and s.concept in INTERVALS:
            return KnownMetric(s.name, m.engine, s.concept, s.per, s.difference, s.deprecated)
        return None
    return known_metric(family)


def _report(series: HistogramSeries, quantiles: Sequence[float], resolution: Resolution) -> HistogramReport:
    known = _known_for(series.family, resolution)
    other = resolution.get(series.family)
    total = series.total
    trusted = not series.problems
    est = tuple(
        bucket_quantile(q, series.buckets, total_sum=series.sum) if trusted
        else QuantileEstimate(q, None, None, None, "none")
        for q in quantiles
    )
    finite = [c for le, c in series.buckets if math.isfinite(le)]
    above = total - finite[-1] if finite and series.buckets and math.isinf(series.buckets[-1][0]) else 0.0
    count = series.count if series.count is not None else total
    mean = series.sum / count if series.sum is not None and count > 0 else None
    return HistogramReport(
        metric=series.family, labels=series.labels,
        interval=known.interval if known else None,
        server=known.server if known else (other.engine if other else None),
        per=known.per if known else (other.series.per if other else None),
        difference=known.difference if known else (other.series.difference or None if other else None),
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


def _total(values: Sequence[tuple[str, Labels, float]], names: Sequence[str]) -> float | None:
    """The sum of every series of the first of ``names`` present, else None."""
    for name in names:
        vals = [v for n, _, v in values if n == name]
        if vals:
            return sum(vals)
    return None


def _hist_total(by_family: Mapping[str, list[HistogramSeries]], names: Sequence[str]) -> float | None:
    for name in names:
        if name in by_family:
            return sum(s.total for s in by_family[name])
    return None


def _first(by_family: Mapping[str, list[HistogramSeries]], names: Sequence[str]) -> str | None:
    return next((n for n in names if n in by_family), None)


_BLIND_SPOTS = ("ttft_s", "e2e_s", "aborts", "requests_failed")
"""Concepts whose absence hides requests from a latency view: an engine lacking one has a survivor-bias
blind spot, said once per scrape."""


def _engine_checks(resolution: Resolution, by_family: Mapping[str, list[HistogramSeries]],
                   counters: Sequence[tuple[str, Labels, float]], scope: str,
                   missing: dict[tuple[str, Labels], float]) -> list[Finding]:
    """The survivor-bias checks each engine's series allow, and why not where they don't."""
    findings: list[Finding] = []
    for p in resolution.engines:
        def names(concept: str, p: EngineProfile = p) -> tuple[str, ...]:
            return resolution.names(p, concept)

        ttft, e2e = _first(by_family, names("ttft_s")), _first(by_family, names("e2e_s"))
        if ttft is not None and e2e is not None:
            for labels, t, e in _matching_totals(by_family[ttft], by_family[e2e]):
                where = series_name("", labels)
                if t < e:
                    gap = e - t
                    missing[(ttft, labels)] = gap
                    findings.append(Finding(
                        "requests_without_first_token", "warning",
                        f"{e2e}{where} counts {fmt_count(e)} finished requests but {ttft} only {fmt_count(t)} "
                        f"first tokens {scope}: at least {fmt_count(gap)} requests ended without a first token "
                        "(aborted, timed out or failed). TTFT quantiles and attainment from this histogram leave "
                        "them out (survivor bias); the gap is a lower bound, since requests in flight that already "
                        "have a first token count in TTFT but not yet in e2e",
                        {"ttft_count": t, "e2e_count": e, "requests_without_first_token_at_least": gap},
                    ))
                elif t > e:
                    findings.append(Finding(
                        "first_tokens_exceed_finished", "info",
                        f"{ttft}{where} counts {fmt_count(t - e)} more first tokens than {e2e} counts finished "
                        f"requests {scope}: requests in flight (or a restart of one histogram); requests without "
                        "a first token cannot be counted from these two",
                        {"ttft_count": t, "e2e_count": e},
                    ))
        else:
            reasons: dict[str, list[str]] = {}
            for concept, name in (("ttft_s", ttft), ("e2e_s", e2e)):
                if name is None:
                    reason = p.lacks.get(concept) or "its histogram is not in this scrape"
                    reasons.setdefault(reason, []).append(concept)
            why = [f"{' and '.join(concepts)}: {reason}" for reason, concepts in reasons.items()]
            findings.append(Finding(
                "survivor_bias_check_unavailable", "info",
                f"{p.name}: the TTFT-versus-e2e check for requests without a first token cannot run ("
                + "; ".join(why) + ")",
            ))
        findings.extend(_outcome_checks(p, resolution, by_family, counters, scope, e2e))
        blind = [(c, p.lacks[c]) for c in _BLIND_SPOTS if c in p.lacks and not (
            c in ("ttft_s", "e2e_s") and (ttft is None or e2e is None))]
        if blind:
            findings.append(Finding(
                "survivor_bias_blind_spot", "info",
                f"{p.name} cannot show every request that went wrong: "
                + "; ".join(f"{c}: {why}" for c, why in blind),
            ))
    return findings


def _outcome_checks(p: EngineProfile, resolution: Resolution, by_family: Mapping[str, list[HistogramSeries]],
                    counters: Sequence[tuple[str, Labels, float]], scope: str, e2e: str | None) -> list[Finding]:
    """Counters of outcomes: requests received, succeeded, failed, finished by reason, aborted."""
    out: list[Finding] = []

    def names(concept: str) -> tuple[str, ...]:
        return resolution.names(p, concept)

    received = _total(counters, names("requests_received"))
    succeeded = _total(counters, names("requests_succeeded"))
    failed = _total(counters, names("requests_failed"))
    finished_name = next((n for n in names("requests_finished") if any(c == n for c, _, _ in counters)), None)
    finish_label = None
    if finished_name is not None:
        m = resolution.get(finished_name)
        finish_label = m.series.finish_label if m else None
    by_reason: dict[str, float] = {}
    if finished_name is not None and finish_label is not None:
        for n, labels, v in counters:
            if n == finished_name:
                reason = dict(labels).get(finish_label, "")
                by_reason[reason] = by_reason.get(reason, 0.0) + v
        if succeeded is None:
            succeeded = sum(v for r, v in by_reason.items() if r in SUCCESS_REASONS)
    if received is not None and succeeded is not None:
        if received > succeeded:
            fail_text = f" ({fmt_count(failed)} counted as failures)" if failed is not None else ""
            rec, ok = names("requests_received")[0], names("requests_succeeded")[0]
            out.append(Finding(
                "unsuccessful_requests", "warning",
                f"{rec} {fmt_count(received)} but {ok} {fmt_count(succeeded)} {scope}: "
                f"{fmt_count(received - succeeded)} requests did not succeed{fail_text}; {p.name}'s latency "
                "histograms cover successful requests only (survivor bias)",
                {"requests": received, "succeeded": succeeded, **({"failed": failed} if failed is not None else {})},
            ))
        observed = _hist_total(by_family, names("e2e_s"))
        if observed is not None and observed < received:
            e2e_name = _first(by_family, names("e2e_s"))
            out.append(Finding(
                "requests_without_duration", "info",
                f"{e2e_name} has {fmt_count(observed)} observations for {fmt_count(received)} requests {scope}: "
                f"{fmt_count(received - observed)} requests have no latency (failed or in flight)",
                {"observed": observed, "requests": received},
            ))
    elif e2e is not None and succeeded is not None:
        e2e_total = sum(s.total for s in by_family[e2e])
        if e2e_total > succeeded:
            source = finished_name or names("requests_succeeded")[0]
            how = f" with {finish_label} in {'/'.join(sorted(SUCCESS_REASONS))}" if finish_label else ""
            out.append(Finding(
                "unsuccessful_requests", "info",
                f"{e2e} counts {fmt_count(e2e_total)} finished requests, {source}{how} {fmt_count(succeeded)} "
                f"successes {scope}: {fmt_count(e2e_total - succeeded)} did not succeed",
                {"finished": e2e_total, "succeeded": succeeded},
            ))
    if by_reason:
        other = {r: v for r, v in by_reason.items() if r not in SUCCESS_REASONS and v > 0}
        if other:
            listed = ", ".join(f"{r or '(empty)'} {fmt_count(v)}" for r, v in sorted(other.items()))
            out.append(Finding(
                "unsuccessful_finish_reasons", "warning",
                f"{finished_name} counts requests that finished other than by stop or length {scope}: {listed}",
                {f"finished_{r or 'empty'}": v for r, v in sorted(other.items())},
            ))
    if received is None and failed is not None and failed > 0:
        out.append(Finding(
            "failed_requests", "warning",
            f"{names('requests_failed')[0]} = {fmt_count(failed)} {scope}: failed requests, in no latency "
            "histogram",
            {"failed": failed},
        ))
    aborted = _total(counters, names("aborts"))
    if aborted is not None and aborted > 0:
        out.append(Finding(
            "aborted_requests", "warning",
            f"{names('aborts')[0]} = {fmt_count(aborted)} {scope}: aborted requests; those aborted before a "
            "first token are missing from the TTFT histogram (survivor bias)",
            {"aborted": aborted},
        ))
    return out


def _token_notes(resolution: Resolution, counters: Sequence[tuple[str, Labels, float]], scope: str) -> list[Finding]:
    """Where an engine's prompt-token counter leaves out cached tokens, the total the clients were told of."""
    out = []
    for p in resolution.engines:
        prompt = next((n for n in resolution.names(p, "prompt_tokens")), None)
        cached = next((n for n in resolution.names(p, "prompt_tokens_cached")), None)
        m = resolution.get(prompt) if prompt else None
        if prompt is None or cached is None or m is None or not m.series.excludes_cached:
            continue
        a, b = _total(counters, (prompt,)), _total(counters, (cached,))
        if a is None or b is None:
            continue
        out.append(Finding(
            "prompt_tokens_exclude_cached", "info",
            f"{prompt} ({fmt_count(a)}) leaves out prompt tokens served from the cache ({cached}: {fmt_count(b)}) "
            f"{scope}: the prompt tokens of the requests' usage = {fmt_count(a + b)}",
            {"prompt_tokens_processed": a, "prompt_tokens_cached": b, "prompt_tokens": a + b},
        ))
    return out


def _checks(
    series: Sequence[HistogramSeries], counters: Sequence[tuple[str, Labels, float]],
    gauges: Sequence[tuple[str, Labels, float]], *, over_interval: bool, resolution: Resolution,
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
    findings.extend(_engine_checks(resolution, by_family, counters, scope, missing))
    if resolution.llmslo:
        own = {k.interval: k.name for k in (known_metric(f) for f in by_family)
               if k is not None and k.server == "llmslo"}
        if "ttft_s" in own and "e2e_s" in own:
            for labels, ttft, e2e in _matching_totals(by_family[own["ttft_s"]], by_family[own["e2e_s"]]):
                if ttft < e2e:
                    gap = e2e - ttft
                    missing[(own["ttft_s"], labels)] = gap
                    findings.append(Finding(
                        "requests_without_first_token", "warning",
                        f"{own['e2e_s']}{series_name('', labels)} counts {fmt_count(e2e)} finished requests but "
                        f"{own['ttft_s']} only {fmt_count(ttft)} first tokens {scope}: at least {fmt_count(gap)} "
                        "requests ended without a first token (survivor bias in TTFT)",
                        {"ttft_count": ttft, "e2e_count": e2e, "requests_without_first_token_at_least": gap},
                    ))
    for s in series:
        known = _known_for(s.family, resolution)
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
        m = resolution.get(name)
        if m is not None and m.concept == "waiting" and value > 0:
            when = "at the later scrape" if over_interval else "at scrape time"
            findings.append(Finding(
                "queued_requests", "warning",
                f"{series_name(name, labels)} = {fmt_count(value)} requests waiting {when}: they have no first "
                "token yet and are in no latency histogram; under overload the histograms describe only "
                "the requests that got through",
                {"queued": value},
            ))
    findings.extend(_token_notes(resolution, counters, scope))
    return findings, missing


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


def resolution_of(series: Sequence[HistogramSeries], counters: Sequence[tuple[str, Labels, float]],
                  gauges: Sequence[tuple[str, Labels, float]], extra_names: Iterable[str] = ()) -> Resolution:
    """The engines' mapping of the names present among these series, counters and gauges."""
    names = {s.family for s in series} | {n for n, _, _ in counters} | {n for n, _, _ in gauges}
    return resolve(names | set(extra_names))


def analyze_series(series: Sequence[HistogramSeries], counters: Sequence[tuple[str, Labels, float]],
                   gauges: Sequence[tuple[str, Labels, float]], slo: Mapping[str, float],
                   quantiles: Sequence[float], *, over_interval: bool,
                   declared_empty: frozenset[str] = frozenset(),
                   resolution: Resolution | None = None) -> _Analysis:
    """Reports, SLO attainment and findings of histogram series with the counters and gauges beside them.

    ``resolution`` maps names to the engines' profiles; by default it is resolved from the names given.
    """
    for q in quantiles:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within [0, 1], got {q!r}")
    res = resolution if resolution is not None else resolution_of(series, counters, gauges, declared_empty)
    reports = tuple(_report(s, quantiles, res) for s in series)
    findings, missing = _checks(series, counters, gauges, over_interval=over_interval, resolution=res)
    attained: list[SloAttainment] = []
    for interval, threshold in slo.items():
        for s in series:
            known = _known_for(s.family, res)
            if known is None or known.interval != interval:
                continue
            a = slo_attainment(s, known, threshold, missing.get((s.family, s.labels), 0.0))
            if a is not None:
                attained.append(a)
    for interval, threshold in slo.items():
        if not any(a.interval == interval for a in attained):
            declared = sorted(n for n in declared_empty
                              if (k := _known_for(n, res)) is not None and k.interval == interval)
            extra = (f" ({', '.join(declared)} is declared but has no series yet: no observation since start)"
                     if declared else "")
            lacking = [f"{p.name}: {p.lacks[interval]}" for p in res.engines if interval in p.lacks]
            why = f" ({'; '.join(lacking)})" if lacking and not declared else ""
            findings.append(Finding(
                "no_histogram_for_slo", "info",
                f"no usable histogram of a known {interval} metric in this scrape{extra}{why}: the {threshold:g} s "
                f"SLO on {interval} cannot be checked",
            ))
    return reports, tuple(attained), tuple(findings)


def analyze_scrape(
    scrape: Scrape,
    *,
    slo: Mapping[str, float] | None = None,
    quantiles: Sequence[float] = DEFAULT_SCRAPE_QUANTILES,
) -> ScrapeAnalysis:
    """Read one scrape: bucket-estimated quantiles, SLO attainment and consistency checks.

    ``slo`` maps interval names (``ttft_s``, ``tpot_s``, ``e2e_s``, ...) to thresholds in seconds;
    attainment is computed on every series of a known latency histogram of that interval (the engine
    profiles' and llmslo's own). Counts are cumulative since the server started. Raises ``ValueError`` for a
    threshold ≤ 0 or a quantile outside [0, 1].

    >>> analysis = analyze_scrape(read_scrape("metrics.txt"), slo={"ttft_s": 2.0})  # doctest: +SKIP
    """
    table = slo_table(slo)
    series = all_series(scrape)
    counters = sample_values(scrape, "counter")
    gauges = sample_values(scrape, "gauge")
    empty = frozenset(f.name for f in scrape.families.values() if not f.samples)
    res = resolve(set(scrape.families) | {s.name for _, s in scrape.samples()})
    reports, attained, findings = analyze_series(series, counters, gauges, table, quantiles, over_interval=False,
                                                 declared_empty=empty, resolution=res)
    types: dict[str, int] = {}
    for fam in scrape.families.values():
        types[fam.type] = types.get(fam.type, 0) + 1
    exemplars = sum(1 for _, s in scrape.samples() if s.exemplar is not None)
    return ScrapeAnalysis(
        source=scrape.source, format=scrape.format, timestamp_s=scrape.timestamp_s, servers=res.servers(),
        family_types=types, histograms=reports, attainment=attained, findings=findings,
        counters=tuple(counters), gauges=tuple(gauges), exemplars=exemplars, mapped=mapped_series(res),
    )


def all_series(scrape: Scrape) -> list[HistogramSeries]:
    """Every histogram series of a scrape, in file order."""
    return scrape.histograms()
