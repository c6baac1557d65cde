"""llmslo on a real engine: llama.cpp's ``llama-server`` (SmolLM2-135M) under ``llmslo load``, scraped by Prometheus.

One run (:func:`llmslo.ops.run_engine_live`, the run behind ``llmslo demo --engine llamacpp``):
calm, a burst above the engine's four slots, calm. The tests read that run: one client summary per attempt,
the client's ``usage`` sums equal to the engine's own counter deltas exactly, the engine rules loaded and
evaluated by Prometheus without error, every query of the engine dashboard answered with data, and the burst
seen queueing in the engine and in the client's TTFT and goodput.

The engine is built once per machine by ``.ci/build-llama-server`` (``.ci/setup`` runs it). Without it the
tests fail with the command to run, except where no C++ compiler exists (then they skip, saying so).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmslo.cli._live_engine import engine_checks
from llmslo.ops import EngineRun, find_llama_server, find_model, run_engine_live
from llmslo.tests._tools import require_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def require_engine() -> None:
    """Skip where no C++ compiler exists (the engine cannot be built here); fail where one does and the engine is
    missing, naming the command that builds it."""
    if find_llama_server() is not None and find_model() is not None:
        return
    if shutil.which("g++") is None and shutil.which("c++") is None and not os.environ.get("CI"):
        pytest.skip("llama-server is not built and no C++ compiler exists to build it (.ci/build-llama-server)")
    pytest.fail("llama-server or its model is missing: run .ci/build-llama-server (it caches both by version)")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> EngineRun:
    require_engine()
    require_tool("prometheus", "Debian package `prometheus`")
    return run_engine_live(tmp_path_factory.mktemp("engine"))


def _check(run: EngineRun, name: str) -> None:
    (check,) = [c for c in engine_checks(run) if c.name == name]
    assert check.passed, check.detail


def test_one_client_summary_per_attempt(run: EngineRun) -> None:
    _check(run, "one client summary per attempt")
    assert run.load_json is not None and run.load_exit_code == 0


def test_usage_sums_equal_the_engine_counter_deltas_exactly(run: EngineRun) -> None:
    _check(run, "usage sums = engine counter deltas")
    sent = [a for a in run.attempts() if a["status"] == 200]
    assert len(sent) >= 20 and all(a["usage_completion_tokens"] for a in sent)


def test_the_gateways_summaries_match_the_clients_attempts_one_to_one(run: EngineRun) -> None:
    _check(run, "gateway summaries = client attempts, gateway TTFT <= client TTFT")
    rows = {r["request_id"]: r for r in run.gateway_summaries()}
    for a in run.attempts():
        row = rows[a["request_id"]]
        if a["status"] == 200:  # the gateway's token counts are the engine's usage, as the client read it
            assert row["generated_tokens"] == a["usage_completion_tokens"], (a, row)
            assert row["prompt_tokens"] == a["usage_prompt_tokens"], (a, row)


def test_the_burst_queues_in_the_engine_and_slows_the_client(run: EngineRun) -> None:
    _check(run, "the burst queues in the engine")
    _check(run, "client TTFT grows in the burst")
    _check(run, "goodput falls in the burst")


def test_engine_rules_load_and_evaluate_in_prometheus(run: EngineRun) -> None:
    _check(run, "engine rules evaluate without error")


def test_every_engine_dashboard_query_returns_data(run: EngineRun) -> None:
    _check(run, "every dashboard query returns data")


def test_every_failed_check_would_say_so(run: EngineRun) -> None:
    """The checks read the run's figures: a run whose counters moved by one token more fails the token check."""
    broken = EngineRun(**{**run.__dict__, "counters_after": {
        **run.counters_after, "llamacpp:tokens_predicted_total": run.counters_after["llamacpp:tokens_predicted_total"]
        + 1}})
    (check,) = [c for c in engine_checks(broken) if c.name == "usage sums = engine counter deltas"]
    assert not check.passed
    # a gateway summary whose TTFT is later than the client's, or one missing, fails the gateway's check
    late = run.folder / "late-gateway"
    late.mkdir()
    rows = run.gateway_summaries()
    timed = next(i for i, r in enumerate(rows) if r["ttft_s"] is not None)
    rows[timed] = {**rows[timed], "ttft_s": rows[timed]["ttft_s"] + 60.0}
    (late / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    missing = run.folder / "missing-gateway"
    missing.mkdir()
    (missing / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[1:]))
    for folder in (late, missing):
        changed = EngineRun(**{**run.__dict__, "gateway_rows": folder})
        (check,) = [c for c in engine_checks(changed) if c.name.startswith("gateway summaries")]
        assert not check.passed, check.detail


def _demo(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmslo.cli", "demo", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False)


def test_demo_engine_refuses_another_engine_and_simulation_options(tmp_path: Path) -> None:
    done = _demo("--engine", "vllm", cwd=tmp_path)
    assert done.returncode == 2 and "--engine 'vllm'" in done.stderr and "llmslo load" in done.stderr
    done = _demo("--engine", "llamacpp", "--window", "1m", cwd=tmp_path)
    assert done.returncode == 2 and "--window does not go with --engine" in done.stderr
    done = _demo("--engine", "llamacpp", "--live", cwd=tmp_path)
    assert done.returncode == 2 and "choose one" in done.stderr
    assert not any(tmp_path.iterdir()), "a refused command wrote nothing"


def test_demo_engine_without_the_engine_says_how_to_build_it(tmp_path: Path) -> None:
    env = {**os.environ, "LLMSLO_LLAMA_SERVER": str(tmp_path / "no-such-binary")}
    done = subprocess.run([sys.executable, "-m", "llmslo.cli", "demo", "--engine", "llamacpp", "--out", "run"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 1, done.stderr
    assert "llama-server is not on this machine" in done.stderr and ".ci/build-llama-server" in done.stderr
    assert not (tmp_path / "run").exists(), "nothing written before the engine was found"
