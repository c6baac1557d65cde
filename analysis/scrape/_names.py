"""Other servers' metric names mapped to our intervals (definitions.md).

:data:`KNOWN_METRICS` maps servers' latency histograms (vLLM, SGLang, TGI, llmslo; seconds) to our
interval names (``ttft_s``, ``tpot_s``, ``itl_s``, ``e2e_s``, ``queue_s``, ``decode_s``,
``client_ttft_s``), with what one observation is and how its definition differs from definitions.md.
:data:`QUEUE_GAUGES` (requests waiting) and :data:`SUCCESS_COUNTERS` (requests succeeded) name, per
server, the gauges and counters the consistency checks read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llmslo.telemetry import METRICS

__all__ = [
    "KNOWN_METRICS",
    "KnownMetric",
    "QUEUE_GAUGES",
    "SUCCESS_COUNTERS",
    "known_metric",
]


@dataclass(frozen=True)
class KnownMetric:
    """A server's latency histogram and the interval of definitions.md it measures.

    ``name`` is the family name as exposed (without ``_bucket``); ``per`` says what one observation is
    (``request``, ``engine step``, ``streamed chunk``, ``token``); ``difference`` states how the
    server's definition differs from ours (empty when it agrees).
    """

    name: str
    server: str
    interval: str
    per: str
    difference: str


KNOWN_METRICS: tuple[KnownMetric, ...] = (
    KnownMetric("vllm:time_to_first_token_seconds", "vllm", "ttft_s", "request",
                "from the engine's arrival time of the request; requests that never produce a token are absent"),
    KnownMetric("vllm:e2e_request_latency_seconds", "vllm", "e2e_s", "request",
                "observed when the engine finishes a request"),
    KnownMetric("vllm:request_time_per_output_token_seconds", "vllm", "tpot_s", "request", ""),
    KnownMetric("vllm:inter_token_latency_seconds", "vllm", "itl_s", "engine step",
                "one observation per engine output event, not per token: a step that commits k tokens counts "
                "once with the whole gap (ours: k samples of gap / k)"),
    KnownMetric("vllm:time_per_output_token_seconds", "vllm", "itl_s", "engine step",
                "despite its name, the gap per engine output event (vLLM's older name for "
                "inter_token_latency), not a per-request TPOT"),
    KnownMetric("vllm:request_queue_time_seconds", "vllm", "queue_s", "request",
                "time in the engine's waiting queue"),
    KnownMetric("vllm:request_decode_time_seconds", "vllm", "decode_s", "request", ""),
    KnownMetric("sglang:time_to_first_token_seconds", "sglang", "ttft_s", "request",
                "from the request's creation in the tokenizer manager; aborted requests without a token are absent"),
    KnownMetric("sglang:e2e_request_latency_seconds", "sglang", "e2e_s", "request",
                "observed for every finished request, including those aborted before a first token"),
    KnownMetric("sglang:time_per_output_token_seconds", "sglang", "tpot_s", "streamed chunk",
                "(now - first token) / (tokens so far - 1), observed at every streamed chunk: a running "
                "per-request TPOT, so a long request contributes many observations (chunk-weighted, "
                "not one per request)"),
    KnownMetric("sglang:inter_token_latency_seconds", "sglang", "itl_s", "token",
                "token-weighted like ours (a chunk of k tokens counts k observations of gap / k)"),
    KnownMetric("sglang:queue_time_seconds", "sglang", "queue_s", "request", ""),
    KnownMetric("tgi_request_duration", "tgi", "e2e_s", "request",
                "successful requests only (failures only increment tgi_request_failure)"),
    KnownMetric("tgi_request_queue_duration", "tgi", "queue_s", "request", "successful requests only"),
    KnownMetric("tgi_request_mean_time_per_token_duration", "tgi", "tpot_s", "request",
                "inference time / N: includes prefill and divides by N, not decode time / (N - 1), so it "
                "is not our TPOT (closer to e2e / N); successful requests only"),
    # llmslo's own histograms, from the name catalogue (ITL is observed per token, the others per request)
    *(KnownMetric(m.name, "llmslo", m.source, "token" if m.source == "itl_s" else "request", "")
      for m in METRICS if m.type == "histogram" and m.source is not None),
)
"""Known latency histograms of LLM servers, mapped to our interval names (definitions.md)."""

_KNOWN_BY_NAME: Mapping[str, KnownMetric] = {m.name: m for m in KNOWN_METRICS}

QUEUE_GAUGES: Mapping[str, str] = {
    "vllm:num_requests_waiting": "vllm",
    "sglang:num_queue_reqs": "sglang",
    "tgi_queue_size": "tgi",
}
SUCCESS_COUNTERS: Mapping[str, str] = {
    "vllm:request_success_total": "vllm",
}


def known_metric(name: str) -> KnownMetric | None:
    """The :class:`KnownMetric` of a histogram family name (with or without ``_bucket``), else None."""
    return _KNOWN_BY_NAME.get(name) or _KNOWN_BY_NAME.get(name.removesuffix("_bucket"))
