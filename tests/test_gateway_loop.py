"""The gateway's event loop: uvloop's where installed, asyncio's otherwise, ``LLMSLO_LOOP`` to choose, and the
ready line saying which (the installed command, from a plain folder)."""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from llmslo.gateway import LOOP_CHOICES, event_loop_factory, loop_name
from llmslo.telemetry import ConfigurationError

READY_WAIT_S = 60.0
"""The longest wait for the gateway's ready line (seconds)."""

uvloop = pytest.importorskip("uvloop", reason="the gateway extra's uvloop: pip install 'llmslo[gateway]'")


def _kind(factory: object) -> str:
    loop = factory()  # type: ignore[operator]
    try:
        return loop_name(loop)
    finally:
        loop.close()


def test_auto_and_uvloop_give_uvloop_and_asyncio_gives_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    assert LOOP_CHOICES == ("auto", "uvloop", "asyncio")
    monkeypatch.delenv("LLMSLO_LOOP", raising=False)
    assert _kind(event_loop_factory()) == "uvloop"
    assert _kind(event_loop_factory(" UVLOOP ")) == "uvloop"
    assert _kind(event_loop_factory("asyncio")) == "asyncio"
    monkeypatch.setenv("LLMSLO_LOOP", "asyncio")
    assert _kind(event_loop_factory()) == "asyncio"
    assert _kind(asyncio.new_event_loop) == "asyncio"


def test_a_bad_choice_is_refused_naming_the_variable_and_the_choices() -> None:
    with pytest.raises(ConfigurationError, match=r"LLMSLO_LOOP: one of auto, uvloop, asyncio, got 'trio'"):
        event_loop_factory("trio")


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert _kind(event_loop_factory("auto")) == "asyncio"
    with pytest.raises(ConfigurationError, match=r"uvloop is not installed \(pip install 'llmslo\[gateway\]'"):
        event_loop_factory("uvloop")


def _ready_line(cwd: Path, loop: str | None) -> tuple[str, str]:
    """The first line ``llmslo gateway`` prints (started in ``cwd`` with ``LLMSLO_LOOP=loop``), and its stderr
    once stopped by its pid."""
    env = {k: v for k, v in os.environ.items() if k != "LLMSLO_LOOP"}
    if loop is not None:
        env["LLMSLO_LOOP"] = loop
    proc = subprocess.Popen([sys.executable, "-m", "llmslo.cli", "gateway", "--backend", "http://127.0.0.1:9",
                             "--port", "0", "--admin-port", "0", "--drain-settle", "0"], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        poll = select.poll()  # not select(): a long test run holds descriptors beyond its 1,024
        poll.register(proc.stdout, select.POLLIN)
        ready = poll.poll(READY_WAIT_S * 1000)  # bounded: a silent process fails
        line = proc.stdout.readline() if ready else ""  # the ready line, or "" when the process ended
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    return line, err


@pytest.mark.slow
def test_the_ready_line_says_which_loop_runs(tmp_path: Path) -> None:
    line, err = _ready_line(tmp_path, None)
    assert line.startswith("gateway on http://127.0.0.1:"), err
    assert line.rstrip().endswith("; event loop: uvloop")
    line, err = _ready_line(tmp_path, "asyncio")
    assert line.rstrip().endswith("; event loop: asyncio"), err


@pytest.mark.slow
def test_a_bad_loop_exits_2_with_the_message_and_starts_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "LLMSLO_LOOP": "trio"}
    done = subprocess.run([sys.executable, "-m", "llmslo.cli", "gateway", "--backend", "http://127.0.0.1:9",
                           "--port", "0", "--admin-port", "0", "--jsonl", "out"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "LLMSLO_LOOP: one of auto, uvloop, asyncio, got 'trio'" in done.stderr
    assert done.stdout == "" and not (tmp_path / "out").exists()
