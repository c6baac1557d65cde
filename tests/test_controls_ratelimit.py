"""Rate limits: the token bucket's arithmetic and bound, per-key limits by requests and by token cost, the
bounded key table, reconciliation, and what a refusal reports (all with a hand-driven clock)."""

from __future__ import annotations

import asyncio
import math
import re
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from llmslo.controls import ADMIT, BucketTake, LocalBuckets, RateLimit, RateLimiter, TokenBucket
from llmslo.telemetry import ConfigurationError, Telemetry, render_metrics


class FakeClock:
    """Monotonic seconds moved by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _samples(tel: Telemetry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples named ``name`` in the rendered /metrics text, by sorted labels."""
    text = render_metrics(tel.registry, "")[0].decode()
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name == name}


# ---- the token bucket -----------------------------------------------------------------------------------

def test_a_bucket_starts_full_and_says_how_long_until_it_holds_the_cost() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_per_s=2.0, capacity=10.0, clock=clock)
    assert bucket.take(8) == BucketTake(True, 0.0)
    allowed, wait_s, detail = bucket.take(5)
    assert not allowed and wait_s == pytest.approx(1.5)  # holds 2, needs 3 more at 2 per second
    assert "less than the cost 5" in detail
    clock.now = 1.5
    assert bucket.take(5).allowed
    assert bucket.tokens == pytest.approx(0.0)


def test_a_bucket_never_refills_above_its_capacity() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_per_s=1.0, capacity=3.0, clock=clock)
    clock.now = 1000.0
    assert bucket.tokens == 3.0
    assert [bucket.take(1).allowed for _ in range(4)] == [True, True, True, False]


def test_a_cost_above_the_capacity_is_refused_with_a_reason_and_no_wait() -> None:
    bucket = TokenBucket(rate_per_s=1.0, capacity=10.0, clock=FakeClock())
    allowed, wait_s, detail = bucket.take(11)
    assert (allowed, wait_s) == (False, None)
    assert detail == "cost 11 exceeds the bucket's capacity 10: it can never be admitted"
    assert bucket.tokens == 10.0


@pytest.mark.parametrize("cost", [-1, math.nan, math.inf, "3", None, True])
def test_a_cost_that_is_not_a_number_at_least_zero_is_refused_and_takes_nothing(cost: object) -> None:
    bucket = TokenBucket(rate_per_s=1.0, capacity=10.0, clock=FakeClock())
    allowed, wait_s, detail = bucket.take(cost)  # type: ignore[arg-type]
    assert (allowed, wait_s) == (False, None) and detail.startswith("cost must be a finite number >= 0")
    assert bucket.tokens == 10.0


def test_a_clock_that_steps_back_refills_nothing() -> None:
    clock = FakeClock(100.0)
    bucket = TokenBucket(rate_per_s=1.0, capacity=5.0, clock=clock)
    assert bucket.take(5).allowed
    clock.now = 50.0
    assert bucket.tokens == 0.0
    clock.now = 101.0
    assert bucket.tokens == pytest.approx(1.0)


def test_give_back_is_bounded_to_plus_and_minus_the_capacity() -> None:
    bucket = TokenBucket(rate_per_s=1.0, capacity=5.0, clock=FakeClock())
    assert bucket.take(4).allowed
    assert bucket.give_back(100) == pytest.approx(4.0)
    assert bucket.give_back(-100) == pytest.approx(-10.0)
    assert bucket.tokens == -5.0
    assert bucket.give_back(math.nan) == 0.0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"rate_per_s": 0, "capacity": 1}, "TokenBucket.rate_per_s"),
    ({"rate_per_s": 1, "capacity": math.nan}, "TokenBucket.capacity"),
    ({"rate_per_s": True, "capacity": 1}, "TokenBucket.rate_per_s"),
    ({"rate_per_s": 1, "capacity": -2}, "TokenBucket.capacity"),
])
def test_a_bad_bucket_configuration_raises_naming_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^{field}: must be a finite number > 0"):
        TokenBucket(**kwargs)


_takes = st.lists(st.tuples(st.floats(0, 50, allow_nan=False), st.floats(0, 40, allow_nan=False)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(rate=st.floats(0.01, 100), capacity=st.floats(0.5, 30), takes=_takes)
def test_a_bucket_never_admits_more_than_rate_times_t_plus_capacity(
        rate: float, capacity: float, takes: list[tuple[float, float]]) -> None:
    """Over [0, t] (the bucket starts full at 0) and over any window between two admissions alike."""
    clock = FakeClock()
    bucket = TokenBucket(rate, capacity, clock)
    admitted: list[tuple[float, float]] = [(0.0, 0.0)]  # (time, cost) of each admitted take
    for dt, cost in takes:
        clock.now += dt
        if bucket.take(cost).allowed:
            admitted.append((clock.now, cost))
    for i, (start, _) in enumerate(admitted):
        total = 0.0
        for end, cost in admitted[i:]:
            total += cost
            assert total <= rate * (end - start) + capacity + 1e-9 * (1 + total)


def _within_bound(admitted: list[tuple[float, float]], rate: float, capacity: float) -> None:
    """Every window between two admissions (and from 0) admitted at most rate × window + capacity."""
    for i, (start, _) in enumerate(admitted):
        total = 0.0
        for end, cost in admitted[i:]:
            total += cost
            assert total <= rate * (end - start) + capacity + 1e-9 * (1 + total)


@settings(max_examples=200, deadline=None)
@given(rate=st.floats(0.01, 100), capacity=st.floats(1, 30), takes=_takes, keys=st.lists(st.sampled_from("ab")))
def test_a_limiter_never_admits_more_per_key_than_rate_times_t_plus_capacity(
        rate: float, capacity: float, takes: list[tuple[float, float]], keys: list[str]) -> None:
    clock = FakeClock()
    limiter = RateLimiter(requests=RateLimit(rate / 3, capacity), tokens=RateLimit(rate, capacity * 10),
                          max_keys=2, clock=clock)
    admitted: dict[str, list[tuple[float, float]]] = {"a": [(0.0, 0.0)], "b": [(0.0, 0.0)]}
    for i, (dt, cost) in enumerate(takes):
        clock.now += dt
        key = keys[i % len(keys)] if keys else "a"
        if limiter.check(key, prompt_tokens=int(cost * 10), max_tokens=0).admitted:
            admitted[key].append((clock.now, float(int(cost * 10))))
    for key in "ab":
        _within_bound(admitted[key], rate, capacity * 10)
        _within_bound([(t, 1.0) for t, _ in admitted[key][1:]], rate / 3, capacity)


@settings(max_examples=200, deadline=None)
@given(rate=st.floats(0.01, 100), capacity=st.floats(0.5, 30), takes=_takes)
def test_after_the_wait_a_bucket_gives_the_same_cost_and_not_before(
        rate: float, capacity: float, takes: list[tuple[float, float]]) -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate, capacity, clock)
    for dt, cost in takes:
        clock.now += dt
        allowed, wait_s, _ = bucket.take(cost)
        if allowed or wait_s is None:
            assert allowed == (wait_s == 0.0) and (allowed or cost > capacity)
            continue
        assert wait_s > 0
        held = bucket.tokens
        clock.now += wait_s * 0.999
        assert bucket.tokens < cost and bucket.tokens >= held
        clock.now += wait_s * 0.001 + 1e-9
        assert bucket.take(cost).allowed


# ---- the limiter: requests and token cost per key -------------------------------------------------------

def test_each_key_has_its_own_request_bucket() -> None:
    clock = FakeClock()
    limiter = RateLimiter(requests=RateLimit(rate_per_s=1.0, capacity=2.0), clock=clock)
    assert [limiter.check("a").admitted for _ in range(3)] == [True, True, False]
    assert limiter.check("b") is ADMIT
    refusal = limiter.check("a")
    assert (refusal.reason, refusal.http_status, refusal.retry_after_s) == ("rate_limited", 429, 1.0)
    assert refusal.retry_after_header == "1"
    clock.now = 1.0
    assert limiter.check("a").admitted


def test_the_token_cost_is_prompt_plus_requested_max_tokens_and_retry_after_is_the_time_it_fits() -> None:
    clock = FakeClock()
    limiter = RateLimiter(tokens=RateLimit.per_minute(100_000), clock=clock)  # 1666.67 tokens per second
    assert limiter.check("client", prompt_tokens=30_000, max_tokens=50_000).admitted
    refusal = limiter.check("client", prompt_tokens=10_000, max_tokens=20_000)
    assert not refusal.admitted
    assert refusal.retry_after_s == pytest.approx(10_000 / (100_000 / 60))  # holds 20k, needs 30k
    assert refusal.detail == "over the tokens limit (1666.67/s, burst 100000)"
    clock.now = refusal.retry_after_s or 0.0
    assert limiter.check("client", prompt_tokens=10_000, max_tokens=20_000).admitted


def test_a_request_refused_by_one_bucket_takes_nothing_from_the_other() -> None:
    clock = FakeClock()
    limiter = RateLimiter(requests=RateLimit(1.0, 3.0), tokens=RateLimit(10.0, 100.0), clock=clock)
    assert limiter.check("k", prompt_tokens=90, max_tokens=0).admitted
    for _ in range(5):  # over the token budget: the request bucket keeps its two remaining requests
        assert not limiter.check("k", prompt_tokens=50, max_tokens=0).admitted
    assert limiter.check("k", prompt_tokens=5, max_tokens=5).admitted
    assert limiter.check("k", prompt_tokens=0, max_tokens=0).admitted
    refusal = limiter.check("k", prompt_tokens=0, max_tokens=0)
    assert refusal.detail.startswith("over the requests limit") and refusal.retry_after_s == pytest.approx(1.0)


def test_retry_after_is_the_longest_wait_over_the_buckets_that_refuse() -> None:
    limiter = RateLimiter(requests=RateLimit(1.0, 1.0), tokens=RateLimit(1.0, 10.0), clock=FakeClock())
    assert limiter.check("k", prompt_tokens=10).admitted
    refusal = limiter.check("k", prompt_tokens=4)  # requests: 1 s, tokens: 4 s
    assert refusal.retry_after_s == pytest.approx(4.0) and "tokens" in refusal.detail


def test_a_cost_that_can_never_fit_is_refused_without_a_retry_after_and_says_why() -> None:
    limiter = RateLimiter(tokens=RateLimit.per_minute(1000), clock=FakeClock())
    refusal = limiter.check("k", prompt_tokens=600, max_tokens=500)
    assert (refusal.reason, refusal.retry_after_s, refusal.retry_after_header) == ("rate_limited", None, None)
    assert refusal.detail == ("tokens cost 1100 exceeds the limit's capacity 1000: it can never be admitted; "
                              "ask for fewer tokens")
    assert limiter.check("k", prompt_tokens=600, max_tokens=400).admitted  # the refusal took nothing


@pytest.mark.parametrize(("prompt", "max_tokens", "field"), [
    (-5, 10, "prompt_tokens"), (math.nan, 10, "prompt_tokens"), (10, "100", "max_tokens"),
    (10, None, "max_tokens"), (10, math.inf, "max_tokens"), (True, 1, "prompt_tokens"),
])
def test_a_token_count_that_is_not_a_number_is_refused_naming_it_and_never_raises(
        prompt: object, max_tokens: object, field: str) -> None:
    limiter = RateLimiter(tokens=RateLimit(1.0, 1000.0), clock=FakeClock())
    refusal = limiter.check("k", prompt_tokens=prompt, max_tokens=max_tokens)
    assert refusal.reason == "rate_limited" and refusal.detail.startswith(f"{field} must be a number >= 0")
    assert limiter.check("k", prompt_tokens=1000).admitted


def test_a_huge_cost_is_refused_as_never_fitting_not_raised() -> None:
    limiter = RateLimiter(tokens=RateLimit(1.0, 1000.0), clock=FakeClock())
    refusal = limiter.check("k", prompt_tokens=10**400, max_tokens=1)
    assert refusal.retry_after_s is None and "can never be admitted" in refusal.detail
    assert limiter.reconcile("k", reserved=10**400, actual=1) == 0.0
    assert not TokenBucket(1.0, 10.0, FakeClock()).take(10**400).allowed


# ---- reconciliation -------------------------------------------------------------------------------------

def test_reconcile_gives_back_what_the_request_did_not_use() -> None:
    clock = FakeClock()
    limiter = RateLimiter(tokens=RateLimit(1.0, 1000.0), clock=clock)
    assert limiter.check("k", prompt_tokens=200, max_tokens=800).admitted
    assert not limiter.check("k", prompt_tokens=300).admitted
    assert limiter.reconcile("k", reserved=1000, actual=200 + 150) == pytest.approx(650.0)
    assert limiter.check("k", prompt_tokens=300).admitted


def test_reconcile_charges_an_overrun_bounded_to_one_capacity_of_debt() -> None:
    clock = FakeClock()
    limiter = RateLimiter(tokens=RateLimit(10.0, 100.0), clock=clock)
    assert limiter.check("k", prompt_tokens=50).admitted
    assert limiter.reconcile("k", reserved=50, actual=80) == pytest.approx(-30.0)
    assert limiter.reconcile("k", reserved=0, actual=10**9) == pytest.approx(-120.0)  # down to -capacity
    refusal = limiter.check("k", prompt_tokens=1)
    assert refusal.retry_after_s == pytest.approx(10.1)


@pytest.mark.parametrize(("reserved", "actual"), [(10, -1), (math.nan, 1), ("10", 1), (None, 3), (5, 5)])
def test_reconcile_with_bad_counts_changes_nothing(reserved: object, actual: object) -> None:
    limiter = RateLimiter(tokens=RateLimit(1.0, 100.0), clock=FakeClock())
    assert limiter.check("k", prompt_tokens=100).admitted
    assert limiter.reconcile("k", reserved, actual) == 0.0
    assert not limiter.check("k", prompt_tokens=1).admitted


def test_reconcile_without_a_token_limit_does_nothing() -> None:
    limiter = RateLimiter(requests=RateLimit(1.0, 1.0), clock=FakeClock())
    assert limiter.check("k").admitted
    assert limiter.reconcile("k", 100, 1) == 0.0
    assert not limiter.check("k").admitted


# ---- the bounded key table ------------------------------------------------------------------------------

def test_keys_beyond_max_keys_share_one_overflow_bucket() -> None:
    limiter = RateLimiter(requests=RateLimit(0.001, 2.0), max_keys=2, clock=FakeClock())
    assert limiter.check("a").admitted and limiter.check("b").admitted
    assert limiter.check("c").admitted and limiter.check("d").admitted  # c and d share the overflow bucket
    assert not limiter.check("e").admitted
    assert limiter.check("a").admitted  # own keys keep their own buckets
    assert len(limiter) == 2


@pytest.mark.parametrize("key", [None, 42, b"bytes", "", "x" * 65])
def test_a_key_that_is_not_short_text_uses_the_overflow_bucket(key: object) -> None:
    limiter = RateLimiter(requests=RateLimit(0.001, 1.0), max_key_chars=64, clock=FakeClock())
    assert limiter.check(key).admitted
    assert not limiter.check("y" * 65).admitted  # the same overflow bucket
    assert limiter.check("x" * 64).admitted
    assert len(limiter) == 1


def test_a_key_is_dropped_only_once_its_buckets_are_full_again() -> None:
    clock = FakeClock()
    store = LocalBuckets(clock)
    limiter = RateLimiter(requests=RateLimit(1.0, 2.0), max_keys=1, store=store, clock=clock)
    assert limiter.check("a").admitted and limiter.check("a").admitted
    clock.now = 1.0  # "a" holds 1 of 2: its entry is kept, so "b" uses the overflow bucket
    assert [limiter.check("b").admitted for _ in range(3)] == [True, True, False]
    assert [limiter.check("a").admitted for _ in range(2)] == [True, False]
    clock.now = 1.0 + 4.0  # idle for 2 × capacity / rate: "a" is full again and gives up its entry
    assert [limiter.check("b").admitted for _ in range(3)] == [True, True, False]
    assert len(limiter) == 1 and len(store) == 2  # b's own buckets and the overflow ones; a's are gone


def test_an_evicted_key_decides_as_if_it_had_never_been_dropped() -> None:
    bursts = [(0.0, "a", 3), (10.0, "b", 3), (12.0, "b", 2), (20.0, "a", 3), (30.0, "c", 3), (31.0, "c", 2)]

    def run(max_keys: int) -> list[bool]:
        clock = FakeClock()
        limiter = RateLimiter(requests=RateLimit(1.0, 2.0), max_keys=max_keys, clock=clock)
        out = []
        for at, key, n in bursts:
            clock.now = at
            out += [limiter.check(key).admitted for _ in range(n)]
        return out

    assert run(max_keys=1) == run(max_keys=1000) == [True, True, False] * 2 + [True, True] + [
        True, True, False] * 2 + [True, False]


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(st.one_of(st.text(max_size=80), st.integers(), st.none()), max_size=200),
       steps=st.lists(st.floats(0, 5), min_size=1, max_size=200))
def test_the_key_table_never_grows_beyond_max_keys(keys: list[object], steps: list[float]) -> None:
    clock = FakeClock()
    store = LocalBuckets(clock)
    limiter = RateLimiter(requests=RateLimit(1.0, 2.0), tokens=RateLimit(10.0, 50.0), max_keys=5,
                          max_key_chars=40, store=store, clock=clock)
    for i, key in enumerate(keys):
        clock.now += steps[i % len(steps)]
        limiter.check(key, prompt_tokens=i % 7, max_tokens=3)
        limiter.reconcile(key, 3, i % 4)
        assert len(limiter) <= 5 and len(store) <= 6


# ---- configuration --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "RateLimiter.requests: give a requests limit, a tokens limit or both"),
    ({"requests": RateLimit(1, 1), "max_keys": 0}, "RateLimiter.max_keys: must be an integer >= 1, got 0"),
    ({"requests": RateLimit(1, 1), "max_key_chars": 2.5}, "RateLimiter.max_key_chars: must be an integer >= 1"),
    ({"tokens": 100}, "RateLimiter.tokens: must be a RateLimit or None, got 100"),
    ({"requests": RateLimit(1, 0.5)}, "RateLimiter.requests: capacity must be >= 1 request (each costs 1), got 0.5"),
])
def test_a_bad_limiter_configuration_raises_naming_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match="^" + re.escape(message)):
        RateLimiter(**kwargs)  # type: ignore[arg-type]


def test_rate_limits_per_minute_and_per_second_and_their_errors() -> None:
    assert RateLimit.per_minute(120) == RateLimit(2.0, 120.0)
    assert RateLimit.per_second(5, burst=20) == RateLimit(5.0, 20.0)
    with pytest.raises(ConfigurationError, match=r"^RateLimit\.per_minute\.amount: must be a finite number > 0"):
        RateLimit.per_minute(0)
    with pytest.raises(ConfigurationError, match=r"^RateLimit\.capacity: must be a finite number > 0"):
        RateLimit.per_second(5, burst=-1)


# ---- reporting ------------------------------------------------------------------------------------------

def test_a_refusal_rejects_the_tracker_and_observes_its_retry_after() -> None:
    rows: list[dict[str, object]] = []
    tel = Telemetry(sink=rows.append)
    limiter = RateLimiter(requests=RateLimit(0.5, 1.0), telemetry=tel, clock=FakeClock())
    first = tel.start("r1", model="llama")
    assert limiter.check("k", tracker=first).admitted and not first.done
    second = tel.start("r2", model="llama")
    refusal = limiter.check("k", tracker=second)
    assert refusal.retry_after_s == pytest.approx(2.0) and second.done
    assert [(r["request_id"], r["finish_reason"], r["reject_reason"]) for r in rows] == [
        ("r2", "rejected", "rate_limited")]
    rejected = _samples(tel, "llmslo_rejected_requests_total")
    assert [v for labels, v in rejected.items() if ("reject_reason", "rate_limited") in labels] == [1.0]
    retry = _samples(tel, "llmslo_retry_after_seconds_sum")
    assert retry == {(("model", "llama"), ("reject_reason", "rate_limited")): pytest.approx(2.0)}


def test_a_refusal_without_a_tracker_reports_for_the_given_model_and_a_never_fitting_cost_reports_none() -> None:
    tel = Telemetry()
    limiter = RateLimiter(tokens=RateLimit(1.0, 10.0), telemetry=tel, clock=FakeClock())
    assert limiter.check("k", prompt_tokens=10, model="m").admitted
    assert not limiter.check("k", prompt_tokens=3, model="m").admitted
    assert not limiter.check("k", prompt_tokens=30, model="m").admitted  # never fits: no Retry-After
    assert _samples(tel, "llmslo_retry_after_seconds_count") == {
        (("model", "m"), ("reject_reason", "rate_limited")): 1.0}


# ---- races ----------------------------------------------------------------------------------------------

def test_threads_racing_on_one_key_admit_exactly_the_capacity_and_reject_each_refused_tracker_once() -> None:
    tel = Telemetry()
    limiter = RateLimiter(requests=RateLimit(1e-6, 50.0), tokens=RateLimit(1e-6, 10_000.0), telemetry=tel,
                          clock=FakeClock())
    admitted: list[int] = []
    trackers = [tel.start(f"r{i}", model="m") for i in range(400)]
    barrier = threading.Barrier(8)

    def worker(part: int) -> None:
        barrier.wait()
        for i in range(part, 400, 8):
            if limiter.check("shared", prompt_tokens=100, max_tokens=100, tracker=trackers[i]).admitted:
                admitted.append(i)

    threads = [threading.Thread(target=worker, args=(p,)) for p in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 50  # 50 requests × 200 tokens = the whole token capacity too
    refused = [t for i, t in enumerate(trackers) if i not in set(admitted)]
    assert all(t.reject_reason == "rate_limited" and t.ignored == {} for t in refused)
    assert not any(trackers[i].done for i in admitted)


def test_asyncio_tasks_admit_the_capacity_and_reconcile_each_request_once() -> None:
    tel = Telemetry()
    limiter = RateLimiter(tokens=RateLimit(1e-6, 1000.0), telemetry=tel, clock=FakeClock())
    outcomes: list[bool] = []

    async def handle(i: int) -> None:
        tracker = tel.start(f"r{i}", model="m")
        decision = limiter.check("tenant", prompt_tokens=50, max_tokens=50, tracker=tracker)
        outcomes.append(decision.admitted)
        if decision.admitted:
            await asyncio.sleep(0)  # other tasks decide while this one "generates"
            limiter.reconcile("tenant", reserved=100, actual=60)
            tracker.finish("stop")
        assert tracker.done and tracker.ignored == {}

    async def main() -> None:
        await asyncio.gather(*(handle(i) for i in range(40)))

    asyncio.run(main())
    # 10 fit at first; each of those gives back 40 when it ends: 400 more tokens admit 4 more requests
    assert outcomes.count(True) == 10 and limiter.check("tenant", prompt_tokens=100).admitted
    assert sum(limiter.check("tenant", prompt_tokens=100).admitted for _ in range(5)) == 3
