"""vLLM (V1 engine) ``/metrics``: ``vllm:`` histograms, gauges and counters labelled ``model_name``, ``engine``."""

from __future__ import annotations

from llmslo.engines._profile import EXTRA, EngineProfile, Series

_SRC = "vllm-project/vllm@v0.12:vllm/v1/metrics/loggers.py"
_SRC_CACHED = "vllm-project/vllm@v0.13:vllm/v1/metrics/loggers.py (PromptTokenStats counters)"
_SRC_V0 = "vllm-project/vllm@v0.10:vllm/v1/metrics/loggers.py"
_LABELS = ("model_name", "engine")
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                  40.0, 80.0)
_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0)
_ABORTED = ("aborted requests are absent (vllm issue #55634: they never reach the finished-request "
            "statistics)")
_FINISH = ("stop", "length", "abort", "error", "repetition")
_FRONT = ("add llmslo's middleware to vLLM (vllm serve --middleware llmslo.telemetry.LlmsloMiddleware; "
          "docs/middleware.md) or put llmslo gateway in front of it (docs/gateway.md): either observes each request's "
          "stream")

VLLM = EngineProfile(
    key="vllm",
    name="vLLM",
    version="0.12 (V1 engine)",
    series=(
        Series("ttft_s", "vllm:time_to_first_token_seconds", "histogram", "seconds", _LABELS, _TTFT_BUCKETS,
               difference="from the frontend's arrival time to the first token the engine produced; "
                          "requests aborted before a first token are absent",
               source=_SRC),
        Series("tpot_s", "vllm:request_time_per_output_token_seconds", "histogram", "seconds", _LABELS,
               _TOKEN_BUCKETS,
               difference=f"the request's mean time per output token, observed when it finishes; {_ABORTED}",
               source=_SRC),
        Series("itl_s", "vllm:inter_token_latency_seconds", "histogram", "seconds", _LABELS, _TOKEN_BUCKETS,
               per="engine step",
               difference="one observation per engine output event, not per token: a step that commits k tokens "
                          "(speculative decoding) counts once with the whole gap (ours: k samples of gap / k)",
               source=_SRC),
        Series("itl_s", "vllm:time_per_output_token_seconds", "histogram", "seconds", _LABELS, _TOKEN_BUCKETS,
               per="engine step",
               difference="despite its name, the gap per engine output event (the older name of "
                          "vllm:inter_token_latency_seconds), not a per-request TPOT",
               deprecated="renamed vllm:inter_token_latency_seconds in 0.11; hidden from 0.12 unless "
                          "--show-hidden-metrics-for-version=0.11",
               source=_SRC),
        Series("e2e_s", "vllm:e2e_request_latency_seconds", "histogram", "seconds", _LABELS, _REQUEST_BUCKETS,
               difference=f"from the frontend's arrival time to the engine's finish; {_ABORTED}", source=_SRC),
        Series("queue_s", "vllm:request_queue_time_seconds", "histogram", "seconds", _LABELS, _REQUEST_BUCKETS,
               difference=f"time in the engine core's waiting queue (engine-core clock); {_ABORTED}",
               source=_SRC),
        Series("prefill_s", "vllm:request_prefill_time_seconds", "histogram", "seconds", _LABELS,
               _REQUEST_BUCKETS,
               difference=f"from first scheduling to the first token; {_ABORTED}", source=_SRC),
        Series("decode_s", "vllm:request_decode_time_seconds", "histogram", "seconds", _LABELS, _REQUEST_BUCKETS,
               difference=_ABORTED, source=_SRC),
        Series("running", "vllm:num_requests_running", "gauge", "requests", _LABELS,
               difference="requests in the engine's running batch at its last scheduler step", source=_SRC),
        Series("waiting", "vllm:num_requests_waiting", "gauge", "requests", _LABELS, source=_SRC),
        Series("kv_usage", "vllm:kv_cache_usage_perc", "gauge", "ratio", _LABELS,
               difference="a fraction 0..1 despite the _perc in its name", source=_SRC),
        Series("kv_usage", "vllm:gpu_cache_usage_perc", "gauge", "ratio", _LABELS,
               deprecated="renamed vllm:kv_cache_usage_perc in 0.9", source=_SRC_V0),
        Series("prompt_tokens", "vllm:prompt_tokens_total", "counter", "tokens", _LABELS, per="token",
               difference="prefill tokens the engine scheduled, including those of requests later aborted "
                          "(vllm issue #55634)",
               source=_SRC),
        Series("prompt_tokens_cached", "vllm:prompt_tokens_cached_total", "counter", "tokens", _LABELS,
               per="token", difference="prefix-cache hits, local and external (KV transfer)",
               source=_SRC_CACHED),
        Series("generated_tokens", "vllm:generation_tokens_total", "counter", "tokens", _LABELS, per="token",
               source=_SRC),
        Series("requests_finished", "vllm:request_success_total", "counter", "requests",
               (*_LABELS, "finished_reason"), finish_label="finished_reason", finish_values=_FINISH,
               difference="despite its name, every finished request by finish reason (the values of "
                          "FinishReason, vllm/v1/engine/__init__.py: error and repetition in recent releases "
                          "only); the abort series exists but stays 0 (vllm issue #31503), so cancelled "
                          "requests are not counted",
               source=_SRC),
        Series("preemptions", "vllm:num_preemptions_total", "counter", "requests", _LABELS, source=_SRC),
        Series(EXTRA, "vllm:request_inference_time_seconds", "histogram", "seconds", _LABELS, _REQUEST_BUCKETS,
               difference=_ABORTED, source=_SRC, what="time in the RUNNING phase (prefill + decode)"),
        Series(EXTRA, "vllm:prefix_cache_queries_total", "counter", "tokens", _LABELS, per="token", source=_SRC,
               what="prefix-cache queries, in tokens"),
        Series(EXTRA, "vllm:prefix_cache_hits_total", "counter", "tokens", _LABELS, per="token", source=_SRC,
               what="prefix-cache hits, in tokens"),
        Series(EXTRA, "vllm:request_prompt_tokens", "histogram", "tokens", _LABELS,
               difference="bucket bounds 1, 2, 5, 10, ... up to the model's max_model_len", source=_SRC,
               what="prompt tokens per finished request"),
        Series(EXTRA, "vllm:request_generation_tokens", "histogram", "tokens", _LABELS,
               difference="bucket bounds 1, 2, 5, 10, ... up to the model's max_model_len", source=_SRC,
               what="generated tokens per finished request"),
        Series(EXTRA, "vllm:iteration_tokens_total", "histogram", "tokens", _LABELS,
               (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0),
               per="engine step", difference="a histogram despite the _total in its name", source=_SRC,
               what="tokens per engine step"),
        Series(EXTRA, "vllm:engine_sleep_state", "gauge", "state", (*_LABELS, "sleep_state"), per="engine",
               source=_SRC, what="whether the engine sleeps (awake, weights_offloaded, discard_all)"),
        Series(EXTRA, "vllm:cache_config_info", "gauge", "info", per="engine", source=_SRC,
               what="the cache configuration as labels (value 1)"),
    ),
    lacks={
        "requests_received": "no counter at arrival: requests are counted when they finish",
        "requests_succeeded": "no counter of successes alone: sum vllm:request_success_total over "
                              "finished_reason=~\"stop|length\"",
        "requests_failed": f"no counter of failed requests (finished_reason=\"error\" only for retryable "
                           f"engine errors; HTTP-level failures are not counted); {_FRONT}",
        "aborts": f"the finished_reason=\"abort\" series stays 0 (vllm issue #31503); {_FRONT}",
    },
    notes=(
        "aborted requests are absent from every per-request histogram while their prompt tokens are counted "
        "(vllm issues #31503, #55634): a success-only view, so latency tails look better under cancellation",
        "TTFT, e2e and the request counter are observed at the frontend's arrival time, queue/prefill/decode "
        "on the engine core's clock",
        "one series per engine (data-parallel rank) through the engine label: sum by model_name",
    ),
)
