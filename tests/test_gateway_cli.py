"""``llmslo gateway`` as a person runs it: the installed command, from a plain folder, relative paths; bad input
gets the field and the fix, exit 2 for the command line and 1 for what it talks to."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]


def llmslo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmslo.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_no_backend_is_a_usage_error_that_says_what_to_give(tmp_path: Path) -> None:
    r = llmslo(tmp_path, "gateway", "--port", "0")
    assert r.returncode == 2 and "--backend URL (repeat it) or --pool FILE" in r.stderr


@pytest.mark.parametrize(("text", "message"), [
    ("backends:\n  - id: a\n", "pool.yaml: backend 1: url is missing (http://HOST:PORT)"),
    ("backends:\n  - url: http://127.0.0.1:1/v1\n", "must be http://HOST:PORT (plain HTTP, no path)"),
    ("backends:\n  - {url: 'http://127.0.0.1:1', slot: 2}\n", "backend 1: unknown key(s) slot"),
    ("servers: []\n", "expected a mapping with a 'backends' list"),
])
def test_a_bad_pool_file_names_the_backend_and_the_fix(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "pool.yaml").write_text(text)
    r = llmslo(tmp_path, "gateway", "--pool", "pool.yaml", "--port", "0")
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_the_admin_commands_say_when_no_gateway_answers(tmp_path: Path) -> None:
    r = llmslo(tmp_path, "gateway", "drain", "a", "--admin", "http://127.0.0.1:9")
    assert r.returncode == 1 and "no gateway admin API there" in r.stderr and "--admin URL" in r.stderr
