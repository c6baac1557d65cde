"""NVIDIA NIM for LLMs: vLLM-style names without the ``vllm:`` prefix (closed source)."""

from __future__ import annotations

from llmslo.engines._profile import EngineProfile, Series

_SRC = ("NVIDIA NIM (closed source): names read from its exposition, DataDog/integrations-core@8b7db5d2:"
        "nvidia_nim/tests/fixtures/nim_metrics.txt")
_LABELS = ("model_name",)

NIM = EngineProfile(
    key="nim",
    name="NVIDIA NIM for LLMs",
    version="1.x (2024-10)",
    series=(
        Series("ttft_s", "time_to_first_token_seconds", "histogram", "seconds", _LABELS,
               (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
               difference="vLLM's V0 definition (the NIM builds on vLLM)", source=_SRC),
        Series("itl_s", "time_per_output_token_seconds", "histogram", "seconds", _LABELS,
               (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5), per="engine step",
               difference="vLLM's V0 time_per_output_token: the gap per engine step, not a per-request TPOT",
               source=_SRC),
        Series("e2e_s", "e2e_request_latency_seconds", "histogram", "seconds", _LABELS, source=_SRC),
        Series("running", "num_requests_running", "gauge", "requests", _LABELS, source=_SRC),
        Series("waiting", "num_requests_waiting", "gauge", "requests", _LABELS, source=_SRC),
        Series("kv_usage", "gpu_cache_usage_perc", "gauge", "ratio", _LABELS, source=_SRC),
        Series("prompt_tokens", "prompt_tokens_total", "counter", "tokens", _LABELS, per="token", source=_SRC),
        Series("generated_tokens", "generation_tokens_total", "counter", "tokens", _LABELS, per="token",
               source=_SRC),
        Series("requests_finished", "request_finish_total", "counter", "requests", (*_LABELS, "finished_reason"),
               finish_label="finished_reason", source=_SRC),
        Series("requests_succeeded", "request_success_total", "counter", "requests", _LABELS, source=_SRC),
        Series("requests_failed", "request_failure_total", "counter", "requests", _LABELS, source=_SRC),
    ),
    notes=("closed source: the profile is read from a captured exposition, not from code",),
)
