"""Engine profiles (llmslo.engines): well-formed data, faithful to the engines' real expositions.

The real expositions are read from ``../shared/real_data/prometheus`` (see its SOURCES.md); the tests that
need them skip when that folder is missing. Each structural check is a function of a profile, so it is also
run against a deliberately broken profile to show that it can fail.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from llmslo.analysis.scrape import read_scrape
from llmslo.engines import (
    CONCEPTS,
    ENGINES,
    EXTRA,
    RELATED,
    EngineProfile,
    Series,
    all_profiles,
    engine_profile,
)
from llmslo.telemetry import ConfigurationError

REAL = Path(__file__).resolve().parents[2] / "shared" / "real_data" / "prometheus"
PROFILES = all_profiles()
IDS = [p.key for p in PROFILES]
EXPOSITIONS = {
    "vllm": ("vllm_opt125m_datadog_fixture_mixed_v0_v1.prom.txt",),
    "sglang": ("sglang_llama3.1-8b_metrics_docs_example.prom.txt", "sglang_v0.5.10_opt125m_datadog_fixture.prom.txt"),
    "tgi": ("tgi_datadog_fixture_first13families.prom.txt",),
    "llamacpp": ("llamacpp_b11434_smollm2_startup.prom.txt", "llamacpp_b11434_smollm2_after_load.prom.txt"),
    "nim": ("nim_llama3.1-8b_datadog_fixture.prom.txt",),
}
"""The real expositions of each engine (trtllm-serve has none among them)."""


def _real(name: str) -> Path:
    path = REAL / name
    if not path.is_file():
        pytest.skip(f"real data not available: {path} (../shared/real_data is missing)")
    return path


# ---------------------------------------------------------------------------------------------------
# the checks, as functions of a profile (each returns the problems it finds)


def concept_problems(p: EngineProfile) -> list[str]:
    return [f"{s.name}: concept {s.concept!r}" for s in p.series if s.concept not in CONCEPTS and s.concept != EXTRA]


def overlap_problems(p: EngineProfile) -> list[str]:
    """A concept is either mapped to a current series or lacked, never both."""
    mapped = {s.concept for s in p.series if s.concept != EXTRA and not s.deprecated}
    return sorted(mapped & set(p.lacks))


def coverage_problems(p: EngineProfile) -> list[str]:
    """Every concept is mapped or lacked (with a reason), and lacks name only concepts."""
    covered = {s.concept for s in p.series} | set(p.lacks)
    return sorted(set(CONCEPTS) - covered) + sorted(set(p.lacks) - set(CONCEPTS)) + [
        c for c, why in p.lacks.items() if len(why.strip()) < 10]


def shape_problems(p: EngineProfile) -> list[str]:
    """Names unique; buckets only on histograms, finite and increasing; counters end in _total unless the
    engine's name does not (TGI's); finish values only with a finish label; extras say what they measure;
    every series cites where it was read."""
    out = []
    names = [s.name for s in p.series]
    out += [f"duplicate {n}" for n in {n for n in names if names.count(n) > 1}]
    for s in p.series:
        if s.buckets and s.type != "histogram":
            out.append(f"{s.name}: buckets on a {s.type}")
        if any(not math.isfinite(b) for b in s.buckets) or list(s.buckets) != sorted(set(s.buckets)):
            out.append(f"{s.name}: buckets not finite and strictly increasing")
        if s.finish_values and not s.finish_label:
            out.append(f"{s.name}: finish values without a finish label")
        if s.finish_label and s.finish_label not in s.labels:
            out.append(f"{s.name}: finish label {s.finish_label} not among its labels")
        if s.concept == EXTRA and not s.what:
            out.append(f"{s.name}: an extra series must say what it measures")
        if not s.source:
            out.append(f"{s.name}: no source")
        if s.high_water and s.type == "histogram":
            out.append(f"{s.name}: a histogram cannot be a high-water mark")
        if s.excludes_cached and s.concept != "prompt_tokens":
            out.append(f"{s.name}: excludes_cached is for prompt_tokens")
    return out


def deprecation_problems(p: EngineProfile) -> list[str]:
    """A deprecated series shares its concept with a current one (or the concept has no current name), and
    get() returns the current one."""
    out = []
    for s in p.series:
        if s.deprecated and s.concept != EXTRA:
            best = p.get(s.concept)
            if best is None or (best.deprecated and any(not x.deprecated and x.concept == s.concept
                                                        for x in p.series)):
                out.append(f"{s.concept}: get() does not prefer the current name over {s.name}")
    return out


CHECKS: list[Callable[[EngineProfile], list[str]]] = [
    concept_problems, overlap_problems, coverage_problems, shape_problems, deprecation_problems]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_every_profile_passes_every_structural_check(profile: EngineProfile,
                                                     check: Callable[[EngineProfile], list[str]]) -> None:
    assert check(profile) == []


def _broken(p: EngineProfile) -> dict[str, EngineProfile]:
    first = p.series[0]
    return {
        "concept_problems": dataclasses.replace(p, series=(*p.series, dataclasses.replace(
            first, name="x_total", concept="throughput"))),
        "overlap_problems": dataclasses.replace(p, lacks={**p.lacks, first.concept: "said to be missing"}),
        "coverage_problems": dataclasses.replace(
            p, lacks={k: v for k, v in p.lacks.items() if k != next(iter(p.lacks))}),
        "shape_problems": dataclasses.replace(p, series=(*p.series, dataclasses.replace(first, source=""))),
        "deprecation_problems": dataclasses.replace(p, series=(
            dataclasses.replace(first, name=first.name + "_old", deprecated="renamed"), *p.series)),
    }


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_each_structural_check_fails_on_a_broken_profile(check: Callable[[EngineProfile], list[str]]) -> None:
    broken = _broken(ENGINES["vllm"])[check.__name__]
    if check is deprecation_problems:
        # get() itself prefers current names; a profile whose get() did not would fail this check
        class Naive(EngineProfile):
            def get(self, concept: str) -> Series | None:
                return next((s for s in self.series if s.concept == concept), None)

        broken = Naive(**{f.name: getattr(broken, f.name) for f in dataclasses.fields(broken)})
    assert check(broken) != []


# ---------------------------------------------------------------------------------------------------
# the public surface


def test_the_five_engines_and_nim_are_there_and_keys_match() -> None:
    assert set(ENGINES) == {"vllm", "sglang", "tgi", "llamacpp", "trtllm"}
    assert set(RELATED) == {"nim"}
    assert all(key == p.key for key, p in {**ENGINES, **RELATED}.items())
    assert [p.key for p in PROFILES] == [*ENGINES, *RELATED]


def test_engine_profile_returns_the_profile_or_names_the_known_keys() -> None:
    assert engine_profile("llamacpp") is ENGINES["llamacpp"]
    with pytest.raises(ConfigurationError) as err:
        engine_profile("vLLM")
    assert all(k in str(err.value) for k in ENGINES) and "'vLLM'" in str(err.value)
    with pytest.raises(ConfigurationError):
        engine_profile("nim")  # a related server, not an engine one can pick


def test_engines_is_read_only() -> None:
    with pytest.raises(TypeError):
        ENGINES["x"] = ENGINES["vllm"]  # type: ignore[index]


def test_get_prefers_current_names_and_never_returns_an_extra() -> None:
    vllm = ENGINES["vllm"]
    itl = vllm.get("itl_s")
    assert itl is not None and itl.name == "vllm:inter_token_latency_seconds"
    assert [s.name for s in vllm.series if s.concept == "itl_s" and s.deprecated] == [
        "vllm:time_per_output_token_seconds"]
    assert vllm.get(EXTRA) is None and vllm.get("no_such_concept") is None
    assert all(s.concept == EXTRA for s in vllm.extras()) and not any(s.concept == EXTRA for s in vllm.mapped())


def test_sample_names_follow_the_series_type() -> None:
    vllm = ENGINES["vllm"]
    ttft = vllm.get("ttft_s")
    assert ttft is not None and ttft.sample_names == tuple(
        f"vllm:time_to_first_token_seconds{x}" for x in ("_bucket", "_sum", "_count"))
    assert vllm.by_name("vllm:time_to_first_token_seconds_bucket") is ttft
    waiting = vllm.get("waiting")
    assert waiting is not None and waiting.sample_names == ("vllm:num_requests_waiting",)


# ---------------------------------------------------------------------------------------------------
# what the brief of each engine says, held as data


def test_llamacpp_has_no_histograms_no_labels_and_its_concepts() -> None:
    p = ENGINES["llamacpp"]
    assert not [s for s in p.series if s.type == "histogram"]
    assert all(not s.labels for s in p.series if s.concept != EXTRA)
    expect = {"prompt_tokens": "llamacpp:prompt_tokens_total",
              "prompt_tokens_cached": "llamacpp:prompt_tokens_cached_total",
              "generated_tokens": "llamacpp:tokens_predicted_total",
              "running": "llamacpp:requests_processing", "waiting": "llamacpp:requests_deferred"}
    assert {c: (s.name if (s := p.get(c)) else None) for c in expect} == expect
    prompt = p.get("prompt_tokens")
    assert prompt is not None and prompt.excludes_cached
    [high] = [s for s in p.series if s.high_water]
    assert (high.name, high.type) == ("llamacpp:n_tokens_max", "counter")
    assert {"ttft_s", "tpot_s", "itl_s", "e2e_s"} <= set(p.lacks)
    assert all("middleware" in p.lacks[c] and "llmslo load" in p.lacks[c] for c in ("ttft_s", "e2e_s"))


def test_tgi_lacks_ttft_and_its_time_per_token_includes_prefill() -> None:
    p = ENGINES["tgi"]
    assert p.get("ttft_s") is None and "ttft_s" in p.lacks
    tpot = p.get("tpot_s")
    assert tpot is not None and tpot.name == "tgi_request_mean_time_per_token_duration"
    assert "includes prefill" in tpot.difference
    # TGI's duration bounds: 35 terms, each 1.5 times the previous from 0.0001, as its router computes them
    e2e = p.get("e2e_s")
    assert e2e is not None and len(e2e.buckets) == 35 and e2e.buckets[0] == pytest.approx(0.00015)
    assert all(b == pytest.approx(a * 1.5) for a, b in zip(e2e.buckets, e2e.buckets[1:], strict=False))


def test_vllm_abort_counter_stays_zero_is_said_and_finish_reasons_are_listed() -> None:
    p = ENGINES["vllm"]
    finished = p.get("requests_finished")
    assert finished is not None and finished.finish_label == "finished_reason"
    assert {"stop", "length", "abort"} <= set(finished.finish_values)
    assert "31503" in p.lacks["aborts"] and "31503" in finished.difference


def test_sglang_counts_requests_without_a_finish_reason() -> None:
    p = ENGINES["sglang"]
    finished = p.get("requests_finished")
    assert finished is not None and finished.finish_label is None and "without a finish reason" in finished.difference
    assert "requests_succeeded" in p.lacks


def test_trtllm_profile_says_where_its_prometheus_text_is_and_what_it_lacks() -> None:
    p = ENGINES["trtllm"]
    assert all(s.type in ("histogram", "counter", "gauge") for s in p.series)
    assert any("/prometheus/metrics" in n for n in p.notes) and any("return_perf_metrics" in n for n in p.notes)
    assert "itl_s" in p.lacks and "tensorrt_llm/metrics/collector.py" in (p.get("ttft_s") or Series("", "", "gauge",
                                                                                                        "")).source


def test_every_source_names_a_repository_and_a_file() -> None:
    for p in PROFILES:
        for s in p.series:
            assert re.search(r"[\w.-]+/[\w.-]+.*:[\w./-]+\.(py|rs|cpp|h|md|txt)", s.source), (p.key, s.name)


# ---------------------------------------------------------------------------------------------------
# against the real expositions


def _names_in(path: Path) -> tuple[set[str], dict[str, str]]:
    scrape = read_scrape(path)
    samples = {s.name for _, s in scrape.samples()}
    types = {f.name: f.type for f in scrape.families.values()}
    return samples | set(types), types


@pytest.mark.parametrize(("key", "file"), [(k, f) for k, files in EXPOSITIONS.items() for f in files])
def test_the_profile_names_are_the_engines_real_names(key: str, file: str) -> None:
    """Every name of the exposition that belongs to the engine's namespace is in the profile (nothing it
    exports is unknown to us), and each profile series found there has the profile's type and labels."""
    names, types = _names_in(_real(file))
    profile = ENGINES.get(key) or RELATED[key]
    found = [s for s in profile.series if s.name in names or set(s.sample_names) & names]
    assert found, file
    for s in found:
        family_type = types.get(s.name) or types.get(s.name.removesuffix("_total"))
        assert family_type == s.type, (s.name, family_type)
    if key == "llamacpp":
        ours = {s.name for s in profile.series}
        theirs = {n for n in types if n.startswith("llamacpp:")}
        assert theirs <= ours, theirs - ours


@pytest.mark.parametrize(("key", "file"), [(k, f) for k, files in EXPOSITIONS.items() for f in files])
def test_labels_in_the_exposition_are_those_the_profile_declares(key: str, file: str) -> None:
    scrape = read_scrape(_real(file))
    profile = ENGINES.get(key) or RELATED[key]
    for fam, sample in scrape.samples():
        s = profile.by_name(sample.name) or profile.by_name(fam.name)
        if s is None or s.unit == "info":
            continue  # an info gauge's labels are the configuration it reports
        labels = {k for k, _ in sample.labels} - {"le", "quantile"}
        # the exposition may carry fewer labels than the source declares (a hand-merged or older capture),
        # never one the profile does not know of, except SGLang's rank labels that vary with parallelism
        unknown = labels - set(s.labels) - ({"tp_rank", "pp_rank", "dp_rank"} if key == "sglang" else set())
        assert not unknown, (sample.name, unknown)


def test_vllm_histogram_bounds_are_the_profiles_where_the_exposition_has_them() -> None:
    """Every bound of the exposition is one of the profile's; its V0 TTFT and per-step histograms show the
    older, shorter lists, which the current ones extend (a prefix); its hand-added V1 families carry only a
    few of the bounds (SOURCES.md)."""
    scrape = read_scrape(_real(EXPOSITIONS["vllm"][0]))
    vllm = ENGINES["vllm"]
    checked = set()
    for h in scrape.histograms():
        s = vllm.by_name(h.family)
        if s is None or not s.buckets:
            continue
        assert set(h.finite_bounds) <= set(s.buckets), (h.family, set(h.finite_bounds) - set(s.buckets))
        checked.add(h.family)
    for family in ("vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds"):
        [h] = [h for h in scrape.histograms() if h.family == family]
        s = vllm.by_name(family)
        assert s is not None and s.buckets[: len(h.finite_bounds)] == h.finite_bounds
    assert len(checked) >= 8


def test_tgi_duration_bounds_match_the_exposition_exactly() -> None:
    scrape = read_scrape(_real(EXPOSITIONS["tgi"][0]))
    [h] = [h for h in scrape.histograms() if h.family == "tgi_request_inference_duration"]
    [extra] = [s for s in ENGINES["tgi"].series if s.name == "tgi_request_inference_duration"]
    assert h.finite_bounds == extra.buckets  # exact floats, computed as TGI computes them


def test_the_llamacpp_usage_identity_holds_on_the_real_scrapes() -> None:
    """prompt tokens of usage = prompt_tokens_total + prompt_tokens_cached_total: grew by 5,558 between the
    two real scrapes (SOURCES.md: the usage sums of the 58 requests)."""
    def value(path: Path, name: str) -> float:
        return next(s.value for _, s in read_scrape(path).samples() if s.name == name)

    before, after = (_real(f) for f in EXPOSITIONS["llamacpp"])
    p = ENGINES["llamacpp"]
    prompt, cached = p.get("prompt_tokens"), p.get("prompt_tokens_cached")
    assert prompt is not None and cached is not None
    grew = sum(value(after, s.name) - value(before, s.name) for s in (prompt, cached))
    assert grew == 5_558


def test_importing_the_profiles_loads_no_runtime_and_no_analysis_stack() -> None:
    """Standard library and llmslo.telemetry's contracts only: rules, dashboards and the gateway read these."""
    import subprocess
    import sys

    code = ("import sys, llmslo.engines\n"
            "heavy = ('prometheus_client', 'polars', 'duckdb', 'numpy', 'scipy', 'typer', 'pyarrow', "
            "'llmslo.analysis', 'opentelemetry')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.startswith(heavy)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout
