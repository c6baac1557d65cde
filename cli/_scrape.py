"""``llmslo scrape``: read one or two Prometheus /metrics expositions of an LLM server."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmslo.cli._common import EXIT_INPUT
from llmslo.cli._common import console as _console
from llmslo.cli._common import fail as _fail
from llmslo.cli._common import shown as _shown
from llmslo.cli._common import threshold as _threshold
from llmslo.telemetry import DEFAULT_TPOT_S, DEFAULT_TTFT_S

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from llmslo.analysis.scrape import (
        Finding,
        HistogramReport,
        Labels,
        MappedSeries,
        RateReport,
        ScrapeAnalysis,
        SloAttainment,
    )

__all__ = ["scrape_command"]


def _shown_names(mapped: tuple[MappedSeries, ...], names: list[str]) -> dict[str, str]:
    """Counter and gauge names to show (the engines' mapped series and llmslo's own), each with its concept
    as a cell: ``concept`` (``extra``), ``high-water mark`` for a high-water series."""
    from llmslo.telemetry import METRICS

    own = {m.name for m in METRICS}
    out = {m.name: ("high-water mark" if m.high_water else m.concept) for m in mapped}
    for n in names:
        if n not in out and (n in own or f"{n}_total" in own):
            out[n] = "llmslo"
    return out


def _labels(labels: Labels, width: int = 48) -> str:
    text = ",".join(f"{k}={v}" for k, v in labels)
    return _shown(text if len(text) <= width else text[: width - 1] + "…")


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "+Inf"
    if x == math.floor(x) and abs(x) < 1e15:
        return f"{x:,.0f}"
    return f"{x:,.4g}"


def _seconds(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.3g}ms" if x < 1 else f"{x:.3g}s"


def _histogram_table(title: str, reports: tuple[HistogramReport, ...]) -> Table:
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    t.add_column("metric", no_wrap=True)
    t.add_column("labels", overflow="fold", max_width=36)
    for col in ("as", "one per", "count", "mean (exact)"):
        t.add_column(col, justify="right" if col in ("count", "mean (exact)") else "left")
    quantiles = reports[0].quantiles if reports else ()
    for q in quantiles:
        t.add_column(f"p{q.q * 100:g} ≈", justify="right")
    for h in reports:
        seconds = h.metric.endswith(("_seconds", "_duration"))
        cells = []
        for q in h.quantiles:
            if q.value is None:
                cells.append("-")
            else:
                text = _seconds(q.value) if seconds else _num(q.value)
                if q.kind == "bounded" and q.bucket_lower:  # only the bucket is known: show it, no point
                    low = _seconds(q.bucket_lower) if seconds else _num(q.bucket_lower)
                    text = f"({low}, {text}]"
                cells.append(f"≥{text}" if q.kind == "at_least" else f"≤{text}" if q.kind == "bounded"
                             and not q.bucket_lower else text)
        mean = (_seconds(h.mean) if seconds else _num(h.mean)) if h.mean is not None else "-"
        t.add_row(_shown(h.metric), _labels(h.labels), _shown(h.interval or "-"), _shown(h.per or "-"), _num(h.count),
                  mean, *cells)
    return t


def _print_attainment(out: Console, attained: tuple[SloAttainment, ...]) -> None:
    if not attained:
        return
    out.print("[bold]SLO attainment[/bold] (fraction of observations within the threshold)")
    for a in attained:
        head = f"  {a.metric} ({a.interval} ≤ {a.threshold_s:g} s)"
        out.print(_shown(head) + (" " + _labels(a.labels) if a.labels else "") + ": " + _shown(a.message),
                  highlight=False, soft_wrap=True)


def _print_findings(out: Console, findings: tuple[Finding, ...]) -> None:
    if not findings:
        out.print("[bold]Checks[/bold]: nothing inconsistent found")
        return
    out.print("[bold]Checks[/bold]")
    for f in findings:
        colour = "yellow" if f.severity == "warning" else "cyan"
        out.print(f"  [{colour}]{_shown(f.severity)}[/{colour}] {_shown(f.message)}", highlight=False, soft_wrap=True)


def _print_definitions(out: Console, reports: tuple[HistogramReport, ...]) -> None:
    notes = {(h.metric, h.interval, h.difference) for h in reports if h.interval and h.difference}
    if notes:
        out.print("[bold]Definitions[/bold] (how each server's metric differs from llmslo's interval)")
        for metric, interval, diff in sorted(notes, key=lambda n: n[0]):
            out.print(_shown(f"  {metric} → {interval}: {diff}"), highlight=False, soft_wrap=True)


def _print_lacks(out: Console, mapped: tuple[MappedSeries, ...]) -> None:
    """What the engines found lack, one line per engine (the checks name the consequences)."""
    from llmslo.engines import ENGINES, RELATED

    keys = sorted({m.engine for m in mapped})
    for key in keys:
        profile = ENGINES.get(key) or RELATED.get(key)
        if profile is not None and profile.lacks:
            out.print(_shown(f"{profile.name} does not export: {', '.join(sorted(profile.lacks))} "
                             "(docs/engines.md says why and what to put in front)"), highlight=False, soft_wrap=True)


def _print_single(out: Console, a: ScrapeAnalysis) -> None:
    from rich.table import Table

    kinds = ", ".join(f"{n} {k}" for k, n in sorted(a.family_types.items()))
    servers = ", ".join(a.servers) or "none recognised"
    out.print(f"[bold]{_shown(a.source)}[/bold] " + _shown(f"({a.format}; families: {kinds}; servers: {servers}; "
              f"exemplars: {a.exemplars})"), highlight=False, soft_wrap=True)
    if a.histograms:
        out.print(_histogram_table("Histograms since the server started (quantiles are bucket estimates)",
                                   a.histograms))
    _print_attainment(out, a.attainment)
    _print_findings(out, a.findings)
    _print_definitions(out, a.histograms)
    concept = _shown_names(a.mapped, [n for n, _, _ in (*a.counters, *a.gauges)])
    shown = [(kind, n, lb, v) for kind, rows in (("counter", a.counters), ("gauge", a.gauges))
             for n, lb, v in rows if n in concept]
    if shown:
        t = Table(title="Counters and gauges of the serving engine, with llmslo's concept", title_justify="left")
        for col in ("name", "concept", "type", "labels", "value"):
            t.add_column(col, justify="right" if col == "value" else "left")
        for kind, n, lb, v in shown:
            t.add_row(_shown(n), _shown(concept[n]), kind, _labels(lb), _num(v))
        out.print(t)
    _print_lacks(out, a.mapped)
    hidden = len(a.counters) + len(a.gauges) - len(shown)
    if hidden:
        out.print(f"{hidden} other counter/gauge series not shown (--json lists every series)")


def _print_rates(out: Console, r: RateReport) -> None:
    from rich.table import Table

    out.print(f"[bold]{_shown(r.before)} → {_shown(r.after)}[/bold]: {r.interval_s:g} s apart "
              f"({_shown(r.interval_basis)})", highlight=False, soft_wrap=True)
    concept = _shown_names(r.mapped, [c.name for c in r.counters] + [n for n, _, _, _ in r.gauges])
    if r.counters:
        t = Table(title="Counter rates over the interval", title_justify="left")
        for col in ("counter", "concept", "labels", "increase", "per second", "note"):
            t.add_column(col, justify="right" if col in ("increase", "per second") else "left")
        for c in r.counters:
            note = "reset" if c.reset else ("new series" if c.appeared else "")
            t.add_row(_shown(c.name), _shown(concept.get(c.name, "-")), _labels(c.labels), _num(c.increase),
                      f"{c.rate_per_s:,.4g}", note)
        out.print(t)
    if r.high_water:
        t = Table(title="High-water marks (the largest value seen; not rates)", title_justify="left")
        for col in ("series", "labels", "before", "after", "note"):
            t.add_column(col, justify="right" if col in ("before", "after") else "left")
        for h in r.high_water:
            t.add_row(_shown(h.name), _labels(h.labels), _num(h.before), _num(h.after),
                      "fell: restarted" if h.fell else "")
        out.print(t)
    if r.histograms:
        out.print(_histogram_table("Observations made during the interval (quantiles are bucket estimates)",
                                   r.histograms))
    _print_attainment(out, r.attainment)
    _print_findings(out, r.findings)
    _print_definitions(out, r.histograms)
    if r.gauges:
        t = Table(title="Gauges", title_justify="left")
        for col in ("gauge", "labels", "before", "after"):
            t.add_column(col, justify="right" if col in ("before", "after") else "left")
        for n, lb, before, after in r.gauges:
            if n in concept:
                t.add_row(_shown(n), _labels(lb), _num(before), _num(after))
        if t.row_count:
            out.print(t)
    if r.vanished:
        out.print(f"series in the first scrape only: {_shown(', '.join(r.vanished))}", highlight=False,
                  soft_wrap=True)


def scrape_command(
    file: Annotated[Path, typer.Argument(help="A Prometheus text or OpenMetrics exposition (a saved /metrics).",
                                         show_default=False)],
    file2: Annotated[Path | None, typer.Argument(
        help="A later exposition of the same server: report rates and the distributions of the interval.",
        show_default=False)] = None,
    ttft: Annotated[str | None, typer.Option(
        "--ttft", help=f"TTFT SLO, e.g. 500ms, 2s; 'off' to skip. (default: {DEFAULT_TTFT_S:g}s)")] = None,
    tpot: Annotated[str | None, typer.Option(
        "--tpot", help=f"TPOT SLO, e.g. 100ms; 'off' to skip. (default: {DEFAULT_TPOT_S * 1e3:g}ms)")] = None,
    e2e: Annotated[str | None, typer.Option("--e2e", help="End-to-end SLO, e.g. 30s (default: off)")] = None,
    interval_s: Annotated[float | None, typer.Option(
        "--interval-s", help="Seconds between the two scrapes, when their samples carry no timestamps.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")] = False,
) -> None:
    """Read /metrics expositions of vLLM, SGLang, TGI, llama.cpp, trtllm-serve, NIM or llmslo: concepts, quantiles,
    SLO attainment, survivor bias.

    Each engine's series are mapped to llmslo's concepts through its profile (llmslo.engines); where an
    engine's series do not allow a check, the output says why and what to put in front.

    One file: per histogram, bucket-estimated quantiles (linear inside the bucket, as PromQL's
    histogram_quantile; a quantile in the +Inf bucket is shown as "≥ highest bound", and one in a bucket whose
    observations the exact sum shows are not spread across it as that bucket, "≤ bound" for the first), the
    exact mean,
    and SLO attainment, exact only when a bucket bound equals the threshold (otherwise the range
    between the neighbouring bounds). Checks flag survivor bias: a TTFT count below the e2e count
    means requests ended without a first token; queued requests are in no histogram.

    Two files (earlier first): counter rates per second over the interval (resets detected) and
    the same reading of the observations made in between. The interval comes from the samples'
    timestamps, or --interval-s. A high-water mark (llama.cpp's n_tokens_max, typed counter) is shown
    with its two values, never as a rate.

    Example: llmslo scrape metrics.txt --ttft 2s
    """
    from llmslo.analysis.scrape import ScrapeFormatError, analyze_scrape, compare_scrapes, read_scrape

    slo = {
        name: value
        for name, value in (("ttft_s", _threshold("ttft", ttft, DEFAULT_TTFT_S)),
                            ("tpot_s", _threshold("tpot", tpot, DEFAULT_TPOT_S)),
                            ("e2e_s", _threshold("e2e", e2e, None)))
        if value is not None
    }
    if interval_s is not None and not (interval_s > 0 and math.isfinite(interval_s)):
        raise _fail(f"--interval-s must be a positive number of seconds, got {interval_s:g}", 2)
    if interval_s is not None and file2 is None:
        raise _fail("--interval-s needs a second file (it is the time between two scrapes)", 2)
    try:
        first = read_scrape(file)
        if file2 is None:
            analysis = analyze_scrape(first, slo=slo)
            if as_json:
                print(json.dumps(analysis.to_dict(), indent=2))
            else:
                _print_single(_console(), analysis)
            return
        second = read_scrape(file2)
        if interval_s is None and (first.timestamp_s is None or second.timestamp_s is None):
            without = " and ".join(str(s.source) for s in (first, second) if s.timestamp_s is None)
            raise _fail(f"{without}: no sample timestamps, so the time between the scrapes is unknown; "
                        "pass --interval-s SECONDS", EXIT_INPUT)
        rates = compare_scrapes(first, second, interval_s=interval_s, slo=slo)
    except ScrapeFormatError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        print(json.dumps(rates.to_dict(), indent=2))
    else:
        _print_rates(_console(), rates)
