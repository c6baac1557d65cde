"""Every report test, run again on both databases: each ``build_report`` call also runs on a ClickHouse (chdb)
copy of the same store and must give the same report (counts, keys, verdicts and texts exact; quantiles,
means and rates within 1e-12) or raise the same error.

The tests are those of ``test_analysis_report`` and ``test_report_rates`` that call ``build_report`` in this
process (the ones that run the command in a subprocess stay DuckDB's: the command's database options have
their own tests in ``test_fleet_cli``). The module's own tests check the comparison itself.
"""

from __future__ import annotations

import inspect
import types
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.analysis import GoodputPolicy, ReportSpec, Store, build_report, polars_schema
from llmslo.analysis.databases import ClickHouseDatabase
from llmslo.telemetry import COLUMNS
from llmslo.tests import test_analysis_report, test_report_rates
from llmslo.tests._databases_support import copy_to_clickhouse, differences, fresh_clickhouse, on_both_databases
from llmslo.tests._rows import cancelled_row, ok_row, rejected_row

SUITES: tuple[types.ModuleType, ...] = (test_analysis_report, test_report_rates)


DATABASE_EXAMPLES = 8
"""The most examples a property of the wrapped suites draws here (each example's reports run on ClickHouse too,
at about 8 ms a query); the suites' own runs keep their own numbers of examples on DuckDB."""


@pytest.fixture(autouse=True)
def _report_on_both_databases(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in SUITES:
        monkeypatch.setattr(module, "build_report", on_both_databases(build_report))
    fn = request.function
    if getattr(fn, "is_hypothesis_test", False):
        # hypothesis reads a property's settings from this attribute each time it runs the property
        own = fn._hypothesis_internal_use_settings
        monkeypatch.setattr(fn, "_hypothesis_internal_use_settings",
                            settings(own, max_examples=min(own.max_examples, DATABASE_EXAMPLES)))


def _in_process(fn: Any) -> bool:
    return "build_report(" in inspect.getsource(inspect.unwrap(fn))


for _module in SUITES:
    _short = _module.__name__.rsplit(".", 1)[1].removeprefix("test_")
    for _name, _fn in vars(_module).copy().items():
        if _name.startswith("test_") and callable(_fn) and _in_process(_fn):
            globals()[f"test_{_short}__{_name.removeprefix('test_')}"] = _fn


# ---- the comparison itself ---------------------------------------------------------------------------------


def _store(path: Path, rows: list[dict[str, Any]]) -> Store:
    store = Store.open(path)
    full = [{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows]
    store.ingest_frame(pl.DataFrame(full, schema=polars_schema()))
    return store


def test_the_wrapped_suites_hold_tests() -> None:
    wrapped = [n for n in globals() if n.startswith(("test_analysis_report__", "test_report_rates__"))]
    assert len(wrapped) >= 20, wrapped


def test_a_changed_figure_on_one_engine_is_reported_with_its_path() -> None:
    a = {"groups": [{"latency": {"p99": 1.0, "count": 3}, "verdict": "consistent"}]}
    b = {"groups": [{"latency": {"p99": 1.0 + 1e-9, "count": 3}, "verdict": "consistent"}]}
    assert differences(a, b) == [".groups[0].latency.p99: 1.0 vs 1.000000001"]
    assert differences(a, {"groups": [{"latency": {"p99": 1.0 + 1e-13, "count": 3}, "verdict": "consistent"}]}) == []
    assert differences({"n": 3}, {"n": 3.0}) == [".n: 3 (int) vs 3.0 (float)"]
    assert differences({"v": "consistent"}, {"v": "optimistic"}) == [".v: 'consistent' (str) vs 'optimistic' (str)"]


def test_the_clickhouse_copy_reports_the_same_store(tmp_path: Path) -> None:
    rows = [ok_row(i, ttft_s=0.1 + 0.01 * i, last_token_s=1.0 + 0.01 * i, e2e_s=1.2 + 0.01 * i) for i in range(40)]
    rows += [cancelled_row(100 + i, waited_s=3.0 + i) for i in range(8)] + [rejected_row(200 + i) for i in range(5)]
    with _store(tmp_path / "s.duckdb", rows) as store, fresh_clickhouse() as ch:
        copy_to_clickhouse(store.con, ch)
        assert ch.count() == store.count() == len(rows)
        for spec in (ReportSpec(GoodputPolicy()), ReportSpec(GoodputPolicy(window_s=10.0), by=("finish_reason",))):
            duck = build_report(store.con, spec).to_dict()
            click = build_report(ClickHouseDatabase(ch), spec).to_dict()
            assert differences(duck, click) == []
            assert duck["groups"][0]["attempted"] > 0
        # breaking one stored value on one side is seen
        ch.client.command("ALTER TABLE request_summaries UPDATE ttft_s = ttft_s + 1 WHERE request_id = 'req-3' "
                          "SETTINGS mutations_sync = 2")
        spec = ReportSpec(GoodputPolicy())
        found = differences(build_report(store.con, spec).to_dict(),
                            build_report(ClickHouseDatabase(ch), spec).to_dict())
        assert any("ttft_s" in d for d in found)


def test_a_mismatch_fails_the_wrapped_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmslo.analysis.databases import ClickHouseDialect

    rows = [ok_row(i, ttft_s=0.1 * (i + 1), last_token_s=1.5, e2e_s=1.6) for i in range(10)]
    monkeypatch.setattr(ClickHouseDialect, "exact_quantiles",
                        lambda self, expr, qs, cond=None: f"quantilesExactLow({', '.join(map(repr, qs))})({expr})"
                        if cond is None else f"quantilesExactLowIf({', '.join(map(repr, qs))})({expr}, {cond})")
    with _store(tmp_path / "s.duckdb", rows) as store, pytest.raises(AssertionError, match="disagree"):
        on_both_databases(build_report)(store.con, ReportSpec(GoodputPolicy()))


_DRAWN: list[int] = []


@settings(max_examples=50, database=None)
@given(st.integers())
def test_a_property_here_draws_at_most_the_database_examples(x: int) -> None:
    _DRAWN.append(x)
    assert len(_DRAWN) <= DATABASE_EXAMPLES
