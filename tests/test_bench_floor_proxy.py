"""The gateway benchmark's baseline (``bench/_floor_proxy.py``): the least a Python proxy does passes a stream
through byte for byte, keeps connections alive for a load of many requests, and says what is wrong with its
command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from llmslo.bench import _proxies as px
from llmslo.bench.bench_gateway import FLOOR, check_bytes, run_load


def test_a_stream_through_the_floor_is_the_same_bytes_as_direct(tmp_path: Path) -> None:
    rows, missing = check_bytes(tmp_path, [FLOOR], None)
    assert missing == {}
    assert [row[:2] for row in rows] == [[FLOOR, "asked"], [FLOOR, "not asked"]]
    assert all(str(row[2]).startswith("identical") for row in rows), rows


def test_a_load_of_kept_alive_streams_passes_through_it(tmp_path: Path) -> None:
    upstream = px.start_upstream(tmp_path, 1000.0)
    try:
        floor = px.start_floor(tmp_path, upstream)
        try:
            run = run_load(floor.url, 20, 8, 2.0, 1, floor.pid, None)
        finally:
            floor.stop()
    finally:
        upstream.stop()
    assert run.failed == 0
    assert run.requests >= 8 and run.chunks == 20 * run.requests


def test_a_bad_upstream_is_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "llmslo.bench._floor_proxy", "--upstream", "ftp://x"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "--upstream: an http://HOST:PORT URL, got 'ftp://x'" in done.stderr
