"""Values that help texts show, kept here so that ``--help`` loads no analysis stack.

Each is a copy of a constant that lives in a subpackage of ``llmslo.analysis``, which imports duckdb,
polars or scipy on import. Commands check their arguments against the real constant when they run;
these copies only feed help texts, and ``tests/test_cli.py`` checks that each equals its source.
(The telemetry contracts are light: help texts import ``COLUMNS``, ``FINISH_REASONS`` and the default
SLO thresholds from ``llmslo.telemetry`` directly.)
"""

from __future__ import annotations

__all__ = ["ANOMALY_METRICS", "GPU_IMPORT_KINDS", "GROUP_COLUMNS", "INFERENCE_ENGINES", "TRACE_KINDS"]

GROUP_COLUMNS: tuple[str, ...] = ("model", "version", "tenant_class", "finish_reason", "backend")
"""``llmslo.analysis.report.GROUP_COLUMNS``: the columns ``--by`` accepts."""

ANOMALY_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e", "queue")
"""The keys of ``llmslo.analysis.anomaly.ANOMALY_METRICS``: the latencies ``anomalies --metric`` scans."""

GPU_IMPORT_KINDS: tuple[str, ...] = ("nvidia-smi", "dmon", "vllm-engine")
"""``llmslo.analysis.gpu.GPU_IMPORT_KINDS``: the kinds ``gpu import`` reads."""

TRACE_KINDS: tuple[str, ...] = ("azure", "mooncake", "burstgpt")
"""``llmslo.analysis.workload.TRACE_KINDS``: the formats ``trace`` reads."""

INFERENCE_ENGINES: tuple[str, ...] = ("vllm", "sglang", "tgi", "llamacpp", "trtllm")
"""The keys of ``llmslo.engines.ENGINES``: what ``rules generate --engine`` and ``dashboards generate --engine``
accept."""
