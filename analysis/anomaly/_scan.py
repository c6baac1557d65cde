"""Distribution change of latency against a baseline: windowed two-sample tests, effect-size gates, FDR, run rule.

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
Its "before → after" compares the requests of the run's windows with the baseline before the run began
(the test figures are those of the window that completed the run). A series in which no window could
be tested says why (:attr:`AnomalyReport.untested`). Every threshold lives in :class:`AnomalyConfig`;
docs/anomalies.md gives the defaults and their reasons.

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
from llmslo.analysis.databases import Database, as_database
from llmslo.analysis.report import MAX_WINDOWS, placeable_rows
from llmslo.telemetry import TPOT_SQL, ConfigurationError, format_duration

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "ANOMALY_METRICS",
    "AnomalyConfig",
    "AnomalyReport",
    "Finding",
    "FloatArray",
    "SERIES_GROUPS",
    "WindowTest",
    "benjamini_hochberg",
    "detect_anomalies",
    "detect_in_arrays",
    "ensure",
    "findings_of",
    "scan_inputs",
    "scan_series",
    "scanned_rows",
    "untested_reason",
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
SERIES_GROUPS: tuple[str, ...] = ("model", "version", "tenant_class")


def ensure(ok: bool, message: str) -> None:
    """Raise :class:`ConfigurationError` with ``message`` unless ``ok``."""
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
        ensure(self.window_s > 0 and math.isfinite(self.window_s), f"window_s must be > 0 s, got {self.window_s}")
        ensure(self.step_s is None or (0 < self.step_s <= self.window_s),
                f"step_s must be in (0, window_s={self.window_s}], got {self.step_s}")
        ensure(self.baseline in _BASELINES, f"baseline must be one of {', '.join(_BASELINES)}, got {self.baseline!r}")
        ensure(self.test in _TESTS, f"test must be one of {', '.join(_TESTS)}, got {self.test!r}")
        ensure(0 < self.alpha < 1, f"alpha must be in (0, 1), got {self.alpha}")
        ensure(self.baseline_windows >= 1, f"baseline_windows must be >= 1, got {self.baseline_windows}")
        ensure(self.min_samples >= 2, f"min_samples must be >= 2, got {self.min_samples}")
        ensure(self.consecutive >= 1, f"consecutive must be >= 1, got {self.consecutive}")
        for name in ("min_p50_change", "min_p99_change", "min_abs_change_s"):
            ensure(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        if self.baseline == "reference":
            lo, hi = self.reference_start_unix_s, self.reference_end_unix_s
            ensure(lo is not None and hi is not None and lo < hi,
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
    """A distribution change: ``windows`` flagged windows in a row, from ``first_start_unix_s`` (where the
    run began) to ``end_unix_s``.

    The test figures (``statistic``, p-values, ``n``, ``n_baseline``, ``start_unix_s``) are those of the
    window that completed the run. "Before → after" compares the ``n_run`` requests that arrived in the
    run's windows with the ``n_before`` of the baseline before the run began (``preceding``: the
    baseline windows before its first window; ``week``: the run's span one week earlier; ``reference``:
    the reference period), so that a run's own windows never count as its "before". Quantiles in
    seconds, changes relative (and ``_change_s`` absolute, seconds)."""

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
    n_run: int
    n_before: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


@dataclass
class AnomalyReport:
    """Every window tested and every finding of one scan, with the configuration that produced them.

    ``untested`` says, for each series in which no window could be tested, why (no arrival times, too
    few requests per window, no baseline, ...); ``notes`` what the scan left out of the store and why
    (rows without arrival times, a metric no request has).
    """

    config: AnomalyConfig
    windows: dict[str, list[WindowTest]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    untested: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (windows summarised as counts per series, with ``untested_reason``)."""
        return {
            "config": asdict(self.config),
            "series": {
                name: {
                    "windows": len(ws),
                    "tested": sum(1 for w in ws if w.enough_samples),
                    "flagged": sum(1 for w in ws if w.flagged),
                    "untested_reason": self.untested.get(name),
                }
                for name, ws in self.windows.items()
            },
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
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
    """Starts of the complete windows between the first and the last arrival (Unix seconds).

    Raises :class:`ConfigurationError` naming the window, the step and the count when there would be
    more than :data:`~llmslo.analysis.report.MAX_WINDOWS`.
    """
    step = cfg.step
    first = math.floor(t_first / step) * step
    last = t_last - cfg.window_s  # only complete windows
    if last < first:
        return np.empty(0)
    count = math.floor((last - first) / step + 1e-9) + 1
    if count > MAX_WINDOWS:
        raise ConfigurationError(
            f"--window {format_duration(cfg.window_s)} with --step {format_duration(step)} gives {count:,} windows "
            f"over arrivals {format_duration(t_last - t_first)} apart, more than the {MAX_WINDOWS:,} a scan "
            "tests per series: choose a longer --window or --step"
        )
    starts: FloatArray = first + step * np.arange(count, dtype=np.float64)
    return starts


def _prepared(times_unix_s: FloatArray, values_s: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The finite (arrival, latency) pairs of a series in arrival order (stable)."""
    t = np.asarray(times_unix_s, dtype=np.float64)
    x = np.asarray(values_s, dtype=np.float64)
    keep = np.isfinite(t) & np.isfinite(x)
    t, x = t[keep], x[keep]
    if len(t) and np.any(np.diff(t) < 0):
        order = np.argsort(t, kind="stable")
        t, x = t[order], x[order]
    return t, x


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
    after Benjamini–Hochberg. Windows start at multiples of the step in Unix time. Raises
    :class:`ConfigurationError` when the arrivals span more windows than a scan tests.
    """
    cfg = config or AnomalyConfig()
    t, x = _prepared(times_unix_s, values_s)
    if len(t) == 0:
        return []
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


def _before_span(first_start: float, end: float, cfg: AnomalyConfig) -> tuple[float, float]:
    """``[lo, hi)`` (Unix seconds) of the baseline before a run of windows from ``first_start`` to ``end``."""
    if cfg.baseline == "preceding":
        return first_start - cfg.baseline_windows * cfg.window_s, first_start
    if cfg.baseline == "week":
        return first_start - WEEK_S, end - WEEK_S
    assert cfg.reference_start_unix_s is not None and cfg.reference_end_unix_s is not None
    return cfg.reference_start_unix_s, cfg.reference_end_unix_s


def _between(t: FloatArray, x: FloatArray, lo: float, hi: float) -> FloatArray:
    """The sorted latencies of the requests that arrived in ``[lo, hi)`` (``t`` ascending)."""
    i, j = np.searchsorted(t, [lo, hi], side="left")
    out: FloatArray = np.sort(x[int(i):int(j)])
    return out


def findings_of(
    windows: Sequence[WindowTest],
    cfg: AnomalyConfig,
    *,
    metric: str,
    group: dict[str, str],
    series: str,
    samples: tuple[FloatArray, FloatArray],
) -> list[Finding]:
    """One finding per run of ``cfg.consecutive`` or more flagged windows (reported when the run reaches k).

    ``samples`` are the series' ``(arrival Unix s, latency s)`` that ``windows`` were computed from: the
    finding's before/after quantiles come from the run's windows and the baseline before the run.
    """
    t, x = _prepared(*samples)
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
            first = run[0].start_unix_s
            after = _between(t, x, first, w.end_unix_s)
            before = _between(t, x, *_before_span(first, w.end_unix_s, cfg))
            if not (len(after) and len(before)):  # a flagged window and its baseline hold min_samples each
                raise ValueError(f"findings_of: the samples of series {series!r} are not the ones its windows "
                                 "were computed from")
            p50b, p50a = _quantile_sorted(before, 0.5), _quantile_sorted(after, 0.5)
            p99b, p99a = _quantile_sorted(before, 0.99), _quantile_sorted(after, 0.99)
            out.append(Finding(
                series, metric, group, cfg.test, first, w.start_unix_s, w.end_unix_s, len(run),
                w.statistic, w.p_value, w.p_adjusted, w.n, w.n_baseline, p50b, p50a, p99b, p99a,
                _rel(p50b, p50a), _rel(p99b, p99a), p50a - p50b, p99a - p99b, len(after), len(before),
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


def _baseline_words(cfg: AnomalyConfig) -> str:
    if cfg.baseline == "preceding":
        return f"the {cfg.baseline_windows} window(s) before it"
    if cfg.baseline == "week":
        return "the same window one week earlier"
    return "the reference period"


def untested_reason(times_unix_s: FloatArray, windows: Sequence[WindowTest], cfg: AnomalyConfig) -> str | None:
    """Why no window of a series could be tested (None when one was): no values, no arrival times, a span
    shorter than one window, no baseline, or too few requests per window or baseline."""
    if any(w.enough_samples for w in windows):
        return None
    t = np.asarray(times_unix_s, dtype=np.float64)
    t = t[np.isfinite(t)]
    if len(t) == 0:
        return "no request has this latency"
    lo, hi = float(np.min(t)), float(np.max(t))
    if not windows:
        if lo == hi:
            return (f"all {len(t):,} requests have the same arrival time: the data carries no arrival times to "
                    "place in windows")
        return (f"no complete window: the arrivals span {format_duration(hi - lo)}, and a window is "
                f"{format_duration(cfg.window_s)} (shorten --window)")
    most_n = max(w.n for w in windows)
    most_base = max(w.n_baseline for w in windows)
    if most_base == 0:
        return f"no window has a baseline: {_baseline_words(cfg)} holds no request"
    both = max(min(w.n, w.n_baseline) for w in windows)
    return (f"too few requests per window: at most {most_n:,} in a window and {most_base:,} in a baseline "
            f"({both:,} in both at once), each needs {cfg.min_samples:,} (lengthen --window)")


def _detect(
    series: dict[str, tuple[FloatArray, FloatArray]],
    cfg: AnomalyConfig,
    metric_of: dict[str, str],
    groups: dict[str, dict[str, str]],
) -> AnomalyReport:
    scanned = {name: scan_series(t, x, cfg, series=name) for name, (t, x) in series.items()}
    report = AnomalyReport(cfg, _apply_fdr(scanned, cfg))
    for name, ws in report.windows.items():
        report.findings += findings_of(ws, cfg, metric=metric_of[name], group=groups.get(name, {}), series=name,
                                       samples=series[name])
        reason = untested_reason(series[name][0], ws, cfg)
        if reason is not None:
            report.untested[name] = reason
    report.findings.sort(key=lambda f: (f.start_unix_s, f.series))
    return report


def _names(files: Sequence[str]) -> str:
    return ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")


def scanned_rows(con: duckdb.DuckDBPyConnection | Database) -> tuple[str, list[str]]:
    """The SQL condition keeping the rows the scan can place in windows, and a note on those it leaves out
    (see :func:`~llmslo.analysis.report.placeable_rows`); ``con``: a DuckDB connection or a database, whose
    SQL the condition is written in."""
    rows = placeable_rows(con)
    if not rows.left_out:
        return rows.condition, []
    return rows.condition, [f"{rows.left_out:,} row(s) from imports without arrival times "
                            f"({_names(rows.files)}) are not scanned: they cannot be placed in windows"]


def scan_inputs(database: Database, metric: str, by: Sequence[str], keep: str) -> pl.DataFrame:
    """The KS scan's inputs for one metric: ``by`` columns, ``t`` (arrival, Unix seconds) and ``x`` (the
    latency, seconds) of every kept row where the metric is defined, ordered by group and arrival. The same
    query on every database (``keep`` in its SQL, :func:`scanned_rows`)."""
    expr = ANOMALY_METRICS[metric]
    sel = f"{', '.join(by)}, " if by else ""
    return database.frame(
        f"SELECT {sel}arrival_unix_s AS t, ({expr}) AS x FROM {database.summaries} "
        f"WHERE ({expr}) IS NOT NULL AND {keep} ORDER BY {sel}arrival_unix_s"
    )


def detect_anomalies(
    con: duckdb.DuckDBPyConnection | Database,
    config: AnomalyConfig | None = None,
    *,
    metrics: Sequence[str] = ("ttft",),
    by: Sequence[str] = ("model",),
) -> AnomalyReport:
    """Scan the stored request summaries: one series per metric and group (``by`` ⊆ model, version,
    tenant_class), Benjamini–Hochberg across all of them per window start. ``con``: a DuckDB connection (a
    store's ``con``) or an :class:`~llmslo.analysis.databases.Database` (ClickHouse, Parquet files): the series
    come from :func:`scan_inputs`, the tests run here.

    Rows from imports without arrival times are not scanned (:attr:`AnomalyReport.notes` says how many).
    Raises :class:`ConfigurationError` for an unknown metric or grouping column, or a window that gives
    more windows than a scan tests, and :class:`~llmslo.analysis.report.ReportDataError` for a stored
    arrival time that cannot be placed.
    """
    cfg = config or AnomalyConfig()
    for m in metrics:
        ensure(m in ANOMALY_METRICS, f"unknown metric {m!r}; choose from {', '.join(ANOMALY_METRICS)}")
    for b in by:
        ensure(b in SERIES_GROUPS, f"cannot group by {b!r}; choose from {', '.join(SERIES_GROUPS)}")
    database = as_database(con)
    keep, notes = scanned_rows(database)
    series: dict[str, tuple[FloatArray, FloatArray]] = {}
    groups: dict[str, dict[str, str]] = {}
    names: dict[str, str] = {}
    for metric in metrics:
        frame = scan_inputs(database, metric, by, keep)
        if frame.height == 0:
            notes.append(f"no scanned request has a {metric} value: there is no {metric} series")
            continue
        parts = frame.partition_by(list(by), as_dict=True, maintain_order=True) if by else {(): frame}
        for key, part in parts.items():
            group = {b: str(v) for b, v in zip(by, key, strict=True)}
            name = metric + "".join(f" {k}={v}" for k, v in group.items())
            series[name] = (part["t"].to_numpy().astype(np.float64), part["x"].to_numpy().astype(np.float64))
            groups[name] = group
            names[name] = metric
    report = _detect(series, cfg, names, groups)
    report.notes = notes
    return report
