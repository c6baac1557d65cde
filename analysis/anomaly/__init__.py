"""Anomaly detection over stored summaries: windowed KS scan gated by effect size, FDR, run rule, and the
other signals (rolling z-score, failure-rate slope, outcome entropy, the composite "tightening" rule).

The modules, each depending only on those above it:

* ``_ks``: two-sample Kolmogorov–Smirnov statistics and p-values for many windows at once;
* ``_scan``: the distribution-change scan (:class:`AnomalyConfig`, window tests, Benjamini–Hochberg,
  the run rule, :func:`detect_anomalies`);
* ``_signals``: :func:`rolling_zscore`, :func:`failure_rate_slope`, :func:`outcome_entropy`;
* ``_tightening``: the composite tightening rule (:func:`tightening_signals`, :func:`detect_tightening`).
"""

from __future__ import annotations

from llmslo.analysis._extra import require

require("llmslo.analysis.anomaly", "duckdb", "numpy", "polars", "scipy")

from llmslo.analysis.anomaly._scan import (
    ANOMALY_METRICS,
    AnomalyConfig,
    AnomalyReport,
    Finding,
    WindowTest,
    benjamini_hochberg,
    detect_anomalies,
    detect_in_arrays,
    findings_of,
    scan_series,
    untested_reason,
)
from llmslo.analysis.anomaly._signals import failure_rate_slope, outcome_entropy, rolling_zscore
from llmslo.analysis.anomaly._tightening import (
    TighteningConfig,
    TighteningSignal,
    detect_tightening,
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
    "untested_reason",
]
