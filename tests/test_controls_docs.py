"""The examples of docs/controls.md run and print what the page says."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "controls.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_the_example_with_every_control_serves_limits_queues_and_drains(capsys: pytest.CaptureFixture[str]) -> None:
    code = next(b for b in _blocks() if "RateLimiter" in b and "AdmissionQueue" in b)
    exec(compile(code, "docs/controls.md", "exec"), {"__name__": "docs_example"})
    lines = capsys.readouterr().out.splitlines()
    said = "[((200, 'served'), 6), ((429, 'queue_full'), 6), ((429, 'rate_limited'), 4), ((503, 'draining'), 1)]"
    assert lines[-1] == f"{said} drained", lines
    assert f"`{said} drained`" in PAGE.read_text()  # the page says what the code prints
    refusals = lines[:-1]
    assert len(refusals) == 10 and all(re.fullmatch(r"r\d+: 429 (queue_full|rate_limited), Retry-After \d+ s", r)
                                       for r in refusals), refusals


def test_the_queue_shed_levels_example_prints_what_its_comment_says(capsys: pytest.CaptureFixture[str]) -> None:
    code = textwrap.dedent(next(b for b in _blocks() if "queue_shed_levels(" in b))  # inside a list item
    exec(compile(code, "docs/controls.md", "exec"), {"__name__": "docs_example"})
    printed = capsys.readouterr().out.strip()
    said = re.search(r"print\(levels\)  # (.*)", code)
    assert said is not None and printed == said.group(1)
