"""The app's charts (Altair, which Streamlit bundles), each built from a table the page also shows.

Time axes are UTC (``scale type utc`` on Unix milliseconds), latency axes seconds. Labels come in already
made literal (:func:`~llmslo.app._show.literal`); Vega draws text as text, never as markup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import altair as alt
import polars as pl

from llmslo.analysis import WINDOW_KEY, Report
from llmslo.analysis.report import Ecdf
from llmslo.app._show import FINISH_COLUMNS, group_label

__all__ = ["Figure", "attempted_good", "ecdf", "finish_reasons", "goodput", "gpu_series", "histogram", "shed",
           "survivor", "timeline", "verdicts"]

Figure = alt.Chart | alt.LayerChart | alt.VConcatChart | alt.FacetChart
"""What the chart functions return (and ``st.altair_chart`` draws)."""
_UTC = alt.Scale(type="utc")
_VERDICT_COLOURS = alt.Scale(domain=["consistent", "optimistic", "insufficient_data"],
                             range=["#2e7d32", "#c62828", "#9e9e9e"])


def _when(frame: pl.DataFrame, column: str = WINDOW_KEY) -> pl.DataFrame:
    return frame.with_columns((pl.col(column) * 1000.0).alias("t_ms"))


def _time(frame: pl.DataFrame, title: str = "window start (UTC)", field: str = "t_ms") -> alt.X:
    """A UTC time axis in 24-hour time (with the date when the data spans more than a day)."""
    values = frame[field].drop_nulls().to_list() if field in frame.columns else []
    span_ms = float(max(values) - min(values)) if values else 0.0
    fmt = "%H:%M:%S" if span_ms < 600_000 else "%H:%M" if span_ms < 86_400_000 else "%m-%d %H:%M"
    return alt.X(f"{field}:T", title=title, scale=_UTC, axis=alt.Axis(format=fmt, labelOverlap=True))


def goodput(frame: pl.DataFrame) -> Figure:
    """Goodput fraction (good / settled) per window."""
    data = _when(frame)
    figure: Figure = (
        alt.Chart(data, title="Goodput fraction by window").mark_line(point=True)
        .encode(_time(data), alt.Y("goodput_fraction:Q", title="good / settled", scale=alt.Scale(domain=[0, 1])),
                tooltip=["window", "attempted", "good", alt.Tooltip("goodput_fraction:Q", format=".3f")]))
    return figure


def attempted_good(frame: pl.DataFrame) -> Figure:
    """Attempted and good requests per window."""
    long = _when(frame).unpivot(index=["t_ms", "window"], on=["attempted", "good"], variable_name="count_of",
                                value_name="requests")
    figure: Figure = (
        alt.Chart(long, title="Attempted vs good requests").mark_line(point=True)
        .encode(_time(long), alt.Y("requests:Q"), alt.Color("count_of:N", title=None),
                tooltip=["window", "count_of", "requests"]))
    return figure


def finish_reasons(frame: pl.DataFrame) -> Figure:
    """Settled requests per finish reason per window, stacked."""
    long = (_when(frame).unpivot(index=["t_ms", "window"], on=list(FINISH_COLUMNS), variable_name="reason",
                                 value_name="requests")
            .with_columns(pl.col("reason").str.strip_prefix("n_")))
    figure: Figure = (
        alt.Chart(long, title="Finish reasons (settled requests)").mark_bar()
        .encode(_time(long), alt.Y("requests:Q", stack="zero"), alt.Color("reason:N", title="finish reason"),
                tooltip=["window", "reason", "requests"]))
    return figure


def verdicts(frame: pl.DataFrame) -> Figure:
    """The survivor-bias verdict of each window."""
    data = _when(frame)
    figure: Figure = (
        alt.Chart(data, title="Survivor-bias verdict by window", height=alt.Step(28)).mark_square(size=120)
        .encode(_time(data), alt.Y("verdict:N", title=None, scale=alt.Scale(domain=_VERDICT_COLOURS.domain)),
                alt.Color("verdict:N", scale=_VERDICT_COLOURS, legend=None),
                tooltip=["window", "verdict", alt.Tooltip("shed_cancel_fraction:Q", format=".1%")]))
    return figure


def _buckets(report: Report, interval: str, threshold_s: float | None) -> pl.DataFrame:
    """Requests per bucket ``(previous bound, bound]`` of ``interval`` per group, and whether the bucket lies
    inside the SLO (bounds contain the threshold, so a bucket is wholly inside or outside)."""
    rows: list[dict[str, object]] = []
    for g in report.groups:
        previous = 0
        for i, b in enumerate(g.latency[interval].buckets):
            label = "> last bound" if b.le == "+Inf" else f"≤ {b.le:g}s"
            inside = None if threshold_s is None or b.le == "+Inf" else float(b.le) <= threshold_s
            rows.append({"group": group_label(g.keys), "bucket": label, "order": i, "requests": b.count - previous,
                         "within_slo": "no SLO" if inside is None else "inside SLO" if inside else "outside SLO"})
            previous = b.count
    return pl.DataFrame(rows, schema={"group": pl.String, "bucket": pl.String, "order": pl.Int64,
                                      "requests": pl.Int64, "within_slo": pl.String}, orient="row")


def histogram(report: Report, interval: str, threshold_s: float | None) -> Figure:
    """Requests per SLO-aligned bucket of ``interval``, per group; one group is coloured by inside / outside
    the SLO, several by group (the buckets outside the SLO paler)."""
    frame = _buckets(report, interval, threshold_s)
    title = f"{interval}: requests per bucket" + (f" (SLO {threshold_s:g}s)" if threshold_s is not None else "")
    base = alt.Chart(frame, title=title).mark_bar()
    x = alt.X("bucket:N", sort=alt.EncodingSortField("order"), title="bucket (seconds)")
    tooltip = ["group", "bucket", "requests", "within_slo"]
    figure: Figure
    if frame["group"].n_unique() <= 1:
        colours = alt.Scale(domain=["inside SLO", "outside SLO", "no SLO"], range=["#1565c0", "#ef9a9a", "#1565c0"])
        figure = base.encode(x, alt.Y("requests:Q"), alt.Color("within_slo:N", scale=colours, title=None),
                             tooltip=tooltip)
    else:
        paler = alt.Scale(domain=["inside SLO", "no SLO", "outside SLO"], range=[1.0, 1.0, 0.4])
        figure = base.encode(x, alt.Y("requests:Q"), alt.Color("group:N"), alt.XOffset("group:N"),
                             alt.Opacity("within_slo:N", scale=paler, title="SLO"), tooltip=tooltip)
    return figure


def ecdf(curves: Sequence[Ecdf], interval: str, threshold_s: float | None) -> Figure:
    """The empirical CDF of ``interval`` per group, with the SLO threshold drawn as a vertical rule."""
    rows = [{"group": group_label(c.keys), "seconds": v, "fraction": f}
            for c in curves for v, f in zip(c.values_s, c.fractions, strict=True)]
    frame = pl.DataFrame(rows, schema={"group": pl.String, "seconds": pl.Float64, "fraction": pl.Float64},
                         orient="row")
    line = (alt.Chart(frame, title=f"{interval}: empirical CDF").mark_line(interpolate="step-after")
            .encode(alt.X("seconds:Q", title=f"{interval} (seconds)"),
                    alt.Y("fraction:Q", title="fraction of requests ≤ x", scale=alt.Scale(domain=[0, 1])),
                    alt.Color("group:N"), tooltip=["group", "seconds", "fraction"]))
    figure: Figure = line
    if threshold_s is not None:
        rule = (alt.Chart(pl.DataFrame({"threshold_s": [threshold_s], "what": [f"SLO {threshold_s:g}s"]}))
                .mark_rule(color="#c62828", strokeDash=[6, 3])
                .encode(alt.X("threshold_s:Q"), tooltip=["what"]))
        figure = alt.layer(line, rule)
    return figure


_BOUND = "at least (unbounded)"


def survivor(frame: pl.DataFrame, quantile: str) -> Figure:
    """Success-only against censoring-aware TTFT at ``quantile`` (``p99``) per window; where the censoring
    leaves the censoring-aware quantile unbounded, its lower bound is drawn as a triangle."""
    data = _when(frame)
    aware = f"censoring_aware_{quantile}_s"
    long = pl.concat([
        data.select("t_ms", "window", pl.lit("success-only").alias("estimate"),
                    pl.col(f"success_only_{quantile}_s").alias("seconds"), pl.lit("exact").alias("value")),
        data.select("t_ms", "window", pl.lit("censoring-aware").alias("estimate"),
                    pl.coalesce(aware, "at_least_s").alias("seconds"),
                    pl.when(pl.col(aware).is_null() & pl.col("at_least_s").is_not_null())
                    .then(pl.lit(_BOUND)).otherwise(pl.lit("exact")).alias("value")),
    ])
    shapes = alt.Scale(domain=["exact", _BOUND], range=["circle", "triangle-up"])
    figure: Figure = (
        alt.Chart(long, title=f"TTFT {quantile}: success-only vs censoring-aware (Kaplan–Meier)")
        .mark_line(point={"size": 60})
        .encode(_time(long), alt.Y("seconds:Q", title=f"TTFT {quantile} (seconds)"), alt.Color("estimate:N"),
                alt.Shape("value:N", scale=shapes, title=None), tooltip=["window", "estimate", "seconds", "value"]))
    return figure


def shed(frame: pl.DataFrame) -> Figure:
    """The shed/cancel fraction (rejected, cancelled, timed out or drained, of settled) per window."""
    data = _when(frame)
    figure: Figure = (
        alt.Chart(data, title="Shed / cancel fraction", height=160).mark_bar()
        .encode(_time(data), alt.Y("shed_cancel_fraction:Q", title="of settled", axis=alt.Axis(format="%")),
                tooltip=["window", alt.Tooltip("shed_cancel_fraction:Q", format=".1%")]))
    return figure


def timeline(frame: pl.DataFrame) -> Figure:
    """The scan's windows per series (rows): in a finding, flagged, tested, or too few samples to test."""
    data = frame.with_columns((pl.col("start_unix_s") * 1000.0).alias("t_ms"),
                              (pl.col("end_unix_s") * 1000.0).alias("t2_ms"))
    colours = alt.Scale(domain=["in a finding", "flagged", "tested", "not tested"],
                        range=["#c62828", "#ef6c00", "#90caf9", "#e0e0e0"])
    figure: Figure = (
        alt.Chart(data, title="Windows of the scan").mark_bar()
        .encode(_time(data, "window (UTC)"), alt.X2("t2_ms:T"),
                alt.Y("series:N", title=None, axis=alt.Axis(labelLimit=320)),
                alt.Color("status:N", scale=colours), tooltip=["series", "from", "status", "n", "n_baseline",
                                                                "p_adjusted"]))
    return figure


def gpu_series(frame: pl.DataFrame, columns: Sequence[str], titles: Mapping[str, str]) -> Figure:
    """Each column of the aligned frame over time, one small chart a column, sharing the time axis."""
    data = frame.with_columns((pl.col("t") * 1000.0).alias("t_ms"))
    charts = [alt.Chart(data, height=110).mark_line()
              .encode(_time(data, "time (UTC)"), alt.Y(f"{c}:Q", title=titles.get(c, c)),
                      tooltip=[alt.Tooltip("t_ms:T", title="time"), c])
              for c in columns]
    figure: Figure = alt.vconcat(*charts).resolve_scale(x="shared")
    return figure
