"""The commands the README and ``docs/*.md`` show exist as shown, and the server page's session is a real one.

What this covers, exactly:

* every ``llmslo …`` command line in a fenced ``sh`` (or ``bash``/``console``/``shell``) block of ``README.md``
  and ``docs/*.md`` (a ``$`` prompt, ``\\`` continuations, ``#`` comments, ``&&``/``;``/``|``/``&`` chains
  understood): its subcommands exist, and every option it passes (``--name``, ``--name=value``, ``-o``) is
  one of that command's options, read from the same click definitions ``llmslo CMD --help`` prints. It does
  not run them (many need a server, a GPU, files of the reader's own), nor check option values or the
  number of arguments;
* ``docs/server.md``'s example session is run as shown (``llmslo serve`` with its options, the ``curl``
  request sent as is) and every event of the stream must equal the page's, ``created`` aside.

The README's tour is also run for real, on the demo's store and ``../shared/real_data``, by
``tests/test_walkthrough.py``.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from llmslo.cli._app import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"sh", "bash", "console", "shell", ""}
"""Fence languages read as shell: the named ones, and a fence without one (``docs/rollouts.md`` uses those)."""
SEPARATORS = {"&&", "||", ";", "|", "&"}


def _lines(block: str) -> Iterator[str]:
    """The command lines of a shell block: prompts dropped, continuations joined, output lines skipped."""
    prompted = any(line.startswith("$ ") for line in block.splitlines())
    pending = ""
    for raw in block.splitlines():
        line = raw.rstrip()
        if pending:
            line = pending + " " + line.strip()
            pending = ""
        elif prompted:
            if not line.startswith("$ "):
                continue  # output shown after a command
            line = line[2:]
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        try:
            shlex.split(line, comments=True)
        except ValueError:  # a quote left open: the command goes on on the next line
            pending = line
            continue
        if line.strip():
            yield line


def shell_blocks(text: str) -> Iterator[tuple[int, str]]:
    """``(first line number, text)`` of each fenced block of ``text`` in a shell language (:data:`SHELL`)."""
    language: str | None = None
    body: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if language is None and line.startswith("```"):
            language, body, start = line[3:].strip(), [], number + 1
        elif language is not None and line.startswith("```"):
            if language in SHELL:
                yield start, "\n".join(body)
            language = None
        elif language is not None:
            body.append(line)


def shown_commands() -> list[tuple[str, int, list[str]]]:
    """``(page, line, argv after 'llmslo')`` of every llmslo command in the pages' shell blocks."""
    found: list[tuple[str, int, list[str]]] = []
    for page in PAGES:
        for start, block in shell_blocks(page.read_text()):
            for line in _lines(block):
                tokens = shlex.split(line, comments=True)
                segment: list[str] = []
                for token in [*tokens, ";"]:
                    if token in SEPARATORS:
                        if segment and Path(segment[0]).name == "llmslo":
                            found.append((page.name, start, segment[1:]))
                        segment = []
                    else:
                        segment.append(token)
    return found


def _is_group(command: Any) -> bool:
    return hasattr(command, "list_commands")


def _resolve(argv: list[str]) -> tuple[list[str], Any, list[str]]:
    """The subcommand path, the click command it reaches (typer's own click), and the arguments left for it."""
    command: Any = typer.main.get_group(app)
    path: list[str] = []
    rest = list(argv)
    while _is_group(command) and rest and not rest[0].startswith("-"):
        ctx = command.make_context("llmslo", [], resilient_parsing=True)
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            raise AssertionError(f"llmslo {' '.join([*path, rest[0]])}: no such command; "
                                 f"{' '.join(path) or 'llmslo'} has {', '.join(command.list_commands(ctx))}")
        path.append(rest.pop(0))
        command = sub
    return path, command, rest


def _options(command: Any) -> set[str]:
    """Every option name of ``command`` (what its ``--help`` lists), ``--help`` included."""
    names = {"--help"}
    for param in command.params:
        if getattr(param, "param_type_name", "") == "option":
            names.update(param.opts)
            names.update(param.secondary_opts)
    return names


COMMANDS = shown_commands()


def test_the_pages_show_commands() -> None:
    pages = {page for page, _, _ in COMMANDS}
    assert {"README.md", "server.md", "rollouts.md", "dashboards.md"} <= pages, pages
    assert len(COMMANDS) >= 40


@pytest.mark.parametrize(("page", "line", "argv"), COMMANDS,
                         ids=[f"{p}:{n}:{' '.join(a[:2])}" for p, n, a in COMMANDS])
def test_each_shown_command_and_option_exists(page: str, line: int, argv: list[str]) -> None:
    path, command, rest = _resolve(argv)
    runs_alone = getattr(command, "invoke_without_command", False)  # a group that is also a command (gateway)
    assert not _is_group(command) or runs_alone, f"{page}:{line}: llmslo {' '.join(path)} needs a subcommand"
    known = _options(command)
    for token in rest:
        if token == "--":
            break
        if token.startswith("-") and len(token) > 1 and not re.fullmatch(r"-\d[\d.]*", token):
            name = token.split("=", 1)[0]
            assert name in known, (f"{page}:{line}: llmslo {' '.join(path)} has no option {name}; "
                                   f"it has {', '.join(sorted(known))}")


def test_a_command_or_option_that_does_not_exist_is_caught() -> None:
    with pytest.raises(AssertionError, match="no such command"):
        _resolve(["gpu", "correlat", "--db", "s.duckdb"])
    with pytest.raises(AssertionError, match="llmslo report has no option --windw"):
        test_each_shown_command_and_option_exists("x.md", 1, ["report", "--db", "s.duckdb", "--windw", "5m"])
    with pytest.raises(AssertionError, match="llmslo gpu needs a subcommand"):
        test_each_shown_command_and_option_exists("x.md", 1, ["gpu", "--db", "s.duckdb"])
    with pytest.raises(AssertionError, match="llmslo gateway has no option --backnd"):
        test_each_shown_command_and_option_exists("x.md", 1, ["gateway", "--backnd", "http://h:1"])
    test_each_shown_command_and_option_exists("x.md", 1, ["report", "--db", "s.duckdb", "--window=5m"])  # passes
    test_each_shown_command_and_option_exists("x.md", 1, ["gateway", "--backend", "http://h:1"])  # passes


# ---- docs/server.md's example session, replayed -----------------------------------------------------------


def _session() -> tuple[list[str], dict[str, str], dict[str, object], list[object]]:
    """The page's serve options, the curl request's headers and body, and the stream it shows."""
    text = (ROOT / "docs" / "server.md").read_text()
    block = text[text.index("## An example session"):]
    block = block[block.index("```sh\n") + 6:]
    block = block[:block.index("\n```")]
    lines = list(_lines(block))
    serve = next(shlex.split(line, comments=True) for line in lines if line.startswith("llmslo serve"))
    serve = serve[:next((i for i, t in enumerate(serve) if t in SEPARATORS), len(serve))]  # "… &": in background
    curl = next(shlex.split(line, comments=True) for line in lines if line.startswith("curl"))
    headers = dict(curl[i + 1].split(": ", 1) for i, t in enumerate(curl) if t == "-H")
    body = json.loads(curl[curl.index("-d") + 1])
    events = [e.removeprefix("data: ") for e in block.splitlines() if e.startswith("data: ")]
    shown = [e if e == "[DONE]" else json.loads(e) for e in events]
    return serve[2:], headers, body, shown


def _without_created(event: object) -> object:
    return {k: v for k, v in event.items() if k != "created"} if isinstance(event, dict) else event


@pytest.mark.integration
def test_the_server_pages_session_streams_what_the_page_shows(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn", reason="the serve extra installs uvicorn: pip install 'llmslo[serve]'")
    exe = Path(sys.executable).parent / "llmslo"
    if not exe.is_file():
        pytest.skip(f"the installed llmslo command is not at {exe}")
    options, headers, body, shown = _session()
    assert shown and shown[-1] == "[DONE]"
    proc = subprocess.Popen([str(exe), "serve", *options], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "NO_COLOR": "1"})
    later: list[str] = []  # what it prints after the ready line
    reader: threading.Thread | None = None
    try:
        assert proc.stdout is not None
        port = 0
        for line in proc.stdout:
            found = re.match(r"serving \S+ on http://127\.0\.0\.1:(\d+)", line)
            if found:
                port = int(found.group(1))
                break
        assert port, "llmslo serve did not say where it listens"
        reader = threading.Thread(target=lambda: later.extend(proc.stdout or ()), daemon=True)
        reader.start()  # keep its output flowing, and keep it
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json", **headers})
        reply = conn.getresponse().read().decode()
        conn.close()
    finally:
        proc.terminate()  # the session's `kill -TERM %1`: the drain, then exit
        proc.wait(timeout=60)
        if reader is not None:
            reader.join(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    got = [e.removeprefix("data: ") for e in reply.split("\n\n") if e.startswith("data: ")]
    streamed = [e if e == "[DONE]" else json.loads(e) for e in got]
    assert [_without_created(e) for e in streamed] == [_without_created(e) for e in shown]
    assert proc.returncode == 0
    assert (tmp_path / "drain.json").is_file()  # --drain-record drain.json, as the page says
    assert [line.rstrip("\n") for line in later] == _printed_after_kill()  # each step of the drain, as shown


def _printed_after_kill() -> list[str]:
    """The lines the page shows the server printing after ``kill -TERM %1``."""
    text = (ROOT / "docs" / "server.md").read_text()
    block = text[text.index("## An example session"):]
    lines = block[:block.index("\n```", block.index("```sh\n"))].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("$ kill -TERM"))
    shown = []
    for line in lines[start + 1:]:
        if line.startswith("$ "):
            break
        shown.append(line)
    assert shown, "the page shows no line after kill"
    return shown
