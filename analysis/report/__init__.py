"""The report over stored summaries: the goodput policy, latency distributions, survivor bias, tokens.

:func:`build_report` reads the store and returns a typed :class:`Report` whose ``to_dict()`` is the JSON of
``llmslo report --json``; :func:`km_quantiles` is the censoring-aware (Kaplan–Meier) estimator it uses.
"""

from __future__ import annotations

from llmslo.analysis._extra import require

require("llmslo.analysis.report", "duckdb", "polars")

from llmslo.analysis.report._model import (
    Accounting,
    Bucket,
    CensoringAwareTtft,
    Distribution,
    Group,
    RateBasis,
    Report,
    SuccessOnlyTtft,
    SurvivorBias,
    Tokens,
    Totals,
    Verdict,
)
from llmslo.analysis.report._policy import DEFAULT_TPOT_S, DEFAULT_TTFT_S, GoodputPolicy
from llmslo.analysis.report._report import (
    DEFINITIONS,
    GROUP_COLUMNS,
    LATENCY_INTERVALS,
    QUANTILES,
    WINDOW_KEY,
    ReportSpec,
    build_report,
)
from llmslo.analysis.report._survival import km_quantiles, quantile_label

__all__ = [
    "Accounting",
    "Bucket",
    "CensoringAwareTtft",
    "DEFAULT_TPOT_S",
    "DEFAULT_TTFT_S",
    "DEFINITIONS",
    "Distribution",
    "GROUP_COLUMNS",
    "GoodputPolicy",
    "Group",
    "LATENCY_INTERVALS",
    "QUANTILES",
    "RateBasis",
    "Report",
    "ReportSpec",
    "SuccessOnlyTtft",
    "SurvivorBias",
    "Tokens",
    "Totals",
    "Verdict",
    "WINDOW_KEY",
    "build_report",
    "km_quantiles",
    "quantile_label",
]
