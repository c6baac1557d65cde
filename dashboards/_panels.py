"""Grafana panels as plain dicts, and the grid that numbers and places them.

Each builder writes every option its panel plugin's published schema (``@grafana/schema``) requires, so the
JSON type-checks against Grafana's own types (``tests/tools/grafana_schema``). Grid units: a dashboard is 24
columns wide; heights are in rows of 30 px.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llmslo.dashboards._json import JSON_NULL

Json = dict[str, Any]
GRID_WIDTH = 24
"""Columns of the Grafana grid."""

DATASOURCE: Json = {"type": "prometheus", "uid": "${datasource}"}
"""Every panel and query variable reads the Prometheus data source chosen in the ``datasource`` variable."""

_HIDE_FROM: Json = {"legend": False, "tooltip": False, "viz": False}
_TOOLTIP: Json = {"mode": "multi", "sort": "desc"}
_LEGEND: Json = {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True}

Format = Literal["time_series", "heatmap", "table"]


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel: its expression and legend; ``exemplar`` asks Prometheus for exemplars
    (``request_id``, ``trace_id``) of the histogram buckets it reads; ``instant`` evaluates at the end of the
    range only (tables)."""

    expr: str
    legend: str = ""
    exemplar: bool = False
    format: Format = "time_series"
    instant: bool = False

    def as_dict(self, ref_id: str) -> Json:
        return {
            "datasource": DATASOURCE,
            "editorMode": "code",
            "exemplar": self.exemplar,
            "expr": self.expr,
            "format": self.format,
            "instant": self.instant,
            "legendFormat": self.legend or "__auto",
            "range": not self.instant,
            "refId": ref_id,
        }


def _targets(targets: Sequence[Target]) -> list[Json]:
    if len(targets) > len(string.ascii_uppercase):
        raise ValueError(f"a panel holds at most {len(string.ascii_uppercase)} queries, got {len(targets)}")
    return [t.as_dict(string.ascii_uppercase[i]) for i, t in enumerate(targets)]


Step = tuple[float | None, str]
"""A threshold step: (value from which the colour applies, colour); ``None`` for the base (minus infinity)."""


def thresholds(*steps: Step) -> Json:
    """Absolute thresholds; the first step must be the base, ``(None, colour)``."""
    if not steps or steps[0][0] is not None:
        raise ValueError("the first threshold step is the base: (None, colour)")
    values = [v for v, _ in steps[1:] if v is not None]
    if len(values) != len(steps) - 1 or values != sorted(values):
        raise ValueError(f"threshold steps after the base need increasing values, got {values}")
    return {"mode": "absolute",
            "steps": [{"color": colour, "value": JSON_NULL if v is None else v} for v, colour in steps]}


def value_mappings(texts: Iterable[tuple[int, str, str]]) -> list[Json]:
    """One value-to-text mapping: (value, text, colour) for each value."""
    return [{"type": "value", "options": {
        str(value): {"color": colour, "index": i, "text": text} for i, (value, text, colour) in enumerate(texts)}}]


def override(name_regex: str, *properties: tuple[str, Any]) -> Json:
    """Field properties for the series whose display name matches ``name_regex``."""
    return {"matcher": {"id": "byRegexp", "options": name_regex},
            "properties": [{"id": key, "value": value} for key, value in properties]}


DASHED: tuple[str, Any] = ("custom.lineStyle", {"dash": [10, 10], "fill": "dash"})
"""An override property drawing the series as a dashed line (capacities, limits)."""


def timeseries(title: str, description: str, targets: Sequence[Target], *, unit: str, stack: bool = False,
               steps: Sequence[Step] = (), threshold_lines: bool = False, overrides: Sequence[Json] = (),
               minimum: float | None = None, bars: bool = False) -> Json:
    """A time-series panel. ``stack`` stacks the series (parts of one total); ``steps`` colour the values and,
    with ``threshold_lines``, are drawn as dashed lines (SLO thresholds, burn rates)."""
    custom = {
        "axisBorderShow": False, "axisCenteredZero": False, "axisColorMode": "text", "axisLabel": "",
        "axisPlacement": "auto", "barAlignment": 0, "drawStyle": "bars" if bars else "line",
        "fillOpacity": 30 if stack or bars else 10, "gradientMode": "none", "hideFrom": _HIDE_FROM,
        "insertNulls": False, "lineInterpolation": "linear", "lineWidth": 1, "pointSize": 4,
        "scaleDistribution": {"type": "linear"}, "showPoints": "never", "spanNulls": False,
        "stacking": {"group": "A", "mode": "normal" if stack else "none"},
        "thresholdsStyle": {"mode": "dashed" if threshold_lines else "off"},
    }
    defaults: Json = {"color": {"mode": "palette-classic"}, "custom": custom, "unit": unit, "min": minimum,
                      "thresholds": thresholds(*(steps or ((None, "green"),)))}
    return {
        "type": "timeseries", "title": title, "description": description, "datasource": DATASOURCE,
        "targets": _targets(targets),
        "fieldConfig": {"defaults": defaults, "overrides": list(overrides)},
        "options": {"legend": _LEGEND, "tooltip": _TOOLTIP},
    }


def heatmap(title: str, description: str, target: Target, *, y_unit: str, cell_unit: str) -> Json:
    """A heatmap of pre-bucketed data (a Prometheus histogram queried with ``format: heatmap``), exemplars
    drawn over the cells."""
    return {
        "type": "heatmap", "title": title, "description": description, "datasource": DATASOURCE,
        "targets": _targets([target]),
        "fieldConfig": {"defaults": {"custom": {"hideFrom": _HIDE_FROM, "scaleDistribution": {"type": "linear"}}},
                        "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "cellValues": {"unit": cell_unit},
            "color": {"exponent": 0.5, "fill": "dark-orange", "mode": "scheme", "reverse": False,
                      "scale": "exponential", "scheme": "Oranges", "steps": 64},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "filterValues": {"le": 1e-9},
            "legend": {"show": True},
            "rowsFrame": {"layout": "auto"},
            "selectionMode": "x",
            "showValue": "never",
            "tooltip": {"mode": "single", "showColorScale": False, "yHistogram": True},
            "yAxis": {"axisPlacement": "left", "reverse": False, "unit": y_unit},
        },
    }


def stat(title: str, description: str, targets: Sequence[Target], *, unit: str, steps: Sequence[Step],
         decimals: int | None = None) -> Json:
    """A stat panel: the last value of each series, coloured by ``steps``."""
    return {
        "type": "stat", "title": title, "description": description, "datasource": DATASOURCE,
        "targets": _targets(targets),
        "fieldConfig": {"defaults": {"color": {"mode": "thresholds"}, "decimals": decimals, "unit": unit,
                                     "thresholds": thresholds(*steps)},
                        "overrides": []},
        "options": {
            "colorMode": "value", "graphMode": "area", "justifyMode": "auto", "orientation": "auto",
            "percentChangeColorMode": "standard", "showPercentChange": False, "textMode": "auto",
            "wideLayout": True,
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
    }


def state_timeline(title: str, description: str, targets: Sequence[Target],
                   states: Sequence[tuple[int, str, str]]) -> Json:
    """A state timeline: one lane per series, each value shown as its state's text and colour."""
    return {
        "type": "state-timeline", "title": title, "description": description, "datasource": DATASOURCE,
        "targets": _targets(targets),
        "fieldConfig": {"defaults": {"color": {"mode": "thresholds"}, "mappings": value_mappings(states),
                                     "thresholds": thresholds((None, "text")),
                                     "custom": {"fillOpacity": 70, "hideFrom": _HIDE_FROM, "lineWidth": 0}},
                        "overrides": []},
        "options": {"alignValue": "left", "legend": _LEGEND, "mergeValues": True, "rowHeight": 0.9,
                    "showValue": "auto", "tooltip": {"mode": "single", "sort": "none"}},
    }


def table(title: str, description: str, target: Target, *, hide: Sequence[str] = ()) -> Json:
    """A table of an instant query (``format: table``); ``hide`` names columns left out (``Time``, ``Value``)."""
    return {
        "type": "table", "title": title, "description": description, "datasource": DATASOURCE,
        "targets": _targets([target]),
        "fieldConfig": {"defaults": {"custom": {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False},
                                     "thresholds": thresholds((None, "text"))},
                        "overrides": []},
        "options": {"cellHeight": "sm", "frameIndex": 0, "showHeader": True},
        "transformations": [{"id": "organize", "options": {"excludeByName": dict.fromkeys(hide, True)}}],
    }


class Grid:
    """Numbers the panels (ids from 1, in order) and places them left to right, rows of panels under row
    headers; a panel that does not fit the rest of the line starts the next one."""

    def __init__(self) -> None:
        self.panels: list[Json] = []
        self._x = 0
        self._y = 0
        self._line_h = 0

    def _newline(self) -> None:
        self._y += self._line_h
        self._x = 0
        self._line_h = 0

    def row(self, title: str, repeat: str | None = None) -> None:
        """A row header across the grid; ``repeat`` repeats the row and its panels per value of a variable."""
        self._newline()
        self.panels.append({"type": "row", "title": title, "collapsed": False, "panels": [], "repeat": repeat,
                            "id": len(self.panels) + 1, "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": self._y}})
        self._y += 1

    def add(self, panel: Json, width: int, height: int = 8) -> None:
        """Place ``panel`` (``width`` columns of 24, ``height`` rows)."""
        if not 0 < width <= GRID_WIDTH:
            raise ValueError(f"a panel is 1 to {GRID_WIDTH} columns wide, got {width}")
        if self._x + width > GRID_WIDTH:
            self._newline()
        self.panels.append({**panel, "id": len(self.panels) + 1,
                            "gridPos": {"h": height, "w": width, "x": self._x, "y": self._y}})
        self._x += width
        self._line_h = max(self._line_h, height)
