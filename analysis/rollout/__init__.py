"""Rolling updates, measured: update records in the store, version comparison during the overlap window,
and wait-budget advice for the drain (``llmslo rollout ...``, ``llmslo drain ...``)."""

from __future__ import annotations

from llmslo.analysis._extra import require

require("llmslo.analysis.rollout", "duckdb", "numpy", "scipy")

# isort: split
# ---- update records (analysis/rollout/_records.py) ---------------------------------------------------
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

# isort: split
# ---- version comparison (analysis/rollout/_compare.py) -----------------------------------------------
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

# isort: split
# ---- wait-budget advice and drain-configuration check (analysis/rollout/_advice.py) ------------------
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
    "ProcessFigures",
    "RATE_METRICS",
    "RecordedUpdate",
    "Regression",
    "RolloutInputError",
    "TenantDifference",
    "UPDATES_TABLE",
    "UpdateRecord",
    "VersionComparison",
    "VersionOutcome",
    "advise_wait_budget",
    "check_drain_config",
    "compare_versions",
    "evaluate_drain_config",
    "get_update",
    "list_updates",
    "parse_update_json",
    "record_update",
    "record_updates",
    "updates_ddl",
    "validate_update",
]
