"""Latency anomalies: distribution change against a baseline, rolling z-scores, failure slope, outcome mix.

Distribution change (:func:`scan_series`, :func:`detect_anomalies`): the latencies of requests that
arrived in a sliding window (default 300 s, step = window) are compared with a baseline sample by a
two-sample test (Kolmogorov–Smirnov by default; Anderson–Darling or Mann–Whitney on request). Latency
samples are autocorrelated and large windows make tiny shifts "significant", so a window is *flagged* only
when every gate holds:

1. both samples hold at least ``min_samples`` values;
2. the test rejects at ``alpha`` after Benjamini–Hochberg adjustment across the series scanned together
   (per window start);
3. the effect is large: the p50 or the p99 moved by at least the relative threshold **and** by at least
   ``min_abs_change_s`` seconds;

and a :class:`Finding` is reported once ``consecutive`` windows in a row are flagged (one finding per run).
Every threshold lives in :class:`AnomalyConfig`; docs/anomalies.md gives the defaults and their reasons.

Other signals: :func:`rolling_zscore` (trailing window ≥ 60 s), :func:`failure_rate_slope` (least squares
over the points inside its window, failures/s per s), :func:`outcome_entropy` (normalised Shannon entropy
of finish reasons) and the composite tightening rule :func:`tightening_signals`, which fires only when the
p99 rise, the failure slope and the entropy agree.

Times are Unix seconds (``arrival_unix_s``); latencies are seconds.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import duckdb
import numpy as np
import numpy.typing as npt
import polars as pl
from scipy import stats

from llmslo.analysis.anomaly._ks import ks_pvalue, ks_statistic_and_positions, ks_statistic_sorted
from llmslo.analysis.store import SUMMARY_TABLE
from llmslo.telemetry import FINISH_REASONS, TPOT_SQL, ConfigurationError

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "ANOMALY_METRICS",
    "AnomalyConfig",
    "AnomalyReport",
    "Finding",
    "TighteningConfig",
    "TighteningSignal",
    "WindowTest",
    "benjamini_hochberg",
    "detect_anomalies",
    "detect_in_arrays",
    "detect_tightening",
    "failure_rate_slope",
    "findings_of",
    "outcome_entropy",
    "rolling_zscore",
    "scan_series",
    "tightening_signals",
]

ANOMALY_METRICS: dict[str, str] = {
    "ttft": "ttft_s",
    "tpot": TPOT_SQL,
    "e2e": "e2e_s",
    "queue": "queue_s",
}
"""Latency series a scan can read from the store, by key, with the SQL expression of each (seconds)."""

WEEK_S = 7 * 86_400.0
BaselineKind = Literal["preceding", "reference", "week"]
TestKind = Literal["ks", "anderson", "mannwhitney"]
_TESTS: tuple[str, ...] = ("ks", "anderson", "mannwhitney")
_BASELINES: tuple[str, ...] = ("preceding", "reference", "week")
_SERIES_GROUPS: tuple[str, ...] = ("model", "version", "tenant_class")


def _cfg(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigurationError(message)


@dataclass(frozen=True)
class AnomalyConfig:
    """Windows, baseline, test and gates of a distribution-change scan (seconds unless stated).

    ``baseline``: ``preceding`` (the ``baseline_windows`` × ``window_s`` seconds before each window),
    ``reference`` (the fixed period ``[reference_start_unix_s, reference_end_unix_s)``) or ``week`` (the
    same window one week earlier). ``test``: ``ks``, ``anderson`` or ``mannwhitney``. ``alpha``: level of
    the test after Benjamini–Hochberg across series (``fdr=False`` uses raw p-values). ``min_p50_change``
    and ``min_p99_change`` are relative (0.1 = 10%); ``min_abs_change_s`` is in seconds and applies to both.
    ``consecutive``: flagged windows in a row before a finding. Raises :class:`ConfigurationError`.
    """

    window_s: float = 300.0
    step_s: float | None = None
    baseline: BaselineKind = "preceding"
    baseline_windows: int = 12
    reference_start_unix_s: float | None = None
    reference_end_unix_s: float | None = None
    test: TestKind = "ks"
    alpha: float = 0.01
    fdr: bool = True
    min_samples: int = 100
    min_p50_change: float = 0.10
    min_p99_change: float = 0.20
    min_abs_change_s: float = 0.005
    consecutive: int = 2

    def __post_init__(self) -> None:
        _cfg(self.window_s > 0 and math.isfinite(self.window_s), f"window_s must be > 0 s, got {self.window_s}")
        _cfg(self.step_s is None or (0 < self.step_s <= self.window_s),
             f"step_s must be in (0, window_s={self.window_s}], got {self.step_s}")
        _cfg(self.baseline in _BASELINES, f"baseline must be one of {', '.join(_BASELINES)}, got {self.baseline!r}")
        _cfg(self.test in _TESTS, f"test must be one of {', '.join(_TESTS)}, got {self.test!r}")
        _cfg(0 < self.alpha < 1, f"alpha must be in (0, 1), got {self.alpha}")
        _cfg(self.baseline_windows >= 1, f"baseline_windows must be >= 1, got {self.baseline_windows}")
        _cfg(self.min_samples >= 2, f"min_samples must be >= 2, got {self.min_samples}")
        _cfg(self.consecutive >= 1, f"consecutive must be >= 1, got {self.consecutive}")
        for name in ("min_p50_change", "min_p99_change", "min_abs_change_s"):
            _cfg(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        if self.baseline == "reference":
            lo, hi = self.reference_start_unix_s, self.reference_end_unix_s
            _cfg(lo is not None and hi is not None and lo < hi,
                 "baseline 'reference' needs reference_start_unix_s < reference_end_unix_s")

    @property
    def step(self) -> float:
        """Seconds between consecutive window starts."""
        return self.window_s if self.step_s is None else self.step_s


@dataclass(frozen=True)
class WindowTest:
    """One window of one series against its baseline: the test and the gates (times Unix s, values s)."""

    series: str
    start_unix_s: float
    end_unix_s: float
    n: int
    n_baseline: int
    statistic: float | None
    p_value: float | None
    p_adjusted: float | None
    p50_before_s: float | None
    p50_after_s: float | None
    p99_before_s: float | None
    p99_after_s: float | None
    enough_samples: bool
    significant: bool
    large_effect: bool

    @property
    def flagged(self) -> bool:
        """Every gate but ``consecutive`` holds."""
        return self.enough_samples and self.significant and self.large_effect

    @property
    def p50_change(self) -> float | None:
        """Relative change of the median, (after − before) / before."""
        return _rel(self.p50_before_s, self.p50_after_s)

    @property
    def p99_change(self) -> float | None:
        """Relative change of the 99th percentile, (after − before) / before."""
        return _rel(self.p99_before_s, self.p99_after_s)


def _rel(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before <= 0:
        return None
    return (after - before) / before


@dataclass(frozen=True)
class Finding:
    """A distribution change: ``windows`` flagged windows in a row, described by the one that completed
    the run (``first_start_unix_s`` is where the run began). Quantiles in seconds, changes relative."""

    series: str
    metric: str
    group: dict[str, str]
    test: str
    first_start_unix_s: float
    start_unix_s: float
    end_unix_s: float
    windows: int
    statistic: float
    p_value: float
    p_adjusted: float
    n: int
    n_baseline: int
    p50_before_s: float
    p50_after_s: float
    p99_before_s: float
    p99_after_s: float
    p50_change: float | None
    p99_change: float | None
    p50_change_s: float
    p99_change_s: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


@dataclass
class AnomalyReport:
    """Every window tested and every finding of one scan, with the configuration that produced them."""

    config: AnomalyConfig
    windows: dict[str, list[WindowTest]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (windows summarised as counts per series)."""
        return {
            "config": asdict(self.config),
            "series": {
                name: {
                    "windows": len(ws),
                    "tested": sum(1 for w in ws if w.enough_samples),
                    "flagged": sum(1 for w in ws if w.flagged),
                }
                for name, ws in self.windows.items()
            },
            "findings": [f.to_dict() for f in self.findings],
        }


# ---- quantiles and sliding sorted samples ---------------------------------------------------------------


def _quantile_sorted(values: FloatArray, q: float) -> float:
    """numpy's default (linear) quantile of a sorted, non-empty sample."""
    h = (len(values) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(values) - 1)
    return float(values[lo] + (h - lo) * (values[hi] - values[lo]))


class _SlidingSorted:
    """The sorted values ``x[lo:hi]`` of a time-ordered array, kept sorted as the range slides forward.

    Each value carries its index in ``x``, so dropping the oldest values is one linear mask, and a chunk
    whose insertion positions are already known (from the KS search of the window just tested) is merged
    without another search.
    """

    def __init__(self, x: FloatArray) -> None:
        self.x = x
        self.lo = 0
        self.hi = 0
        self.values: FloatArray = np.empty(0)
        self.index: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
        self._known: tuple[int, int, FloatArray, npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None

    def remember(self, lo: int, hi: int, values: FloatArray, index: npt.NDArray[np.int64],
                 positions: npt.NDArray[np.int64]) -> None:
        """``values`` (sorted ``x[lo:hi]``, indices ``index``) would be inserted at ``positions`` now."""
        self._known = (lo, hi, values, index, positions)

    def move(self, lo: int, hi: int) -> FloatArray:
        if lo >= self.hi or hi <= self.lo or lo < self.lo or hi < self.hi:
            order = np.argsort(self.x[lo:hi])
            self.values = self.x[lo:hi][order]
            self.index = lo + order.astype(np.int64)
        else:
            if hi > self.hi:
                known = self._known
                if known is not None and known[0] == self.hi and known[1] == hi:
                    _, _, add, add_index, pos = known
                else:
                    order = np.argsort(self.x[self.hi:hi])
                    add = self.x[self.hi:hi][order]
                    add_index = self.hi + order.astype(np.int64)
                    pos = np.searchsorted(self.values, add, side="right")
                self.values = np.insert(self.values, pos, add)
                self.index = np.insert(self.index, pos, add_index)
            if lo > self.lo:
                keep = self.index >= lo
                self.values = self.values[keep]
                self.index = self.index[keep]
        self._known = None
        self.lo, self.hi = lo, hi
        return self.values


# ---- the scan --------------------------------------------------------------------------------------------


def _window_starts(t_first: float, t_last: float, cfg: AnomalyConfig) -> FloatArray:
    step = cfg.step
    first = math.floor(t_first / step) * step
    last = t_last - cfg.window_s  # only complete windows
    if last < first:
        return np.empty(0)
    starts: FloatArray = first + step * np.arange(math.floor((last - first) / step + 1e-9) + 1, dtype=np.float64)
    return starts


def _test(kind: str, window: FloatArray, baseline: FloatArray) -> tuple[float, float]:
    if kind == "ks":
        d = ks_statistic_sorted(window, baseline)
        return d, float(ks_pvalue(d, len(window), len(baseline))[0])
    if kind == "mannwhitney":
        r = stats.mannwhitneyu(window, baseline, alternative="two-sided", method="asymptotic")
        return float(r.statistic), float(r.pvalue)
    with warnings.catch_warnings():  # anderson_ksamp caps its p-value to [0.001, 0.25] and warns about it
        warnings.simplefilter("ignore")
        r = stats.anderson_ksamp([window, baseline])
    return float(r.statistic), float(r.pvalue)


def scan_series(
    times_unix_s: FloatArray, values_s: FloatArray, config: AnomalyConfig | None = None, *, series: str = "series"
) -> list[WindowTest]:
    """Test every complete window of one latency series against its baseline (no FDR, no run rule).

    ``times_unix_s``: arrival times, Unix seconds; ``values_s``: the latency of each request, seconds (NaN
    values are dropped). ``significant`` uses the raw p-value here; :func:`detect_anomalies` re-applies it
    after Benjamini–Hochberg. Windows start at multiples of the step in Unix time.
    """
    cfg = config or AnomalyConfig()
    t = np.asarray(times_unix_s, dtype=np.float64)
    x = np.asarray(values_s, dtype=np.float64)
    keep = np.isfinite(t) & np.isfinite(x)
    t, x = t[keep], x[keep]
    if len(t) == 0:
        return []
    if np.any(np.diff(t) < 0):
        order = np.argsort(t, kind="stable")
        t, x = t[order], x[order]
    starts = _window_starts(float(t[0]), float(t[-1]), cfg)
    lo_idx = np.searchsorted(t, starts, side="left")
    hi_idx = np.searchsorted(t, starts + cfg.window_s, side="left")
    if cfg.baseline == "preceding":
        span = cfg.baseline_windows * cfg.window_s
        b_lo = np.searchsorted(t, starts - span, side="left")
        b_hi = lo_idx
    elif cfg.baseline == "week":
        b_lo = np.searchsorted(t, starts - WEEK_S, side="left")
        b_hi = np.searchsorted(t, starts - WEEK_S + cfg.window_s, side="left")
    else:
        assert cfg.reference_start_unix_s is not None and cfg.reference_end_unix_s is not None
        r_lo = int(np.searchsorted(t, cfg.reference_start_unix_s, side="left"))
        r_hi = int(np.searchsorted(t, cfg.reference_end_unix_s, side="left"))
        b_lo = np.full(len(starts), r_lo)
        b_hi = np.full(len(starts), r_hi)
    sliding = _SlidingSorted(x)
    out: list[WindowTest] = []
    for k, start in enumerate(starts):
        n = int(hi_idx[k] - lo_idx[k])
        m = int(b_hi[k] - b_lo[k])
        enough = n >= cfg.min_samples and m >= cfg.min_samples
        if n == 0 or m == 0:
            out.append(WindowTest(series, float(start), float(start + cfg.window_s), n, m, None, None, None,
                                  None, None, None, None, False, False, False))
            continue
        order = np.argsort(x[lo_idx[k]:hi_idx[k]])
        window = x[lo_idx[k]:hi_idx[k]][order]
        baseline = sliding.move(int(b_lo[k]), int(b_hi[k]))
        if cfg.test == "ks":
            stat, right = ks_statistic_and_positions(window, baseline)
            p = float(ks_pvalue(stat, n, m)[0])
            sliding.remember(int(lo_idx[k]), int(hi_idx[k]), window, lo_idx[k] + order.astype(np.int64), right)
        else:
            stat, p = _test(cfg.test, window, baseline)
        p50b, p50a = _quantile_sorted(baseline, 0.5), _quantile_sorted(window, 0.5)
        p99b, p99a = _quantile_sorted(baseline, 0.99), _quantile_sorted(window, 0.99)
        large = _large(cfg, p50b, p50a) or _large(cfg, p99b, p99a, tail=True)
        out.append(WindowTest(series, float(start), float(start + cfg.window_s), n, m, stat, p, p,
                              p50b, p50a, p99b, p99a, enough, p < cfg.alpha, large))
    return out


def _large(cfg: AnomalyConfig, before: float, after: float, *, tail: bool = False) -> bool:
    rel = cfg.min_p99_change if tail else cfg.min_p50_change
    change = abs(after - before)
    return change >= cfg.min_abs_change_s and before > 0 and change / before >= rel


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini–Hochberg adjusted p-values (monotone, capped at 1), in the input order."""
    p = np.asarray(p_values, dtype=np.float64)
    n = len(p)
    if n == 0:
        return []
    order = np.argsort(p)
    ranked = p[order] * n / np.arange(1, n + 1)
    adjusted = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(n)
    out[order] = np.minimum(adjusted, 1.0)
    return [float(v) for v in out]


def _apply_fdr(windows: dict[str, list[WindowTest]], cfg: AnomalyConfig) -> dict[str, list[WindowTest]]:
    by_start: dict[float, list[tuple[str, int]]] = {}
    for name, ws in windows.items():
        for i, w in enumerate(ws):
            if w.p_value is not None:
                by_start.setdefault(w.start_unix_s, []).append((name, i))
    out = {name: list(ws) for name, ws in windows.items()}
    for members in by_start.values():
        raw = [windows[name][i].p_value for name, i in members]
        adjusted = benjamini_hochberg([p for p in raw if p is not None]) if cfg.fdr else raw
        for (name, i), adj in zip(members, adjusted, strict=True):
            w = windows[name][i]
            assert adj is not None
            out[name][i] = WindowTest(**{**_fields(w), "p_adjusted": adj, "significant": adj < cfg.alpha})
    return out


def _fields(w: WindowTest) -> dict[str, Any]:
    return {k: getattr(w, k) for k in WindowTest.__dataclass_fields__}


def findings_of(
    windows: Sequence[WindowTest], cfg: AnomalyConfig, *, metric: str, group: dict[str, str], series: str
) -> list[Finding]:
    """One finding per run of ``cfg.consecutive`` or more flagged windows (reported when the run reaches k)."""
    out: list[Finding] = []
    run: list[WindowTest] = []
    for w in windows:
        contiguous = bool(run) and abs(w.start_unix_s - run[-1].start_unix_s - cfg.step) < 1e-6
        if w.flagged and (contiguous or not run):
            run.append(w)
        elif w.flagged:
            run = [w]
        else:
            run = []
        if len(run) == cfg.consecutive:
            assert w.statistic is not None and w.p_value is not None and w.p_adjusted is not None
            assert w.p50_before_s is not None and w.p50_after_s is not None
            assert w.p99_before_s is not None and w.p99_after_s is not None
            out.append(Finding(
                series, metric, group, cfg.test, run[0].start_unix_s, w.start_unix_s, w.end_unix_s, len(run),
                w.statistic, w.p_value, w.p_adjusted, w.n, w.n_baseline, w.p50_before_s, w.p50_after_s,
                w.p99_before_s, w.p99_after_s, w.p50_change, w.p99_change,
                w.p50_after_s - w.p50_before_s, w.p99_after_s - w.p99_before_s,
            ))
    return out


def detect_in_arrays(
    series: dict[str, tuple[FloatArray, FloatArray]],
    config: AnomalyConfig | None = None,
    *,
    metric: str = "latency",
    groups: dict[str, dict[str, str]] | None = None,
) -> AnomalyReport:
    """Scan several series (name → (arrival Unix s, latency s)), apply BH across them and the run rule."""
    cfg = config or AnomalyConfig()
    return _detect(series, cfg, dict.fromkeys(series, metric), groups or {})


def _detect(
    series: dict[str, tuple[FloatArray, FloatArray]],
    cfg: AnomalyConfig,
    metric_of: dict[str, str],
    groups: dict[str, dict[str, str]],
) -> AnomalyReport:
    scanned = {name: scan_series(t, x, cfg, series=name) for name, (t, x) in series.items()}
    report = AnomalyReport(cfg, _apply_fdr(scanned, cfg))
    for name, ws in report.windows.items():
        report.findings += findings_of(ws, cfg, metric=metric_of[name], group=groups.get(name, {}), series=name)
    report.findings.sort(key=lambda f: (f.start_unix_s, f.series))
    return report


def detect_anomalies(
    con: duckdb.DuckDBPyConnection,
    config: AnomalyConfig | None = None,
    *,
    metrics: Sequence[str] = ("ttft",),
    by: Sequence[str] = ("model",),
) -> AnomalyReport:
    """Scan the stored request summaries: one series per metric and group (``by`` ⊆ model, version,
    tenant_class), Benjamini–Hochberg across all of them per window start.

    Raises :class:`ConfigurationError` for an unknown metric or grouping column.
    """
    cfg = config or AnomalyConfig()
    for m in metrics:
        _cfg(m in ANOMALY_METRICS, f"unknown metric {m!r}; choose from {', '.join(ANOMALY_METRICS)}")
    for b in by:
        _cfg(b in _SERIES_GROUPS, f"cannot group by {b!r}; choose from {', '.join(_SERIES_GROUPS)}")
    keys = ", ".join(by)
    series: dict[str, tuple[FloatArray, FloatArray]] = {}
    groups: dict[str, dict[str, str]] = {}
    names: dict[str, str] = {}
    for metric in metrics:
        expr = ANOMALY_METRICS[metric]
        sel = f"{keys}, " if by else ""
        frame = con.sql(
            f"SELECT {sel}arrival_unix_s AS t, ({expr}) AS x FROM {SUMMARY_TABLE} "
            f"WHERE ({expr}) IS NOT NULL ORDER BY {sel}arrival_unix_s"
        ).pl()
        parts = frame.partition_by(list(by), as_dict=True, maintain_order=True) if by else {(): frame}
        for key, part in parts.items():
            group = {b: str(v) for b, v in zip(by, key, strict=True)}
            name = metric + "".join(f" {k}={v}" for k, v in group.items())
            series[name] = (part["t"].to_numpy().astype(np.float64), part["x"].to_numpy().astype(np.float64))
            groups[name] = group
            names[name] = metric
    return _detect(series, cfg, names, groups)


# ---- other signals ---------------------------------------------------------------------------------------


MIN_ZSCORE_WINDOW_S = 60.0


def rolling_zscore(times_unix_s: FloatArray, values_s: FloatArray, window_s: float = 60.0) -> FloatArray:
    """Each latency's z-score against the mean and standard deviation of the latencies that arrived in the
    ``window_s`` seconds before it (trailing, the sample itself excluded). NaN with fewer than two earlier
    samples in the window or a zero deviation. ``times_unix_s`` must be ascending.

    Raises :class:`ConfigurationError` when ``window_s`` < 60 s (shorter windows chase noise).
    """
    _cfg(window_s >= MIN_ZSCORE_WINDOW_S, f"z-score window must be >= {MIN_ZSCORE_WINDOW_S:g} s, got {window_s}")
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
    _cfg(window_s >= 3 * bucket_s, f"window_s must hold at least three buckets of {bucket_s} s, got {window_s}")
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
        _cfg(self.p99_rise > 0, f"p99_rise must be > 0, got {self.p99_rise}")
        _cfg(0 <= self.entropy <= 1, f"entropy must be in [0, 1], got {self.entropy}")
        _cfg(1 <= self.min_agree <= 3, f"min_agree must be 1, 2 or 3, got {self.min_agree}")
        _cfg(self.slope_window_s >= 3, f"slope_window_s must be >= 3 s, got {self.slope_window_s}")


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
    Raises :class:`ConfigurationError` for an unknown metric or grouping column.
    """
    _cfg(metric in ANOMALY_METRICS, f"unknown metric {metric!r}; choose from {', '.join(ANOMALY_METRICS)}")
    for b in by:
        _cfg(b in _SERIES_GROUPS, f"cannot group by {b!r}; choose from {', '.join(_SERIES_GROUPS)}")
    sel = f"{', '.join(by)}, " if by else ""
    frame = con.sql(
        f"SELECT {sel}arrival_unix_s AS t, ({ANOMALY_METRICS[metric]}) AS x, finish_reason AS r "
        f"FROM {SUMMARY_TABLE} ORDER BY {sel}arrival_unix_s"
    ).pl()
    parts = frame.partition_by(list(by), as_dict=True, maintain_order=True) if by else {(): frame}
    out: dict[str, list[TighteningSignal]] = {}
    for key, part in parts.items():
        name = metric + "".join(f" {k}={v}" for k, v in zip(by, key, strict=True))
        x = part["x"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
        out[name] = tightening_signals(part["t"].to_numpy().astype(np.float64), x.astype(np.float64),
                                       part["r"].to_list(), config, anomaly)
    return out
