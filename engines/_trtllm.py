"""TensorRT-LLM's ``trtllm-serve``."""

from __future__ import annotations

from llmslo.engines._profile import EngineProfile

TRTLLM = EngineProfile(
    key="trtllm",
    name="TensorRT-LLM trtllm-serve",
    version="",
    series=(),
    notes=("profile not read from the source yet",),
)
