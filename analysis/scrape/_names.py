"""Which series of a scrape measures which of llmslo's concepts: read from the engine profiles.

Inference engines' names come from :mod:`llmslo.engines` (one profile per engine, read from its source);
llmslo's own histograms come from the name catalogue (:data:`llmslo.telemetry.METRICS`). Nothing here writes
an engine's metric name.

* :data:`KNOWN_METRICS`: every known latency histogram (seconds) with the interval of definitions.md it
  measures, what one observation is and how its definition differs from ours; :func:`known_metric` looks
  one up by name.
* :func:`resolve`: the series of one scrape mapped to the engines that export them. Some engines share
  names (NVIDIA NIM and TensorRT-LLM 1.x both export ``time_to_first_token_seconds``); a shared name goes to
  the engine with the most of its names in the scrape.
* :data:`QUEUE_GAUGES` and :data:`SUCCESS_COUNTERS`: the ``waiting`` gauges and success counters of every
  profile (by name, with the engine key), kept for callers of the former table.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from llmslo.engines import EngineProfile, Series, all_profiles
from llmslo.telemetry import METRICS

__all__ = [
    "INTERVALS",
    "KNOWN_METRICS",
    "KnownMetric",
    "LLMSLO",
    "Mapped",
    "QUEUE_GAUGES",
    "Resolution",
    "SUCCESS_COUNTERS",
    "SUCCESS_REASONS",
    "known_metric",
    "resolve",
]

LLMSLO = "llmslo"
"""The server name of llmslo's own series."""

INTERVALS: tuple[str, ...] = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s", "prefill_s", "decode_s")
"""The concepts that are latency intervals (a histogram of one of them is read as seconds)."""

SUCCESS_REASONS: frozenset[str] = frozenset({"stop", "length"})
"""Finish-label values that mean success (definitions.md's default success set)."""


@dataclass(frozen=True)
class KnownMetric:
    """A server's latency histogram and the interval of definitions.md it measures.

    ``name`` is the family name as exposed (without ``_bucket``); ``server`` the engine key (or ``llmslo``);
    ``per`` says what one observation is (``request``, ``engine step``, ``streamed chunk``, ``token``);
    ``difference`` states how the server's definition differs from ours (empty when it agrees);
    ``deprecated`` says which name replaced an older one (empty for a current name).
    """

    name: str
    server: str
    interval: str
    per: str
    difference: str
    deprecated: str = ""


def _known(profile: EngineProfile, s: Series) -> KnownMetric:
    return KnownMetric(s.name, profile.key, s.concept, s.per, s.difference, s.deprecated)


def _latency(s: Series) -> bool:
    return s.type == "histogram" and s.concept in INTERVALS


def _engine_known() -> tuple[KnownMetric, ...]:
    """Latency histograms of every profile, one per name: current names before deprecated ones, so a name one
    engine still uses wins over the same name another engine has given up."""
    out: dict[str, KnownMetric] = {}
    for current in (True, False):
        for p in all_profiles():
            for s in p.series:
                if _latency(s) and (not s.deprecated) == current and s.name not in out:
                    out[s.name] = _known(p, s)
    return tuple(out.values())


KNOWN_METRICS: tuple[KnownMetric, ...] = (
    *_engine_known(),
    # llmslo's own histograms, from the name catalogue (ITL is observed per token, the others per request)
    *(KnownMetric(m.name, LLMSLO, m.source, "token" if m.source == "itl_s" else "request", "")
      for m in METRICS if m.type == "histogram" and m.source is not None),
)
"""Known latency histograms of LLM servers, mapped to our interval names (definitions.md)."""

_KNOWN_BY_NAME: Mapping[str, KnownMetric] = {m.name: m for m in KNOWN_METRICS}

QUEUE_GAUGES: Mapping[str, str] = MappingProxyType(
    {s.name: p.key for p in all_profiles() for s in p.series if s.concept == "waiting" and s.type == "gauge"})
"""Gauges of requests waiting (name → engine key)."""

SUCCESS_COUNTERS: Mapping[str, str] = MappingProxyType(
    {s.name: p.key for p in all_profiles() for s in p.series
     if s.type == "counter" and (s.concept == "requests_succeeded"
                                 or (s.concept == "requests_finished" and s.finish_label))})
"""Counters from which successes can be read (name → engine key): success counters, and finish counters
whose finish label tells successes (:data:`SUCCESS_REASONS`) apart."""


def known_metric(name: str) -> KnownMetric | None:
    """The :class:`KnownMetric` of a histogram family name (with or without ``_bucket``), else None."""
    return _KNOWN_BY_NAME.get(name) or _KNOWN_BY_NAME.get(name.removesuffix("_bucket"))


@dataclass(frozen=True)
class Mapped:
    """One series name of a scrape, the engine it belongs to and the profile's entry for it."""

    name: str
    profile: EngineProfile
    series: Series

    @property
    def engine(self) -> str:
        """The engine key."""
        return self.profile.key

    @property
    def concept(self) -> str:
        """The concept the series measures (``extra`` beyond the concepts)."""
        return self.series.concept


@dataclass(frozen=True)
class Resolution:
    """The series of one scrape mapped to engine profiles.

    ``engines``: the profiles with at least one series in the scrape, in the order of
    :func:`llmslo.engines.all_profiles`; ``by_name``: every mapped name (a histogram's family name, a
    counter's or gauge's sample name) → :class:`Mapped`; ``llmslo``: the scrape holds llmslo's own series.
    """

    engines: tuple[EngineProfile, ...]
    by_name: Mapping[str, Mapped]
    llmslo: bool

    def get(self, name: str) -> Mapped | None:
        """The mapping of a name (a histogram's ``_bucket``/``_sum``/``_count`` sample name works too)."""
        hit = self.by_name.get(name)
        if hit is None:
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix):
                    hit = self.by_name.get(name.removesuffix(suffix))
                    if hit is not None and hit.series.type in ("histogram", "summary"):
                        return hit
            return None
        return hit

    def names(self, profile: EngineProfile, concept: str) -> tuple[str, ...]:
        """The names in the scrape of ``profile``'s series for ``concept`` (current name first)."""
        found = [m for m in self.by_name.values() if m.profile is profile and m.concept == concept]
        found.sort(key=lambda m: bool(m.series.deprecated))
        return tuple(m.name for m in found)

    def servers(self) -> tuple[str, ...]:
        """The engine keys found, plus ``llmslo`` when its own series are there, sorted."""
        return tuple(sorted({p.key for p in self.engines} | ({LLMSLO} if self.llmslo else set())))


_CATALOGUE = frozenset(m.name for m in METRICS)


def _in_catalogue(name: str) -> bool:
    """Whether ``name`` is one of llmslo's own (a sample name, or an OpenMetrics counter family without
    ``_total``)."""
    if name in _CATALOGUE or f"{name}_total" in _CATALOGUE:
        return True
    return any(name.endswith(x) and name.removesuffix(x) in _CATALOGUE for x in ("_bucket", "_sum", "_count",
                                                                                  "_created"))


def resolve(names: Collection[str]) -> Resolution:
    """Map the names present in a scrape (family names and sample names) to the engines' profiles.

    A name that only one profile has goes to it. A name several profiles have goes to the one with the most
    names in the scrape (the first in :func:`~llmslo.engines.all_profiles` on a tie).
    """
    present = set(names)
    claims: dict[str, list[tuple[EngineProfile, Series]]] = {}
    for p in all_profiles():
        for s in p.series:
            if s.name in present or any(n in present for n in s.sample_names):
                claims.setdefault(s.name, []).append((p, s))
    score: dict[str, int] = {}
    for entries in claims.values():
        for p, _ in entries:
            score[p.key] = score.get(p.key, 0) + 1
    order = {p.key: i for i, p in enumerate(all_profiles())}
    by_name: dict[str, Mapped] = {}
    for name, entries in claims.items():
        p, s = max(entries, key=lambda e: (score[e[0].key], -order[e[0].key]))
        by_name[name] = Mapped(name, p, s)
    owners = {m.profile.key for m in by_name.values()}
    engines = tuple(p for p in all_profiles() if p.key in owners)
    llmslo = any(_in_catalogue(n) for n in present)
    return Resolution(engines, MappingProxyType(by_name), llmslo)
