"""Small stores for the app's tests: three one-minute windows with an overload burst in the middle, hostile
labels, client-side TTFT, ITL gaps, GPU samples and an update record; and the ways to open the app on them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
from typer.testing import CliRunner

from llmslo.analysis import Store, polars_schema
from llmslo.analysis.gpu import GPU_COLUMNS, store_gpu_samples
from llmslo.analysis.rollout import record_update
from llmslo.analysis.workload import simulate_demo_workload
from llmslo.telemetry import COLUMNS
from llmslo.tests._rows import cancelled_row, ok_row, rejected_row

T0 = 1_700_000_040.0
"""Start of the data: a multiple of 60, so one-minute windows start at T0, T0 + 60, T0 + 120 (Unix seconds)."""
WINDOW_S = 60.0
HOSTILE = ("<script>alert(1)</script>", "**bold**", "red\x1b[31mtext")
"""Model names that must show as written (HTML, Markdown, a terminal escape)."""
ENTRY = Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py"


def _ok(i: int, t: float, ttft_s: float, **overrides: Any) -> dict[str, Any]:
    """A successful request arriving at ``t`` with TTFT ``ttft_s`` and 11 tokens at 90 ms each."""
    last = ttft_s + 0.9
    return ok_row(i, arrival_unix_s=t, ttft_s=ttft_s, queue_s=ttft_s / 4, last_token_s=last, e2e_s=last + 0.05,
                  **overrides)


def app_rows() -> list[dict[str, Any]]:
    """Calm windows at T0 and T0 + 120 (30 model-m1 requests each, TTFT 0.2 to 0.8 s, with client TTFT and ITL
    gaps, plus 5 requests of each hostile model in the first), and a burst at T0 + 60: 10 fast successes,
    8 rejected, 12 clients that gave up after 9 s without a first token."""
    rows: list[dict[str, Any]] = []
    i = 0
    for w in (0, 2):
        for k in range(30):
            ttft = 0.2 + 0.02 * k
            rows.append(_ok(i, T0 + w * WINDOW_S + k, ttft, client_ttft_s=ttft + 0.03,
                            itl_s=[0.09] * 10, version="v1" if k % 2 else "v2"))
            i += 1
    for name in HOSTILE:
        for k in range(5):
            rows.append(_ok(i, T0 + 31 + k, 0.3, model=name, tenant_class=name))
            i += 1
    burst = T0 + WINDOW_S
    for k in range(10):
        rows.append(_ok(i, burst + k, 0.1))
        i += 1
    for k in range(8):
        rows.append(rejected_row(i, arrival_unix_s=burst + 10 + k))
        i += 1
    for k in range(12):
        rows.append(cancelled_row(i, arrival_unix_s=burst + 20 + k, waited_s=9.0))
        i += 1
    return rows


def ingest(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """A store at ``path`` holding ``rows`` (created, or added to)."""
    with Store.open(path) as store:
        if rows:
            full = [{c.name: r.get(c.name, c.default) for c in COLUMNS} for r in rows]
            store.ingest_frame(pl.DataFrame(full, schema=polars_schema()))
    return path


def add_gpu(path: Path, *, start_unix_s: float = T0, seconds: int = 180,
            busy: tuple[float, float] | None = None) -> None:
    """GPU samples every second from ``start_unix_s``, utilisation high in ``busy`` (Unix seconds; default: the
    burst window of :func:`app_rows`) and lower elsewhere."""
    lo, hi = busy or (T0 + WINDOW_S, T0 + 2 * WINDOW_S)
    times = [start_unix_s + s for s in range(seconds)]
    measured = {"util_gpu_pct": [95.0 if lo <= t < hi else 40.0 + s % 7 for s, t in enumerate(times)],
                "power_w": [300.0 + s % 11 for s in range(seconds)],
                "temperature_c": [60.0 + s % 5 for s in range(seconds)]}
    columns: dict[str, Any] = {"time_unix_s": times, "gpu": ["0"] * seconds, "source": ["nvidia-smi"] * seconds}
    for name, kind in GPU_COLUMNS.items():
        if name not in columns:
            dtype = pl.Int64 if kind.startswith("BIGINT") else pl.Float64
            columns[name] = pl.Series(name, measured.get(name, [None] * seconds), dtype=dtype)
    with Store.open(path) as store:
        store_gpu_samples(store.con, pl.DataFrame(columns).select(list(GPU_COLUMNS)))


def demo_store(path: Path) -> Path:
    """The demo's simulated overload (synthetic arrivals, 18,000 requests over 50 minutes), plus the hostile
    models of :func:`app_rows`, GPU samples over the whole run and an update from v1 to v2."""
    with Store.open(path) as store:
        store.ingest_frame(simulate_demo_workload(None, seed=0))
    ingest(path, [r for r in app_rows() if r["model"] in HOSTILE])
    start = 1_700_000_000.0
    add_gpu(path, start_unix_s=start, seconds=3000, busy=(start + 900, start + 1200))
    add_update(path, window=(start + 1800, start + 2400))
    return path


def add_update(path: Path, update_id: str = "u-1", window: tuple[float, float] | None = None) -> None:
    """An update from v1 to v2 over ``window`` (Unix seconds; default: the third window of :func:`app_rows`)."""
    lo, hi = window or (T0 + 2 * WINDOW_S, T0 + 3 * WINDOW_S)
    record = {"update_id": update_id, "versions": {"from": "v1", "to": "v2"}, "started_unix_s": lo,
              "ended_unix_s": hi, "overlap": {"from_unix_s": lo, "to_unix_s": hi},
              "drain": {"wait_budget_s": 120.0, "actual_drain_s": 42.5, "unregister_settle_s": 5.0,
                        "terminated": 3, "closed_by_reason": {"idle": 1, "max_inflight": 0, "budget_exhausted": 2}}}
    with Store.open(path) as store:
        record_update(store, record)


def cli_json(*args: str) -> Any:
    """The JSON that ``llmslo ARGS`` prints (run in this process)."""
    from llmslo.cli._app import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@contextmanager
def argv(db: Path | None) -> Iterator[None]:
    """The script arguments Streamlit passes the app (``-- --db DB``), for AppTest (which runs in-process)."""
    saved = sys.argv
    sys.argv = [str(ENTRY), *(["--db", str(db)] if db is not None else [])]
    try:
        yield
    finally:
        sys.argv = saved


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Wait until the Streamlit server on ``port`` answers its health check (fails if ``proc`` exits)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1) as r:
                if r.read() == b"ok":
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"no answer on 127.0.0.1:{port} within {timeout_s:.0f} s")
