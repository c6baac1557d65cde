"""Ingest refuses what would break the analysis, tells a changed row from a re-sent one, and leaves no
store file behind when it fails.

Rules protected: implausible arrival times and intervals are rejected with the row named
(``ARRIVAL_MIN_UNIX_S``, ``ARRIVAL_MAX_AHEAD_S``, ``INTERVAL_MAX_S``); inputs that cannot be read as
summaries (an integer beyond 64 bits, a reserved column name, text that is not UTF-8, an empty file) are
refused naming the file and the row, and nothing is written; a stored ``request_id`` with other content is
a conflict, reported, while identical content stays "already stored"; a failed ``llmslo ingest`` into a new
path leaves no file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmslo.analysis import DuckDBSummaryWriter, InvalidInputError, Store, StoreError, polars_schema
from llmslo.analysis.store import (
    ARRIVAL_MAX_AHEAD_S,
    ARRIVAL_MIN_UNIX_S,
    INTERVAL_MAX_S,
    RESERVED_COLUMNS,
    SUMMARY_TABLE,
)
from llmslo.analysis.store import _store as store_module
from llmslo.cli._app import app
from llmslo.telemetry import COLUMNS
from llmslo.tests._rows import ok_row


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame([{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows], schema=polars_schema())


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` as Parquet, CSV (no list column) or JSONL, by the suffix of ``path``."""
    if path.suffix == ".parquet":
        _frame(rows).write_parquet(path)
    elif path.suffix == ".csv":
        _frame(rows).drop("itl_s").write_csv(path)
    else:
        _jsonl(path, rows)
    return path


def _stored(store: Store) -> list[tuple[Any, ...]]:
    return store.con.sql(f"SELECT * FROM {SUMMARY_TABLE} ORDER BY request_id").fetchall()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path / "s.duckdb")
    yield s  # type: ignore[misc]
    s.close()


# ---- 1. values that would break the analysis ---------------------------------------------------


def test_implausible_arrival_times_are_rejected_with_their_rows(tmp_path: Path, store: Store) -> None:
    rows = [ok_row(0), ok_row(1, arrival_unix_s=1.7e308), ok_row(2, arrival_unix_s=-1e12),
            ok_row(3, arrival_unix_s=1.7e12), ok_row(4, arrival_unix_s=time.time() + 2 * ARRIVAL_MAX_AHEAD_S)]
    src = _jsonl(tmp_path / "arrivals.jsonl", rows)
    with pytest.raises(InvalidInputError) as info:
        store.ingest_files([src])
    hits = [(e.row, e.column) for e in info.value.errors if e.rule == "implausible_arrival"]
    assert hits == [(2, "arrival_unix_s"), (3, "arrival_unix_s"), (4, "arrival_unix_s"), (5, "arrival_unix_s")]
    assert f"{src}: row 2, column arrival_unix_s" in str(info.value) and "Unix seconds" in str(info.value)
    assert store.count() == 0


def test_arrivals_from_the_epoch_to_now_are_accepted(store: Store) -> None:
    """0 is what importers write for files without start times; now is what a live server writes."""
    report = store.ingest_frame(_frame([ok_row(0, arrival_unix_s=ARRIVAL_MIN_UNIX_S), ok_row(1, arrival_unix_s=100.0),
                                        ok_row(2, arrival_unix_s=time.time())]))
    assert report.rows_inserted == 3


@pytest.mark.parametrize(("column", "overrides"), [
    ("e2e_s", {"e2e_s": 1e308}),
    ("queue_s", {"queue_s": 3e6, "ttft_s": 3e6, "last_token_s": 3e6, "e2e_s": 3e6}),
    ("client_e2e_s", {"client_e2e_s": 1e9}),
    ("stream_paused_s", {"stream_paused_s": 1e300}),
    ("itl_s", {"itl_s": [0.1, 1e9]}),
], ids=["e2e_s", "queue_s", "client_e2e_s", "stream_paused_s", "itl_s"])
def test_an_interval_longer_than_the_bound_is_rejected(store: Store, column: str, overrides: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError) as info:
        store.ingest_frame(_frame([ok_row(0), ok_row(1, **overrides)]))
    assert (2, column) in {(e.row, e.column) for e in info.value.errors if e.rule == "interval_too_long"}
    assert store.count() == 0


def test_an_interval_at_the_bound_is_accepted(store: Store) -> None:
    row = ok_row(0, e2e_s=INTERVAL_MAX_S, client_e2e_s=INTERVAL_MAX_S, itl_s=[INTERVAL_MAX_S])
    assert store.ingest_frame(_frame([row])).rows_inserted == 1


def test_report_with_a_tiny_window_runs_on_what_ingest_accepts(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    bad = _jsonl(tmp_path / "bad.jsonl", [ok_row(0), ok_row(1, arrival_unix_s=1.7e308)])
    res = CliRunner().invoke(app, ["ingest", str(bad), "--db", str(db)])
    assert res.exit_code == 1 and "row 2, column arrival_unix_s" in res.stderr
    good = _jsonl(tmp_path / "good.jsonl", [ok_row(0, arrival_unix_s=0.0), ok_row(1)])
    assert CliRunner().invoke(app, ["ingest", str(good), "--db", str(db)]).exit_code == 0
    res = CliRunner().invoke(app, ["report", "--db", str(db), "--window", "1ms", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["totals"]["attempted"] == 2


# ---- 2. inputs that cannot be read as summaries -------------------------------------------------


def _arrow(rows: list[dict[str, Any]]) -> pa.Table:
    return _frame(rows).to_arrow()


def test_a_uint64_beyond_the_int64_range_names_its_row(tmp_path: Path, store: Store) -> None:
    table = _arrow([ok_row(i) for i in range(3)])
    i = table.schema.get_field_index("prompt_tokens")
    table = table.set_column(i, "prompt_tokens", pa.array([1, 2, 2**64 - 1], type=pa.uint64()))
    pq.write_table(table, tmp_path / "u64.parquet")
    with pytest.raises(InvalidInputError) as info:
        store.ingest_files([tmp_path / "u64.parquet"])
    [error] = info.value.errors
    assert (error.row, error.column, error.value) == (3, "prompt_tokens", str(2**64 - 1))
    assert "from -2^63 to 2^63 - 1" in error.message
    assert store.count() == 0
    small = table.set_column(i, "prompt_tokens", pa.array([1, 2, 3], type=pa.uint64()))
    pq.write_table(small, tmp_path / "small.parquet")
    assert store.ingest_files([tmp_path / "small.parquet"])[0].rows_inserted == 3


def _with_column(path: Path, name: str) -> Path:
    """Three valid rows plus a column ``name``, as the format of ``path`` (or a frame for ``.frame``)."""
    rows = [ok_row(i) for i in range(3)]
    if path.suffix == ".jsonl":
        return _jsonl(path, [{**r, name: 7} for r in rows])
    frame = _frame(rows).drop("itl_s").with_columns(pl.lit(7).alias(name))
    if path.suffix == ".csv":
        frame.write_csv(path)
    else:
        frame.write_parquet(path)
    return path


@pytest.mark.parametrize("name", RESERVED_COLUMNS)
@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl", ".frame"])
def test_a_column_named_like_an_internal_one_is_refused(tmp_path: Path, store: Store, name: str, suffix: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        if suffix == ".frame":
            rows = [ok_row(i) for i in range(3)]
            store.ingest_frame(_frame(rows).with_columns(pl.lit(7).alias(name)), source="frame")
        else:
            store.ingest_files([_with_column(tmp_path / f"in{suffix}", name)])
    assert {(e.rule, e.column, e.row) for e in info.value.errors} == {("reserved_column", name, None)}
    assert f"column {name!r} is a name llmslo uses internally" in str(info.value)
    assert store.count() == 0


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_text_that_is_not_utf8_names_its_row(tmp_path: Path, store: Store, suffix: str) -> None:
    good = _write(tmp_path / f"good{suffix}", [ok_row(i) for i in range(4)])
    lines = good.read_bytes().split(b"\n")
    at = 3 if suffix == ".csv" else 2  # the third row: line 4 after a CSV header, line 3 of JSONL
    lines[at] = lines[at].replace(b"m1", b"m\xff")
    bad = tmp_path / f"bad{suffix}"
    bad.write_bytes(b"\n".join(lines))
    with pytest.raises(InvalidInputError) as info:
        store.ingest_files([good, bad])
    [error] = info.value.errors
    assert (error.source, error.row, error.rule) == (str(bad), 3, "not_utf8")
    assert f"{bad}: row 3" in str(info.value) and "0xff" in error.message
    assert store.count() == 0


def test_a_parquet_string_that_is_not_utf8_names_its_row_and_column(tmp_path: Path, store: Store) -> None:
    table = _arrow([ok_row(i) for i in range(4)])
    i = table.schema.get_field_index("model")
    bad = pa.array([b"m1", b"m1", b"m\xff", b"m1"], type=pa.binary()).view(pa.string())
    pq.write_table(table.set_column(i, pa.field("model", pa.string()), bad), tmp_path / "bad.parquet")
    with pytest.raises(InvalidInputError) as info:
        store.ingest_files([tmp_path / "bad.parquet"])
    [error] = info.value.errors
    assert (error.row, error.column, error.rule) == (3, "model", "not_utf8")
    assert store.count() == 0


def _empty(path: Path) -> Path:
    if path.name == "header.csv":
        _write(path, [ok_row(0)])
        path.write_text(path.read_text().splitlines()[0] + "\n")
    elif path.name == "schema.parquet":
        _frame([]).write_parquet(path)
    elif path.name == "blank.jsonl":
        path.write_text("\n\n")
    else:
        path.write_bytes(b"")
    return path


@pytest.mark.parametrize("name", ["e.jsonl", "e.csv", "e.parquet", "header.csv", "schema.parquet", "blank.jsonl"])
def test_an_empty_file_is_refused_and_nothing_is_written(tmp_path: Path, store: Store, name: str) -> None:
    good = _write(tmp_path / "good.jsonl", [ok_row(0)])
    empty = _empty(tmp_path / name)
    with pytest.raises(StoreError) as info:
        store.ingest_files([good, empty])
    assert str(info.value).startswith(f"{empty}: the file ") and "nothing to ingest" in str(info.value)
    assert store.count() == 0


# ---- 3. the same request_id with other content is a conflict ------------------------------------


def test_a_stored_id_with_other_content_is_a_conflict_and_the_stored_row_is_kept(store: Store) -> None:
    store.ingest_frame(_frame([ok_row(i) for i in range(6)]))
    before = _stored(store)
    again = [ok_row(0), ok_row(1, model="m2"), ok_row(2), ok_row(3, e2e_s=1.7), ok_row(4, itl_s=[0.1]),
             ok_row(5, proposed_tokens=0), ok_row(9)]
    report = store.ingest_frame(_frame(again))
    assert (report.rows_read, report.rows_inserted, report.rows_already_stored, report.rows_conflicting) == (
        7, 1, 3, 3)
    assert report.conflicting_ids == ("req-1", "req-3", "req-4")
    note = report.conflict_note()
    assert note is not None and "3 row(s)" in note and "req-1, req-3, req-4" in note
    assert [r for r in _stored(store) if r[0] != "req-9"] == before


def test_identical_content_from_another_format_is_already_stored(tmp_path: Path, store: Store) -> None:
    rows = [ok_row(i) for i in range(5)]
    store.ingest_files([_write(tmp_path / "a.jsonl", rows)])
    for suffix in (".parquet", ".csv", ".jsonl"):
        (report,) = store.ingest_files([_write(tmp_path / f"b{suffix}", [*rows, ok_row(7 + len(suffix))])])
        assert (report.rows_inserted, report.rows_already_stored, report.rows_conflicting) == (1, 5, 0), suffix
    assert store.ingest_frame(_frame(rows)).conflicting_ids == ()


def test_conflicts_are_found_through_the_hashes_in_every_chunk(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "INSERT_CHUNK_ROWS", 4)
    monkeypatch.setattr(store_module, "CONFLICT_IDS_KEPT", 2)
    store.ingest_frame(_frame([ok_row(i, request_id=f"{i * 7919 % 101:03d}-x") for i in range(0, 30, 2)]))
    store.ingest_frame(_frame([ok_row(0, request_id="000-x")]))  # an overlap: the store keeps the id hashes
    rows = [ok_row(i, request_id=f"{i * 7919 % 101:03d}-x", model="m1" if i % 4 else "changed") for i in range(30)]
    (report,) = store.ingest_files([_write(tmp_path / "big.parquet", rows)])
    changed = [r["request_id"] for r in rows if r["model"] == "changed"]
    assert (report.rows_inserted, report.rows_already_stored, report.rows_conflicting) == (15, 15 - 8, 8)
    assert report.conflicting_ids == tuple(changed[:2])
    assert "..." in (report.conflict_note() or "")


def test_files_of_one_call_that_disagree_on_an_id_report_the_conflict(tmp_path: Path, store: Store) -> None:
    a = _write(tmp_path / "a.parquet", [ok_row(i) for i in range(4)])
    b = _write(tmp_path / "b.jsonl", [ok_row(2), ok_row(3, sent_tokens=10), ok_row(4)])
    ra, rb = store.ingest_files([a, b])
    assert (ra.rows_inserted, rb.rows_inserted, rb.rows_already_stored, rb.rows_conflicting) == (4, 1, 1, 1)
    assert rb.conflicting_ids == ("req-3",)


def test_skip_invalid_counts_each_row_once_with_conflicts(tmp_path: Path, store: Store) -> None:
    store.ingest_frame(_frame([ok_row(i) for i in range(4)]))
    rows = [ok_row(0), ok_row(1, model="m2"), ok_row(2, finish_reason="done"), ok_row(3, e2e_s=2.0), ok_row(5)]
    (report,) = store.ingest_files([_write(tmp_path / "m.jsonl", rows)], skip_invalid=True)
    assert (report.rows_inserted, report.rows_already_stored, report.rows_conflicting, report.rows_rejected) == (
        1, 1, 2, 1)
    assert report.conflicting_ids == ("req-1", "req-3")


def test_the_duckdb_sink_writer_counts_conflicts_apart_from_resent_rows(tmp_path: Path) -> None:
    def full(row: dict[str, Any]) -> dict[str, Any]:
        return {c.name: row.get(c.name, c.default) for c in COLUMNS}

    writer = DuckDBSummaryWriter(tmp_path / "sink.duckdb")
    batch = [full(ok_row(0)), full(ok_row(1))]
    writer.write(batch)
    writer.write(batch)  # a retried batch
    writer.write([full(ok_row(0, model="m2"))])
    writer.close()
    assert (writer.rows_written, writer.rows_already_stored, writer.rows_conflicting) == (2, 2, 1)


def test_ingest_command_prints_the_conflicts(tmp_path: Path) -> None:
    db = str(tmp_path / "s.duckdb")
    first = _jsonl(tmp_path / "a.jsonl", [ok_row(i) for i in range(3)])
    assert CliRunner().invoke(app, ["ingest", str(first), "--db", db]).exit_code == 0
    changed = _jsonl(tmp_path / "b.jsonl", [ok_row(0), ok_row(1, model="[/nonexistent]"), ok_row(2, e2e_s=9.0)])
    res = CliRunner().invoke(app, ["ingest", str(changed), "--db", db, "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "conflicting" in res.stdout
    assert "2 row(s) have a request_id that is stored with other content (first: req-1, req-2)" in " ".join(
        res.stderr.split())
    res = CliRunner().invoke(app, ["ingest", str(changed), "--db", db, "--json"])
    [doc] = json.loads(res.stdout)["files"]
    assert (doc["rows_already_stored"], doc["rows_conflicting"], doc["conflicting_ids"]) == (1, 2, ["req-1", "req-2"])


# ---- 4. a failed ingest leaves no store file behind -----------------------------------------------


def test_a_failed_ingest_into_a_new_path_leaves_no_file(tmp_path: Path) -> None:
    db = tmp_path / "new.duckdb"
    bad = _jsonl(tmp_path / "bad.jsonl", [ok_row(0, finish_reason="done")])
    for args in ([str(bad)], [str(tmp_path / "missing.jsonl")], [str(_empty(tmp_path / "e.csv"))]):
        res = CliRunner().invoke(app, ["ingest", *args, "--db", str(db)])
        assert res.exit_code == 1, res.output
        assert not db.exists() and not Path(f"{db}.wal").exists(), args
    with pytest.raises(InvalidInputError), Store.open(db) as s:
        s.ingest_files([bad])
    assert not db.exists()


def test_a_failed_ingest_keeps_an_existing_store_and_one_that_received_rows(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    bad = _jsonl(tmp_path / "bad.jsonl", [ok_row(5, finish_reason="done")])
    first = _jsonl(tmp_path / "a.jsonl", [ok_row(0)])
    assert CliRunner().invoke(app, ["ingest", str(first), "--db", str(db)]).exit_code == 0
    assert CliRunner().invoke(app, ["ingest", str(bad), "--db", str(db)]).exit_code == 1
    with Store.open(db, read_only=True) as s:
        assert s.count() == 1
    fresh = tmp_path / "fresh.duckdb"
    with pytest.raises(InvalidInputError), Store.open(fresh) as s:
        s.ingest_frame(_frame([ok_row(0)]))
        s.ingest_files([bad])
    with Store.open(fresh, read_only=True) as s:
        assert s.count() == 1
