"""Grafana dashboards built from the metric name catalogue and, when given, an SLO spec.

Two dashboards: **serving** (request and token rates, TTFT/TPOT/ITL/e2e heatmaps and quantiles with
``request_id`` exemplars, queue depth against capacity, rejections, shedding, circuit breakers, drains,
backpressure, GPUs) and **SLO** (error budget left, good events over the period, burn rates over the alert
windows, alert state, from the recording rules of :mod:`llmslo.rules`). Data source and job are template
variables; every metric name comes from :mod:`llmslo.telemetry`. Plain dicts, written as deterministic JSON.
Imports the telemetry contracts only (never its runtime); :func:`slo_dashboard` without a model and
:func:`build_dashboards` read :mod:`llmslo.rules` (PyYAML) when called.

For servers without llmslo inside, :func:`engine_dashboard` draws an inference engine's own series from its
profile (:mod:`llmslo.engines`); ``build_dashboards(model)`` of a model built with ``engine=`` gives it and the
SLO dashboard of the engine rules.

Example::

    from llmslo.dashboards import build_dashboards, write_dashboards
    from llmslo.rules import build_model, load_spec

    paths = write_dashboards(build_dashboards(build_model(load_spec("examples/chat-slo.yaml"))), "dashboards")
"""

from llmslo.dashboards._build import build_dashboards
from llmslo.dashboards._dashboard import SCHEMA_VERSION, Dashboard
from llmslo.dashboards._engine import engine_dashboard
from llmslo.dashboards._json import JSON_NULL, render_json, strip_nulls
from llmslo.dashboards._output import write_dashboards
from llmslo.dashboards._promql import PROMETHEUS_SERIES
from llmslo.dashboards._queries import PanelQuery, VariableQuery, panel_queries, variable_queries
from llmslo.dashboards._serving import serving_dashboard
from llmslo.dashboards._slo import slo_dashboard

__all__ = [
    "Dashboard",
    "JSON_NULL",
    "PROMETHEUS_SERIES",
    "PanelQuery",
    "SCHEMA_VERSION",
    "VariableQuery",
    "build_dashboards",
    "engine_dashboard",
    "panel_queries",
    "render_json",
    "serving_dashboard",
    "slo_dashboard",
    "strip_nulls",
    "variable_queries",
    "write_dashboards",
]
