"""The composite tightening rule: fires only when the p99 rise, the failure slope and the entropy agree.

:func:`tightening_signals` evaluates it on the windows of a distribution-change scan (their window, step
and baseline) and :func:`detect_tightening` on the stored summaries; :class:`TighteningConfig` holds
its thresholds (p99 rise relative, failure slope in failures/s per s, entropy normalised to [0, 1]).

Times are Unix seconds (``arrival_unix_s``); latencies are seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl

from llmslo.analysis.anomaly._scan import (
    ANOMALY_METRICS,
    SERIES_GROUPS,
    AnomalyConfig,
    FloatArray,
    ensure,
    scan_series,
    scanned_rows,
)
from llmslo.analysis.anomaly._signals import failure_rate_slope, outcome_entropy
from llmslo.analysis.store import SUMMARY_TABLE

__all__ = [
    "TighteningConfig",
    "TighteningSignal",
    "detect_tightening",
    "tightening_signals",
]


@dataclass(frozen=True)
class TighteningConfig:
    """The composite tightening rule: fire only when at least ``min_agree`` signals hold in a window.

    ``p99_rise``: relative rise of the window's p99 over the baseline's (0.3 = +30%); ``failure_slope``:
    failures/s per second, the largest slope of any ``slope_window_s`` window ending inside the window;
    ``entropy``: normalised outcome-mix entropy of the window. Raises :class:`ConfigurationError`.
    """

    p99_rise: float = 0.30
    failure_slope: float = 0.8
    entropy: float = 0.45
    slope_window_s: float = 30.0
    min_agree: int = 3
    success_reasons: tuple[str, ...] = ("stop", "length")

    def __post_init__(self) -> None:
        ensure(self.p99_rise > 0, f"p99_rise must be > 0, got {self.p99_rise}")
        ensure(0 <= self.entropy <= 1, f"entropy must be in [0, 1], got {self.entropy}")
        ensure(1 <= self.min_agree <= 3, f"min_agree must be 1, 2 or 3, got {self.min_agree}")
        ensure(self.slope_window_s >= 3, f"slope_window_s must be >= 3 s, got {self.slope_window_s}")


@dataclass(frozen=True)
class TighteningSignal:
    """The composite rule evaluated on one window: each signal, whether it holds, and the verdict."""

    start_unix_s: float
    end_unix_s: float
    p99_rise: float | None
    failure_slope: float | None
    entropy: float | None
    agree: int
    fire: bool


def tightening_signals(
    arrival_unix_s: FloatArray,
    latency_s: FloatArray,
    finish_reasons: Sequence[str],
    config: TighteningConfig | None = None,
    anomaly: AnomalyConfig | None = None,
) -> list[TighteningSignal]:
    """Evaluate the composite rule on each window of ``anomaly`` (its window, step and baseline).

    ``latency_s`` may hold NaN for requests without the latency (e.g. no first token): they count in the
    outcome mix and the failure rate, not in the p99.
    """
    tc = config or TighteningConfig()
    ac = anomaly or AnomalyConfig()
    t = np.asarray(arrival_unix_s, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    t = t[order]
    x = np.asarray(latency_s, dtype=np.float64)[order]
    reasons = np.asarray(finish_reasons, dtype=object)[order].astype(str)
    failed = ~np.isin(reasons, tc.success_reasons)
    windows = scan_series(t, x, ac, series="tightening")
    if not windows:
        return []
    ends, slope = failure_rate_slope(t, failed, window_s=tc.slope_window_s,
                                     start_unix_s=windows[0].start_unix_s, end_unix_s=windows[-1].end_unix_s)
    out: list[TighteningSignal] = []
    for w in windows:
        rise = w.p99_change
        inside = (ends > w.start_unix_s + tc.slope_window_s - 1e-9) & (ends <= w.end_unix_s + 1e-9)
        s = slope[inside]
        s = s[np.isfinite(s)]
        max_slope = float(np.max(s)) if len(s) else None
        lo, hi = np.searchsorted(t, [w.start_unix_s, w.end_unix_s], side="left")
        ent = outcome_entropy(list(reasons[lo:hi])) if hi > lo else None
        agree = int(rise is not None and rise >= tc.p99_rise) + int(
            max_slope is not None and max_slope > tc.failure_slope) + int(ent is not None and ent > tc.entropy)
        out.append(TighteningSignal(w.start_unix_s, w.end_unix_s, rise, max_slope, ent, agree,
                                    agree >= tc.min_agree))
    return out


def detect_tightening(
    con: duckdb.DuckDBPyConnection,
    config: TighteningConfig | None = None,
    anomaly: AnomalyConfig | None = None,
    *,
    metric: str = "ttft",
    by: Sequence[str] = ("model",),
) -> dict[str, list[TighteningSignal]]:
    """Evaluate the composite tightening rule on the stored summaries, one series per group of ``by``.

    Every request counts in the outcome mix and the failure rate; only those with the metric defined
    (e.g. a first token for ``ttft``) count in the p99. Windows, step and baseline come from ``anomaly``.
    Rows from imports without arrival times are left out. Raises :class:`ConfigurationError` for an
    unknown metric or grouping column, and :class:`~llmslo.analysis.report.ReportDataError` for a stored
    arrival time that cannot be placed.
    """
    ensure(metric in ANOMALY_METRICS, f"unknown metric {metric!r}; choose from {', '.join(ANOMALY_METRICS)}")
    for b in by:
        ensure(b in SERIES_GROUPS, f"cannot group by {b!r}; choose from {', '.join(SERIES_GROUPS)}")
    sel = f"{', '.join(by)}, " if by else ""
    keep, _ = scanned_rows(con)
    frame = con.sql(
        f"SELECT {sel}arrival_unix_s AS t, ({ANOMALY_METRICS[metric]}) AS x, finish_reason AS r "
        f"FROM {SUMMARY_TABLE} WHERE {keep} ORDER BY {sel}arrival_unix_s"
    ).pl()
    parts = frame.partition_by(list(by), as_dict=True, maintain_order=True) if by else {(): frame}
    out: dict[str, list[TighteningSignal]] = {}
    for key, part in parts.items():
        name = metric + "".join(f" {k}={v}" for k, v in zip(by, key, strict=True))
        x = part["x"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
        out[name] = tightening_signals(part["t"].to_numpy().astype(np.float64), x.astype(np.float64),
                                       part["r"].to_list(), config, anomaly)
    return out
