"""NVIDIA NIM for LLMs: vLLM-style series without the ``vllm:`` prefix. NIM is closed source: this profile is
read from a captured exposition, so its bounds are those the exposition shows and its definitions are vLLM's
older ones, which the names and help texts follow."""

from __future__ import annotations

from llmslo.engines._profile import EXTRA, EngineProfile, Series

_SRC = ("NVIDIA NIM for LLMs (closed source), read from its /metrics: DataDog/integrations-core@8b7db5d2:"
        "nvidia_nim/tests/fixtures/nim_metrics.txt")
_LABELS = ("model_name",)
_AS_VLLM = "vLLM's pre-V1 definition, which NIM's names and help texts follow (not verifiable: closed source)"

NIM = EngineProfile(
    key="nim",
    name="NVIDIA NIM for LLMs",
    version="1.x (process start 2024-10)",
    series=(
        Series("ttft_s", "time_to_first_token_seconds", "histogram", "seconds", _LABELS,
               (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
               difference=_AS_VLLM, source=_SRC),
        Series("itl_s", "time_per_output_token_seconds", "histogram", "seconds", _LABELS,
               (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5), per="engine step",
               difference=f"despite its name, the gap per engine step ({_AS_VLLM}), not a per-request TPOT",
               source=_SRC),
        Series("e2e_s", "e2e_request_latency_seconds", "histogram", "seconds", _LABELS,
               (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0), difference=_AS_VLLM, source=_SRC),
        Series("running", "num_requests_running", "gauge", "requests", _LABELS, source=_SRC),
        Series("waiting", "num_requests_waiting", "gauge", "requests", _LABELS, source=_SRC),
        Series("kv_usage", "gpu_cache_usage_perc", "gauge", "ratio", _LABELS,
               difference="a fraction 0..1 despite the _perc in its name", source=_SRC),
        Series("prompt_tokens", "prompt_tokens_total", "counter", "tokens", _LABELS, per="token", source=_SRC),
        Series("generated_tokens", "generation_tokens_total", "counter", "tokens", _LABELS, per="token",
               source=_SRC),
        Series("requests_finished", "request_finish_total", "counter", "requests", (*_LABELS, "finished_reason"),
               finish_label="finished_reason", source=_SRC),
        Series("requests_succeeded", "request_success_total", "counter", "requests", _LABELS, source=_SRC),
        Series("requests_failed", "request_failure_total", "counter", "requests", _LABELS, source=_SRC),
        Series(EXTRA, "num_request_max", "gauge", "requests", _LABELS, per="server", source=_SRC,
               what="the configured maximum of concurrently running requests"),
        Series(EXTRA, "request_prompt_tokens", "histogram", "tokens", _LABELS, source=_SRC,
               what="prompt tokens per finished request"),
        Series(EXTRA, "request_generation_tokens", "histogram", "tokens", _LABELS, source=_SRC,
               what="generated tokens per finished request"),
    ),
    lacks={
        "requests_received": "no counter at arrival in the exposition",
        "prefill_s": "no prefill-time histogram in the exposition",
        "decode_s": "no decode-time histogram in the exposition",
        "preemptions": "no preemption counter in the exposition",
        "tpot_s": "no per-request TPOT (time_per_output_token_seconds is a per-step gap)",
        "queue_s": "no queue-time histogram in the exposition",
        "aborts": "no abort counter in the exposition",
        "prompt_tokens_cached": "no prefix-cache counter in the exposition",
    },
    notes=(
        "closed source: names, types and bounds are those of a captured exposition, definitions inferred "
        "from vLLM, whose names NIM exports without the vllm: prefix",
        "TensorRT-LLM 1.0-1.1 exports some of the same unprefixed names (request_success_total, "
        "time_to_first_token_seconds, ...) with other meanings: tell them apart by the other series present",
    ),
)
