"""The wire benchmark's pooled p99 (``bench/bench_gateway.py``): the quantile of every repeat's steady streams
together, its two-stage bootstrap interval, and the verdict on that interval."""

from __future__ import annotations

import math
import random

from llmslo.bench.bench_gateway import interval_verdict, pooled_quantile, quantile


def _repeats(seed: int, n: int = 5, size: int = 384, mean_s: float = 0.0006) -> list[list[float]]:
    rng = random.Random(seed)
    return [[rng.expovariate(1 / mean_s) for _ in range(size)] for _ in range(n)]


def test_the_estimate_is_the_quantile_of_the_pool_and_the_interval_holds_it() -> None:
    reps = _repeats(1)
    est, low, high = pooled_quantile(reps, 0.99, resamples=400)
    assert est == quantile([x for r in reps for x in r], 0.99)
    assert low < est < high
    assert pooled_quantile(reps, 0.99, resamples=400) == (est, low, high)  # seeded


def test_a_disturbed_repeat_widens_the_interval() -> None:
    """One repeat whose every stream waited 2 ms more (a host that took the CPU away) moves the estimate less than
    it widens the interval: the repeats are drawn too, not only the streams within them."""
    calm = _repeats(2)
    disturbed = [*calm[:4], [x + 0.002 for x in calm[4]]]
    _, low_c, high_c = pooled_quantile(calm, 0.99, resamples=400)
    _, low_d, high_d = pooled_quantile(disturbed, 0.99, resamples=400)
    assert high_d - low_d > 2 * (high_c - low_c)


def test_no_samples_give_no_estimate() -> None:
    assert all(math.isnan(x) for x in pooled_quantile([[], []], 0.99))


def test_the_verdict_needs_the_whole_interval_on_one_side() -> None:
    assert interval_verdict(1.5, 1.9, 2.0).startswith("met")
    assert interval_verdict(1.5, 2.1, 2.0) == "not shown (95 % interval 1.5..2.1)"
    assert interval_verdict(2.1, 2.4, 2.0).startswith("NOT MET")
