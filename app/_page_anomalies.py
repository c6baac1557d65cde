"""Anomalies: the distribution-change scan's windows on a timeline, and its findings with before → after."""

from __future__ import annotations

from typing import Any

import polars as pl
import streamlit as st

from llmslo.analysis import AnomalyConfig, AnomalyReport, parse_duration
from llmslo.analysis.anomaly import ANOMALY_METRICS
from llmslo.app import _charts as charts
from llmslo.app import _compute as compute
from llmslo.app._context import Context, current
from llmslo.app._show import literal, seconds, utc
from llmslo.app._widgets import chart, header, notes, problem, seconds_columns, selection_text, table
from llmslo.telemetry import LlmsloError

__all__ = ["findings_frame", "render", "windows_frame"]

PURPOSE = ("Each window's latencies (by arrival) are tested against the baseline before it (Kolmogorov–Smirnov); "
           "a window is flagged only with enough samples, a significant result after Benjamini–Hochberg across "
           "series and a large effect, and a finding needs flagged windows in a row (docs/anomalies.md).")
_GROUPINGS = {"model": ("model",), "version": ("version",), "tenant class": ("tenant_class",), "nothing": ()}


def windows_frame(report: AnomalyReport) -> pl.DataFrame:
    """Every window of every series with its status: ``in a finding``, ``flagged``, ``tested`` (enough
    samples on both sides) or ``not tested``; times Unix seconds (``from`` in UTC)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for f in report.findings:
        spans.setdefault(f.series, []).append((f.first_start_unix_s, f.end_unix_s))
    rows: list[dict[str, Any]] = []
    for series, windows in report.windows.items():
        for w in windows:
            found = any(lo <= w.start_unix_s and w.end_unix_s <= hi for lo, hi in spans.get(series, ()))
            status = ("in a finding" if found and w.flagged else "flagged" if w.flagged
                      else "tested" if w.enough_samples else "not tested")
            rows.append({"series": literal(series), "from": utc(w.start_unix_s), "start_unix_s": w.start_unix_s,
                         "end_unix_s": w.end_unix_s, "status": status, "n": w.n, "n_baseline": w.n_baseline,
                         "statistic": w.statistic, "p_adjusted": w.p_adjusted})
    schema = {"series": pl.String, "from": pl.String, "start_unix_s": pl.Float64, "end_unix_s": pl.Float64,
              "status": pl.String, "n": pl.Int64, "n_baseline": pl.Int64, "statistic": pl.Float64,
              "p_adjusted": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def findings_frame(report: AnomalyReport) -> pl.DataFrame:
    """One row per finding: the series, where the run began and ended (UTC), how many windows, the test
    figures of the window that completed it, and the p50 / p99 before → after (seconds, relative change)."""
    rows = [{"series": literal(f.series), "from": utc(f.first_start_unix_s), "to": utc(f.end_unix_s),
             "windows": f.windows, "statistic": f.statistic, "p_adjusted": f.p_adjusted, "n_after": f.n_run,
             "n_before": f.n_before, "p50": f"{seconds(f.p50_before_s)} → {seconds(f.p50_after_s)}",
             "p50_before_s": f.p50_before_s, "p50_after_s": f.p50_after_s, "p50_change": f.p50_change,
             "p99": f"{seconds(f.p99_before_s)} → {seconds(f.p99_after_s)}", "p99_before_s": f.p99_before_s,
             "p99_after_s": f.p99_after_s, "p99_change": f.p99_change} for f in report.findings]
    schema = {"series": pl.String, "from": pl.String, "to": pl.String, "windows": pl.Int64, "statistic": pl.Float64,
              "p_adjusted": pl.Float64, "n_after": pl.Int64, "n_before": pl.Int64, "p50": pl.String,
              "p50_before_s": pl.Float64, "p50_after_s": pl.Float64, "p50_change": pl.Float64, "p99": pl.String,
              "p99_before_s": pl.Float64, "p99_after_s": pl.Float64, "p99_change": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def _config() -> tuple[AnomalyConfig, str, tuple[str, ...]]:
    cols = st.columns(4)
    metric = cols[0].selectbox("Metric", list(ANOMALY_METRICS), key="anomaly_metric")
    window = cols[1].text_input("Window", "5m", key="anomaly_window", help="e.g. 300s, 5m")
    consecutive = int(cols[2].number_input("Flagged windows in a row", min_value=1, max_value=20, value=2,
                                           key="anomaly_consecutive"))
    grouping = cols[3].selectbox("One series per", list(_GROUPINGS), key="anomaly_by")
    try:
        window_s = parse_duration(window)
    except ValueError as exc:
        raise LlmsloError(f"Window: {exc}") from None
    return AnomalyConfig(window_s=window_s, consecutive=consecutive), metric, _GROUPINGS[grouping]


def render(ctx: Context) -> None:
    """Draw the page."""
    header(ctx, "Anomalies", PURPOSE)
    try:
        config, metric, by = _config()
        report = compute.anomalies(ctx.opened.store.con, ctx.opened.token, ctx.selection, config, metric, by)
    except LlmsloError as exc:
        problem(str(exc))
        return
    windows = windows_frame(report)
    tested = int((windows["status"] != "not tested").sum())
    st.text(selection_text(ctx, None))
    st.text(f"{len(report.findings)} finding(s) in {len(report.windows)} series, {tested} window(s) tested")
    notes([*report.notes, *(f"{name}: no window tested: {why}" for name, why in report.untested.items())],
          title="What the scan left out, and why")
    if windows.height:
        chart(charts.timeline(windows))
        with st.expander("Every window of the scan"):
            table(windows, config=seconds_columns(windows))
    if report.findings:
        st.subheader("Findings (before = the baseline before the run, after = the run's windows)")
        frame = findings_frame(report)
        table(frame, config=seconds_columns(frame))
    elif windows.height:
        st.text("No finding: no run of flagged windows.")


if __name__ == "__main__":
    render(current())
