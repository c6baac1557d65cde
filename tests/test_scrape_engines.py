"""``llmslo scrape`` over the five kinds of real exposition (vLLM, SGLang x2, TGI, NVIDIA NIM, llama.cpp x2):
names mapped to llmslo's concepts through the engine profiles, the survivor-bias checks where the series
allow them (and why not where they don't), and a high-water mark never shown as a rate.

The expositions are read from ``../shared/real_data/prometheus`` (never copied here); tests skip when it is
missing. The llama.cpp pair also runs through the installed ``llmslo`` command, from a temporary folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmslo.analysis.scrape import (
    Finding,
    analyze_scrape,
    compare_scrapes,
    parse_exposition,
    read_scrape,
    resolve,
)
from llmslo.engines import ENGINES

REAL = Path(__file__).resolve().parents[2] / "shared" / "real_data" / "prometheus"
LLAMA_T0 = "llamacpp_b11434_smollm2_startup.prom.txt"
LLAMA_T1 = "llamacpp_b11434_smollm2_after_load.prom.txt"
FILES = {
    "vllm_opt125m_datadog_fixture_mixed_v0_v1.prom.txt": "vllm",
    "sglang_llama3.1-8b_metrics_docs_example.prom.txt": "sglang",
    "sglang_v0.5.10_opt125m_datadog_fixture.prom.txt": "sglang",
    "tgi_datadog_fixture_first13families.prom.txt": "tgi",
    "nim_llama3.1-8b_datadog_fixture.prom.txt": "nim",
    LLAMA_T0: "llamacpp",
    LLAMA_T1: "llamacpp",
}


def _real(name: str) -> Path:
    path = REAL / name
    if not path.is_file():
        pytest.skip(f"real data not available: {path} (../shared/real_data is missing)")
    return path


def _checks(findings: tuple[Finding, ...], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


def _llmslo() -> Path:
    exe = Path(sys.executable).parent / "llmslo"
    if not exe.is_file():
        pytest.skip(f"the installed llmslo command is not at {exe}")
    return exe


# ---------------------------------------------------------------------------------------------------
# every real exposition: its engine, its concepts


@pytest.mark.parametrize(("file", "engine"), FILES.items())
def test_each_real_exposition_is_read_as_its_engine_with_its_concepts(file: str, engine: str) -> None:
    scrape = read_scrape(_real(file))
    a = analyze_scrape(scrape, slo={"ttft_s": 2.0})
    assert a.servers == (engine,)
    concepts = {m.concept for m in a.mapped if m.engine == engine}
    assert {"running", "waiting", "prompt_tokens"} & concepts, concepts
    # every mapped name is really in the exposition (as a family or a sample name), and belongs to that engine
    present = set(scrape.families) | {s.name for _, s in scrape.samples()}
    assert {m.name for m in a.mapped} <= present
    assert {m.engine for m in a.mapped} == {engine}


def test_llamacpp_concepts_are_the_five_its_profile_maps() -> None:
    a = analyze_scrape(read_scrape(_real(LLAMA_T1)))
    by_concept = {m.concept: m.name for m in a.mapped if m.concept != "extra"}
    assert by_concept == {
        "prompt_tokens": "llamacpp:prompt_tokens_total", "prompt_tokens_cached": "llamacpp:prompt_tokens_cached_total",
        "generated_tokens": "llamacpp:tokens_predicted_total", "running": "llamacpp:requests_processing",
        "waiting": "llamacpp:requests_deferred"}
    [high] = [m for m in a.mapped if m.high_water]
    assert high.name == "llamacpp:n_tokens_max" and high.type == "counter"


def test_nim_unprefixed_names_are_read_as_nim_not_as_tensorrt_llm() -> None:
    a = analyze_scrape(read_scrape(_real("nim_llama3.1-8b_datadog_fixture.prom.txt")), slo={"ttft_s": 2.0})
    ttft = [h for h in a.histograms if h.interval == "ttft_s"]
    assert [(h.metric, h.server) for h in ttft] == [("time_to_first_token_seconds", "nim")]
    # the per-step histogram is not taken for a TPOT
    [step] = [h for h in a.histograms if h.metric == "time_per_output_token_seconds"]
    assert step.interval == "itl_s" and step.per == "engine step"


def test_the_five_unprefixed_tensorrt_llm_1x_families_are_read_as_trtllm() -> None:
    """A trtllm-serve 1.x exposition shares names with NIM; its names decide (no real one exists here, so the
    families are written from TensorRT-LLM's collector.py, counts invented)."""
    text = "".join(
        f"# TYPE {n} histogram\n{n}_bucket{{le=\"1.0\"}} 1\n{n}_bucket{{le=\"+Inf\"}} 2\n{n}_sum 3\n{n}_count 2\n"
        for n in ("e2e_request_latency_seconds", "time_to_first_token_seconds", "time_per_output_token_seconds",
                  "request_queue_time_seconds"))
    text += "# TYPE request_success_total counter\nrequest_success_total{finished_reason=\"stop\"} 2\n"
    a = analyze_scrape(parse_exposition(text, "trtllm 1.x"))
    assert a.servers == ("trtllm",)
    intervals = {h.metric: h.interval for h in a.histograms}
    assert intervals["time_per_output_token_seconds"] == "tpot_s"  # TensorRT-LLM's is a per-request TPOT
    assert resolve({"time_to_first_token_seconds", "num_requests_running", "request_finish_total"}).servers() == (
        "nim",)


# ---------------------------------------------------------------------------------------------------
# survivor-bias checks where the series allow, and why not where they don't


def test_sglang_checks_run_and_find_220_requests_without_a_first_token() -> None:
    a = analyze_scrape(read_scrape(_real("sglang_llama3.1-8b_metrics_docs_example.prom.txt")))
    [gap] = _checks(a.findings, "requests_without_first_token")
    assert gap.numbers["requests_without_first_token_at_least"] == 220
    assert not _checks(a.findings, "survivor_bias_check_unavailable")


def test_tgi_check_counts_requests_that_did_not_succeed_and_says_it_has_no_ttft() -> None:
    a = analyze_scrape(read_scrape(_real("tgi_datadog_fixture_first13families.prom.txt")), slo={"ttft_s": 2.0})
    [unsuccessful] = _checks(a.findings, "unsuccessful_requests")
    assert unsuccessful.numbers == {"requests": 111, "succeeded": 109, "failed": 2}
    [unavailable] = _checks(a.findings, "survivor_bias_check_unavailable")
    assert "no time-to-first-token histogram" in unavailable.message and "llmslo load" in unavailable.message
    [blind] = _checks(a.findings, "survivor_bias_blind_spot")
    assert "aborts" in blind.message


def test_vllm_says_aborts_are_not_counted() -> None:
    a = analyze_scrape(read_scrape(_real("vllm_opt125m_datadog_fixture_mixed_v0_v1.prom.txt")))
    [blind] = _checks(a.findings, "survivor_bias_blind_spot")
    assert "31503" in blind.message
    assert not _checks(a.findings, "survivor_bias_check_unavailable")  # TTFT and e2e are both there


def test_llamacpp_says_why_no_check_can_run_and_what_to_put_in_front() -> None:
    a = analyze_scrape(read_scrape(_real(LLAMA_T1)), slo={"ttft_s": 2.0})
    assert a.histograms == () and a.attainment == ()
    [unavailable] = _checks(a.findings, "survivor_bias_check_unavailable")
    assert "no latency histogram" in unavailable.message and "middleware" in unavailable.message
    [slo] = _checks(a.findings, "no_histogram_for_slo")
    assert "llama.cpp llama-server: no latency histogram" in slo.message
    [tokens] = _checks(a.findings, "prompt_tokens_exclude_cached")
    assert tokens.numbers == {"prompt_tokens_processed": 4_188, "prompt_tokens_cached": 1_402, "prompt_tokens": 5_590}


# ---------------------------------------------------------------------------------------------------
# two scrapes: a high-water mark is never a rate


def test_two_llamacpp_scrapes_give_rates_but_not_for_the_high_water_mark() -> None:
    r = compare_scrapes(read_scrape(_real(LLAMA_T0)), read_scrape(_real(LLAMA_T1)), interval_s=29.0)
    assert "llamacpp:n_tokens_max" not in {c.name for c in r.counters}
    [mark] = r.high_water
    assert (mark.name, mark.before, mark.after, mark.fell) == ("llamacpp:n_tokens_max", 48.0, 159.0, False)
    [note] = _checks(r.findings, "high_water_mark")
    assert "not a rate" in note.message
    rates = {c.name: c for c in r.counters}
    assert rates["llamacpp:tokens_predicted_total"].increase == 3_712
    [tokens] = _checks(r.findings, "prompt_tokens_exclude_cached")
    assert tokens.numbers["prompt_tokens"] == 5_558  # the usage sums of the 58 requests (SOURCES.md)
    doc = r.to_dict()
    assert doc["high_water_marks"][0]["note"] == "largest value seen so far: not a rate"
    assert all(c["name"] != "llamacpp:n_tokens_max" for c in doc["counters"])


def test_a_high_water_mark_that_fell_means_a_restart() -> None:
    t1 = _real(LLAMA_T1).read_text()
    t0 = t1.replace("llamacpp:n_tokens_max 159", "llamacpp:n_tokens_max 300")
    r = compare_scrapes(parse_exposition(t0, "before"), parse_exposition(t1, "after"), interval_s=10.0)
    [mark] = r.high_water
    assert mark.fell and "restarted" in _checks(r.findings, "high_water_mark")[0].message


def test_without_the_profile_mark_the_same_counter_would_be_a_rate() -> None:
    """The check can fail: a counter the profile does not mark as a high-water mark is a rate."""
    t0, t1 = (_real(f).read_text().replace("n_tokens_max", "n_tokens_maxed") for f in (LLAMA_T0, LLAMA_T1))
    r = compare_scrapes(parse_exposition(t0, "a"), parse_exposition(t1, "b"), interval_s=10.0)
    assert r.high_water == () and "llamacpp:n_tokens_maxed" in {c.name for c in r.counters}
    assert ENGINES["llamacpp"].by_name("llamacpp:n_tokens_maxed") is None


# ---------------------------------------------------------------------------------------------------
# the installed command, from a temporary folder


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([str(_llmslo()), "scrape", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_installed_llmslo_scrape_compares_the_llamacpp_pair_without_a_rate_for_n_tokens_max(tmp_path: Path) -> None:
    t0, t1 = str(_real(LLAMA_T0)), str(_real(LLAMA_T1))
    res = _run([t0, t1, "--interval-s", "29", "--json"], tmp_path)
    assert res.returncode == 0, res.stderr
    doc: dict[str, Any] = json.loads(res.stdout)
    assert [h["name"] for h in doc["high_water_marks"]] == ["llamacpp:n_tokens_max"]
    assert "llamacpp:n_tokens_max" not in {c["name"] for c in doc["counters"]}
    concepts = {m["name"]: m["concept"] for m in doc["mapped_series"]}
    assert concepts["llamacpp:requests_deferred"] == "waiting"
    text = _run([t0, t1, "--interval-s", "29"], tmp_path)
    assert text.returncode == 0, text.stderr
    rates, _, rest = text.stdout.partition("High-water marks (the largest value seen; not rates)")
    assert "Counter rates over the interval" in rates and "llamacpp:tokens_predicted_total" in rates
    assert "n_tokens_max" not in rates  # not among the rates ...
    [row] = [line for line in rest.splitlines() if "llamacpp:n_tokens_max" in line and "│" in line]
    assert "48" in row and "159" in row  # ... but its two values, apart


@pytest.mark.parametrize("file", sorted(FILES))
def test_installed_llmslo_scrape_reads_every_real_exposition(file: str, tmp_path: Path) -> None:
    res = _run([str(_real(file)), "--json"], tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["servers"] == [FILES[file]] and doc["mapped_series"]
