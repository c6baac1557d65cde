"""Prometheus ``/metrics`` scrapes of LLM servers (vLLM, SGLang, TGI, llama.cpp, trtllm-serve, NIM, llmslo):
parse, estimate, check, compare.

The modules, each depending only on those above it:

* ``_parse``: the exposition parser (Prometheus text 0.0.4 and OpenMetrics 1.0) and the histogram
  series of a parsed scrape;
* ``_names``: which series measures which concept, read from the engine profiles (:mod:`llmslo.engines`)
  and llmslo's name catalogue (:data:`KNOWN_METRICS`, :func:`resolve`);
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
    MappedSeries,
    ScrapeAnalysis,
    analyze_scrape,
)
from llmslo.analysis.scrape._compare import HighWaterMark, RateReport, SeriesRate, compare_scrapes
from llmslo.analysis.scrape._names import KNOWN_METRICS, KnownMetric, Resolution, known_metric, resolve
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
    "HighWaterMark",
    "HistogramReport",
    "HistogramSeries",
    "KNOWN_METRICS",
    "KnownMetric",
    "Labels",
    "MappedSeries",
    "MetricFamily",
    "QuantileEstimate",
    "RateReport",
    "Resolution",
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
    "resolve",
]
