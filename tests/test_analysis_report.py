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


def test_windows_align_to_unix_time_and_count_requests_still_running_as_in_flight(tmp_path: Path) -> None:
    t0 = 1_700_000_000.0  # a multiple of 10
    rows = [
        _success(0, 0.5, arrival_unix_s=t0 + 1.0),
        _success(1, 0.5, arrival_unix_s=t0 + 8.0, decode=5.0),  # finishes at t0+13.5: in flight at t0+10
        _success(2, 0.5, arrival_unix_s=t0 + 12.0),
    ]
    with _store(tmp_path / "s.duckdb", rows) as store:
        rep = build_report(store.con, ReportSpec(GoodputPolicy(window_s=10.0))).to_dict()
    first, second = rep["groups"]
    assert first["keys"]["window_start_unix_s"] == t0 and second["keys"]["window_start_unix_s"] == t0 + 10
    assert (first["attempted"], first["in_flight"], first["good"], first["goodput_fraction"]) == (2, 1, 1, 1.0)
    assert first["request_goodput_per_s"] == pytest.approx(0.1)
    assert first["token_goodput_per_s"] == pytest.approx(11 / 10)
    assert rep["rate_basis"] == {"kind": "window", "seconds": 10.0}
    acc = first["survivor_bias"]["accounting"]
    assert acc["balanced"] and acc["admitted"] == acc["stop"] + acc["in_flight"]


def test_without_a_window_rates_divide_by_the_span_and_say_so(tmp_path: Path) -> None:
    rows = [_success(0, 0.5, arrival_unix_s=100.0), _success(1, 0.5, arrival_unix_s=110.0)]
    with _store(tmp_path / "s.duckdb", rows) as store:
        rep = build_report(store.con, ReportSpec(GoodputPolicy())).to_dict()
    assert rep["rate_basis"]["kind"] == "span"
    assert rep["rate_basis"]["seconds"] == pytest.approx(110.0 + 1.51 - 100.0)
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
    assert any("p99" in r for r in sb["reasons"])


def test_survivor_bias_is_consistent_when_nobody_is_lost(tmp_path: Path) -> None:
    with _store(tmp_path / "s.duckdb", [_success(i, 0.2 + 0.01 * i) for i in range(50)]) as store:
        sb = _only(build_report(store.con, ReportSpec(GoodputPolicy())).to_dict())["survivor_bias"]
    assert sb["verdict"] == "consistent" and sb["reasons"] == []


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
