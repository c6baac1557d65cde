"""How values reach the page: literally, in UTC, with their units; tables built from the typed report.

Everything here is plain Python over the analysis API's typed results (no Streamlit), so the tables a page
shows can be tested against ``llmslo report --json`` directly. Labels (model, version, tenant class, file
names) are data: :func:`literal` makes control and invisible characters visible as their code points, and
:func:`markdown_literal` additionally escapes every Markdown character, for the few elements that render
Markdown (errors, warnings, captions). Everything else goes to ``st.text``, ``st.code`` or a dataframe,
which show text as it is.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from llmslo.analysis import WINDOW_KEY, Report, format_duration
from llmslo.analysis.report import Group
from llmslo.telemetry import FINISH_REASONS

__all__ = [
    "FINISH_COLUMNS",
    "auto_window_s",
    "fraction",
    "group_label",
    "latency_frame",
    "literal",
    "markdown_literal",
    "seconds",
    "survivor_frame",
    "utc",
    "window_frame",
    "window_text",
]

_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_MARKDOWN = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character (CommonMark escapes them all)
FINISH_COLUMNS: tuple[str, ...] = tuple(f"n_{r}" for r in FINISH_REASONS)
"""Columns of the window table that count settled requests per finish reason."""
_NICE_WINDOWS_S: tuple[float, ...] = (1, 5, 10, 30, 60, 300, 600, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600,
                                      86400, 7 * 86400)


def _code_point(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def literal(value: object) -> str:
    """``str(value)`` with control and invisible characters written as their code points (ESC as ``\\x1b``,
    U+202E as ``\\u202e``): what a label really holds, visibly, for ``st.text`` and dataframes."""
    return _INVISIBLE.sub(_code_point, str(value))


def markdown_literal(value: object) -> str:
    """:func:`literal`, with every Markdown character backslash-escaped: ``**bold**`` stays as written in an
    element that renders Markdown (``st.error``, ``st.caption``)."""
    return _MARKDOWN.sub(r"\\\1", literal(value))


def utc(unix_s: float | None) -> str:
    """Unix seconds as ``YYYY-MM-DD HH:MM:SS`` UTC (with milliseconds when not whole); ``-`` for None."""
    if unix_s is None or not math.isfinite(unix_s):
        return "-"
    when = dt.datetime.fromtimestamp(unix_s, dt.UTC)
    text = when.strftime("%Y-%m-%d %H:%M:%S")
    return text + (f".{when.microsecond // 1000:03d}" if when.microsecond else "")


def seconds(value: float | None) -> str:
    """A duration in seconds for reading: ``850ms``, ``2.5s``; ``-`` for None."""
    if value is None:
        return "-"
    if value == 0:
        return "0s"
    return f"{value * 1e3:.3g}ms" if abs(value) < 1 else f"{value:.3g}s"


def fraction(value: float | None) -> str:
    """A fraction in [0, 1] as a percentage with one decimal; ``-`` for None."""
    return "-" if value is None else f"{value:.1%}"


def auto_window_s(first_unix_s: float | None, last_unix_s: float | None, *, most: int = 60) -> float:
    """The shortest of the usual window lengths (1 s ... 1 week) that gives at most ``most`` windows over the
    arrival range (Unix seconds); 5 minutes when there is no range."""
    if first_unix_s is None or last_unix_s is None:
        return 300.0
    for w in _NICE_WINDOWS_S:
        if math.floor(last_unix_s / w) - math.floor(first_unix_s / w) + 1 <= most:
            return float(w)
    return float(_NICE_WINDOWS_S[-1])


def group_label(keys: Mapping[str, Any], *, skip: Sequence[str] = (WINDOW_KEY,)) -> str:
    """A group's key values as ``model=a, version=b`` (literal), ``all requests`` without keys."""
    parts = [f"{k}={literal(v)}" for k, v in keys.items() if k not in skip]
    return ", ".join(parts) or "all requests"


def _key_columns(group: Group, by: Sequence[str]) -> dict[str, Any]:
    return {k: literal(group.keys[k]) for k in by}


def window_frame(report: Report) -> pl.DataFrame:
    """One row per group of a windowed report: the window (UTC and Unix seconds), the group's keys, attempted,
    good, in flight, goodput (fraction and rates), the survivor-bias verdict and shed/cancel fraction, and the
    settled requests per finish reason (``n_<reason>``)."""
    by = [k for k in report.group_by if k != WINDOW_KEY]
    rows: list[dict[str, Any]] = []
    for g in report.groups:
        start = g.keys.get(WINDOW_KEY)
        row: dict[str, Any] = {"window": utc(start), WINDOW_KEY: start, **_key_columns(g, by),
                               "attempted": g.attempted, "good": g.good, "in_flight": g.in_flight,
                               "goodput_fraction": g.goodput_fraction,
                               "request_goodput_per_s": g.request_goodput_per_s,
                               "token_goodput_per_s": g.token_goodput_per_s,
                               "verdict": g.survivor_bias.verdict,
                               "shed_cancel_fraction": g.survivor_bias.shed_cancel_fraction}
        row.update({f"n_{r}": int(g.finish_reasons.get(r, 0)) for r in FINISH_REASONS})
        rows.append(row)
    schema: dict[str, Any] = {"window": pl.String, WINDOW_KEY: pl.Float64, **dict.fromkeys(by, pl.String),
                              "attempted": pl.Int64, "good": pl.Int64, "in_flight": pl.Int64,
                              "goodput_fraction": pl.Float64, "request_goodput_per_s": pl.Float64,
                              "token_goodput_per_s": pl.Float64, "verdict": pl.String,
                              "shed_cancel_fraction": pl.Float64, **dict.fromkeys(FINISH_COLUMNS, pl.Int64)}
    return pl.DataFrame(rows, schema=schema, orient="row")


def latency_frame(report: Report, intervals: Sequence[str]) -> pl.DataFrame:
    """One row per group and interval: the group's keys, ``interval``, count, mean, exact quantiles and max
    (seconds), and ``within_slo``: the share of the interval's values at or under the policy's threshold on
    it (from the SLO-aligned bucket at that bound; None without a threshold or a value)."""
    by = [k for k in report.group_by if k != WINDOW_KEY]
    thresholds = {"ttft_s": report.policy.ttft_s, "tpot_s": report.policy.tpot_s, "e2e_s": report.policy.e2e_s}
    labels: list[str] = []
    rows: list[dict[str, Any]] = []
    for g in report.groups:
        for name in intervals:
            d = g.latency[name]
            labels = list(d.quantiles)
            within: float | None = None
            bound = thresholds.get(name)
            if bound is not None and d.count:
                within = next(b.count for b in d.buckets if b.le == bound) / d.count
            rows.append({**_key_columns(g, by), "interval": name, "count": d.count, "mean_s": d.mean,
                         **{f"{q}_s": v for q, v in d.quantiles.items()}, "max_s": d.max, "within_slo": within})
    schema: dict[str, Any] = {**dict.fromkeys(by, pl.String), "interval": pl.String, "count": pl.Int64,
                              "mean_s": pl.Float64, **{f"{q}_s": pl.Float64 for q in labels or _QUANTILE_LABELS},
                              "max_s": pl.Float64, "within_slo": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


_QUANTILE_LABELS: tuple[str, ...] = ("p50", "p90", "p95", "p99")


def survivor_frame(report: Report) -> pl.DataFrame:
    """One row per group: the window, the group's keys, the accounting (attempted, admitted, rejected),
    success-only and censoring-aware (Kaplan–Meier) TTFT quantiles (seconds; a censoring-aware quantile that
    the censoring leaves unbounded is None and then at least ``at_least_s``), the shed/cancel fraction, the
    verdict and its reasons (joined by ``; ``)."""
    by = [k for k in report.group_by if k != WINDOW_KEY]
    rows: list[dict[str, Any]] = []
    so_labels: list[str] = []
    ca_labels: list[str] = []
    for g in report.groups:
        sb = g.survivor_bias
        so_labels, ca_labels = list(sb.ttft_success_only.quantiles), list(sb.ttft_censoring_aware.quantiles)
        start = g.keys.get(WINDOW_KEY)
        rows.append({"window": utc(start) if start is not None else "whole selection", WINDOW_KEY: start,
                     **_key_columns(g, by), "attempted": sb.accounting.attempted,
                     "admitted": sb.accounting.admitted, "rejected": sb.accounting.rejected,
                     "success_only_n": sb.ttft_success_only.count,
                     **{f"success_only_{q}_s": v for q, v in sb.ttft_success_only.quantiles.items()},
                     "censoring_aware_n": sb.ttft_censoring_aware.count,
                     "censored": sb.ttft_censoring_aware.censored,
                     **{f"censoring_aware_{q}_s": v for q, v in sb.ttft_censoring_aware.quantiles.items()},
                     "at_least_s": sb.ttft_censoring_aware.at_least_s,
                     "shed_cancel_fraction": sb.shed_cancel_fraction, "verdict": sb.verdict,
                     "reasons": "; ".join(literal(r) for r in sb.reasons)})
    default = ("p50", "p90", "p99")
    schema: dict[str, Any] = {
        "window": pl.String, WINDOW_KEY: pl.Float64, **dict.fromkeys(by, pl.String), "attempted": pl.Int64,
        "admitted": pl.Int64, "rejected": pl.Int64, "success_only_n": pl.Int64,
        **{f"success_only_{q}_s": pl.Float64 for q in so_labels or default}, "censoring_aware_n": pl.Int64,
        "censored": pl.Int64, **{f"censoring_aware_{q}_s": pl.Float64 for q in ca_labels or default},
        "at_least_s": pl.Float64, "shed_cancel_fraction": pl.Float64, "verdict": pl.String, "reasons": pl.String}
    return pl.DataFrame(rows, schema=schema, orient="row")


def window_text(window_s: float | None) -> str:
    """``5m windows`` or ``no windows``."""
    return "no windows" if window_s is None else f"{format_duration(window_s)} windows"
