"""Running promtool (Prometheus's own checker) on generated files."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llmslo.rules._errors import PromtoolError

INSTALL_HINT = "promtool not installed: apt-get install prometheus (it ships promtool)"


@dataclass(frozen=True)
class PromtoolResult:
    """One promtool run: the command, whether it passed, its output, and how long it took (seconds)."""

    command: tuple[str, ...]
    ok: bool
    output: str
    seconds: float


def find_promtool() -> str | None:
    """The promtool executable on PATH, or ``None``."""
    return shutil.which("promtool")


def _promtool() -> str:
    found = find_promtool()
    if found is None:
        raise PromtoolError(INSTALL_HINT)
    return found


def check_rules(paths: Sequence[str | Path]) -> PromtoolResult:
    """``promtool check rules --lint=all --lint-fatal`` on rule files. Raises :class:`PromtoolError` when
    promtool is missing."""
    command = (_promtool(), "check", "rules", "--lint=all", "--lint-fatal", *map(str, paths))
    return _run([command])[0]


def run_rule_tests(paths: Sequence[str | Path], parallel: bool = True) -> list[PromtoolResult]:
    """``promtool test rules`` on test files, one process per file (run side by side when ``parallel``).

    Raises :class:`PromtoolError` when promtool is missing.
    """
    binary = _promtool()
    commands = [(binary, "test", "rules", str(p)) for p in paths]
    if parallel:
        return _run(commands)
    return [_run([c])[0] for c in commands]


def _run(commands: Sequence[tuple[str, ...]]) -> list[PromtoolResult]:
    started = time.monotonic()
    processes = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in commands]
    results = []
    for command, process in zip(commands, processes, strict=True):
        output, _ = process.communicate()
        results.append(PromtoolResult(command, process.returncode == 0, output, time.monotonic() - started))
    return results
