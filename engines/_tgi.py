"""Hugging Face Text Generation Inference (TGI) ``/metrics``: ``tgi_`` series from its router."""

from __future__ import annotations

from llmslo.engines._profile import EngineProfile, Series

_SRC = "huggingface/text-generation-inference:router/src/server.rs"
_FRONT = "put llmslo's middleware (telemetry) or llmslo's gateway in front of TGI"

TGI = EngineProfile(
    key="tgi",
    name="Text Generation Inference",
    version="3",
    series=(
        Series("e2e_s", "tgi_request_duration", "histogram", "seconds",
               difference="successful requests only (failures only increment tgi_request_failure)",
               source=_SRC),
        Series("queue_s", "tgi_request_queue_duration", "histogram", "seconds",
               difference="successful requests only", source=_SRC),
        Series("tpot_s", "tgi_request_mean_time_per_token_duration", "histogram", "seconds",
               difference="inference time / N: includes prefill and divides by N, not decode time / (N - 1), "
                          "so it is not our TPOT (closer to e2e / N); successful requests only",
               source=_SRC),
        Series("waiting", "tgi_queue_size", "gauge", "requests", source=_SRC),
        Series("requests_succeeded", "tgi_request_success", "counter", "requests", source=_SRC),
        Series("requests_failed", "tgi_request_failure", "counter", "requests", ("err",), source=_SRC),
    ),
    lacks={
        "ttft_s": f"no time-to-first-token histogram; {_FRONT}",
    },
)
