"""The ClickHouse store (on chdb): DDL from the contract, ingest with the DuckDB store's rules, idempotency on
``request_id`` by a check at ingest, and the sink writer that never blocks the request path."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from llmslo.analysis import InvalidInputError, Store, StoreError, StoreVersionError, polars_schema
from llmslo.analysis.store import (
    META_TABLE,
    SUMMARY_TABLE,
    ClickHouseError,
    ClickHouseStore,
    ClickHouseSummaryWriter,
    clickhouse_summary_ddl,
    parse_clickhouse_url,
)
from llmslo.telemetry import COLUMN_NAMES, COLUMNS, SCHEMA_VERSION, ConfigurationError, SummarySink, Telemetry
from llmslo.tests._databases_support import chdb_folder, chdb_url, fresh_clickhouse
from llmslo.tests._rows import BREAKERS, cancelled_row, ok_row, rejected_row

GOOD = [ok_row(0), ok_row(1, itl_s=[0.1] * 10), rejected_row(2), cancelled_row(3)]


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame([{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows], schema=polars_schema())


def _stored(store: ClickHouseStore) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = store.client.query_arrow(
        f"SELECT {', '.join(COLUMN_NAMES)} FROM {SUMMARY_TABLE} ORDER BY request_id").to_pylist()
    return rows


def _duck_stored(store: Store) -> list[dict[str, Any]]:
    rel = store.con.sql(f"SELECT * FROM {SUMMARY_TABLE} ORDER BY request_id")
    return [{**dict(zip(rel.columns, r, strict=True))} for r in rel.fetchall()]


def test_the_table_is_a_merge_tree_partitioned_by_day_and_ordered_by_model_version_arrival() -> None:
    with fresh_clickhouse() as store:
        (table,) = store.client.query_arrow(
            "SELECT engine, partition_key, sorting_key FROM system.tables "
            f"WHERE database = currentDatabase() AND name = '{SUMMARY_TABLE}'").to_pylist()
        types = dict(store.client.query_arrow(
            "SELECT name, type FROM system.columns WHERE database = currentDatabase() "
            f"AND table = '{SUMMARY_TABLE}' ORDER BY position").to_pylist()[i].values() for i in range(len(COLUMNS)))
    assert table["engine"] == "MergeTree"
    assert "toDate" in table["partition_key"] and "arrival_unix_s" in table["partition_key"]
    assert table["sorting_key"] == "model, version, arrival_unix_s"
    assert list(types) == list(COLUMN_NAMES)  # every contract column, in the contract's order
    assert types["model"] == "LowCardinality(String)" and types["ttft_s"] == "Nullable(Float64)"
    assert types["itl_s"] == "Array(Float64)" and types["prompt_tokens"] == "Int64"
    assert clickhouse_summary_ddl().startswith(f"CREATE TABLE IF NOT EXISTS {SUMMARY_TABLE}")


def test_ingest_stores_the_rows_as_the_duckdb_store_does(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "in.jsonl", GOOD)
    with fresh_clickhouse() as ch, Store.open(tmp_path / "s.duckdb") as duck:
        (rep,) = ch.ingest_files([path])
        duck.ingest_files([path])
        assert (rep.rows_read, rep.rows_inserted, rep.rows_already_stored, rep.rows_rejected) == (4, 4, 0, 0)
        want = _duck_stored(duck)
        got = _stored(ch)
    for w in want:  # ClickHouse arrays are never NULL: a summary without gaps reads back as []
        w["itl_s"] = w["itl_s"] or []
    assert got == want


@pytest.mark.parametrize(("rule", "column", "overrides"), BREAKERS, ids=[f"{b[0]}-{b[1]}" for b in BREAKERS])
def test_each_rule_rejects_its_row_with_the_duckdb_stores_error_and_writes_nothing(
    tmp_path: Path, rule: str, column: str, overrides: dict[str, Any]
) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", [*GOOD, ok_row(9, **overrides)])
    with Store.open(tmp_path / "s.duckdb") as duck, pytest.raises(InvalidInputError) as want:
        duck.ingest_files([path])
    with fresh_clickhouse() as ch:
        with pytest.raises(InvalidInputError) as got:
            ch.ingest_files([path])
        assert ch.count() == 0
    assert str(got.value) == str(want.value)
    assert any(e.rule == rule and e.column == column and e.row == 5 for e in got.value.errors)


def test_skip_invalid_loads_the_valid_rows_and_writes_the_rejected_ones_beside_the_input(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "mixed.jsonl", [*GOOD, ok_row(9, ttft_s=-1.0)])
    with fresh_clickhouse() as ch:
        (rep,) = ch.ingest_files([path], skip_invalid=True)
        assert (rep.rows_inserted, rep.rows_rejected) == (4, 1) and ch.count() == 4
    rejected = [json.loads(line) for line in Path(str(rep.rejected_path)).read_text().splitlines()]
    assert [r["row"] for r in rejected] == [5] and rejected[0]["errors"][0]["rule"] == "negative"


def test_re_ingesting_adds_nothing_and_a_changed_row_is_a_conflict_that_keeps_the_stored_one(tmp_path: Path) -> None:
    first = _jsonl(tmp_path / "a.jsonl", GOOD)
    changed = _jsonl(tmp_path / "b.jsonl", [ok_row(0, ttft_s=0.7), ok_row(1, itl_s=[0.1] * 10), ok_row(5)])
    with fresh_clickhouse() as ch, Store.open(tmp_path / "s.duckdb") as duck:
        ch.ingest_files([first])
        (again,) = ch.ingest_files([first])
        assert (again.rows_inserted, again.rows_already_stored, again.rows_conflicting) == (0, 4, 0)
        (rep,) = ch.ingest_files([changed])
        assert (rep.rows_inserted, rep.rows_already_stored, rep.rows_conflicting) == (1, 1, 1)
        assert rep.conflicting_ids == ("req-0",) and "req-0" in (rep.conflict_note() or "")
        kept = {r["request_id"]: r for r in _stored(ch)}
        duck.ingest_files([first])
        assert duck.ingest_files([first]) == [again]
        assert duck.ingest_files([changed]) == [rep]  # the same report from both stores
    assert len(kept) == 5 and kept["req-0"]["ttft_s"] == 0.5


def test_a_retried_batch_inserts_only_what_its_first_attempt_did_not(tmp_path: Path) -> None:
    rows = [ok_row(i) for i in range(10)]
    with fresh_clickhouse() as ch:
        ch.ingest_frame(_frame(rows[:6]))
        rep = ch.ingest_frame(_frame(rows))
        assert (rep.rows_inserted, rep.rows_already_stored) == (4, 6) and ch.count() == 10


def test_duplicates_within_one_call_across_inputs_are_counted_as_the_duckdb_store_counts_them(tmp_path: Path) -> None:
    a = _jsonl(tmp_path / "a.jsonl", GOOD)
    b = _jsonl(tmp_path / "b.jsonl", [GOOD[0], ok_row(7)])
    with fresh_clickhouse() as ch, Store.open(tmp_path / "s.duckdb") as duck:
        got = [(r.rows_inserted, r.rows_already_stored) for r in ch.ingest_files([a, b])]
        want = [(r.rows_inserted, r.rows_already_stored) for r in duck.ingest_files([a, b])]
    assert got == want == [(4, 0), (1, 1)]


def test_a_version_1_store_gets_the_backend_column_when_opened(tmp_path: Path) -> None:
    with fresh_clickhouse() as ch:
        ch.ingest_files([_jsonl(tmp_path / "a.jsonl", GOOD)])
        url = f"chdb://{chdb_folder()}?database={ch.url.database}"
        ch.client.command(f"ALTER TABLE {SUMMARY_TABLE} DROP COLUMN backend")  # a version-1 store
        ch.client.command(f"TRUNCATE TABLE {META_TABLE}")
        ch.client.command(f"INSERT INTO {META_TABLE} VALUES ('schema_version', '1')")
        upgraded = ClickHouseStore.open(url)
        got = upgraded.client.query_arrow(f"SELECT count(), countIf(backend IS NULL) FROM {SUMMARY_TABLE}")
        assert [c.to_pylist()[0] for c in got.columns] == [len(GOOD), len(GOOD)]
        assert upgraded.meta("schema_version") == str(SCHEMA_VERSION)


def test_a_store_of_another_schema_version_or_a_foreign_table_is_refused() -> None:
    with fresh_clickhouse() as ch:
        url = f"chdb://{chdb_folder()}?database={ch.url.database}"
        ch.client.command(f"TRUNCATE TABLE {META_TABLE}")
        ch.client.command(f"INSERT INTO {META_TABLE} VALUES ('schema_version', '999')")
        with pytest.raises(StoreVersionError, match="schema version 999"):
            ClickHouseStore.open(url)
        ch.client.command(f"DROP TABLE {META_TABLE}")
        with pytest.raises(StoreError, match="not made by llmslo"):
            ClickHouseStore.open(url)
    with pytest.raises(StoreError, match="no store at"):
        ClickHouseStore.open(chdb_url("nothing_here"), create=False)


def test_urls_are_parsed_and_a_bad_one_names_the_option_without_its_password() -> None:
    u = parse_clickhouse_url("http://ana:s3cret@ch.example:8124?database=fleet")
    assert (u.kind, u.host, u.port, u.username, u.password, u.database) == ("http", "ch.example", 8124, "ana",
                                                                             "s3cret", "fleet")
    assert "s3cret" not in u.shown
    assert parse_clickhouse_url("https://ch.example").port == 8443
    assert parse_clickhouse_url("chdb:///var/lib/x").path == Path("/var/lib/x")
    assert parse_clickhouse_url("chdb:rel/x").path == Path("rel/x")
    for bad, why in (("postgres://h", "no ClickHouse URL"), ("chdb://", "needs a folder"),
                     ("http://h?database=1x", "must be a name"), ("http://h?db=x", "unknown parameter"),
                     ("http://:pw@:80", "names no host")):
        with pytest.raises(ConfigurationError, match=why) as err:
            parse_clickhouse_url(bad)
        assert "--url" in str(err.value) and "pw" not in str(err.value)


def test_a_second_chdb_folder_in_one_process_is_refused_with_the_reason(tmp_path: Path) -> None:
    with fresh_clickhouse(), pytest.raises(ClickHouseError, match="one folder per process"):
        ClickHouseStore.open(f"chdb://{tmp_path}")


def test_the_sink_writer_stores_valid_summaries_and_counts_what_it_leaves_out() -> None:
    with fresh_clickhouse() as ch:
        writer = ClickHouseSummaryWriter(f"chdb://{chdb_folder()}?database={ch.url.database}")
        sink = SummarySink(writer, batch_rows=50)
        tel = Telemetry(sink=sink)
        for i in range(120):
            with tel.request(f"r{i}", model="m") as t:
                t.schedule()
                t.commit()
                t.commit()
                t.finish("stop")
        sink({"request_id": "broken", "model": "m"})  # not a summary: left out and counted
        sink.close(timeout_s=30)
        assert ch.count() == 120
        assert (writer.rows_written, writer.rows_rejected) == (120, 1)
        writer.write([_frame([ok_row(0)]).to_dicts()[0]])
        writer.write([_frame([ok_row(0)]).to_dicts()[0]])  # a retried batch that had reached the store
        writer.close()
        assert (writer.rows_written, writer.rows_already_stored) == (121, 1)


def test_an_unreachable_server_never_blocks_the_request_path_and_its_losses_are_counted() -> None:
    pytest.importorskip("clickhouse_connect", reason="the HTTP path needs clickhouse-connect")
    writer = ClickHouseSummaryWriter("http://127.0.0.1:9?database=llmslo")  # nothing listens on port 9
    sink = SummarySink(writer, batch_rows=10, capacity=100)
    tel = Telemetry(sink=sink)
    started = time.perf_counter()
    for i in range(300):
        with tel.request(f"r{i}", model="m") as t:
            t.finish("stop")
    request_path_s = time.perf_counter() - started
    sink.close(timeout_s=1)
    print(f"300 requests with an unreachable ClickHouse: {request_path_s:.3f} s on the request path")
    assert writer.rows_written == 0
    assert sink.written == 0 and sum(sink.dropped.values()) == 300  # every summary counted: queue full or store error
    with pytest.raises(ClickHouseError, match="cannot connect"):
        writer.write(_frame([ok_row(0)]).to_dicts())


def test_writes_from_two_threads_go_through_one_connection_in_turn() -> None:
    with fresh_clickhouse() as ch:
        writer = ClickHouseSummaryWriter(f"chdb://{chdb_folder()}?database={ch.url.database}")
        batches = [[r for r in _frame([ok_row(100 * k + i) for i in range(20)]).to_dicts()] for k in range(6)]
        threads = [threading.Thread(target=writer.write, args=(b,)) for b in batches]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        writer.close()
        assert ch.count() == 120 and writer.batches_written == 6
