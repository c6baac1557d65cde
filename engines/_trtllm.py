"""TensorRT-LLM's ``trtllm-serve``: Prometheus series from ``tensorrt_llm/metrics/collector.py``.

trtllm-serve answers ``/metrics`` with JSON iteration statistics, not Prometheus text; its Prometheus
exposition is the prometheus-client registry of the MetricsCollector, created only when the server runs with
``return_perf_metrics`` and exposed at ``/prometheus/metrics``.
"""

from __future__ import annotations

from llmslo.engines._profile import EXTRA, EngineProfile, Series

_SRC = "NVIDIA/TensorRT-LLM (main, 2026):tensorrt_llm/metrics/collector.py"
_SRC_OLD = "NVIDIA/TensorRT-LLM@89fd9b74:tensorrt_llm/metrics/collector.py (1.0-1.1, names without a prefix)"
_TIMES = "NVIDIA/TensorRT-LLM:tensorrt_llm/executor/result.py (the request's perf metrics to seconds)"
_LABELS = ("model_name", "engine_type")
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
         80.0, 160.0, 640.0, 2560.0)
_TOKEN = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
            960.0, 1920.0, 7680.0)
_FINISHED = ("observed only for requests that finished with a finish reason; a value of 0 is dropped "
             "(the collector observes only truthy values)")
_OLD = "the name without the trtllm_ prefix in 1.0-1.1 (Dynamo added trtllm_ itself)"

TRTLLM = EngineProfile(
    key="trtllm",
    name="TensorRT-LLM trtllm-serve",
    version="main 2026 (MetricsCollector with the trtllm_ prefix)",
    series=(
        Series("ttft_s", "trtllm_time_to_first_token_seconds", "histogram", "seconds", _LABELS, _TTFT,
               difference=f"first-token time - arrival time of the engine's per-request perf metrics; {_FINISHED}",
               source=f"{_SRC}; {_TIMES}"),
        Series("tpot_s", "trtllm_time_per_output_token_seconds", "histogram", "seconds", _LABELS, _TOKEN,
               difference="(last token - first token) / (output tokens - 1), only when more than one token "
                          f"and a single response: our TPOT, one observation per request; {_FINISHED}",
               source=f"{_SRC}; {_TIMES}"),
        Series("e2e_s", "trtllm_e2e_request_latency_seconds", "histogram", "seconds", _LABELS, _REQUEST,
               difference=f"last-token time - arrival time (not the finish of the response); {_FINISHED}",
               source=f"{_SRC}; {_TIMES}"),
        Series("queue_s", "trtllm_request_queue_time_seconds", "histogram", "seconds", _LABELS, _REQUEST,
               difference=f"first-scheduled time - arrival time; {_FINISHED}", source=f"{_SRC}; {_TIMES}"),
        Series("requests_finished", "trtllm_request_success_total", "counter", "requests",
               (*_LABELS, "finished_reason"), finish_label="finished_reason",
               difference="despite its name, every request that finished with a finish reason, by that reason "
                          "(the values are the request output's finish reason; collector.py does not list them)",
               source=_SRC),
        Series("requests_failed", "trtllm_request_error_total", "counter", "requests", (*_LABELS, "http_code"),
               difference="request errors by HTTP status code", source=_SRC),
        Series("waiting", "trtllm_server_queue_length", "gauge", "requests", _LABELS,
               difference="queued requests from the executor's iteration statistics (polled)", source=_SRC),
        Series("running", "trtllm_num_active_requests", "gauge", "requests", _LABELS,
               difference="active requests from the executor's iteration statistics (polled)", source=_SRC),
        Series("kv_usage", "trtllm_kv_cache_utilization", "gauge", "ratio", _LABELS,
               difference="used / max KV-cache blocks from the iteration statistics", source=_SRC),
        Series("prompt_tokens", "trtllm_prompt_tokens_total", "counter", "tokens", _LABELS, per="token",
               difference="counted when a request finishes", source=_SRC),
        Series("prompt_tokens_cached", "trtllm_prompt_cached_tokens_total", "counter", "tokens", _LABELS,
               per="token", difference="counted when a request finishes", source=_SRC),
        Series("ttft_s", "time_to_first_token_seconds", "histogram", "seconds", _LABELS, _TTFT,
               deprecated=_OLD, source=_SRC_OLD),
        Series("tpot_s", "time_per_output_token_seconds", "histogram", "seconds", _LABELS, _TOKEN,
               deprecated=_OLD, source=_SRC_OLD),
        Series("e2e_s", "e2e_request_latency_seconds", "histogram", "seconds", _LABELS, _REQUEST,
               deprecated=_OLD, source=_SRC_OLD),
        Series("queue_s", "request_queue_time_seconds", "histogram", "seconds", _LABELS, _REQUEST,
               deprecated=_OLD, source=_SRC_OLD),
        Series("requests_finished", "request_success_total", "counter", "requests", (*_LABELS, "finished_reason"),
               finish_label="finished_reason", deprecated=_OLD, source=_SRC_OLD),
        Series(EXTRA, "trtllm_kv_cache_hit_rate", "gauge", "ratio", _LABELS, source=_SRC,
               what="KV-cache (prefix) hit rate from the iteration statistics"),
        Series(EXTRA, "trtllm_prompt_cached_tokens", "histogram", "tokens", _LABELS,
               (0.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0), source=_SRC,
               what="cached prompt tokens per request"),
        Series(EXTRA, "trtllm_prefill_batch_tokens", "histogram", "tokens", _LABELS,
               (64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0), per="engine step",
               source=_SRC, what="context tokens per iteration"),
        Series(EXTRA, "trtllm_spec_decode_drafted_tokens_total", "counter", "tokens",
               (*_LABELS, "token_position"), per="token", source=_SRC,
               what="speculative decoding: drafted tokens per position"),
        Series(EXTRA, "trtllm_spec_decode_accepted_tokens_total", "counter", "tokens",
               (*_LABELS, "token_position"), per="token", source=_SRC,
               what="speculative decoding: accepted tokens per position"),
    ),
    lacks={
        "requests_received": "no counter at arrival: requests are counted when they finish",
        "itl_s": "no inter-token histogram; add llmslo's middleware to trtllm-serve's FastAPI app (docs/middleware.md) "
                 "or put llmslo gateway in front of it (docs/gateway.md)",
        "prefill_s": "no prefill-time histogram in the collector read",
        "decode_s": "no decode-time histogram in the collector read",
        "generated_tokens": "no counter of generated tokens in the collector read (its perf metrics carry no "
                            "generation-token count to it); count them with llmslo's middleware or gateway",
        "requests_succeeded": "no counter of successes alone: trtllm_request_success_total counts every finish "
                              "reason; select the successful ones",
        "aborts": "no abort counter: whether a request the client abandons (trtllm-serve aborts it on disconnect) "
                  "reaches trtllm_request_success_total with a reason was not established from the files read; "
                  "add llmslo's middleware to trtllm-serve's FastAPI app or put llmslo gateway in front of it",
        "preemptions": "no preemption counter",
    },
    notes=(
        "Prometheus series exist only with return_perf_metrics; /metrics is JSON iteration statistics, the "
        "Prometheus text is served at /prometheus/metrics",
        "the collector is created with model_name=\"undefined\" and engine_type=\"undefined\" by trtllm-serve",
        "every request histogram and counter is written when a request finishes with a finish reason; "
        "requests that end otherwise are in none of them",
        "1.0-1.1 export five families without a prefix (request_success_total, e2e_request_latency_seconds, "
        "time_to_first_token_seconds, time_per_output_token_seconds, request_queue_time_seconds); the same "
        "names as NVIDIA NIM's vLLM-style series, so a scrape with only those is ambiguous",
    ),
)
