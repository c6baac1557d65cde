"""``llmslo ingest|report|anomalies`` on the fleet databases: ``--database clickhouse --url chdb://…``, ``--source``
Parquet files with ``--memory-limit`` and ``--from/--to``; options that do not go together exit 2, naming them."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from llmslo.analysis.store import ParquetSummaryWriter, summary_table
from llmslo.telemetry import COLUMNS
from llmslo.tests._databases_support import differences
from llmslo.tests._rows import cancelled_row, ok_row, rejected_row

pytestmark = pytest.mark.integration
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _llmslo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmslo.cli", *args], capture_output=True, text=True, timeout=300)


def _rows(n: int = 3_000) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        at = T0 + i * 2.0  # 100 minutes
        if i % 10 == 3:
            rows.append(cancelled_row(i, arrival_unix_s=at, waited_s=3.0))
        elif i % 10 == 7:
            rows.append(rejected_row(i, arrival_unix_s=at))
        else:
            ttft = 0.2 + (i % 17) * 0.01 + (0.5 if 2_000 <= i < 2_600 else 0.0)
            rows.append(ok_row(i, arrival_unix_s=at, ttft_s=ttft, last_token_s=ttft + 1, e2e_s=ttft + 1.1,
                               model="a" if i % 2 else "b"))
    return [{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same summaries as a file, a DuckDB store, a ClickHouse (chdb) store and the sink's Parquet files."""
    tmp = tmp_path_factory.mktemp("fleet")
    rows = _rows()
    pq.write_table(summary_table(rows), tmp / "in.parquet")
    writer = ParquetSummaryWriter(tmp / "sink", rotate_rows=700)
    writer.write(rows)
    writer.close()
    db, ch = tmp / "s.duckdb", tmp / "ch"
    for args in (["--db", str(db)], ["--database", "clickhouse", "--url", f"chdb://{ch}"]):
        out = _llmslo("ingest", str(tmp / "in.parquet"), *args, "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["files"][0]["rows_inserted"] == len(rows)
    return {"tmp": tmp, "file": tmp / "in.parquet", "db": db, "ch": ch, "sink": tmp / "sink"}


def _sources(data: dict[str, Path]) -> dict[str, list[str]]:
    return {"duckdb": ["--db", str(data["db"])],
            "clickhouse": ["--database", "clickhouse", "--url", f"chdb://{data['ch']}"],
            "parquet": ["--source", f"{data['sink']}/**/*.parquet", "--memory-limit", "256MB"]}


def test_ingest_into_clickhouse_again_adds_nothing(data: dict[str, Path]) -> None:
    out = _llmslo("ingest", str(data["file"]), "--database", "clickhouse", "--url", f"chdb://{data['ch']}")
    assert out.returncode == 0, out.stderr
    assert "store chdb:" in out.stdout and "3,000 request summaries" in out.stdout
    assert "3,000 │" in out.stdout or "3,000 |" in out.stdout  # the "already stored" column


@pytest.mark.parametrize("window", [[], ["--window", "10m", "--by", "model"]], ids=["all", "windows"])
def test_every_source_gives_the_same_report(data: dict[str, Path], window: list[str]) -> None:
    reports = {}
    for name, args in _sources(data).items():
        out = _llmslo("report", *args, *window, "--json")
        assert out.returncode == 0, (name, out.stderr)
        reports[name] = json.loads(out.stdout)
    assert reports["duckdb"]["totals"]["attempted"] == 3_000
    assert differences(reports["duckdb"], reports["clickhouse"]) == []
    assert differences(reports["duckdb"], reports["parquet"]) == []


def test_from_and_to_keep_the_same_arrivals_on_every_source(data: dict[str, Path]) -> None:
    counts = {}
    for name, args in _sources(data).items():
        out = _llmslo("report", *args, "--from", "2026-01-01T00:10:00Z", "--to", str(T0 + 1_800), "--json")
        assert out.returncode == 0, (name, out.stderr)
        counts[name] = json.loads(out.stdout)["totals"]["attempted"]
    assert counts == dict.fromkeys(counts, 600)  # 20 minutes of one arrival every 2 s


def test_anomalies_find_the_same_shift_on_every_source(data: dict[str, Path]) -> None:
    found = {}
    for name, args in _sources(data).items():
        out = _llmslo("anomalies", *args, "--window", "5m", "--by", "", "--json")
        assert out.returncode == 0, (name, out.stderr)
        found[name] = json.loads(out.stdout)
    assert found["duckdb"]["findings"], "the shift at request 2,000 is found"
    assert differences(found["duckdb"], found["clickhouse"]) == []
    assert differences(found["duckdb"], found["parquet"]) == []


@pytest.mark.parametrize("command", [["report", "--db", "x.duckdb"], ["ingest", "f.jsonl", "--db", "x.duckdb"],
                                     ["anomalies", "--db", "x.duckdb"]])
def test_the_old_engine_spelling_is_refused_naming_database(command: list[str]) -> None:
    """``--engine`` now names an inference engine: the store option's old spelling exits 2 with the new one."""
    out = _llmslo(*command, "--engine", "clickhouse")
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "--database clickhouse" in out.stderr and "inference engine" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["report"], "give one of --db"),
    (["report", "--db", "x.duckdb", "--source", "y"], "give one of --db"),
    (["report", "--url", "chdb:///tmp/x"], "add --database clickhouse"),
    (["report", "--database", "clickhouse"], "needs --url"),
    (["report", "--database", "clickhouse", "--url", "chdb:///tmp/x", "--memory-limit", "1GB"], "--memory-limit"),
    (["report", "--database", "sqlite", "--db", "x"], "--database: 'sqlite'"),
    (["report", "--source", "x", "--memory-limit", "much"], "--memory-limit"),
    (["report", "--source", "x", "--from", "yesterday"], "--from"),
    (["report", "--source", "x", "--from", "100", "--to", "50"], "--to"),
    (["report", "--database", "clickhouse", "--url", "ftp://x"], "no ClickHouse URL"),
    (["ingest", "f.jsonl"], "--db FILE"),
    (["ingest", "f.jsonl", "--database", "clickhouse"], "--url"),
    (["anomalies", "--database", "clickhouse", "--url", "chdb:///tmp/x", "--tightening"], "--tightening"),
])
def test_options_that_do_not_go_together_exit_2_naming_them(args: list[str], message: str) -> None:
    out = _llmslo(*args)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert message in out.stderr and "Traceback" not in out.stderr


def test_a_missing_store_or_source_exits_1_with_the_fix(tmp_path: Path) -> None:
    out = _llmslo("report", "--database", "clickhouse", "--url", f"chdb://{tmp_path}/none")
    assert out.returncode == 1 and "no store at" in out.stderr and "llmslo ingest" in out.stderr
    out = _llmslo("report", "--source", f"{tmp_path}/none/**/*.parquet")
    assert out.returncode == 1 and "no Parquet file matches" in out.stderr
    out = _llmslo("report", "--database", "clickhouse", "--url", "http://127.0.0.1:9")
    reason = "cannot connect" if importlib.util.find_spec("clickhouse_connect") else "not installed"
    assert out.returncode == 1 and reason in out.stderr and "Traceback" not in out.stderr
