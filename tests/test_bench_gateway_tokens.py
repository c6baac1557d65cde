"""The tokens-in-flight benchmark: its simulated backend bound by its KV cache, and its report. Deterministic (a
seeded trace, a simulated clock): no wall-clock figure is asserted."""

from __future__ import annotations

import subprocess
import sys

from llmslo.bench.bench_gateway_tokens import CONTROLLERS, Backend, arrivals, simulate, summarise

BACKEND = Backend(kv_tokens=65_536, slots=32, base_gap_s=0.02, prefill_s=0.00005)
PHASE_S = 120.0
BY_NAME = {c.name: c for c in CONTROLLERS}


def test_the_token_limit_lets_fewer_tokens_in_when_the_prompts_grow() -> None:
    trace = arrivals(20.0, PHASE_S, (512, 8192, 512), 64, seed=7)
    tokens, count = (simulate(BACKEND, trace, BY_NAME[name], PHASE_S) for name in ("tokens in flight", "requests only"))
    assert tokens.most_tokens[0] == count.most_tokens[0]      # short prompts: the same (the count binds)
    assert tokens.most_tokens[1] * 2 < count.most_tokens[1]  # long prompts: held at once to the tokens served well
    ours, theirs = (summarise(r, PHASE_S, 60.0, 2.0) for r in (tokens, count))
    assert ours[1]["early_goodput"] > 1.5 * theirs[1]["early_goodput"]
    assert ours[1]["ttft_p99"] < theirs[1]["ttft_p99"]
    samples = [tok for t, _, tok, _ in tokens.samples if t >= PHASE_S - 10]
    assert samples and all(tok is not None for tok in samples) and all(tok is None for _, _, tok, _ in count.samples)


def test_told_the_engines_queue_the_token_limit_stays_nearer_the_cache() -> None:
    trace = arrivals(20.0, PHASE_S, (512, 8192, 512), 64, seed=7)
    alone, told = (simulate(BACKEND, trace, BY_NAME[name], PHASE_S) for name in ("tokens in flight",
                                                                                 "tokens + engine queue"))
    assert told.most_tokens[1] < alone.most_tokens[1]
    held = [tok for t, _, tok, _ in told.samples if PHASE_S * 1.5 <= t < 2 * PHASE_S]
    assert held and all(tok is not None and tok < 1.5 * BACKEND.kv_tokens for tok in held)
    ours, theirs = (summarise(r, PHASE_S, 60.0, 2.0) for r in (told, alone))
    assert ours[1]["ttft_p99"] < theirs[1]["ttft_p99"]


def test_the_no_limit_backend_queues_without_bound_beyond_its_cache() -> None:
    trace = arrivals(20.0, PHASE_S, (512, 8192, 512), 64, seed=7)
    run = simulate(BACKEND, trace, BY_NAME["no limit"], PHASE_S)
    assert all(o.admitted for o in run.outcomes)
    assert summarise(run, PHASE_S, 60.0, 2.0)[1]["ttft_p50"] > 10.0


def test_the_benchmark_prints_each_controller_per_phase_and_the_ratios() -> None:
    r = subprocess.run([sys.executable, "-m", "llmslo.bench.bench_gateway_tokens", "--phase-s", "60"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "KV cache 65,536 tokens (7 long-prompt requests at once)" in r.stdout
    for ctl in CONTROLLERS:
        assert sum(line.startswith(ctl.name + " ") for line in r.stdout.splitlines()) == 3
    assert "goodput tokens / requests only" in r.stdout
