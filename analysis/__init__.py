"""Offline analysis of request summaries: the DuckDB store, latency, goodput and survivor bias.

Needs the ``analysis`` extra (``pip install 'llmslo[analysis]'``).
"""

from __future__ import annotations

try:
    import duckdb as _duckdb  # noqa: F401
    import polars as _polars  # noqa: F401
    import pyarrow as _pyarrow  # noqa: F401
except ModuleNotFoundError as _exc:  # pragma: no cover - exercised only without the extra
    raise ModuleNotFoundError(
        f"llmslo.analysis needs the 'analysis' extra ({_exc.name} is missing): "
        "pip install 'llmslo[analysis]'",
        name=_exc.name,
    ) from None

from llmslo.analysis._anomaly import (
    AnomalyConfig,
    AnomalyReport,
    TighteningConfig,
    detect_anomalies,
    failure_rate_slope,
    outcome_entropy,
    rolling_zscore,
    tightening_signals,
)
from llmslo.analysis._correlate import aligned_frame, correlate, gpu_state_during_decode, lagged_correlation
from llmslo.analysis._gpu_import import GPU_IMPORT_KINDS, GpuFormatError, import_gpu_file
from llmslo.analysis._import_registry import (
    ImportFormatError,
    ImportOptions,
    ImportReport,
    UnknownKindError,
    detect_kind,
    importer_for,
    importers,
)
from llmslo.analysis._import_traces import TRACE_KINDS, TraceFormatError, TraceSummary, read_trace
from llmslo.analysis._policy import DEFAULT_TPOT_S, DEFAULT_TTFT_S, GoodputPolicy
from llmslo.analysis._report import (
    GROUP_COLUMNS,
    LATENCY_INTERVALS,
    QUANTILES,
    WINDOW_KEY,
    ReportSpec,
    build_report,
)
from llmslo.analysis._schema import arrow_schema, polars_schema, summary_ddl
from llmslo.analysis._scrape import (
    Scrape,
    ScrapeAnalysis,
    ScrapeFormatError,
    analyze_scrape,
    compare_scrapes,
    parse_exposition,
    read_scrape,
)
from llmslo.analysis._sink_writers import DuckDBSummaryWriter, ParquetSummaryWriter, summary_table
from llmslo.analysis._store import IngestReport, Store, StoreError, StoreVersionError, open_store
from llmslo.analysis._survival import km_quantiles, quantile_label
from llmslo.analysis._validation import InvalidInputError, RowError
from llmslo.telemetry import format_duration, parse_duration

__all__ = [
    "AnomalyConfig",
    "AnomalyReport",
    "DEFAULT_TPOT_S",
    "DEFAULT_TTFT_S",
    "DuckDBSummaryWriter",
    "GPU_IMPORT_KINDS",
    "GROUP_COLUMNS",
    "GoodputPolicy",
    "GpuFormatError",
    "ImportFormatError",
    "ImportOptions",
    "ImportReport",
    "IngestReport",
    "InvalidInputError",
    "LATENCY_INTERVALS",
    "ParquetSummaryWriter",
    "QUANTILES",
    "ReportSpec",
    "RowError",
    "Scrape",
    "ScrapeAnalysis",
    "ScrapeFormatError",
    "Store",
    "StoreError",
    "StoreVersionError",
    "TRACE_KINDS",
    "TighteningConfig",
    "TraceFormatError",
    "TraceSummary",
    "UnknownKindError",
    "WINDOW_KEY",
    "aligned_frame",
    "analyze_scrape",
    "arrow_schema",
    "build_report",
    "compare_scrapes",
    "correlate",
    "detect_anomalies",
    "detect_kind",
    "failure_rate_slope",
    "format_duration",
    "gpu_state_during_decode",
    "import_gpu_file",
    "importer_for",
    "importers",
    "km_quantiles",
    "lagged_correlation",
    "open_store",
    "outcome_entropy",
    "parse_duration",
    "parse_exposition",
    "polars_schema",
    "quantile_label",
    "read_scrape",
    "read_trace",
    "rolling_zscore",
    "summary_ddl",
    "summary_table",
    "tightening_signals",
]
