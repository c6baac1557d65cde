"""Inference engines' own Prometheus series, mapped to llmslo's concepts: pure data.

One :class:`EngineProfile` per engine (vLLM, SGLang, TGI, llama.cpp's llama-server, TensorRT-LLM's
trtllm-serve), each read from that engine's source (``Series.source`` names the version and file). A profile
says which series measures which of :data:`CONCEPTS`, with its type, unit, labels, bucket bounds and how its
definition differs from ``docs/definitions.md``, and what the engine lacks (``EngineProfile.lacks``, with
what to put in front instead). Rules, dashboards, ``llmslo scrape`` and the gateway read these profiles;
no other module writes an engine's metric name.

:data:`ENGINES` holds the five engines by ``--engine`` key; :data:`RELATED` holds servers that are not one of
them but export a known engine's names (NVIDIA NIM: vLLM's names without the ``vllm:`` prefix), so that a
scrape of one is read too. Standard library and llmslo.telemetry's contracts only.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from llmslo.engines._llamacpp import LLAMACPP
from llmslo.engines._nim import NIM
from llmslo.engines._profile import CONCEPTS, EXTRA, EngineProfile, Series, SeriesType
from llmslo.engines._sglang import SGLANG
from llmslo.engines._tgi import TGI
from llmslo.engines._trtllm import TRTLLM
from llmslo.engines._vllm import VLLM
from llmslo.telemetry import ConfigurationError

__all__ = [
    "CONCEPTS",
    "ENGINES",
    "EXTRA",
    "RELATED",
    "EngineProfile",
    "Series",
    "SeriesType",
    "all_profiles",
    "engine_profile",
]

ENGINES: Mapping[str, EngineProfile] = MappingProxyType(
    {p.key: p for p in (VLLM, SGLANG, TGI, LLAMACPP, TRTLLM)})
"""The inference engines by key: ``vllm``, ``sglang``, ``tgi``, ``llamacpp``, ``trtllm``."""

RELATED: Mapping[str, EngineProfile] = MappingProxyType({p.key: p for p in (NIM,)})
"""Servers that are not one of :data:`ENGINES` but whose exposition scrape reads (``nim``)."""


def engine_profile(key: str) -> EngineProfile:
    """The profile of engine ``key`` (see :data:`ENGINES`).

    Raises:
        ConfigurationError: ``key`` is not a known engine; the message names the known keys.
    """
    try:
        return ENGINES[key]
    except KeyError:
        raise ConfigurationError(
            f"unknown engine {key!r}: known engines are {', '.join(sorted(ENGINES))}") from None


def all_profiles() -> tuple[EngineProfile, ...]:
    """Every profile scrape reads: :data:`ENGINES` then :data:`RELATED`."""
    return (*ENGINES.values(), *RELATED.values())
