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
        "itl_s": [None] * n, "backend": [None] * n,
    }, schema_overrides={"itl_s": pl.List(pl.Float64), "backend": pl.Utf8}, strict=False)
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


def _same_arrival_store(path: Path) -> Path:
    """500 requests that all arrived at the same time (a benchmark file ingested without start times)."""
    n = 500
    frame = pl.DataFrame({
        "request_id": [f"b{i}" for i in range(n)], "model": ["m"] * n, "version": ["v1"] * n,
        "tenant_class": ["benchmark"] * n, "arrival_unix_s": np.full(n, T0), "finish_reason": ["stop"] * n,
        "reject_reason": [None] * n, "error_type": [None] * n, "queue_s": np.full(n, 0.1),
        "ttft_s": np.full(n, 0.2), "last_token_s": np.full(n, 1.2), "e2e_s": np.full(n, 1.3),
        "prompt_tokens": np.full(n, 100), "proposed_tokens": np.zeros(n, dtype=np.int64),
        "generated_tokens": np.full(n, 11), "sent_tokens": np.full(n, 11), "client_ttft_s": [None] * n,
        "client_e2e_s": [None] * n, "stream_paused_s": np.zeros(n), "stream_max_queued": np.zeros(n, dtype=np.int64),
        "itl_s": [None] * n, "backend": [None] * n,
    }, schema_overrides={"itl_s": pl.List(pl.Float64), "backend": pl.Utf8}, strict=False)
    with Store.open(path) as store:
        store.ingest_frame(frame.select(polars_schema().names()).cast(dict(polars_schema())))
    return path


def test_the_command_says_why_no_window_was_tested(tmp_path: Path) -> None:
    db = _same_arrival_store(tmp_path / "s.duckdb")
    cmd = [sys.executable, "-m", "llmslo.cli", "anomalies", "--db", str(db), "--by", ""]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    assert "0 windows tested" in text.stdout
    assert "ttft: no window tested: all 500 requests have the same arrival time" in text.stdout
    out = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=300).stdout)
    assert out["series"]["ttft"]["tested"] == 0
    assert out["series"]["ttft"]["untested_reason"].startswith("all 500 requests have the same arrival time")
    assert out["notes"] == []


def test_the_command_refuses_unplaceable_arrivals_and_too_many_windows_without_a_traceback(tmp_path: Path) -> None:
    db = _same_arrival_store(tmp_path / "s.duckdb")
    with Store.open(db) as store:
        store.con.execute("UPDATE request_summaries SET arrival_unix_s = 1.7e308 WHERE request_id = 'b7'")
    cmd = [sys.executable, "-m", "llmslo.cli", "anomalies", "--db", str(db), "--by", "", "--window", "1ms"]
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "Traceback" not in bad.stdout + bad.stderr
    assert "arrival_unix_s" in bad.stderr and "'b7'" in bad.stderr
    with Store.open(db) as store:
        store.con.execute(f"UPDATE request_summaries SET arrival_unix_s = {T0 + 86_400.0} WHERE request_id = 'b7'")
    many = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert many.returncode == 2 and "Traceback" not in many.stdout + many.stderr
    assert "--window 1ms" in many.stderr and "86,400,000 windows" in many.stderr  # complete 1 ms windows in a day
