"""``llmslo anomalies``: distribution changes of latency in the store, against a baseline."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmslo.cli._common import console as _console
from llmslo.cli._common import duration as _duration
from llmslo.cli._common import fail as _fail
from llmslo.cli._common import shown
from llmslo.cli._help import ANOMALY_METRICS
from llmslo.telemetry import LlmsloError

if TYPE_CHECKING:
    from rich.table import Table

    from llmslo.analysis.anomaly import AnomalyReport, TighteningSignal

__all__ = ["anomalies_command"]


def _baseline(text: str) -> dict[str, object]:
    """``preceding``, ``preceding:N``, ``week`` or ``reference:START,END`` (Unix seconds)."""
    kind, _, arg = text.partition(":")
    if kind == "preceding":
        return {"baseline": "preceding", **({"baseline_windows": int(arg)} if arg else {})}
    if kind == "week" and not arg:
        return {"baseline": "week"}
    if kind == "reference" and "," in arg:
        lo, hi = arg.split(",", 1)
        return {"baseline": "reference", "reference_start_unix_s": float(lo), "reference_end_unix_s": float(hi)}
    raise ValueError(f"unrecognised baseline {text!r}")


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.0f}%"


def _ms(x: float) -> str:
    return f"{x * 1e3:.3g}ms" if x < 1 else f"{x:.3g}s"


def _table(report: AnomalyReport) -> Table:
    from rich.table import Table

    t = Table(title="Latency distribution changes (UTC; before = the baseline before the run, after = the "
              "run's windows; statistic and p of the window that completed the run)", title_justify="left")
    for col in ("series", "from", "to", "windows", "statistic", "p (BH)", "n after / before", "p50 before→after",
                "p50", "p99 before→after", "p99"):
        t.add_column(col, justify="left" if col in ("series", "from", "to") else "right")
    for f in report.findings:
        t.add_row(shown(f.series), _when(f.first_start_unix_s), _when(f.end_unix_s), str(f.windows),
                  f"{f.statistic:.3f}", f"{f.p_adjusted:.2g}", f"{f.n_run:,} / {f.n_before:,}",
                  f"{_ms(f.p50_before_s)}→{_ms(f.p50_after_s)}", _pct(f.p50_change),
                  f"{_ms(f.p99_before_s)}→{_ms(f.p99_after_s)}", _pct(f.p99_change))
    return t


def _why_untested(report: AnomalyReport) -> list[str]:
    """Lines saying what the scan left out and, per series without a tested window, why."""
    lines = [f"note: {note}" for note in report.notes]
    lines += [f"{name}: no window tested: {reason}" for name, reason in report.untested.items()]
    if not report.windows and not report.notes:
        lines.append("no series: the store holds no request summaries")
    return lines


def _tightening_table(signals: dict[str, list[TighteningSignal]]) -> Table:
    from rich.table import Table

    t = Table(title="Composite tightening rule: windows where the signals agree (UTC)", title_justify="left")
    for col in ("series", "from", "to", "p99 rise", "failure slope /s", "outcome entropy", "agree"):
        t.add_column(col, justify="left" if col in ("series", "from", "to") else "right")
    for name, items in signals.items():
        for s in items:
            if s.fire:
                t.add_row(shown(name), _when(s.start_unix_s), _when(s.end_unix_s), _pct(s.p99_rise),
                          "-" if s.failure_slope is None else f"{s.failure_slope:.3g}",
                          "-" if s.entropy is None else f"{s.entropy:.2f}", str(s.agree))
    return t


def anomalies_command(
    db: Annotated[Path, typer.Option("--db", help="DuckDB store file.", show_default=False)],
    metric: Annotated[list[str] | None, typer.Option(
        "--metric", help=f"Latency to scan (repeatable): {', '.join(ANOMALY_METRICS)}. (default: ttft)")] = None,
    baseline: Annotated[str, typer.Option(
        "--baseline", help="preceding[:N] (the N windows before, default 12), week (same window a week "
        "earlier) or reference:START,END (Unix seconds).")] = "preceding",
    window: Annotated[str, typer.Option("--window", help="Window length, e.g. 300s, 5m.")] = "5m",
    step: Annotated[str | None, typer.Option("--step", help="Step between windows (default: the window).")] = None,
    test: Annotated[str, typer.Option("--test", help="ks, anderson or mannwhitney.")] = "ks",
    alpha: Annotated[float, typer.Option("--alpha", help="Level after Benjamini-Hochberg across series.")] = 0.01,
    consecutive: Annotated[int, typer.Option("--consecutive", help="Flagged windows in a row for a finding.")] = 2,
    by: Annotated[str, typer.Option("--by", help="Series per value of: model, version, tenant_class "
                                    "(comma-separated; empty for one series).")] = "model",
    tightening: Annotated[bool, typer.Option(
        "--tightening", help="Also evaluate the composite tightening rule (p99 rise, failure-rate slope and "
        "outcome-mix entropy must agree; docs/anomalies.md) on the first --metric.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")] = False,
) -> None:
    """Find windows whose latency distribution moved away from a baseline (docs/anomalies.md).

    Each window (by arrival time) is tested against its baseline with a two-sample test; it is flagged
    only with enough samples, a significant result after Benjamini-Hochberg across series, and a large
    effect (p50 or p99 moved by the configured share and absolute amount); a finding needs
    --consecutive flagged windows in a row. Every finding prints its statistic, p-value, sample sizes
    and quantiles before and after.
    """
    from llmslo.analysis.anomaly import AnomalyConfig, detect_anomalies, detect_tightening
    from llmslo.analysis.store import Store

    try:
        cfg = AnomalyConfig(window_s=_duration("window", window),
                            step_s=_duration("step", step) if step is not None else None,
                            test=test, alpha=alpha, consecutive=consecutive,  # type: ignore[arg-type]
                            **_baseline(baseline))  # type: ignore[arg-type]
    except (ValueError, LlmsloError) as exc:
        raise _fail(str(exc), 2) from None
    groups = tuple(s.strip() for s in by.split(",") if s.strip())
    try:
        with Store.open(db, read_only=True) as store:
            report = detect_anomalies(store.con, cfg, metrics=tuple(metric or ["ttft"]), by=groups)
            signals = (detect_tightening(store.con, anomaly=cfg, metric=(metric or ["ttft"])[0], by=groups)
                       if tightening else {})
    except LlmsloError as exc:
        raise _fail(str(exc), 2 if isinstance(exc, ValueError) else 1) from None
    if as_json:
        out_json = report.to_dict()
        if tightening:
            out_json["tightening"] = {name: [dataclasses.asdict(x) for x in items] for name, items in signals.items()}
        print(json.dumps(out_json, indent=2))
        return
    out = _console()
    if report.findings:
        out.print(_table(report))
    tested = sum(1 for ws in report.windows.values() for w in ws if w.enough_samples)
    out.print(f"{len(report.findings)} finding(s) in {len(report.windows)} series, {tested} windows tested "
              f"({cfg.test.upper()}, alpha {cfg.alpha:g} after BH, {consecutive} consecutive, "
              f"baseline {shown(baseline)})")
    for line in _why_untested(report):
        out.print(f"  {shown(line)}")
    if tightening:
        fired = sum(1 for items in signals.values() for s in items if s.fire)
        if fired:
            out.print(_tightening_table(signals))
        windows = sum(len(items) for items in signals.values())
        out.print(f"composite tightening rule: fired in {fired} of {windows} windows")
