"""The ``llmslo`` command, run as a user runs it (a real process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmslo.tests._rows import cancelled_row, ok_row, rejected_row

REAL_TRACE = Path(__file__).resolve().parents[2] / "shared" / "real_data" / "azure" / "AzureLLMInferenceTrace_conv.csv"


def llmslo(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmslo.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def db(tmp_path: Path) -> Path:
    rows = [ok_row(i, model="a" if i % 2 else "b") for i in range(30)]
    rows += [rejected_row(100, model="a"), cancelled_row(101, model="b")]
    src = _jsonl(tmp_path / "s.jsonl", rows)
    out = llmslo("ingest", str(src), "--db", str(tmp_path / "s.duckdb"), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["files"][0]["rows_inserted"] == 32
    return tmp_path / "s.duckdb"


def test_report_json_has_the_documented_shape(db: Path) -> None:
    out = llmslo("report", "--db", str(db), "--ttft", "2s", "--tpot", "100ms", "--by", "model", "--json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["policy"]["ttft_s"] == 2.0 and "good =" in rep["policy"]["rule"]
    assert [g["keys"]["model"] for g in rep["groups"]] == ["a", "b"]
    for g in rep["groups"]:
        assert {"attempted", "good", "in_flight", "goodput_fraction", "request_goodput_per_s",
                "token_goodput_per_s", "latency", "tokens", "survivor_bias"} <= set(g)
        assert set(g["latency"]) == {"ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s", "client_ttft_s"}
    assert sum(g["attempted"] for g in rep["groups"]) == 32


def test_report_tables_and_csv(db: Path) -> None:
    text = llmslo("report", "--db", str(db), "--window", "1m")
    assert text.returncode == 0, text.stderr
    assert "Goodput" in text.stdout and "Survivor bias" in text.stdout and "Policy: good =" in text.stdout
    assert "divide by the window length (1m)" in text.stdout
    csv = llmslo("report", "--db", str(db), "--csv", "--by", "finish_reason")
    lines = csv.stdout.strip().splitlines()
    assert lines[0].startswith("finish_reason,attempted,good") and len(lines) == 4


def test_bad_arguments_get_a_clear_message_and_exit_code(tmp_path: Path, db: Path) -> None:
    bad = llmslo("report", "--db", str(db), "--ttft", "2 parsecs")
    assert bad.returncode == 2 and "--ttft: invalid duration '2 parsecs'" in bad.stderr
    missing = llmslo("report", "--db", str(tmp_path / "none.duckdb"))
    assert missing.returncode == 1 and "llmslo ingest" in missing.stderr
    by = llmslo("report", "--db", str(db), "--by", "user")
    assert by.returncode == 2 and "unknown column 'user'" in by.stderr


def test_invalid_file_exits_non_zero_names_the_row_and_writes_nothing(tmp_path: Path, db: Path) -> None:
    src = _jsonl(tmp_path / "bad.jsonl", [ok_row(500), ok_row(501, ttft_s=5.0, last_token_s=5.0)])
    out = llmslo("ingest", str(src), "--db", str(db))
    assert out.returncode == 1
    assert "row 2, column ttft_s" in out.stderr and "ttft_after_e2e" in out.stderr
    again = llmslo("report", "--db", str(db), "--json")
    assert json.loads(again.stdout)["totals"]["attempted"] == 32


def test_help_teaches_the_columns_and_durations() -> None:
    out = llmslo("ingest", "--help")
    assert out.returncode == 0 and "request_id" in out.stdout and "--skip-invalid" in out.stdout
    # its paragraphs are rewrapped as prose: no docstring indentation left inside a line
    assert "negative or NaN intervals" in " ".join(out.stdout.split()) and "NaN  " not in out.stdout
    rep = llmslo("report", "--help")
    assert "250ms" in rep.stdout or "500ms" in rep.stdout


def test_help_texts_show_the_values_the_commands_accept() -> None:
    """``llmslo.cli._help`` copies constants of the heavy analysis subpackages (so ``--help`` loads none of
    them); each copy must equal its source."""
    from llmslo.analysis.anomaly import ANOMALY_METRICS
    from llmslo.analysis.gpu import GPU_IMPORT_KINDS
    from llmslo.analysis.report import GROUP_COLUMNS
    from llmslo.analysis.workload import TRACE_KINDS
    from llmslo.cli import _help

    assert GROUP_COLUMNS == _help.GROUP_COLUMNS
    assert tuple(ANOMALY_METRICS) == _help.ANOMALY_METRICS
    assert GPU_IMPORT_KINDS == _help.GPU_IMPORT_KINDS
    assert TRACE_KINDS == _help.TRACE_KINDS


def test_without_the_analysis_stack_help_works_and_commands_give_the_install_hint(tmp_path: Path) -> None:
    def without_duckdb(*args: str) -> subprocess.CompletedProcess[str]:
        code = (f"import sys\nsys.modules['duckdb'] = None  # as if not installed\nsys.argv = ['llmslo', *{args!r}]\n"
                "from llmslo.cli import main\nmain()")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)

    helped = without_duckdb("report", "--help")
    assert helped.returncode == 0 and "--ttft" in helped.stdout, helped.stderr
    ran = without_duckdb("report", "--db", str(tmp_path / "s.duckdb"))
    assert ran.returncode == 1, ran.stderr  # something the command needs is missing, like a file
    assert "duckdb is not installed" in ran.stderr and "pip install 'llmslo[analysis]'" in ran.stderr
    assert "Traceback" not in ran.stderr


@pytest.mark.integration
def test_demo_shows_survivor_bias_on_the_real_trace(tmp_path: Path) -> None:
    if not REAL_TRACE.is_file():
        pytest.skip(f"real Azure trace not found at {REAL_TRACE}")
    out = llmslo("demo", "--db", str(tmp_path / "demo.duckdb"), "--trace", str(REAL_TRACE), "--json",
                 cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    verdicts = [g["survivor_bias"]["verdict"] for g in rep["groups"]]
    assert "optimistic" in verdicts and "consistent" in verdicts
    assert any(g["survivor_bias"]["accounting"]["rejected"] > 0 for g in rep["groups"])
    # a second run replaces its own store instead of failing
    assert llmslo("demo", "--db", str(tmp_path / "demo.duckdb"), "--trace", str(REAL_TRACE), "--json",
                  cwd=tmp_path).returncode == 0


def test_ingest_takes_a_folder_of_summaries_as_its_jsonl_files(tmp_path: Path) -> None:
    (tmp_path / "rows").mkdir()
    _jsonl(tmp_path / "rows" / "summaries-1-1.jsonl", [ok_row(i) for i in range(3)])
    _jsonl(tmp_path / "rows" / "summaries-2-1.jsonl", [rejected_row(10)])
    (tmp_path / "rows" / "notes.txt").write_text("not a summary file\n")
    out = llmslo("ingest", "rows", "--db", "s.duckdb", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [f["file"] for f in report["files"]] == ["rows/summaries-1-1.jsonl", "rows/summaries-2-1.jsonl"]
    assert report["store_rows"] == 4
    (tmp_path / "empty").mkdir()
    empty = llmslo("ingest", "empty", "--db", "s.duckdb", cwd=tmp_path)
    assert empty.returncode == 1 and "empty: a folder without a .jsonl file" in empty.stderr


def test_report_by_backend_names_the_requests_no_backend_served(tmp_path: Path) -> None:
    rows = [{**ok_row(i), "backend": "a"} for i in range(3)] + [{**rejected_row(10), "backend": None}]
    _jsonl(tmp_path / "rows.jsonl", rows)
    assert llmslo("ingest", "rows.jsonl", "--db", "s.duckdb", cwd=tmp_path).returncode == 0
    out = llmslo("report", "--db", "s.duckdb", "--by", "backend", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    goodput = out.stdout.split("Latency")[0]
    assert "│ no backend │" in goodput and "│ a " in goodput and "None" not in goodput
