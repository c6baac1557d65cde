"""Helpers of the load generator's tests: a schedule from offsets, a run against the test server, log lines, and
the installed ``llmslo`` command run as a person runs it."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from llmslo.controls import CircuitBreaker
from llmslo.loadgen import Arrival, LoadConfig, RunResult, Schedule, Target, run_load
from llmslo.telemetry import validate_summary

MODEL = "test-model"


def at(*offsets: float, prompt: int = 4, output: int = 8) -> Schedule:
    """A schedule with one arrival at each offset (seconds), all of the same lengths."""
    return Schedule(tuple(Arrival(i, t, prompt, output) for i, t in enumerate(offsets)), "test")


def run(url: str, schedule: Schedule, *, endpoint: str | None = None, client_breaker: CircuitBreaker | None = None,
        **config: Any) -> tuple[RunResult, list[dict[str, Any]]]:
    """Run ``schedule`` against ``url`` (``config``: :class:`LoadConfig`'s fields; ``client_breaker`` replaces the
    run's breaker); the result and the attempts log's entries (in the order they ended). Every row must be valid
    by the contract (checked here, for every test)."""
    log = io.StringIO()
    rows: list[dict[str, Any]] = []
    cfg = LoadConfig(Target.parse(url, endpoint), MODEL, **config)
    result = asyncio.run(run_load(schedule, cfg, sink=lambda r: rows.append(dict(r)), attempts_log=log,
                                  breaker=client_breaker))
    assert result.invalid_rows == 0
    assert rows == result.rows
    for row in rows:
        assert validate_summary(row) == [], row
    entries = [json.loads(line) for line in log.getvalue().splitlines()]
    assert len(entries) == len(rows) == len(schedule) - result.unsent
    return result, entries


def only(url: str, **config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """One attempt against ``url``: its row and its log entry."""
    result, entries = run(url, at(0.0), **config)
    return result.rows[0], entries[0]


LLMSLO = Path(sys.executable).parent / "llmslo"
"""The installed command (the console script of this environment)."""


def llmslo(*args: str, cwd: Path, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    """The installed ``llmslo`` with ``args``, run in ``cwd`` (so relative paths are the person's own)."""
    assert LLMSLO.is_file(), f"the command is not installed at {LLMSLO}"
    return subprocess.run([str(LLMSLO), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s)


def attempts_log(path: Path) -> list[dict[str, Any]]:
    """The lines of an attempts log, in the order the attempts ended."""
    return [json.loads(line) for line in path.read_text().splitlines()]
