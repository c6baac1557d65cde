"""Rolling updates, measured: update records in the store, version comparison during the overlap window,
wait-budget advice for the drain (``llmslo rollout ...``, ``llmslo drain ...``), and the drain's rules.

The drain's rules (``_rules.py``: standard library only) load with the package, so that ``llmslo.ops`` checks a
plan by them without the ``analysis`` extra's heavy part; every other name loads on first use (PEP 562) and
needs duckdb, numpy and scipy (the ``analysis`` extra: ``pip install 'llmslo[analysis]'``).
"""

from __future__ import annotations

import importlib
import typing

# ---- the drain's rules (analysis/rollout/_rules.py), loaded at once ------------------------------------------
from llmslo.analysis.rollout._rules import (
    Part,
    RuleVerdict,
    budget_verdict,
    grace_verdict,
    overlap_verdict,
    part,
    update_window_verdict,
    within,
)

_EXPORTS: dict[str, tuple[str, ...]] = {
    # update records (analysis/rollout/_records.py)
    "_records": ("METRIC_KEYS", "UPDATES_TABLE", "RecordedUpdate", "RolloutInputError", "UpdateRecord",
                 "get_update", "list_updates", "parse_update_json", "record_update", "record_updates",
                 "updates_ddl", "validate_update"),
    # version comparison (analysis/rollout/_compare.py)
    "_compare": ("CORRECTION", "DEFAULT_ALPHA", "LATENCY_METRICS", "MIN_LATENCY_CHANGE", "MIN_RATE_DIFFERENCE",
                 "MIN_SIDE_COUNT", "MISSING_TERMINAL_EVENTS", "RATE_METRICS", "CompareWindow", "LatencySummary",
                 "MetricComparison", "ProcessFigures", "Regression", "TenantDifference", "VersionComparison",
                 "VersionOutcome", "compare_versions"),
    # wait-budget advice and drain-configuration check (analysis/rollout/_advice.py)
    "_advice": ("DRAIN_RULES", "BudgetAdvice", "DrainCheck", "DurationFit", "ObservedUpdate", "advise_wait_budget",
                "check_drain_config", "evaluate_drain_config"),
}
_WHERE: dict[str, str] = {name: module for module, names in _EXPORTS.items() for name in names}

__all__: list[str] = [
    "BudgetAdvice",
    "CORRECTION",
    "CompareWindow",
    "DEFAULT_ALPHA",
    "DRAIN_RULES",
    "DrainCheck",
    "DurationFit",
    "LATENCY_METRICS",
    "LatencySummary",
    "METRIC_KEYS",
    "MIN_LATENCY_CHANGE",
    "MIN_RATE_DIFFERENCE",
    "MIN_SIDE_COUNT",
    "MISSING_TERMINAL_EVENTS",
    "MetricComparison",
    "ObservedUpdate",
    "Part",
    "ProcessFigures",
    "RATE_METRICS",
    "RecordedUpdate",
    "Regression",
    "RolloutInputError",
    "RuleVerdict",
    "TenantDifference",
    "UPDATES_TABLE",
    "UpdateRecord",
    "VersionComparison",
    "VersionOutcome",
    "advise_wait_budget",
    "budget_verdict",
    "check_drain_config",
    "compare_versions",
    "evaluate_drain_config",
    "get_update",
    "grace_verdict",
    "list_updates",
    "overlap_verdict",
    "parse_update_json",
    "part",
    "record_update",
    "record_updates",
    "update_window_verdict",
    "updates_ddl",
    "validate_update",
    "within",
]


def __getattr__(name: str) -> typing.Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'llmslo.analysis.rollout' has no attribute {name!r}")
    from llmslo.analysis._extra import require

    require("llmslo.analysis.rollout", "duckdb", "numpy", "scipy")
    value = getattr(importlib.import_module(f"llmslo.analysis.rollout.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if typing.TYPE_CHECKING:
    from llmslo.analysis.rollout._advice import (
        DRAIN_RULES,
        BudgetAdvice,
        DrainCheck,
        DurationFit,
        ObservedUpdate,
        advise_wait_budget,
        check_drain_config,
        evaluate_drain_config,
    )
    from llmslo.analysis.rollout._compare import (
        CORRECTION,
        DEFAULT_ALPHA,
        LATENCY_METRICS,
        MIN_LATENCY_CHANGE,
        MIN_RATE_DIFFERENCE,
        MIN_SIDE_COUNT,
        MISSING_TERMINAL_EVENTS,
        RATE_METRICS,
        CompareWindow,
        LatencySummary,
        MetricComparison,
        ProcessFigures,
        Regression,
        TenantDifference,
        VersionComparison,
        VersionOutcome,
        compare_versions,
    )
    from llmslo.analysis.rollout._records import (
        METRIC_KEYS,
        UPDATES_TABLE,
        RecordedUpdate,
        RolloutInputError,
        UpdateRecord,
        get_update,
        list_updates,
        parse_update_json,
        record_update,
        record_updates,
        updates_ddl,
        validate_update,
    )
