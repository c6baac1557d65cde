"""Anomaly detection over stored summaries: windowed KS scan gated by effect size, FDR, run rule, and the
other signals (rolling z-score, failure-rate slope, outcome entropy, the composite "tightening" rule)."""

from __future__ import annotations

from llmslo.analysis.anomaly._scan import (
    ANOMALY_METRICS,
    AnomalyConfig,
    AnomalyReport,
    Finding,
    TighteningConfig,
    TighteningSignal,
    WindowTest,
    benjamini_hochberg,
    detect_anomalies,
    detect_in_arrays,
    detect_tightening,
    failure_rate_slope,
    findings_of,
    outcome_entropy,
    rolling_zscore,
    scan_series,
    tightening_signals,
)

__all__ = [
    "ANOMALY_METRICS",
    "AnomalyConfig",
    "AnomalyReport",
    "Finding",
    "TighteningConfig",
    "TighteningSignal",
    "WindowTest",
    "benjamini_hochberg",
    "detect_anomalies",
    "detect_in_arrays",
    "detect_tightening",
    "failure_rate_slope",
    "findings_of",
    "outcome_entropy",
    "rolling_zscore",
    "scan_series",
    "tightening_signals",
]
