"""The report over stored summaries: the goodput policy, latency distributions, survivor bias, tokens.

:func:`build_report` reads the store and returns a typed :class:`Report` whose ``to_dict()`` is the JSON of
``llmslo report --json``; :func:`km_quantiles` is the censoring-aware (Kaplan–Meier) estimator it uses.
:func:`arrivalless_imports`, :func:`stored_arrival_range` and :func:`check_window_count` say what the
stored rows can support (imports without arrival times, arrival times that can be placed, how many
windows); the anomaly scan uses them too.
:class:`RowSelection` with :func:`selected_rows` narrows every reader on a connection to some rows (labels,
an arrival range), :func:`store_contents` says what a store holds, and :func:`latency_ecdf` samples the
empirical CDF of an interval (the app's filters, data page and curves).
"""

from __future__ import annotations

from llmslo.analysis._extra import require

require("llmslo.analysis.report", "duckdb", "polars")

from llmslo.analysis.report._model import (
    Accounting,
    Bucket,
    CensoringAwareTtft,
    Clock,
    Distribution,
    Group,
    GroupRateBasis,
    QuantileComparison,
    RateBasis,
    Report,
    SuccessOnlyTtft,
    SurvivorBias,
    Tokens,
    Totals,
    Verdict,
)
from llmslo.analysis.report._policy import DEFAULT_TPOT_S, DEFAULT_TTFT_S, GoodputPolicy
from llmslo.analysis.report._provenance import (
    ARRIVAL_MAX_UNIX_S,
    ARRIVAL_MIN_UNIX_S,
    MAX_WINDOWS,
    ArrivallessImport,
    PlaceableRows,
    ReportDataError,
    arrivalless_imports,
    check_window_count,
    id_prefix_sql,
    placeable_rows,
    stored_arrival_range,
)
from llmslo.analysis.report._report import (
    CLIENT_DEFINITIONS,
    DEFINITIONS,
    GROUP_COLUMNS,
    LATENCY_INTERVALS,
    QUANTILE_DEFINITIONS,
    QUANTILES,
    WINDOW_KEY,
    ReportSpec,
    build_report,
    definitions_for,
)
from llmslo.analysis.report._selection import (
    LABEL_COLUMNS,
    LabelCount,
    RowSelection,
    SelectedRows,
    StoreContents,
    TableRows,
    selected_rows,
    store_contents,
)
from llmslo.analysis.report._series import ECDF_MAX_POINTS, Ecdf, latency_ecdf
from llmslo.analysis.report._sql import DEFAULT_QUANTILE_METHOD, QUANTILE_METHODS, QuantileMethod
from llmslo.analysis.report._survival import km_quantiles, quantile_label

__all__ = [
    "ARRIVAL_MAX_UNIX_S",
    "ARRIVAL_MIN_UNIX_S",
    "Accounting",
    "ArrivallessImport",
    "Bucket",
    "CLIENT_DEFINITIONS",
    "CensoringAwareTtft",
    "Clock",
    "DEFAULT_QUANTILE_METHOD",
    "DEFAULT_TPOT_S",
    "DEFAULT_TTFT_S",
    "DEFINITIONS",
    "Distribution",
    "ECDF_MAX_POINTS",
    "Ecdf",
    "GROUP_COLUMNS",
    "GoodputPolicy",
    "Group",
    "GroupRateBasis",
    "LABEL_COLUMNS",
    "LATENCY_INTERVALS",
    "LabelCount",
    "MAX_WINDOWS",
    "PlaceableRows",
    "QUANTILES",
    "QUANTILE_DEFINITIONS",
    "QUANTILE_METHODS",
    "QuantileMethod",
    "RateBasis",
    "Report",
    "ReportDataError",
    "ReportSpec",
    "RowSelection",
    "SelectedRows",
    "StoreContents",
    "SuccessOnlyTtft",
    "QuantileComparison",
    "SurvivorBias",
    "TableRows",
    "Tokens",
    "Totals",
    "Verdict",
    "WINDOW_KEY",
    "arrivalless_imports",
    "build_report",
    "check_window_count",
    "definitions_for",
    "id_prefix_sql",
    "km_quantiles",
    "latency_ecdf",
    "placeable_rows",
    "quantile_label",
    "selected_rows",
    "store_contents",
    "stored_arrival_range",
]
