"""Every query a dashboard holds: the panels' PromQL and the variables' ``label_values`` look-ups."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PanelQuery:
    """One PromQL query of one panel, with Grafana's template variables still in it (``$job``,
    ``$__rate_interval``)."""

    panel_id: int
    panel: str
    ref_id: str
    expr: str
    exemplar: bool
    instant: bool


@dataclass(frozen=True)
class VariableQuery:
    """A query variable: its name and Grafana's ``label_values(series, label)`` look-up."""

    name: str
    query: str


def _panels(data: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for panel in data.get("panels", ()):
        yield panel
        yield from panel.get("panels", ())  # a collapsed row holds its panels


def panel_queries(data: Mapping[str, Any]) -> tuple[PanelQuery, ...]:
    """The PromQL of every panel target of a dashboard's JSON model, in panel order."""
    return tuple(
        PanelQuery(int(p["id"]), str(p.get("title", "")), str(t["refId"]), str(t["expr"]),
                   bool(t.get("exemplar", False)), bool(t.get("instant", False)))
        for p in _panels(data) for t in p.get("targets", ()))


def variable_queries(data: Mapping[str, Any]) -> tuple[VariableQuery, ...]:
    """The look-up of every query variable of a dashboard's JSON model."""
    return tuple(VariableQuery(str(v["name"]), str(v["query"]))
                 for v in data.get("templating", {}).get("list", ()) if v.get("type") == "query")
