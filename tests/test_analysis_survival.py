"""Kaplan–Meier quantiles in SQL (llmslo.analysis.report._survival) against numpy and a plain Python KM."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import duckdb
import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmslo.analysis.report import _survival as survival
from llmslo.analysis.report._survival import (
    KM_TOLERANCE,
    inverse_cdf_max_n,
    km_quantiles,
    km_quantiles_by_id_sql,
    km_quantiles_sql,
    quantile_decimal,
    quantile_label,
)

# Quantiles for which numpy's "inverted_cdf" has no float artefact of its own for n <= 3000
# (see test_no_censoring_is_the_exact_inverse_cdf_where_numpy_rounds for one that has).
QS = [0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999]
LABELS = [quantile_label(q) for q in QS]
_CON = duckdb.connect()  # shared: a fresh connection costs more than a small query


def _run(
    t: Sequence[float],
    event: Sequence[bool],
    qs: Sequence[float],
    groups: dict[str, Sequence[object]] | None = None,
) -> pl.DataFrame:
    data: dict[str, object] = dict(groups or {})
    data["t"] = pl.Series("t", list(t), dtype=pl.Float64)
    data["event"] = pl.Series("event", list(event), dtype=pl.Boolean)
    frame = pl.DataFrame(data)
    _CON.register("_src", frame)
    try:
        return km_quantiles(_CON, "SELECT * FROM _src", list((groups or {}).keys()), qs)
    finally:
        _CON.unregister("_src")


def km_reference(t: np.ndarray, event: np.ndarray, qs: Sequence[float]) -> list[float | None]:
    """Product-limit estimator, written out: S *= 1 - d/n at each distinct event time."""
    result: list[float | None] = [None] * len(qs)
    s = 1.0
    for u in np.unique(t):
        d = int(np.sum(event & (t == u)))
        if d == 0:
            continue
        n = int(np.sum(t >= u))
        s *= 1.0 - d / n
        for i, q in enumerate(qs):
            if result[i] is None and s <= (1.0 - q) + 1e-12:
                result[i] = float(u)
    return result


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= 1e-12


# --- labels -------------------------------------------------------------------------------------


def test_quantile_label() -> None:
    assert [quantile_label(q) for q in (0.5, 0.9, 0.95, 0.99, 0.999, 0.9999)] == [
        "p50", "p90", "p95", "p99", "p999", "p9999",
    ]
    assert quantile_label(0.25) == "p25"
    assert quantile_label(0.05) == "p05"
    assert quantile_label(0.001) == "p001"
    assert quantile_label(0.0999) != quantile_label(0.999)
    for bad in (0.0, 1.0, -0.1, 1.5, math.nan, math.inf):
        with pytest.raises(ValueError):
            quantile_label(bad)


# --- (1) no censoring = inverse empirical CDF ----------------------------------------------------

_times = st.lists(
    st.one_of(
        st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False),
        st.sampled_from([0.0, 0.25, 1.0, 3.5]),  # frequent exact ties
    ),
    min_size=1,
    max_size=300,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_times)
def test_no_censoring_equals_numpy_inverted_cdf(xs: list[float]) -> None:
    df = _run(xs, [True] * len(xs), QS)
    row = df.row(0, named=True)
    expected = np.quantile(np.array(xs), QS, method="inverted_cdf")
    for label, want in zip(LABELS, expected, strict=True):
        assert row[label] == float(want), (label, row[label], want)
    assert row["n"] == row["n_events"] == len(xs)
    assert row["n_censored"] == 0
    assert row["max_censored_t"] is None


def test_no_censoring_is_the_exact_inverse_cdf_where_numpy_rounds() -> None:
    # 100 * 0.07 is 7.000000000000001 in floats, so numpy's inverted_cdf takes the 8th value; the
    # exact inverse CDF (smallest x with F(x) >= 0.07, F(x_(7)) = 7/100) is the 7th, as KM gives.
    xs = [float(i) for i in range(1, 101)]
    got = _run(xs, [True] * 100, [0.07])["p07"][0]
    assert np.quantile(np.array(xs), 0.07, method="inverted_cdf") == 8.0
    assert got == 7.0
    exact = next(x for k, x in enumerate(xs, 1) if Fraction(k, 100) >= Fraction(7, 100))
    assert got == exact


# --- (2) against a plain product-limit implementation -------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_matches_reference_km_with_ties_and_censoring_per_group(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    groups = rng.choice(np.array(["a", "b", "c"]), size=n)
    # Times on a coarse grid so that events and censorings tie, within and across kinds.
    t = np.round(rng.exponential(2.0, size=n), 1)
    event = rng.random(n) < rng.uniform(0.2, 1.0)
    qs = [0.1, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999]
    df = _run(t.tolist(), event.tolist(), qs, {"g": groups.tolist()})
    assert df["g"].to_list() == sorted(set(groups.tolist()))
    for row in df.iter_rows(named=True):
        sel = groups == row["g"]
        want = km_reference(t[sel], event[sel], qs)
        got = [row[quantile_label(q)] for q in qs]
        assert all(_close(a, b) for a, b in zip(got, want, strict=True)), (row["g"], got, want)
        assert row["n"] == int(sel.sum())
        assert row["n_events"] == int(event[sel].sum())
        assert row["n_censored"] == int((~event[sel]).sum())
        cens = t[sel & ~event]
        assert row["max_censored_t"] == (float(cens.max()) if cens.size else None)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.booleans()), min_size=1, max_size=40))
def test_matches_reference_km_hypothesis(rows: list[tuple[int, bool]]) -> None:
    t = np.array([float(x) / 2 for x, _ in rows])
    event = np.array([e for _, e in rows])
    qs = [0.2, 0.5, 0.75, 0.9, 0.99]
    row = _run(t.tolist(), event.tolist(), qs).row(0, named=True)
    want = km_reference(t, event, qs)
    got = [row[quantile_label(q)] for q in qs]
    assert all(_close(a, b) for a, b in zip(got, want, strict=True)), (rows, got, want)


# --- (3) a hand-worked example --------------------------------------------------------------------


def test_hand_worked_example() -> None:
    # t (s):  1  2  2  3  4  4  5  6  7  8      (E = first token at t, C = gave up at t)
    #         E  E  C  E  E  C  C  E  C  E
    # u=1: n=10 d=1  S = 9/10             = 0.9
    # u=2: n=9  d=1  S = 0.9 · 8/9        = 0.8    (the censoring at 2 is still at risk at 2)
    # u=3: n=7  d=1  S = 0.8 · 6/7        = 0.6857
    # u=4: n=6  d=1  S = 24/35 · 5/6      = 4/7 = 0.5714
    # u=6: n=3  d=1  S = 4/7 · 2/3        = 8/21 = 0.3810
    # u=8: n=1  d=1  S = 0
    # p20: S <= 0.8 first at 2 (an exact tie: needs the tolerance), p25 → 3, p50 → 6, p60 → 6, p90 → 8.
    # Dropping the censored rows instead (events 1 2 3 4 6 8) would give a median of 3: survivor bias.
    t = [1, 2, 2, 3, 4, 4, 5, 6, 7, 8]
    e = [True, True, False, True, True, False, False, True, False, True]
    row = _run([float(x) for x in t], e, [0.2, 0.25, 0.5, 0.6, 0.9]).row(0, named=True)
    assert row == {
        "n": 10, "n_events": 6, "n_censored": 4,
        "p20": 2.0, "p25": 3.0, "p50": 6.0, "p60": 6.0, "p90": 8.0,
        "max_censored_t": 7.0,
    }
    success_only = np.quantile(np.array([x for x, ev in zip(t, e, strict=True) if ev]), 0.5,
                               method="inverted_cdf")
    assert success_only == 3.0


# --- (4) heavy censoring ----------------------------------------------------------------------------


def test_heavy_censoring_gives_null_and_max_censored_t() -> None:
    # S(1) = 4/5 and nothing after: the curve never gets to 0.5.
    row = _run([1.0, 2.0, 3.0, 4.0, 5.0], [True, False, False, False, False], [0.1, 0.2, 0.5, 0.99]).row(
        0, named=True
    )
    assert row["p10"] == 1.0 and row["p20"] == 1.0
    assert row["p50"] is None and row["p99"] is None
    assert row["max_censored_t"] == 5.0
    assert (row["n"], row["n_events"], row["n_censored"]) == (5, 1, 4)


def test_all_censored_group() -> None:
    row = _run([3.0, 9.0], [False, False], [0.5]).row(0, named=True)
    assert row == {"n": 2, "n_events": 0, "n_censored": 2, "p50": None, "max_censored_t": 9.0}


def test_censored_tie_after_last_event_keeps_events_first() -> None:
    # At t=2 one event and one censoring: n=2, d=1 → S = 1/2 · ... the censoring is at risk at 2.
    row = _run([1.0, 2.0, 2.0], [True, True, False], [0.5, 0.9]).row(0, named=True)
    # u=1: S = 2/3; u=2: n=2, d=1 → S = 1/3. p50 → 2; p90 never.
    assert row["p50"] == 2.0 and row["p90"] is None


# --- (5) groups ----------------------------------------------------------------------------------------


def test_multiple_group_columns_and_null_group() -> None:
    model = ["m1", "m1", "m1", "m2", "m2", "m1", None, None]
    tenant = ["a", "a", "b", "a", "a", "a", "a", "a"]
    t = [1.0, 2.0, 5.0, 0.5, 0.7, 3.0, 4.0, 6.0]
    e = [True, False, True, True, True, True, False, True]
    df = _run(t, e, [0.5], {"model": model, "tenant": tenant})
    rows = {(r["model"], r["tenant"]): r for r in df.iter_rows(named=True)}
    assert set(rows) == {("m1", "a"), ("m1", "b"), ("m2", "a"), (None, "a")}
    # m1/a: 1 E, 2 C, 3 E → S(1)=2/3, S(3)=0 → p50 = 3
    assert rows[("m1", "a")]["p50"] == 3.0 and rows[("m1", "a")]["n"] == 3
    assert rows[("m1", "b")]["p50"] == 5.0
    assert rows[("m2", "a")]["p50"] == 0.5
    assert rows[(None, "a")]["p50"] == 6.0 and rows[(None, "a")]["max_censored_t"] == 4.0


def test_empty_group_cols_is_one_overall_row() -> None:
    rng = np.random.default_rng(7)
    t = np.round(rng.exponential(1.0, 500), 2)
    e = rng.random(500) < 0.7
    qs = [0.5, 0.9, 0.99]
    df = _run(t.tolist(), e.tolist(), qs)
    assert df.height == 1
    assert df.columns == ["n", "n_events", "n_censored", "p50", "p90", "p99", "max_censored_t"]
    got = [df[quantile_label(q)][0] for q in qs]
    assert all(_close(a, b) for a, b in zip(got, km_reference(t, e, qs), strict=True))


def test_empty_source() -> None:
    con = duckdb.connect()
    q = "SELECT 'x' AS g, 1.0 AS t, TRUE AS event WHERE FALSE"
    overall = km_quantiles(con, q, [], [0.5])
    assert overall.to_dicts() == [
        {"n": 0, "n_events": 0, "n_censored": 0, "p50": None, "max_censored_t": None}
    ]
    assert km_quantiles(con, q, ["g"], [0.5]).height == 0


def test_schema_params_and_no_quantiles() -> None:
    con = duckdb.connect()
    con.sql("CREATE TABLE r AS SELECT i % 2 AS g, i::DOUBLE AS t, i % 3 <> 0 AS event FROM range(20) x(i)")
    df = km_quantiles(con, "SELECT g, t, event FROM r WHERE t < ?", ["g"], [0.5, 0.999], params=[10])
    assert df.schema == pl.Schema(
        {"g": pl.Int64, "n": pl.Int64, "n_events": pl.Int64, "n_censored": pl.Int64,
         "p50": pl.Float64, "p999": pl.Float64, "max_censored_t": pl.Float64}
    )
    assert df["n"].to_list() == [5, 5]
    bare = km_quantiles(con, "SELECT g, t, event FROM r", ["g"], [])
    assert bare.columns == ["g", "n", "n_events", "n_censored", "max_censored_t"]


# --- input checks ----------------------------------------------------------------------------------


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        km_quantiles_sql("src", [], [0.5, 0.5])
    with pytest.raises(ValueError):
        km_quantiles_sql("src", ["t"], [0.5])
    with pytest.raises(ValueError):
        km_quantiles_sql("src", ["p50"], [0.5])
    with pytest.raises(ValueError):
        km_quantiles_sql("src", ["g", "g"], [0.5])
    with pytest.raises(ValueError):
        km_quantiles_sql("src", [], [1.0])


@pytest.mark.parametrize(
    "values",
    ["(NULL::DOUBLE, TRUE)", "(-1.0, TRUE)", "('nan'::DOUBLE, FALSE)", "('inf'::DOUBLE, TRUE)",
     "(1.0, NULL::BOOLEAN)"],
)
def test_invalid_rows_raise(values: str) -> None:
    con = duckdb.connect()
    src = f"SELECT * FROM (VALUES (0.5, TRUE), {values}) v(t, event)"
    with pytest.raises(duckdb.Error, match="km_quantiles"):
        km_quantiles(con, src, [], [0.5])


def test_source_may_be_a_table_name_or_a_query() -> None:
    con = duckdb.connect()
    con.sql("CREATE SCHEMA s")
    con.sql("CREATE TABLE s.r AS SELECT i::DOUBLE AS t, i % 4 <> 0 AS event FROM range(1, 11) x(i)")
    by_name = km_quantiles(con, "s.r", [], [0.5, 0.9])
    assert by_name.equals(km_quantiles(con, "FROM s.r", [], [0.5, 0.9]))
    assert by_name.equals(km_quantiles(con, 'SELECT * FROM "s"."r"', [], [0.5, 0.9]))
    t = np.arange(1.0, 11.0)
    assert [by_name["p50"][0], by_name["p90"][0]] == km_reference(t, t % 4 != 0, [0.5, 0.9])


# --- (6) groups without censoring: quantile_disc with DECIMAL fractions --------------------------------

# Decimal quantiles for the shortcut, with 0.07 among them: there numpy's float index rounds the wrong way
# (see above) but quantile_disc's integer arithmetic does not.
DISC_QS = [0.07, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999]
_ties_and_small = st.lists(
    st.one_of(
        st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.5]),  # frequent exact ties
        st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False),
    ),
    min_size=1,
    max_size=250,
)


def _exact_inverse_cdf(xs: Sequence[float], q: float) -> float:
    """x_(ceil(n q)) with q the decimal it is written as: the smallest x with F(x) >= q, exactly."""
    return sorted(xs)[math.ceil(len(xs) * Fraction(quantile_decimal(q))) - 1]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ties_and_small)
def test_quantile_disc_with_decimal_fractions_is_the_km_quantile_without_censoring(xs: list[float]) -> None:
    frame = pl.DataFrame({"t": pl.Series(xs, dtype=pl.Float64)})
    _CON.register("_disc_src", frame)
    try:
        fractions = ", ".join(quantile_decimal(q) for q in DISC_QS)
        (disc,) = _CON.sql(f"SELECT quantile_disc(t, [{fractions}]) FROM _disc_src").fetchall()[0]
        ranked = _CON.sql(km_quantiles_by_id_sql("SELECT 7 AS _km_gid, t, TRUE AS event FROM _disc_src",
                                                 DISC_QS)).fetchall()
    finally:
        _CON.unregister("_disc_src")
    exact = [_exact_inverse_cdf(xs, q) for q in DISC_QS]
    assert disc == exact
    # the KM rule itself (ranking method, S <= 1 - q + 1e-12), no shortcut: the same order statistics
    ((gid, n, n_events, n_censored, *km, max_censored),) = ranked
    assert (gid, n, n_events, n_censored, max_censored) == (7, len(xs), len(xs), 0, None)
    assert km == exact
    # and numpy's inverted_cdf wherever numpy's own float index is right (all but 0.07 here)
    numpy = np.quantile(np.array(xs), DISC_QS[1:], method="inverted_cdf")
    assert disc[1:] == [float(v) for v in numpy]


def test_quantile_decimal_and_the_exactness_bound() -> None:
    assert [quantile_decimal(q) for q in (0.5, 0.99, 0.999, 1e-7)] == ["0.5", "0.99", "0.999", "0.0000001"]
    assert inverse_cdf_max_n([0.5, 0.9, 0.99]) == 10**9
    assert inverse_cdf_max_n([0.5]) == 10**10
    assert inverse_cdf_max_n([0.999]) == 10**8
    assert inverse_cdf_max_n([1 / 3]) == 0  # 16 decimals: no shortcut
    assert inverse_cdf_max_n([]) == 0
    assert KM_TOLERANCE == 10.0**-12
    with pytest.raises(ValueError):
        quantile_decimal(1.0)


def _km_rule_position(n: int, q: float) -> int:
    """The 1-based position the KM rule picks without censoring, in the floats the SQL uses: the
    smallest k with (n - k) / n <= (1 - q) + 1e-12 (the row k has descending rank a = n - k + 1)."""
    thr = (1.0 - q) + KM_TOLERANCE
    k = max(1, math.ceil(n * Fraction(quantile_decimal(q))) - 3)
    while float(n - k) / n > thr:
        k += 1
    return k


def test_km_rule_equals_ceil_n_q_below_the_bound_and_not_far_above_it() -> None:
    qs = [0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999]
    for q in qs:
        exact = Fraction(quantile_decimal(q))
        bound = inverse_cdf_max_n([q])
        for n in [*range(1, 3001), 10**6 + 1, 10**7 - 1, bound // 7, bound - 1]:
            assert _km_rule_position(n, q) == math.ceil(n * exact), (q, n)
    # Ten times the bound for 0.99 the tolerance wins: n = 10^10 + 99 puts n q 0.99 above an integer,
    # (n q - k) / n is about 1e-12, and the KM rule takes the order statistic below x_(ceil(n q)).
    n = 10**10 + 99
    assert _km_rule_position(n, 0.99) == math.ceil(n * Fraction("0.99")) - 1


@pytest.mark.parametrize("seed", range(6))
def test_the_shortcut_and_the_ranking_method_agree_per_group(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Groups a and b have no censoring (quantile_disc), c has some (ranking); forcing every group through
    # the ranking method changes nothing.
    rng = np.random.default_rng(100 + seed)
    n = 600
    groups = rng.choice(np.array(["a", "b", "c"]), size=n)
    t = np.round(rng.exponential(2.0, size=n), 1)
    event = (groups != "c") | (rng.random(n) < 0.6)
    qs = [0.1, 0.5, 0.9, 0.95, 0.99]
    shortcut = _run(t.tolist(), event.tolist(), qs, {"g": groups.tolist()})
    monkeypatch.setattr(survival, "inverse_cdf_max_n", lambda quantiles: 0)
    ranked = _run(t.tolist(), event.tolist(), qs, {"g": groups.tolist()})
    assert shortcut.equals(ranked)
    for row in shortcut.iter_rows(named=True):
        sel = groups == row["g"]
        want = km_reference(t[sel], event[sel], qs)
        assert all(_close(row[quantile_label(q)], w) for q, w in zip(qs, want, strict=True)), row


def test_ranking_by_id_matches_the_reference_with_censoring() -> None:
    rng = np.random.default_rng(5)
    n = 900
    gid = rng.integers(0, 4, size=n)
    t = np.round(rng.exponential(1.5, size=n), 1)
    event = rng.random(n) < np.array([1.0, 0.8, 0.4, 0.05])[gid]
    qs = [0.5, 0.9, 0.99]
    frame = pl.DataFrame({"_km_gid": gid, "t": t, "event": event})
    _CON.register("_by_id_src", frame)
    try:
        rows = _CON.sql(km_quantiles_by_id_sql("_by_id_src", qs)).fetchall()
    finally:
        _CON.unregister("_by_id_src")
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    for g, n_rows, n_events, n_censored, *got, max_censored in rows:
        sel = gid == g
        assert (n_rows, n_events, n_censored) == (sel.sum(), event[sel].sum(), (~event[sel]).sum())
        assert all(_close(a, b) for a, b in zip(got, km_reference(t[sel], event[sel], qs), strict=True))
        cens = t[sel & ~event]
        assert max_censored == (float(cens.max()) if cens.size else None)
    with pytest.raises(ValueError):
        km_quantiles_by_id_sql("_by_id_src", [])


def _greenwood_reference(t: np.ndarray, event: np.ndarray, x: float) -> tuple[float, float]:
    """Kaplan-Meier survival and Greenwood's sum at ``x``, by the textbook product over distinct event times."""
    s, gw = 1.0, 0.0
    for u in sorted(set(t[event].tolist())):
        if u > x:
            break
        d = int(((t == u) & event).sum())
        n = int((t >= u).sum())
        s *= 1.0 - d / n
        gw += d / (n * (n - d)) if n > d else 0.0
    return s, gw


@pytest.mark.parametrize("seed", range(4))
def test_the_survivor_comparison_matches_a_plain_kaplan_meier_and_greenwood(seed: int) -> None:
    """Per group: the success-only nearest-rank quantile, and the survival and Greenwood's sum there, by DuckDB's
    ranking method and by ClickHouse's arrays (chdb), equal the textbook product (with ties)."""
    pytest.importorskip("chdb", reason="the ClickHouse half needs chdb (the dev extra)")
    from llmslo.analysis.databases import ClickHouseDatabase
    from llmslo.analysis.databases._clickhouse import km_quantiles_by_group_sql
    from llmslo.tests._databases_support import fresh_clickhouse

    rng = np.random.default_rng(seed)
    n = 400
    t = np.round(rng.lognormal(size=n), 1)  # coarse: many ties
    event = rng.random(n) > 0.15
    success = event & (rng.random(n) > 0.1)
    qs = [0.5, 0.9, 0.99]
    con = duckdb.connect()
    con.execute("CREATE TABLE s (_km_gid INTEGER, t DOUBLE, event BOOLEAN, success BOOLEAN)")
    con.executemany("INSERT INTO s VALUES (0, ?, ?, ?)",
                    [[float(a), bool(b), bool(c)] for a, b, c in zip(t, event, success, strict=True)])
    rel = con.sql(survival.km_quantiles_by_id_sql("s", qs, success=True))
    duck = dict(zip(rel.columns, rel.fetchall()[0], strict=True))
    values = ",".join(f"({float(a)!r},{int(b)},{int(c)})" for a, b, c in zip(t, event, success, strict=True))
    source = f"SELECT c1 AS t, c2 = 1 AS event, c3 = 1 AS success FROM values({values})"
    with fresh_clickhouse() as store:
        (click,) = ClickHouseDatabase(store).rows(km_quantiles_by_group_sql(source, [], qs, ["p50", "p90", "p99"],
                                                                            success=True))
    for q, label in zip(qs, ["p50", "p90", "p99"], strict=True):
        so = float(np.quantile(t[success], q, method="inverted_cdf"))
        s_ref, gw_ref = _greenwood_reference(t, event, so)
        for got in (duck, click):
            assert got[f"so_{label}"] == so
            assert got[f"s_at_{label}"] == pytest.approx(s_ref, rel=1e-12, abs=1e-15)
            assert got[f"gw_at_{label}"] == pytest.approx(gw_ref, rel=1e-12, abs=1e-15)
