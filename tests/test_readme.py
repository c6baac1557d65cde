"""The README's two commands are the ones CI and users run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _sh_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```sh\n(.*?)```", text, re.S)]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    blocks = _sh_blocks((ROOT / "README.md").read_text())
    test_command = blocks[1]
    assert test_command.endswith(".ci/check") and ".ci/setup" in test_command
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci


def test_readme_demo_command_sets_up_a_venv_and_runs_the_demo() -> None:
    demo = _sh_blocks((ROOT / "README.md").read_text())[0]
    assert demo.startswith("python3 -m venv .venv") and demo.endswith("llmslo demo")
