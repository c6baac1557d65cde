"""SLO thresholds read the same in every command: ``off`` switches one off, anything else is a positive
duration with a unit, and a bad spelling exits 2 naming the flag before any file is touched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmslo.cli._app import app
from llmslo.tests._rows import ok_row

runner = CliRunner()

EXPOSITION = """\
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.5"} 3
vllm:time_to_first_token_seconds_bucket{le="2.0"} 5
vllm:time_to_first_token_seconds_bucket{le="+Inf"} 6
vllm:time_to_first_token_seconds_sum 4
vllm:time_to_first_token_seconds_count 6
"""

REFUSED = ["0", "0s", "0ms", "0.0s", "-1", "-1s", "nan", "inf", "1e309", "2", "none", "", "2 parsecs"]
"""Not one of them switches the SLO off or sets it: ``0`` used to disable it silently while ``0s`` failed."""

# (command, threshold flags it takes, arguments naming an input that does not exist)
COMMANDS = [
    ("report", ("ttft", "tpot", "e2e"), ["--db", "{tmp}/missing.duckdb"]),
    ("scrape", ("ttft", "tpot", "e2e"), ["{tmp}/missing.prom"]),
    ("demo", ("ttft", "tpot"), ["--db", "{tmp}/demo.duckdb", "--trace", "{tmp}/missing.csv"]),
]
CASES = [(command, flag, args) for command, flags, args in COMMANDS for flag in flags]


def _run(tmp_path: Path, command: str, args: list[str], *extra: str) -> tuple[int, str]:
    argv = [command, *(a.format(tmp=tmp_path) for a in args), *extra]
    result = runner.invoke(app, argv)
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(("command", "flag", "args"), CASES)
@pytest.mark.parametrize("text", REFUSED)
def test_a_threshold_that_is_not_a_positive_duration_exits_2_naming_the_flag(
        tmp_path: Path, command: str, flag: str, args: list[str], text: str) -> None:
    code, output = _run(tmp_path, command, args, f"--{flag}", text)
    assert code == 2, output
    assert f"error: --{flag}: invalid duration {text!r}" in output
    assert f"to switch this SLO off, write --{flag} off" in output
    assert list(tmp_path.iterdir()) == []  # refused before anything was read or written


@pytest.mark.parametrize(("command", "flag", "args"), CASES)
@pytest.mark.parametrize("text", ["2s", "500ms", "1m", "off", "OFF"])
def test_a_valid_threshold_passes_on_to_the_inputs(
        tmp_path: Path, command: str, flag: str, args: list[str], text: str) -> None:
    code, output = _run(tmp_path, command, args, f"--{flag}", text)
    assert code == 1, output  # the missing input, not the threshold
    assert f"--{flag}" not in output


def _store(tmp_path: Path) -> Path:
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(ok_row(i)) + "\n" for i in range(5)))
    db = tmp_path / "s.duckdb"
    assert runner.invoke(app, ["ingest", str(src), "--db", str(db)]).exit_code == 0
    return db


@pytest.mark.parametrize(("text", "seconds"), [("2s", 2.0), ("500ms", 0.5), ("1m", 60.0), ("off", None)])
def test_report_applies_the_threshold_it_reads(tmp_path: Path, text: str, seconds: float | None) -> None:
    db = _store(tmp_path)
    result = runner.invoke(app, ["report", "--db", str(db), "--ttft", text, "--e2e", text, "--json"])
    assert result.exit_code == 0, result.output
    policy = json.loads(result.stdout)["policy"]
    assert policy["ttft_s"] == seconds and policy["e2e_s"] == seconds


@pytest.mark.parametrize(("text", "seconds"), [("2s", 2.0), ("500ms", 0.5), ("off", None)])
def test_scrape_applies_the_threshold_it_reads(tmp_path: Path, text: str, seconds: float | None) -> None:
    exposition = tmp_path / "m.prom"
    exposition.write_text(EXPOSITION)
    result = runner.invoke(app, ["scrape", str(exposition), "--ttft", text, "--json"])
    assert result.exit_code == 0, result.output
    checked = [a["threshold_s"] for a in json.loads(result.stdout)["slo_attainment"] if a["interval"] == "ttft_s"]
    assert checked == ([] if seconds is None else [seconds])


def test_a_threshold_too_long_for_a_float_says_so(tmp_path: Path) -> None:
    huge = "9" * 400 + "s"  # float() gives inf
    code, output = _run(tmp_path, "report", ["--db", "{tmp}/missing.duckdb"], "--ttft", huge)
    assert code == 2
    assert "too long to hold as a number of seconds" in output and "greater than zero" not in output
