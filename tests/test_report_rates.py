"""Per-second rates of the report: rows without arrival times, run durations, and stores that cannot be placed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from llmslo.analysis import GoodputPolicy, ReportSpec, Store, build_report, polars_schema
from llmslo.analysis.report import MAX_WINDOWS, ReportDataError, check_window_count, stored_arrival_range
from llmslo.analysis.store import IMPORTS_TABLE, imports_ddl
from llmslo.telemetry import COLUMNS
from llmslo.tests._rows import ok_row, rejected_row

DAY1 = 1_700_000_000.0
DAY2 = DAY1 + 40 * 86_400.0  # another run, 40 days later
NEW_COLUMNS = {"id_prefix": "VARCHAR", "run_duration_s": "DOUBLE", "run_duration_note": "VARCHAR"}


def _store(path: Path, rows: list[dict[str, Any]]) -> Store:
    store = Store.open(path)
    full = [{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows]
    store.ingest_frame(pl.DataFrame(full, schema=polars_schema()))
    return store


def _imports_table(store: Store, *, legacy: bool = False) -> None:
    """The provenance table with the run-duration columns (``legacy``: as an older llmslo wrote it)."""
    store.con.execute(imports_ddl())
    have = {r[0] for r in store.con.sql(
        f"SELECT column_name FROM duckdb_columns() WHERE table_name = '{IMPORTS_TABLE}'").fetchall()}
    for name, kind in NEW_COLUMNS.items():
        if legacy and name in have:
            store.con.execute(f"ALTER TABLE {IMPORTS_TABLE} DROP COLUMN {name}")
        elif not legacy and name not in have:
            store.con.execute(f"ALTER TABLE {IMPORTS_TABLE} ADD COLUMN {name} {kind}")


def _record(store: Store, source: str, *, arrivals: bool, prefix: str | None = None,
            duration: float | None = None, note: str | None = None) -> None:
    values: dict[str, Any] = {
        "content_sha256": f"sha-{source}", "source": f"/runs/{source}", "kind": "vllm-bench", "tool": "vLLM bench",
        "rows_read": 0, "rows_imported": 0, "rows_inserted": 0, "rows_already_stored": 0,
        "arrivals_available": arrivals, "arrival_note": "", "conversions": [], "missing_fields": [],
        "finish_reasons": {}, "imported_unix_s": DAY2,
    }
    if prefix is not None:
        values.update(id_prefix=prefix, run_duration_s=duration, run_duration_note=note)
    names = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    store.con.execute(f"INSERT INTO {IMPORTS_TABLE} ({names}) VALUES ({marks})", list(values.values()))


def _run(prefix: str, n: int, arrival: float, *, model: str = "m1", good: int | None = None) -> list[dict[str, Any]]:
    """``n`` requests of one imported run, all at the same arrival time (the file recorded none);
    the first ``good`` succeed, the rest are rejected."""
    good = n if good is None else good
    return [(ok_row if i < good else rejected_row)(i, request_id=f"{prefix}#{i}", arrival_unix_s=arrival, model=model)
            for i in range(n)]


def _groups(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(g["keys"].get("model", "all")): g for g in report["groups"]}


class _Recorder:
    """A connection that records every query on the way to DuckDB."""

    def __init__(self, con: Any) -> None:
        self.con = con
        self.queries: list[str] = []

    def sql(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self.queries.append(query)
        return self.con.sql(query, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)


def test_runs_without_arrival_times_divide_by_their_recorded_durations(tmp_path: Path) -> None:
    # two rate-limited runs, 40 days apart, whose files record no start times but their durations
    rows = _run("aaaa", 40, DAY1, model="a", good=30) + _run("bbbb", 10, DAY2, model="b")
    with _store(tmp_path / "s.duckdb", rows) as store:
        _imports_table(store)
        _record(store, "a.json", arrivals=False, prefix="aaaa", duration=100.0)
        _record(store, "b.json", arrivals=False, prefix="bbbb", duration=25.0)
        whole = build_report(store.con, ReportSpec(GoodputPolicy())).to_dict()
        by_model = _groups(build_report(store.con, ReportSpec(GoodputPolicy(), by=("model",))).to_dict())
    (g,) = whole["groups"]
    assert g["rate_basis"]["kind"] == "run_duration" and g["rate_basis"]["seconds"] == 125.0
    assert "a.json" in g["rate_basis"]["note"] and "b.json" in g["rate_basis"]["note"]
    assert g["request_goodput_per_s"] == pytest.approx(40 / 125)
    assert g["tokens"]["generated_tokens_per_s"] == pytest.approx(40 * 11 / 125)
    assert whole["rate_basis"]["kind"] == "span" and whole["rate_basis"]["seconds"] is None  # no row has arrivals
    assert len(whole["rate_basis"]["exceptions"]) == 1 and "run duration" in whole["rate_basis"]["exceptions"][0]
    assert by_model["a"]["request_goodput_per_s"] == pytest.approx(30 / 100)
    assert by_model["b"]["request_goodput_per_s"] == pytest.approx(10 / 25)
    assert by_model["a"]["goodput_fraction"] == pytest.approx(0.75)


def test_a_run_without_a_recorded_duration_has_null_rates_and_says_why(tmp_path: Path) -> None:
    rows = _run("aaaa", 20, DAY1) + _run("bbbb", 20, DAY2)
    with _store(tmp_path / "s.duckdb", rows) as store:
        _imports_table(store)
        _record(store, "a.json", arrivals=False, prefix="aaaa", duration=100.0)
        _record(store, "b.json", arrivals=False, prefix="bbbb", note="the file records no duration")
        rep = build_report(store.con, ReportSpec(GoodputPolicy())).to_dict()
    (g,) = rep["groups"]
    assert g["request_goodput_per_s"] is None and g["token_goodput_per_s"] is None
    assert g["tokens"]["generated_tokens_per_s"] is None
    assert g["rate_basis"]["kind"] == "none" and g["rate_basis"]["seconds"] is None
    assert "b.json" in g["rate_basis"]["note"] and "the file records no duration" in g["rate_basis"]["note"]
    assert g["goodput_fraction"] == 1.0 and g["latency"]["ttft_s"]["p50"] == 0.5  # fractions, quantiles stay
    assert any("b.json" in e for e in rep["rate_basis"]["exceptions"])


def test_live_rows_keep_their_span_and_a_group_mixing_both_kinds_has_null_rates(tmp_path: Path) -> None:
    live = [ok_row(i, request_id=f"live-{i}", arrival_unix_s=DAY1 + 10.0 * i, model="live") for i in range(5)]
    imported = _run("aaaa", 20, 0.0, model="bench")  # LLMPerf: arrival_unix_s = 0 on every row
    with _store(tmp_path / "s.duckdb", live + imported) as store:
        _imports_table(store)
        _record(store, "llmperf.json", arrivals=False, prefix="aaaa", duration=60.0)
        by_model = _groups(build_report(store.con, ReportSpec(GoodputPolicy(), by=("model",))).to_dict())
        whole = build_report(store.con, ReportSpec(GoodputPolicy())).to_dict()
    span = 40.0 + 1.6  # the live rows only: first arrival to last finish
    assert by_model["live"]["rate_basis"] == {"kind": "span", "seconds": pytest.approx(span), "note": None}
    assert by_model["live"]["request_goodput_per_s"] == pytest.approx(5 / span)
    assert by_model["bench"]["request_goodput_per_s"] == pytest.approx(20 / 60)
    (g,) = whole["groups"]
    assert g["request_goodput_per_s"] is None and g["rate_basis"]["kind"] == "none"
    assert "mixes 5 row(s) with arrival times and 20" in g["rate_basis"]["note"]
    assert whole["rate_basis"]["seconds"] == pytest.approx(span)


def test_windows_over_rows_without_arrival_times_have_null_rates_but_valid_fractions(tmp_path: Path) -> None:
    live = [ok_row(i, request_id=f"live-{i}", arrival_unix_s=DAY1 + i) for i in range(5)]
    rows = live + _run("aaaa", 10, DAY2, good=5)
    with _store(tmp_path / "s.duckdb", rows) as store:
        _imports_table(store)
        _record(store, "a.json", arrivals=False, prefix="aaaa", duration=100.0)
        rep = build_report(store.con, ReportSpec(GoodputPolicy(window_s=60.0))).to_dict()
    live_w, imported_w = rep["groups"]
    assert live_w["request_goodput_per_s"] == pytest.approx(5 / 60) and live_w["rate_basis"]["kind"] == "window"
    assert imported_w["request_goodput_per_s"] is None and imported_w["token_goodput_per_s"] is None
    assert imported_w["rate_basis"]["kind"] == "none"
    assert "cannot be placed in windows" in imported_w["rate_basis"]["note"]
    assert imported_w["goodput_fraction"] == 0.5 and imported_w["latency"]["ttft_s"]["p99"] == 0.5
    assert any("a.json" in e for e in rep["rate_basis"]["exceptions"])


def test_a_store_imported_before_run_durations_were_recorded_asks_for_a_re_import(tmp_path: Path) -> None:
    rows = _run("old.json", 10, 0.0) + _run("timed.json", 10, DAY1, model="m2")
    with _store(tmp_path / "s.duckdb", rows) as store:
        _imports_table(store, legacy=True)
        _record(store, "old.json", arrivals=False)
        _record(store, "timed.json", arrivals=True)
        by_model = _groups(build_report(store.con, ReportSpec(GoodputPolicy(), by=("model",))).to_dict())
    old = by_model["m1"]
    assert old["request_goodput_per_s"] is None and old["rate_basis"]["kind"] == "none"
    assert "imported before run durations were recorded; re-import" in old["rate_basis"]["note"]
    assert by_model["m2"]["rate_basis"]["kind"] == "span"  # an import with arrival times: the span rule


def test_the_join_with_the_imports_is_made_only_when_some_import_has_no_arrival_times(tmp_path: Path) -> None:
    rows = [ok_row(i, request_id=f"aaaa#{i}") for i in range(5)]
    with _store(tmp_path / "s.duckdb", rows) as store:
        rec = _Recorder(store.con)
        build_report(rec, ReportSpec(GoodputPolicy()))  # type: ignore[arg-type]
        _imports_table(store)
        _record(store, "timed.json", arrivals=True, prefix="aaaa", duration=10.0)
        build_report(rec, ReportSpec(GoodputPolicy()))  # type: ignore[arg-type]
        assert not any("split_part" in q for q in rec.queries)
        _record(store, "other.json", arrivals=False, prefix="bbbb", duration=10.0)
        rep = build_report(rec, ReportSpec(GoodputPolicy())).to_dict()  # type: ignore[arg-type]
        assert any("split_part" in q for q in rec.queries)
    assert rep["groups"][0]["rate_basis"]["kind"] == "span"  # none of the rows is from "bbbb"


# ---- stores a report cannot place in time --------------------------------------------------------------


def _bad_arrivals(path: Path) -> Path:
    rows = [ok_row(0), ok_row(1, request_id="far", arrival_unix_s=1.7e308),
            ok_row(2, request_id="before", arrival_unix_s=-1e12)]
    with _store(path, rows[:1]) as store:  # ingest may refuse the others: write them as a store may hold them
        for r in rows[1:]:
            store.con.execute("INSERT INTO request_summaries SELECT * REPLACE (? AS request_id, ? AS arrival_unix_s) "
                              "FROM request_summaries LIMIT 1", [r["request_id"], r["arrival_unix_s"]])
    return path


@pytest.mark.parametrize("window", [0.001, 60.0, None])
def test_arrival_times_that_cannot_be_placed_give_a_clear_error(tmp_path: Path, window: float | None) -> None:
    db = _bad_arrivals(tmp_path / "s.duckdb")
    with Store.open(db, read_only=True) as store, pytest.raises(ReportDataError) as err:
        build_report(store.con, ReportSpec(GoodputPolicy(window_s=window)))
    message = str(err.value)
    assert "arrival_unix_s" in message and "2 row(s)" in message and "'far'" in message and "'before'" in message


def test_the_command_reports_unplaceable_arrivals_and_too_many_windows_without_a_traceback(tmp_path: Path) -> None:
    db = _bad_arrivals(tmp_path / "bad.duckdb")
    cmd = [sys.executable, "-m", "llmslo.cli", "report", "--db", str(db), "--window", "1ms"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr + out.stdout
    assert "arrival_unix_s" in out.stderr and "far" in out.stderr
    long = tmp_path / "long.duckdb"
    with _store(long, [ok_row(i, arrival_unix_s=DAY1 + 0.001 * i + 0.0005) for i in range(MAX_WINDOWS + 1)]):
        pass
    out = subprocess.run([*cmd[:5], str(long), "--window", "1ms", "--json"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0 and "Traceback" not in out.stderr + out.stdout
    assert "--window 1ms" in out.stderr and f"{MAX_WINDOWS + 1:,} windows" in out.stderr
    ok = subprocess.run([*cmd[:5], str(long), "--window", "1s", "--json"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert sum(g["attempted"] for g in json.loads(ok.stdout)["groups"]) == MAX_WINDOWS + 1


def test_the_window_bound_counts_only_windows_that_hold_a_request(tmp_path: Path) -> None:
    # two short runs 40 days apart: millions of 1 s windows between them, but only a few hold a request
    rows = [ok_row(i, arrival_unix_s=DAY1 + i) for i in range(5)] + [
        ok_row(10 + i, arrival_unix_s=DAY2 + i) for i in range(5)]
    with _store(tmp_path / "s.duckdb", rows) as store:
        rep = build_report(store.con, ReportSpec(GoodputPolicy(window_s=1.0))).to_dict()
        assert len(rep["groups"]) == 10
        # with a horizon, only the windows up to it count: the second run does not exist yet at DAY1 + 10
        arrivals = stored_arrival_range(store.con)
        assert check_window_count(store.con, 0.001, arrivals, until_unix_s=DAY1 + 10) == 10_001
        # over both runs, 3.5e9 1 ms windows are spanned: the ten that hold a request are counted instead
        assert check_window_count(store.con, 0.001, arrivals, until_unix_s=DAY2 + 10) == 10
        assert check_window_count(store.con, 0.001, arrivals, until_unix_s=DAY1 - 1) == 0


# ---- through `llmslo import` -------------------------------------------------------------------------

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "import"
REAL = Path(__file__).resolve().parents[2] / "shared" / "real_data"


def _imports_record_durations() -> bool:
    return "id_prefix" in imports_ddl()


@pytest.mark.skipif(not _imports_record_durations(), reason="the importer does not record run durations yet")
def test_imported_files_without_start_times_divide_by_the_duration_they_recorded(tmp_path: Path) -> None:
    from llmslo.analysis.importers import import_files

    old, timed = FIXTURES / "vllm_benchmark_serving_old.json", FIXTURES / "vllm_bench_serve_detailed.json"
    result = import_files([old, timed], "auto", tmp_path / "s.duckdb")
    no_starts, with_starts = (f.report for f in result.files)
    assert not no_starts.arrivals_available and no_starts.run_duration_s is not None
    assert with_starts.arrivals_available
    with Store.open(tmp_path / "s.duckdb", read_only=True) as store:
        rep = build_report(store.con, ReportSpec(GoodputPolicy(), by=("model",))).to_dict()
        mixed = build_report(store.con, ReportSpec(GoodputPolicy())).to_dict()
    groups = {g["rate_basis"]["kind"]: g for g in rep["groups"]}
    imported = groups["run_duration"]
    assert imported["rate_basis"]["seconds"] == no_starts.run_duration_s
    assert imported["request_goodput_per_s"] == pytest.approx(imported["good"] / no_starts.run_duration_s)
    live = groups["span"]  # the file with start times keeps the span of its own rows
    assert live["rate_basis"]["seconds"] == pytest.approx(rep["rate_basis"]["seconds"])
    assert rep["rate_basis"]["from_unix_s"] > 1.7e9  # not pulled back to the other file's anchor
    (g,) = mixed["groups"]
    assert g["request_goodput_per_s"] is None and "mixes" in g["rate_basis"]["note"]


@pytest.mark.skipif(not _imports_record_durations(), reason="the importer does not record run durations yet")
def test_real_llmperf_files_record_no_duration_and_get_null_rates_with_the_reason(tmp_path: Path) -> None:
    folder = REAL / "llmperf_leaderboard" / "individual"
    files = [folder / "groq_70b.json", folder / "anyscale_70b.json"]
    if not all(f.is_file() for f in files):
        pytest.skip(f"real data not found in {folder}")
    from llmslo.analysis.importers import import_files

    result = import_files(files, "llmperf", tmp_path / "s.duckdb")
    assert all(f.report.run_duration_s is None for f in result.files)
    with Store.open(tmp_path / "s.duckdb", read_only=True) as store:
        rep = build_report(store.con, ReportSpec(GoodputPolicy())).to_dict()
        windowed = build_report(store.con, ReportSpec(GoodputPolicy(window_s=60.0))).to_dict()
    (g,) = rep["groups"]
    assert g["attempted"] == sum(f.report.rows_imported for f in result.files)
    assert g["request_goodput_per_s"] is None and g["tokens"]["sent_tokens_per_s"] is None
    assert g["rate_basis"]["note"].startswith("rows from imports without arrival times: no run duration")
    assert "groq_70b.json" in g["rate_basis"]["note"]
    by_model = build_report_of(tmp_path / "s.duckdb", ("model",))
    (said,) = by_model["rate_basis"]["exceptions"]  # two groups, one reason: said once, with its files
    assert said.startswith("2 group(s) (model=anyscale_70b; model=groq_70b): rows from imports without "
                           "arrival times: no run duration"), said
    assert said.endswith("(files: anyscale_70b.json, groq_70b.json)"), said
    assert g["goodput_fraction"] is not None and g["latency"]["ttft_s"]["p50"] is not None
    assert all(w["request_goodput_per_s"] is None for w in windowed["groups"])


def build_report_of(db: Path, keys: tuple[str, ...]) -> dict[str, Any]:
    """The report's JSON of the store at ``db``, grouped by ``keys``."""
    with Store.open(db, read_only=True) as store:
        return build_report(store.con, ReportSpec(GoodputPolicy(), keys)).to_dict()
