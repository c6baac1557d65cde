"""SLO specs that ask an inference engine for everything its own series can give (tests of ``--engine``).

For each latency interval the engine has a histogram of, an objective at one of *its* bucket bounds (one the
exposition at hand holds, when given); availability when its finished-request counter has an ``error`` finish
reason; saturation on each of its gauges of waiting and running requests and of KV-cache usage. Windows are
short (20s/5s, scrape and evaluation every second) so that promtool and a real Prometheus prove them quickly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmslo.engines import ENGINES, EngineProfile
from llmslo.rules import SPEC_VERSION

LATENCIES: dict[str, float] = {"ttft": 1.0, "tpot": 0.1, "itl": 0.1, "e2e": 10.0, "queue": 1.0}
"""The latency objectives tried (catalogue keys), each with the bound it would like."""
LIMITS: dict[str, Any] = {"waiting": 4, "running": 64, "kv_usage": 0.9}
"""The saturation objectives tried, with their limits."""
OPERATIONAL_OFF = ("queue_saturation", "rejections", "breaker_open", "drain_too_long", "summaries_dropped",
                   "gpu_memory", "version_skew")


def _histogram(profile: EngineProfile, concept: str) -> tuple[str, tuple[float, ...]] | None:
    series = profile.get(concept)
    if series is None or concept in profile.lacks or series.type != "histogram" or not series.buckets:
        return None
    return series.name, series.buckets


def _bound(buckets: tuple[float, ...], wanted: float, present: set[float]) -> float:
    """The engine's bound nearest ``wanted``, among those the exposition holds when it holds any."""
    pool = [b for b in buckets if b in present] or list(buckets)
    return min(pool, key=lambda b: (abs(b - wanted), b))


def engine_spec(key: str, *, job: str, service: str | None = None, model: str | None = None,
                present_les: Mapping[str, set[float]] | None = None) -> dict[str, Any]:
    """A spec of every objective engine ``key`` supports (``present_les``: histogram name -> the ``le``
    bounds an exposition holds, so that thresholds fall on buckets it has)."""
    profile = ENGINES[key]
    objectives: list[dict[str, Any]] = []
    for metric, wanted in LATENCIES.items():
        found = _histogram(profile, f"{metric}_s")
        if found is not None:
            name, buckets = found
            bound = _bound(buckets, wanted, (present_les or {}).get(name, set()))
            objectives.append({"name": metric, "kind": "latency", "metric": metric, "threshold": bound,
                               "objective": 95})
    finished = profile.get("requests_finished")
    if finished is not None and "requests_finished" not in profile.lacks and "error" in finished.finish_values:
        objectives.append({"name": "errors", "kind": "availability", "bad": ["error"], "objective": 95})
    for metric, limit in LIMITS.items():
        series = profile.get(metric)
        if series is not None and metric not in profile.lacks and series.type == "gauge":
            objectives.append({"name": f"{metric.replace('_', '-')}-saturation", "kind": "saturation",
                               "metric": metric, "threshold": limit, "objective": 95})
    spec: dict[str, Any] = {
        "version": SPEC_VERSION, "service": service or key, "period": "1h",
        "scrape": {"job": job, "interval": "1s"}, "evaluation_interval": "1s", "absent_for": "30s",
        "objectives": objectives,
        "burn_alerts": [{"severity": "page", "burn_rate": 5, "long_window": "20s", "short_window": "5s"}],
        "operational": {"scrape_target_missing": {"for": "10s"}, **dict.fromkeys(OPERATIONAL_OFF, False)},
    }
    if model is not None:
        spec["selector"] = {"model": model}
    return spec
