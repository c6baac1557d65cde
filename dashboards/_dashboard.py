"""What every generated dashboard shares: the envelope, the template variables, the object handed back."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llmslo.dashboards._json import render_json
from llmslo.dashboards._panels import DATASOURCE, Json

SCHEMA_VERSION = 42
"""The dashboard JSON schema version written (``schemaVersion``), as ``@grafana/schema`` 13 defines it;
Grafana migrates older dashboards to its own on import, never the other way."""
TAG = "llmslo"
"""Every generated dashboard carries this tag; each links to the others through it."""
ALL = "$__all"
"""Grafana's value of a variable set to All."""
MAX_UID_LENGTH = 40
"""Grafana refuses a dashboard uid longer than this."""

Kind = Literal["serving", "slo"]


@dataclass(frozen=True)
class Dashboard:
    """One generated dashboard: its ``kind``, Grafana ``uid`` and ``title``, the file name it is written
    under, and its JSON model (``data``, a plain dict; :meth:`text` gives the bytes written)."""

    kind: Kind
    uid: str
    title: str
    file_name: str
    data: Mapping[str, Any]

    def text(self) -> str:
        """The dashboard as deterministic JSON text (keys sorted, nulls stripped, trailing newline)."""
        return render_json(self.data)


def uid(service: str | None, kind: Kind) -> str:
    """``llmslo-<service>-<kind>`` (``llmslo-<kind>`` without a service); a service name too long for
    Grafana's 40 characters is replaced by the first 12 hex digits of its SHA-256."""
    if service is None:
        return f"llmslo-{kind}"
    full = f"llmslo-{service}-{kind}"
    if len(full) <= MAX_UID_LENGTH:
        return full
    return f"llmslo-{hashlib.sha256(service.encode()).hexdigest()[:12]}-{kind}"


def datasource_variable() -> Json:
    """The ``datasource`` variable: any Prometheus data source of the Grafana instance."""
    return {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
            "refresh": 1, "hide": 0, "regex": "", "options": []}


def query_variable(name: str, label: str, query: str, *, current: str | None = None, multi: bool = False,
                   include_all: bool = False, description: str = "") -> Json:
    """A variable whose values Grafana asks Prometheus for (``label_values(series, label)``), refreshed when
    the time range changes. ``current`` is the value selected on import (All when ``include_all`` and none
    is given; Grafana's first value otherwise)."""
    selected: Json | None = None
    value = current if current is not None else (ALL if include_all else None)
    if value is not None:
        text = "All" if value == ALL else value
        selected = {"selected": True, "text": [text] if multi else text, "value": [value] if multi else value}
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE, "query": query,
            "refresh": 2, "sort": 1, "multi": multi, "includeAll": include_all,
            "allValue": ".*" if include_all else None, "current": selected, "hide": 0, "regex": "",
            "options": [], "description": description or None}


def dashboard_links(service: str | None) -> list[Json]:
    """A drop-down of the other llmslo dashboards (of the same service when there is one), keeping the time
    range and the variables."""
    tags = [TAG] if service is None else [TAG, service]
    return [{"type": "dashboards", "title": "llmslo", "tags": tags, "asDropdown": True, "includeVars": True,
             "keepTime": True, "icon": "external link", "targetBlank": False, "tooltip": ""}]


def envelope(*, uid_: str, title: str, description: str, service: str | None, variables: Sequence[Json],
             panels: Sequence[Json], time_from: str) -> Json:
    """The dashboard around its panels: uid, title, tags, variables, time range (``time_from`` back to now),
    a 30 s refresh and a shared crosshair."""
    return {
        "uid": uid_, "title": title, "description": description,
        "tags": [TAG] if service is None else [TAG, service],
        "editable": True, "graphTooltip": 1, "schemaVersion": SCHEMA_VERSION, "version": 1,
        "time": {"from": time_from, "to": "now"}, "timezone": "browser", "refresh": "30s",
        "fiscalYearStartMonth": 0, "liveNow": False,
        "templating": {"list": list(variables)}, "annotations": {"list": []},
        "links": dashboard_links(service), "panels": list(panels),
    }
