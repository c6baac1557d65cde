"""SGLang ``/metrics`` (``--enable-metrics``): ``sglang:`` series; the tokenizer manager's request histograms and
counters, the scheduler's gauges."""

from __future__ import annotations

from llmslo.engines._profile import EXTRA, EngineProfile, Series

_SRC = "sgl-project/sglang@00ae9c15:python/sglang/srt/metrics/collector.py"
_SRC_TM = "sgl-project/sglang@00ae9c15:python/sglang/srt/managers/tokenizer_manager.py (abort_request)"
_SRC_OLD = "sgl-project/sglang:docs/references/production_metrics.md (older releases' /metrics example)"
_REQ = ("model_name",)
"""Labels of the tokenizer manager's series (plus any custom labels the server is started with)."""
_SCHED = ("model_name", "tp_rank")
"""Labels of the scheduler's series (more rank labels with pipeline, data or expert parallelism)."""
_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
_E2E = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
        600.0, 1200.0, 1800.0, 2400.0)
_ITL = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4,
        0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
_QUEUE = (0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0,
          100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 1200.0, 1400.0, 1600.0, 1800.0,
          2000.0, 2500.0, 3000.0)
_CONFIGURABLE = ("default bounds; --bucket-time-to-first-token, --bucket-inter-token-latency and "
                 "--bucket-e2e-request-latency replace them")
_FRONT = ("add llmslo's middleware to SGLang's app (docs/middleware.md) or put llmslo gateway in front of it "
          "(docs/gateway.md): either observes each request's stream")

SGLANG = EngineProfile(
    key="sglang",
    name="SGLang",
    version="0.5 (collector.py @00ae9c15)",
    series=(
        Series("ttft_s", "sglang:time_to_first_token_seconds", "histogram", "seconds", _REQ, _TTFT,
               difference="from the request's arrival in the tokenizer manager; requests aborted before a first "
                          f"token are absent; {_CONFIGURABLE}",
               source=_SRC),
        Series("e2e_s", "sglang:e2e_request_latency_seconds", "histogram", "seconds", _REQ, _E2E,
               difference="observed when the tokenizer manager finishes a request, aborted ones included "
                          f"(whether or not they had a first token); {_CONFIGURABLE}",
               source=_SRC),
        Series("itl_s", "sglang:inter_token_latency_seconds", "histogram", "seconds", _REQ, _ITL, per="token",
               difference="token-weighted like ours: a chunk of k tokens adds k observations of gap / k to the "
                          "buckets, and the whole gap to the sum",
               source=_SRC),
        Series("tpot_s", "sglang:time_per_output_token_seconds", "histogram", "seconds", _REQ,
               (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 2.5),
               per="streamed chunk",
               difference="(now - first token) / (tokens so far - 1), observed at every streamed chunk: a running "
                          "per-request TPOT, chunk-weighted, not one observation per request",
               deprecated="older releases only (the documentation's /metrics example); replaced by "
                          "sglang:inter_token_latency_seconds",
               source=_SRC_OLD),
        Series("queue_s", "sglang:queue_time_seconds", "histogram", "seconds", _SCHED, _QUEUE,
               difference="observed by the scheduler when a request leaves its waiting queue", source=_SRC),
        Series("running", "sglang:num_running_reqs", "gauge", "requests", _SCHED, source=_SRC),
        Series("waiting", "sglang:num_queue_reqs", "gauge", "requests", _SCHED,
               difference="the scheduler's waiting queue (the grammar queue is sglang:num_grammar_queue_reqs)",
               source=_SRC),
        Series("kv_usage", "sglang:token_usage", "gauge", "ratio", _SCHED,
               difference="used KV-pool tokens / pool size", source=_SRC),
        Series("prompt_tokens", "sglang:prompt_tokens_total", "counter", "tokens", _REQ, per="token",
               difference="counted when a request finishes (aborted ones included), not as prefill runs",
               source=_SRC),
        Series("prompt_tokens_cached", "sglang:cached_tokens_total", "counter", "tokens", _REQ, per="token",
               difference="counted when a request finishes", source=_SRC),
        Series("generated_tokens", "sglang:generation_tokens_total", "counter", "tokens", _REQ, per="token",
               difference="counted when a request finishes", source=_SRC),
        Series("requests_finished", "sglang:num_requests_total", "counter", "requests", _REQ,
               difference="every finished request, aborted ones included, without a finish reason",
               source=_SRC),
        Series("aborts", "sglang:num_aborted_requests_total", "counter", "requests", _REQ,
               difference="abort calls (client disconnects, /abort_request); one abort-all call counts once",
               source=_SRC_TM),
        Series(EXTRA, "sglang:num_retracted_requests_total", "counter", "requests", _SCHED, source=_SRC,
               what="requests retracted (KV evicted, re-queued), the nearest to a preemption counter"),
        Series(EXTRA, "sglang:cache_hit_rate", "gauge", "ratio", _SCHED, source=_SRC,
               what="prefix-cache hit rate"),
        Series(EXTRA, "sglang:gen_throughput", "gauge", "tokens/s", _SCHED, source=_SRC,
               what="generation throughput over the scheduler's last logging interval"),
        Series(EXTRA, "sglang:num_used_tokens", "gauge", "tokens", _SCHED, source=_SRC,
               what="KV-pool tokens in use"),
        Series(EXTRA, "sglang:max_total_num_tokens", "gauge", "tokens", _SCHED, source=_SRC,
               what="KV-pool size in tokens"),
    ),
    lacks={
        "requests_received": "no counter at arrival: sglang:num_requests_total counts finished requests",
        "tpot_s": "no per-request TPOT in current releases (the older chunk-weighted histogram is gone): "
                  "derive it from the summaries of llmslo's middleware or gateway",
        "prefill_s": "no prefill-time histogram (sglang:per_stage_req_latency_seconds{stage} has stage timings)",
        "decode_s": "no decode-time histogram",
        "requests_succeeded": "requests are counted without a finish reason: successes cannot be told apart "
                              "from aborts and errors except by subtracting sglang:num_aborted_requests_total",
        "requests_failed": f"no error counter; {_FRONT}",
        "preemptions": "retractions are counted (sglang:num_retracted_requests_total), not as preemptions of "
                       "vLLM's kind",
    },
    notes=(
        "request counters and histograms are labelled by model only; scheduler gauges by model and rank",
        "aborted requests stay in sglang:e2e_request_latency_seconds but those without a first token are missing "
        "from the TTFT histogram: the TTFT-versus-e2e count gap is at least the number of such requests",
    ),
)
