"""Tools for tests that run real programs: the skip-or-fail rule for a missing tool, and a bounded read of a
program's first line.

A test that needs a tool (prometheus, chromium, the npm packages of the Grafana schema check) skips when it
is missing on a developer's machine and fails under CI (``CI=true``), where ``.ci/setup`` installs every tool
and a skip would hide a check that never ran.
"""

from __future__ import annotations

import os
import selectors
import shutil
from typing import IO

import pytest

__all__ = ["first_line", "need", "require_tool"]


def need(reason: str | None) -> None:
    """Skip the test with ``reason`` when a tool it needs is missing (``reason`` not None), but fail under CI."""
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: .ci/setup must install it)")
    pytest.skip(reason)


def require_tool(name: str, hint: str) -> str:
    """The path of executable ``name``; :func:`need` decides when it is missing (``hint``: how to install it)."""
    path = shutil.which(name)
    need(None if path is not None else f"{name} is not installed ({hint})")
    assert path is not None
    return path


def first_line(stream: IO[str], timeout_s: float) -> str:
    """The next line of a program's output pipe, or "" when none began within ``timeout_s`` (a program that hangs
    fails its test instead of hanging it). Waits with :mod:`selectors` (epoll here): ``select.select`` refuses a
    descriptor above 1023, which a long test session reaches."""
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        return stream.readline() if sel.select(timeout_s) else ""

