"""The shape of an engine profile: which of an inference engine's own Prometheus series measures which of our
concepts, and what the engine lacks. Pure data, standard library only.

A **concept** is one thing llmslo reasons about, named once in :data:`CONCEPTS`; a profile maps each concept
the engine exports to a :class:`Series` (the name as it is queried in PromQL, its type, unit, labels, bucket
bounds, what one observation is, how its definition differs from ``docs/definitions.md``, and where in the
engine's source this was read), and each concept it does not export to the reason (:attr:`EngineProfile.lacks`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

SeriesType = Literal["histogram", "counter", "gauge", "summary"]

CONCEPTS: Mapping[str, str] = {
    # latency histograms (seconds), our interval names of definitions.md
    "ttft_s": "time to first token, per request",
    "tpot_s": "time per output token after the first, per request",
    "itl_s": "inter-token latency, the gaps between tokens",
    "e2e_s": "end-to-end request latency",
    "queue_s": "time waiting in the engine's queue before scheduling",
    "prefill_s": "time in prefill",
    "decode_s": "time in decode",
    # gauges
    "running": "requests running now (in a batch / a slot)",
    "waiting": "requests waiting now (queued, deferred)",
    "kv_usage": "KV-cache usage, fraction 0..1",
    # counters
    "prompt_tokens": "prompt tokens processed",
    "prompt_tokens_cached": "prompt tokens served from a prefix cache",
    "generated_tokens": "output tokens generated",
    "requests_received": "requests received (counted on arrival, before any outcome)",
    "requests_finished": "requests finished (with a finish-reason label where the engine has one)",
    "requests_succeeded": "requests that finished successfully",
    "requests_failed": "requests that failed",
    "aborts": "requests aborted (cancelled by the client or the engine)",
    "preemptions": "requests preempted (KV evicted, recomputed later)",
}
"""Every concept a profile may map, with what it means."""

EXTRA = "extra"
"""The ``concept`` of a series an engine has beyond :data:`CONCEPTS` (listed so that scrape knows its type and
whether it is a high-water mark; :meth:`EngineProfile.get` never returns one)."""


@dataclass(frozen=True)
class Series:
    """One series of an engine, as PromQL names it.

    ``name``: the sample name as queried (a counter's ``…_total``; a histogram's family name, without
    ``_bucket``/``_sum``/``_count``). ``unit``: ``seconds``, ``tokens``, ``requests``, ``ratio``.
    ``labels``: the labels the engine puts on it (beyond job/instance). ``buckets``: a histogram's finite
    upper bounds as the engine's source defines them (empty when not a histogram or not fixed).
    ``per``: what one observation is (``request``, ``engine step``, ``token``, ``streamed chunk``).
    ``difference``: how its definition differs from ours (empty when it agrees). ``finish_label``: the label
    holding the finish reason, where there is one. ``high_water``: a high-water mark (never shown as a rate,
    whatever its type says). ``source``: ``repository@version:path`` where this was read.
    ``finish_values``: the values the engine puts in ``finish_label`` (as its source spells them).
    ``deprecated``: for an older name the engine still exports (or exported) beside the current one, which
    one replaced it and since when; a deprecated series shares its concept with the current series and
    :meth:`EngineProfile.get` prefers the current one. ``what``: for an ``extra`` series, what it measures.
    ``excludes_cached``: for ``prompt_tokens``, the count leaves out prompt tokens served from the prefix cache
    (the prompt tokens a client is told of = this + ``prompt_tokens_cached``).
    """

    concept: str
    name: str
    type: SeriesType
    unit: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    per: str = "request"
    difference: str = ""
    finish_label: str | None = None
    high_water: bool = False
    source: str = ""
    finish_values: tuple[str, ...] = ()
    deprecated: str = ""
    what: str = ""
    excludes_cached: bool = False

    @property
    def sample_names(self) -> tuple[str, ...]:
        """The sample names the series appears under in an exposition (a histogram's ``_bucket``, ``_sum``,
        ``_count``; a summary's ``_sum``, ``_count`` and the family; otherwise its name)."""
        if self.type == "histogram":
            return tuple(f"{self.name}{s}" for s in ("_bucket", "_sum", "_count"))
        if self.type == "summary":
            return (self.name, f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


@dataclass(frozen=True)
class EngineProfile:
    """One inference engine's own metrics, mapped to our concepts.

    ``key``: the ``--engine`` value (``vllm``, ``sglang``, ``tgi``, ``llamacpp``, ``trtllm``); ``name``: as
    people write it; ``version``: the engine version the profile was read from; ``series``: what it exports
    (one entry per concept it maps, plus ``extra`` series it has beyond our concepts); ``lacks``: concept →
    why the engine cannot give it (what to put in front instead, where relevant); ``notes``: caveats that
    apply to the whole engine.
    """

    key: str
    name: str
    version: str
    series: tuple[Series, ...]
    lacks: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def get(self, concept: str) -> Series | None:
        """The series measuring ``concept``, else None (see :attr:`lacks` for why).

        The current series wins over a deprecated one of the same concept; ``extra`` series are never returned.
        """
        if concept == EXTRA:
            return None
        found = [s for s in self.series if s.concept == concept]
        current = [s for s in found if not s.deprecated]
        best = current or found
        return best[0] if best else None

    def by_name(self, name: str) -> Series | None:
        """The series whose PromQL name is ``name`` (a histogram's family name also matches its
        ``_bucket``/``_sum``/``_count`` samples), else None."""
        for s in self.series:
            if name == s.name or name in s.sample_names:
                return s
        return None

    def extras(self) -> tuple[Series, ...]:
        """The series beyond :data:`CONCEPTS` (concept :data:`EXTRA`)."""
        return tuple(s for s in self.series if s.concept == EXTRA)

    def mapped(self) -> tuple[Series, ...]:
        """The series that measure one of :data:`CONCEPTS` (deprecated names included)."""
        return tuple(s for s in self.series if s.concept != EXTRA)
