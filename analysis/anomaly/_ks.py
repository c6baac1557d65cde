"""Two-sample Kolmogorov–Smirnov statistics for many windows at once, without re-sorting the baseline.

The statistic is ``D = sup_x |F_a(x) − F_b(x)|`` of the two empirical CDFs. Both are right-continuous step
functions, so between two consecutive points ``a_i ≤ a_{i+1}`` of the sorted window the window's CDF is the
constant ``(i + 1)/n`` while the baseline's only grows. The largest positive difference on that stretch is
at its left end and the largest negative one just before its right end, which gives

    D⁺ = max_i ((i + 1)/n − #{b ≤ a_i}/m),      D⁻ = max_i (#{b < a_i}/m − i/n),      D = max(D⁺, D⁻)

with two binary searches of the ``n`` window points into the sorted baseline, instead of searching all
``n + m`` points in both samples as ``scipy.stats.ks_2samp`` does. Ties need no special care: inside a run
of equal values the maximum falls on the run's last (D⁺) or first (D⁻) element, which is exactly the value
the step function takes there. The integers and the float operations are the ones ``ks_2samp`` uses, so the
statistics agree to the last bit apart from the rounding ``ks_2samp`` applies in its exact mode.

The p-value is Smirnov's asymptotic two-sided form: the distribution of the one-sample statistic for
``round(n·m/(n+m))`` samples (``scipy.stats.kstwo``, what ``ks_2samp`` uses once a sample exceeds 10,000
values) up to :data:`KSTWO_MAX_N`, Kolmogorov's limiting distribution beyond (see there). For
autocorrelated latencies every such p-value is optimistic; :mod:`llmslo.analysis.anomaly._scan` gates findings
on effect size and consecutive windows for that reason.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy import stats

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

__all__ = ["KSTWO_MAX_N", "ks_pvalue", "ks_statistic_and_positions", "ks_statistic_sorted", "ks_statistics_against"]


def ks_statistic_sorted(window: FloatArray, baseline: FloatArray) -> float:
    """KS statistic of two **sorted** samples (any units, the same for both); 0 ≤ D ≤ 1.

    Raises ``ValueError`` when either sample is empty.
    """
    return ks_statistic_and_positions(window, baseline)[0]


def ks_statistic_and_positions(window: FloatArray, baseline: FloatArray) -> tuple[float, IntArray]:
    """KS statistic of two sorted samples and ``searchsorted(baseline, window, "right")`` (reusable to merge)."""
    n, m = len(window), len(baseline)
    if n == 0 or m == 0:
        raise ValueError("a KS statistic needs two non-empty samples")
    right = np.searchsorted(baseline, window, side="right")
    # #{b < a} equals #{b <= a} unless a occurs in the baseline: search again only for those values.
    left = right.copy()
    hit = right > 0
    hit[hit] = baseline[right[hit] - 1] == window[hit]
    if np.any(hit):
        left[hit] = np.searchsorted(baseline, window[hit], side="left")
    ranks = np.arange(n, dtype=np.float64)
    d_plus = float(np.max((ranks + 1.0) / n - right / m))
    d_minus = float(np.max(left / m - ranks / n))
    return max(d_plus, min(max(d_minus, 0.0), 1.0)), right


def ks_statistics_against(sorted_windows: FloatArray, bounds: IntArray, baseline: FloatArray) -> FloatArray:
    """KS statistics of many windows against one **sorted** baseline, with one binary search pass.

    ``sorted_windows[bounds[k]:bounds[k + 1]]`` is window ``k``, each sorted ascending (an empty window's
    statistic is NaN). Returns ``len(bounds) - 1`` statistics. Cost: two binary searches per window value.
    """
    m = len(baseline)
    k = len(bounds) - 1
    out = np.full(max(k, 0), np.nan)
    if m == 0 or k <= 0:
        return out
    right = np.searchsorted(baseline, sorted_windows, side="right") / m
    left = np.searchsorted(baseline, sorted_windows, side="left") / m
    for j in range(k):
        lo, hi = int(bounds[j]), int(bounds[j + 1])
        size = hi - lo
        if size <= 0:
            continue
        ranks = np.arange(size, dtype=np.float64)
        d_plus = float(np.max((ranks + 1.0) / size - right[lo:hi]))
        d_minus = float(np.max(left[lo:hi] - ranks / size))
        out[j] = max(d_plus, min(max(d_minus, 0.0), 1.0))
    return out


KSTWO_MAX_N = 2000
"""Up to this effective sample size ``round(n·m/(n+m))`` the p-value uses the finite-sample distribution of
the statistic (``scipy.stats.kstwo``, milliseconds per value, tens of milliseconds at 30,000); above it,
Kolmogorov's limiting distribution of ``sqrt(n·m/(n+m))·D`` (microseconds), which differs from the
finite-sample value by less than 0.002 in absolute terms there."""


def ks_pvalue(statistic: FloatArray | float, n: IntArray | int, m: IntArray | int) -> FloatArray:
    """Two-sided asymptotic KS p-value(s) for sample sizes ``n`` and ``m`` (vectorised; NaN where n or m is 0).

    See :data:`KSTWO_MAX_N` for which distribution is used.
    """
    d = np.atleast_1d(np.asarray(statistic, dtype=np.float64))
    nn = np.atleast_1d(np.asarray(n, dtype=np.float64))
    mm = np.atleast_1d(np.asarray(m, dtype=np.float64))
    d, nn, mm = np.broadcast_arrays(d, nn, mm)
    p = np.full(d.shape, np.nan)
    ok = (nn > 0) & (mm > 0) & np.isfinite(d)
    en = np.zeros(d.shape)
    en[ok] = np.round(nn[ok] * mm[ok] / (nn[ok] + mm[ok]))
    small = ok & (en <= KSTWO_MAX_N)
    large = ok & (en > KSTWO_MAX_N)
    if np.any(small):
        p[small] = stats.kstwo.sf(d[small], en[small])
    if np.any(large):
        p[large] = stats.kstwobign.sf(np.sqrt(en[large]) * d[large])
    out: FloatArray = np.clip(p, 0.0, 1.0)
    return out
