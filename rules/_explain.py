"""Model -> what each alert means in numbers: windows, burn rate, detection time, budget spent, reset time."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from llmslo.rules._durations import human_duration, prometheus_duration
from llmslo.rules._generator import generate_groups, slo_statement
from llmslo.rules._model import Model
from llmslo.rules._promql import number


@dataclass(frozen=True)
class BurnRow:
    """One burn-rate alert. Times in seconds; ``threshold`` and ``budget_spent`` are ratios."""

    slo: str
    objective: str
    alert: str
    severity: str
    long_window: str
    short_window: str
    burn_rate: float
    threshold: float
    detection_s: float
    budget_spent: float
    reset_s: float


@dataclass(frozen=True)
class OtherRow:
    """An absent-data or operational alert: its condition and how long it must hold (seconds)."""

    alert: str
    severity: str
    condition: str
    for_s: int


@dataclass(frozen=True)
class Explanation:
    """Every alert of a spec, explained."""

    service: str
    period: str
    burn: tuple[BurnRow, ...]
    other: tuple[OtherRow, ...]

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form (times in seconds, ratios in [0, 1])."""
        return asdict(self)

    def burn_table(self) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
        """Column titles and text cells of the burn-rate alerts."""
        return BURN_COLUMNS, [burn_cells(row) for row in self.burn]

    def other_table(self) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
        """Column titles and text cells of the absent-data and operational alerts."""
        return OTHER_COLUMNS, [other_cells(row) for row in self.other]


def explain(model: Model) -> Explanation:
    """The numbers behind each alert of ``model`` (detection and reset assume traffic free of errors before)."""
    burn = tuple(
        BurnRow(slo.name, slo_statement(slo), a.name, a.severity, a.long_window, a.short_window,
                float(a.burn_rate), float(a.threshold), a.detection_s, a.budget_spent, a.reset_s)
        for slo in model.slos for a in slo.alerts)
    other: list[OtherRow] = []
    alerts = [r for g in generate_groups(model) for r in g.rules if r.alert]
    summaries = {r.alert: dict(r.annotations).get("summary", "") for r in alerts}
    fors = {r.alert: r.for_s for r in alerts}
    severities = {r.alert: dict(r.labels).get("severity", "") for r in alerts}
    for slo in model.slos:
        other.append(OtherRow(slo.absent_alert, "ticket", summaries[slo.absent_alert].split(": ", 1)[-1],
                              slo.absent_for_s))
    for alert in model.operational:
        other.append(OtherRow(alert.name, severities[alert.name], summaries[alert.name].split(": ", 1)[-1],
                              fors[alert.name]))
    return Explanation(model.spec.service, prometheus_duration(model.spec.period_s), burn, tuple(other))


BURN_COLUMNS: tuple[str, ...] = ("SLO", "alert", "severity", "windows", "burn rate", "error ratio above",
                                 "detects a total outage in", "budget spent when it fires", "resets after")
OTHER_COLUMNS: tuple[str, ...] = ("alert", "severity", "condition", "for")


def burn_cells(row: BurnRow) -> tuple[str, ...]:
    """One burn-rate row as table text."""
    return (row.slo, row.alert, row.severity, f"{row.long_window} / {row.short_window}",
            f"{number(row.burn_rate)}×", f"{row.threshold * 100:.4g}%", human_duration(row.detection_s),
            f"{row.budget_spent * 100:.3g}%", human_duration(row.reset_s))


def other_cells(row: OtherRow) -> tuple[str, ...]:
    """One absent-data or operational row as table text."""
    return (row.alert, row.severity, row.condition, prometheus_duration(row.for_s) if row.for_s else "-")
