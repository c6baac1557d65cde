"""Workloads: production traces (Azure, Mooncake, BurstGPT) read as arrival schedules, and the demo.

A schedule is a frame of ``offset_s`` (seconds after the first arrival), ``input_tokens``,
``output_tokens`` (and where the trace has them, ``prefix_ids``, ``source_model``), the input of a load
replay: :func:`read_schedule` reads back the files ``llmslo import`` and ``llmslo trace --out`` write, for
``llmslo load URL --schedule FILE``. :func:`simulate_demo_workload` runs one through a simulated server for
``llmslo demo``.
"""

from __future__ import annotations

from llmslo.analysis._extra import require

require("llmslo.analysis.workload", "polars", "numpy")

from llmslo.analysis.workload._demo import DEMO_START_UNIX_S, ServerModel, demo_workload_note, simulate_demo_workload
from llmslo.analysis.workload._schedule_file import ScheduleFile, ScheduleFileError, read_schedule, replay_command
from llmslo.analysis.workload._traces import (
    MOONCAKE_BLOCK_TOKENS,
    SCHEDULE_SCHEMA,
    TRACE_KINDS,
    TRACE_NOTE,
    LengthStats,
    PrefixStats,
    RateBucket,
    TraceFormatError,
    TraceSummary,
    detect_trace_kind,
    read_azure_trace,
    read_burstgpt_trace,
    read_mooncake_trace,
    read_trace,
    summarize_schedule,
    trace_kind_of_line,
)

__all__ = [
    "DEMO_START_UNIX_S",
    "LengthStats",
    "MOONCAKE_BLOCK_TOKENS",
    "PrefixStats",
    "RateBucket",
    "SCHEDULE_SCHEMA",
    "ScheduleFile",
    "ScheduleFileError",
    "ServerModel",
    "TRACE_KINDS",
    "TRACE_NOTE",
    "TraceFormatError",
    "TraceSummary",
    "demo_workload_note",
    "detect_trace_kind",
    "read_azure_trace",
    "read_burstgpt_trace",
    "read_mooncake_trace",
    "read_schedule",
    "read_trace",
    "replay_command",
    "simulate_demo_workload",
    "summarize_schedule",
    "trace_kind_of_line",
]
