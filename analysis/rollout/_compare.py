"""Version comparison during a rolling update's overlap window (``llmslo rollout compare``).

For every version that served requests in the window, :func:`compare_versions` measures the outcome figures
(error, timeout and rejection rates, goodput under a printed policy, TTFT and e2e quantiles), compares each
version in the window with its own baseline (its requests outside every stored update window) and the
versions in the window with each other, and gives a verdict: ``lossless``, ``regression`` (which version,
which metric, which tenant class, how big) or ``insufficient_data``, with the reasons.

Statistics: rates by a two-proportion z-test (Fisher's exact test when an expected count is below 5) with a
95 % Newcombe (hybrid Wilson score) interval of the difference; latency by a two-sided Mann–Whitney U test,
Cliff's delta and the relative change of the median and p99, with a 95 % interval of the difference of the
medians from each median's distribution-free order-statistic interval. Every test of the family (metrics ×
comparisons) is adjusted by Holm's step-down method, so the chance of one false ``regression`` among them
is at most ``alpha`` (familywise error rate). A significant difference counts as a regression only in the
bad direction and only when its effect reaches the stated minimum (large samples make tiny shifts
"significant").

Process figures (drain time, settle delay, terminated and drain-rejected requests by version) are kept in a
section of their own: requests the drain ended are counted there and left out of the outcome rates, so the
update procedure is never blamed on a version, nor the reverse (domain.md §4). Times are Unix seconds;
durations seconds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Literal

import duckdb
import numpy as np
import numpy.typing as npt
from scipy import stats

from llmslo.analysis.report import GoodputPolicy, placeable_rows
from llmslo.analysis.rollout._records import RolloutInputError, UpdateRecord, get_update, list_updates
from llmslo.analysis.store import SUMMARY_TABLE
from llmslo.telemetry import ConfigurationError

__all__ = [
    "CORRECTION",
    "DEFAULT_ALPHA",
    "LATENCY_METRICS",
    "MIN_LATENCY_CHANGE",
    "MIN_RATE_DIFFERENCE",
    "MIN_SIDE_COUNT",
    "MISSING_TERMINAL_EVENTS",
    "RATE_METRICS",
    "CompareWindow",
    "LatencySummary",
    "MetricComparison",
    "ProcessFigures",
    "Regression",
    "TenantDifference",
    "VersionComparison",
    "VersionOutcome",
    "compare_versions",
]

DEFAULT_ALPHA = 0.01
"""Familywise false-alarm level of one comparison (all its tests together)."""
CONFIDENCE = 0.95
"""Level of every confidence interval shown."""
CORRECTION = "holm"
"""The multiple-testing correction: Holm's step-down over every test of the comparison."""
MIN_SIDE_COUNT = 100
"""Fewest requests (rates) or latency samples on each side for a test to be made."""
MIN_RATE_DIFFERENCE = 0.002
"""Smallest absolute rate difference (0.2 percentage points) that a significant rate test reports as a
regression."""
MIN_LATENCY_CHANGE = 0.05
"""Smallest relative change of the median or of p99 (5 %) that a significant latency test reports as a
regression."""
RATE_METRICS: tuple[str, ...] = ("error_rate", "timeout_rate", "rejected_share", "goodput_fraction")
"""Rates compared, over the outcome population (attempted less the requests the drain ended)."""
LATENCY_METRICS: tuple[str, ...] = ("ttft_s", "e2e_s")
"""Latencies compared, seconds."""
MISSING_TERMINAL_EVENTS = (
    "not measurable from request summaries: a summary is written when a request reaches its terminal state, "
    "so a request whose terminal event never came leaves no row, and the store cannot count it; compare the "
    "server's in-flight gauge or a client-side count of sent requests with the stored summaries instead"
)
"""Why the missing-terminal-event rate is reported as not measurable."""

_Z = float(stats.norm.ppf(0.5 + CONFIDENCE / 2))
_HIGHER_IS_WORSE: Mapping[str, bool] = {
    "error_rate": True, "timeout_rate": True, "rejected_share": True, "goodput_fraction": False,
    "ttft_s": True, "e2e_s": True,
}
_DEFINITIONS: Mapping[str, str] = {
    "window": "requests that arrived in [from, to] (Unix seconds, both ends included)",
    "baseline": "the same version's requests that arrived outside the window and outside every stored "
                "update's window (overlap window and update period)",
    "drain_ended": "finish_reason server_draining or reject_reason draining: counted in the process section, "
                   "left out of the outcome population",
    "outcome_population": "attempted less drain_ended: the denominator of every outcome rate",
    "error_rate": "finish_reason error / outcome_population",
    "timeout_rate": "finish_reason deadline / outcome_population",
    "rejected_share": "finish_reason rejected (any reason but draining) / outcome_population",
    "goodput_fraction": "good / outcome_population, good under the printed policy",
    "goodput_fraction_all": "good / attempted (definitions.md: drain-ended requests in the denominator)",
    "ttft_s": "server TTFT of the outcome population's requests that got a first token, seconds",
    "e2e_s": "e2e of the outcome population's requests that finished in the policy's success set, seconds",
    "quantiles": "exact, linear interpolation between order statistics (numpy's default)",
    "rate_test": "two-proportion z-test (pooled), Fisher's exact test when an expected count is below 5; "
                 "95 % Newcombe hybrid-score interval of the difference",
    "latency_test": "two-sided Mann-Whitney U; Cliff's delta; 95 % interval of the difference of the medians "
                    "from each median's distribution-free order-statistic interval",
    "correction": "Holm step-down over every test of the comparison (familywise error rate <= alpha)",
    "regression": "Holm-adjusted p <= alpha, in the bad direction, and an effect of at least the stated minimum",
}

Side = Literal["window", "baseline"]
ComparisonKind = Literal["version_vs_baseline", "between_versions"]
VerdictName = Literal["lossless", "regression", "insufficient_data"]


def _r(x: float | None, digits: int = 6) -> float | None:
    """``x`` rounded for output; ``None`` for a missing or non-finite value."""
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


@dataclass(frozen=True)
class CompareWindow:
    """The compared window (Unix seconds, both ends included) and the periods left out of every baseline."""

    from_unix_s: float
    to_unix_s: float
    update_id: str | None
    excluded_from_baseline: tuple[tuple[float, float], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "from_unix_s": self.from_unix_s, "to_unix_s": self.to_unix_s, "seconds": self.to_unix_s - self.from_unix_s,
            "update_id": self.update_id,
            "excluded_from_baseline": [{"from_unix_s": lo, "to_unix_s": hi} for lo, hi in self.excluded_from_baseline],
        }


@dataclass(frozen=True)
class LatencySummary:
    """Exact quantiles (seconds) of ``n`` samples; ``None`` without samples."""

    n: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None

    @classmethod
    def of(cls, values: npt.NDArray[np.float64]) -> LatencySummary:
        if values.size == 0:
            return cls(0, None, None, None)
        p50, p90, p99 = (float(v) for v in np.quantile(values, [0.5, 0.9, 0.99]))
        return cls(int(values.size), p50, p90, p99)

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "p50_s": _r(self.p50_s), "p90_s": _r(self.p90_s), "p99_s": _r(self.p99_s)}


@dataclass(frozen=True)
class VersionOutcome:
    """Outcome figures of one version on one side (the window or its baseline); rates over
    ``outcome_population`` (``None`` when it is 0)."""

    version: str
    side: Side
    attempted: int
    drain_ended: int
    outcome_population: int
    errors: int
    timeouts: int
    rejected: int
    good: int
    ttft: LatencySummary
    e2e: LatencySummary

    def rate(self, metric: str) -> float | None:
        """``error_rate``, ``timeout_rate``, ``rejected_share`` or ``goodput_fraction``."""
        count = {"error_rate": self.errors, "timeout_rate": self.timeouts, "rejected_share": self.rejected,
                 "goodput_fraction": self.good}[metric]
        return count / self.outcome_population if self.outcome_population else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": self.version, "side": self.side, "attempted": self.attempted,
            "drain_ended": self.drain_ended, "outcome_population": self.outcome_population,
            "errors": self.errors, "timeouts": self.timeouts, "rejected": self.rejected, "good": self.good,
        }
        out.update({m: _r(self.rate(m)) for m in RATE_METRICS})
        out["goodput_fraction_all"] = _r(self.good / self.attempted) if self.attempted else None
        out["missing_terminal_event_rate"] = None
        out["ttft_s"] = self.ttft.to_dict()
        out["e2e_s"] = self.e2e.to_dict()
        return out


@dataclass(frozen=True)
class TenantDifference:
    """One tenant class's share of a significant difference (its own test, Holm over the classes)."""

    tenant_class: str
    n_reference: int
    n_candidate: int
    reference: float | None
    candidate: float | None
    difference: float | None
    p_value: float | None
    p_adjusted: float | None
    concentrated: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "tenant_class": self.tenant_class, "n_reference": self.n_reference, "n_candidate": self.n_candidate,
            "reference": _r(self.reference), "candidate": _r(self.candidate), "difference": _r(self.difference),
            "p_value": _r(self.p_value, 9), "p_adjusted": _r(self.p_adjusted, 9), "concentrated": self.concentrated,
        }


@dataclass(frozen=True)
class MetricComparison:
    """One metric, candidate against reference: estimates (a rate, or a median in seconds), the difference
    candidate − reference with its 95 % interval, the test, the Holm-adjusted p and the effect sizes.

    ``version`` is the version this test blames when it finds a regression (``finding``); ``skipped`` says
    why no test was made (too few on a side).
    """

    kind: ComparisonKind
    metric: str
    version: str
    reference: str
    candidate: str
    n_reference: int
    n_candidate: int
    estimate_reference: float | None = None
    estimate_candidate: float | None = None
    difference: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    test: str | None = None
    statistic: float | None = None
    p_value: float | None = None
    p_adjusted: float | None = None
    effect: Mapping[str, float | None] = field(default_factory=dict)
    direction: Literal["worse", "better", "same"] | None = None
    finding: Regression | None = None
    judged: tuple[str, ...] = ()
    by_tenant: tuple[TenantDifference, ...] = ()
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "metric": self.metric, "version": self.version, "reference": self.reference,
            "candidate": self.candidate, "n_reference": self.n_reference, "n_candidate": self.n_candidate,
            "estimate_reference": _r(self.estimate_reference), "estimate_candidate": _r(self.estimate_candidate),
            "difference": _r(self.difference), "ci95": [_r(self.ci_low), _r(self.ci_high)],
            "test": self.test, "statistic": _r(self.statistic), "p_value": _r(self.p_value, 9),
            "p_adjusted": _r(self.p_adjusted, 9), "effect": {k: _r(v) for k, v in self.effect.items()},
            "direction": self.direction, "regression": self.finding is not None, "judged": list(self.judged),
            "by_tenant": [t.to_dict() for t in self.by_tenant], "skipped": self.skipped,
        }


@dataclass(frozen=True)
class Regression:
    """Where a regression is and how big: the version, the metric, the comparison that found it (against
    ``reference``), the difference (version − reference: a rate, or the median in seconds) with its 95 %
    interval and relative size, and per tenant class the same difference (``by_tenant``, read in the same
    direction); ``tenant_classes`` names the classes in which it is significant on its own (Holm over the
    classes, alpha): where it concentrates. Empty: no class alone carries it (too few requests per class,
    or spread thin)."""

    version: str
    metric: str
    kind: ComparisonKind
    reference: str
    difference: float
    ci_low: float | None
    ci_high: float | None
    relative_change: float | None
    p_adjusted: float
    by_tenant: tuple[TenantDifference, ...] = ()

    @property
    def tenant_classes(self) -> tuple[str, ...]:
        return tuple(d.tenant_class for d in self.by_tenant if d.concentrated)

    def text(self) -> str:
        """One line for a person."""
        unit = "s" if self.metric.endswith("_s") else ""
        what = "median " if unit else ""
        rel = f" ({self.relative_change * 100:+.1f} %)" if self.relative_change is not None else ""
        ci = (f", 95 % CI [{self.ci_low:+.4g}, {self.ci_high:+.4g}]{unit}"
              if self.ci_low is not None and self.ci_high is not None else "")
        classes = [f"{d.tenant_class} {d.difference:+.4g}{unit} (Holm p {d.p_adjusted:.2g}"
                   f"{', significant' if d.concentrated else ''})"
                   for d in self.by_tenant if d.difference is not None and d.p_adjusted is not None]
        where = f"; by tenant class: {', '.join(classes)}" if classes else ""
        return (f"{self.version}: {self.metric} {what}{self.difference:+.4g}{unit}{rel} against {self.reference}"
                f"{ci}, Holm p = {self.p_adjusted:.2g}{where}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version, "metric": self.metric, "kind": self.kind, "reference": self.reference,
            "tenant_classes": list(self.tenant_classes), "difference": _r(self.difference),
            "ci95": [_r(self.ci_low), _r(self.ci_high)], "relative_change": _r(self.relative_change),
            "p_adjusted": _r(self.p_adjusted, 9), "by_tenant": [d.to_dict() for d in self.by_tenant],
            "text": self.text(),
        }


@dataclass(frozen=True)
class ProcessFigures:
    """What the update procedure did, apart from the outcome figures: the update record's drain and impact
    figures (seconds and counts, ``None`` without a record) and, from the summaries in the window, the
    requests the drain ended by version."""

    update: Mapping[str, Any] | None
    terminated_by_version: Mapping[str, int]
    drain_rejected_by_version: Mapping[str, int]
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "update": None if self.update is None else dict(self.update),
            "terminated_by_version": dict(self.terminated_by_version),
            "drain_rejected_by_version": dict(self.drain_rejected_by_version),
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class VersionComparison:
    """The whole comparison: window, policy, outcomes per version and side, tests, process figures, verdict."""

    window: CompareWindow
    policy: GoodputPolicy
    alpha: float
    min_side_count: int
    min_rate_difference: float
    min_latency_change: float
    outcomes: tuple[VersionOutcome, ...]
    comparisons: tuple[MetricComparison, ...]
    process: ProcessFigures
    verdict: VerdictName
    regressions: tuple[Regression, ...]
    reasons: tuple[str, ...]
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window.to_dict(),
            "policy": self.policy.to_dict(),
            "alpha": self.alpha,
            "confidence": CONFIDENCE,
            "correction": CORRECTION,
            "tests_in_family": sum(1 for c in self.comparisons if c.p_value is not None),
            "min_side_count": self.min_side_count,
            "min_rate_difference": self.min_rate_difference,
            "min_latency_change": self.min_latency_change,
            "definitions": dict(_DEFINITIONS),
            "missing_terminal_events": {"measurable": False, "reason": MISSING_TERMINAL_EVENTS},
            "outcomes": [o.to_dict() for o in self.outcomes],
            "comparisons": [c.to_dict() for c in self.comparisons],
            "process": self.process.to_dict(),
            "verdict": self.verdict,
            "regressions": [r.to_dict() for r in self.regressions],
            "reasons": list(self.reasons),
            "notes": list(self.notes),
        }


# ---- statistics ------------------------------------------------------------------------------------------


def _wilson(k: int, n: int) -> tuple[float, float]:
    """95 % Wilson score interval of the proportion k / n."""
    p = k / n
    denom = 1 + _Z**2 / n
    centre = (p + _Z**2 / (2 * n)) / denom
    half = _Z * math.sqrt(p * (1 - p) / n + _Z**2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _newcombe(k_ref: int, n_ref: int, k_can: int, n_can: int) -> tuple[float, float]:
    """95 % Newcombe hybrid score interval of p_candidate − p_reference (Newcombe 1998, method 10)."""
    p1, p2 = k_can / n_can, k_ref / n_ref
    l1, u1 = _wilson(k_can, n_can)
    l2, u2 = _wilson(k_ref, n_ref)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def _rate_test(k_ref: int, n_ref: int, k_can: int, n_can: int) -> tuple[str, float | None, float]:
    """(test name, statistic, two-sided p) for two proportions."""
    pooled = (k_ref + k_can) / (n_ref + n_can)
    if pooled in (0.0, 1.0):
        return "none (identical: no events on either side, or all)", None, 1.0
    expected = min(n * q for n in (n_ref, n_can) for q in (pooled, 1 - pooled))
    if expected < 5:
        res = stats.fisher_exact([[k_can, n_can - k_can], [k_ref, n_ref - k_ref]])
        return "Fisher exact", None, float(res.pvalue)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_ref + 1 / n_can))
    z = (k_can / n_can - k_ref / n_ref) / se
    return "two-proportion z", z, float(2 * stats.norm.sf(abs(z)))


def _median_se(sorted_x: npt.NDArray[np.float64]) -> float:
    """Standard error of the median from its distribution-free 95 % order-statistic interval."""
    n = sorted_x.size
    half = _Z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half))
    return float(sorted_x[hi] - sorted_x[lo]) / (2 * _Z)


def _holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the input order."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


# ---- the rows --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rows:
    """One (version, side)'s rows as arrays, outcome-population flags included."""

    tenant: npt.NDArray[np.object_]
    finish: npt.NDArray[np.object_]
    drain: npt.NDArray[np.bool_]
    good: npt.NDArray[np.bool_]
    rejected: npt.NDArray[np.bool_]
    ttft: npt.NDArray[np.float64]
    e2e: npt.NDArray[np.float64]
    success: npt.NDArray[np.bool_]

    def subset(self, mask: npt.NDArray[np.bool_]) -> _Rows:
        return _Rows(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))

    @property
    def outcome(self) -> _Rows:
        return self.subset(~self.drain)

    def count(self, metric: str) -> int:
        """Events of a rate metric among these rows (call on the outcome population)."""
        if metric == "error_rate":
            return int(np.count_nonzero(self.finish == "error"))
        if metric == "timeout_rate":
            return int(np.count_nonzero(self.finish == "deadline"))
        if metric == "rejected_share":
            return int(np.count_nonzero(self.rejected))
        return int(np.count_nonzero(self.good))

    def latency(self, metric: str) -> npt.NDArray[np.float64]:
        """Samples of a latency metric among these rows (call on the outcome population), seconds."""
        if metric == "ttft_s":
            return self.ttft[~np.isnan(self.ttft)]
        return self.e2e[self.success & ~np.isnan(self.e2e)]


def _span_sql(spans: Sequence[tuple[float, float]]) -> str:
    if not spans:
        return "FALSE"
    return "(" + " OR ".join(f"arrival_unix_s BETWEEN {lo!r} AND {hi!r}" for lo, hi in spans) + ")"


def _placeable(con: duckdb.DuckDBPyConnection) -> tuple[str, list[str]]:
    """SQL keeping rows with real arrival times, and a note on the rows of arrival-less imports left out."""
    rows = placeable_rows(con)
    notes = [f"{rows.left_out:,} row(s) from imports without arrival times are left out: they cannot be "
             "placed inside or outside a window"] if rows.left_out else []
    return rows.condition, notes


def _load(con: duckdb.DuckDBPyConnection, window: CompareWindow, policy: GoodputPolicy
          ) -> tuple[dict[tuple[str, Side], _Rows], list[str]]:
    """Every row of the versions seen in the window, by (version, side)."""
    keep, notes = _placeable(con)
    inside = _span_sql([(window.from_unix_s, window.to_unix_s)])
    outside = f"NOT {inside} AND NOT {_span_sql(window.excluded_from_baseline)}"
    success = ", ".join("'" + s + "'" for s in sorted(policy.success))
    sql = f"""
        WITH placed AS (SELECT *, CASE WHEN {inside} THEN 'window' WHEN {outside} THEN 'baseline' END AS side
                        FROM {SUMMARY_TABLE} WHERE {keep})
        SELECT version, side, tenant_class, finish_reason,
               finish_reason = 'server_draining' OR coalesce(reject_reason = 'draining', FALSE) AS drain,
               coalesce({policy.good_sql()}, FALSE) AS good,
               finish_reason = 'rejected' AS rejected,
               coalesce(ttft_s, 'NaN'::DOUBLE) AS ttft, coalesce(e2e_s, 'NaN'::DOUBLE) AS e2e,
               finish_reason IN ({success}) AS success
        FROM placed
        WHERE side IS NOT NULL AND version IN (SELECT DISTINCT version FROM placed WHERE side = 'window')
        ORDER BY version, side, arrival_unix_s, request_id
    """
    data = con.sql(sql).fetchnumpy()
    versions = np.asarray(data["version"], dtype=object)
    sides = np.asarray(data["side"], dtype=object)
    out: dict[tuple[str, Side], _Rows] = {}
    for key in sorted({(str(v), str(s)) for v, s in zip(versions, sides, strict=True)}):
        mask = (versions == key[0]) & (sides == key[1])
        out[(key[0], "window" if key[1] == "window" else "baseline")] = _Rows(
            np.asarray(data["tenant_class"], dtype=object)[mask], np.asarray(data["finish_reason"], dtype=object)[mask],
            np.asarray(data["drain"], dtype=bool)[mask], np.asarray(data["good"], dtype=bool)[mask],
            np.asarray(data["rejected"], dtype=bool)[mask] & ~np.asarray(data["drain"], dtype=bool)[mask],
            np.asarray(data["ttft"], dtype=np.float64)[mask], np.asarray(data["e2e"], dtype=np.float64)[mask],
            np.asarray(data["success"], dtype=bool)[mask],
        )
    return out, notes


def _outcome(version: str, side: Side, rows: _Rows) -> VersionOutcome:
    pop = rows.outcome
    return VersionOutcome(
        version, side, attempted=int(rows.finish.size), drain_ended=int(np.count_nonzero(rows.drain)),
        outcome_population=int(pop.finish.size), errors=pop.count("error_rate"), timeouts=pop.count("timeout_rate"),
        rejected=pop.count("rejected_share"), good=pop.count("goodput_fraction"),
        ttft=LatencySummary.of(pop.latency("ttft_s")), e2e=LatencySummary.of(pop.latency("e2e_s")),
    )


# ---- one metric, two sides -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Test:
    """A test's figures before the family's adjustment."""

    estimate_reference: float
    estimate_candidate: float
    difference: float
    ci_low: float | None
    ci_high: float | None
    test: str
    statistic: float | None
    p_value: float
    effect: dict[str, float | None]


def _test_rate(metric: str, ref: _Rows, can: _Rows) -> _Test:
    n_r, n_c = ref.finish.size, can.finish.size
    k_r, k_c = ref.count(metric), can.count(metric)
    name, stat, p = _rate_test(k_r, n_r, k_c, n_c)
    lo, hi = _newcombe(k_r, n_r, k_c, n_c)
    p_r, p_c = k_r / n_r, k_c / n_c
    ratio = p_c / p_r if p_r > 0 else None
    return _Test(p_r, p_c, p_c - p_r, lo, hi, name, stat, p, {"risk_difference": p_c - p_r, "risk_ratio": ratio})


def _test_latency(ref: npt.NDArray[np.float64], can: npt.NDArray[np.float64]) -> _Test:
    a, b = np.sort(ref), np.sort(can)
    res = stats.mannwhitneyu(b, a, alternative="two-sided")
    u = float(res.statistic)
    delta = 2 * u / (a.size * b.size) - 1
    m_a, m_b = float(np.quantile(a, 0.5)), float(np.quantile(b, 0.5))
    q_a, q_b = float(np.quantile(a, 0.99)), float(np.quantile(b, 0.99))
    se = math.hypot(_median_se(a), _median_se(b))
    diff = m_b - m_a
    return _Test(m_a, m_b, diff, diff - _Z * se, diff + _Z * se, "Mann-Whitney U", u, float(res.pvalue), {
        "cliffs_delta": delta,
        "median_change": diff / m_a if m_a > 0 else None,
        "p99_change": (q_b - q_a) / q_a if q_a > 0 else None,
    })


def _direction(metric: str, difference: float) -> Literal["worse", "better", "same"]:
    if difference == 0:
        return "same"
    return "worse" if (difference > 0) == _HIGHER_IS_WORSE[metric] else "better"


def _big_enough(metric: str, t: _Test, min_rate: float, min_latency: float) -> bool:
    """Whether the effect reaches the minimum that a regression needs (in the bad direction)."""
    if metric in RATE_METRICS:
        return abs(t.difference) >= min_rate
    changes = [t.effect.get("median_change"), t.effect.get("p99_change")]
    return any(c is not None and c >= min_latency for c in changes)


def _sample(metric: str, rows: _Rows) -> int:
    return int(rows.finish.size) if metric in RATE_METRICS else int(rows.latency(metric).size)


def _run_test(metric: str, ref: _Rows, can: _Rows) -> _Test:
    if metric in RATE_METRICS:
        return _test_rate(metric, ref, can)
    return _test_latency(ref.latency(metric), can.latency(metric))


@dataclass(frozen=True)
class _Pair:
    """A planned comparison: reference and candidate rows (outcome populations), and which side's worsening
    is a regression (``judged``: the version(s) blamed, candidate first)."""

    kind: ComparisonKind
    reference: str
    candidate: str
    ref_version: str
    can_version: str
    ref_rows: _Rows
    can_rows: _Rows
    judge_both: bool


def _tenant_breakdown(metric: str, pair: _Pair, alpha: float, worse_is: str) -> tuple[TenantDifference, ...]:
    """Per tenant class, the same test (Holm over the classes); ``concentrated``: significantly worse for
    ``worse_is`` (the candidate or the reference)."""
    classes = sorted(set(pair.ref_rows.tenant.tolist()) & set(pair.can_rows.tenant.tolist()))
    found: list[tuple[str, int, int, _Test | None]] = []
    for cls in classes:
        ref = pair.ref_rows.subset(pair.ref_rows.tenant == cls)
        can = pair.can_rows.subset(pair.can_rows.tenant == cls)
        n_r, n_c = _sample(metric, ref), _sample(metric, can)
        found.append((str(cls), n_r, n_c, _run_test(metric, ref, can) if min(n_r, n_c) >= 2 else None))
    tested = [t.p_value for _, _, _, t in found if t is not None]
    adjusted = iter(_holm(tested))
    out = []
    for cls, n_r, n_c, t in found:
        if t is None:
            out.append(TenantDifference(cls, n_r, n_c, None, None, None, None, None, False))
            continue
        p_adj = next(adjusted)
        direction = _direction(metric, t.difference)
        bad = direction == "worse" if worse_is == "candidate" else direction == "better"
        out.append(TenantDifference(cls, n_r, n_c, t.estimate_reference, t.estimate_candidate, t.difference,
                                    t.p_value, p_adj, bad and p_adj <= alpha))
    return tuple(out)


# ---- the comparison --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Settings:
    alpha: float
    min_side_count: int
    min_rate_difference: float
    min_latency_change: float


def _pairs(rows: Mapping[tuple[str, Side], _Rows], from_version: str | None, to_version: str | None) -> list[_Pair]:
    """Each version in the window against its baseline, then every pair of versions in the window (an
    update's from → to pair oriented so, and judged in that direction only)."""
    versions = sorted({v for v, s in rows if s == "window"})
    out = [_Pair("version_vs_baseline", f"{v} baseline", f"{v} window", v, v,
                 rows[(v, "baseline")].outcome if (v, "baseline") in rows else _empty(), rows[(v, "window")].outcome,
                 judge_both=False) for v in versions]
    for a, b in combinations(versions, 2):
        update = {a, b} == {from_version, to_version}
        ref, can = (from_version, to_version) if update and from_version is not None and to_version is not None \
            else (a, b)
        out.append(_Pair("between_versions", f"{ref} window", f"{can} window", ref, can,
                         rows[(ref, "window")].outcome, rows[(can, "window")].outcome, judge_both=not update))
    return out


def _empty() -> _Rows:
    o, b, f = np.array([], dtype=object), np.array([], dtype=bool), np.array([], dtype=np.float64)
    return _Rows(o, o, b, b, b, f, f, b)


def _compare_all(pairs: Sequence[_Pair], settings: _Settings) -> list[MetricComparison]:
    """Every metric of every pair: the tests, Holm over the whole family, the regressions."""
    planned: list[tuple[_Pair, str, int, int, _Test | None]] = []
    for pair in pairs:
        for metric in (*RATE_METRICS, *LATENCY_METRICS):
            n_r, n_c = _sample(metric, pair.ref_rows), _sample(metric, pair.can_rows)
            ok = min(n_r, n_c) >= settings.min_side_count
            planned.append((pair, metric, n_r, n_c, _run_test(metric, pair.ref_rows, pair.can_rows) if ok else None))
    adjusted = iter(_holm([t.p_value for *_, t in planned if t is not None]))
    return [_finish(pair, metric, n_r, n_c, t, None if t is None else next(adjusted), settings)
            for pair, metric, n_r, n_c, t in planned]


def _finish(pair: _Pair, metric: str, n_r: int, n_c: int, t: _Test | None, p_adj: float | None,
            settings: _Settings) -> MetricComparison:
    """The comparison of one metric: skipped (too few), or tested with its Holm-adjusted p and any finding."""
    base = MetricComparison(kind=pair.kind, metric=metric, version=pair.can_version, reference=pair.reference,
                            candidate=pair.candidate, n_reference=n_r, n_candidate=n_c)
    if t is None or p_adj is None:
        return dataclasses.replace(base, skipped=(
            f"too few {'requests' if metric in RATE_METRICS else 'samples'}: {n_r:,} ({pair.reference}) and {n_c:,} "
            f"({pair.candidate}); a test needs at least {settings.min_side_count:,} on each side"))
    direction = _direction(metric, t.difference)
    significant = p_adj <= settings.alpha
    flipped = direction == "better" and pair.judge_both  # the reference is the worse one
    by_tenant = _tenant_breakdown(metric, pair, settings.alpha, "reference" if flipped else "candidate") \
        if significant else ()
    finding = None
    if significant and (direction == "worse" or flipped):
        finding = _finding(pair, metric, _flip(t) if flipped else t, p_adj, by_tenant, flipped, settings)
    return dataclasses.replace(
        base, version=pair.ref_version if flipped else pair.can_version, estimate_reference=t.estimate_reference,
        estimate_candidate=t.estimate_candidate, difference=t.difference, ci_low=t.ci_low, ci_high=t.ci_high,
        test=t.test, statistic=t.statistic, p_value=t.p_value, p_adjusted=p_adj, effect=t.effect,
        direction=direction, finding=finding, by_tenant=by_tenant,
        judged=(pair.can_version, pair.ref_version) if pair.judge_both else (pair.can_version,))


def _finding(pair: _Pair, metric: str, seen: _Test, p_adj: float, by_tenant: tuple[TenantDifference, ...],
             flipped: bool, settings: _Settings) -> Regression | None:
    """The regression of a significant worsening (``seen`` read from the worse side), ``None`` when its
    effect is below the minimum."""
    if not _big_enough(metric, seen, settings.min_rate_difference, settings.min_latency_change):
        return None
    relative = seen.difference / seen.estimate_reference if seen.estimate_reference else None
    blamed, against = (pair.ref_version, pair.candidate) if flipped else (pair.can_version, pair.reference)
    classes = tuple(_flip_tenant(d) for d in by_tenant) if flipped else by_tenant
    return Regression(blamed, metric, pair.kind, against, seen.difference, seen.ci_low, seen.ci_high, relative,
                      p_adj, classes)


def _flip_tenant(d: TenantDifference) -> TenantDifference:
    """A tenant class's difference read from the other side (the reference as the candidate)."""
    return dataclasses.replace(d, n_reference=d.n_candidate, n_candidate=d.n_reference, reference=d.candidate,
                               candidate=d.reference, difference=None if d.difference is None else -d.difference)


def _flip(t: _Test) -> _Test:
    """The same test read from the other side (the reference as the candidate)."""
    m_r, m_c = t.estimate_reference, t.estimate_candidate
    eff: dict[str, float | None] = {"risk_difference": -t.difference,
                                    "risk_ratio": m_r / m_c if m_c > 0 else None}
    if "cliffs_delta" in t.effect:
        p99 = t.effect.get("p99_change")
        eff = {"cliffs_delta": -(t.effect.get("cliffs_delta") or 0.0),
               "median_change": (m_r - m_c) / m_c if m_c > 0 else None,
               "p99_change": 1 / (1 + p99) - 1 if p99 is not None and p99 > -1 else None}
    return _Test(m_c, m_r, -t.difference, None if t.ci_high is None else -t.ci_high,
                 None if t.ci_low is None else -t.ci_low, t.test, t.statistic, t.p_value, eff)


def _verdict(rows: Mapping[tuple[str, Side], _Rows], comparisons: Sequence[MetricComparison],
             settings: _Settings) -> tuple[VerdictName, tuple[Regression, ...], tuple[str, ...]]:
    regressions = tuple(c.finding for c in comparisons if c.finding is not None)
    reasons: list[str] = [r.text() for r in regressions]
    versions = sorted({v for v, s in rows if s == "window"})
    between = [c for c in comparisons if c.kind == "between_versions"]
    if len(versions) < 2:
        reasons.append(f"{len(versions)} version(s) served requests in the window ({', '.join(versions) or 'none'}): "
                       "the versions cannot be compared with each other")
    for c in comparisons:
        if c.skipped:
            reasons.append(f"{c.metric}, {c.reference} vs {c.candidate}: {c.skipped}")
    if regressions:
        return "regression", regressions, tuple(reasons)
    if not between or any(c.skipped for c in between):
        reasons.insert(0, f"not enough data to judge the versions against each other (at least "
                          f"{settings.min_side_count:,} requests and latency samples per version and side)")
        return "insufficient_data", (), tuple(reasons)
    reasons.insert(0, f"no metric differs significantly in the bad direction (Holm over "
                      f"{sum(1 for c in comparisons if c.p_value is not None)} tests, alpha {settings.alpha:g})")
    return "lossless", (), tuple(reasons)


# ---- windows and update records --------------------------------------------------------------------------


def _process_of(update: UpdateRecord) -> dict[str, Any]:
    """The update record's process figures: versions, batch, drain seconds, impact counts (from ``impact``,
    else from the drain section) and shares."""
    drain = update.record.get("drain") or {}
    return {
        "update_id": update.update_id, "from_version": update.from_version, "to_version": update.to_version,
        "batch_index": update.batch_index, "batches": update.batches,
        "started_unix_s": update.started_unix_s, "ended_unix_s": update.ended_unix_s,
        "wait_budget_s": update.wait_budget_s, "actual_drain_s": update.actual_drain_s,
        "unregister_settle_s": update.unregister_settle_s, "in_flight_at_start": update.in_flight_at_start,
        **{k: getattr(update, k) if getattr(update, k) is not None else drain.get(k)
           for k in ("terminated", "timed_out", "requeued")},
        "closed_by_reason": drain.get("closed_by_reason"), "decision": drain.get("decision"),
        "rollback_triggered": update.rollback_triggered, **update.derived(),
    }


def _resolve_window(con: duckdb.DuckDBPyConnection, update_id: str | None, from_unix_s: float | None,
                    to_unix_s: float | None) -> tuple[CompareWindow, UpdateRecord | None, list[str]]:
    """The window, the update record (``None`` for an explicit window) and notes."""
    updates = list_updates(con)
    update: UpdateRecord | None = None
    notes: list[str] = []
    if update_id is not None:
        if from_unix_s is not None or to_unix_s is not None:
            raise ConfigurationError("compare_versions: give update_id or from_unix_s and to_unix_s, not both")
        update = get_update(con, update_id)
        if update is None:
            known = ", ".join(repr(u.update_id) for u in updates[-5:]) or "none is stored"
            raise RolloutInputError(f"update_id: no update {update_id!r} in the store (latest: {known}); "
                                    "see `llmslo rollout list`")
        window = update.window()
        if window is None:
            window, said = _overlap_in_rows(con, update)
            if window is None:
                raise RolloutInputError(f"update_id {update_id!r}: {_no_window(update)}{said}")
            notes.append(f"update {update_id!r} records no times: {said}")
        elif update.overlap_from_unix_s is None or update.overlap_to_unix_s is None:
            notes.append(f"update {update_id!r} records no overlap window: its start and end are compared instead")
        from_unix_s, to_unix_s = window
    elif from_unix_s is None or to_unix_s is None:
        raise ConfigurationError("compare_versions: give update_id, or both from_unix_s and to_unix_s")
    for name, value in (("from_unix_s", from_unix_s), ("to_unix_s", to_unix_s)):
        if not math.isfinite(value):
            raise ConfigurationError(f"compare_versions.{name}: must be a finite Unix time in seconds, got {value!r}")
    if to_unix_s <= from_unix_s:
        raise ConfigurationError(f"compare_versions: the window ends ({to_unix_s!r}) at or before it starts "
                                 f"({from_unix_s!r}); give an end after the start (Unix seconds)")
    spans = sorted({s for u in updates for s in _spans(u)})
    timeless = [u.update_id for u in updates if u.window() is None]
    if timeless:
        notes.append(f"{len(timeless)} stored update(s) record no times ({', '.join(map(repr, timeless[:5]))}"
                     f"{', ...' if len(timeless) > 5 else ''}): their periods cannot be left out of the baselines")
    return CompareWindow(from_unix_s, to_unix_s, update_id, tuple(spans)), update, notes


def _overlap_in_rows(con: duckdb.DuckDBPyConnection,
                     update: UpdateRecord) -> tuple[tuple[float, float] | None, str]:
    """Where a record without times overlapped, read from the stored summaries: from the first arrival of the
    new version to the last arrival of the old one (Unix seconds), when both versions have rows there and the
    two spans meet; else None. The text says what was found (for a note, or for the refusal's end)."""
    versions = (update.from_version, update.to_version)
    found = {v: (lo, hi, n) for v, lo, hi, n in con.sql(
        f"SELECT version, min(arrival_unix_s), max(arrival_unix_s), count(*) FROM {SUMMARY_TABLE} "
        f"WHERE version IN (?, ?) AND arrival_unix_s > 0 GROUP BY version", params=list(versions)).fetchall()}
    missing = [v for v in versions if v not in found]
    if missing:
        return None, (f". The store holds no summary of version {' or '.join(map(repr, missing))} to place it by "
                      "(the versions as recorded must be the summaries' version)")
    start, end = found[update.to_version][0], found[update.from_version][1]
    if end <= start:
        return None, (f". In the store, version {update.from_version!r} ends ({end:.3f}) before "
                      f"{update.to_version!r} starts ({start:.3f}): no overlap to compare")
    length = _overlap_length(update)
    given = "" if length is None else f"; the record gives its length as {length:g} s"
    return (start, end), (f"its overlap is taken from the stored summaries, from the first arrival of "
                          f"{update.to_version!r} to the last of {update.from_version!r}: {end - start:.1f} s "
                          f"({start:.3f} to {end:.3f}){given}")


def _spans(update: UpdateRecord) -> list[tuple[float, float]]:
    """The periods of an update left out of every baseline: its overlap window and its start to end."""
    out = [] if (window := update.window()) is None else [window]
    if update.started_unix_s is not None and update.ended_unix_s is not None:
        out.append((update.started_unix_s, update.ended_unix_s))
    return out


def _overlap_length(update: UpdateRecord) -> float | None:
    """The overlap's length the record gives (``overlap.duration_s``, seconds), None when it gives none."""
    overlap = update.record.get("overlap")
    length = overlap.get("duration_s") if isinstance(overlap, Mapping) else None
    return None if length is None else float(length)


def _no_window(update: UpdateRecord) -> str:
    """Why ``update`` cannot be compared by its record, and the ways out."""
    length = _overlap_length(update)
    said = "" if length is None else (
        f"; {'overlap_window_s' if update.shape == 'runbook' else 'overlap.duration_s'} gives the overlap's "
        f"length, {length:g} s, not when it was")
    return (f"the record says neither when the versions overlapped nor when the update started and ended{said}. "
            "Record it again under a new update_id with overlap.from_unix_s (or both overlap ends), or "
            "started_unix_s and ended_unix_s; or compare an explicit window: llmslo rollout compare --from T --to T")


def _process(update: UpdateRecord | None, rows: Mapping[tuple[str, Side], _Rows]) -> ProcessFigures:
    window = {v: r for (v, s), r in rows.items() if s == "window"}
    terminated = {v: int(np.count_nonzero(r.finish == "server_draining")) for v, r in window.items()}
    rejected = {v: int(np.count_nonzero(r.drain & (r.finish == "rejected"))) for v, r in window.items()}
    notes = () if update is not None else (
        "no update record (explicit window): drain time, settle delay and the drain's own counts are unknown",)
    return ProcessFigures(None if update is None else _process_of(update), terminated, rejected, notes)


def _check_settings(policy: GoodputPolicy, settings: _Settings) -> None:
    if not isinstance(policy, GoodputPolicy):
        raise ConfigurationError(f"compare_versions.policy: must be a GoodputPolicy, got {type(policy).__name__}")
    if not 0 < settings.alpha < 1:
        raise ConfigurationError(f"compare_versions.alpha: must be between 0 and 1 (exclusive), got {settings.alpha!r}")
    if settings.min_side_count < 2:
        raise ConfigurationError(
            f"compare_versions.min_side_count: must be at least 2, got {settings.min_side_count!r}")
    for name in ("min_rate_difference", "min_latency_change"):
        value = getattr(settings, name)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigurationError(f"compare_versions.{name}: must be a number >= 0, got {value!r}")


def compare_versions(
    con: duckdb.DuckDBPyConnection,
    *,
    update_id: str | None = None,
    from_unix_s: float | None = None,
    to_unix_s: float | None = None,
    policy: GoodputPolicy | None = None,
    alpha: float = DEFAULT_ALPHA,
    min_side_count: int = MIN_SIDE_COUNT,
    min_rate_difference: float = MIN_RATE_DIFFERENCE,
    min_latency_change: float = MIN_LATENCY_CHANGE,
) -> VersionComparison:
    """Compare the versions serving requests in a window (see the module docstring).

    The window is the stored update ``update_id``'s overlap window, or ``[from_unix_s, to_unix_s]`` (Unix
    seconds, both ends included). ``policy`` decides which requests are good (default
    :class:`~llmslo.analysis.report.GoodputPolicy`); ``alpha`` is the familywise false-alarm level of all
    the tests together; ``min_side_count`` the fewest requests or latency samples per side for a test;
    ``min_rate_difference`` (absolute) and ``min_latency_change`` (relative) the smallest effects that a
    significant test reports as a regression.

    Raises :class:`~llmslo.telemetry.ConfigurationError` for a bad argument and :class:`RolloutInputError`
    for an unknown ``update_id``. An update that records no overlap window is compared over its start and
    end (:meth:`UpdateRecord.window`; a note says so).
    """
    policy = GoodputPolicy() if policy is None else policy
    settings = _Settings(alpha, min_side_count, min_rate_difference, min_latency_change)
    _check_settings(policy, settings)
    window, update, notes = _resolve_window(con, update_id, from_unix_s, to_unix_s)
    rows, placed_notes = _load(con, window, policy)
    pairs = _pairs(rows, *((update.from_version, update.to_version) if update is not None else (None, None)))
    comparisons = _compare_all(pairs, settings)
    verdict, regressions, reasons = _verdict(rows, comparisons, settings)
    order = sorted(rows, key=lambda key: (key[0], key[1] != "window"))
    outcomes = tuple(_outcome(v, s, rows[(v, s)]) for v, s in order)
    return VersionComparison(window, policy, alpha, min_side_count, min_rate_difference, min_latency_change,
                             outcomes, tuple(comparisons), _process(update, rows), verdict, regressions, reasons,
                             tuple(notes + placed_notes))
