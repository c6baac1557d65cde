"""The store: every rule rejects its row and changes nothing; ingest is lossless and idempotent."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmslo.analysis import (
    InvalidInputError,
    Store,
    StoreError,
    StoreVersionError,
    arrow_schema,
    polars_schema,
)
from llmslo.analysis.store import _store as store_module
from llmslo.analysis.store._schema import META_TABLE, SUMMARY_TABLE
from llmslo.analysis.store._store import ID_HASH_TABLE, ID_RANGE_TABLE
from llmslo.telemetry import COLUMN_NAMES, COLUMNS, SCHEMA_VERSION
from llmslo.tests._rows import BREAKERS, cancelled_row, ok_row, rejected_row


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    full = [{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows]
    return pl.DataFrame(full, schema=polars_schema())


def _stored(store: Store) -> list[dict[str, Any]]:
    rel = store.con.sql(f"SELECT * FROM {SUMMARY_TABLE} ORDER BY request_id")
    return [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path / "s.duckdb")
    yield s  # type: ignore[misc]
    s.close()


GOOD = [ok_row(0), ok_row(1, itl_s=[0.1] * 10), rejected_row(2), cancelled_row(3)]


@pytest.mark.parametrize(("rule", "column", "overrides"), BREAKERS, ids=[f"{b[0]}-{b[1]}" for b in BREAKERS])
def test_each_rule_rejects_its_bad_row_and_leaves_the_store_unchanged(
    tmp_path: Path, store: Store, rule: str, column: str, overrides: dict[str, Any]
) -> None:
    store.ingest_files([_jsonl(tmp_path / "first.jsonl", GOOD[:1])])
    before = _stored(store)
    bad = _jsonl(tmp_path / "bad.jsonl", [*GOOD[1:], ok_row(9, **overrides)])
    with pytest.raises(InvalidInputError) as info:
        store.ingest_files([bad])
    hits = [e for e in info.value.errors if e.rule == rule and e.column == column]
    assert hits, info.value
    assert hits[0].row == 4 and hits[0].source == str(bad)
    assert str(bad) in str(info.value) and f"row 4, column {column}" in str(info.value)
    assert _stored(store) == before


def test_non_finite_value_in_a_frame_is_rejected(store: Store) -> None:
    with pytest.raises(InvalidInputError) as info:
        store.ingest_frame(_frame([ok_row(0, e2e_s=math.inf), ok_row(1, ttft_s=math.nan)]))
    assert {(e.rule, e.column, e.row) for e in info.value.errors} >= {("non_finite", "e2e_s", 1),
                                                                       ("non_finite", "ttft_s", 2)}
    assert store.count() == 0


def test_duplicate_request_id_names_both_rows(tmp_path: Path, store: Store) -> None:
    with pytest.raises(InvalidInputError) as info:
        store.ingest_files([_jsonl(tmp_path / "d.jsonl", [ok_row(0), ok_row(1), ok_row(0)])])
    (err,) = [e for e in info.value.errors if e.rule == "duplicate_request_id"]
    assert err.row == 3 and "same as row 1" in (err.value or "")


def test_a_bad_file_among_good_ones_loads_nothing(tmp_path: Path, store: Store) -> None:
    good = _jsonl(tmp_path / "good.jsonl", GOOD)
    bad = _jsonl(tmp_path / "bad.jsonl", [ok_row(10, finish_reason="oops")])
    with pytest.raises(InvalidInputError):
        store.ingest_files([good, bad])
    assert store.count() == 0


def test_skip_invalid_loads_valid_rows_and_writes_rejected_ones_beside_the_input(
    tmp_path: Path, store: Store
) -> None:
    src = _jsonl(tmp_path / "mixed.jsonl", [*GOOD, ok_row(7, sent_tokens=99), ok_row(8, ttft_s="x")])
    (report,) = store.ingest_files([src], skip_invalid=True)
    assert (report.rows_read, report.rows_inserted, report.rows_rejected) == (6, 4, 2)
    assert report.rejected_path == str(tmp_path / "mixed.jsonl.rejected.jsonl")
    rejected = [json.loads(line) for line in Path(report.rejected_path).read_text().splitlines()]
    assert [r["row"] for r in rejected] == [5, 6]
    assert rejected[0]["record"]["request_id"] == "req-7"
    assert rejected[0]["errors"][0]["rule"] == "sent_exceeds_generated"
    assert store.count() == 4


def test_malformed_json_names_the_line_and_loads_nothing(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(ok_row(0)) + "\n" + '{"request_id": "x",,}\n')
    with pytest.raises(InvalidInputError) as info:
        store.ingest_files([path])
    assert info.value.errors[0].row == 2 and info.value.errors[0].rule == "malformed_json"
    assert store.count() == 0


def test_unknown_and_missing_columns_are_named_with_a_hint(tmp_path: Path, store: Store) -> None:
    row = ok_row(0)
    row["ttft"] = row.pop("ttft_s")
    del row["e2e_s"]
    with pytest.raises(InvalidInputError) as info:
        store.ingest_files([_jsonl(tmp_path / "cols.jsonl", [row])])
    text = str(info.value)
    assert "'ttft'" in text and "did you mean 'ttft_s'" in text
    assert "required column 'e2e_s'" in text


def test_reingesting_the_same_rows_adds_nothing(tmp_path: Path, store: Store) -> None:
    src = _jsonl(tmp_path / "a.jsonl", GOOD)
    first = store.ingest_files([src])[0]
    again = store.ingest_files([src])[0]
    assert (first.rows_inserted, again.rows_inserted, again.rows_already_stored) == (4, 0, 4)
    assert store.count() == 4


def test_csv_parquet_jsonl_and_frames_load_the_same_rows(tmp_path: Path) -> None:
    frame = _frame(GOOD)
    frame.write_parquet(tmp_path / "a.parquet")
    frame.drop("itl_s").write_csv(tmp_path / "a.csv")
    _jsonl(tmp_path / "a.jsonl", GOOD)
    results = []
    for name in ("a.parquet", "a.csv", "a.jsonl"):
        with Store.open(tmp_path / f"{name}.duckdb") as s:
            s.ingest_files([tmp_path / name])
            results.append(_stored(s))
    with Store.open(tmp_path / "frame.duckdb") as s:
        s.ingest_frame(frame.to_arrow())
        results.append(_stored(s))
    for got in results:
        for r in got:
            if r["request_id"] == "req-1":
                r["itl_s"] = None  # the CSV has no itl_s column
    assert results[0] == results[1] == results[2] == results[3]


_finite = st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False)


@st.composite
def _valid_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 20))
    rows = []
    for i in range(n):
        q, a, b, c = sorted(draw(st.lists(_finite, min_size=4, max_size=4)))
        gen = draw(st.integers(1, 10_000))
        rows.append(ok_row(
            i, model=draw(st.text(min_size=1, max_size=8)), arrival_unix_s=draw(st.floats(0, 1.7e9)),
            queue_s=q, ttft_s=a, last_token_s=b, e2e_s=c, generated_tokens=gen,
            sent_tokens=draw(st.integers(0, gen)), prompt_tokens=draw(st.integers(0, 10**6)),
            itl_s=draw(st.one_of(st.none(), st.lists(_finite, max_size=4))),
            client_ttft_s=draw(st.one_of(st.none(), _finite)),
        ))
    return rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_valid_rows())
def test_ingest_then_read_is_lossless(tmp_path_factory: pytest.TempPathFactory, rows: list[dict[str, Any]]) -> None:
    path = tmp_path_factory.mktemp("lossless")
    _jsonl(path / "in.jsonl", rows)
    with Store.open(path / "s.duckdb") as s:
        s.ingest_files([path / "in.jsonl"])
        stored = _stored(s)
    want = sorted(({c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows),
                  key=lambda r: r["request_id"])
    assert stored == want


def test_arrow_schema_and_ddl_come_from_one_definition(store: Store) -> None:
    rel = store.con.sql(f"SELECT * FROM {SUMMARY_TABLE} LIMIT 0")
    assert tuple(rel.columns) == COLUMN_NAMES == tuple(arrow_schema().names) == tuple(polars_schema().names())
    assert isinstance(arrow_schema().field("itl_s").type, pa.ListType)


def test_a_store_of_another_schema_version_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    Store.open(path).close()
    con = duckdb.connect(str(path))
    con.execute(f"UPDATE {META_TABLE} SET value = '0' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(StoreVersionError, match=r"schema version 0.*re-ingest"):
        Store.open(path)


@pytest.mark.parametrize("read_only", [False, True])
def test_a_version_1_store_gets_the_backend_column_when_opened_and_keeps_its_rows(tmp_path: Path,
                                                                                   read_only: bool) -> None:
    path = tmp_path / "v1.duckdb"
    with Store.open(path) as store:
        store.ingest_files([_jsonl(tmp_path / "v1.jsonl", [ok_row(1), ok_row(2)])])
    con = duckdb.connect(str(path))  # what a version-1 store looked like: no backend column
    con.execute(f"ALTER TABLE {SUMMARY_TABLE} DROP COLUMN backend")
    con.execute(f"UPDATE {META_TABLE} SET value = '1' WHERE key = 'schema_version'")
    con.close()
    with Store.open(path, read_only=read_only) as store:
        rows = store.con.sql(f"SELECT request_id, backend FROM {SUMMARY_TABLE} ORDER BY request_id").fetchall()
        version = store.con.sql(f"SELECT value FROM {META_TABLE} WHERE key = 'schema_version'").fetchall()
    assert [r[1] for r in rows] == [None, None] and len(rows) == 2
    assert version == [(str(SCHEMA_VERSION),)]
    with Store.open(path) as store:
        store.ingest_files([_jsonl(tmp_path / "v2.jsonl", [{**ok_row(3), "backend": "llama-a"}])])
        assert store.con.sql(f"SELECT backend FROM {SUMMARY_TABLE} WHERE backend IS NOT NULL").fetchall() == [
            ("llama-a",)]


def test_reading_a_missing_store_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="llmslo ingest"):
        Store.open(tmp_path / "nope.duckdb", read_only=True)


def test_a_foreign_duckdb_file_is_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (a INT)")
    con.close()
    with pytest.raises(StoreError, match="not an llmslo store"):
        Store.open(path)


# ---- ingest into a store that already holds rows: the stored ids are found once, exactly ----------


def _ids(store: Store) -> list[str]:
    return [r[0] for r in store.con.sql(f"SELECT request_id FROM {SUMMARY_TABLE} ORDER BY request_id").fetchall()]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` as a Parquet, CSV (no list column) or JSONL file, by the suffix of ``path``."""
    if path.suffix == ".parquet":
        _frame(rows).write_parquet(path)
    elif path.suffix == ".csv":
        _frame(rows).drop("itl_s").write_csv(path)
    else:
        _jsonl(path, rows)
    return path


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_reingest_into_a_store_with_other_rows_counts_exactly_the_overlap(
    tmp_path: Path, store: Store, suffix: str
) -> None:
    store.ingest_frame(_frame([ok_row(i) for i in range(100, 130)]), source="other")
    day = _write(tmp_path / f"day{suffix}", [ok_row(i) for i in range(20)])
    assert store.ingest_files([day])[0].rows_inserted == 20
    grown = _write(tmp_path / f"grown{suffix}", [ok_row(i) for i in range(25)] + [ok_row(110)])
    (report,) = store.ingest_files([grown])
    assert (report.rows_read, report.rows_inserted, report.rows_already_stored, report.rows_rejected) == (
        26, 5, 21, 0)
    assert _ids(store) == sorted(f"req-{i}" for i in [*range(25), *range(100, 130)])


def test_random_ids_and_disjoint_id_ranges_both_find_the_stored_rows(store: Store) -> None:
    rng = random.Random(7)
    stored = [ok_row(i, request_id=f"{rng.getrandbits(128):032x}") for i in range(200)]
    store.ingest_frame(_frame(stored))
    store.ingest_frame(_frame([ok_row(i, request_id=f"zz-{i:04d}") for i in range(50)]))  # a range of its own
    fresh = [ok_row(i, request_id=f"{rng.getrandbits(128):032x}") for i in range(300, 400)]
    mixed = rng.sample(stored, 40) + fresh + [ok_row(7, request_id="zz-0007")]
    rng.shuffle(mixed)
    report = store.ingest_frame(_frame(mixed))
    assert (report.rows_inserted, report.rows_already_stored) == (100, 41)
    report = store.ingest_frame(_frame([ok_row(i, request_id=f"aa-{i}") for i in range(10)]))
    assert (report.rows_inserted, report.rows_already_stored) == (10, 0)
    assert store.count() == 360 == len(set(_ids(store)))


def test_a_multi_chunk_input_skips_its_stored_ids_and_loads_the_new_ones(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "INSERT_CHUNK_ROWS", 7)
    store.ingest_frame(_frame([ok_row(i) for i in range(0, 40, 3)]))  # 14 of the 40 ids, in every chunk
    rows = [ok_row(i) for i in range(40)]
    random.Random(3).shuffle(rows)
    progress: list[tuple[str, int, int]] = []
    (report,) = store.ingest_files([_write(tmp_path / "big.parquet", rows)],
                                   on_progress=lambda *a: progress.append(a))
    assert (report.rows_read, report.rows_inserted, report.rows_already_stored) == (40, 26, 14)
    assert _ids(store) == sorted(f"req-{i}" for i in range(40))
    assert [d for s, d, _ in progress if s == "loading"] == [7, 14, 21, 28, 35, 40]
    again = store.ingest_files([tmp_path / "big.parquet"])[0]
    assert (again.rows_inserted, again.rows_already_stored) == (0, 40)


def test_an_invalid_row_anywhere_writes_nothing_even_when_its_id_is_stored(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "INSERT_CHUNK_ROWS", 4)
    store.ingest_frame(_frame([ok_row(i) for i in range(3)]))
    before = _stored(store)
    rows = [ok_row(i) for i in range(20)]
    rows[1] = ok_row(1, queue_s=-1.0)  # id already stored, row invalid: still an error
    rows[17] = ok_row(17, sent_tokens=99)  # in the last chunk
    bad = _write(tmp_path / "bad.parquet", rows)
    with pytest.raises(InvalidInputError) as info:
        store.ingest_files([_write(tmp_path / "good.jsonl", [ok_row(i) for i in range(50, 60)]), bad])
    assert {(e.source, e.row, e.rule) for e in info.value.errors} == {
        (str(bad), 2, "negative"), (str(bad), 18, "sent_exceeds_generated")}
    assert info.value.invalid_rows == 2
    assert _stored(store) == before
    (report,) = store.ingest_files([_write(tmp_path / "fixed.parquet", [ok_row(i) for i in range(20)])])
    assert (report.rows_inserted, report.rows_already_stored) == (17, 3)  # the id side tables were rolled back


def test_skip_invalid_with_stored_ids_counts_each_row_once(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "INSERT_CHUNK_ROWS", 5)
    store.ingest_frame(_frame([ok_row(i) for i in range(0, 20, 2)]))
    rows = [ok_row(i) for i in range(20)]
    rows[12] = ok_row(12, finish_reason="done")  # stored id, invalid row
    rows[15] = ok_row(15, ttft_s="x")  # new id, invalid row
    (report,) = store.ingest_files([_write(tmp_path / "m.jsonl", rows)], skip_invalid=True)
    assert (report.rows_read, report.rows_inserted, report.rows_already_stored, report.rows_rejected) == (
        20, 9, 9, 2)
    rejected = [json.loads(line)["row"] for line in Path(report.rejected_path or "").read_text().splitlines()]
    assert rejected == [13, 16]
    assert _ids(store) == sorted(f"req-{i}" for i in range(20) if i != 15)


def test_files_of_one_call_that_share_ids_load_each_id_once(tmp_path: Path, store: Store) -> None:
    a = _write(tmp_path / "a.parquet", [ok_row(i) for i in range(10)])
    b = _write(tmp_path / "b.jsonl", [ok_row(i) for i in range(5, 15)])
    ra, rb = store.ingest_files([a, b])
    assert (ra.rows_inserted, ra.rows_already_stored, rb.rows_inserted, rb.rows_already_stored) == (10, 0, 5, 5)
    assert _ids(store) == sorted(f"req-{i}" for i in range(15))


def test_rows_written_around_the_store_or_before_the_id_tables_are_still_found(store: Store) -> None:
    store.ingest_frame(_frame([ok_row(0)]))
    store.ingest_frame(_frame([ok_row(0)]))  # an overlap: from now on the store keeps the id hashes too
    store.con.register("around", _frame([ok_row(i, request_id=f"x-{i}") for i in (1, 2)]).to_arrow())
    store.con.execute(f"INSERT INTO {SUMMARY_TABLE} SELECT * FROM around")  # not through Store
    report = store.ingest_frame(_frame([ok_row(i, request_id=f"x-{i}") for i in (1, 2, 3)]))
    assert (report.rows_inserted, report.rows_already_stored) == (1, 2)
    store.con.execute(f"DROP TABLE {ID_HASH_TABLE}")  # a store written before the id tables existed
    store.con.execute(f"DROP TABLE {ID_RANGE_TABLE}")
    report = store.ingest_frame(_frame([ok_row(i, request_id=f"x-{i}") for i in (1, 2, 3, 4)]))
    assert (report.rows_inserted, report.rows_already_stored) == (1, 3)
    assert _ids(store) == ["req-0", "x-1", "x-2", "x-3", "x-4"]


def test_a_matching_hash_alone_never_skips_a_new_row(store: Store) -> None:
    store.ingest_frame(_frame([ok_row(0), ok_row(9, request_id="zzz")]))
    assert store.ingest_frame(_frame([ok_row(0)])).rows_already_stored == 1  # an overlap: the hashes are kept
    # as if 'zzz' and 'req-1' had the same 64-bit hash: the hash table then says req-1 may be stored
    store.con.execute(f"UPDATE {ID_HASH_TABLE} SET h = hash('req-1') WHERE h = hash('zzz')")
    report = store.ingest_frame(_frame([ok_row(0), ok_row(1)]))
    assert (report.rows_inserted, report.rows_already_stored) == (1, 1)
    assert _ids(store) == ["req-0", "req-1", "zzz"]


def test_an_invalid_row_whose_id_is_stored_is_still_an_error(store: Store) -> None:
    store.ingest_frame(_frame([ok_row(0), ok_row(1)]))
    with pytest.raises(InvalidInputError) as info:
        store.ingest_frame(_frame([ok_row(0), ok_row(1, e2e_s=math.nan), ok_row(2)]))
    assert [(e.row, e.rule, e.column) for e in info.value.errors] == [(2, "non_finite", "e2e_s")]
    assert _ids(store) == ["req-0", "req-1"]


def test_merged_id_ranges_still_cover_every_stored_row(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "ID_RANGES_MAX", 3)
    for k in range(12):
        store.ingest_frame(_frame([ok_row(i, request_id=f"b{k:02d}-{i}") for i in range(5)]))
    n_ranges = store.con.sql(f"SELECT count(*), sum(n) FROM {ID_RANGE_TABLE}").fetchall()[0]
    assert n_ranges[0] <= 4 and n_ranges[1] == 60
    for k in range(12):  # each input's id range is narrow: only the range table can send it to the hashes
        report = store.ingest_frame(_frame([ok_row(i, request_id=f"b{k:02d}-{i}") for i in (0, 4, 9)]))
        assert (report.rows_inserted, report.rows_already_stored) == (1, 2)
    assert store.count() == 72


def test_ordered_ids_keep_no_hashes_until_an_input_overlaps_the_stored_ranges(store: Store) -> None:
    def tables() -> set[str]:
        return {r[0] for r in store.con.sql("SELECT table_name FROM duckdb_tables()").fetchall()}

    for day in ("2024-01-01", "2024-01-02"):
        store.ingest_frame(_frame([ok_row(i, request_id=f"{day}-{i:05d}") for i in range(50)]))
    assert ID_RANGE_TABLE in tables() and ID_HASH_TABLE not in tables()
    late = [ok_row(i, request_id=f"2024-01-01-{i:05d}") for i in (7, 70)]
    report = store.ingest_frame(_frame(late))
    assert (report.rows_inserted, report.rows_already_stored) == (1, 1)
    assert store.con.sql(f"SELECT count(*) FROM {ID_HASH_TABLE}").fetchall()[0][0] == store.count() == 101


@pytest.mark.parametrize(("memory_limit", "polars_from"), [(0, 0), (1_000, 1_000), (1_000, 0)],
                         ids=["duckdb-count-distinct", "numpy-sort", "polars-count"])
def test_duplicate_ids_are_caught_by_each_repeat_check(
    store: Store, monkeypatch: pytest.MonkeyPatch, memory_limit: int, polars_from: int
) -> None:
    monkeypatch.setattr(store_module, "MEMORY_CHECK_MAX_ROWS", memory_limit)
    monkeypatch.setattr(store_module, "POLARS_CHECK_MIN_ROWS", polars_from)
    rows = [ok_row(i) for i in range(30)]
    with pytest.raises(InvalidInputError) as info:
        store.ingest_frame(_frame([*rows, ok_row(12, model="m2")]))
    assert [(e.row, e.rule) for e in info.value.errors] == [(31, "duplicate_request_id")]
    assert store.count() == 0
    assert store.ingest_frame(_frame(rows)).rows_inserted == 30
