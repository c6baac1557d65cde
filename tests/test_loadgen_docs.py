"""docs/loadgen.md tells the truth: every flag of ``llmslo load`` is in its flag table (and no flag that does not
exist), and its Python example runs (against the tests' SSE server under uvicorn)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import typer.main

from llmslo.cli._app import app
from llmslo.tests._loadgen_server import MODEL, ServerProcess

DOC = Path(__file__).resolve().parents[1] / "docs" / "loadgen.md"


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def test_the_flag_table_lists_every_flag_of_the_command_and_only_those() -> None:
    command = typer.main.get_command(app).commands["load"]  # type: ignore[attr-defined]
    real = {opt for p in command.params for opt in p.opts if opt.startswith("--")} - {"--help"}
    documented = set(re.findall(r"`(--[a-z0-9-]+)", _section("Every flag")))
    assert real - documented == set(), "flags missing from docs/loadgen.md"
    assert documented - real == set(), "docs/loadgen.md documents flags the command does not have"


@pytest.mark.integration
def test_the_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = textwrap.dedent(_section("Python API").split("```python\n", 1)[1].split("```", 1)[0])
    with ServerProcess() as srv:
        code = (code.replace("http://127.0.0.1:8000", srv.url(tokens=3)).replace('"llmslo-sim"', repr(MODEL))
                .replace("duration_s=60", "duration_s=2").replace("rate_per_s=20", "rate_per_s=10")
                .replace("handle_signals=True", "handle_signals=False"))
        monkeypatch.chdir(tmp_path)
        scope: dict[str, object] = {}
        exec(compile(code, str(DOC), "exec"), scope)
    result = scope["result"]
    assert result.rows and result.invalid_rows == 0  # type: ignore[attr-defined]
    written = sum(len(p.read_text().splitlines()) for p in (tmp_path / "client-summaries").glob("*.jsonl"))
    assert written == len(result.rows)  # type: ignore[attr-defined]
