"""The gateway benchmark's ``--pin``: each proxy on a CPU of its own, the benchmark and what else it starts on the
others (``sched_setaffinity``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmslo.bench import _proxies as px
from llmslo.bench.bench_gateway import pin_cpus

AFFINITY = "import os; print(','.join(map(str, sorted(os.sched_getaffinity(0)))))"


@pytest.fixture
def affinity() -> Iterator[set[int]]:
    """This process's CPUs, given back after the test."""
    before = os.sched_getaffinity(0)
    yield before
    os.sched_setaffinity(0, before)


def _cpus_of(cmd_cpus: frozenset[int] | None, tmp_path: Path) -> str:
    log = tmp_path / "child.log"
    proc = px._spawn([sys.executable, "-c", AFFINITY], log, tmp_path, cpus=cmd_cpus)
    assert proc.wait(timeout=60) == 0
    return log.read_text().strip()


def test_pin_gives_the_proxies_the_last_cpu_and_keeps_the_rest_for_everything_else(affinity: set[int],
                                                                                    tmp_path: Path) -> None:
    if len(affinity) < 2:
        pytest.skip(f"--pin needs two CPUs; this process may use {len(affinity)}")
    last = max(affinity)
    proxy = pin_cpus()
    assert proxy == {last}
    assert os.sched_getaffinity(0) == affinity - {last}
    assert _cpus_of(proxy, tmp_path) == str(last)  # a proxy
    assert _cpus_of(None, tmp_path) == ",".join(map(str, sorted(affinity - {last})))  # the upstream, the load


def test_pin_on_one_cpu_is_refused_naming_the_flag(affinity: set[int]) -> None:
    os.sched_setaffinity(0, {min(affinity)})
    with pytest.raises(SystemExit, match=r"--pin: needs two CPUs or more, this process may use 1"):
        pin_cpus()
    assert os.sched_getaffinity(0) == {min(affinity)}


def test_the_flag_is_in_the_help() -> None:
    out = subprocess.run([sys.executable, "-m", "llmslo.bench.bench_gateway", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "--pin" in out.stdout and "CPU of its own" in out.stdout
