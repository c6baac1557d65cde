"""Distribution-change detection, its gates, and the other trouble signals (rolling z, failure slope, entropy)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

from llmslo.analysis import Store, polars_schema
from llmslo.analysis.anomaly import (
    AnomalyConfig,
    TighteningConfig,
    benjamini_hochberg,
    detect_anomalies,
    detect_in_arrays,
    failure_rate_slope,
    outcome_entropy,
    rolling_zscore,
    scan_series,
    tightening_signals,
)
from llmslo.analysis.anomaly._ks import KSTWO_MAX_N, ks_pvalue, ks_statistic_sorted, ks_statistics_against
from llmslo.telemetry import COLUMNS, ConfigurationError

REAL = Path(__file__).resolve().parents[2] / "shared" / "real_data"
T0 = 1_700_006_400.0  # a multiple of 300 s


def _stream(rng: np.random.Generator, rate: float, seconds: float, median: float = 0.5) -> tuple[np.ndarray, ...]:
    n = int(rate * seconds)
    return T0 + np.sort(rng.uniform(0, seconds, n)), median * np.exp(0.5 * rng.standard_normal(n))


@pytest.mark.parametrize("seed", range(6))
def test_ks_statistic_equals_scipy_to_the_last_bit_with_and_without_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    digits = (None, 2, 1)[seed % 3]  # rounding makes ties within and across samples
    a = rng.lognormal(0, 0.5, 1 + 37 * seed)
    b = rng.lognormal(0.05 * seed, 0.5, 500)
    if digits is not None:
        a, b = np.round(a, digits), np.round(b, digits)
    ours = ks_statistic_sorted(np.sort(a), np.sort(b))
    assert abs(ours - stats.ks_2samp(a, b).statistic) <= 1e-12
    bounds = np.array([0, len(a)])
    assert ks_statistics_against(np.sort(a), bounds, np.sort(b))[0] == ours


def test_ks_pvalue_is_scipys_asymptotic_one_up_to_the_finite_sample_limit() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=900), rng.normal(0.1, 1, size=1100)
    d = ks_statistic_sorted(np.sort(a), np.sort(b))
    assert round(900 * 1100 / 2000) <= KSTWO_MAX_N
    assert ks_pvalue(d, 900, 1100)[0] == pytest.approx(stats.ks_2samp(a, b, method="asymp").pvalue, abs=1e-12)


def test_every_window_of_a_scan_matches_ks_2samp_on_the_same_samples() -> None:
    rng = np.random.default_rng(2)
    t, x = _stream(rng, 5.0, 4 * 3600)
    x = np.round(x, 3)
    cfg = AnomalyConfig(window_s=600, baseline_windows=3, min_samples=10)
    for w in scan_series(t, x, cfg):
        if w.statistic is None:
            continue
        win = x[(t >= w.start_unix_s) & (t < w.end_unix_s)]
        base = x[(t >= w.start_unix_s - 1800) & (t < w.start_unix_s)]
        assert abs(w.statistic - stats.ks_2samp(win, base).statistic) <= 1e-12
        assert w.p50_before_s == pytest.approx(float(np.quantile(base, 0.5)), abs=1e-12)
        assert w.p99_after_s == pytest.approx(float(np.quantile(win, 0.99)), abs=1e-12)


def test_benjamini_hochberg_adjusts_like_the_textbook_step_up() -> None:
    p = [0.01, 0.04, 0.03, 0.20]
    # sorted 0.01, 0.03, 0.04, 0.20 -> 0.04, 0.04*4/3 -> min with later, 0.04*4/3=0.0533, 0.2
    assert benjamini_hochberg(p) == pytest.approx([0.04, 0.05333333333, 0.05333333333, 0.2])
    assert benjamini_hochberg([]) == []


def test_a_tiny_shift_on_a_large_sample_is_significant_but_not_flagged() -> None:
    rng = np.random.default_rng(3)
    t, x = _stream(rng, 50.0, 3 * 3600)
    x[t >= T0 + 7200] *= 1.03  # +3%: KS rejects with 15,000 samples a window, the effect gate does not pass
    report = detect_in_arrays({"s": (t, x)}, AnomalyConfig(baseline_windows=6))
    after = [w for w in report.windows["s"] if w.start_unix_s >= T0 + 7200 and w.n_baseline]
    assert any(w.significant for w in after)
    assert not any(w.flagged for w in after)
    assert report.findings == []


def test_a_30_percent_shift_is_found_within_two_windows_with_every_figure() -> None:
    rng = np.random.default_rng(4)
    t, x = _stream(rng, 10.0, 3 * 3600)
    shift = T0 + 7200
    x[t >= shift] *= 1.3
    report = detect_in_arrays({"s": (t, x)}, AnomalyConfig(baseline_windows=6), metric="ttft")
    assert len(report.findings) == 1
    f = report.findings[0]
    assert f.first_start_unix_s == shift and f.start_unix_s == shift + 300  # the second window completes the run
    assert f.windows == 2 and f.metric == "ttft" and f.test == "ks"
    assert f.p_value < 0.01 and f.p_adjusted >= f.p_value and 0 < f.statistic <= 1
    assert f.n >= 100 and f.n_baseline >= 100
    assert f.p50_change is not None and 0.2 < f.p50_change < 0.4
    assert f.p50_change_s == pytest.approx(f.p50_after_s - f.p50_before_s)
    assert f.p99_after_s > f.p99_before_s


def test_a_single_flagged_window_is_not_a_finding_with_two_required() -> None:
    rng = np.random.default_rng(5)
    t, x = _stream(rng, 10.0, 3 * 3600)
    burst = (t >= T0 + 7200) & (t < T0 + 7500)
    x[burst] *= 1.5
    cfg = AnomalyConfig(baseline_windows=6)
    report = detect_in_arrays({"s": (t, x)}, cfg)
    assert sum(w.flagged for w in report.windows["s"]) == 1
    assert report.findings == []
    assert len(detect_in_arrays({"s": (t, x)}, AnomalyConfig(baseline_windows=6, consecutive=1)).findings) == 1


def test_windows_with_too_few_samples_are_never_flagged() -> None:
    rng = np.random.default_rng(6)
    t, x = _stream(rng, 0.2, 3 * 3600)  # ~60 requests per 300 s window
    x[t >= T0 + 7200] *= 3
    report = detect_in_arrays({"s": (t, x)}, AnomalyConfig(baseline_windows=6))
    assert not any(w.enough_samples for w in report.windows["s"])
    assert report.findings == []


def test_fdr_across_series_raises_p_values_it_never_lowers_them() -> None:
    rng = np.random.default_rng(7)
    series = {f"s{i}": _stream(rng, 5.0, 2 * 3600) for i in range(8)}
    on = detect_in_arrays(series, AnomalyConfig(baseline_windows=3, min_samples=10))
    off = detect_in_arrays(series, AnomalyConfig(baseline_windows=3, min_samples=10, fdr=False))
    for name in series:
        for a, b in zip(on.windows[name], off.windows[name], strict=True):
            if a.p_value is not None:
                assert a.p_adjusted is not None and b.p_adjusted is not None
                assert a.p_adjusted >= b.p_adjusted == b.p_value


@pytest.mark.parametrize("test", ["anderson", "mannwhitney"])
def test_anderson_darling_and_mann_whitney_options_find_the_same_shift(test: str) -> None:
    rng = np.random.default_rng(8)
    t, x = _stream(rng, 5.0, 3 * 3600)
    x[t >= T0 + 7200] *= 1.4
    report = detect_in_arrays({"s": (t, x)}, AnomalyConfig(baseline_windows=6, test=test))  # type: ignore[arg-type]
    assert [f.first_start_unix_s for f in report.findings] == [T0 + 7200]


def test_week_and_reference_baselines_take_their_samples_where_they_say() -> None:
    rng = np.random.default_rng(9)
    t1, x1 = _stream(rng, 2.0, 3600)
    t2, x2 = _stream(rng, 2.0, 3600)
    t = np.concatenate([t1, t2 + 7 * 86400])
    x = np.concatenate([x1, x2 * 2])
    week = scan_series(t, x, AnomalyConfig(baseline="week", min_samples=10))
    tested = [w for w in week if w.n_baseline]
    assert tested and all(w.start_unix_s >= T0 + 7 * 86400 for w in tested)
    assert all(w.p50_change is not None and w.p50_change > 0.5 for w in tested)
    ref = scan_series(t1, x1, AnomalyConfig(baseline="reference", reference_start_unix_s=T0,
                                            reference_end_unix_s=T0 + 600, min_samples=10))
    assert {w.n_baseline for w in ref} == {int(np.sum(t1 < T0 + 600))}


def test_configuration_mistakes_name_the_field() -> None:
    for kwargs, field in (({"window_s": 0}, "window_s"), ({"step_s": 600}, "step_s"), ({"alpha": 1.5}, "alpha"),
                          ({"baseline": "reference"}, "reference_start_unix_s"), ({"test": "t"}, "test"),
                          ({"consecutive": 0}, "consecutive")):
        with pytest.raises(ConfigurationError, match=field):
            AnomalyConfig(**kwargs)  # type: ignore[arg-type]


def test_rolling_zscore_uses_only_the_trailing_window_and_refuses_windows_under_60_s() -> None:
    rng = np.random.default_rng(10)
    t = np.sort(rng.uniform(0, 600, 2000))
    x = rng.normal(1, 0.1, 2000)
    z = rolling_zscore(t, x, 60.0)
    for i in (100, 1000, 1999):
        prev = x[(t >= t[i] - 60) & (np.arange(len(t)) < i)]
        assert z[i] == pytest.approx((x[i] - prev.mean()) / prev.std(ddof=1), rel=1e-9)
    assert math.isnan(z[0])
    with pytest.raises(ConfigurationError, match="60"):
        rolling_zscore(t, x, 30.0)


def test_failure_slope_is_least_squares_over_the_window_only() -> None:
    # failures per second ramp up by one each second from t=100 s; a spike at t=10 s is outside late windows
    times = [10.0 + k * 0.001 for k in range(50)]
    for s in range(100, 130):
        times += [s + 0.5] * (s - 99)
    t = np.array(times)
    ends, slope = failure_rate_slope(t, np.ones(len(t), dtype=bool), window_s=10.0, start_unix_s=0.0)
    at = {float(e): float(v) for e, v in zip(ends, slope, strict=True)}
    assert at[130.0] == pytest.approx(1.0)  # buckets 120..129 hold 21..30 failures: 1 failure/s per s
    assert at[60.0] == pytest.approx(0.0)
    assert math.isnan(at[5.0])


def test_outcome_entropy_is_zero_for_one_reason_and_one_for_all_seven_equally() -> None:
    from llmslo.telemetry import FINISH_REASONS

    assert outcome_entropy(["stop"] * 10) == 0.0
    assert outcome_entropy(list(FINISH_REASONS) * 3) == pytest.approx(1.0)
    assert math.isnan(outcome_entropy([]))


def test_the_tightening_rule_fires_only_when_the_three_signals_agree() -> None:
    rng = np.random.default_rng(11)
    n = 12_000
    t = T0 + np.sort(rng.uniform(0, 3600, n))
    x = 0.5 * np.exp(0.3 * rng.standard_normal(n))
    reasons = np.where(rng.uniform(size=n) < 0.7, "stop", "length").astype(object)
    late = t >= T0 + 3000
    x[late] *= 1.6
    # failures ramp during the last window: the failure rate climbs by 2 failures/s every second for 40 s
    ramp = late & (rng.uniform(size=n) < 0.3)
    reasons[ramp] = rng.choice(["error", "deadline", "client_cancel", "rejected"], size=int(ramp.sum()))
    extra_t = np.concatenate([T0 + 3100 + k + rng.uniform(0, 1, 2 * k) for k in range(40)])
    t = np.concatenate([t, extra_t])
    x = np.concatenate([x, np.full(len(extra_t), np.nan)])
    reasons = np.concatenate([reasons, np.array(["error"] * len(extra_t), dtype=object)])
    n = len(t)
    cfg = AnomalyConfig(baseline_windows=6)
    signals = tightening_signals(t, x, list(reasons), TighteningConfig(), cfg)
    fired = [s for s in signals if s.fire]
    assert [s.start_unix_s for s in fired] == [T0 + 3000]
    assert fired[0].p99_rise is not None and fired[0].p99_rise >= 0.3
    only_latency = tightening_signals(t, x, ["stop"] * n, TighteningConfig(), cfg)
    assert not any(s.fire for s in only_latency)
    assert any(s.agree == 1 for s in only_latency)


@pytest.mark.slow
def test_the_demo_overload_burst_is_found_from_the_store(tmp_path: Path) -> None:
    trace = REAL / "azure" / "AzureLLMInferenceTrace_conv.csv"
    if not trace.is_file():
        pytest.skip(f"real data not found at {trace}")
    from llmslo.analysis.workload._demo import BURST_OFFSET_S, simulate_demo_workload

    frame = simulate_demo_workload(trace, seed=0)
    with Store.open(tmp_path / "s.duckdb") as store:
        store.ingest_frame(frame)
        start = float(frame["arrival_unix_s"].min())
        cfg = AnomalyConfig(window_s=120, baseline="reference", reference_start_unix_s=start,
                            reference_end_unix_s=start + 600)
        report = detect_anomalies(store.con, cfg, metrics=("ttft", "queue"), by=("model",))
    burst = start + BURST_OFFSET_S
    ttft = [f for f in report.findings if f.metric == "ttft"]
    assert ttft, "the burst must be found"
    first = min(f.end_unix_s for f in ttft)
    assert burst < first <= burst + 3 * 120  # within three 120 s windows of the burst start
    assert all(f.p99_change is not None for f in ttft)


# ---- before/after of a finding, untested series, stores the scan cannot place ---------------------------


def _summary_frame(t: np.ndarray, ttft: np.ndarray, *, prefix: str = "r") -> pl.DataFrame:
    """Successful requests arriving at ``t`` (Unix s) with TTFT ``ttft`` (s), 11 tokens each."""
    n = len(t)
    cols: dict[str, object] = {
        "request_id": [f"{prefix}#{i}" for i in range(n)], "model": ["m"] * n, "version": ["v1"] * n,
        "tenant_class": ["interactive"] * n, "arrival_unix_s": t, "finish_reason": ["stop"] * n,
        "queue_s": ttft / 2, "ttft_s": ttft, "last_token_s": ttft + 1.0, "e2e_s": ttft + 1.1,
        "prompt_tokens": np.full(n, 100), "generated_tokens": np.full(n, 11), "sent_tokens": np.full(n, 11),
    }
    schema = polars_schema()
    frame = pl.DataFrame(cols).with_columns(
        pl.lit(c.default).cast(schema[c.name]).alias(c.name) for c in COLUMNS if c.name not in cols)
    return frame.select(schema.names()).cast(dict(schema))


def _burst_store(path: Path, baseline: str = "preceding") -> tuple[Path, np.ndarray, np.ndarray]:
    """An hour of calm TTFT (0.1-0.5 s) at 10 req/s, then 30 minutes of a burst (8-10.5 s)."""
    rng = np.random.default_rng(12)
    t = T0 + np.sort(rng.uniform(0, 5400, 54_000))
    x = rng.uniform(0.1, 0.5, len(t))
    burst = t >= T0 + 3600
    x[burst] = rng.uniform(8.0, 10.5, int(burst.sum()))
    with Store.open(path) as store:
        store.ingest_frame(_summary_frame(t, x))
    return path, t, x


def test_a_finding_compares_the_run_with_the_baseline_before_the_run(tmp_path: Path) -> None:
    db, t, x = _burst_store(tmp_path / "s.duckdb")
    with Store.open(db, read_only=True) as store:
        report = detect_anomalies(store.con, AnomalyConfig(), by=())
    f = report.findings[0]
    assert (f.first_start_unix_s, f.end_unix_s, f.windows) == (T0 + 3600, T0 + 4200, 2)
    before = x[(t >= T0 + 3600 - 12 * 300) & (t < T0 + 3600)]  # the 12 windows before the run: all calm
    after = x[(t >= T0 + 3600) & (t < T0 + 4200)]
    assert f.p99_before_s == pytest.approx(float(np.quantile(before, 0.99)), abs=1e-12)
    assert f.p99_before_s < 0.5  # the calm baseline, not one that holds the run's first window
    assert f.p99_after_s == pytest.approx(float(np.quantile(after, 0.99)), abs=1e-12)
    assert f.p50_before_s == pytest.approx(float(np.quantile(before, 0.5)), abs=1e-12)
    assert (f.n_run, f.n_before) == (len(after), len(before))
    assert f.p99_change == pytest.approx((f.p99_after_s - f.p99_before_s) / f.p99_before_s)
    assert f.p99_change_s == pytest.approx(f.p99_after_s - f.p99_before_s)
    # the test figures stay those of the window that completed the run (its baseline holds the first one)
    assert f.start_unix_s == T0 + 3900 and f.n_baseline == int(np.sum((t >= T0 + 300) & (t < T0 + 3900)))


def test_week_and_reference_findings_take_before_from_their_own_baseline() -> None:
    rng = np.random.default_rng(13)
    t1, x1 = _stream(rng, 5.0, 3600)
    t2, x2 = _stream(rng, 5.0, 3600)
    t = np.concatenate([t1, t2 + WEEK])
    x = np.concatenate([x1, x2 * np.where(t2 >= T0 + 1800, 3.0, 1.0)])
    week = detect_in_arrays({"s": (t, x)}, AnomalyConfig(baseline="week", min_samples=50))
    f = week.findings[0]
    assert f.first_start_unix_s == T0 + WEEK + 1800
    span = (t >= f.first_start_unix_s - WEEK) & (t < f.end_unix_s - WEEK)
    assert f.p99_before_s == pytest.approx(float(np.quantile(x[span], 0.99)), abs=1e-12)
    ref = detect_in_arrays({"s": (t, x)}, AnomalyConfig(baseline="reference", reference_start_unix_s=T0,
                                                        reference_end_unix_s=T0 + 600, min_samples=50))
    g = next(f for f in ref.findings if f.first_start_unix_s >= T0 + WEEK)
    assert g.n_before == int(np.sum(t < T0 + 600))
    assert g.p50_before_s == pytest.approx(float(np.quantile(x[t < T0 + 600], 0.5)), abs=1e-12)


WEEK = 7 * 86_400.0


def _imports_record(store: Store, prefix: str) -> None:
    """A provenance record of an import without arrival times (with the run-duration columns)."""
    from llmslo.analysis.store import IMPORTS_TABLE, imports_ddl

    store.con.execute(imports_ddl())
    have = {r[0] for r in store.con.sql(
        f"SELECT column_name FROM duckdb_columns() WHERE table_name = '{IMPORTS_TABLE}'").fetchall()}
    for name, kind in (("id_prefix", "VARCHAR"), ("run_duration_s", "DOUBLE"), ("run_duration_note", "VARCHAR")):
        if name not in have:
            store.con.execute(f"ALTER TABLE {IMPORTS_TABLE} ADD COLUMN {name} {kind}")
    store.con.execute(
        f"INSERT INTO {IMPORTS_TABLE} (content_sha256, source, kind, tool, rows_read, rows_imported, rows_inserted, "
        "rows_already_stored, arrivals_available, arrival_note, conversions, missing_fields, finish_reasons, "
        "imported_unix_s, id_prefix, run_duration_s) VALUES (?, ?, 'llmperf', 'LLMPerf', 0, 0, 0, 0, FALSE, '', "
        "[], [], MAP {}, 0, ?, 60.0)", [f"sha-{prefix}", f"/runs/{prefix}.json", prefix])


def test_a_scan_that_tests_no_window_says_why(tmp_path: Path) -> None:
    rng = np.random.default_rng(14)
    with Store.open(tmp_path / "imported.duckdb") as store:  # an import without arrival times: not scanned
        store.ingest_frame(_summary_frame(np.zeros(500), rng.uniform(0.1, 1, 500), prefix="bench"))
        _imports_record(store, "bench")
        imported = detect_anomalies(store.con, AnomalyConfig(), by=())
    assert imported.windows == {} and imported.findings == []
    assert any("500 row(s) from imports without arrival times (bench.json)" in n for n in imported.notes)
    with Store.open(tmp_path / "same.duckdb") as store:  # ingested as is: every arrival the same
        store.ingest_frame(_summary_frame(np.full(500, T0), rng.uniform(0.1, 1, 500)))
        same = detect_anomalies(store.con, AnomalyConfig(), by=())
    assert "same arrival time" in same.untested["ttft"]
    assert same.to_dict()["series"]["ttft"]["untested_reason"] == same.untested["ttft"]
    t, x = _stream(rng, 0.2, 3 * 3600)  # ~60 requests a window
    sparse = detect_in_arrays({"s": (t, x)}, AnomalyConfig(baseline_windows=6))
    assert sparse.untested["s"].startswith("too few requests per window") and "needs 100" in sparse.untested["s"]
    t, x = _stream(rng, 5.0, 3600)
    far = detect_in_arrays({"s": (t, x)}, AnomalyConfig(baseline="reference", reference_start_unix_s=T0 - 900,
                                                        reference_end_unix_s=T0 - 600))
    assert far.untested["s"] == "no window has a baseline: the reference period holds no request"
    short = detect_in_arrays({"s": (t[:10], x[:10])}, AnomalyConfig())
    assert short.untested["s"].startswith("no complete window")
    busy = detect_in_arrays({"s": _stream(rng, 10.0, 3 * 3600)}, AnomalyConfig(baseline_windows=6))
    assert busy.untested == {} and busy.to_dict()["series"]["s"]["untested_reason"] is None


def test_a_scan_refuses_more_windows_than_it_tests_and_arrivals_it_cannot_place(tmp_path: Path) -> None:
    from llmslo.analysis.report import MAX_WINDOWS, ReportDataError

    t = np.array([T0, T0 + 10 * 86_400.0])
    with pytest.raises(ConfigurationError, match=r"--window 1s with --step 1s gives [\d,]+ windows"):
        scan_series(t, np.ones(2), AnomalyConfig(window_s=1.0))
    with pytest.raises(ConfigurationError, match=f"more than the {MAX_WINDOWS:,}"):
        scan_series(np.array([T0, 1.7e308]), np.ones(2), AnomalyConfig())
    with Store.open(tmp_path / "s.duckdb") as store:
        store.ingest_frame(_summary_frame(np.full(3, T0), np.ones(3)))
        store.con.execute("UPDATE request_summaries SET arrival_unix_s = -1e12 WHERE request_id = 'r#1'")
        with pytest.raises(ReportDataError, match=r"1 row\(s\).*'r#1'"):
            detect_anomalies(store.con, AnomalyConfig(), by=())


def test_a_request_that_outlives_its_window_counts_in_the_window_of_its_arrival() -> None:
    # each window ends with requests whose latency (60 s) outlasts it: the scan takes them by arrival
    rng = np.random.default_rng(15)
    t, x = _stream(rng, 2.0, 3600)
    late = (t - T0) % 300 > 290
    x[late] = 60.0
    windows = scan_series(t, x, AnomalyConfig(min_samples=10))
    assert sum(w.statistic is not None for w in windows) == len(windows) - 1 > 0  # the first has no baseline
    for w in windows:
        inside = (t >= w.start_unix_s) & (t < w.end_unix_s)
        assert w.n == int(inside.sum()) and int((inside & late).sum()) > 0
        if w.statistic is not None:
            assert w.p99_after_s == pytest.approx(float(np.quantile(x[inside], 0.99)), abs=1e-12)
