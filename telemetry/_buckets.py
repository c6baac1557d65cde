"""Default latency bucket bounds, seconds, shared by histograms, rules and reports.

They contain the common SLO thresholds (definitions.md, "Histograms"): TTFT 0.1, 0.2, 0.5, 1, 2, 5, 10 s;
TPOT and ITL 0.01, 0.02, 0.05, 0.1, 0.2 s. A configured SLO threshold must be one of the bounds of the
instrument it reads; reports add the thresholds of their policy to these bounds.
"""

from __future__ import annotations

from collections.abc import Mapping

TTFT_BUCKETS_S: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0)
TOKEN_GAP_BUCKETS_S: tuple[float, ...] = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
E2E_BUCKETS_S: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
QUEUE_BUCKETS_S: tuple[float, ...] = (0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)

DEFAULT_BUCKETS_S: Mapping[str, tuple[float, ...]] = {
    "ttft_s": TTFT_BUCKETS_S,
    "client_ttft_s": TTFT_BUCKETS_S,
    "tpot_s": TOKEN_GAP_BUCKETS_S,
    "itl_s": TOKEN_GAP_BUCKETS_S,
    "e2e_s": E2E_BUCKETS_S,
    "queue_s": QUEUE_BUCKETS_S,
}
"""Upper bounds (inclusive, ``le``) per interval name; ``+Inf`` is implied."""
