"""Retry-After from the observed drain rate and the depth ahead: bounded, jittered, a documented fallback."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.controls import RetryAfterEstimator
from llmslo.telemetry import ConfigurationError


def steady(est: RetryAfterEstimator, rate_per_s: float, seconds: float, depth: int = 10, t0: float = 0.0) -> float:
    """Keep ``depth`` waiting while requests leave at ``rate_per_s`` for ``seconds``; the end time."""
    est.record(0, depth, t0)
    step = 1.0 / rate_per_s
    t = t0
    for _ in range(round(seconds * rate_per_s)):
        t += step
        est.record(1, depth, t)
    return t


def test_before_any_drain_the_fallback_is_given() -> None:
    est = RetryAfterEstimator(fallback_s=7.0, jitter=0.0, clock=lambda: 0.0)
    assert est.drain_rate() is None
    assert est.estimate(500) == 7.0


def test_a_steady_drain_gives_depth_over_rate() -> None:
    est = RetryAfterEstimator(jitter=0.0, max_s=600.0)
    end = steady(est, rate_per_s=2.0, seconds=60.0)
    rate = est.drain_rate(end)
    assert rate == pytest.approx(2.0, rel=0.01)
    assert est.estimate(40, end) == pytest.approx(20.0, rel=0.01)


def test_the_rate_follows_a_change_of_drain_speed() -> None:
    est = RetryAfterEstimator(jitter=0.0, max_s=600.0, smoothing_s=5.0)
    end = steady(est, rate_per_s=10.0, seconds=30.0)
    end = steady(est, rate_per_s=1.0, seconds=30.0, t0=end)
    assert est.drain_rate(end) == pytest.approx(1.0, rel=0.05)


def test_idle_time_does_not_decay_the_rate() -> None:
    est = RetryAfterEstimator(jitter=0.0)
    end = steady(est, rate_per_s=4.0, seconds=30.0)
    est.record(0, 0, end)  # the queue emptied
    before = est.drain_rate(end)
    assert before is not None and est.drain_rate(end + 3600.0) == before


def test_a_stalled_full_queue_drives_retry_after_to_the_maximum() -> None:
    est = RetryAfterEstimator(jitter=0.0, max_s=45.0)
    end = steady(est, rate_per_s=4.0, seconds=30.0)
    assert est.estimate(10, end) == pytest.approx(2.5, rel=0.02)
    assert est.estimate(10, end + 60.0) == 45.0  # nobody left the queue for a minute


def test_an_empty_queue_ahead_gives_the_minimum() -> None:
    est = RetryAfterEstimator(jitter=0.0, min_s=1.5)
    end = steady(est, rate_per_s=4.0, seconds=10.0)
    assert est.estimate(0, end) == 1.5


def test_jitter_spreads_estimates_within_the_fraction() -> None:
    est = RetryAfterEstimator(jitter=0.25, max_s=600.0, rng=random.Random(3))
    end = steady(est, rate_per_s=2.0, seconds=60.0)
    base = 40 / est.drain_rate(end)  # type: ignore[operator]
    values = [est.estimate(40, end) for _ in range(200)]
    assert len(set(values)) > 100
    assert all(0.75 * base <= v <= 1.25 * base for v in values)
    assert min(values) < 0.8 * base and max(values) > 1.2 * base


def test_the_same_seed_gives_the_same_estimates() -> None:
    def run() -> list[float]:
        est = RetryAfterEstimator(rng=random.Random(11))
        end = steady(est, rate_per_s=3.0, seconds=20.0)
        return [est.estimate(12, end) for _ in range(5)]
    assert run() == run()


@pytest.mark.parametrize(("kw", "message"), [
    ({"min_s": -1}, "RetryAfterEstimator.min_s: must be a finite number >= 0, got -1"),
    ({"max_s": 0}, "RetryAfterEstimator.max_s: must be a finite number > 0, got 0"),
    ({"min_s": 10, "max_s": 5, "fallback_s": 5}, "RetryAfterEstimator.max_s: must be >= min_s (10.0), got 5"),
    ({"fallback_s": 100}, "RetryAfterEstimator.fallback_s: must lie within [min_s, max_s] = [1.0, 60.0]"),
    ({"jitter": 1.0}, "RetryAfterEstimator.jitter: must be a fraction in [0, 1), got 1.0"),
    ({"window_s": float("nan")}, "RetryAfterEstimator.window_s: must be a finite number > 0, got nan"),
    ({"rng": 3}, "RetryAfterEstimator.rng: must be a random.Random, got int"),
])
def test_bad_configuration_raises_naming_the_field(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        RetryAfterEstimator(**kw)  # type: ignore[arg-type]
    assert str(err.value).startswith(message)


def test_bad_observations_are_ignored() -> None:
    est = RetryAfterEstimator(jitter=0.0, fallback_s=3.0)
    est.record(-1, 5, 1.0)
    est.record(1, -5, 2.0)
    est.record(True, 1, 3.0)
    est.record(1, 2.5, 4.0)  # type: ignore[arg-type]
    assert est.drain_rate(5.0) is None
    assert est.estimate(-4, 5.0) == 3.0


EVENTS = st.lists(st.tuples(st.floats(0.0, 5.0), st.integers(0, 3), st.integers(0, 50)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(events=EVENTS, ahead=st.integers(-5, 10_000), jitter=st.floats(0.0, 0.9),
       bounds=st.tuples(st.floats(0.0, 30.0), st.floats(0.1, 600.0)), seed=st.integers(0, 2**16))
def test_every_estimate_lies_within_the_bounds(events: list[tuple[float, int, int]], ahead: int, jitter: float,
                                               bounds: tuple[float, float], seed: int) -> None:
    lo, hi = min(bounds), max(bounds)
    est = RetryAfterEstimator(min_s=lo, max_s=hi, fallback_s=lo, jitter=jitter, rng=random.Random(seed))
    t = 0.0
    for dt, departed, depth in events:
        t += dt
        est.record(departed, depth, t)
        value = est.estimate(ahead, t)
        assert lo <= value <= hi
