"""The gateway benchmark's ``--base PATH``: another checkout's gateway runs beside this one (``llmslo-base``),
from that checkout (first on its import path), and a folder that is not a checkout is refused with why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmslo.bench import _proxies as px
from llmslo.bench.bench_gateway import base_problem, run_load

PACKAGE = Path(px.__file__).resolve().parents[1]


def _checkout(where: Path, without: str = "") -> Path:
    """A second checkout of the package: every entry of this one, linked (the build outputs too), but the folder
    ``without``."""
    where.mkdir()
    for entry in PACKAGE.iterdir():
        if entry.name not in (".git", ".venv", without):
            (where / entry.name).symlink_to(entry)
    return where


def test_another_checkouts_gateway_runs_from_it_beside_this_one(tmp_path: Path) -> None:
    other = _checkout(tmp_path / "other")
    assert base_problem(other) is None
    upstream = px.start_upstream(tmp_path, 1000.0)
    try:
        base = px.start_gateway(tmp_path, upstream, code=other)
        try:
            assert base.name == px.BASE
            environ = dict(kv.split("=", 1) for kv in
                           Path(f"/proc/{base.pid}/environ").read_text().split("\0") if "=" in kv)
            first = Path(environ["PYTHONPATH"].split(os.pathsep)[0])
            assert (first / "llmslo").resolve() == other.resolve()  # that checkout comes first
            run = run_load(base.url, 20, 4, 1.5, 1, base.pid, None)
        finally:
            base.stop()
    finally:
        upstream.stop()
    assert run.failed == 0 and run.requests >= 4 and run.chunks == 20 * run.requests


def test_a_folder_that_is_not_a_checkout_is_refused(tmp_path: Path) -> None:
    assert "not a checkout of this package" in (base_problem(tmp_path) or "")
    done = subprocess.run([sys.executable, "-m", "llmslo.bench.bench_gateway", "--base", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode != 0
    assert f"--base {tmp_path}: not a checkout of this package (expected gateway/__init__.py" in done.stderr


def test_a_checkout_without_the_native_token_log_is_refused_where_this_one_has_it(tmp_path: Path) -> None:
    if not any((PACKAGE / "telemetry").glob("_tokenlog_c*.so")):
        pytest.skip("this checkout's native token log is not built (no C compiler): nothing to compare")
    other = _checkout(tmp_path / "other", without="telemetry")
    (other / "telemetry").mkdir()  # its Python files, not its build
    for f in (PACKAGE / "telemetry").glob("*.py"):
        (other / "telemetry" / f.name).symlink_to(f)
    assert "native token log (telemetry/_tokenlog_c*.so) is not built" in (base_problem(other) or "")


def test_the_fingerprint_tells_two_checkouts_apart_by_their_code(tmp_path: Path) -> None:
    import shutil

    from llmslo.bench.bench_gateway import code_fingerprint

    same = _checkout(tmp_path / "same")
    assert code_fingerprint(same) == code_fingerprint()
    changed = _checkout(tmp_path / "changed", without="gateway")
    shutil.copytree(PACKAGE / "gateway", changed / "gateway", ignore=shutil.ignore_patterns("__pycache__"))
    with (changed / "gateway" / "_http.py").open("a") as f:
        f.write("\n# a change\n")
    assert code_fingerprint(changed) != code_fingerprint()
