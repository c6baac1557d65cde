"""Which series each SLO reads: llmslo's own catalogue, or an inference engine's own (:mod:`llmslo.engines`).

Rules over an engine's own series serve teams that run vLLM, SGLang, TGI, llama.cpp's llama-server or
trtllm-serve without llmslo inside the server. Each objective of the spec is bound to the engine's series or
refused with the reason and the way out (:class:`Refusal`):

- **latency** reads the engine's histogram of the same interval (``ttft`` -> ``ttft_s``); the threshold must be
  one of *its* bucket bounds, and the selector's labels must be ones its series carry (``model`` becomes the
  engine's ``model_name``; an engine without a model label serves one model, which the scrape job selects);
- **availability** reads the engine's counter of finished requests by finish reason, when every ``bad`` reason
  is one of the values it writes;
- **saturation** (a time-slice SLI) reads the engine's gauge of waiting or running requests or of KV-cache
  usage;
- **goodput** is refused on every engine: no engine counts the requests that met a goodput policy (a
  per-request joint condition on the finish reason, TTFT and TPOT).

Of the operational alerts only ``scrape_target_missing`` (Prometheus's own ``up``) applies to an engine; the
others read llmslo's controls, sink or GPU sampler and are left out with the reason. Without an engine, only
saturation objectives need binding: to llmslo's ``queued`` and ``in_flight`` gauges.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Literal

from llmslo.rules._errors import SpecError
from llmslo.rules._promql import Matcher, number
from llmslo.rules._spec import ObjectiveKind, ObjectiveSpec, Spec
from llmslo.telemetry import METRICS_BY_KEY, TARGET_LABELS

if TYPE_CHECKING:
    from llmslo.engines import EngineProfile, Series

__all__ = ["EngineSupportError", "Refusal", "Sli", "bind_objectives", "bind_operational", "resolve_engine", "support"]

FRONT = ("put llmslo gateway in front of the engine (any engine; docs/gateway.md), or llmslo's middleware inside "
         "a Python server (vLLM, SGLang, llama-cpp-python or any ASGI app; docs/middleware.md), and generate the "
         "rules without --engine: either observes every request's stream")
"""The way out for what an engine's own series cannot give."""
CATALOGUE_GAUGES: dict[str, str] = {"waiting": "queued", "running": "in_flight"}
"""Saturation concepts -> llmslo's own gauges (catalogue keys); llmslo exports no KV-cache gauge."""
ENGINE_SUPPORTED_OPERATIONAL = ("scrape_target_missing",)
"""The operational alerts that read no llmslo series (Prometheus's own ``up``), so that apply to any engine."""
MODEL_LABELS = ("model_name", "model")
"""The labels an engine may hold the model name in, in the order they are looked for."""


@dataclass(frozen=True)
class Refusal:
    """One spec entry left out of an engine's rules: where it is, which engine, why, and the way out."""

    path: str
    entry: str
    engine: str
    reason: str
    fix: str

    def message(self) -> str:
        """``objectives[1] (ttft: latency ttft <= 2s) on TGI: no ... . Way out: put ...``."""
        return f"{self.path} ({self.entry}) on {self.engine}: {self.reason}. Way out: {self.fix}"


class EngineSupportError(SpecError):
    """No objective of the spec can be computed from the engine's own series; ``refusals`` says why, each."""

    def __init__(self, engine: str, refusals: tuple[Refusal, ...]) -> None:
        lines = "\n".join(f"  refused {r.message()}" for r in refusals if r.path.startswith("objectives"))
        super().__init__("", f"no objective of the spec can be computed from {engine}'s own series:\n{lines}")
        self.refusals = refusals


@dataclass(frozen=True)
class Sli:
    """The series an SLO reads when they are not llmslo's own histograms and counters.

    ``kind``: ``histogram`` (a latency objective on an engine: good = the bucket at ``threshold`` seconds,
    events = the count), ``finish`` (availability on an engine: ``name`` counted by ``label``, bad values
    ``bad``), ``gauge`` (saturation: bad when ``name`` is above ``threshold``). ``matchers`` select the
    series; ``source`` says whose they are; ``difference`` how their definition differs from llmslo's
    (empty when it agrees); ``notes`` what the binding had to leave aside (a selector label the series lack).
    """

    kind: Literal["histogram", "finish", "gauge"]
    name: str
    matchers: tuple[Matcher, ...]
    source: str
    threshold: float = 0.0
    label: str = ""
    bad: tuple[str, ...] = ()
    good: str = ""
    """``finish``: a value of ``label`` that is not bad (the tests' good requests)."""
    difference: str = ""
    notes: tuple[str, ...] = ()

    @property
    def bucket(self) -> str:
        return f"{self.name}_bucket"

    @property
    def count(self) -> str:
        return f"{self.name}_count"

    @property
    def events(self) -> str:
        """The series whose absence means no data: the histogram's count, else the series itself."""
        return self.count if self.kind == "histogram" else self.name


def resolve_engine(engine: str | EngineProfile | None) -> EngineProfile | None:
    """The profile of ``engine`` (an ``--engine`` key or a profile); ``None`` for llmslo's own series.

    Raises :class:`SpecError` naming the known engines for an unknown key.
    """
    if engine is None or not isinstance(engine, str):
        return engine
    from llmslo.engines import engine_profile
    from llmslo.telemetry import ConfigurationError

    try:
        return engine_profile(engine)
    except ConfigurationError as exc:
        raise SpecError("", str(exc)) from None


def entry_of(objective: ObjectiveSpec) -> str:
    """A spec entry in words: ``ttft: latency ttft <= 2s``."""
    if objective.kind == "latency":
        what = f"latency {objective.metric} <= {number(objective.threshold_s or 0)}s"
    elif objective.kind == "saturation":
        what = f"saturation {objective.metric} <= {number(objective.limit or Decimal(0))}"
    elif objective.kind == "availability":
        what = f"availability, bad: {', '.join(objective.bad)}"
    else:
        what = "goodput"
    return f"{objective.name}: {what}"


_FIX_CLAUSE = re.compile(r"; (?=(?:put|add|observe|use|derive|count) )")
"""Where the way-out clause of a profile's ``lacks`` text begins: ``; `` and one of these verbs."""


def _split(text: str) -> tuple[str, str]:
    """A profile's ``lacks`` text as (reason, way out): the way out is its first ``; <verb> …`` clause (``put``,
    ``add``, ``observe``…), else :data:`FRONT`."""
    match = _FIX_CLAUSE.search(text)
    return (text[:match.start()], text[match.end():]) if match else (text, FRONT)


class _Refused(Exception):
    def __init__(self, reason: str, fix: str = FRONT) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fix = fix


def _lacking(profile: EngineProfile, concept: str) -> _Refused:
    reason, fix = _split(profile.lacks.get(concept, f"exports no series for {concept}"))
    return _Refused(reason, fix)


def _series(profile: EngineProfile, concept: str) -> Series:
    series = profile.get(concept)
    if concept in profile.lacks or series is None:
        raise _lacking(profile, concept)
    return series


def _engine_matchers(spec: Spec, objective: ObjectiveSpec, series: Series,
                     profile: EngineProfile) -> tuple[tuple[Matcher, ...], tuple[str, ...]]:
    """The scrape job, then the objective's selector in the engine's label names (``model`` -> its model label;
    dropped, with a note, where the engine has none)."""
    pairs = {"job": spec.job}
    notes = []
    for key, value in objective.selector:
        if key in TARGET_LABELS:
            pairs[key] = value
        elif key == "model":
            label = next((m for m in MODEL_LABELS if m in series.labels), None)
            if label is None:
                notes.append(f"{series.name} carries no model label (one {profile.name} serves one model): the "
                             f"scrape job {spec.job} selects it, not model={value}")
            else:
                pairs[label] = value
        else:
            labels = ", ".join(series.labels) or "none besides job and instance"
            raise _Refused(f"{series.name} carries no {key} label (its labels: {labels}), so the objective "
                           f"cannot be restricted to {key}={value}",
                           f"drop {key} from the selector, or {FRONT}")
    return tuple(sorted((k, "=", v) for k, v in pairs.items())), tuple(notes)


def _bound(series: Series, threshold_s: float) -> float:
    """The engine's bucket bound equal to ``threshold_s`` (to 1e-9 relative: bounds are computed floats)."""
    for bound in series.buckets:
        if math.isclose(bound, threshold_s, rel_tol=1e-9, abs_tol=0.0):
            return bound
    if not series.buckets:
        raise _Refused(f"{series.name} has no fixed bucket bounds, so no series is known to count the requests "
                       f"at or under {number(threshold_s)}s")
    below = [b for b in series.buckets if b < threshold_s][-1:]
    above = [b for b in series.buckets if b > threshold_s][:1]
    near = " and ".join(f"{b:.6g}s" for b in below + above)
    raise _Refused(f"{number(threshold_s)}s is not a bucket bound of {series.name}, so no series counts the "
                   f"requests at or under it (nearest bounds: {near})",
                   f"set the threshold to one of its bounds ({', '.join(f'{b:.6g}' for b in series.buckets)} s), "
                   f"or {FRONT}")


def _bind_engine(spec: Spec, objective: ObjectiveSpec, profile: EngineProfile) -> Sli:
    kind = objective.kind
    if kind == "goodput":
        raise _Refused(f"goodput counts the requests that met every condition of a goodput policy together (finish "
                       f"reason, TTFT and TPOT of the same request); {profile.name} counts no such request, and "
                       "no ratio of its separate series can give it")
    if kind == "latency":
        if objective.metric == "client_ttft":
            raise _Refused("client_ttft is measured by llmslo's client (llmslo load), never by a server",
                           "generate this objective without --engine (it reads llmslo_client_ttft_seconds)")
        series = _series(profile, f"{objective.metric}_s")
        if series.type != "histogram":
            raise _Refused(f"{series.name} is a {series.type}, not a histogram: no share of requests under a "
                           "threshold can be counted from it")
        bound = _bound(series, objective.threshold_s or 0.0)
        matchers, notes = _engine_matchers(spec, objective, series, profile)
        return Sli("histogram", series.name, matchers, profile.name, bound, difference=series.difference,
                   notes=notes)
    if kind == "availability":
        series = _series(profile, "requests_finished")
        if series.finish_label is None or not series.finish_values:
            raise _Refused(f"{series.name} holds no finish reason whose values are known, so no request can be "
                           f"told bad by its finish")
        missing = [r for r in objective.bad if r not in series.finish_values]
        if missing:
            raise _Refused(f"{series.name} counts finish reasons {', '.join(series.finish_values)} "
                           f"({series.finish_label}): {', '.join(missing)} is not among them")
        matchers, notes = _engine_matchers(spec, objective, series, profile)
        good = next(v for v in (*("stop", "length"), *series.finish_values)
                    if v in series.finish_values and v not in objective.bad)
        return Sli("finish", series.name, matchers, profile.name, label=series.finish_label, bad=objective.bad,
                   good=good, difference=series.difference, notes=notes)
    concept = objective.metric or ""
    series = _series(profile, concept)
    if series.type != "gauge":
        raise _Refused(f"{series.name} is a {series.type}, not a gauge")
    matchers, notes = _engine_matchers(spec, objective, series, profile)
    return Sli("gauge", series.name, matchers, profile.name, float(objective.limit or 0),
               difference=series.difference, notes=notes)


def _bind_catalogue(objective: ObjectiveSpec, path: str) -> Sli | None:
    """A saturation objective on llmslo's own gauges; every other kind reads the catalogue as it always did."""
    if objective.kind != "saturation":
        return None
    key = CATALOGUE_GAUGES.get(objective.metric or "")
    if key is None:
        raise SpecError(f"{path}.metric", f"llmslo's telemetry exports no {objective.metric} gauge (it has "
                                          f"{', '.join(CATALOGUE_GAUGES)}); an engine's own may: generate with "
                                          "--engine")
    metric = METRICS_BY_KEY[key]
    for label, _ in objective.selector:
        if label not in metric.labels and label not in TARGET_LABELS:
            raise SpecError(f"{path}.selector.{label}", f"{metric.name} has no label {label!r} (its labels: "
                                                        f"{', '.join(metric.labels) or 'none'})")
    matchers = tuple(sorted((k, "=", v) for k, v in objective.selector))
    return Sli("gauge", metric.name, matchers, "llmslo telemetry", float(objective.limit or 0))


def bind_objectives(spec: Spec, profile: EngineProfile | None) -> tuple[list[Sli | None], list[Refusal]]:
    """Each objective's :class:`Sli` (``None``: llmslo's catalogue as before; on an engine, ``None`` also marks
    a refused objective, listed in the refusals)."""
    slis: list[Sli | None] = []
    refused: list[Refusal] = []
    for i, objective in enumerate(spec.objectives):
        path = f"objectives[{i}]"
        if profile is None:
            slis.append(_bind_catalogue(objective, path))
            continue
        try:
            slis.append(_bind_engine(spec, objective, profile))
        except _Refused as exc:
            slis.append(None)
            refused.append(Refusal(path, entry_of(objective), profile.name, exc.reason, exc.fix))
    return slis, refused


_OPERATIONAL_REASONS: dict[str, tuple[str, str]] = {
    "queue_saturation": ("it reads the bounded admission queue of llmslo.controls (queued / capacity); {engine} "
                         "exports no queue capacity",
                         "a saturation objective on the engine's waiting requests (kind: saturation, metric: "
                         "waiting), or llmslo.controls' admission queue inside a Python server (docs/controls.md)"),
    "rejections": ("{engine} counts no requests rejected by reason (429 queue_full, rate_limited)",
                   "admit with llmslo.controls inside a Python server (docs/controls.md): it rejects and counts"),
    "breaker_open": ("circuit breakers are llmslo's (llmslo.controls); {engine} has none",
                     "use llmslo.controls' CircuitBreaker inside a Python server (docs/controls.md)"),
    "drain_too_long": ("the drain gauge is llmslo's (the drain controller); {engine} exports none",
                       "drain with llmslo.controls' drain controller inside a Python server (docs/controls.md)"),
    "summaries_dropped": ("request summaries are written by llmslo's telemetry sink, not by {engine}", FRONT),
    "gpu_memory": ("GPU memory comes from llmslo's GPU sampler (llmslo gpu sample), not from {engine}'s /metrics",
                   "run llmslo's GPU sampler beside the engine and generate this alert without --engine"),
    "version_skew": ("{engine}'s series carry no version label, so versions cannot be compared", FRONT),
}


def bind_operational(spec: Spec, profile: EngineProfile | None) -> tuple[tuple[str, ...], list[Refusal]]:
    """The operational alert kinds enabled in the spec that apply (all of them without an engine), and those
    left out on the engine with the reason."""
    enabled = tuple(k for k in _OPERATIONAL_REASONS if getattr(spec.operational, k) is not None)
    enabled += tuple(k for k in ENGINE_SUPPORTED_OPERATIONAL if getattr(spec.operational, k) is not None)
    if profile is None:
        return enabled, []
    kept = tuple(k for k in enabled if k in ENGINE_SUPPORTED_OPERATIONAL)
    refused = [Refusal(f"operational.{k}", k, profile.name, _OPERATIONAL_REASONS[k][0].format(engine=profile.name),
                       _OPERATIONAL_REASONS[k][1]) for k in enabled if k not in ENGINE_SUPPORTED_OPERATIONAL]
    return kept, refused


PROBES: tuple[tuple[ObjectiveKind, str], ...] = (
    ("goodput", ""), ("latency", "ttft"), ("latency", "tpot"), ("latency", "itl"), ("latency", "e2e"),
    ("latency", "queue"), ("availability", "error"), ("saturation", "waiting"), ("saturation", "running"),
    ("saturation", "kv_usage"))
"""The objectives :func:`support` tries: (kind, latency metric, bad finish reason or gauge)."""


def support(profile: EngineProfile) -> list[tuple[str, str, str | None]]:
    """What ``profile``'s own series can alert on: (kind, metric, ``None`` when they can give it, else why not),
    a latency tried at one of the engine's own bucket bounds (docs/dashboards.md shows it as a table)."""
    out: list[tuple[str, str, str | None]] = []
    for kind, metric in PROBES:
        series = profile.get(f"{metric}_s") if kind == "latency" else None
        threshold = series.buckets[0] if series is not None and series.buckets else 1.0
        objective = ObjectiveSpec(
            "probe", kind, Decimal(99), "", (), None, metric=metric if kind in ("latency", "saturation") else None,
            threshold_s=threshold if kind == "latency" else None, bad=(metric,) if kind == "availability" else (),
            limit=Decimal(1) if kind == "saturation" else None)
        try:
            _bind_engine(Spec("probe", (objective,)), objective, profile)
        except _Refused as exc:
            out.append((kind, metric, exc.reason))
        else:
            out.append((kind, metric, None))
    return out
