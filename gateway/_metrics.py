"""The gateway's per-backend series, read from the pool at each scrape (nothing is counted per request).

Names, types and help come from the catalogue (``llmslo.telemetry.METRICS_BY_KEY``, the ``backend_*`` keys); the
``backend`` label is the backend's id (at most 16 per gateway: bounded).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmslo.gateway._pool import Pool
from llmslo.telemetry import METRICS_BY_KEY


class PoolCollector(Collector):
    """A prometheus-client collector of ``pool``'s backends (register it on the telemetry's registry)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        backends = list(self.pool.backends.values())
        values: dict[str, list[float | None]] = {
            "backend_routable": [float(b.routable()) for b in backends],
            "backend_draining": [float(b.drain is not None and b.drain.phase in ("settling", "waiting"))
                                 for b in backends],
            "backend_outstanding": [float(b.outstanding) for b in backends],
            "backend_limit": [float(b.limit.limit) for b in backends],
            "backend_token_limit": [None if b.limit.token_limit is None else float(b.limit.token_limit)
                                    for b in backends],
            "backend_tokens": [float(b.limit.tokens_in_flight) for b in backends],
            "backend_requests": [float(b.served) for b in backends],
            "backend_pool_changes": [float(b.changes) for b in backends],
            "backend_engine_read_failures": [float(0 if b.engine is None else b.engine.read_failures)
                                             for b in backends],
            "backend_engine_fallbacks": [float(0 if b.engine is None else b.engine.fallbacks) for b in backends],
        }
        for key, per_backend in values.items():
            m = METRICS_BY_KEY[key]
            family: GaugeMetricFamily | CounterMetricFamily
            if m.type == "counter":
                family = CounterMetricFamily(m.name.removesuffix("_total"), m.help, labels=["backend"])
            else:
                family = GaugeMetricFamily(m.name, m.help, labels=["backend"])
            for b, value in zip(backends, per_backend, strict=True):
                if value is not None:   # None: the backend has no such figure yet (no series, never a made-up 0)
                    family.add_metric([b.id], value)
            yield family
