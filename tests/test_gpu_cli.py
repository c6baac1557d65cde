"""``llmslo gpu``: imports are idempotent, nothing to correlate is an error, ``--json`` everywhere, ``sample``
right with and without NVML, and data shown literally.

Rules protected: the same file imported twice (under any name) writes its rows once, keyed by the SHA-256
of its bytes and its kind; ``gpu correlate`` on a store without GPU or engine samples exits 1 with the
reason (the ``EXIT_INPUT`` of ``cli/_common.py``); ``gpu import --json`` and ``gpu sample --json`` print
one JSON object; engine metric names and file names reach the terminal as the characters they are.
(``gpu sample`` with and without NVML: ``tests/test_analysis_gpu.py``.)
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from typer.testing import CliRunner

from llmslo import telemetry
from llmslo.analysis import Store
from llmslo.analysis.gpu import ENGINE_TABLE, GPU_IMPORTS_TABLE, GPU_TABLE, GpuFormatError, import_gpu_file
from llmslo.cli._common import EXIT_INPUT, EXIT_USAGE
from llmslo.cli._gpu import gpu_app
from llmslo.tests._rows import ok_row

BASE = 1_700_000_000.0
SMI_HEADER = "time [s], index, utilization.gpu [%], power.draw [W]\n"


def _smi(path: Path, n: int = 20) -> Path:
    """An nvidia-smi --query-gpu CSV with relative times: ``n`` samples of one GPU, one a second."""
    path.write_text(SMI_HEADER + "".join(f"{k}.0, 0, {10 + (k * 37) % 90} %, {100 + 7 * k}.5 W\n" for k in range(n)))
    return path


def _count(db: Path, table: str) -> int:
    with Store.open(db, read_only=True) as store:
        return int(store.con.sql(f"SELECT count(*) FROM {table}").fetchall()[0][0])


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(gpu_app, list(args))


# ---- 6. import is idempotent -----------------------------------------------------------------------


def test_importing_the_same_file_twice_writes_its_rows_once(tmp_path: Path) -> None:
    db = tmp_path / "g.duckdb"
    first = _smi(tmp_path / "smi.csv")
    assert _invoke("import", "nvidia-smi", str(first), "--db", str(db), "--start", str(BASE)).exit_code == 0
    assert _count(db, GPU_TABLE) == 20
    copy = shutil.copy(first, tmp_path / "renamed.csv")  # the key is the content, not the name
    for path in (first, Path(copy)):
        res = _invoke("import", "nvidia-smi", str(path), "--db", str(db), "--start", str(BASE))
        assert res.exit_code == 0, res.output
        assert "was imported before (20 rows" in res.stdout and "nothing written" in res.stdout
    assert _count(db, GPU_TABLE) == 20 and _count(db, GPU_IMPORTS_TABLE) == 1


def test_the_same_file_with_other_time_options_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    con = duckdb.connect()
    smi = _smi(tmp_path / "smi.csv")
    done = import_gpu_file(con, "nvidia-smi", smi, start_unix_s=BASE)
    assert (done.rows_written, done.already_imported, done.table) == (20, False, GPU_TABLE)
    with pytest.raises(GpuFormatError, match=r"imported before as nvidia-smi .* with --start 1\.7e\+09"):
        import_gpu_file(con, "nvidia-smi", smi, start_unix_s=BASE + 60)
    again = import_gpu_file(con, "nvidia-smi", smi, start_unix_s=BASE)
    assert (again.rows_written, again.rows_recorded, again.already_imported) == (0, 20, True)
    assert again.content_sha256 == done.content_sha256 and len(done.content_sha256) == 64
    assert con.sql(f"SELECT count(*) FROM {GPU_TABLE}").fetchall()[0][0] == 20
    res = _invoke("import", "nvidia-smi", str(smi), "--db", str(tmp_path / "x.duckdb"), "--start", "5")
    assert res.exit_code == 0
    res = _invoke("import", "nvidia-smi", str(smi), "--db", str(tmp_path / "x.duckdb"), "--start", "6")
    assert res.exit_code == EXIT_INPUT and "would store its samples twice" in res.stderr


def test_a_failed_import_rolls_back_and_a_new_store_is_not_left_behind(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(SMI_HEADER + "0.0, 0, 3 %, 100 W\nabc, 0, 4 %, 100 W\n")
    db = tmp_path / "new.duckdb"
    res = _invoke("import", "nvidia-smi", str(bad), "--db", str(db), "--start", str(BASE))
    assert res.exit_code == EXIT_INPUT and "bad.csv:3" in res.stderr
    assert not db.exists()
    res = _invoke("import", "nvtop", str(bad), "--db", str(db))
    assert res.exit_code == EXIT_USAGE and "unknown GPU import kind" in res.stderr and not db.exists()


# ---- 7. nothing to correlate -------------------------------------------------------------------------


def test_correlate_on_a_store_without_gpu_data_says_so_and_exits_1(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    with Store.open(db) as store:
        store.ingest_frame(pl.DataFrame([ok_row(i, arrival_unix_s=BASE + i) for i in range(30)]))
    for args in ([], ["--json"]):
        res = _invoke("correlate", "--db", str(db), *args)
        assert res.exit_code == EXIT_INPUT, res.output
        assert "holds request summaries but no GPU or engine samples to correlate" in res.stderr
        assert "llmslo gpu import" in res.stderr and res.stdout == ""


def test_correlate_with_gpu_samples_alone_says_what_is_missing(tmp_path: Path) -> None:
    db = tmp_path / "g.duckdb"
    assert _invoke("import", "nvidia-smi", str(_smi(tmp_path / "s.csv")), "--db", str(db), "--start",
                   str(BASE)).exit_code == 0
    res = _invoke("correlate", "--db", str(db))
    assert res.exit_code == EXIT_INPUT
    assert "neither request summaries placed in time nor engine samples" in " ".join(res.stderr.split())


def test_correlate_with_too_few_buckets_is_an_error_not_an_empty_table(tmp_path: Path) -> None:
    db = tmp_path / "g.duckdb"
    assert _invoke("import", "nvidia-smi", str(_smi(tmp_path / "s.csv", n=4)), "--db", str(db),
                   "--start", str(BASE)).exit_code == 0
    with Store.open(db) as store:
        store.ingest_frame(pl.DataFrame([ok_row(i, arrival_unix_s=BASE + i) for i in range(4)]))
    res = _invoke("correlate", "--db", str(db))
    assert res.exit_code == EXIT_INPUT and "no signal and target share 10 buckets" in res.stderr


def test_sources_far_apart_in_time_are_refused_before_the_grid_is_laid_out(tmp_path: Path) -> None:
    db = tmp_path / "g.duckdb"
    assert _invoke("import", "nvidia-smi", str(_smi(tmp_path / "s.csv")), "--db", str(db),
                   "--start", "0").exit_code == 0  # at 1970
    engine = tmp_path / "engine.csv"
    engine.write_text("time [s],num_requests_running\n" + "".join(f"{k},{k % 5}\n" for k in range(20)))
    assert _invoke("import", "vllm-engine", str(engine), "--db", str(db), "--start", str(BASE)).exit_code == 0
    res = _invoke("correlate", "--db", str(db))
    assert res.exit_code == EXIT_INPUT and "--start" in res.stderr and "buckets" in res.stderr


# ---- 8. --json -----------------------------------------------------------------------------------------


def test_import_json_is_one_object_with_the_key_and_the_rows(tmp_path: Path) -> None:
    db = tmp_path / "g.duckdb"
    smi = _smi(tmp_path / "smi.csv")
    docs = [json.loads(_invoke("import", "nvidia-smi", str(smi), "--db", str(db), "--start", str(BASE),
                               "--json").stdout) for _ in (1, 2)]
    assert [(d["rows_written"], d["rows_recorded"], d["already_imported"]) for d in docs] == [(20, 20, False),
                                                                                           (0, 20, True)]
    assert docs[0]["content_sha256"] == docs[1]["content_sha256"] and docs[0]["table"] == GPU_TABLE
    assert docs[0]["db"] == str(db) and docs[0]["kind"] == "nvidia-smi" and docs[0]["source"] == str(smi)


class _FakeSampler:
    """Stands in for :class:`llmslo.telemetry.GpuSampler`: two GPUs, one reading each at start."""

    def __init__(self, *, interval_s: float, sink: Callable[[list[dict[str, Any]]], None]) -> None:
        self.sink = sink
        self.unavailable_reason = None

    def start(self) -> bool:
        self.sink([{"time_unix_s": BASE, "gpu": str(g), "source": "nvml", "util_gpu_pct": 50.0} for g in (0, 1)])
        return True

    def stop(self) -> None:
        return None


def test_sample_json_reports_the_samples_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "GpuSampler", _FakeSampler)
    db = tmp_path / "s.duckdb"
    res = _invoke("sample", "--db", str(db), "--interval", "100ms", "--duration", "100ms", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"db": str(db), "interval_s": 0.1, "duration_s": 0.1, "samples_written": 2}
    assert _count(db, GPU_TABLE) == 2


# ---- 10. data shown literally ------------------------------------------------------------------------------

ODD_NAMES = ("[/nonexistent]", "[link=http://x]y", "\x1b[31m")


def test_engine_metric_names_are_shown_literally_in_the_correlation_table(tmp_path: Path) -> None:
    engine = tmp_path / "engine.csv"
    header = ",".join(["time [s]", *(f'"{n}"' for n in ODD_NAMES), "num_requests_running"])
    lines = [f"{k},{(k * 13) % 7},{(k * 5) % 11},{k % 3},{k}" for k in range(30)]
    engine.write_text(header + "\n" + "\n".join(lines) + "\n")
    db = tmp_path / "e.duckdb"
    res = _invoke("import", "vllm-engine", str(engine), "--db", str(db), "--start", str(BASE))
    assert res.exit_code == 0, res.output
    with Store.open(db, read_only=True) as store:
        names = {r[0] for r in store.con.sql(f"SELECT DISTINCT name FROM {ENGINE_TABLE}").fetchall()}
    assert set(ODD_NAMES) <= names
    res = _invoke("correlate", "--db", str(db))
    assert res.exit_code == 0, res.output
    assert "[/nonexistent]" in res.stdout and "[link=http://x]y" in res.stdout and "\\x1b[31m" in res.stdout
    assert "\x1b" not in res.stdout


def test_an_engine_header_that_cannot_be_a_column_is_refused(tmp_path: Path) -> None:
    engine = tmp_path / "engine.csv"
    engine.write_text("time [s],a,a\n0,1,2\n")
    with pytest.raises(GpuFormatError, match=r"column 3 of the header \('a'\) appears twice"):
        import_gpu_file(duckdb.connect(), "vllm-engine", engine, start_unix_s=BASE)
