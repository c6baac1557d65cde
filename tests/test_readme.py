"""The README's two commands are the ones CI and users run; ``.ci/run`` takes no arguments."""

from __future__ import annotations

import re
import shutil
import subprocess
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


def _ci_copy(tmp_path: Path) -> Path:
    """``.ci/run`` in a copy of the folder whose setup and check only record that they ran, and with what."""
    ci = tmp_path / ".ci"
    ci.mkdir()
    shutil.copy2(ROOT / ".ci" / "run", ci / "run")
    for name in ("setup", "check"):
        stub = ci / name
        stub.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> "$(dirname "$0")/ran"\n')
        stub.chmod(0o755)
    return ci


def test_ci_run_refuses_arguments_with_a_usage_line_and_runs_nothing(tmp_path: Path) -> None:
    ci = _ci_copy(tmp_path)
    out = subprocess.run(["bash", str(ci / "run"), "-k", "readme"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith("usage: .ci/run (no arguments;") and ".ci/check ARGS" in out.stderr
    assert not (ci / "ran").exists()


def test_ci_run_without_arguments_runs_setup_then_check(tmp_path: Path) -> None:
    ci = _ci_copy(tmp_path)
    out = subprocess.run(["bash", str(ci / "run")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (ci / "ran").read_text() == "setup \ncheck \n"
