"""The other trouble signals of a latency series: rolling z-score, failure-rate slope, outcome entropy.

:func:`rolling_zscore` (trailing window ≥ 60 s), :func:`failure_rate_slope` (least squares over the
points inside its window, failures/s per s) and :func:`outcome_entropy` (normalised Shannon entropy of
finish reasons, 0 to 1).

Times are Unix seconds (``arrival_unix_s``); latencies are seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from llmslo.analysis.anomaly._scan import FloatArray, ensure
from llmslo.telemetry import FINISH_REASONS

BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "failure_rate_slope",
    "outcome_entropy",
    "rolling_zscore",
]

MIN_ZSCORE_WINDOW_S = 60.0


def rolling_zscore(times_unix_s: FloatArray, values_s: FloatArray, window_s: float = 60.0) -> FloatArray:
    """Each latency's z-score against the mean and standard deviation of the latencies that arrived in the
    ``window_s`` seconds before it (trailing, the sample itself excluded). NaN with fewer than two earlier
    samples in the window or a zero deviation. ``times_unix_s`` must be ascending.

    Raises :class:`ConfigurationError` when ``window_s`` < 60 s (shorter windows chase noise).
    """
    ensure(window_s >= MIN_ZSCORE_WINDOW_S, f"z-score window must be >= {MIN_ZSCORE_WINDOW_S:g} s, got {window_s}")
    t = np.asarray(times_unix_s, dtype=np.float64)
    x = np.asarray(values_s, dtype=np.float64)
    lo = np.searchsorted(t, t - window_s, side="left")
    hi = np.arange(len(t))
    c1 = np.concatenate([[0.0], np.cumsum(x)])
    shift = float(np.mean(x)) if len(x) else 0.0  # centre before squaring: fewer cancellation errors
    c2 = np.concatenate([[0.0], np.cumsum((x - shift) ** 2)])
    n = (hi - lo).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (c1[hi] - c1[lo]) / n
        m2 = (c2[hi] - c2[lo]) / n - (mean - shift) ** 2
        sd = np.sqrt(np.maximum(m2 * n / (n - 1), 0.0))
        z = (x - mean) / sd
    z[(n < 2) | ~(sd > 0)] = np.nan
    out: FloatArray = np.asarray(z, dtype=np.float64)
    return out


def failure_rate_slope(
    times_unix_s: FloatArray,
    failed: BoolArray,
    *,
    window_s: float = 30.0,
    bucket_s: float = 1.0,
    start_unix_s: float | None = None,
    end_unix_s: float | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Least-squares slope of the failure rate (failures per second, in ``bucket_s`` buckets by arrival),
    over the buckets inside each trailing ``window_s`` window. Returns ``(bucket_end_unix_s, slope)`` with
    the slope in failures/s per second; NaN until a window holds at least three buckets.
    """
    ensure(window_s >= 3 * bucket_s, f"window_s must hold at least three buckets of {bucket_s} s, got {window_s}")
    t = np.asarray(times_unix_s, dtype=np.float64)
    f = np.asarray(failed, dtype=bool)
    if len(t) == 0:
        return np.empty(0), np.empty(0)
    t0 = math.floor((float(np.min(t)) if start_unix_s is None else start_unix_s) / bucket_s) * bucket_s
    t1 = float(np.max(t)) if end_unix_s is None else end_unix_s
    nb = max(1, math.ceil((t1 - t0) / bucket_s + 1e-12))
    idx = np.clip(((t[f] - t0) // bucket_s).astype(np.int64), 0, nb - 1)
    rate = np.bincount(idx, minlength=nb).astype(np.float64) / bucket_s
    k = round(window_s / bucket_s)
    ends = t0 + bucket_s * (np.arange(nb) + 1)
    slope = np.full(nb, np.nan)
    if nb >= k:
        centred = (np.arange(k) - (k - 1) / 2.0) * bucket_s
        # Sum over a window of (t_i - t̄) * rate_i: a correlation with a fixed kernel.
        num = np.correlate(rate, centred, mode="valid")
        slope[k - 1:] = num / float(np.sum(centred**2))
    return np.asarray(ends, dtype=np.float64), slope


def outcome_entropy(finish_reasons: Sequence[str]) -> float:
    """Normalised Shannon entropy of a mix of finish reasons: 0 when one reason accounts for every request,
    1 when all seven of the closed set are equally frequent (divided by ln 7). NaN for an empty mix."""
    if len(finish_reasons) == 0:
        return math.nan
    _, counts = np.unique(np.asarray(finish_reasons, dtype=object).astype(str), return_counts=True)
    p = counts / counts.sum()
    return float(-np.sum(p * np.log(p)) / math.log(len(FINISH_REASONS)))
