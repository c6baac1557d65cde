"""Data reaches the terminal literally: no rich markup, no hyperlink, no emoji, no escape sequence.

Every command prints label values, file names and messages that come from data. They go through
``llmslo.cli._common.shown``; these tests feed hostile values to the real commands (a process, as a user
runs them) and check what comes out.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from llmslo.cli._common import shown
from llmslo.tests._rows import ok_row

MARKUP = "[/nonexistent]"
"""A closing tag with nothing to close: rich raises MarkupError on it."""
LINK = "[link=https://evil.example]click[/link]"
ESCAPE = "\x1b[31mred\x1b[0m"
EMOJI = ":smile:"
HOSTILE = (MARKUP, LINK, ESCAPE, EMOJI, "back\\")
FILE = f"[bold]{ESCAPE}"
"""Hostile and still a valid file name (no slash)."""


def llmslo(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmslo.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def _printed(markup: str) -> str:
    """What a console prints for ``markup`` (no terminal: no styles)."""
    buf = io.StringIO()
    Console(file=buf, width=200, emoji=False).print(markup, highlight=False)
    return buf.getvalue().rstrip("\n")


@pytest.mark.parametrize(("value", "printed"), [
    (MARKUP, MARKUP),
    (LINK, LINK),
    ("[bold]x[/bold] [#ff0000]y [@click]z", "[bold]x[/bold] [#ff0000]y [@click]z"),
    ("a\\[bold]b", "a\\[bold]b"),
    (ESCAPE, "\\x1b[31mred\\x1b[0m"),
    ("bell\x07 del\x7f csi\x9b nul\x00", "bell\\x07 del\\x7f csi\\x9b nul\\x00"),
    ("tab\tnew\nline\rcr", "tab\\x09new\\x0aline\\x0dcr"),
    ("\u202eevil\u200b\u2066", "\\u202eevil\\u200b\\u2066"),
    (EMOJI, EMOJI),
    ("back\\", "back\\"),
    ("two\\\\", "two\\\\"),
    ("plain · text ≥ 2", "plain · text ≥ 2"),
])
def test_shown_prints_every_value_as_its_characters(value: str, printed: str) -> None:
    assert _printed(shown(value)) == printed
    assert _printed(f"[dim]{shown(value)}[/dim] after") == printed + " after"  # inside other markup too


def test_shown_values_in_a_table_are_literal() -> None:
    table = Table()
    table.add_column("v")
    for value in HOSTILE:
        table.add_row(shown(value))
    buf = io.StringIO()
    Console(file=buf, width=200, emoji=False).print(table)
    text = buf.getvalue()
    assert "\x1b" not in text
    for value in (MARKUP, LINK, "\\x1b[31mred\\x1b[0m", EMOJI, "back\\ "):
        assert value in text


def test_messages_keep_their_line_breaks_but_no_other_control_character() -> None:
    assert _printed(shown("one\ntwo\x1b", newlines=True)) == "one\ntwo\\x1b"


def _assert_literal(text: str, *values: str) -> None:
    assert "\x1b" not in text, "a raw escape reached the terminal"
    assert "😄" not in text, "an emoji code was replaced"
    for value in values:
        assert value in text, value


@pytest.fixture
def hostile_store(tmp_path: Path) -> Path:
    """A store whose model names are hostile, loaded from a file whose name is hostile too."""
    rows = [ok_row(i, model=model) for i, model in enumerate(HOSTILE)]
    src = tmp_path / f"{FILE}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = llmslo("ingest", str(src), "--db", str(tmp_path / "h.duckdb"))
    assert out.returncode == 0, out.stderr
    _assert_literal(out.stdout, "[bold]\\x1b[31mred\\x1b[0m.jsonl")
    return tmp_path / "h.duckdb"


def test_report_tables_show_hostile_label_values_literally(hostile_store: Path) -> None:
    out = llmslo("report", "--db", str(hostile_store), "--by", "model")
    assert out.returncode == 0, out.stderr
    _assert_literal(out.stdout, MARKUP, LINK, "\\x1b[31mred\\x1b[0m", EMOJI, "back\\ ")
    assert out.stdout.count(MARKUP) == 4  # one row in each of the four tables


def test_anomalies_show_hostile_series_names_literally(hostile_store: Path) -> None:
    out = llmslo("anomalies", "--db", str(hostile_store), "--by", "model")
    assert out.returncode == 0, out.stderr
    _assert_literal(out.stdout, MARKUP, LINK, "\\x1b[31mred\\x1b[0m", EMOJI)


def test_scrape_shows_hostile_label_values_literally(tmp_path: Path) -> None:
    exposition = tmp_path / "m.prom"
    exposition.write_text("# TYPE vllm:num_requests_running gauge\n"
                          f'vllm:num_requests_running{{model_name="{MARKUP}{ESCAPE}"}} 3\n')
    out = llmslo("scrape", str(exposition))
    assert out.returncode == 0, out.stderr
    _assert_literal(out.stdout, f"model_name={MARKUP}\\x1b[31mred\\x1b[0m")


def test_trace_shows_hostile_model_names_literally(tmp_path: Path) -> None:
    trace = tmp_path / "b.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     f"0,{MARKUP}{ESCAPE}{EMOJI},10,20,30,Conversation log\n"
                     "1.5,ChatGPT,10,20,30,Conversation log\n")
    out = llmslo("trace", "burstgpt", str(trace))
    assert out.returncode == 0, out.stderr
    _assert_literal(out.stdout, f"{MARKUP}\\x1b[31mred\\x1b[0m{EMOJI}: 1")


def test_rules_output_shows_hostile_file_names_literally(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text((Path(__file__).resolve().parents[1] / "examples" / "chat-slo.yaml").read_text())
    rules = tmp_path / f"{FILE}.yml"
    out = llmslo("rules", "generate", str(spec), "-o", str(rules))
    assert out.returncode == 0, out.stderr
    _assert_literal(out.stdout, f"wrote {tmp_path}/[bold]\\x1b[31mred\\x1b[0m.yml")


def test_error_messages_show_hostile_names_literally(tmp_path: Path) -> None:
    missing = tmp_path / f"{FILE}.duckdb"
    out = llmslo("report", "--db", str(missing))
    assert out.returncode == 1
    _assert_literal(out.stderr, "[bold]\\x1b[31mred\\x1b[0m.duckdb")
