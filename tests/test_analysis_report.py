"""Report figures: exact quantiles, goodput by the fixed rule, windows, survivor bias, tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmslo.analysis import GoodputPolicy, ReportSpec, Store, build_report, polars_schema
from llmslo.telemetry import COLUMNS, ConfigurationError
from llmslo.tests._rows import cancelled_row, ok_row, rejected_row


def _store(path: Path, rows: list[dict[str, Any]]) -> Store:
    store = Store.open(path)
    full = [{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows]
    store.ingest_frame(pl.DataFrame(full, schema=polars_schema()))
    return store


def _only(report: dict[str, Any]) -> dict[str, Any]:
    (group,) = report["groups"]
    return group


def _success(i: int, ttft: float, n: int = 11, decode: float = 1.0, **kw: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"queue_s": ttft / 2, "ttft_s": ttft, "last_token_s": ttft + decode,
                              "e2e_s": ttft + decode + 0.01, "generated_tokens": n, "sent_tokens": n}
    fields.update(kw)
    return ok_row(i, **fields)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.floats(min_value=0.001, max_value=100), min_size=1, max_size=60))
def test_quantiles_equal_numpy_and_stay_inside_the_data(tmp_path_factory: pytest.TempPathFactory,
                                                        ttfts: list[float]) -> None:
    rows = [_success(i, t) for i, t in enumerate(ttfts)]
    with _store(tmp_path_factory.mktemp("q") / "s.duckdb", rows) as store:
        lat = _only(build_report(store.con, ReportSpec(GoodputPolicy())).to_dict())["latency"]["ttft_s"]
    want = np.percentile(np.array(ttfts), [50, 90, 95, 99])
    got = [lat["p50"], lat["p90"], lat["p95"], lat["p99"]]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert min(ttfts) <= lat["p50"] <= lat["p99"] <= lat["max"] == max(ttfts)
    assert lat["count"] == len(ttfts)
    assert lat["mean"] == pytest.approx(float(np.mean(ttfts)))


_mixed = st.lists(
    st.tuples(st.sampled_from(["ok", "rejected", "cancel", "one"]), st.floats(0.01, 5), st.floats(0.0, 5)),
    min_size=1, max_size=40,
)


def _mixed_rows(spec: list[tuple[str, float, float]]) -> list[dict[str, Any]]:
    rows = []
    for i, (kind, ttft, decode) in enumerate(spec):
        if kind == "ok":
            rows.append(_success(i, ttft, decode=decode))
        elif kind == "one":
            rows.append(ok_row(i, queue_s=0.0, ttft_s=ttft, last_token_s=ttft, e2e_s=ttft,
                               generated_tokens=1, sent_tokens=1))
        elif kind == "rejected":
            rows.append(rejected_row(i))
        else:
            rows.append(cancelled_row(i, waited_s=ttft))
    return rows


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_mixed, st.floats(0.05, 5), st.floats(0.05, 5), st.floats(0.01, 1), st.floats(0.01, 1))
def test_goodput_is_a_fraction_and_monotone_in_each_threshold(
    tmp_path_factory: pytest.TempPathFactory, spec: list[tuple[str, float, float]],
    t1: float, t2: float, p1: float, p2: float,
) -> None:
    with _store(tmp_path_factory.mktemp("g") / "s.duckdb", _mixed_rows(spec)) as store:
        def frac(ttft: float, tpot: float) -> float:
            g = _only(build_report(store.con, ReportSpec(GoodputPolicy(ttft_s=ttft, tpot_s=tpot))).to_dict())
            assert g["attempted"] == len(spec)
            assert 0.0 <= g["goodput_fraction"] <= 1.0
            return float(g["goodput_fraction"])

        lo_t, hi_t = sorted((t1, t2))
        lo_p, hi_p = sorted((p1, p2))
        assert frac(lo_t, lo_p) <= frac(hi_t, lo_p) <= frac(hi_t, hi_p)
        assert frac(lo_t, lo_p) <= frac(lo_t, hi_p)


def test_goodput_keeps_shed_and_cancelled_requests_in_the_denominator(tmp_path: Path) -> None:
    rows = [_success(0, 0.5), _success(1, 3.0), rejected_row(2), cancelled_row(3),
            ok_row(4, queue_s=0.0, ttft_s=0.2, last_token_s=0.2, e2e_s=0.2, generated_tokens=1, sent_tokens=1)]
    with _store(tmp_path / "s.duckdb", rows) as store:
        g = _only(build_report(store.con, ReportSpec(GoodputPolicy(ttft_s=2.0, tpot_s=0.1))).to_dict())
        strict = _only(build_report(store.con, ReportSpec(
            GoodputPolicy(ttft_s=2.0, tpot_s=0.1, one_token_passes_tpot=False))).to_dict())
    assert (g["attempted"], g["good"], g["goodput_fraction"]) == (5, 2, 0.4)
    assert g["good_one_token_replies"] == 1 and g["one_token_replies"] == 1
    assert strict["good"] == 1
    # tpot of row 0: 1.0 s / 10 = 0.1 s, which passes (inclusive)
    assert g["latency"]["tpot_s"]["max"] == pytest.approx(0.1)


def test_windows_align_to_unix_time_and_judge_each_request_by_its_final_outcome(tmp_path: Path) -> None:
    t0 = 1_700_000_000.0  # a multiple of 10
    rows = [
        _success(0, 0.5, arrival_unix_s=t0 + 1.0),
        _success(1, 0.5, arrival_unix_s=t0 + 8.0),  # finishes at t0+9.51
        _success(2, 0.5, arrival_unix_s=t0 + 9.0, decode=1.0),  # finishes at t0+10.51: after its window's end
        _success(3, 0.5, arrival_unix_s=t0 + 12.0),
    ]
    with _store(tmp_path / "s.duckdb", rows) as store:
        rep = build_report(store.con, ReportSpec(GoodputPolicy(window_s=10.0))).to_dict()
    first, second = rep["groups"]
    assert first["keys"]["window_start_unix_s"] == t0 and second["keys"]["window_start_unix_s"] == t0 + 10
    # the request that outlived its window belongs to it, judged by its outcome: nothing is in flight
    assert (first["attempted"], first["in_flight"], first["good"], first["goodput_fraction"]) == (3, 0, 3, 1.0)
    assert (second["attempted"], second["in_flight"], second["good"]) == (1, 0, 1)
    assert first["request_goodput_per_s"] == pytest.approx(0.3)
    assert first["token_goodput_per_s"] == pytest.approx(33 / 10)
    assert rep["rate_basis"] == {"kind": "window", "seconds": 10.0, "exceptions": []}
    assert first["rate_basis"] == {"kind": "window", "seconds": 10.0, "note": None}
    assert rep["until_unix_s"] is None
    acc = first["survivor_bias"]["accounting"]
    assert acc["balanced"] and acc["admitted"] == acc["stop"] == 3


def test_ten_good_requests_just_before_a_boundary_are_ten_good_requests(tmp_path: Path) -> None:
    t0 = 1_700_000_000.0
    rows = [_success(i, 0.5, arrival_unix_s=t0 + 9.9) for i in range(10)]  # each runs 1.51 s past t0+10
    with _store(tmp_path / "s.duckdb", rows) as store:
        for window in (10.0, 0.001):
            (g,) = build_report(store.con, ReportSpec(GoodputPolicy(window_s=window))).to_dict()["groups"]
            assert (g["attempted"], g["good"], g["in_flight"], g["goodput_fraction"]) == (10, 10, 0, 1.0), window
            assert g["request_goodput_per_s"] == pytest.approx(10 / window)


def test_only_requests_in_flight_at_the_horizon_are_set_apart(tmp_path: Path) -> None:
    t0 = 1_700_000_000.0
    rows = [
        _success(0, 0.5, arrival_unix_s=t0 + 1.0),  # finishes t0+2.51
        _success(1, 0.5, arrival_unix_s=t0 + 8.0, decode=5.0),  # finishes t0+13.51: in flight at t0+12
        cancelled_row(2, waited_s=1.0, arrival_unix_s=t0 + 9.0),  # finished t0+10: settled at t0+12
        _success(3, 0.5, arrival_unix_s=t0 + 11.0),  # finishes t0+12.51: in flight at t0+12
        _success(4, 0.5, arrival_unix_s=t0 + 12.5),  # arrives after the horizon: not reported
    ]
    with _store(tmp_path / "s.duckdb", rows) as store:
        windowed = build_report(store.con, ReportSpec(GoodputPolicy(window_s=10.0), until_unix_s=t0 + 12)).to_dict()
        whole = build_report(store.con, ReportSpec(GoodputPolicy(), until_unix_s=t0 + 12)).to_dict()
        later = build_report(store.con, ReportSpec(GoodputPolicy(window_s=10.0), until_unix_s=t0 + 20)).to_dict()
    first, second = windowed["groups"]
    assert windowed["until_unix_s"] == t0 + 12
    assert (first["attempted"], first["in_flight"], first["good"], first["goodput_fraction"]) == (3, 1, 1, 0.5)
    assert (second["attempted"], second["in_flight"], second["good"], second["goodput_fraction"]) == (1, 1, 0, None)
    assert first["finish_reasons"]["stop"] == 1 and first["finish_reasons"]["client_cancel"] == 1
    acc = first["survivor_bias"]["accounting"]
    assert acc["balanced"] and acc["in_flight"] == 1
    # the second window was seen for 2 s before the horizon: its rates divide by those 2 s
    assert second["rate_basis"]["kind"] == "window" and second["rate_basis"]["seconds"] == pytest.approx(2.0)
    assert first["request_goodput_per_s"] == pytest.approx(0.1)
    (g,) = whole["groups"]
    assert (g["attempted"], g["in_flight"], g["good"], g["goodput_fraction"]) == (4, 2, 1, 0.5)
    assert whole["rate_basis"]["to_unix_s"] == t0 + 12 and whole["rate_basis"]["seconds"] == pytest.approx(11.0)
    # a horizon after every finish: nothing in flight, and the decode=5 s request is judged by its outcome
    assert [(w["attempted"], w["in_flight"], w["good"]) for w in later["groups"]] == [(3, 0, 1), (2, 0, 2)]
    with pytest.raises(ConfigurationError, match="--until"):
        ReportSpec(GoodputPolicy(), until_unix_s=float("nan"))


def test_without_a_window_rates_divide_by_the_span_and_say_so(tmp_path: Path) -> None:
    rows = [_success(0, 0.5, arrival_unix_s=100.0), _success(1, 0.5, arrival_unix_s=110.0)]
    with _store(tmp_path / "s.duckdb", rows) as store:
        rep = build_report(store.con, ReportSpec(GoodputPolicy())).to_dict()
    assert rep["rate_basis"]["kind"] == "span" and rep["rate_basis"]["exceptions"] == []
    assert rep["rate_basis"]["seconds"] == pytest.approx(110.0 + 1.51 - 100.0)
    assert _only(rep)["rate_basis"] == {"kind": "span", "seconds": rep["rate_basis"]["seconds"], "note": None}
    assert _only(rep)["tokens"]["generated_tokens_per_s"] == pytest.approx(22 / 11.51)


def test_survivor_bias_flags_a_success_only_tail_that_hides_cancelled_requests(tmp_path: Path) -> None:
    fast = [_success(i, 0.2 + 0.001 * i) for i in range(80)]
    gave_up = [cancelled_row(100 + i, waited_s=10.0 + i) for i in range(20)]
    with _store(tmp_path / "s.duckdb", fast + gave_up) as store:
        sb = _only(build_report(store.con, ReportSpec(GoodputPolicy())).to_dict())["survivor_bias"]
    assert sb["verdict"] == "optimistic"
    assert sb["ttft_success_only"]["p99"] < 0.3
    assert sb["ttft_censoring_aware"]["p99"] is None and sb["ttft_censoring_aware"]["at_least_s"] == 29.0
    assert sb["shed_cancel_fraction"] == pytest.approx(0.2)
    assert any(r.startswith("TTFT p90: success-only") for r in sb["reasons"])
    # 100 admitted requests put one beyond a p99: too few to judge it (500 needed), and the comparison says so
    assert sb["comparisons"]["p99"]["judged"] is False
    assert "p99 needs 500 admitted requests (5 beyond it), this group has 100" in sb["comparisons"]["p99"]["reason"]


def test_survivor_bias_is_consistent_when_nobody_is_lost(tmp_path: Path) -> None:
    with _store(tmp_path / "s.duckdb", [_success(i, 0.2 + 0.01 * i) for i in range(50)]) as store:
        sb = _only(build_report(store.con, ReportSpec(GoodputPolicy())).to_dict())["survivor_bias"]
    assert sb["verdict"] == "consistent" and sb["reasons"] == []


def test_a_calm_window_with_nothing_censored_is_consistent_whatever_its_top_gap(tmp_path: Path) -> None:
    """89 successful requests, none censored, the two largest TTFTs far apart: interpolated, the success-only p99
    sat between them, 27 % below the Kaplan-Meier step, and the calm window read optimistic. One quantile
    definition for both estimates makes them equal, and the window consistent."""
    ttfts = [0.03 + 0.001 * i for i in range(87)] + [0.12, 0.16]
    with _store(tmp_path / "s.duckdb", [_success(i, t) for i, t in enumerate(ttfts)]) as store:
        sb = _only(build_report(store.con, ReportSpec(GoodputPolicy())).to_dict())["survivor_bias"]
    assert sb["verdict"] == "consistent" and sb["reasons"] == []
    so, ca = sb["ttft_success_only"], sb["ttft_censoring_aware"]
    assert ca["censored"] == 0
    assert [so[k] for k in ("p50", "p90", "p99")] == [ca[k] for k in ("p50", "p90", "p99")]
    assert so["p99"] == 0.16  # rank ceil(89 * 0.99) = 89: the largest value, not an interpolation


def test_a_gap_sampling_explains_is_not_bias(tmp_path: Path) -> None:
    """60 requests, one random cancel early on: the Kaplan-Meier p90 moves by one step, which Greenwood's band
    covers; the window stays consistent, and the comparison says what it weighed."""
    rng = np.random.default_rng(7)
    ttfts = sorted(float(x) for x in 0.5 * np.exp(0.6 * rng.standard_normal(59)))
    rows = [_success(i, t) for i, t in enumerate(ttfts)] + [cancelled_row(100, waited_s=0.05)]
    with _store(tmp_path / "s.duckdb", rows) as store:
        sb = _only(build_report(store.con, ReportSpec(GoodputPolicy())).to_dict())["survivor_bias"]
    assert sb["verdict"] == "consistent", sb["reasons"]
    p90 = sb["comparisons"]["p90"]
    assert p90["judged"] and not p90["optimistic"]
    assert p90["share_beyond"] - p90["allowed"] < p90["band"]
    assert sb["comparisons"]["p99"]["judged"] is False  # 60 admitted requests: p99 needs 500


def test_rising_shed_fraction_with_an_improving_success_tail_is_flagged(tmp_path: Path) -> None:
    t0 = 1_700_000_000.0
    calm = [_success(i, 1.0 + 0.01 * i, arrival_unix_s=t0 + i * 0.1) for i in range(40)]
    # next window: the slow ones are rejected, the survivors are fast
    shed = [_success(100 + i, 0.3, arrival_unix_s=t0 + 60 + i * 0.1) for i in range(30)]
    shed += [rejected_row(200 + i, arrival_unix_s=t0 + 60 + i * 0.1) for i in range(30)]
    with _store(tmp_path / "s.duckdb", calm + shed) as store:
        rep = build_report(store.con, ReportSpec(GoodputPolicy(window_s=60.0))).to_dict()
    later = rep["groups"][1]["survivor_bias"]
    assert later["verdict"] == "optimistic"
    assert any("shed/cancel fraction rose" in r for r in later["reasons"])


def test_a_shed_fraction_that_rises_by_chance_is_not_a_trend(tmp_path: Path) -> None:
    """Two windows of 60: one cancel, then four (1.7 % -> 6.7 %, a 5-point rise) while the success-only p99
    dips: a rise well inside what two samples of 60 give by chance, so no flag."""
    t0 = 1_700_000_040.0  # a window boundary
    first = [_success(i, 0.5 + 0.01 * i, arrival_unix_s=t0 + i * 0.5) for i in range(59)]
    first += [cancelled_row(90, waited_s=0.2, arrival_unix_s=t0 + 40)]
    second = [_success(100 + i, 0.5 + 0.009 * i, arrival_unix_s=t0 + 60 + i * 0.5) for i in range(56)]
    second += [cancelled_row(190 + i, waited_s=0.2, arrival_unix_s=t0 + 100 + i) for i in range(4)]
    with _store(tmp_path / "s.duckdb", first + second) as store:
        rep = build_report(store.con, ReportSpec(GoodputPolicy(window_s=60.0))).to_dict()
    before, after = (g["survivor_bias"] for g in rep["groups"])
    assert after["shed_cancel_fraction"] - before["shed_cancel_fraction"] >= 0.05
    assert after["ttft_success_only"]["p99"] < before["ttft_success_only"]["p99"]
    assert not any("shed/cancel fraction rose" in r for r in after["reasons"])
    assert after["verdict"] == "consistent"


def test_tokens_report_the_four_counts_and_backpressure_waste(tmp_path: Path) -> None:
    rows = [_success(0, 0.5, n=11, proposed_tokens=20), _success(1, 0.5, n=11, sent_tokens=5)]
    with _store(tmp_path / "s.duckdb", rows) as store:
        tok = _only(build_report(store.con, ReportSpec(GoodputPolicy())).to_dict())["tokens"]
    assert (tok["prompt_tokens"], tok["proposed_tokens"], tok["generated_tokens"], tok["sent_tokens"]) == (
        200, 20, 22, 16)
    assert tok["backpressure_waste_tokens"] == 6


def test_itl_is_reported_from_the_gap_lists(tmp_path: Path) -> None:
    rows = [_success(0, 0.5, itl_s=[0.01, 0.02, 0.03]), _success(1, 0.5, itl_s=[0.04])]
    with _store(tmp_path / "s.duckdb", rows) as store:
        itl = _only(build_report(store.con, ReportSpec(GoodputPolicy())).to_dict())["latency"]["itl_s"]
    assert itl["count"] == 4 and itl["p50"] == pytest.approx(0.025) and itl["max"] == 0.04


def test_grouping_splits_by_the_requested_columns(tmp_path: Path) -> None:
    rows = [_success(0, 0.5, model="a"), _success(1, 0.5, model="b"), rejected_row(2, model="b")]
    with _store(tmp_path / "s.duckdb", rows) as store:
        rep = build_report(store.con, ReportSpec(GoodputPolicy(), by=("model", "finish_reason"))).to_dict()
    assert [(g["keys"]["model"], g["keys"]["finish_reason"], g["attempted"]) for g in rep["groups"]] == [
        ("a", "stop", 1), ("b", "rejected", 1), ("b", "stop", 1)]


def test_bad_policy_and_grouping_name_the_field() -> None:
    with pytest.raises(ConfigurationError, match=r"GoodputPolicy.success.*finished"):
        GoodputPolicy(success=frozenset({"finished"}))
    with pytest.raises(ConfigurationError, match=r"GoodputPolicy.ttft_s"):
        GoodputPolicy(ttft_s=-1.0)
    with pytest.raises(ConfigurationError, match="unknown column 'user'"):
        ReportSpec(GoodputPolicy(), by=("user",))


def test_a_group_that_sheds_most_requests_is_not_called_consistent(tmp_path: Path) -> None:
    rows = [_success(i, 0.2 + 0.001 * i) for i in range(20)] + [rejected_row(100 + i) for i in range(130)]
    with _store(tmp_path / "s.duckdb", rows) as store:
        g = _only(build_report(store.con, ReportSpec(GoodputPolicy())).to_dict())
    sb = g["survivor_bias"]
    # the success-only and censoring-aware TTFT agree (nobody admitted was lost) ...
    assert sb["ttft_censoring_aware"]["p99"] == pytest.approx(sb["ttft_success_only"]["p99"], rel=0.1)
    # ... but 87% of the traffic never got an answer
    assert sb["verdict"] == "optimistic" and any("were rejected" in r for r in sb["reasons"])
    assert g["goodput_fraction"] == pytest.approx(20 / 150)


# ---- the queries: one aggregate; Kaplan–Meier only where something is censored ----------------------

T0 = 1_700_000_000.0  # a multiple of 60


class _Recorder:
    """A connection that records every query and its parameters on the way to DuckDB."""

    def __init__(self, con: Any) -> None:
        self.con = con
        self.queries: list[tuple[str, Any]] = []

    def sql(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self.queries.append((query, kwargs.get("params")))
        return self.con.sql(query, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)


_row_spec = st.tuples(
    st.sampled_from(["a", "b", "o'neil"]),  # a quote in a group key
    st.sampled_from(["ok", "ok", "one", "rejected", "cancel", "itl"]),
    st.one_of(st.sampled_from([0.05, 0.1, 0.5, 2.0, 3.0]), st.floats(0.01, 5)),  # ties, bucket bounds
    st.floats(0.0, 3.0),
    st.integers(0, 600),  # arrival offset, s
)


def _spec_rows(spec: list[tuple[str, str, float, float, int]]) -> list[dict[str, Any]]:
    rows = []
    for i, (model, kind, ttft, decode, offset) in enumerate(spec):
        at = {"model": model, "arrival_unix_s": T0 + offset}
        if kind == "rejected":
            rows.append(rejected_row(i, **at))
        elif kind == "cancel":
            rows.append(cancelled_row(i, waited_s=ttft, **at))
        elif kind == "one":
            rows.append(ok_row(i, queue_s=0.0, ttft_s=ttft, last_token_s=ttft, e2e_s=ttft, generated_tokens=1,
                               sent_tokens=1, **at))
        else:
            rows.append(_success(i, ttft, decode=decode, itl_s=[0.01, decode / 10] if kind == "itl" else None,
                                 **at))
    return rows


_SPECS = [ReportSpec(GoodputPolicy(), by=by) for by in ((), ("model",), ("model", "finish_reason"))]
_SPECS += [ReportSpec(GoodputPolicy(window_s=60.0), by=by) for by in (("finish_reason",), ("model",))]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_row_spec, min_size=1, max_size=50))
def test_every_figure_is_the_same_when_every_group_goes_through_kaplan_meier(
    tmp_path_factory: pytest.TempPathFactory, spec: list[tuple[str, str, float, float, int]],
) -> None:
    # A group without censored rows takes its censoring-aware TTFT from the main aggregate's
    # quantile_disc; forcing every group through the ranking method (the bound of the shortcut set to
    # one row) must give the same report, figure for figure.
    from unittest import mock

    from llmslo.analysis.report import _sql

    with _store(tmp_path_factory.mktemp("km") / "s.duckdb", _spec_rows(spec)) as store:
        for report_spec in _SPECS:
            fast = build_report(store.con, report_spec).to_dict()
            with mock.patch.object(_sql, "inverse_cdf_max_n", lambda quantiles: 1):
                ranked = build_report(store.con, report_spec).to_dict()
            assert fast == ranked


def _km_plain(t: np.ndarray, event: np.ndarray, qs: list[float]) -> list[float | None]:
    """The product-limit estimator written out: S *= 1 - d/n at each event time; first S <= 1 - q."""
    out: list[float | None] = [None] * len(qs)
    s = 1.0
    for u in np.unique(t[event]):
        s *= 1.0 - int(np.sum(event & (t == u))) / int(np.sum(t >= u))
        out = [o if o is not None or s > 1.0 - q + 1e-12 else float(u) for o, q in zip(out, qs, strict=True)]
    return out


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_row_spec, min_size=1, max_size=60))
def test_ttft_figures_match_numpy_and_a_plain_kaplan_meier_per_group(
    tmp_path_factory: pytest.TempPathFactory, spec: list[tuple[str, str, float, float, int]],
) -> None:
    rows = _spec_rows(spec)
    with _store(tmp_path_factory.mktemp("ttft") / "s.duckdb", rows) as store:
        reports = {by: build_report(store.con, ReportSpec(GoodputPolicy(), by=by)).to_dict()
                   for by in (("model",), ("model", "finish_reason"))}
    for by, rep in reports.items():
        for g in rep["groups"]:
            mine = [r for r in rows if all(r[k] == g["keys"][k] for k in by)]
            ttft = np.array([r["ttft_s"] for r in mine if r.get("ttft_s") is not None])
            lat = g["latency"]["ttft_s"]
            assert lat["count"] == ttft.size
            assert [b["count"] for b in lat["buckets"][:-1]] == [
                int(np.sum(ttft <= b["le"])) for b in lat["buckets"][:-1]]  # inclusive bounds
            so = g["survivor_bias"]["ttft_success_only"]
            ok = np.array([r["ttft_s"] for r in mine if r["finish_reason"] in ("stop", "length")
                           and r.get("ttft_s") is not None])
            assert so["count"] == ok.size
            if ok.size:
                # nearest rank, the Kaplan-Meier quantile's definition (docs/definitions.md, "Survivor bias")
                np.testing.assert_allclose([so["p50"], so["p90"], so["p99"]],
                                           np.percentile(ok, [50, 90, 99], method="inverted_cdf"),
                                           rtol=1e-12, atol=1e-12)
            else:
                assert so["p50"] is None and so["p99"] is None
            admitted = [r for r in mine if r["finish_reason"] != "rejected"]
            km = g["survivor_bias"]["ttft_censoring_aware"]
            t = np.array([r["ttft_s"] if r.get("ttft_s") is not None else r["e2e_s"] for r in admitted])
            event = np.array([r.get("ttft_s") is not None for r in admitted], dtype=bool)
            assert (km["count"], km["events"], km["censored"]) == (t.size, int(event.sum()), int((~event).sum()))
            want = _km_plain(t, event, [0.5, 0.9, 0.99])
            for label, w in zip(("p50", "p90", "p99"), want, strict=True):
                assert (km[label] is None and w is None) or km[label] == pytest.approx(w, abs=1e-12), (label, km)
            cens = t[~event] if t.size else t
            assert km["at_least_s"] == (float(cens.max()) if cens.size else None)


def test_kaplan_meier_runs_only_over_the_groups_with_censored_rows(tmp_path: Path) -> None:
    rows = [_success(i, 0.1 * (i % 7), model="a") for i in range(30)]
    rows += [_success(100 + i, 0.2 + 0.01 * i, model="b'c") for i in range(30)]
    rows += [cancelled_row(200 + i, waited_s=5.0 + i, model="b'c") for i in range(5)]
    rows += [rejected_row(300 + i, model="d") for i in range(5)]
    with _store(tmp_path / "s.duckdb", rows) as store:
        rec = _Recorder(store.con)
        rep = build_report(rec, ReportSpec(GoodputPolicy(), by=("model",))).to_dict()  # type: ignore[arg-type]
        km_queries = [(q, p) for q, p in rec.queries if "_km_" in q]
        assert len(km_queries) == 1
        (query, params), = km_queries
        assert params == [["b'c"]]  # the one group with a censored row
        assert "model IN ('b''c')" in query  # and a filter that DuckDB pushes into the scan
        rec.queries.clear()
        build_report(rec, ReportSpec(GoodputPolicy(), by=("finish_reason",)))  # type: ignore[arg-type]
        assert [p for q, p in rec.queries if "_km_" in q] == [[["client_cancel"]]]
    # without any censored row there is no Kaplan-Meier query at all
    with _store(tmp_path / "clean.duckdb", [r for r in rows if r["finish_reason"] != "client_cancel"]) as store:
        rec = _Recorder(store.con)
        clean = build_report(rec, ReportSpec(GoodputPolicy(), by=("model",))).to_dict()  # type: ignore[arg-type]
        assert not [q for q, _ in rec.queries if "_km_" in q]
    assert [g["survivor_bias"]["ttft_censoring_aware"]["count"] for g in clean["groups"]] == [30, 30, 0]
    groups = {g["keys"]["model"]: g["survivor_bias"]["ttft_censoring_aware"] for g in rep["groups"]}
    a = sorted(0.1 * (i % 7) for i in range(30))
    assert groups["a"]["p50"] == a[14] and groups["a"]["p90"] == a[26] and groups["a"]["p99"] == a[29]
    assert groups["a"]["censored"] == 0 and groups["a"]["at_least_s"] is None
    assert groups["b'c"]["censored"] == 5 and groups["b'c"]["at_least_s"] == 9.0
    assert groups["d"]["count"] == 0 and groups["d"]["p50"] is None


def test_an_interval_null_everywhere_costs_no_aggregate_and_reports_zero_counts(tmp_path: Path) -> None:
    rows = [_success(i, 0.3 + 0.01 * i) for i in range(10)]  # no client_ttft_s, no itl_s anywhere
    with _store(tmp_path / "s.duckdb", rows) as store:
        rec = _Recorder(store.con)
        rep = build_report(rec, ReportSpec(GoodputPolicy())).to_dict()  # type: ignore[arg-type]
    aggregates = [q for q, _ in rec.queries if "quantile_cont" in q]
    assert len(aggregates) == 1 and "client_ttft_s" not in aggregates[0]
    assert not any("unnest(itl_s)" in q for q, _ in rec.queries)
    lat = _only(rep)["latency"]
    for name in ("client_ttft_s", "itl_s"):
        assert lat[name]["count"] == 0 and lat[name]["mean"] is None and lat[name]["max"] is None
        assert lat[name]["p50"] is None and {b["count"] for b in lat[name]["buckets"]} == {0}
    assert lat["ttft_s"]["count"] == 10


def test_bucket_counts_are_inclusive_at_each_bound(tmp_path: Path) -> None:
    from llmslo.analysis.report._sql import bucket_bounds

    policy = GoodputPolicy()
    bounds = bucket_bounds("ttft_s", policy)
    values = [b for b in bounds] + [float(np.nextafter(b, np.inf)) for b in bounds] + [1e-4, 1e4]
    rows = [_success(i, v) for i, v in enumerate(values)]
    with _store(tmp_path / "s.duckdb", rows) as store:
        buckets = _only(build_report(store.con, ReportSpec(policy)).to_dict())["latency"]["ttft_s"]["buckets"]
    assert [b["le"] for b in buckets] == [*bounds, "+Inf"]
    assert [b["count"] for b in buckets] == [sum(v <= b for v in values) for b in bounds] + [len(values)]
