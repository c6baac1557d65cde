"""What an LLM server imports: the request lifecycle, bounded streams, metrics, traces and the summary contract.

Two halves. The **contracts** (the summary schema, the metric name catalogue, the SLO policy, bucket
bounds, durations, errors) load eagerly and need only the standard library: the analysis, the rules and
the dashboards read them. The **runtime** (lifecycle, metrics, exposition, sink, journal, streams, spans,
GPU sampler, the ASGI middleware) loads on first use of one of its names (PEP 562), so a contract user never
loads prometheus-client. Nothing here loads polars, duckdb, pyarrow, scipy, numpy, typer, streamlit or
OpenTelemetry (the summary sink's DuckDB and Parquet writers live in ``llmslo.analysis.store``;
:class:`RequestTracing` imports OpenTelemetry when it is constructed).
"""

from __future__ import annotations

import importlib
import typing

from llmslo.telemetry._buckets import DEFAULT_BUCKETS_S
from llmslo.telemetry._durations import format_duration, parse_duration
from llmslo.telemetry._errors import ConfigurationError, LlmsloError
from llmslo.telemetry._names import (
    BREAKER_STATES,
    DRAIN_CLOSE_REASONS,
    DRAIN_DURATION_BUCKETS_S,
    LABELS,
    METRICS,
    METRICS_BY_KEY,
    METRICS_BY_NAME,
    OBSERVATION_DROP_REASONS,
    OVERFLOW_VALUE,
    RATE_LIMIT_FAIL_MODES,
    RECORDING_RULES,
    RETRY_AFTER_BUCKETS_S,
    SHED_SIGNALS,
    SLO_BUDGET_REMAINING,
    SLO_ERROR_RATIO,
    SLO_LABELS,
    SLO_OBJECTIVE,
    SUMMARY_DROP_REASONS,
    TARGET_LABELS,
    VERSION_ERROR_RATIO,
    VERSION_TTFT_P95,
    Label,
    Metric,
    MetricType,
    RecordingRule,
)
from llmslo.telemetry._policy import DEFAULT_TPOT_S, DEFAULT_TTFT_S, SloPolicy
from llmslo.telemetry._summary import (
    COLUMN_NAMES,
    COLUMNS,
    COLUMNS_BY_NAME,
    COUNT_COLUMNS,
    DECODE_SQL,
    FINISH_REASONS,
    INTERVAL_COLUMNS,
    REJECT_REASONS,
    RULES,
    SCHEMA_VERSION,
    TOKEN_COUNT_COLUMNS,
    TPOT_SQL,
    Column,
    FinishReason,
    RejectReason,
    Rule,
    Violation,
    tpot_s,
    validate_summary,
)

_RUNTIME: dict[str, str] = {
    "CRASH_ERROR_TYPE": "_journal",
    "FORBIDDEN_LABELS": "_labels",
    "GpuSample": "_gpu",
    "GpuSampler": "_gpu",
    "Guard": "_guard",
    "Journal": "_journal",
    "JournalEntry": "_journal",
    "JournalInUse": "_journal",
    "JournalState": "_journal",
    "JsonlWriter": "_sink",
    "LabelPolicy": "_labels",
    "LlmsloMiddleware": "_middleware",
    "MetricsServer": "_exposition",
    "MiddlewareConfig": "_middleware",
    "OtlpExport": "_otel",
    "Progress": "_journal",
    "RecoveryReport": "_journal",
    "RequestScope": "_lifecycle",
    "RequestTracing": "_otel",
    "RequestTracker": "_lifecycle",
    "SampleSink": "_gpu",
    "SendQueue": "_streams",
    "StreamClosed": "_streams",
    "StreamPolicy": "_streams",
    "StreamSimulation": "_streams",
    "StreamTick": "_streams",
    "SummarySink": "_sink",
    "SummaryWriter": "_sink",
    "Telemetry": "_lifecycle",
    "TelemetryMetrics": "_metrics",
    "TerminalRecord": "_streams",
    "crash_row": "_journal",
    "ensure_journal_free": "_journal",
    "current_tracker": "_lifecycle",
    "default_telemetry": "_middleware",
    "metrics_app": "_exposition",
    "read_journal": "_journal",
    "recover_journal": "_journal",
    "render_metrics": "_exposition",
    "simulate_stream": "_streams",
    "stored_in_jsonl": "_journal",
    "valid_request_id": "_middleware",
}
"""Runtime names and the private module each lives in, imported on first access."""


def __getattr__(name: str) -> typing.Any:
    module = _RUNTIME.get(name)
    if module is None:
        raise AttributeError(f"module 'llmslo.telemetry' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"llmslo.telemetry.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if typing.TYPE_CHECKING:
    from llmslo.telemetry._exposition import MetricsServer, metrics_app, render_metrics
    from llmslo.telemetry._gpu import GpuSample, GpuSampler, SampleSink
    from llmslo.telemetry._guard import Guard
    from llmslo.telemetry._journal import (
        CRASH_ERROR_TYPE,
        Journal,
        JournalEntry,
        JournalInUse,
        JournalState,
        Progress,
        RecoveryReport,
        crash_row,
        ensure_journal_free,
        read_journal,
        recover_journal,
        stored_in_jsonl,
    )
    from llmslo.telemetry._labels import FORBIDDEN_LABELS, LabelPolicy
    from llmslo.telemetry._lifecycle import RequestScope, RequestTracker, Telemetry, current_tracker
    from llmslo.telemetry._metrics import TelemetryMetrics
    from llmslo.telemetry._middleware import (
        LlmsloMiddleware,
        MiddlewareConfig,
        default_telemetry,
        valid_request_id,
    )
    from llmslo.telemetry._otel import OtlpExport, RequestTracing
    from llmslo.telemetry._sink import JsonlWriter, SummarySink, SummaryWriter
    from llmslo.telemetry._streams import (
        SendQueue,
        StreamClosed,
        StreamPolicy,
        StreamSimulation,
        StreamTick,
        TerminalRecord,
        simulate_stream,
    )

__all__ = [
    "BREAKER_STATES",
    "COLUMNS",
    "COLUMNS_BY_NAME",
    "COLUMN_NAMES",
    "COUNT_COLUMNS",
    "CRASH_ERROR_TYPE",
    "Column",
    "ConfigurationError",
    "DECODE_SQL",
    "DEFAULT_BUCKETS_S",
    "DEFAULT_TPOT_S",
    "DEFAULT_TTFT_S",
    "DRAIN_CLOSE_REASONS",
    "DRAIN_DURATION_BUCKETS_S",
    "FINISH_REASONS",
    "FORBIDDEN_LABELS",
    "FinishReason",
    "GpuSample",
    "GpuSampler",
    "Guard",
    "INTERVAL_COLUMNS",
    "Journal",
    "JournalEntry",
    "JournalInUse",
    "JournalState",
    "JsonlWriter",
    "LABELS",
    "Label",
    "LabelPolicy",
    "LlmsloError",
    "LlmsloMiddleware",
    "METRICS",
    "METRICS_BY_KEY",
    "METRICS_BY_NAME",
    "Metric",
    "MetricType",
    "MetricsServer",
    "MiddlewareConfig",
    "OBSERVATION_DROP_REASONS",
    "OVERFLOW_VALUE",
    "OtlpExport",
    "Progress",
    "RATE_LIMIT_FAIL_MODES",
    "RECORDING_RULES",
    "REJECT_REASONS",
    "RETRY_AFTER_BUCKETS_S",
    "RULES",
    "RecordingRule",
    "RecoveryReport",
    "RejectReason",
    "RequestScope",
    "RequestTracing",
    "RequestTracker",
    "Rule",
    "SCHEMA_VERSION",
    "SHED_SIGNALS",
    "SLO_BUDGET_REMAINING",
    "SLO_ERROR_RATIO",
    "SLO_LABELS",
    "SLO_OBJECTIVE",
    "SUMMARY_DROP_REASONS",
    "SampleSink",
    "SendQueue",
    "SloPolicy",
    "StreamClosed",
    "StreamPolicy",
    "StreamSimulation",
    "StreamTick",
    "SummarySink",
    "SummaryWriter",
    "TARGET_LABELS",
    "TOKEN_COUNT_COLUMNS",
    "TPOT_SQL",
    "Telemetry",
    "TelemetryMetrics",
    "TerminalRecord",
    "VERSION_ERROR_RATIO",
    "VERSION_TTFT_P95",
    "Violation",
    "crash_row",
    "current_tracker",
    "default_telemetry",
    "ensure_journal_free",
    "format_duration",
    "metrics_app",
    "parse_duration",
    "read_journal",
    "recover_journal",
    "render_metrics",
    "simulate_stream",
    "stored_in_jsonl",
    "tpot_s",
    "valid_request_id",
    "validate_summary",
]
