"""The primitives on ClickHouse against DuckDB and numpy: exact quantiles past ClickHouse's sampling size,
Kaplan–Meier by one array per group, the KS scan's inputs, and no sampled ``quantile`` anywhere."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmslo.analysis import (
    AnomalyConfig,
    GoodputPolicy,
    ReportSpec,
    Store,
    build_report,
    detect_anomalies,
    polars_schema,
)
from llmslo.analysis.databases import ClickHouseDatabase, DuckDBDatabase, km_quantiles_by_group_sql
from llmslo.analysis.report import km_quantiles
from llmslo.telemetry import COLUMNS
from llmslo.tests._databases_support import copy_to_clickhouse, differences, fresh_clickhouse
from llmslo.tests._rows import cancelled_row, ok_row, rejected_row

T0 = 1_700_000_000.0


def _store(path: Path, rows: list[dict[str, Any]]) -> Store:
    store = Store.open(path)
    full = [{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows]
    store.ingest_frame(pl.DataFrame(full, schema=polars_schema()))
    return store


class _Recording(ClickHouseDatabase):
    """A ClickHouse database that keeps every query it runs."""

    queries: list[str]

    def rows(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        self.queries.append(sql)
        return super().rows(sql, params)

    def tuples(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        self.queries.append(sql)
        return super().tuples(sql, params)


def test_quantiles_stay_exact_beyond_clickhouses_sampling_size(tmp_path: Path) -> None:
    # 20,000 distinct TTFTs: ClickHouse's plain quantile keeps a sample of 8,192 and would be off
    rng = np.random.default_rng(7)
    ttft = rng.lognormal(-1.0, 1.0, 20_000).round(9)
    rows = [ok_row(i, queue_s=0.0, ttft_s=float(t), last_token_s=float(t) + 1, e2e_s=float(t) + 1.5)
            for i, t in enumerate(ttft)]
    with _store(tmp_path / "s.duckdb", rows) as store, fresh_clickhouse() as ch:
        copy_to_clickhouse(store.con, ch)
        database = _Recording(ch)
        database.queries = []
        lat = build_report(database, ReportSpec(GoodputPolicy())).to_dict()["groups"][0]["latency"]["ttft_s"]
        np.testing.assert_allclose([lat["p50"], lat["p90"], lat["p95"], lat["p99"]],
                                   np.percentile(ttft, [50, 90, 95, 99]), rtol=1e-12, atol=0)
        sampled = ch.client.query_arrow("SELECT quantiles(0.5, 0.9, 0.95, 0.99)(ttft_s) AS q FROM request_summaries")
        assert sampled.column("q")[0].as_py() != [lat["p50"], lat["p90"], lat["p95"], lat["p99"]]
    used = [q for q in database.queries if "quantile" in q.lower()]
    assert used and not any(re.search(r"\bquantiles?\(", q) for q in used)
    assert all("quantilesExactInclusive" in q for q in used if "ttft_s__q" in q)


_times = st.lists(st.tuples(st.sampled_from(["a", "b", "o'c"]), st.sampled_from([0.5, 1.0, 2.0, 3.0]) | st.floats(0, 9),
                            st.booleans()), min_size=1, max_size=60)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_times)
def test_kaplan_meier_by_array_equals_duckdbs_ranking_with_ties_and_censoring(rows: list[tuple[str, float, bool]]
                                                                                ) -> None:
    import duckdb

    qs, labels = [0.5, 0.9, 0.99], ["p50", "p90", "p99"]
    frame = pl.DataFrame({"g": [r[0] for r in rows], "t": [float(r[1]) for r in rows], "event": [r[2] for r in rows]})
    con = duckdb.connect()
    con.register("src", frame.to_arrow())
    want = km_quantiles(con, "SELECT * FROM src", ["g"], qs).to_dicts()
    with fresh_clickhouse() as ch:
        ch.client.command("CREATE TABLE src (g String, t Float64, event Bool) ENGINE = MergeTree ORDER BY g")
        ch.client.insert_arrow("src", frame.to_arrow())
        got = ClickHouseDatabase(ch).rows(km_quantiles_by_group_sql("SELECT * FROM src", ["g"], qs, labels))
    assert differences(want, got) == []


def test_kaplan_meier_counts_a_censoring_at_an_event_time_after_the_event() -> None:
    # a tie of an event and a censoring at 2 s: the censored row is still at risk at 2 s
    frame = pl.DataFrame({"t": [1.0, 2.0, 2.0, 3.0], "event": [True, True, False, True]})
    with fresh_clickhouse() as ch:
        ch.client.command("CREATE TABLE src (t Float64, event Bool) ENGINE = MergeTree ORDER BY t")
        ch.client.insert_arrow("src", frame.to_arrow())
        sql = km_quantiles_by_group_sql("SELECT * FROM src", [], [0.5, 0.6], ["p50", "p60"])
        (row,) = ClickHouseDatabase(ch).rows(sql)
    # S(1) = 3/4, S(2) = 3/4 * 2/3 = 1/2 (three at risk at 2 s, the censored one among them), S(3) = 0;
    # counting the censoring first would give S(2) = 3/8 and a p60 of 2 s
    assert (row["n"], row["n_events"], row["n_censored"], row["max_censored_t"]) == (4, 3, 1, 2.0)
    assert (row["p50"], row["p60"]) == (2.0, 3.0)


def test_the_tolerance_of_both_kaplan_meier_forms_is_one() -> None:
    from llmslo.analysis.databases import _clickhouse
    from llmslo.analysis.report import _survival

    assert _clickhouse.KM_TOLERANCE == _survival.KM_TOLERANCE


def test_the_ks_scan_finds_the_same_shift_on_both_databases(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    rows = []
    for i in range(6_000):
        slow = 0.8 if 4_000 <= i < 5_000 else 0.0  # a shift for ~17 minutes
        ttft = float(0.2 + slow + rng.exponential(0.05))
        rows.append(ok_row(i, arrival_unix_s=T0 + i, queue_s=0.0, ttft_s=ttft, last_token_s=ttft + 1,
                           e2e_s=ttft + 1.1, model="a" if i % 3 else "b"))
    rows += [cancelled_row(10_000 + i, arrival_unix_s=T0 + i) for i in range(0, 6_000, 50)]
    rows += [rejected_row(20_000 + i, arrival_unix_s=T0 + i) for i in range(0, 6_000, 70)]
    cfg = AnomalyConfig(window_s=300.0, min_samples=50)
    with _store(tmp_path / "s.duckdb", rows) as store, fresh_clickhouse() as ch:
        copy_to_clickhouse(store.con, ch)
        duck = detect_anomalies(store.con, cfg, metrics=("ttft", "e2e", "tpot"), by=("model",))
        click = detect_anomalies(ClickHouseDatabase(ch), cfg, metrics=("ttft", "e2e", "tpot"), by=("model",))
    assert duck.findings, "the shift is found"
    assert differences(duck.to_dict(), click.to_dict()) == []
    assert {k: [w.__dict__ for w in v] for k, v in duck.windows.items()} == \
        {k: [w.__dict__ for w in v] for k, v in click.windows.items()}


def test_a_duckdb_engine_and_its_connection_give_one_report(tmp_path: Path) -> None:
    rows = [ok_row(i) for i in range(30)] + [cancelled_row(100 + i) for i in range(4)]
    with _store(tmp_path / "s.duckdb", rows) as store:
        spec = ReportSpec(GoodputPolicy(window_s=5.0), by=("finish_reason",))
        assert build_report(DuckDBDatabase(store.con), spec).to_dict() == build_report(store.con, spec).to_dict()


def test_a_clickhouse_engine_takes_no_query_parameters() -> None:
    with fresh_clickhouse() as ch, pytest.raises(ValueError, match="no query parameters"):
        ClickHouseDatabase(ch).rows("SELECT 1", [1])
