"""The report's quantile definition: linear interpolation (the default) or nearest rank (``--quantiles``).

Ten requests with TTFTs of 1, 2, …, 10 s. By hand: linear interpolation reads the q-quantile at position
1 + q (n − 1) of the sorted values (p50 at 5.5 → 5.5 s; p90 at 9.1 → 9.1 s; p95 at 9.55 → 9.55 s; p99 at 9.91 →
9.91 s); nearest rank takes the value of rank ceil(q n) (p50: rank 5 → 5 s; p90: rank 9 → 9 s; p95: rank
ceil(9.5) = 10 → 10 s; p99: rank ceil(9.9) = 10 → 10 s).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from llmslo.analysis import GoodputPolicy, ReportSpec, Store, build_report, polars_schema
from llmslo.analysis.report import QUANTILE_METHODS
from llmslo.telemetry import COLUMNS, ConfigurationError
from llmslo.tests._rows import ok_row

TTFTS = [float(v) for v in range(1, 11)]
LABELS = ("p50", "p90", "p95", "p99")
BY_HAND = {
    "linear": (5.5, 9.1, 9.55, 9.91),
    "nearest-rank": (5.0, 9.0, 10.0, 10.0),
}
"""The hand-computed TTFT quantiles of :data:`TTFTS` (seconds), by definition (module docstring)."""


def _rows() -> list[dict[str, Any]]:
    """One successful request per TTFT; its ITL gaps are the TTFT itself (one gap), its e2e TTFT + 1.1 s."""
    return [ok_row(i, ttft_s=t, last_token_s=t + 1.0, e2e_s=t + 1.1, queue_s=0.1, generated_tokens=2,
                   sent_tokens=2, itl_s=[t]) for i, t in enumerate(TTFTS)]


def _store(path: Path) -> Path:
    with Store.open(path) as store:
        full = [{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in _rows()]
        store.ingest_frame(pl.DataFrame(full, schema=polars_schema()))
    return path


def _latency(report: dict[str, Any], interval: str) -> tuple[float, ...]:
    (group,) = report["groups"]
    return tuple(group["latency"][interval][label] for label in LABELS)


@pytest.mark.parametrize("method", QUANTILE_METHODS)
def test_each_definition_gives_the_hand_computed_quantiles_for_every_interval(tmp_path: Path, method: str) -> None:
    with Store.open(_store(tmp_path / "s.duckdb"), read_only=True) as store:
        report = build_report(store.con, ReportSpec(GoodputPolicy(), quantiles=method)).to_dict()  # type: ignore[arg-type]
    want = BY_HAND[method]
    assert _latency(report, "ttft_s") == pytest.approx(want, rel=1e-12)
    assert _latency(report, "itl_s") == pytest.approx(want, rel=1e-12)  # the unnested gaps, by the same definition
    assert _latency(report, "e2e_s") == pytest.approx(tuple(v + 1.1 for v in want), rel=1e-12)
    assert report["quantiles"] == method
    assert ("nearest rank" in report["definitions"]["quantiles"].lower()) == (method == "nearest-rank")


def test_quantiles_run_apart_under_a_memory_budget_keep_their_definition(tmp_path: Path) -> None:
    from llmslo.analysis.databases import DuckDBDatabase

    with Store.open(_store(tmp_path / "s.duckdb"), read_only=True) as store:
        for by in ((), ("finish_reason",)):
            spec = ReportSpec(GoodputPolicy(), by=by, quantiles="nearest-rank")
            apart = build_report(DuckDBDatabase(store.con, holistic_budget_bytes=1), spec).to_dict()
            assert apart == build_report(store.con, spec).to_dict()  # every quantile in a query of its own
            assert _latency(apart, "ttft_s") == pytest.approx(BY_HAND["nearest-rank"], rel=1e-12)
            assert _latency(apart, "itl_s") == pytest.approx(BY_HAND["nearest-rank"], rel=1e-12)


def test_the_clickhouse_path_gives_the_same_quantiles_by_each_definition(tmp_path: Path) -> None:
    support = pytest.importorskip("llmslo.tests._databases_support")
    from llmslo.analysis.databases import ClickHouseDatabase

    with Store.open(_store(tmp_path / "s.duckdb"), read_only=True) as store, support.fresh_clickhouse() as ch:
        support.copy_to_clickhouse(store.con, ch)
        for method in QUANTILE_METHODS:
            spec = ReportSpec(GoodputPolicy(), quantiles=method)
            on_clickhouse = build_report(ClickHouseDatabase(ch), spec).to_dict()
            on_duckdb = build_report(store.con, spec).to_dict()
            for interval in ("ttft_s", "itl_s", "e2e_s"):
                assert _latency(on_clickhouse, interval) == pytest.approx(_latency(on_duckdb, interval), rel=1e-12)
            assert _latency(on_clickhouse, "ttft_s") == pytest.approx(BY_HAND[method], rel=1e-12)


def test_an_unknown_definition_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match=r"--quantiles: 'median' is not one of linear, nearest-rank"):
        ReportSpec(GoodputPolicy(), quantiles="median")  # type: ignore[arg-type]


def _report(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "llmslo.cli", "report", "--db", str(db), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_the_command_says_the_definition_when_it_is_not_the_default(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.duckdb")
    default = _report(db)
    assert default.returncode == 0, default.stderr
    assert "nearest" not in default.stdout.lower()
    text = _report(db, "--quantiles", "nearest-rank")
    assert text.returncode == 0, text.stderr
    flat = " ".join(text.stdout.split())
    assert "Latency (exact quantiles by nearest-rank: --quantiles nearest-rank)" in flat
    assert "quantiles: NEAREST RANK (--quantiles nearest-rank, not the default)" in flat
    as_json = json.loads(_report(db, "--quantiles", "nearest-rank", "--json").stdout)
    assert as_json["quantiles"] == "nearest-rank"
    assert _latency(as_json, "ttft_s") == pytest.approx(BY_HAND["nearest-rank"], rel=1e-12)
    csv = _report(db, "--quantiles", "nearest-rank", "--csv").stdout.splitlines()
    header, row = csv[0].split(","), csv[1].split(",")
    assert row[header.index("quantiles")] == "nearest-rank"
    assert float(row[header.index("ttft_s_p95")]) == pytest.approx(10.0)
    bad = _report(db, "--quantiles", "median")
    assert bad.returncode == 2 and "--quantiles: 'median' is not one of linear, nearest-rank" in bad.stderr
    assert "Traceback" not in bad.stderr
