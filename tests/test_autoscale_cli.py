"""``llmslo autoscale simulate`` run as a process (the installed ``llmslo``) from a plain working directory with
relative paths: the message of a bad policy first, then the tables, the JSON and the picture.

pytestmark = slow: each test starts the installed ``llmslo`` as a process (about a second each on a busy core).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts the installed llmslo as a process

ROOT = Path(__file__).resolve().parents[1]
LLMSLO = Path(sys.executable).parent / "llmslo"
CODE_TRACE = Path(__file__).resolve().parents[2] / "shared" / "real_data" / "azure" / "AzureLLMInferenceTrace_code.csv"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A plain folder holding the example policies and a link to the real trace (never a copy)."""
    if not CODE_TRACE.is_file():
        pytest.skip(f"the real Azure trace is missing: {CODE_TRACE} (see shared/real_data/README.md)")
    for example in ROOT.glob("examples/hpa-*.yaml"):
        shutil.copyfile(example, tmp_path / example.name)
    os.symlink(CODE_TRACE, tmp_path / "code.csv")
    return tmp_path


def _llmslo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LLMSLO), "autoscale", "simulate", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_bad_policy_is_named_then_a_good_run_prints_the_tables(workdir: Path) -> None:
    (workdir / "bad.yaml").write_text("name: bad\nmetric: queue_length\ntarget: 4\nmax_replica: 3\n", encoding="utf-8")
    bad = _llmslo(workdir, "--trace-kind", "azure", "code.csv", "--policy", "bad.yaml")
    assert bad.returncode == 1
    assert "error: bad.yaml: field 'max_replica': unknown field; did you mean max_replicas?" in bad.stderr
    out = "picture.html"
    good = _llmslo(workdir, "--trace-kind", "azure", "code.csv", "--policy", "hpa-queue.yaml", "--policy",
                   "hpa-gpu.yaml", "--start", "180s", "--duration", "2m", "--out", out)
    assert good.returncode == 0, good.stderr
    for text in ("queue-length: over time", "gpu-utilization: over time", "Policies by goodput and GPU-seconds",
                 f"picture: {out}"):
        assert text in good.stdout
    assert "vconcat" in (workdir / out).read_text(encoding="utf-8")


def test_json_for_scripts(workdir: Path) -> None:
    run = _llmslo(workdir, "--trace-kind", "azure", "code.csv", "--policy", "hpa-concurrency.yaml", "--start", "180s",
                  "--duration", "1m", "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    (policy,) = data["policies"]
    assert policy["policy"]["metric"] == "concurrency"
    assert data["trace"]["requests"] == policy["totals"]["arrivals"] > 0


@pytest.mark.skipif(importlib.util.find_spec("vl_convert") is None,
                    reason="writing SVG needs vl-convert-python (pip install vl-convert-python)")
def test_an_svg_picture(workdir: Path) -> None:
    run = _llmslo(workdir, "code.csv", "--policy", "hpa-queue.yaml", "--start", "180s", "--duration", "1m",
                  "--out", "picture.svg")
    assert run.returncode == 0, run.stderr
    assert (workdir / "picture.svg").read_text(encoding="utf-8").lstrip().startswith("<svg")
