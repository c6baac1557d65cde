"""GPU and engine signals against request latency: time-bucket alignment, correlations, lead/lag, decode state.

:func:`aligned_frame` puts every source on one time grid of ``bucket_s`` seconds (bucket start, Unix s):

* GPU samples (``gpu_samples``): per-bucket means over GPUs and sources of utilisation (%), memory used
  (bytes), power (W), temperature (°C), SM clock (MHz), and ``throttled`` (1 when any sample had a
  throttle reason, else 0);
* engine samples (``engine_samples``): per-bucket means of gauges (``gpu_cache_usage_perc``,
  ``num_requests_waiting``…); cumulative counters (a ``total`` in the name) become per-second rates from
  consecutive samples, named without ``_total`` and ending in ``_per_s`` (``generation_tokens_per_s``:
  generated tokens per second; ``model_forward_time_per_s``: seconds of forward pass per second);
* request summaries: by arrival bucket the mean ``ttft_s``, ``tpot_s``, ``queue_s`` (seconds) and
  ``arrivals_per_s``; by terminal-state bucket ``generated_tokens_per_s``; ``in_flight`` (requests
  arrived and not yet finished at the bucket start). Rows from imports without arrival times (stored at
  arrival 0) cannot be placed in time and are left out.

:func:`time_overlap` says when the samples and the requests were taken and how much of that they share:
correlate them only over the overlap (:meth:`TimeOverlap.restrict`), and not at all without one.

:func:`correlate` gives Pearson and Spearman coefficients (with p-values and the number of buckets) of
each signal against each target; :func:`lagged_correlation` finds the shift that maximises |Pearson| and
says which series leads; :func:`gpu_state_during_decode` gives each request the GPU state while it decoded.
Correlation over time buckets is not causation, and both series are autocorrelated: the p-values are
optimistic.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import duckdb
import numpy as np
import polars as pl
from scipy import stats

from llmslo.analysis.gpu._samples import ENGINE_TABLE, GPU_TABLE
from llmslo.analysis.report import placeable_rows
from llmslo.analysis.store import SUMMARY_TABLE, table_names
from llmslo.telemetry import TPOT_SQL, ConfigurationError

__all__ = [
    "GPU_SIGNALS",
    "REQUEST_TARGETS",
    "Correlation",
    "LagResult",
    "TimeOverlap",
    "aligned_frame",
    "correlate",
    "gpu_state_during_decode",
    "lagged_correlation",
    "time_overlap",
]

GPU_SIGNALS: tuple[str, ...] = (
    "util_gpu_pct", "util_mem_pct", "memory_used_bytes", "power_w", "temperature_c", "sm_clock_mhz", "throttled",
)
"""GPU columns of :func:`aligned_frame`."""
REQUEST_TARGETS: tuple[str, ...] = ("ttft_s", "tpot_s", "queue_s", "in_flight", "generated_tokens_per_s",
                                    "arrivals_per_s")
"""Request-derived columns of :func:`aligned_frame`."""
MAX_ALIGNED_BUCKETS = 5_000_000
"""Most buckets :func:`aligned_frame` lays out (about 40 MB a column): past it, the sources span far more
time than one run (a file with relative times read from Unix time 0 beside real Unix times, say)."""


def _is_counter(name: str) -> bool:
    return "total" in name.split("_")


def _rate_name(name: str) -> str:
    parts = [p for p in name.split("_") if p != "total"]
    return "_".join(parts) + "_per_s"


def _ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (an engine metric name comes from a file's header)."""
    return '"' + name.replace('"', '""') + '"'


def _check_span(lo: float, hi: float, b: float) -> int:
    """Buckets of ``b`` seconds from ``lo`` to ``hi`` (Unix s); raises past :data:`MAX_ALIGNED_BUCKETS`."""
    n = math.floor((hi - lo) / b) + 2
    if n > MAX_ALIGNED_BUCKETS:
        raise ConfigurationError(
            f"the GPU, engine and request data span {hi - lo:,.0f} s (Unix {lo:,.0f} to {hi:,.0f}): {n:,} buckets "
            f"of {b:g} s, more than {MAX_ALIGNED_BUCKETS:,}. Pass a larger bucket, or import files with relative "
            "times with --start (their Unix time of time 0) so that they line up with the requests")
    return n


def _placed(con: duckdb.DuckDBPyConnection) -> str:
    """SQL over the summary table keeping the rows that can be placed in time (``TRUE`` when all can)."""
    return placeable_rows(con).condition


@dataclass(frozen=True)
class TimeOverlap:
    """When the GPU and engine samples were taken and when the requests ran, and the time they share.

    Unix seconds: ``samples_from_unix_s``/``samples_to_unix_s`` the first and last sample (None without
    samples); ``requests_from_unix_s``/``requests_to_unix_s`` the first arrival and the last finish of the
    requests that can be placed in time (None without any). ``requests_without_arrival`` rows came from
    imports without arrival times (their ``files``): they are placed nowhere and left out.
    """

    samples_from_unix_s: float | None
    samples_to_unix_s: float | None
    requests_from_unix_s: float | None
    requests_to_unix_s: float | None
    requests_without_arrival: int
    files_without_arrival: tuple[str, ...]

    @property
    def both(self) -> bool:
        """Whether there are samples and placed requests both (so that an overlap is asked for)."""
        return self.samples_from_unix_s is not None and self.requests_from_unix_s is not None

    @property
    def overlap(self) -> tuple[float, float] | None:
        """``(from, to)`` Unix seconds that the samples and the requests share; None when they share none (or
        one side is missing)."""
        if not self.both:
            return None
        assert self.samples_from_unix_s is not None and self.samples_to_unix_s is not None
        assert self.requests_from_unix_s is not None and self.requests_to_unix_s is not None
        lo = max(self.samples_from_unix_s, self.requests_from_unix_s)
        hi = min(self.samples_to_unix_s, self.requests_to_unix_s)
        return (lo, hi) if lo <= hi else None

    @property
    def overlap_s(self) -> float | None:
        """Seconds the two share (0.0 when they do not overlap; None when one side is missing)."""
        if not self.both:
            return None
        ov = self.overlap
        return 0.0 if ov is None else ov[1] - ov[0]

    def restrict(self, frame: pl.DataFrame) -> pl.DataFrame:
        """The buckets of an :func:`aligned_frame` that lie in the overlap (every bucket when one side is
        missing; none when they do not overlap)."""
        if not self.both:
            return frame
        ov = self.overlap
        if ov is None or frame.height == 0:
            return frame.clear()
        step = float(frame["t"][1] - frame["t"][0]) if frame.height > 1 else 1.0
        return frame.filter((pl.col("t") >= math.floor(ov[0] / step) * step) & (pl.col("t") <= ov[1]))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "files_without_arrival": list(self.files_without_arrival),
                "overlap_s": self.overlap_s}


def time_overlap(con: duckdb.DuckDBPyConnection) -> TimeOverlap:
    """When the stored GPU/engine samples and the placeable requests were taken (see :class:`TimeOverlap`).

    Raises :class:`~llmslo.analysis.report.ReportDataError` for a stored arrival time that is no time at all.
    """
    tables = table_names(con)
    spans = [con.sql(f"SELECT min(time_unix_s), max(time_unix_s) FROM {t}").fetchall()[0]
             for t in (GPU_TABLE, ENGINE_TABLE) if t in tables]
    lows = [float(lo) for lo, _ in spans if lo is not None]
    highs = [float(hi) for _, hi in spans if hi is not None]
    r_lo = r_hi = None
    left_out, files = 0, tuple[str, ...]()
    if SUMMARY_TABLE in tables:
        placed = placeable_rows(con)
        left_out, files = placed.left_out, placed.files
        lo, hi = con.sql(f"SELECT min(arrival_unix_s), max(arrival_unix_s + e2e_s) FROM {SUMMARY_TABLE} "
                         f"WHERE {placed.condition}").fetchall()[0]
        r_lo, r_hi = (None, None) if lo is None else (float(lo), float(hi))
    return TimeOverlap(min(lows) if lows else None, max(highs) if highs else None, r_lo, r_hi, left_out, files)


def aligned_frame(con: duckdb.DuckDBPyConnection, *, bucket_s: float = 1.0) -> pl.DataFrame:
    """Every available source on one grid of ``bucket_s``-second buckets (column ``t``, bucket start, Unix s).

    Request summaries from imports without arrival times are left out (they cannot be placed in time). The
    grid spans every source: correlate samples with requests over :meth:`TimeOverlap.restrict` of it.
    Raises :class:`ConfigurationError` when ``bucket_s`` is not positive, or when the sources span more
    than :data:`MAX_ALIGNED_BUCKETS` buckets. Missing tables are skipped.
    """
    if not bucket_s > 0:
        raise ConfigurationError(f"bucket_s must be > 0 s, got {bucket_s}")
    b = float(bucket_s)
    tables = table_names(con)
    parts: list[pl.DataFrame] = []
    if GPU_TABLE in tables:
        gpu = con.sql(
            f"SELECT floor(time_unix_s / {b!r}) * {b!r} AS t, avg(util_gpu_pct) AS util_gpu_pct, "
            "avg(util_mem_pct) AS util_mem_pct, avg(memory_used_bytes) AS memory_used_bytes, "
            "avg(power_w) AS power_w, avg(temperature_c) AS temperature_c, avg(sm_clock_mhz) AS sm_clock_mhz, "
            "CAST(max(CASE WHEN throttle_reasons IS NULL THEN NULL WHEN throttle_reasons <> 0 THEN 1 ELSE 0 END) "
            f"AS DOUBLE) AS throttled FROM {GPU_TABLE} GROUP BY 1"
        ).pl()
        if gpu.height:
            parts.append(gpu)
    if ENGINE_TABLE in tables:
        names = [str(r[0]) for r in con.sql(f"SELECT DISTINCT name FROM {ENGINE_TABLE} ORDER BY 1").fetchall()]
        for name in names:
            if _is_counter(name):
                sql = (
                    f"SELECT floor(time_unix_s / {b!r}) * {b!r} AS t, avg(rate) AS {_ident(_rate_name(name))} FROM ("
                    "SELECT time_unix_s, (value - lag(value) OVER w) / nullif(time_unix_s - lag(time_unix_s) OVER w, 0)"
                    f" AS rate FROM {ENGINE_TABLE} WHERE name = $1 "
                    "WINDOW w AS (PARTITION BY source ORDER BY time_unix_s)) WHERE rate IS NOT NULL GROUP BY 1"
                )
            else:
                sql = (f"SELECT floor(time_unix_s / {b!r}) * {b!r} AS t, avg(value) AS {_ident(name)} "
                       f"FROM {ENGINE_TABLE} WHERE name = $1 GROUP BY 1")
            frame = con.sql(sql, params=[name]).pl()
            if frame.height:
                parts.append(frame)
    if SUMMARY_TABLE in tables:
        placed = _placed(con)
        req = con.sql(
            f"SELECT floor(arrival_unix_s / {b!r}) * {b!r} AS t, avg(ttft_s) AS ttft_s, avg({TPOT_SQL}) AS tpot_s, "
            f"avg(queue_s) AS queue_s, count(*) / {b!r} AS arrivals_per_s FROM {SUMMARY_TABLE} WHERE {placed} "
            "GROUP BY 1"
        ).pl()
        if req.height:
            parts.append(req)
            fin = con.sql(
                f"SELECT floor((arrival_unix_s + e2e_s) / {b!r}) * {b!r} AS t, "
                f"sum(generated_tokens) / {b!r} AS generated_tokens_per_s FROM {SUMMARY_TABLE} WHERE {placed} "
                "GROUP BY 1"
            ).pl()
            parts.append(fin)
            parts.append(_in_flight(con, b, placed))
    if not parts:
        return pl.DataFrame({"t": []}, schema={"t": pl.Float64})
    grid = pl.concat([p.select("t") for p in parts]).unique()
    lo, hi = grid["t"].min(), grid["t"].max()
    assert isinstance(lo, float) and isinstance(hi, float)
    _check_span(lo, hi, b)
    out = pl.DataFrame({"t": lo + b * np.arange(round((hi - lo) / b) + 1)})
    for p in parts:
        out = out.join(p.with_columns(pl.col("t").cast(pl.Float64)), on="t", how="left")
    if "generated_tokens_per_s" in out.columns:
        out = out.with_columns(pl.col("generated_tokens_per_s").fill_null(0.0))
    return out.sort("t")


def _in_flight(con: duckdb.DuckDBPyConnection, b: float, placed: str) -> pl.DataFrame:
    rows = con.sql(f"SELECT arrival_unix_s, arrival_unix_s + e2e_s FROM {SUMMARY_TABLE} WHERE {placed}").fetchnumpy()
    arr = np.asarray(rows["arrival_unix_s"], dtype=np.float64)
    fin = np.asarray(list(rows.values())[1], dtype=np.float64)
    t0 = math.floor(float(arr.min()) / b) * b
    nb = _check_span(t0, float(fin.max()), b)
    # +1 in the bucket after the one holding the arrival, -1 in the bucket after the finish: the count at
    # each bucket start.
    up = np.bincount(np.floor((arr - t0) / b).astype(np.int64) + 1, minlength=nb)[:nb]
    down = np.bincount(np.floor((fin - t0) / b).astype(np.int64) + 1, minlength=nb)[:nb]
    return pl.DataFrame({"t": t0 + b * np.arange(nb), "in_flight": np.cumsum(up - down).astype(np.float64)})


@dataclass(frozen=True)
class Correlation:
    """Pearson and Spearman coefficients of one signal with one target over ``n`` shared buckets."""

    signal: str
    target: str
    n: int
    pearson: float | None
    pearson_p: float | None
    spearman: float | None
    spearman_p: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pair(frame: pl.DataFrame, a: str, b: str) -> tuple[np.ndarray, np.ndarray]:
    sub = frame.select(a, b).drop_nulls().drop_nans()
    return sub[a].to_numpy().astype(np.float64), sub[b].to_numpy().astype(np.float64)


def correlate(
    frame: pl.DataFrame, signals: Sequence[str] | None = None, targets: Sequence[str] | None = None,
    *, min_buckets: int = 10,
) -> list[Correlation]:
    """Correlations of every signal with every target (columns of :func:`aligned_frame`).

    Defaults: signals are the GPU columns and the engine columns present; targets the request columns present,
    or, without request summaries, the engine columns. A pair with fewer than ``min_buckets`` shared buckets or
    a constant series gets ``None`` coefficients.
    """
    cols = [c for c in frame.columns if c != "t"]
    engine = [c for c in cols if c not in GPU_SIGNALS and c not in REQUEST_TARGETS]
    sig = list(signals) if signals is not None else [c for c in cols if c in GPU_SIGNALS] + engine
    req = [c for c in cols if c in REQUEST_TARGETS]
    tgt = list(targets) if targets is not None else (req or engine)
    for c in [*sig, *tgt]:
        if c not in cols:
            raise ConfigurationError(f"no column {c!r} in the aligned frame; columns: {', '.join(cols)}")
    out: list[Correlation] = []
    for s in sig:
        for t in tgt:
            if s == t:
                continue
            x, y = _pair(frame, s, t)
            if len(x) < min_buckets or np.ptp(x) == 0 or np.ptp(y) == 0:
                out.append(Correlation(s, t, len(x), None, None, None, None))
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pr = stats.pearsonr(x, y)
                sr = stats.spearmanr(x, y)
            out.append(Correlation(s, t, len(x), float(pr.statistic), float(pr.pvalue), float(sr.statistic),
                                   float(sr.pvalue)))
    return out


@dataclass(frozen=True)
class LagResult:
    """Lagged Pearson correlation of ``a`` and ``b``: ``best_lag_s`` > 0 means ``a`` moves first (``a`` at
    time t goes with ``b`` at t + lag), < 0 that ``b`` does. Seconds; coefficients in [-1, 1]."""

    a: str
    b: str
    best_lag_s: float
    r_at_best: float
    r_at_zero: float | None
    n_at_best: int
    leader: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _corr(x: np.ndarray, y: np.ndarray) -> float | None:
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3:
        return None
    xx, yy = x[ok], y[ok]
    if np.ptp(xx) == 0 or np.ptp(yy) == 0:
        return None
    return float(np.corrcoef(xx, yy)[0, 1])


def lagged_correlation(
    frame: pl.DataFrame, a: str, b: str, *, max_lag_s: float = 30.0, min_buckets: int = 10
) -> LagResult | None:
    """Pearson correlation of ``a(t)`` with ``b(t + lag)`` for every lag up to ``max_lag_s`` seconds either
    way (on the frame's bucket grid); the lag of the largest |r| wins. ``None`` when no lag has
    ``min_buckets`` shared buckets and variation in both series."""
    if frame.height < 2:
        return None
    step = float(frame["t"][1] - frame["t"][0])
    x = frame[a].cast(pl.Float64).fill_null(np.nan).to_numpy()
    y = frame[b].cast(pl.Float64).fill_null(np.nan).to_numpy()
    k = int(max_lag_s // step)
    best: tuple[float, int, int] | None = None
    zero: float | None = None
    for lag in range(-k, k + 1):
        xs, ys = (x[: len(x) - lag], y[lag:]) if lag >= 0 else (x[-lag:], y[: len(y) + lag])
        n = int(np.sum(np.isfinite(xs) & np.isfinite(ys)))
        if n < min_buckets:
            continue
        r = _corr(xs, ys)
        if r is None:
            continue
        if lag == 0:
            zero = r
        if best is None or abs(r) > abs(best[0]) + 1e-12:
            best = (r, lag, n)
    if best is None:
        return None
    r, lag, n = best
    leader = a if lag > 0 else b if lag < 0 else "neither"
    return LagResult(a, b, lag * step, r, zero, int(n), leader)


def gpu_state_during_decode(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Each decoding request with the mean GPU state over its decode (first token → last token, Unix s); rows
    from imports without arrival times are left out (they cannot be placed in time).

    Columns: ``request_id``, ``decode_start_unix_s``, ``decode_end_unix_s``, ``samples`` (GPU samples inside
    the decode; 0 when the decode was shorter than the sampling interval, then the last sample at or before
    the decode start is used), ``util_gpu_pct``, ``util_mem_pct``, ``memory_used_bytes``, ``power_w``,
    ``temperature_c``, ``sm_clock_mhz`` (means) and ``throttled`` (any sample with a throttle reason).
    Empty when the store has no GPU samples.
    """
    if GPU_TABLE not in table_names(con):
        return pl.DataFrame()
    cols = ("util_gpu_pct", "util_mem_pct", "memory_used_bytes", "power_w", "temperature_c", "sm_clock_mhz")
    inside = ", ".join(f"avg(g.{c}) AS in_{c}" for c in cols)
    chosen = ", ".join(f"coalesce(i.in_{c}, a.{c}) AS {c}" for c in cols)
    frame: pl.DataFrame = con.sql(
        f"""
        WITH d AS (
            SELECT request_id, arrival_unix_s + ttft_s AS s, arrival_unix_s + last_token_s AS e
            FROM {SUMMARY_TABLE} WHERE ttft_s IS NOT NULL AND last_token_s IS NOT NULL AND ({_placed(con)})
        ), i AS (
            SELECT d.request_id, count(g.time_unix_s) AS samples, {inside},
                   bool_or(g.throttle_reasons <> 0) AS in_throttled
            FROM d LEFT JOIN {GPU_TABLE} g ON g.time_unix_s >= d.s AND g.time_unix_s <= d.e
            GROUP BY d.request_id
        ), g1 AS (
            SELECT time_unix_s, avg(util_gpu_pct) AS util_gpu_pct, avg(util_mem_pct) AS util_mem_pct,
                   avg(memory_used_bytes) AS memory_used_bytes, avg(power_w) AS power_w,
                   avg(temperature_c) AS temperature_c, avg(sm_clock_mhz) AS sm_clock_mhz,
                   bool_or(throttle_reasons <> 0) AS throttled
            FROM {GPU_TABLE} GROUP BY time_unix_s
        ), a AS (
            SELECT d.request_id, g1.* FROM d ASOF LEFT JOIN g1 ON d.s >= g1.time_unix_s
        )
        SELECT d.request_id, d.s AS decode_start_unix_s, d.e AS decode_end_unix_s, i.samples, {chosen},
               CASE WHEN i.samples > 0 THEN i.in_throttled ELSE a.throttled END AS throttled
        FROM d JOIN i USING (request_id) JOIN a USING (request_id)
        ORDER BY d.s, d.request_id
        """
    ).pl()
    return frame
