"""Rendering a report: tables a person reads at a glance, or CSV for a script."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from llmslo.analysis.report import DEFAULT_QUANTILE_METHOD, LATENCY_INTERVALS, WINDOW_KEY
from llmslo.cli._common import shown
from llmslo.telemetry import format_duration

if TYPE_CHECKING:
    from collections.abc import Mapping

    from llmslo.analysis.report import CensoringAwareTtft, Report

_QUANTS = ("p50", "p90", "p95", "p99")


def _s(value: float | None) -> str:
    """Seconds, readable: 0.0123 -> 12.3ms, 2.5 -> 2.50s."""
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1e3:.3g}ms"
    return f"{value:.3g}s"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def group_label(keys: Mapping[str, Any]) -> str:
    """The group's key values joined with ' · ' (a window shown as its UTC start; rows without arrival times,
    which sit in no window, as ``no arrival time``; an empty value as ``no COLUMN``), shown literally
    (:func:`shown`)."""
    parts = []
    for k, v in keys.items():
        if k == WINDOW_KEY and v is not None:
            parts.append(datetime.fromtimestamp(float(v), tz=UTC).strftime("%Y-%m-%d %H:%M:%S"))
        elif k == WINDOW_KEY:
            parts.append("no arrival time")
        elif v is None:  # a column a row may leave empty: backend, for a request refused before any was chosen
            parts.append(f"no {k}")
        else:
            parts.append(str(v))
    return shown(" · ".join(parts)) if parts else "all"


def render_report(report: Report, console: Console) -> None:
    """Print the goodput, latency, survivor-bias and token tables, then the definitions used."""
    groups = report.groups
    head = shown(" × ".join("window" if k == WINDOW_KEY else k for k in report.group_by) or "all requests")
    if not groups:
        console.print("[yellow]The store holds no request summaries.[/yellow]")
        return

    t = Table(title=f"Goodput by {head}", title_justify="left")
    for col in ("group", "attempted", "good", "in flight", "goodput", "good req/s", "good gen tok/s"):
        t.add_column(col, justify="left" if col == "group" else "right")
    for g in groups:
        t.add_row(group_label(g.keys), f"{g.attempted:,}", f"{g.good:,}", f"{g.in_flight:,}",
                  _pct(g.goodput_fraction), _rate(g.request_goodput_per_s), _rate(g.token_goodput_per_s))
    console.print(t)

    t = Table(title=f"Latency ({_quantiles_title(report)})", title_justify="left")
    for col in ("group", "interval", "n", "mean", *_QUANTS, "max"):
        t.add_column(col, justify="left" if col in ("group", "interval") else "right")
    for g in groups:
        label = group_label(g.keys)
        for name in LATENCY_INTERVALS:
            d = g.latency[name]
            if d.count == 0:
                continue
            t.add_row(label, shown(name), f"{d.count:,}", _s(d.mean), *(_s(d.quantile(q)) for q in _QUANTS), _s(d.max))
            label = ""
    console.print(t)

    t = Table(title="Survivor bias: TTFT over successful requests vs censoring-aware (Kaplan-Meier)",
              title_justify="left")
    for col in ("group", "rejected", "shed+cancel", "success p90", "KM p90",
                "success p99", "KM p99", "verdict"):
        t.add_column(col, justify="left" if col in ("group", "verdict") else "right")
    notes: list[str] = []
    for g in groups:
        sb = g.survivor_bias
        so, ca = sb.ttft_success_only.quantiles, sb.ttft_censoring_aware
        verdict = sb.verdict
        style = {"optimistic": "bold red", "consistent": "green"}.get(verdict, "yellow")
        t.add_row(group_label(g.keys), f"{sb.accounting.rejected:,}", _pct(sb.shed_cancel_fraction),
                  _s(so["p90"]), _aware(ca, "p90"), _s(so["p99"]), _aware(ca, "p99"),
                  f"[{style}]{shown(verdict)}[/{style}]")
        notes += [f"{group_label(g.keys)}: {shown(r)}" for r in sb.reasons if verdict == "optimistic"]
        notes += [f"{group_label(g.keys)}: accounting does not add up: {shown(u)}" for u in sb.accounting.unbalanced]
    console.print(t)
    for n in notes[:12]:
        console.print(f"  [red]•[/red] {n}")
    if len(notes) > 12:
        console.print(f"  … and {len(notes) - 12} more")

    t = Table(title="Tokens (sums; waste = generated - sent; generated/s = generated_tokens_per_s, "
              "sent/s = sent_tokens_per_s)", title_justify="left")
    for col in ("group", "prompt", "generated", "sent", "waste", "generated/s", "sent/s"):
        t.add_column(col, justify="left" if col == "group" else "right")
    for g in groups:
        k = g.tokens
        t.add_row(group_label(g.keys), f"{k.prompt_tokens:,}", f"{k.generated_tokens:,}", f"{k.sent_tokens:,}",
                  f"{k.backpressure_waste_tokens:,}", _rate(k.generated_tokens_per_s), _rate(k.sent_tokens_per_s))
    console.print(t)

    basis = report.rate_basis
    if basis.kind == "window" and basis.seconds is not None:
        rate = f"per-second rates divide by the window length ({format_duration(basis.seconds)})"
    else:
        rate = ("per-second rates divide by the span the data covers, first arrival to last finish "
                f"({_s(basis.seconds)})")
    for caveat in report.caveats:
        console.print(f"[yellow]caveat: {shown(caveat)}[/yellow]")
    totals = report.totals
    console.print(f"[dim]Policy: {shown(report.policy.rule_text())}.[/dim]")
    console.print(f"[dim]Rates: {rate}. Totals: {totals.attempted:,} attempted, "
                  f"{totals.good:,} good ({_pct(totals.goodput_fraction)}).[/dim]")
    for exception in basis.exceptions:
        console.print(f"[yellow]rates: {shown(exception)}[/yellow]")
    mixed = report.clock is not None and report.clock.kind == "mixed"
    for name, text in report.definitions.items():
        # rows on two clocks, or quantiles not by the default definition: said where it is seen
        loud = (mixed and name == "clock") or (name == "quantiles" and report.quantiles != DEFAULT_QUANTILE_METHOD)
        style = "yellow" if loud else "dim"
        console.print(f"[{style}]{shown(name)}: {shown(text)}[/{style}]")


def _quantiles_title(report: Report) -> str:
    """How the latency table's quantiles were computed, said in its title when it is not the default."""
    if report.quantiles == DEFAULT_QUANTILE_METHOD:
        return "exact quantiles"
    return f"exact quantiles by {report.quantiles}: --quantiles {report.quantiles}"


def _aware(ca: CensoringAwareTtft, label: str) -> str:
    """A censoring-aware quantile, or "≥ the largest censored time" when censoring leaves it unbounded."""
    value = ca.quantiles[label]
    if value is None and ca.at_least_s is not None and ca.count:
        return f"≥{_s(ca.at_least_s)}"
    return _s(value)


def report_csv(report: Report) -> str:
    """One CSV row per group: keys, goodput figures, each interval's statistics, tokens, verdict, and the
    quantile definition (``quantiles``: ``linear`` or ``nearest-rank``)."""
    rows: list[dict[str, Any]] = []
    for g in report.groups:
        row: dict[str, Any] = dict(g.keys)
        row.update(attempted=g.attempted, good=g.good, in_flight=g.in_flight, goodput_fraction=g.goodput_fraction,
                   request_goodput_per_s=g.request_goodput_per_s, token_goodput_per_s=g.token_goodput_per_s)
        for name in LATENCY_INTERVALS:
            d = g.latency[name]
            row.update({f"{name}_count": d.count, f"{name}_mean": d.mean})
            row.update({f"{name}_{q}": d.quantile(q) for q in _QUANTS})
            row[f"{name}_max"] = d.max
        row.update(g.tokens.to_dict())
        sb = g.survivor_bias
        for q in ("p90", "p99"):
            row[f"ttft_s_success_only_{q}"] = sb.ttft_success_only.quantiles[q]
            row[f"ttft_s_censoring_aware_{q}"] = sb.ttft_censoring_aware.quantiles[q]
        row["survivor_bias_verdict"] = sb.verdict
        row["quantiles"] = report.quantiles
        rows.append(row)
    buf = io.StringIO()
    fields: Sequence[str] = list(rows[0]) if rows else ["attempted"]
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


__all__ = ["group_label", "render_report", "report_csv"]
