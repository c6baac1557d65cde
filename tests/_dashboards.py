"""What the dashboard tests share: the dashboards generated for the example spec and without one, a reader of
the metric names and functions a PromQL expression uses, and the skip-or-fail rule for missing tools."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from llmslo.dashboards import Dashboard, build_dashboards
from llmslo.rules import SPEC_VERSION, Model, build_model, generate_groups, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "chat-slo.yaml"
GOLDEN = Path(__file__).parent / "golden" / "dashboards"

DEFAULT_SPEC = {"version": SPEC_VERSION, "service": "default",
                "objectives": [{"name": "default", "kind": "availability", "objective": 99}]}
"""A spec that keeps the default burn-rate alerts and period: the recording rules the no-spec SLO dashboard
expects."""


@functools.cache
def example_model() -> Model:
    return build_model(load_spec(EXAMPLE))


@functools.cache
def generated() -> dict[str, Dashboard]:
    """Every dashboard: those of the example spec and those generated without a spec, by file name."""
    return {d.file_name: d for d in (*build_dashboards(example_model()), *build_dashboards())}


@functools.cache
def engine_generated() -> dict[str, Dashboard]:
    """The dashboards of every inference engine's own series: of the example spec where the engine can give
    one of its objectives, and without a spec, by file name."""
    from llmslo.engines import ENGINES
    from llmslo.rules import EngineSupportError

    out: dict[str, Dashboard] = {}
    for key, profile in ENGINES.items():
        try:
            model: Model | None = build_model(load_spec(EXAMPLE, engine=True), key)
        except EngineSupportError:
            model = None
        dashboards = build_dashboards(None, profile) + (build_dashboards(model) if model is not None else ())
        out |= {d.file_name: d for d in dashboards}
    return out


def recorded_names(model: Model) -> set[str]:
    """The names of the recording rules ``llmslo rules generate`` writes for ``model``."""
    return {r.record for g in generate_groups(model) for r in g.rules if r.record}


def allowed_series(dashboard: Dashboard) -> set[str]:
    """The series a dashboard may read: the catalogue's, the recording rules of its spec (of the default spec
    without one) and Prometheus's own ALERTS and up."""
    from llmslo.telemetry import METRICS

    names = {m.name for m in METRICS}
    names |= {s for m in METRICS if m.type == "histogram" for s in (m.bucket, m.count, m.sum)}
    model = example_model() if "-chat-" in dashboard.file_name else build_model(parse_spec(DEFAULT_SPEC))
    return names | recorded_names(model) | {"ALERTS", "up"}


PROMQL_FUNCTIONS = frozenset({
    "abs", "absent", "avg", "avg_over_time", "ceil", "clamp_max", "clamp_min", "count", "delta", "floor",
    "histogram_quantile", "increase", "irate", "label_replace", "max", "max_over_time", "min", "min_over_time",
    "quantile", "rate", "round", "scalar", "sort", "sum", "sum_over_time", "time", "topk", "vector",
})
"""PromQL functions and aggregations (a subset: enough to tell a real one from a typo)."""
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
                       "bool", "offset"})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACES = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*")


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(series names, function names) an expression uses: identifiers outside strings, matchers, ranges and
    label lists; those followed by ``(`` are functions."""
    text = _STRING.sub('""', expr)
    text = _BRACES.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub(" ", text)
    series: set[str] = set()
    functions: set[str] = set()
    for match in _IDENTIFIER.finditer(text):
        token = match.group()
        if text[match.end():].lstrip().startswith("("):
            functions.add(token)
        elif token not in _KEYWORDS:
            series.add(token)
    return series, functions


LABEL_VALUES = re.compile(r"^label_values\((?P<series>.+),\s*(?P<label>[A-Za-z_][A-Za-z0-9_]*)\)$")
"""Grafana's ``label_values(series, label)`` variable query."""
