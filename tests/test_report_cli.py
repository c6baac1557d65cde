"""``llmslo report`` through the real command: the horizon (--until) and rates without arrival times."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl

from llmslo.analysis import Store, polars_schema
from llmslo.analysis.store import IMPORTS_TABLE, imports_ddl
from llmslo.telemetry import COLUMNS
from llmslo.tests._rows import ok_row

T0 = 1_700_000_000.0  # a multiple of 10


def _store(path: Path, rows: list[dict[str, Any]]) -> Path:
    with Store.open(path) as store:
        full = [{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows]
        store.ingest_frame(pl.DataFrame(full, schema=polars_schema()))
    return path


def _report(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "llmslo.cli", "report", "--db", str(db), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_until_sets_the_horizon_of_in_flight_requests(tmp_path: Path) -> None:
    # ok_row: e2e 1.6 s. Arrivals at t0+1 .. t0+9; at t0+9 the requests of t0+8 and t0+9 are still running
    db = _store(tmp_path / "s.duckdb", [ok_row(i, arrival_unix_s=T0 + 1 + i) for i in range(9)])
    whole = json.loads(_report(db, "--window", "10s", "--json").stdout)
    (g,) = whole["groups"]
    assert (g["attempted"], g["good"], g["in_flight"]) == (9, 9, 0) and whole["until_unix_s"] is None
    out = _report(db, "--window", "10s", "--until", str(T0 + 9), "--json")
    assert out.returncode == 0, out.stderr
    at = json.loads(out.stdout)
    (h,) = at["groups"]
    assert at["until_unix_s"] == T0 + 9
    assert (h["attempted"], h["good"], h["in_flight"], h["goodput_fraction"]) == (9, 7, 2, 1.0)
    assert h["rate_basis"]["seconds"] == 9.0  # the window was seen for 9 s before the horizon
    bad = _report(db, "--until", "nan")
    assert bad.returncode == 2 and "--until" in bad.stderr and "Traceback" not in bad.stderr


def test_the_table_says_why_rates_are_null(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.duckdb", [ok_row(i, request_id=f"bench#{i}", arrival_unix_s=0.0) for i in range(5)])
    with Store.open(db) as store:
        store.con.execute(imports_ddl())
        for name, kind in (("id_prefix", "VARCHAR"), ("run_duration_s", "DOUBLE"), ("run_duration_note", "VARCHAR")):
            store.con.execute(f"ALTER TABLE {IMPORTS_TABLE} ADD COLUMN IF NOT EXISTS {name} {kind}")
        store.con.execute(
            f"INSERT INTO {IMPORTS_TABLE} (content_sha256, source, kind, tool, rows_read, rows_imported, "
            "rows_inserted, rows_already_stored, arrivals_available, arrival_note, conversions, missing_fields, "
            "finish_reasons, imported_unix_s, id_prefix, run_duration_note) VALUES ('sha', '/runs/[bold]x.json', "
            "'llmperf', 'LLMPerf', 5, 5, 5, 0, FALSE, '', [], [], MAP {}, 0, 'bench', 'none recorded')")
    out = _report(db)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # the console wraps long lines
    assert "rates: 1 group(s) (all requests): rows from imports without arrival times: no run " \
           "duration (none recorded) (files: [bold]x.json)" in text
