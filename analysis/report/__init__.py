"""The report over stored summaries: the goodput policy, latency distributions, survivor bias, tokens.

:func:`build_report` reads the store and returns a typed :class:`Report` whose ``to_dict()`` is the JSON of
``llmslo report --json``; :func:`km_quantiles` is the censoring-aware (Kaplan–Meier) estimator it uses.
"""

from __future__ import annotations

from llmslo.analysis.report._policy import DEFAULT_TPOT_S, DEFAULT_TTFT_S, GoodputPolicy
from llmslo.analysis.report._report import (
    GROUP_COLUMNS,
    LATENCY_INTERVALS,
    QUANTILES,
    WINDOW_KEY,
    ReportSpec,
    build_report,
)
from llmslo.analysis.report._survival import km_quantiles, quantile_label

__all__ = [
    "DEFAULT_TPOT_S",
    "DEFAULT_TTFT_S",
    "GROUP_COLUMNS",
    "GoodputPolicy",
    "LATENCY_INTERVALS",
    "QUANTILES",
    "ReportSpec",
    "WINDOW_KEY",
    "build_report",
    "km_quantiles",
    "quantile_label",
]
