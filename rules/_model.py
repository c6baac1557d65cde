"""Spec -> model: the numbers behind every rule, computed once (budgets, thresholds, detection times).

Burn-rate arithmetic (definitions.md, "Error budgets and burn rate"), for an alert with burn rate ``b``,
long window ``L``, short window ``S``, period ``P`` and budget ``B = 1 - objective``:

- it fires when the error ratio over both windows exceeds ``b × B``;
- a total outage (every event bad) after clean traffic is detected after ``b × B × L``;
- when it fires, ``b × L / P`` of the period's budget has been spent;
- after the outage ends it resets once the short window clears: ``S × (1 - b × B)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from llmslo.rules._durations import prometheus_duration
from llmslo.rules._engine import EngineSupportError, Refusal, Sli, bind_objectives, bind_operational, resolve_engine
from llmslo.rules._errors import SpecError
from llmslo.rules._spec import BurnAlertSpec, ObjectiveSpec, Pairs, Spec

if TYPE_CHECKING:
    from llmslo.engines import EngineProfile

MIN_EVALUATIONS_PER_WINDOW = 4
"""A saturation objective's windows hold at least this many rule evaluations (its events)."""


def camel(text: str) -> str:
    """``chat-7b_v2`` -> ``Chat7bV2`` (alert names)."""
    return "".join(part[:1].upper() + part[1:] for part in text.replace("_", "-").split("-") if part)


@dataclass(frozen=True)
class BurnRateAlert:
    """One multi-window multi-burn-rate alert of one SLO. Times in seconds, ratios in [0, 1]."""

    name: str
    severity: str
    burn_rate: Decimal
    long_window_s: int
    short_window_s: int
    threshold: Decimal
    period_s: int

    @property
    def long_window(self) -> str:
        return prometheus_duration(self.long_window_s)

    @property
    def short_window(self) -> str:
        return prometheus_duration(self.short_window_s)

    @property
    def detection_s(self) -> float:
        """Seconds from the start of a total outage (after clean traffic) until both windows exceed the threshold."""
        return float(self.threshold) * self.long_window_s

    @property
    def budget_spent(self) -> float:
        """Share of the period's budget spent when the alert fires on a total outage: ``b × L / P``."""
        return float(self.burn_rate) * self.long_window_s / self.period_s

    @property
    def reset_s(self) -> float:
        """Seconds after a total outage (at least one short window long) ends until the alert resolves."""
        return self.short_window_s * (1 - float(self.threshold))

    @property
    def budget_lasts_s(self) -> float:
        """How long the whole budget lasts when burned at exactly this rate, seconds."""
        return self.period_s / float(self.burn_rate)


@dataclass(frozen=True)
class Slo:
    """One objective with everything the generator needs."""

    service: str
    spec: ObjectiveSpec
    period_s: int
    labels: Pairs
    """Labels of every recorded series and alert of this SLO: service, SLO name, the spec's labels."""
    windows_s: tuple[int, ...]
    """Recording windows, seconds, ascending (every alert window and the period)."""
    alerts: tuple[BurnRateAlert, ...]
    absent_alert: str
    absent_for_s: int
    sli: Sli | None = None
    """The series it reads when not llmslo's own histograms and counters (an engine's, or a gauge)."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def budget(self) -> Decimal:
        return self.spec.budget

    @property
    def period(self) -> str:
        return prometheus_duration(self.period_s)


@dataclass(frozen=True)
class OperationalAlert:
    """One operational alert: its name, the spec section that configures it and the labels it adds."""

    kind: str
    name: str


@dataclass(frozen=True)
class Model:
    """Everything generated from one spec: over llmslo's own series, or over an ``engine``'s own (then
    ``refused`` lists the spec's entries its series cannot give, with why and the way out)."""

    spec: Spec
    slos: tuple[Slo, ...]
    operational: tuple[OperationalAlert, ...]
    labels: Pairs
    """Labels added to every rule: ``llmslo_service`` and the spec's labels."""
    engine: EngineProfile | None = None
    refused: tuple[Refusal, ...] = ()


def _burn_alert(service: str, slo: ObjectiveSpec, alert: BurnAlertSpec, period_s: int) -> BurnRateAlert:
    name = (f"{camel(service)}{camel(slo.name)}BudgetBurn"
            f"{prometheus_duration(alert.long_window_s)}{prometheus_duration(alert.short_window_s)}")
    return BurnRateAlert(name, alert.severity, alert.burn_rate, alert.long_window_s, alert.short_window_s,
                         alert.burn_rate * slo.budget, period_s)


_OPERATIONAL_NAMES: tuple[tuple[str, str], ...] = (
    ("queue_saturation", "QueueNearCapacity"),
    ("rejections", "RejectionRatioHigh"),
    ("breaker_open", "BreakerOpen"),
    ("drain_too_long", "DrainTooLong"),
    ("summaries_dropped", "SummariesDropped"),
    ("scrape_target_missing", "ScrapeTargetMissing"),
    ("gpu_memory", "GpuMemoryNearLimit"),
    ("version_skew", "VersionSkewErrors"),
    ("version_skew", "VersionSkewTtft"),
)


def _check_evaluations(spec: Spec) -> None:
    """A saturation objective counts rule evaluations: each window must hold a few."""
    if not any(o.kind == "saturation" for o in spec.objectives):
        return
    least = MIN_EVALUATIONS_PER_WINDOW * spec.evaluation_interval_s
    for i, alert in enumerate(spec.burn_alerts):
        if alert.short_window_s < least:
            raise SpecError(f"burn_alerts[{i}].short_window",
                            f"{prometheus_duration(alert.short_window_s)} holds fewer than "
                            f"{MIN_EVALUATIONS_PER_WINDOW} rule evaluations (evaluation_interval "
                            f"{prometheus_duration(spec.evaluation_interval_s)}), the events of a saturation "
                            f"objective: use at least {prometheus_duration(least)} or evaluate more often")


def build_model(spec: Spec, engine: str | EngineProfile | None = None) -> Model:
    """The model of a validated spec: SLOs with their alerts and windows, and the operational alerts.

    With ``engine`` (an ``--engine`` key of :data:`llmslo.engines.ENGINES`, or a profile), over that inference
    engine's own series: the objectives and operational alerts its series cannot give are left out and listed
    in :attr:`Model.refused`; :class:`~llmslo.rules.EngineSupportError` when no objective is left. Load the
    spec with ``engine=True`` so that latency thresholds are checked against the engine's own buckets.
    """
    profile = resolve_engine(engine)
    _check_evaluations(spec)
    slis, refused = bind_objectives(spec, profile)
    kinds, refused_operational = bind_operational(spec, profile)
    common = tuple(sorted((("llmslo_service", spec.service), *spec.labels)))
    windows = sorted({spec.period_s, *(a.long_window_s for a in spec.burn_alerts),
                      *(a.short_window_s for a in spec.burn_alerts)})
    slos = []
    for objective, sli in zip(spec.objectives, slis, strict=True):
        if profile is not None and sli is None:
            continue
        labels = tuple(sorted((*common, ("llmslo_slo", objective.name))))
        alerts = tuple(_burn_alert(spec.service, objective, a, spec.period_s) for a in spec.burn_alerts)
        slos.append(Slo(spec.service, objective, spec.period_s, labels, tuple(windows), alerts,
                        f"{camel(spec.service)}{camel(objective.name)}DataAbsent", spec.absent_for_s, sli))
    if profile is not None and not slos:
        raise EngineSupportError(profile.name, (*refused, *refused_operational))
    operational = []
    for kind, suffix in _OPERATIONAL_NAMES:
        if getattr(spec.operational, kind) is None or kind not in kinds:
            continue
        operational.append(OperationalAlert(kind, f"{camel(spec.service)}{suffix}"))
    return Model(spec, tuple(slos), tuple(operational), common, profile, (*refused, *refused_operational))
