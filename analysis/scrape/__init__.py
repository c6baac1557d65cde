"""Prometheus ``/metrics`` scrapes of LLM servers (vLLM, SGLang, TGI, llmslo): parse, estimate, check, compare.

The modules, each depending only on those above it:

* ``_parse``: the exposition parser (Prometheus text 0.0.4 and OpenMetrics 1.0) and the histogram
  series of a parsed scrape;
* ``_names``: other servers' metric names mapped to our intervals (:data:`KNOWN_METRICS`);
* ``_buckets``: bucket math: bucket-estimated quantiles and SLO attainment from one series;
* ``_checks``: one scrape's analysis (:func:`analyze_scrape`) and its consistency checks;
* ``_compare``: two scrapes (:func:`compare_scrapes`): counter rates, resets and interval distributions.
"""

from __future__ import annotations

from llmslo.analysis.scrape._buckets import QuantileEstimate, SloAttainment, bucket_quantile
from llmslo.analysis.scrape._checks import (
    DEFAULT_SCRAPE_QUANTILES,
    Finding,
    HistogramReport,
    ScrapeAnalysis,
    analyze_scrape,
)
from llmslo.analysis.scrape._compare import RateReport, SeriesRate, compare_scrapes
from llmslo.analysis.scrape._names import KNOWN_METRICS, KnownMetric, known_metric
from llmslo.analysis.scrape._parse import (
    Exemplar,
    HistogramSeries,
    Labels,
    MetricFamily,
    Sample,
    Scrape,
    ScrapeFormatError,
    parse_exposition,
    read_scrape,
)

__all__ = [
    "DEFAULT_SCRAPE_QUANTILES",
    "Exemplar",
    "Finding",
    "HistogramReport",
    "HistogramSeries",
    "KNOWN_METRICS",
    "KnownMetric",
    "Labels",
    "MetricFamily",
    "QuantileEstimate",
    "RateReport",
    "Sample",
    "Scrape",
    "ScrapeAnalysis",
    "ScrapeFormatError",
    "SeriesRate",
    "SloAttainment",
    "analyze_scrape",
    "bucket_quantile",
    "compare_scrapes",
    "known_metric",
    "parse_exposition",
    "read_scrape",
]
