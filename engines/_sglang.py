"""SGLang ``/metrics`` (``--enable-metrics``): ``sglang:`` series labelled by model (and rank)."""

from __future__ import annotations

from llmslo.engines._profile import EngineProfile, Series

_SRC = "sgl-project/sglang@00ae9c15:python/sglang/srt/metrics/collector.py"
_LABELS = ("model_name",)
_FRONT = "put llmslo's middleware (telemetry) or llmslo's gateway in front of SGLang"

SGLANG = EngineProfile(
    key="sglang",
    name="SGLang",
    version="0.5",
    series=(
        Series("ttft_s", "sglang:time_to_first_token_seconds", "histogram", "seconds", _LABELS,
               difference="from the request's creation in the tokenizer manager; aborted requests without a "
                          "token are absent",
               source=_SRC),
        Series("e2e_s", "sglang:e2e_request_latency_seconds", "histogram", "seconds", _LABELS,
               difference="observed for every finished request, including those aborted before a first token",
               source=_SRC),
        Series("itl_s", "sglang:inter_token_latency_seconds", "histogram", "seconds", _LABELS, per="token",
               difference="token-weighted like ours (a chunk of k tokens counts k observations of gap / k)",
               source=_SRC),
        Series("tpot_s", "sglang:time_per_output_token_seconds", "histogram", "seconds", _LABELS,
               per="streamed chunk",
               difference="(now - first token) / (tokens so far - 1), observed at every streamed chunk: a "
                          "running per-request TPOT, chunk-weighted, not one observation per request",
               source=_SRC),
        Series("queue_s", "sglang:queue_time_seconds", "histogram", "seconds", _LABELS, source=_SRC),
        Series("running", "sglang:num_running_reqs", "gauge", "requests", _LABELS, source=_SRC),
        Series("waiting", "sglang:num_queue_reqs", "gauge", "requests", _LABELS, source=_SRC),
        Series("kv_usage", "sglang:token_usage", "gauge", "ratio", _LABELS,
               difference="used KV-pool tokens / pool size", source=_SRC),
        Series("prompt_tokens", "sglang:prompt_tokens_total", "counter", "tokens", _LABELS, per="token",
               source=_SRC),
        Series("prompt_tokens_cached", "sglang:cached_tokens_total", "counter", "tokens", _LABELS, per="token",
               source=_SRC),
        Series("generated_tokens", "sglang:generation_tokens_total", "counter", "tokens", _LABELS, per="token",
               source=_SRC),
        Series("requests_finished", "sglang:num_requests_total", "counter", "requests", _LABELS,
               difference="requests counted without a finish reason", source=_SRC),
    ),
    lacks={
        "requests_succeeded": "requests are counted without a finish reason: successes cannot be told apart",
        "requests_failed": f"no error counter; {_FRONT}",
        "aborts": f"no counter of aborted requests; {_FRONT}",
    },
)
