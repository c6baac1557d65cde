"""The SLO dashboard: error budget left, SLI over the period, burn rates over the alert windows and alert
state, from the recording rules and alerts ``llmslo rules generate`` writes for the same spec."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from llmslo.dashboards._dashboard import Dashboard, Kind, datasource_variable, envelope, query_variable, uid
from llmslo.dashboards._panels import Grid, Step, Target, stat, state_timeline, table, timeseries
from llmslo.dashboards._promql import ALERTS, JOB, UP, Matcher, selector
from llmslo.telemetry import METRICS_BY_KEY, SLO_BUDGET_REMAINING, SLO_ERROR_RATIO, SLO_OBJECTIVE

if TYPE_CHECKING:
    from llmslo.engines import EngineProfile
    from llmslo.rules import Model, Slo

SEVERITY_COLOURS = {"ticket": "orange", "page": "red"}
"""Colour of a burn-rate threshold line, by the severity of the alert it belongs to."""


@dataclass(frozen=True)
class SloView:
    """What one SLO's panels need: a row title, the matchers of its recorded series, its period and burn-rate
    alert windows (Prometheus durations, shortest first), the burn rates that alert (with severity), and
    its objective as a ratio (``None`` when it is read from Prometheus only)."""

    title: str
    matchers: tuple[Matcher, ...]
    period: str
    windows: tuple[str, ...]
    burn_rates: tuple[tuple[Decimal, str], ...]
    objective: Decimal | None
    description: str


def _windows(slo: Slo) -> tuple[str, ...]:
    pairs = {(a.long_window_s, a.long_window) for a in slo.alerts} | {(a.short_window_s, a.short_window)
                                                                      for a in slo.alerts}
    return tuple(text for _, text in sorted(pairs))


def _burn_rates(slo: Slo) -> tuple[tuple[Decimal, str], ...]:
    severity: dict[Decimal, str] = {}
    for a in slo.alerts:
        if severity.get(a.burn_rate) != "page":
            severity[a.burn_rate] = a.severity
    return tuple(sorted(severity.items()))


def _plain(value: Decimal) -> str:
    return f"{value.normalize():f}"


def view_of(slo: Slo) -> SloView:
    """The view of one SLO of a spec's model."""
    objective = slo.spec.objective / 100
    return SloView(
        title=f"{slo.name}: {_plain(slo.spec.objective)}% over {slo.period}",
        matchers=(("llmslo_service", "=", slo.service), ("llmslo_slo", "=", slo.name)),
        period=slo.period, windows=_windows(slo), burn_rates=_burn_rates(slo), objective=objective,
        description=f"{slo.spec.kind} objective: {slo.spec.description}.")


def default_view() -> SloView:
    """The view of the SLO chosen in the ``slo`` variable, for a spec that keeps the default burn-rate alerts
    and period (the windows ``llmslo rules generate`` then records); its objective is read from Prometheus."""
    from llmslo.rules import SPEC_VERSION, build_model, parse_spec

    minimal = {"version": SPEC_VERSION, "service": "default",
               "objectives": [{"name": "default", "kind": "availability", "objective": 99}]}
    slo = build_model(parse_spec(minimal)).slos[0]
    return SloView(
        title="$slo", matchers=(("llmslo_service", "=", "$service"), ("llmslo_slo", "=", "$slo")),
        period=slo.period, windows=_windows(slo), burn_rates=_burn_rates(slo), objective=None,
        description="Objective read from the recorded llmslo:slo_objective:ratio; windows and burn rates of the "
                    "default alerts (generate with --spec for a spec's own).")


def _budget_panel(view: SloView) -> dict[str, object]:
    expr = selector(SLO_BUDGET_REMAINING.name(), view.matchers)
    return stat(f"Error budget left ({view.period})",
                f"{SLO_BUDGET_REMAINING.doc} {view.description}", [Target(expr, "budget left")],
                unit="percentunit", steps=((None, "red"), (0.0, "orange"), (0.25, "green")), decimals=1)


def _sli_panel(view: SloView) -> dict[str, object]:
    expr = f"1 - {selector(SLO_ERROR_RATIO.name(view.period), view.matchers)}"
    steps: tuple[Step, ...] = ((None, "red"), (float(view.objective), "green")) if view.objective else (
        (None, "blue"),)
    objective = f" Green at or above the objective, {_plain(view.objective * 100)}%." if view.objective else ""
    return stat(f"Good events over {view.period}",
                f"1 - the error ratio over the period: good events / all events, total over total.{objective}",
                [Target(expr, "good")], unit="percentunit", steps=steps, decimals=3)


def _burn_panel(view: SloView) -> dict[str, object]:
    objective = selector(SLO_OBJECTIVE.name(), view.matchers)
    targets = [Target(f"{selector(SLO_ERROR_RATIO.name(w), view.matchers)} / (1 - {objective})", w)
               for w in view.windows]
    steps: list[Step] = [(None, "green")]
    steps += [(float(rate), SEVERITY_COLOURS.get(severity, "red")) for rate, severity in view.burn_rates]
    rates = ", ".join(f"{_plain(rate)}× ({severity})" for rate, severity in view.burn_rates)
    return timeseries(
        "Burn rate by window",
        "Error ratio over each window ÷ the error budget (1 - objective): 1 spends the budget exactly over the "
        f"period. An alert fires when both its long and short windows burn faster than its rate; dashed lines: "
        f"{rates}.", targets, unit="suffix:×", steps=steps, threshold_lines=True, minimum=0)


def _alerts_panel(view: SloView) -> dict[str, object]:
    firing = selector(ALERTS, [*view.matchers, ("alertstate", "=", "firing")])
    pending = selector(ALERTS, [*view.matchers, ("alertstate", "=", "pending")])
    expr = f"2 * max by (alertname) ({firing}) or max by (alertname) ({pending})"
    return state_timeline("Alert state", "The burn-rate and absent-data alerts of this SLO while pending or "
                                         "firing (Prometheus's ALERTS series); empty while none is.",
                          [Target(expr, "{{alertname}}")], [(1, "pending", "orange"), (2, "firing", "red")])


def _slo_row(grid: Grid, view: SloView, repeat: str | None = None) -> None:
    grid.row(view.title, repeat)
    grid.add(_budget_panel(view), 6)
    grid.add(_sli_panel(view), 6)
    grid.add(_burn_panel(view), 12)
    grid.add(_alerts_panel(view), 24, 5)


def _overview(grid: Grid, service: Matcher) -> None:
    grid.row("Overview")
    grid.add(stat("Error budget left, every SLO", SLO_BUDGET_REMAINING.doc,
                  [Target(selector(SLO_BUDGET_REMAINING.name(), [service]), "{{llmslo_slo}}")],
                  unit="percentunit", steps=((None, "red"), (0.0, "orange"), (0.25, "green")), decimals=1), 10)
    active = f"sum by (alertname, alertstate, severity) ({selector(ALERTS, [service])})"
    grid.add(table("Active alerts", "Every alert of the service (burn-rate, absent-data and operational) now "
                                    "pending or firing.",
                   Target(active, format="table", instant=True), hide=("Time", "Value")), 8)
    up = selector(UP, [JOB])
    grid.add(stat("Scrape targets up", "Share of the job's targets whose last scrape succeeded; an SLO is blind "
                                       "to a target that is down.",
                  [Target(f"sum({up}) / count({up})", "up")], unit="percentunit",
                  steps=((None, "red"), (1.0, "green")), decimals=0), 6)


def slo_dashboard(model: Model | None = None, engine: EngineProfile | None = None) -> Dashboard:
    """The SLO dashboard. With a spec's ``model``: one row per objective with its own windows, burn rates
    and objective. Without: one row repeated for each SLO chosen in the ``slo`` variable, read from the
    recorded series of the default burn-rate alerts. With an ``engine`` (the model's by default), for the rules
    over that engine's own series: its jobs are listed from the engine's series, and the uid and file name
    name the engine."""
    from llmslo.dashboards._engine import engine_service, job_series

    if engine is None and model is not None:
        engine = model.engine
    job_source = job_series(engine) if engine is not None else METRICS_BY_KEY["requests"].name
    grid = Grid()
    variables = [datasource_variable()]
    objective = SLO_OBJECTIVE.name()
    if model is not None:
        service: str | None = model.spec.service
        job: str | None = model.spec.job
        _overview(grid, ("llmslo_service", "=", model.spec.service))
        views: Sequence[SloView] = [view_of(slo) for slo in model.slos]
    else:
        service = job = None
        _overview(grid, ("llmslo_service", "=", "$service"))
        views = [default_view()]
    variables.append(query_variable("job", "Job", f"label_values({job_source}, job)", current=job,
                                    description="The Prometheus job scraping the servers (for the targets-up panel)."))
    if model is None:
        variables.append(query_variable("service", "Service", f"label_values({objective}, llmslo_service)"))
        variables.append(query_variable(
            "slo", "SLO", f"label_values({selector(objective, [('llmslo_service', '=', '$service')])}, llmslo_slo)",
            multi=True, include_all=True))
    for view in views:
        _slo_row(grid, view, repeat="slo" if model is None else None)
    title = f"llmslo SLOs: {service}" if service else "llmslo SLOs"
    description = ("Error budget left, good events over the period, burn rates over the alert windows and alert "
                   "state, from the recording rules of llmslo rules generate.")
    named = service
    if engine is not None:
        title = f"{title} ({engine.name})"
        description += f" The rules read {engine.name}'s own series (llmslo rules generate --engine {engine.key})."
        named = engine_service(engine, service)
    kind: Kind = "slo"
    data = envelope(uid_=uid(named, kind), title=title, description=description, service=service,
                    variables=variables, panels=grid.panels, time_from="now-2d")
    return Dashboard(kind, data["uid"], title, f"{data['uid']}.json", data)
