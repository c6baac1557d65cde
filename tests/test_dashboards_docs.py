"""docs/dashboards.md: its Python example runs and its commands name real options."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path

import pytest

from llmslo.tests._dashboards import EXAMPLE, ROOT

PAGE = ROOT / "docs" / "dashboards.md"


def test_the_python_example_writes_both_dashboards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (code,) = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    (tmp_path / "examples").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "examples" / EXAMPLE.name)
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(PAGE), "exec"), {"__name__": "docs_example"})
    assert sorted(p.name for p in (tmp_path / "dashboards").iterdir()) == [
        "llmslo-chat-serving.json", "llmslo-chat-slo.json"]
    assert out.getvalue().splitlines()[0].startswith("Error budget left, every SLO | llmslo:slo_error_budget:")


def test_the_commands_of_the_page_use_options_the_command_has() -> None:
    from typer.testing import CliRunner

    from llmslo.cli._app import app

    help_text = CliRunner().invoke(app, ["dashboards", "generate", "--help"]).output
    commands = re.findall(r"^llmslo dashboards generate (.*?)(?:\s+#.*)?$", PAGE.read_text(), re.M)
    assert len(commands) == 4
    for command in commands:
        for option in re.findall(r"(?<!\S)(--?[a-z][a-z-]*)", command):
            assert option in help_text, (option, command)
    for sub in ("generate", "explain"):
        help_text = CliRunner().invoke(app, ["rules", sub, "--help"]).output
        for command in re.findall(rf"^llmslo rules {sub} (.*?)(?:\s+#.*)?$", PAGE.read_text(), re.M):
            for option in re.findall(r"(?<!\S)(--?[a-z][a-z-]*)", command):
                assert option in help_text, (option, command)


def test_the_table_of_what_each_engine_can_alert_on_is_what_the_rules_generate() -> None:
    from llmslo.engines import ENGINES
    from llmslo.rules._engine import support

    rows = re.findall(r"^\| (\w+) \| ((?:(?:yes|no) \| ){9}(?:yes|no)) \|$", PAGE.read_text(), re.M)
    table = {engine: cells.split(" | ") for engine, cells in rows}
    assert table == {key: ["yes" if why is None else "no" for _, _, why in support(profile)]
                     for key, profile in ENGINES.items()}


def test_the_refusal_shown_on_the_page_is_what_the_command_prints(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from llmslo.cli._app import app

    (shown,) = re.findall(r"```text\n\$ llmslo (rules generate .*?)\n(.*?)```", PAGE.read_text(), re.S)
    (tmp_path / "examples").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "examples" / EXAMPLE.name)
    args = shown[0].split()
    with contextlib.chdir(tmp_path):
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    printed = result.output.splitlines()
    for line, expected in zip(printed, shown[1].splitlines(), strict=True):
        head, _, tail = expected.partition("(...)")
        assert line.startswith(head.rstrip()) and line.endswith(tail.lstrip(". ").rstrip() or line[-1:]), (line,
                                                                                                          expected)
