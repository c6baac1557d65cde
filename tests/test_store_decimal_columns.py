"""Exact decimal columns (DuckDB's ``epoch_ms(t) * 0.001``, Arrow's ``decimal128``) are read the same way by every
reader of request summaries: ``llmslo ingest`` (into DuckDB or ClickHouse) and ``llmslo report --source``.

Rules protected: a decimal of at most 6 decimal places is read as a float, so ingest and ``report --source`` of
the same file give the same figures (and ClickHouse the same as DuckDB); a finer decimal is read as a float
when no value changes by more than a microsecond; otherwise both readers refuse it naming the column, its type
and the fix, and nothing is written. Every command runs the installed ``llmslo`` from a temporary working
directory with relative paths, as a person runs it; figures agree as :func:`differences` says (floats summed in
another order may differ in their last bits).
"""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmslo.analysis.databases import open_parquet
from llmslo.analysis.store import SUMMARY_TABLE, Store, input_conversion, lossy_decimals
from llmslo.telemetry import COLUMNS
from llmslo.tests._databases_support import differences

pytestmark = pytest.mark.integration
LLMSLO = Path(sys.executable).parent / "llmslo"
COLUMN = {c.name: c for c in COLUMNS}

DUCKDB_COPY = """
COPY (
  SELECT 'req-' || i AS request_id, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END AS model, 'v1' AS version,
         'interactive' AS tenant_class,
         epoch_ms(TIMESTAMP '2026-01-01 00:00:00' + INTERVAL (i * 1537) MILLISECOND) * 0.001 AS arrival_unix_s,
         CASE WHEN i % 10 = 7 THEN 'client_cancel' ELSE 'stop' END AS finish_reason,
         CASE WHEN i % 10 = 7 THEN NULL ELSE 0.01 * (i % 5) END AS queue_s,
         CASE WHEN i % 10 = 7 THEN NULL ELSE 0.2 + 0.013 * (i % 17) END AS ttft_s,
         CASE WHEN i % 10 = 7 THEN NULL ELSE 1.2 + 0.013 * (i % 17) END AS last_token_s,
         CASE WHEN i % 10 = 7 THEN 3.5 ELSE 1.3 + 0.013 * (i % 17) END AS e2e_s,
         100 + i % 7 AS prompt_tokens,
         CASE WHEN i % 10 = 7 THEN 0 ELSE 11 + i % 3 END AS generated_tokens,
         CASE WHEN i % 10 = 7 THEN 0 ELSE 11 + i % 3 END AS sent_tokens,
         CASE WHEN i % 10 = 7 THEN NULL ELSE [0.09, 0.1 + 0.001 * (i % 9)] END AS itl_s
  FROM range(600) AS t(i)
) TO '{path}'
"""
"""A person's export: arrivals as ``epoch_ms(...) * 0.001``, durations and inter-token gaps as decimal literals
(DuckDB writes them all as exact decimals, the gaps as a list of them)."""


def _llmslo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LLMSLO), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def _report(cwd: Path, *args: str) -> dict[str, Any]:
    out = _llmslo(cwd, "report", *args, "--window", "5m", "--by", "model", "--json")
    assert out.returncode == 0, out.stderr
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def _duckdb_export(folder: Path) -> Path:
    path = folder / "summaries.parquet"
    con = duckdb.connect()
    con.execute(DUCKDB_COPY.format(path=path))
    con.close()
    return path


def _decimal_table(values: list[str], precision: int, scale: int, column: str = "arrival_unix_s") -> pa.Table:
    """Valid summaries whose ``column`` holds ``values`` as ``decimal128(precision, scale)``."""
    n = len(values)
    table = pa.table({
        "request_id": [f"req-{i}" for i in range(n)], "model": ["m1"] * n, "version": ["v1"] * n,
        "tenant_class": ["interactive"] * n, "arrival_unix_s": [1_767_225_600.0 + i for i in range(n)],
        "finish_reason": ["stop"] * n, "queue_s": [0.1] * n, "ttft_s": [0.5] * n, "last_token_s": [1.5] * n,
        "e2e_s": [1.6] * n, "prompt_tokens": [100] * n, "generated_tokens": [11] * n, "sent_tokens": [11] * n,
    })
    decimals = pa.array([Decimal(v) for v in values], type=pa.decimal128(precision, scale))
    return table.set_column(table.schema.get_field_index(column), column, decimals)


def test_a_duckdb_export_with_decimal_arrivals_gives_the_same_figures_from_ingest_and_source(tmp_path: Path) -> None:
    path = _duckdb_export(tmp_path)
    types = {f.name: f.type for f in pq.read_schema(path)}
    assert pa.types.is_decimal(types["arrival_unix_s"]) and pa.types.is_decimal(types["ttft_s"]), types
    assert pa.types.is_decimal(types["itl_s"].value_type), types
    out = _llmslo(tmp_path, "ingest", "summaries.parquet", "--db", "s.duckdb", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["files"][0]["rows_inserted"] == 600
    stored = _report(tmp_path, "--db", "s.duckdb")
    assert stored["totals"]["attempted"] == 600 and len(stored["groups"]) > 2
    assert differences(_report(tmp_path, "--source", "summaries.parquet"), stored) == []
    window = ("--from", "2026-01-01T00:02:00Z", "--to", "2026-01-01T00:07:00Z")
    in_window = _report(tmp_path, "--db", "s.duckdb", *window)
    assert 0 < in_window["totals"]["attempted"] < 600
    assert differences(_report(tmp_path, "--source", "summaries.parquet", *window), in_window) == []


def test_arrow_decimal128_24_3_arrivals_read_as_floats_by_both(tmp_path: Path) -> None:
    arrivals = [f"{1_767_225_600 + 7 * i}.{(37 * i) % 1000:03d}" for i in range(40)]
    pq.write_table(_decimal_table(arrivals, 24, 3), tmp_path / "arrow.parquet")
    assert _llmslo(tmp_path, "ingest", "arrow.parquet", "--db", "s.duckdb").returncode == 0
    with Store.open(tmp_path / "s.duckdb", read_only=True) as store:
        read = [r[0] for r in store.con.sql(f"SELECT arrival_unix_s FROM {SUMMARY_TABLE} ORDER BY request_id")
                .fetchall()]
    assert sorted(read) == sorted(float(Decimal(a)) for a in arrivals)
    assert differences(_report(tmp_path, "--source", "arrow.parquet"), _report(tmp_path, "--db", "s.duckdb")) == []


def test_a_finer_decimal_is_read_when_no_value_moves_by_a_microsecond(tmp_path: Path) -> None:
    arrivals = [f"{1_767_225_600 + i}.123456789" for i in range(5)]  # nanoseconds: a float keeps 1e-7 s
    pq.write_table(_decimal_table(arrivals, 38, 9), tmp_path / "ns.parquet")
    ingest = _llmslo(tmp_path, "ingest", "ns.parquet", "--db", "s.duckdb")
    assert ingest.returncode == 0, ingest.stderr
    assert differences(_report(tmp_path, "--source", "ns.parquet"), _report(tmp_path, "--db", "s.duckdb")) == []


def test_a_decimal_a_float_cannot_hold_to_a_microsecond_is_refused_by_every_reader(tmp_path: Path) -> None:
    arrivals = [f"{1_767_225_600_000 + i}.123456789" for i in range(5)]  # milliseconds with 9 decimal places
    pq.write_table(_decimal_table(arrivals, 38, 9), tmp_path / "ms.parquet")
    ingest = _llmslo(tmp_path, "ingest", "ms.parquet", "--db", "s.duckdb")
    report = _llmslo(tmp_path, "report", "--source", "ms.parquet")
    for out in (ingest, report):
        assert out.returncode == 1, out.stdout
        said = " ".join(out.stderr.split())
        assert "ms.parquet" in said and "arrival_unix_s is DECIMAL(38,9)" in said, said
        assert "more than 1e-06 s" in said and "cast it to DOUBLE when you write it" in said, said
    assert not (tmp_path / "s.duckdb").exists()  # nothing was written


def test_files_of_decimal_and_double_columns_are_read_together_without_losing_digits(tmp_path: Path) -> None:
    arrivals = [f"{1_767_225_600 + i}.250" for i in range(3)]
    pq.write_table(_decimal_table(arrivals, 24, 3), tmp_path / "a.parquet")  # the first file: its types lead
    doubles = _decimal_table(["0"] * 3, 24, 3).set_column(4, "arrival_unix_s", pa.array(
        [1_767_225_700.123456 + i for i in range(3)], pa.float64()))
    doubles = doubles.set_column(0, "request_id", pa.array([f"later-{i}" for i in range(3)]))
    pq.write_table(doubles.set_column(7, "ttft_s", pa.array([0.1234567] * 3)), tmp_path / "b.parquet")
    database = open_parquet(str(tmp_path))
    try:
        read = database.rows(f"SELECT arrival_unix_s, ttft_s FROM {SUMMARY_TABLE} ORDER BY arrival_unix_s")
    finally:
        database.close()
    assert [r["arrival_unix_s"] for r in read] == [float(Decimal(a)) for a in arrivals] + [
        1_767_225_700.123456 + i for i in range(3)]
    assert [r["ttft_s"] for r in read] == [0.5] * 3 + [0.1234567] * 3


def test_the_rule_is_one_function_for_every_reader() -> None:
    arrival = COLUMN["arrival_unix_s"]
    assert input_conversion(arrival, "DECIMAL(24,3)") == "cast"
    assert input_conversion(arrival, "DECIMAL(38,9)") == "cast"  # its values are checked: lossy_decimals
    assert input_conversion(arrival, "VARCHAR") == "parse"
    assert input_conversion(COLUMN["itl_s"], "DECIMAL(4,3)[]") == "cast"
    assert input_conversion(COLUMN["prompt_tokens"], "DECIMAL(24,3)") == "parse"
    assert input_conversion(COLUMN["prompt_tokens"], "UBIGINT") == "narrow"
    assert input_conversion(COLUMN["model"], "DECIMAL(24,3)") is None
    con = duckdb.connect()
    source = "(SELECT * FROM (VALUES (1, CAST('1767225600000.123456789' AS DECIMAL(38,9)), "
    source += "[CAST('0.1234567891' AS DECIMAL(18,10))])) AS t(r, arrival_unix_s, itl_s))"
    types = {"arrival_unix_s": "DECIMAL(38,9)", "itl_s": "DECIMAL(18,10)[]"}
    found = lossy_decimals(con, source, "r", types)
    assert [(f.column, f.row, f.value) for f in found] == [("arrival_unix_s", 1, "1767225600000.123456789")]
    exact = Decimal("1767225600000.123456789") - Decimal(float(Decimal("1767225600000.123456789")))
    assert found[0].loss_s == pytest.approx(float(abs(exact)), abs=1e-12)


def test_clickhouse_reads_what_ingest_and_source_read(tmp_path: Path) -> None:
    _duckdb_export(tmp_path)
    clickhouse = ("--database", "clickhouse", "--url", "chdb://ch")
    out = _llmslo(tmp_path, "ingest", "summaries.parquet", *clickhouse, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["files"][0]["rows_inserted"] == 600
    assert differences(_report(tmp_path, *clickhouse), _report(tmp_path, "--source", "summaries.parquet")) == []
    pq.write_table(_decimal_table([f"{1_767_225_600_000 + i}.123456789" for i in range(5)], 38, 9),
                   tmp_path / "ms.parquet")
    refused = _llmslo(tmp_path, "ingest", "ms.parquet", *clickhouse)
    assert refused.returncode == 1 and "arrival_unix_s is DECIMAL(38,9)" in " ".join(refused.stderr.split())
    assert _report(tmp_path, *clickhouse)["totals"]["attempted"] == 600  # nothing of ms.parquet was written
