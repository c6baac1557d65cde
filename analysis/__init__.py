"""Offline analysis of request summaries, one subpackage a concern.

==============  ======================================================================================
``store``       schema, validation, the DuckDB :class:`Store`, sink writers (duckdb + pyarrow only)
``report``      the goodput policy, the typed :class:`Report`, Kaplan–Meier (censoring-aware TTFT)
``importers``   other tools' results (vLLM bench, LLMPerf, GenAI-Perf/AIPerf, guidellm), one registry
``workload``    traces (Azure, Mooncake, BurstGPT) as arrival schedules; the demo workload
``scrape``      Prometheus exposition: parse, other servers' names, bucket math, checks, compare
``anomaly``     KS scan, FDR, run rule, z-score, slope, entropy, tightening
``gpu``         GPU sample importers, correlation with latency
==============  ======================================================================================

(The registry listing ``importers()`` is ``llmslo.analysis.importers.importers``: on the facade that
name is the subpackage.) The names below are re-exported from those subpackages and load on first use (PEP 562), so
``import llmslo.analysis`` costs almost nothing and ``llmslo.analysis.store`` stays the light door.
Needs the ``analysis`` extra (``pip install 'llmslo[analysis]'``); each subpackage checks for what it
imports (``store``: duckdb and pyarrow only) and says what to install.
"""

from __future__ import annotations

import importlib
import typing

_EXPORTS: dict[str, tuple[str, ...]] = {
    "anomaly": ("AnomalyConfig", "AnomalyReport", "TighteningConfig", "detect_anomalies", "failure_rate_slope",
                "outcome_entropy", "rolling_zscore", "tightening_signals"),
    "gpu": ("GPU_IMPORT_KINDS", "GpuFormatError", "aligned_frame", "correlate", "gpu_state_during_decode",
            "import_gpu_file", "lagged_correlation"),
    "importers": ("ImportFormatError", "ImportOptions", "ImportReport", "UnknownKindError", "detect_kind",
                  "importer_for"),
    "report": ("DEFAULT_TPOT_S", "DEFAULT_TTFT_S", "GROUP_COLUMNS", "GoodputPolicy", "LATENCY_INTERVALS",
               "QUANTILES", "Report", "ReportSpec", "WINDOW_KEY", "build_report", "km_quantiles", "quantile_label"),
    "scrape": ("Scrape", "ScrapeAnalysis", "ScrapeFormatError", "analyze_scrape", "compare_scrapes",
               "parse_exposition", "read_scrape"),
    "store": ("DuckDBSummaryWriter", "IngestReport", "InvalidInputError", "ParquetSummaryWriter", "RowError",
              "Store", "StoreError", "StoreVersionError", "arrow_schema", "open_store", "polars_schema",
              "summary_ddl", "summary_table"),
    "workload": ("TRACE_KINDS", "TraceFormatError", "TraceSummary", "read_trace"),
}
_FROM_TELEMETRY = ("format_duration", "parse_duration")
_WHERE: dict[str, str] = {name: sub for sub, names in _EXPORTS.items() for name in names}

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
    "Report",
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


def __getattr__(name: str) -> typing.Any:
    if name in _FROM_TELEMETRY:
        module = importlib.import_module("llmslo.telemetry")
    elif name in _WHERE:
        module = importlib.import_module(f"llmslo.analysis.{_WHERE[name]}")
    else:
        raise AttributeError(f"module 'llmslo.analysis' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if typing.TYPE_CHECKING:
    from llmslo.analysis.anomaly import (
        AnomalyConfig,
        AnomalyReport,
        TighteningConfig,
        detect_anomalies,
        failure_rate_slope,
        outcome_entropy,
        rolling_zscore,
        tightening_signals,
    )
    from llmslo.analysis.gpu import (
        GPU_IMPORT_KINDS,
        GpuFormatError,
        aligned_frame,
        correlate,
        gpu_state_during_decode,
        import_gpu_file,
        lagged_correlation,
    )
    from llmslo.analysis.importers import (
        ImportFormatError,
        ImportOptions,
        ImportReport,
        UnknownKindError,
        detect_kind,
        importer_for,
    )
    from llmslo.analysis.report import (
        DEFAULT_TPOT_S,
        DEFAULT_TTFT_S,
        GROUP_COLUMNS,
        LATENCY_INTERVALS,
        QUANTILES,
        WINDOW_KEY,
        GoodputPolicy,
        Report,
        ReportSpec,
        build_report,
        km_quantiles,
        quantile_label,
    )
    from llmslo.analysis.scrape import (
        Scrape,
        ScrapeAnalysis,
        ScrapeFormatError,
        analyze_scrape,
        compare_scrapes,
        parse_exposition,
        read_scrape,
    )
    from llmslo.analysis.store import (
        DuckDBSummaryWriter,
        IngestReport,
        InvalidInputError,
        ParquetSummaryWriter,
        RowError,
        Store,
        StoreError,
        StoreVersionError,
        arrow_schema,
        open_store,
        polars_schema,
        summary_ddl,
        summary_table,
    )
    from llmslo.analysis.workload import TRACE_KINDS, TraceFormatError, TraceSummary, read_trace
    from llmslo.telemetry import format_duration, parse_duration
