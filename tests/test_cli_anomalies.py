"""``llmslo anomalies --tightening``: the composite rule on a stored collapse, through the real command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl

from llmslo.analysis import Store, polars_schema
from llmslo.analysis.anomaly import AnomalyConfig, detect_tightening

T0 = 1_700_000_100.0  # a multiple of 300 s


def _collapse_store(path: Path) -> Path:
    """100 req/s for 25 min: 17.5 calm minutes, then within 30 s most requests start failing and TTFT triples."""
    rng = np.random.default_rng(7)
    n = 150_000
    t = T0 + np.sort(rng.uniform(0, 1500, n))
    late = t > T0 + 1050
    ramp = np.clip((t - (T0 + 1050)) / 30.0, 0, 1)
    fails = late & (rng.random(n) < 0.7 * ramp)
    ttft = rng.lognormal(np.log(0.2), 0.3, n) * np.where(late, 3.0, 1.0)
    kinds = rng.choice(["client_cancel", "deadline", "error"], n)
    reason = np.where(fails, kinds, "stop")
    ok = ~fails
    frame = pl.DataFrame({
        "request_id": [f"r{i}" for i in range(n)],
        "model": ["m"] * n, "version": ["v1"] * n, "tenant_class": ["interactive"] * n,
        "arrival_unix_s": t, "finish_reason": reason,
        "reject_reason": [None] * n,
        "error_type": [("engine_error" if r == "error" else None) for r in reason.tolist()],
        "queue_s": np.where(ok, ttft / 2, np.nan), "ttft_s": np.where(ok, ttft, np.nan),
        "last_token_s": np.where(ok, ttft + 1.0, np.nan), "e2e_s": np.where(ok, ttft + 1.1, 5.0),
        "prompt_tokens": np.full(n, 100), "proposed_tokens": np.zeros(n, dtype=np.int64),
        "generated_tokens": np.where(ok, 11, 0), "sent_tokens": np.where(ok, 11, 0),
        "client_ttft_s": [None] * n, "client_e2e_s": [None] * n,
        "stream_paused_s": np.zeros(n), "stream_max_queued": np.zeros(n, dtype=np.int64),
        "itl_s": [None] * n,
    }, schema_overrides={"itl_s": pl.List(pl.Float64)}, strict=False)
    frame = frame.with_columns(pl.col(c).fill_nan(None) for c in ("queue_s", "ttft_s", "last_token_s"))
    with Store.open(path) as store:
        store.ingest_frame(frame.select(polars_schema().names()).cast(dict(polars_schema())))
    return path


def test_the_composite_rule_fires_only_in_the_collapse_window(tmp_path: Path) -> None:
    db = _collapse_store(tmp_path / "s.duckdb")
    with Store.open(db, read_only=True) as store:
        signals = detect_tightening(store.con, anomaly=AnomalyConfig(window_s=300.0), by=())
    (series,) = signals.values()
    fired = [s for s in series if s.fire]
    assert fired, series
    assert all(s.end_unix_s > T0 + 1050 for s in fired)
    assert all(not s.fire for s in series if s.end_unix_s <= T0 + 1050)


def test_the_command_prints_the_rule_and_its_json(tmp_path: Path) -> None:
    db = _collapse_store(tmp_path / "s.duckdb")
    cmd = [sys.executable, "-m", "llmslo.cli", "anomalies", "--db", str(db), "--by", "", "--tightening"]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    assert "composite tightening rule: fired in" in text.stdout and "fired in 0 of" not in text.stdout
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=300)
    data = json.loads(out.stdout)
    assert any(w["fire"] for items in data["tightening"].values() for w in items)
