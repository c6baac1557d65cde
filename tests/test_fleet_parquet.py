"""Partitioned Parquet: the sink writes date=/hour= folders; the report reads them lazily with DuckDB, prunes the
partitions outside --from/--to, keeps under its memory limit, and gives the store's report."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmslo.analysis import GoodputPolicy, ReportSpec, Store, StoreError, build_report, polars_schema
from llmslo.analysis.databases import (
    Database,
    DuckDBDatabase,
    TimeRange,
    open_parquet,
    open_store_range,
    parse_memory_limit,
)
from llmslo.analysis.report._sql import HOLISTIC_BYTES_PER_VALUE
from llmslo.analysis.store import ParquetSummaryWriter, summary_table
from llmslo.cli._anomalies import QueryProgress
from llmslo.telemetry import COLUMNS, ConfigurationError
from llmslo.tests._databases_support import differences
from llmslo.tests._rows import cancelled_row, ok_row, rejected_row

DAY = 1_767_225_600.0  # 2026-01-01T00:00:00Z
HOUR = 3_600.0


def _rows() -> list[dict[str, Any]]:
    """Requests over 27 hours (two days), some cancelled or rejected."""
    rows: list[dict[str, Any]] = []
    for i in range(540):
        at = DAY + i * 180.0 + 7.0  # every 3 minutes
        kind = i % 9
        if kind == 4:
            rows.append(cancelled_row(i, arrival_unix_s=at, waited_s=2.0 + i % 5))
        elif kind == 7:
            rows.append(rejected_row(i, arrival_unix_s=at))
        else:
            ttft = 0.2 + (i % 13) * 0.05
            rows.append(ok_row(i, arrival_unix_s=at, ttft_s=ttft, last_token_s=ttft + 1, e2e_s=ttft + 1.2,
                               model="a" if i % 2 else "b"))
    return [{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows]


def _sink(folder: Path, rows: list[dict[str, Any]], **kw: Any) -> ParquetSummaryWriter:
    writer = ParquetSummaryWriter(folder, **kw)
    for i in range(0, len(rows), 50):
        writer.write(rows[i:i + 50])
    writer.close()
    return writer


def _store(path: Path, rows: list[dict[str, Any]]) -> Store:
    store = Store.open(path)
    store.ingest_frame(pl.DataFrame(rows, schema=polars_schema()))
    return store


SPECS = [ReportSpec(GoodputPolicy()), ReportSpec(GoodputPolicy(window_s=3_600.0), by=("model",)),
         ReportSpec(GoodputPolicy(), by=("finish_reason",))]


def test_the_sink_writes_one_folder_per_utc_hour_of_arrival_and_only_complete_files(tmp_path: Path) -> None:
    rows = _rows()
    writer = _sink(tmp_path / "pq", rows, rotate_rows=15, max_open=2)
    assert not list((tmp_path / "pq").rglob("*.partial"))
    assert sorted({f.parent.relative_to(tmp_path / "pq").as_posix() for f in writer.files})[:2] == [
        "date=2026-01-01/hour=00", "date=2026-01-01/hour=01"]
    assert len({f.parent for f in writer.files}) == 27
    seen = 0
    for f in writer.files:
        table = pq.read_table(f)
        assert table.num_rows <= 15
        day, hour = f.parent.parent.name.removeprefix("date="), int(f.parent.name.removeprefix("hour="))
        for t in table.column("arrival_unix_s").to_pylist():
            assert time.strftime("%Y-%m-%d", time.gmtime(t)) == day and time.gmtime(t).tm_hour == hour
        seen += table.num_rows
    assert seen == len(rows)


def test_the_flat_layout_is_kept_on_request(tmp_path: Path) -> None:
    writer = _sink(tmp_path / "flat", _rows()[:100], partitioned=False, rotate_rows=60)
    assert [f.parent for f in writer.files] == [tmp_path / "flat"] * 2


def test_bad_writer_settings_name_the_field() -> None:
    with pytest.raises(ConfigurationError, match="max_open"):
        ParquetSummaryWriter("x", max_open=0)


def test_partitioned_files_ingest_without_their_folder_names_as_columns(tmp_path: Path) -> None:
    writer = _sink(tmp_path / "pq", _rows())
    with Store.open(tmp_path / "s.duckdb") as store:
        reports = store.ingest_files(writer.files)
        assert sum(r.rows_inserted for r in reports) == 540 and store.count() == 540


@pytest.mark.parametrize("spec", SPECS, ids=["all", "hourly-by-model", "by-reason"])
def test_the_report_over_the_files_is_the_report_over_the_store(tmp_path: Path, spec: ReportSpec) -> None:
    rows = _rows()
    _sink(tmp_path / "pq", rows)
    database = open_parquet(str(tmp_path / "pq" / "**" / "*.parquet"), memory_limit=parse_memory_limit("256MB"))
    try:
        with _store(tmp_path / "s.duckdb", rows) as store:
            want = build_report(store.con, spec).to_dict()
        got = build_report(database, spec).to_dict()
    finally:
        database.close()
    assert differences(want, got) == []
    assert got["groups"][0]["attempted"] > 0


def test_a_time_range_opens_only_its_partitions_and_keeps_exactly_its_arrivals(tmp_path: Path) -> None:
    rows = _rows()
    _sink(tmp_path / "pq", rows)
    # a file that is no Parquet at all, in an hour outside the range: opening it would fail
    broken = tmp_path / "pq" / "date=2026-01-02" / "hour=02" / "summaries-0-0.parquet"
    broken.write_bytes(b"not parquet")
    lo, hi = DAY + 5 * HOUR + 7.0, DAY + 9 * HOUR + 7.0  # two of the arrivals sit exactly on the bounds
    window = TimeRange(lo, hi)
    database = open_parquet(str(tmp_path / "pq"), time_range=window)
    try:
        got = build_report(database, ReportSpec(GoodputPolicy())).to_dict()
    finally:
        database.close()
    inside = [r for r in rows if lo <= r["arrival_unix_s"] < hi]
    with _store(tmp_path / "s.duckdb", inside) as store:
        want = build_report(store.con, ReportSpec(GoodputPolicy())).to_dict()
    assert differences(want, got) == [] and got["totals"]["attempted"] == len(inside) == 80
    with pytest.raises(StoreError, match=r"hour=02/summaries-0-0\.parquet"):  # without the range it is read
        open_parquet(str(tmp_path / "pq"))


def _view_parts(database: DuckDBDatabase) -> dict[bool, str]:
    """The ``read_parquet`` parts of a database's summary view, keyed by whether the part filters its rows."""
    ((sql,),) = database.con.sql("SELECT sql FROM duckdb_views() WHERE view_name = 'request_summaries'").fetchall()
    parts = sql.split(" UNION ALL ")
    return {" WHERE " in p: p for p in parts}


def test_files_whose_statistics_put_every_arrival_in_the_range_are_read_without_the_row_filter(
        tmp_path: Path) -> None:
    rows = _rows()  # arrivals at DAY + 180 i + 7 s: hour 7's last one is row 159
    _sink(tmp_path / "pq", rows)
    # files in a kept partition whose rows lie outside the range (hour 20): with statistics, and without any
    strays = [{**r, "request_id": "stray-" + r["request_id"]} for r in rows if DAY + 20 * HOUR <= r["arrival_unix_s"]
              < DAY + 21 * HOUR]
    hour6 = tmp_path / "pq" / "date=2026-01-01" / "hour=06"
    pq.write_table(summary_table(strays[:10]), hour6 / "stray-stats.parquet")
    pq.write_table(summary_table(strays[10:]), hour6 / "stray-nostats.parquet", write_statistics=False)
    # and one whose first row group lies inside the range, its second outside
    late = [{**r, "request_id": "two-groups-" + r["request_id"]} for r in rows[120:125] + strays[:5]]
    pq.write_table(summary_table(late), hour6 / "stray-two-groups.parquet", row_group_size=5)
    lo, hi = DAY + 5 * HOUR, rows[159]["arrival_unix_s"]  # hour 7's last arrival sits on the open end
    database = open_parquet(str(tmp_path / "pq"), time_range=TimeRange(lo, hi))
    try:
        parts = _view_parts(database)
        whole = sorted(Path(f).parent.name for f in parts[False].split("'") if f.endswith(".parquet"))
        assert whole == ["hour=05", "hour=06"]  # the sink's files of hours 5 and 6; hour 7 ends on the bound
        assert "stray" not in parts[False] and all(f"stray-{kind}" in parts[True] for kind in ("stats", "nostats",
                                                                                            "two-groups"))
        got = build_report(database, ReportSpec(GoodputPolicy())).to_dict()
    finally:
        database.close()
    inside = [r for r in rows + late if lo <= r["arrival_unix_s"] < hi]
    with _store(tmp_path / "s.duckdb", inside) as store:
        want = build_report(store.con, ReportSpec(GoodputPolicy())).to_dict()
    assert differences(want, got) == [] and got["totals"]["attempted"] == len(inside) == 59 + 5
    unbounded = open_parquet(str(tmp_path / "pq"))
    try:
        assert list(_view_parts(unbounded)) == [False]  # no range: no filter at all
    finally:
        unbounded.close()


def test_a_store_seen_through_a_time_range_reports_only_those_arrivals(tmp_path: Path) -> None:
    rows = _rows()
    lo, hi = DAY + 3 * HOUR, DAY + 20 * HOUR
    with _store(tmp_path / "all.duckdb", rows):
        pass
    with _store(tmp_path / "some.duckdb", [r for r in rows if lo <= r["arrival_unix_s"] < hi]) as some:
        want = build_report(some.con, SPECS[1]).to_dict()
    database = open_store_range(tmp_path / "all.duckdb", TimeRange(lo, hi))
    try:
        assert differences(want, build_report(database, SPECS[1]).to_dict()) == []
    finally:
        database.close()


def test_the_memory_limit_is_duckdbs_own(tmp_path: Path) -> None:
    _sink(tmp_path / "pq", _rows()[:10])
    database = open_parquet(str(tmp_path / "pq"), memory_limit=parse_memory_limit("300MiB"))
    try:
        assert isinstance(database, DuckDBDatabase)
        (limit,) = database.con.sql("SELECT current_setting('memory_limit')").fetchall()[0]
    finally:
        database.close()
    assert limit == "300.0 MiB"
    assert parse_memory_limit("4GB") == 4 * 10**9 and parse_memory_limit("2GiB") == 2 * 2**30
    for bad in ("lots", "-1GB", "10MB", "4XB", "nanGB"):
        with pytest.raises(ConfigurationError, match="--memory-limit"):
            parse_memory_limit(bad)


def test_files_that_are_not_summaries_are_named(tmp_path: Path) -> None:
    folder = tmp_path / "pq" / "date=2026-01-01" / "hour=00"
    folder.mkdir(parents=True)
    table = summary_table(_rows()[:3]).drop_columns(["e2e_s"])
    pq.write_table(table, folder / "x.parquet")
    with pytest.raises(StoreError, match=r"x\.parquet.*required column 'e2e_s' is missing"):
        open_parquet(str(tmp_path / "pq"))
    pq.write_table(table.append_column("e2e_s", pa.array(["slow"] * 3)), folder / "x.parquet")
    with pytest.raises(StoreError, match=r"column 'e2e_s' is VARCHAR, the contract says float"):
        open_parquet(str(tmp_path / "pq"))
    with pytest.raises(StoreError, match="no Parquet file matches"):
        open_parquet(str(tmp_path / "empty"))
    with pytest.raises(ConfigurationError, match="--to"):
        TimeRange(DAY, DAY)


class _SlowDatabase(DuckDBDatabase):
    """Reports progress 0, 40, 80 ... percent, one step per poll."""

    def __init__(self) -> None:
        import duckdb

        super().__init__(duckdb.connect(), owned=True)
        self.steps = iter(range(0, 101, 40))

    def query_progress(self) -> float | None:
        return float(next(self.steps, 100))


def test_the_progress_bar_shows_the_stage_and_how_far_the_query_is() -> None:
    from rich.console import Console

    out = io.StringIO()
    database: Database = _SlowDatabase()
    bar = QueryProgress(database, True, delay_s=0.0, poll_s=0.05, console=Console(file=out, force_terminal=True,
                                                                                  width=100))
    bar("aggregating")
    time.sleep(0.5)
    bar.stop()
    database.close()
    text = out.getvalue()
    assert "aggregating" in text and "40%" in text and "80%" in text
    quiet = QueryProgress(_SlowDatabase(), True, console=Console(file=io.StringIO()))  # not a terminal
    quiet("aggregating")
    assert quiet.enabled is False and quiet._thread is None


class _Counting(DuckDBDatabase):
    """A DuckDB database that keeps the text of every query it runs, and can fail with DuckDB's out-of-memory
    error the ones naming a word or holding more than ``max_quantiles`` exact quantiles (a stand-in for a
    memory limit that the estimate misjudged: a real one cannot be made to fail at a chosen query)."""

    def __init__(self, con: Any, budget: int, fail_on: str | None = None, max_quantiles: int | None = None) -> None:
        super().__init__(con, holistic_budget_bytes=budget)
        self.queries: list[str] = []
        self.fail_on = fail_on
        self.max_quantiles = max_quantiles

    def rows(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        import duckdb

        self.queries.append(sql)
        too_many = self.max_quantiles is not None and sql.count("quantile_") > self.max_quantiles
        if too_many or (self.fail_on is not None and self.fail_on in sql):
            raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block")
        return super().rows(sql, params)


def _quantile_queries(database: _Counting) -> list[str]:
    """The holistic passes (exact quantiles run apart): not the main aggregate, not the Kaplan-Meier query
    (whose success-only quantile reads the censored groups' rows it ranks anyway)."""
    return [q for q in database.queries if "quantile" in q and '"attempted"' not in q and "_km_res" not in q]


@pytest.mark.parametrize("spec", SPECS, ids=["all", "hourly-by-model", "by-reason"])
def test_exact_quantiles_packed_into_queries_under_a_budget_give_the_same_report(tmp_path: Path,
                                                                                  spec: ReportSpec) -> None:
    rows = _rows()
    rows[5]["itl_s"] = [0.01, 0.02, 0.05]  # an ITL distribution too
    per_value = HOLISTIC_BYTES_PER_VALUE
    with _store(tmp_path / "s.duckdb", rows) as store:
        want = build_report(store.con, spec).to_dict()
        one_each = _Counting(store.con, budget=1)  # every exact quantile of every group in a query of its own
        assert build_report(one_each, spec).to_dict() == want
        pairs = _Counting(store.con, budget=per_value * len(rows) * 2)  # about two of them per query
        assert build_report(pairs, spec).to_dict() == want
        roomy = _Counting(store.con, budget=10**9)  # all of them fit: they stay in the main aggregate
        assert build_report(roomy, spec).to_dict() == want
    alone = _quantile_queries(one_each)
    assert all(q.count("quantile") == 1 for q in alone) and len(alone) >= 6
    packed = [q.count("quantile") for q in _quantile_queries(pairs)]
    assert max(packed) == 2 and len(packed) < len(alone)
    main_alone = next(q for q in one_each.queries if '"attempted"' in q)
    assert "quantile" not in main_alone  # the main aggregate holds no value in memory when none fits
    main_pairs = next(q for q in pairs.queries if '"attempted"' in q)
    assert main_pairs.count("quantile_") == 2  # as many as fit the budget however many values they read
    assert len([q for q in roomy.queries if "quantile" in q and "_km_res" not in q]) == 2  # main aggregate, ITL


def test_a_query_that_runs_out_of_memory_is_run_again_in_halves(tmp_path: Path) -> None:
    rows = _rows()
    spec = ReportSpec(GoodputPolicy(), by=("model",))
    with _store(tmp_path / "s.duckdb", rows) as store:
        want = build_report(store.con, spec).to_dict()
        # the estimate packs several quantiles into a query (not all into the main aggregate); DuckDB disagrees
        database = _Counting(store.con, budget=HOLISTIC_BYTES_PER_VALUE * len(rows) * 3, max_quantiles=1)
        assert build_report(database, spec).to_dict() == want
    mains = [q.count("quantile_") for q in database.queries if '"attempted"' in q]
    assert mains == [3, 0]  # the main aggregate held three, ran out of memory, and ran again without them
    tried = _quantile_queries(database)
    assert max(q.count("quantile_") for q in tried) > 1  # packed first
    done = [q for q in tried if q.count("quantile_") == 1]
    assert len(done) >= 6  # then one at a time


def test_quantiles_that_cannot_fit_the_memory_limit_say_what_to_change(tmp_path: Path) -> None:
    with _store(tmp_path / "s.duckdb", _rows()) as store:
        database = _Counting(store.con, budget=1, fail_on="quantile_cont(e2e_s")
        with pytest.raises(ConfigurationError, match=r"--memory-limit: the exact quantiles of e2e_s hold about"):
            build_report(database, ReportSpec(GoodputPolicy()))


class _Recording(DuckDBDatabase):
    """A DuckDB database that keeps the text of every query (to see which scans a report makes)."""

    def __init__(self, database: DuckDBDatabase) -> None:
        super().__init__(database.con, owned=True, holistic_budget_bytes=database.holistic_budget_bytes)
        self.empty_lists = database.empty_lists
        self.queries: list[str] = []

    def tuples(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        self.queries.append(sql)
        return super().tuples(sql, params)


def test_files_whose_statistics_show_no_itl_element_are_not_scanned_for_one(tmp_path: Path) -> None:
    rows = _rows()
    _sink(tmp_path / "pq", rows)
    spec = ReportSpec(GoodputPolicy(), by=("model",))
    with _store(tmp_path / "s.duckdb", rows) as store:
        want = build_report(store.con, spec).to_dict()
    database = _Recording(open_parquet(str(tmp_path / "pq")))
    assert database.empty_lists == frozenset({"itl_s"})
    assert differences(want, build_report(database, spec).to_dict()) == []
    probes = [q for q in database.queries if "EXISTS" in q]
    assert probes and not any("itl_s" in q for q in probes)  # the footers said it: no scan for ITL gaps
    database.close()


def test_files_with_itl_gaps_or_without_statistics_are_probed_and_their_itl_reported(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    rows = _rows()
    rows[5]["itl_s"] = [0.01, 0.02, 0.05]
    _sink(tmp_path / "pq", rows)
    spec = ReportSpec(GoodputPolicy())
    with _store(tmp_path / "s.duckdb", rows) as store:
        want = build_report(store.con, spec).to_dict()
    database = open_parquet(str(tmp_path / "pq"))
    assert database.empty_lists == frozenset()
    got = build_report(database, spec).to_dict()
    database.close()
    assert differences(want, got) == [] and got["groups"][0]["latency"]["itl_s"]["count"] == 3
    bare = tmp_path / "nostats" / "summaries.parquet"  # a writer that keeps no statistics proves nothing
    bare.parent.mkdir()
    pq.write_table(summary_table(_rows()), bare, write_statistics=False)
    database = open_parquet(str(bare.parent))
    assert database.empty_lists == frozenset()
    database.close()
