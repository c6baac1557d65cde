"""Bucket math: quantiles and SLO attainment estimated from one histogram series' cumulative buckets.

* **bucket-estimated quantiles** (:func:`bucket_quantile`): the rank ``q × count`` is located in the
  cumulative buckets and interpolated linearly inside its bucket, as PromQL's ``histogram_quantile``
  does (the first bucket's lower edge is 0 when its upper bound is positive). They are estimates,
  labelled so: the true value lies somewhere in the same bucket. A rank that falls in the ``+Inf``
  bucket is only known to be at least the highest finite bound (PromQL returns that bound; we say
  "at least"). A linear guess assumes the bucket's observations spread across it; when the exact
  ``_sum`` proves they cannot (their mean lies, at most, in the bucket's lowest tenth, or at least in its
  highest), the quantile is only *bounded* by the bucket and is given as that bucket, ``≤ 0.05`` for the
  first one, never as a point inside it (:data:`SPREAD_FRACTION`).
* **SLO attainment** (:func:`slo_attainment`) for a threshold in seconds on a mapped interval (TTFT,
  TPOT, e2e): the fraction of observations ``≤ threshold``, exact only when a bucket bound equals the
  threshold (within 1e-9 × max(1, threshold) seconds). Otherwise the two bounds around it give a range, and the result
  says that no bound equals the threshold.

Bounds and values are in the histogram's unit (seconds for latency histograms); counts are
observations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmslo.analysis.scrape._names import KnownMetric
from llmslo.analysis.scrape._parse import HistogramSeries, Labels

__all__ = [
    "SPREAD_FRACTION",
    "QuantileEstimate",
    "SloAttainment",
    "bucket_quantile",
    "fmt_count",
    "slo_attainment",
]

_EXACT_TOLERANCE = 1e-9
SPREAD_FRACTION = 0.1
"""A linear estimate inside a bucket is given only when the exact sum allows the bucket's observations a mean
beyond its lowest and highest tenth (of its width); otherwise the quantile is ``bounded`` by the bucket. Reason:
the interpolation places the bucket's median at its middle, which such a mean proves wrong (SGLang's
``func_latency_seconds``: a mean of 0.32 ms in a first bucket of 50 ms gave a "p50" of 25 ms)."""


@dataclass(frozen=True)
class QuantileEstimate:
    """A quantile estimated from buckets, seconds for latency histograms.

    ``value`` is the PromQL-style linear interpolation inside the bucket holding the rank; the true
    quantile lies in [``bucket_lower``, ``bucket_upper``]. ``kind``: ``interpolated``; ``at_least``
    (the rank is in the ``+Inf`` bucket: only ``value`` = highest finite bound is known as a lower
    bound); ``bounded`` (the exact sum shows the bucket's observations are not spread across it: the
    quantile is only known to lie in the bucket, and ``value`` is its upper bound, not an estimate);
    ``none`` (no observations or an untrustworthy histogram).
    """

    q: float
    value: float | None
    bucket_lower: float | None
    bucket_upper: float | None
    kind: str

    def label(self) -> str:
        """``p99 ≈ 2.31 (bucket estimate)``, ``p99 ≥ 30 (above the highest bound)`` or ``p99 n/a``."""
        name = f"p{self.q * 100:g}"
        if self.value is None:
            return f"{name} n/a"
        if self.kind == "at_least":
            return f"{name} ≥ {self.value:g} (above the highest bucket bound)"
        if self.kind == "bounded":
            where = (f"≤ {self.bucket_upper:g}" if not self.bucket_lower
                     else f"in ({self.bucket_lower:g}, {self.bucket_upper:g}]")
            return (f"{name} {where} (only bounded by its bucket: the exact mean shows the bucket's observations "
                    "are not spread across it, so no point inside it is estimated)")
        return f"{name} ≈ {self.value:.4g} (bucket estimate, in ({self.bucket_lower:g}, {self.bucket_upper:g}])"


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]], *,
                    total_sum: float | None = None) -> QuantileEstimate:
    """Estimate the ``q`` quantile (0 ≤ q ≤ 1) from cumulative ``(le, count)`` buckets sorted by ``le``.

    As PromQL's ``histogram_quantile``: rank = q × observations (the ``+Inf`` bucket); the first bucket
    whose cumulative count reaches the rank holds it; the value is interpolated linearly between that
    bucket's lower and upper bound (lower = 0 for the first bucket when its bound is positive). In the
    ``+Inf`` bucket the result is the highest finite bound, labelled ``at_least``. With ``total_sum`` (the
    series' ``_sum``), a bucket whose observations that sum proves are not spread across it
    (:data:`SPREAD_FRACTION`) gives a ``bounded`` quantile instead of a point inside it. Raises
    ``ValueError`` for q outside [0, 1].

    >>> bucket_quantile(0.5, [(1.0, 2.0), (2.0, 6.0), (math.inf, 6.0)]).value
    1.5
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q!r}")
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]):
        return QuantileEstimate(q, None, None, None, "none")
    total = buckets[-1][1]
    if not total > 0:
        return QuantileEstimate(q, None, None, None, "none")
    rank = q * total
    index = next(i for i, (_, c) in enumerate(buckets) if c >= rank)
    if index == len(buckets) - 1:
        highest = buckets[-2][0]
        return QuantileEstimate(q, highest, highest, math.inf, "at_least")
    upper, count_upto = buckets[index]
    if index == 0:
        if upper <= 0:
            return QuantileEstimate(q, upper, upper, upper, "interpolated")
        lower, count_below = 0.0, 0.0
    else:
        lower, count_below = buckets[index - 1]
    in_bucket = count_upto - count_below
    if in_bucket <= 0:
        return QuantileEstimate(q, upper, lower, upper, "interpolated")
    if total_sum is not None and _not_spread(buckets, index, lower, total_sum):
        return QuantileEstimate(q, upper, lower, upper, "bounded")
    value = lower + (upper - lower) * (rank - count_below) / in_bucket
    return QuantileEstimate(q, value, lower, upper, "interpolated")


def _not_spread(buckets: Sequence[tuple[float, float]], index: int, lower: float, total_sum: float) -> bool:
    """Whether ``total_sum`` proves that the observations of bucket ``index`` (lower edge ``lower``) average in
    its lowest or its highest :data:`SPREAD_FRACTION`: every other observation is put at its own bucket's
    lower, then its upper edge, and what the sum leaves for this bucket's observations bounds their mean."""
    if not math.isfinite(total_sum):
        return False
    upper = buckets[index][0]
    counts = [c - (buckets[i - 1][1] if i else 0.0) for i, (_, c) in enumerate(buckets)]
    edges = [(0.0 if i == 0 else buckets[i - 1][0], le) for i, (le, _) in enumerate(buckets)]
    mine = counts[index]
    least = most = 0.0
    for i, ((lo, hi), n) in enumerate(zip(edges, counts, strict=True)):
        if i == index or n <= 0:
            continue
        least += n * max(lo, 0.0)
        most += n * hi  # math.inf for observations above the highest bound: no upper edge
    width = upper - lower
    mean_at_most = (total_sum - least) / mine
    mean_at_least = (total_sum - most) / mine if math.isfinite(most) else -math.inf
    return mean_at_most < lower + SPREAD_FRACTION * width or mean_at_least > upper - SPREAD_FRACTION * width


@dataclass(frozen=True)
class SloAttainment:
    """Fraction of observations within a threshold, from one histogram series.

    ``exact`` when a bucket bound equals ``threshold_s``: ``fraction`` = count(le = threshold) /
    observations. Otherwise ``fraction`` is None and the attainment lies in [``lower_fraction``,
    ``upper_fraction``], the fractions at the bounds just below and above (``bound_below``,
    ``bound_above``; None when there is none). ``per`` says what an observation is. When the same
    server's e2e histogram shows requests that ended without a first token (TTFT only),
    ``missing_requests`` counts them (a lower bound) and ``fraction_counting_missing`` (or the
    ``*_counting_missing`` bounds) counts them as not good.
    """

    metric: str
    labels: Labels
    interval: str
    per: str
    threshold_s: float
    observations: float
    exact: bool
    fraction: float | None
    lower_fraction: float | None
    upper_fraction: float | None
    bound_below: float | None
    bound_above: float | None
    missing_requests: float = 0.0
    fraction_counting_missing: float | None = None
    lower_counting_missing: float | None = None
    upper_counting_missing: float | None = None
    message: str = ""


def fmt_count(x: float) -> str:
    """A count for a message: no decimals when whole (``1,234``), else two (``1,234.50``)."""
    return f"{x:,.0f}" if x == math.floor(x) else f"{x:,.2f}"


def slo_attainment(series: HistogramSeries, known: KnownMetric, threshold: float,
                   missing: float) -> SloAttainment | None:
    """Attainment of ``threshold`` seconds on one series (None when unusable); ``missing``: requests absent
    from it, counted as not good in the ``*_counting_missing`` fields."""
    if series.problems or not series.buckets:
        return None
    total = series.total
    if not total > 0:
        return None
    finite = [(le, c) for le, c in series.buckets if math.isfinite(le)]
    tol = _EXACT_TOLERANCE * max(1.0, abs(threshold))
    exact = next(((le, c) for le, c in finite if abs(le - threshold) <= tol), None)
    below = max(((le, c) for le, c in finite if le < threshold - tol), default=None)
    above = min(((le, c) for le, c in finite if le > threshold + tol), default=None)
    obs = f"observations (one per {known.per})"
    caveat = f"; {known.name} is not defined as our {known.interval}: {known.difference}" if (
        known.difference and known.interval == "tpot_s") else ""
    if exact is not None:
        frac = exact[1] / total
        with_missing = exact[1] / (total + missing) if missing > 0 else None
        message = (f"{frac:.2%} of {fmt_count(total)} {obs} within {threshold:g} s "
                   f"(a bucket bound equals the threshold)")
        if with_missing is not None:
            message += (f"; {with_missing:.2%} counting the {fmt_count(missing)} requests that ended without "
                        "a first token as not good")
        message += caveat
        return SloAttainment(known.name, series.labels, known.interval, known.per, threshold, total, True, frac,
                             frac, frac, exact[0], exact[0], missing, with_missing, with_missing, with_missing,
                             message)
    lo = below[1] / total if below is not None else 0.0
    hi = above[1] / total if above is not None else 1.0
    lo_m = lo * total / (total + missing) if missing > 0 else None
    hi_m = hi * total / (total + missing) if missing > 0 else None
    bounds = ", ".join(f"{le:g}" for le in series.finite_bounds)
    message = (f"no bucket bound equals {threshold:g} s (bounds: {bounds}): attainment over {fmt_count(total)} "
               f"{obs} lies between {lo:.2%}"
               + (f" (≤ {below[0]:g} s)" if below is not None else "")
               + f" and {hi:.2%}" + (f" (≤ {above[0]:g} s)" if above is not None else "")
               + "; not reported as a number")
    if lo_m is not None and hi_m is not None:
        message += (f" (between {lo_m:.2%} and {hi_m:.2%} counting the {fmt_count(missing)} requests that ended "
                    "without a first token as not good)")
    message += f". A bucket bound at {threshold:g} s would make it exact{caveat}"
    return SloAttainment(known.name, series.labels, known.interval, known.per, threshold, total, False, None,
                         lo, hi, below[0] if below else None, above[0] if above else None, missing, None, lo_m,
                         hi_m, message)
