"""Hugging Face Text Generation Inference (TGI) ``/metrics``: ``tgi_`` series written by its Rust router."""

from __future__ import annotations

from llmslo.engines._profile import EXTRA, EngineProfile, Series

_V = "huggingface/text-generation-inference@v3.3.7"
_SRC = f"{_V}:router/src/server.rs"
_INFER = f"{_V}:router/src/infer/mod.rs"
_QUEUE = f"{_V}:backends/v3/src/queue.rs"
_BACKEND = f"{_V}:backends/v3/src/backend.rs"
_VALIDATION = f"{_V}:router/src/validation.rs"


def _durations() -> tuple[float, ...]:
    """TGI's bounds for every histogram whose name ends in ``duration``: 35 terms of a geometric sequence,
    each the previous times 1.5 from 0.0001 (computed as TGI computes it, so the floats match the exposition)."""
    value, out = 0.0001, []
    for _ in range(35):
        value *= 1.5
        out.append(value)
    return tuple(out)


_DURATION = _durations()
_SUCCESS_ONLY = "observed for successful requests only (a failure increments tgi_request_failure and nothing else)"
_FRONT = ("observe each request's stream instead: put llmslo gateway in front of TGI (docs/gateway.md), or use "
          "the clients' own summaries (llmslo load); TGI is no Python server, so llmslo's middleware cannot go "
          "inside it")

TGI = EngineProfile(
    key="tgi",
    name="Text Generation Inference",
    version="3.3.7",
    series=(
        Series("e2e_s", "tgi_request_duration", "histogram", "seconds", (), _DURATION,
               difference=f"from the router's receipt of the request to its response; {_SUCCESS_ONLY}",
               source=_SRC),
        Series("queue_s", "tgi_request_queue_duration", "histogram", "seconds", (), _DURATION,
               difference=f"from the end of validation to the start of inference; {_SUCCESS_ONLY}",
               source=_SRC),
        Series("tpot_s", "tgi_request_mean_time_per_token_duration", "histogram", "seconds", (), _DURATION,
               difference="inference time / generated tokens: it includes prefill and divides by N, not decode "
                          f"time / (N - 1), so it is not our TPOT (closer to e2e / N); {_SUCCESS_ONLY}",
               source=_SRC),
        Series("waiting", "tgi_queue_size", "gauge", "requests",
               difference="entries in the batching queue", source=_QUEUE),
        Series("running", "tgi_batch_current_size", "gauge", "requests",
               difference="requests in the batch being run", source=_BACKEND),
        Series("prompt_tokens", "tgi_request_input_length", "histogram", "tokens", per="request",
               difference="a histogram of each validated request's input length, not a counter: its _sum is the "
                          "prompt tokens of the requests that passed validation (bounds: max input tokens / 100 "
                          "steps, set at start)",
               source=_VALIDATION),
        Series("generated_tokens", "tgi_request_generated_tokens", "histogram", "tokens", per="request",
               difference="a histogram per successful request, not a counter: its _sum is the tokens generated "
                          "for successful requests only (bounds: max total tokens / 100 steps, set at start)",
               source=_SRC),
        Series("requests_received", "tgi_request_count", "counter", "requests",
               difference="counted when a request arrives at a route, before validation",
               source=_SRC),
        Series("requests_succeeded", "tgi_request_success", "counter", "requests", source=_SRC),
        Series("requests_failed", "tgi_request_failure", "counter", "requests", ("err",),
               difference="err is the failure kind: validation, overloaded, template, incomplete, dropped, "
                          "generation",
               source=_INFER),
        Series(EXTRA, "tgi_request_inference_duration", "histogram", "seconds", (), _DURATION,
               difference=_SUCCESS_ONLY, source=_SRC, what="time from the start of inference to the response "
                                                           "(prefill and decode)"),
        Series(EXTRA, "tgi_request_validation_duration", "histogram", "seconds", (), _DURATION,
               difference=_SUCCESS_ONLY, source=_SRC, what="time spent validating and tokenizing"),
        Series(EXTRA, "tgi_batch_forward_duration", "histogram", "seconds", ("method",), _DURATION,
               per="engine step", source=_BACKEND, what="one forward pass of a batch, method prefill or decode"),
        Series(EXTRA, "tgi_batch_inference_duration", "histogram", "seconds", ("method",), _DURATION,
               per="engine step", source=_BACKEND, what="one prefill or decode step of a batch, end to end"),
        Series(EXTRA, "tgi_request_skipped_tokens", "summary", "tokens", per="request", source=_BACKEND,
               what="tokens accepted beyond the first per speculative step"),
        Series(EXTRA, "tgi_batch_current_max_tokens", "gauge", "tokens", source=_BACKEND,
               what="maximum tokens the current batch may hold"),
    ),
    lacks={
        "ttft_s": f"no time-to-first-token histogram at all; {_FRONT}",
        "itl_s": f"no inter-token histogram; {_FRONT}",
        "prefill_s": "only per-batch timings (tgi_batch_forward_duration{method=\"prefill\"}), no per-request "
                     "prefill time",
        "decode_s": "no per-request decode time (tgi_request_inference_duration includes prefill)",
        "kv_usage": "no KV-cache usage gauge",
        "prompt_tokens_cached": "no prefix-cache counter",
        "requests_finished": "no counter of finished requests with a reason: successes, failures by kind, and "
                             "requests received are counted apart",
        "aborts": "no counter: a stream the client drops is counted in tgi_request_count but neither as a "
                  f"success nor as a failure; {_FRONT}",
        "preemptions": "no preemption counter",
    },
    notes=(
        "no labels on request series (one TGI serves one model)",
        "every latency histogram holds successful requests only: failures and dropped streams are invisible "
        "to them (survivor bias); tgi_request_count - tgi_request_success - tgi_request_failure counts the "
        "requests in flight or dropped",
        "every histogram whose name ends in duration shares one set of 35 bounds, none of them round numbers: "
        "no SLO threshold such as 2 s is a bound, so attainment is only a range",
    ),
)
