"""What every command does the same way: exit status, flags in --help, --json, files left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from llmslo.cli._app import app
from llmslo.cli._common import EXIT_STATUS_HELP
from llmslo.rules import find_promtool

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "chat-slo.yaml"
runner = CliRunner()
needs_promtool = pytest.mark.skipif(find_promtool() is None,
                                    reason="promtool not installed: apt-get install prometheus")

# Each command, naming an input that does not exist ({tmp}: an empty folder): exit 1, naming the input.
MISSING_INPUT = [
    ["ingest", "{tmp}/none.jsonl", "--db", "{tmp}/s.duckdb"],
    ["report", "--db", "{tmp}/none.duckdb"],
    ["demo", "--db", "{tmp}/d.duckdb", "--trace", "{tmp}/none.csv"],
    ["import", "llmperf", "{tmp}/none.json", "--db", "{tmp}/s.duckdb"],
    ["scrape", "{tmp}/none.prom"],
    ["trace", "azure", "{tmp}/none.csv"],
    ["anomalies", "--db", "{tmp}/none.duckdb"],
    ["gpu", "import", "nvidia-smi", "{tmp}/none.csv", "--db", "{tmp}/s.duckdb"],
    ["gpu", "correlate", "--db", "{tmp}/none.duckdb"],
    ["rules", "generate", "{tmp}/none.yaml", "-o", "{tmp}/rules.yml"],
    ["rules", "check", "{tmp}/none.yml"],
    ["rules", "explain", "{tmp}/none.yaml"],
    ["rollout", "record", "{tmp}/none.json", "--db", "{tmp}/s.duckdb"],
    ["rollout", "list", "--db", "{tmp}/none.duckdb"],
    ["rollout", "compare", "--db", "{tmp}/none.duckdb", "--from", "0", "--to", "10"],
    ["drain", "advise", "--db", "{tmp}/none.duckdb", "--caller-timeout", "300s"],
    ["drain", "check", "{tmp}/none.yaml"],
]

# Each command with a command line that is wrong whatever the files hold: exit 2.
BAD_USAGE = [
    ["ingest", "--db", "{tmp}/s.duckdb"],  # no file
    ["report", "--db", "{tmp}/none.duckdb", "--by", "user"],
    ["report", "--db", "{tmp}/none.duckdb", "--json", "--csv"],
    ["demo", "--db", "{tmp}/d.duckdb", "--window", "0s"],
    ["import", "bogus", "{tmp}/none.json", "--db", "{tmp}/s.duckdb"],
    ["scrape", "{tmp}/none.prom", "--tpot", "0"],
    ["trace", "bogus", "{tmp}/none.csv"],
    ["trace", "azure", "{tmp}/none.csv", "--out", "{tmp}/schedule.csv"],
    ["stream-sim", "--drain", "x"],
    ["anomalies", "--db", "{tmp}/none.duckdb", "--window", "-5m"],
    ["gpu", "correlate", "--db", "{tmp}/none.duckdb", "--bucket", "1"],
    ["rules", "generate", "{tmp}/none.yaml"],  # no -o
    ["rules", "check", "{tmp}/none.yml", "--lint"],
    ["rules", "explain", "{tmp}/none.yaml", "--csv"],
    ["rollout", "compare", "--db", "{tmp}/none.duckdb", "--update", "u1", "--from", "0"],
    ["drain", "advise", "--db", "{tmp}/none.duckdb", "--caller-timeout", "300s", "--quantile", "1.5"],
]


def _run(argv: list[str], tmp: Path) -> tuple[int, str]:
    result = runner.invoke(app, [a.format(tmp=tmp) for a in argv])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize("argv", MISSING_INPUT, ids=lambda a: " ".join(a[:2]))
def test_a_missing_input_exits_1_naming_it_and_leaves_nothing(tmp_path: Path, argv: list[str]) -> None:
    code, output = _run(argv, tmp_path)
    assert code == 1, output
    missing = next(a for a in argv if "none." in a).format(tmp=tmp_path)
    assert output.startswith("error: ") and missing in output, output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", BAD_USAGE, ids=lambda a: " ".join(a[:3]))
def test_a_wrong_command_line_exits_2(tmp_path: Path, argv: list[str]) -> None:
    code, output = _run(argv, tmp_path)
    assert code == 2, output
    assert list(tmp_path.iterdir()) == []


def test_the_top_level_help_states_the_exit_status_convention() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert " ".join(EXIT_STATUS_HELP.split()) in " ".join(result.output.split())


def _commands() -> list[tuple[list[str], object]]:
    """Every command of ``llmslo`` with its path (``["rules", "check"]``)."""
    found: list[tuple[list[str], object]] = []

    def walk(command: object, path: list[str]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in subcommands.items():
                walk(sub, [*path, name])
        else:
            found.append((path, command))

    walk(typer.main.get_command(app), [])
    return found


@pytest.mark.parametrize(("path", "command"), _commands(), ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_boolean_options_print_as_plain_flags_in_help(path: list[str], command: object) -> None:
    flags = [p for p in getattr(command, "params", []) if getattr(p, "is_flag", False) and p.name != "help"]
    result = runner.invoke(app, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for flag in flags:
        (line,) = [x for x in lines if x.strip().startswith(flag.opts[0] + " ")]
        head = line.strip().split("  ")[0]
        assert head == ", ".join(flag.opts), f"{flag.opts[0]} prints as {head!r}"
    assert "<bool>" not in result.output and "--no-json" not in result.output


@pytest.mark.parametrize("path", [["rules", "generate"], ["rules", "check"], ["rules", "explain"]])
def test_every_rules_command_has_json(path: list[str]) -> None:
    assert "--json" in runner.invoke(app, [*path, "--help"]).output


def test_rules_generate_json_lists_what_it_wrote(tmp_path: Path) -> None:
    rules, tests = tmp_path / "rules.yml", tmp_path / "rules_test.yml"
    result = runner.invoke(app, ["rules", "generate", str(EXAMPLE), "-o", str(rules), "--tests", str(tests), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["rules_file"] == str(rules)
    assert sorted(data["test_files"]) == sorted(str(p) for p in tmp_path.glob("rules_test*.yml"))
    groups = yaml.safe_load(rules.read_text())["groups"]
    assert (data["rule_count"], data["group_count"]) == (sum(len(g["rules"]) for g in groups), len(groups))


@needs_promtool
def test_rules_check_json_gives_each_promtool_run(tmp_path: Path) -> None:
    rules, tests = tmp_path / "rules.yml", tmp_path / "rules_test.yml"
    generated = runner.invoke(app, ["rules", "generate", str(EXAMPLE), "-o", str(rules), "--tests", str(tests)])
    assert generated.exit_code == 0, generated.output
    test_files = sorted(tmp_path.glob("rules_test*.yml"))
    result = runner.invoke(app, ["rules", "check", str(rules), *map(str, test_files), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["rules"]["files"] == [str(rules)] and "SUCCESS" in data["rules"]["output"]
    assert [t["files"] for t in data["tests"]] == [[str(p)] for p in test_files]
    assert all(t["ok"] for t in data["tests"])
    broken = tmp_path / "broken.yml"
    broken.write_text("groups:\n  - name: g\n    rules:\n      - record: a:b:c\n        expr: sum(rate(x[5m])\n")
    failed = runner.invoke(app, ["rules", "check", str(broken), "--json"])
    assert failed.exit_code == 1
    assert json.loads(failed.stdout)["ok"] is False


@pytest.mark.integration
def test_demo_leaves_nothing_but_its_store_in_the_working_folder(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "llmslo.cli", "demo", "--json"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llmslo-demo.duckdb"]
    assert json.loads(out.stdout)["totals"]["attempted"] > 0
