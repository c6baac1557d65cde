"""The gateway's adaptive concurrency limit: bounded acquire/release and limit, bad figures ignored, a limit
that follows latency per unit of work (falls and settles when a backend slows, climbs back when it recovers,
re-measures its baseline when the backend itself is slower) and, unlike Envoy's whole-request gradient, is
not lowered by long answers. No sleeping: every test moves a fake clock."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.gateway._concurrency import DECODE, PREFILL, TOKEN_STEP, AdaptiveLimit, WholeRttGradientLimit
from llmslo.telemetry import ConfigurationError


class Clock:
    """Monotonic seconds moved by hand."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class _Stream:
    start_s: float
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)


class Backend:
    """A continuous-batching backend with more demand than any limit: before each decode step as many
    requests start as the limit lets in; a step lasts ``gap_s(in flight)`` seconds and gives every stream one
    token (the first one's time is the TTFT); a stream of ``tokens`` tokens then ends, is released and
    observed. Streams run on from one :meth:`run` to the next."""

    def __init__(self, limit: AdaptiveLimit, clock: Clock, *, tokens: int = 16, prompt_tokens: int = 100) -> None:
        self.limit = limit
        self.clock = clock
        self.tokens = tokens
        self.prompt_tokens = prompt_tokens
        self.running: list[_Stream] = []

    def run(self, steps: int, gap_s: Callable[[int], float]) -> list[int]:
        """``steps`` decode steps; the limit after each."""
        limits: list[int] = []
        for _ in range(steps):
            while self.limit.try_acquire():
                self.running.append(_Stream(self.clock.now))
            step = gap_s(len(self.running))
            self.clock.now += step
            still: list[_Stream] = []
            for s in self.running:
                if s.ttft_s is None:
                    s.ttft_s = self.clock.now - s.start_s
                else:
                    s.gaps_s.append(step)
                if 1 + len(s.gaps_s) >= self.tokens:
                    self.limit.release()
                    self.limit.observe(ttft_s=s.ttft_s, prompt_tokens=self.prompt_tokens, gaps_s=s.gaps_s)
                else:
                    still.append(s)
            self.running = still
            limits.append(self.limit.limit)
        return limits


def knee(base_gap_s: float, slots: float) -> Callable[[int], float]:
    """Per-token gap: ``base_gap_s`` up to ``slots`` streams, then growing in proportion (compute-bound)."""
    return lambda running: base_gap_s * max(1.0, running / slots)


def settled(limits: list[int], last: int) -> tuple[int, int]:
    """The lowest and highest limit over the last ``last`` steps."""
    tail = limits[-last:]
    return min(tail), max(tail)


# ---- acquire / release and bounds ----------------------------------------------------------------------


def test_acquire_stops_at_the_limit_and_release_never_goes_below_zero() -> None:
    limit = AdaptiveLimit(initial=3, clock=Clock())
    assert [limit.try_acquire() for _ in range(4)] == [True, True, True, False]
    assert limit.in_flight == 3
    for _ in range(4):
        limit.release()
    assert limit.in_flight == 0
    assert limit.unmatched_releases == 1
    assert limit.try_acquire() and limit.in_flight == 1


def test_whole_rtt_limit_acquires_up_to_its_pinned_limit_while_measuring() -> None:
    limit = WholeRttGradientLimit(initial=8, min_limit=3, clock=Clock())
    assert limit.measuring and limit.limit == 3
    assert [limit.try_acquire() for _ in range(4)] == [True, True, True, False]
    for _ in range(5):
        limit.release()
    assert limit.in_flight == 0 and limit.unmatched_releases == 2
    live = WholeRttGradientLimit(initial=8, min_limit=3, pin_min_rtt=False, clock=Clock())
    assert live.measuring and live.limit == 8       # minRTT from live traffic: nothing pinned


def test_the_limit_stays_between_min_and_max_whatever_the_costs() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=4, min_limit=2, max_limit=20, window=5, clock=clock)
    backend = Backend(limit, clock)
    highs = backend.run(400, knee(0.02, 1000))      # never slower: grows until max_limit
    assert max(highs) == 20 and highs[-1] == 20
    steps = iter(range(10**6))
    lows = backend.run(400, lambda running: 0.02 * 1.02 ** next(steps))  # ever slower
    assert min(lows) == 2 and lows[-1] == 2
    assert all(2 <= v <= 20 for v in highs + lows)


def test_the_limit_does_not_grow_while_the_backend_is_far_from_it() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=40, window=5, clock=clock)
    for _ in range(200):        # one request at a time: fast, but proves nothing about 40 at once
        assert limit.try_acquire()
        clock.now += 0.5
        limit.release()
        limit.observe(ttft_s=0.02, prompt_tokens=100, gaps_s=[0.02] * 15)
    assert limit.updates == 40
    assert limit.limit == 40


@pytest.mark.parametrize("kw, field_name", [
    ({"initial": 0}, "initial"),
    ({"initial": 300}, "initial"),
    ({"min_limit": 0}, "min_limit"),
    ({"min_limit": 10, "max_limit": 5, "initial": 10}, "max_limit"),
    ({"tolerance": 1.0}, "tolerance"),
    ({"tolerance": math.nan}, "tolerance"),
    ({"window": 0}, "window"),
    ({"smoothing": 0.0}, "smoothing"),
    ({"smoothing": 1.5}, "smoothing"),
    ({"clock": 5.0}, "clock"),
])
def test_a_bad_configuration_is_refused_naming_the_field(kw: dict[str, object], field_name: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^AdaptiveLimit\.{field_name}: must be"):
        AdaptiveLimit(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("kw, field_name", [
    ({"buffer": -1.0}, "buffer"),
    ({"percentile": 0.0}, "percentile"),
    ({"update_interval_s": 0.0}, "update_interval_s"),
    ({"min_rtt_interval_s": math.inf}, "min_rtt_interval_s"),
    ({"min_rtt_requests": 0}, "min_rtt_requests"),
    ({"pin_min_rtt": "no"}, "pin_min_rtt"),
])
def test_the_whole_rtt_limit_refuses_a_bad_configuration_naming_the_field(kw: dict[str, object],
                                                                         field_name: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^WholeRttGradientLimit\.{field_name}: must be"):
        WholeRttGradientLimit(**kw)  # type: ignore[arg-type]


# ---- bad figures ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -0.5, 1e300, "0.1", True])
def test_bad_figures_are_ignored_counted_and_never_raise(bad: object) -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=5, window=2, clock=clock)
    for _ in range(10):
        limit.observe(ttft_s=bad, prompt_tokens=100, gaps_s=[bad, bad])  # type: ignore[arg-type, list-item]
        limit.observe(ttft_s=0.1, prompt_tokens=-3, gaps_s=None)  # type: ignore[arg-type]
        limit.observe(ttft_s=0.1, prompt_tokens=True, gaps_s=5)  # type: ignore[arg-type]
    assert limit.updates == 0 and limit.limit == 5
    assert limit.baselines == {PREFILL: None, DECODE: None}
    assert limit.ignored_values == 10 * (3 + 1 + 2)  # ttft and 2 gaps; the prompt; the prompt and the gaps


def test_good_gaps_beside_bad_ones_still_count() -> None:
    limit = AdaptiveLimit(initial=5, window=1, clock=Clock())
    limit.observe(ttft_s=math.nan, prompt_tokens=100, gaps_s=[0.02, math.nan, -1.0, 0.04, 0.05, math.inf])
    assert limit.ignored_values == 4
    assert limit.baselines == {PREFILL: None, DECODE: 0.04}   # the median of the three good gaps


@pytest.mark.parametrize("gaps", [[0.05, math.nan, 0.02, 0.04], [math.nan, 0.05, 0.02, 0.04],
                                  [0.05, 0.02, math.inf, 0.04], [0.05, 0.02, True, 0.04], (0.05, 0.02, 0.04)])
def test_a_list_of_floats_is_checked_as_closely_as_any_other_sequence(gaps: list[float]) -> None:
    """The gateway's own lists of floats take a shorter check: a NaN or inf anywhere in one, or a value of another
    type, is still dropped and counted."""
    limit = AdaptiveLimit(initial=5, window=1, clock=Clock())
    limit.observe(ttft_s=None, prompt_tokens=100, gaps_s=gaps)
    assert limit.ignored_values == (0 if isinstance(gaps, tuple) else 1)
    assert limit.baselines == {PREFILL: None, DECODE: 0.04}   # the median of the three good gaps


def test_a_request_without_a_first_token_gives_no_prefill_sample() -> None:
    limit = AdaptiveLimit(initial=5, window=4, clock=Clock())
    for _ in range(4):
        limit.observe(ttft_s=None, prompt_tokens=100, gaps_s=[0.03] * 9)
    assert limit.baselines == {PREFILL: None, DECODE: 0.03}
    assert limit.ignored_values == 0


_figure = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**6))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_figure, st.integers(-5, 5000), st.lists(_figure, max_size=6)), max_size=60),
       st.integers(1, 4))
def test_any_figures_keep_the_limit_in_bounds_and_never_raise(
        requests: list[tuple[float | None, int, list[float | None]]], window: int) -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=3, min_limit=2, max_limit=6, window=window, clock=clock)
    for ttft_s, prompt_tokens, gaps_s in requests:
        limit.try_acquire()
        clock.now += 0.5
        limit.release()
        limit.observe(ttft_s=ttft_s, prompt_tokens=prompt_tokens, gaps_s=gaps_s)  # type: ignore[arg-type]
        assert 2 <= limit.limit <= 6
    json.dumps(limit.to_dict(), allow_nan=False)


def test_the_whole_rtt_limit_ignores_bad_round_trip_times() -> None:
    clock = Clock()
    limit = WholeRttGradientLimit(min_rtt_requests=2, clock=clock)
    clock.now += 10
    for bad in (math.nan, -1.0, math.inf):
        limit.observe_rtt(bad)
    assert limit.ignored_values == 3 and limit.measuring and limit.min_rtt_s is None


# ---- following the backend -----------------------------------------------------------------------------


def test_a_backend_that_loses_capacity_lowers_the_limit_which_settles_then_climbs_back() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=8, clock=clock)
    backend = Backend(limit, clock)
    normal = backend.run(3000, knee(0.02, 16))
    low, high = settled(normal, 500)
    assert high <= 1.25 * low                        # settled before the change
    before = low
    # the same per-token gap at low load, three times the gap at the load it had: a third of the capacity
    slow = backend.run(3000, knee(0.02, 16 / 3))
    slow_low, slow_high = settled(slow, 1000)
    assert slow_high <= before / 2                   # fell ...
    assert slow_high <= 1.5 * slow_low               # ... and settled
    first_settled = next(i for i in range(len(slow)) if all(v <= slow_high for v in slow[i:]))
    assert first_settled <= 1500                     # within a bounded number of steps
    assert limit.rebases == 0                        # the load was the cause: the baseline did not move
    again = backend.run(3000, knee(0.02, 16))
    assert settled(again, 500)[0] >= 0.8 * before    # back to normal: the limit climbed again


def test_a_backend_three_times_slower_per_token_gets_a_new_baseline_and_its_limit_back() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=8, clock=clock)
    backend = Backend(limit, clock)
    before = settled(backend.run(3000, knee(0.02, 16)), 500)[0]
    best_gap = limit.baselines[DECODE]
    assert best_gap is not None
    slow = backend.run(4000, knee(0.06, 16))  # every gap 3x, at any load
    assert min(slow) < before                        # it cut first ...
    assert limit.rebases >= 1                        # ... found the cost did not follow the cut, re-measured
    slow_gap = limit.baselines[DECODE]
    assert slow_gap is not None and 2.5 * best_gap <= slow_gap <= 3.5 * best_gap
    low, high = settled(slow, 1000)
    assert low >= 0.8 * before and high <= 1.5 * low  # settled near the same knee, not at min_limit
    backend.run(3000, knee(0.02, 16))
    assert limit.baselines[DECODE] == best_gap        # recovered: the best baseline is back


def test_other_requests_prefills_in_a_streams_steps_do_not_lower_the_limit() -> None:
    # An engine that prefills in its decode steps stretches the step after each arrival: at a higher arrival
    # rate more of a stream's gaps are those steps, its cost per token unchanged. Here one gap in six is a
    # prefill step 2.2x a decode step (as measured on llmslo serve --speed 5 at 20 req/s): the p90 gap is that
    # step, the median the decode step.
    clock = Clock()
    limit = AdaptiveLimit(initial=8, window=20, clock=clock)
    for _ in range(4):
        assert limit.try_acquire()      # half the limit in flight: the backend is used
    decode_s, prefill_step_s = 0.0067, 0.015
    for _ in range(3 * 20):             # quiet: no arrival's prefill among this stream's steps
        limit.observe(ttft_s=0.02, prompt_tokens=100, gaps_s=[decode_s] * 30)
        clock.now += 0.05
    before = limit.limit
    busier = [prefill_step_s if i % 6 == 0 else decode_s for i in range(30)]
    for _ in range(10 * 20):
        limit.observe(ttft_s=0.02, prompt_tokens=100, gaps_s=busier)
        clock.now += 0.05
    assert limit.baselines[DECODE] == decode_s
    assert limit.gradient == 1.0 and limit.limit >= before, limit.to_dict()


def test_a_fresh_limit_doubles_until_its_first_window_over_tolerance_halves_it() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=2, window=4, max_limit=256, clock=clock)

    def window(ttft_s: float) -> int:
        while limit.try_acquire():      # every slot used: the backend is tried at the whole limit
            pass
        for _ in range(4):
            limit.release()
            limit.observe(ttft_s=ttft_s, prompt_tokens=100, gaps_s=[0.01] * 8)
            clock.now += 0.1
        return limit.limit

    assert [window(0.02) for _ in range(4)] == [4, 8, 16, 32]
    assert limit.slow_start
    cut = window(0.05)                  # 2.5x the baseline: the first window over tolerance
    assert not limit.slow_start and cut < 16   # halved to 16, then the usual cut toward 32 * 1.5 / 2.5
    assert cut < window(0.02) < 1.5 * cut  # then it grows again, by a square root: no more doubling


def test_long_answers_do_not_lower_our_limit_but_lower_the_whole_rtt_one() -> None:
    clock = Clock()
    ours = AdaptiveLimit(initial=8, clock=clock)
    theirs = WholeRttGradientLimit(initial=8, min_limit=3, update_interval_s=1.0, min_rtt_requests=20,
                                   clock=clock)
    gap_s, ttft_s = 0.02, 0.05

    def serve(tokens: int, n: int) -> None:
        """``n`` requests of ``tokens`` tokens, every gap ``gap_s``, one finishing every 0.1 s."""
        for _ in range(n):
            while ours.try_acquire():
                pass
            while theirs.try_acquire():
                pass
            clock.now += 0.1
            gaps = [gap_s] * (tokens - 1)
            ours.release()
            ours.observe(ttft_s=ttft_s, prompt_tokens=200, gaps_s=gaps)
            theirs.release()
            theirs.observe_rtt(ttft_s + math.fsum(gaps))

    serve(16, 300)
    assert not theirs.measuring
    ours_before, theirs_before = ours.limit, theirs.limit
    serve(512, 100)                                  # 10 s of long answers, the same cost per token
    assert ours.limit >= ours_before
    assert ours.gradient is not None and ours.gradient <= ours.tolerance
    assert theirs.gradient == 0.5                    # whole-request time looks 30x slower: clamped cut
    assert theirs.limit <= theirs_before / 2


def test_the_whole_rtt_limit_follows_envoys_formula() -> None:
    clock = Clock()
    limit = WholeRttGradientLimit(initial=16, min_limit=3, update_interval_s=1.0, min_rtt_requests=3,
                                  clock=clock)
    clock.now += 5.0
    for _ in range(3):
        limit.observe_rtt(1.0)
    assert not limit.measuring and limit.min_rtt_s == 1.0 and limit.limit == 16   # restored after measuring
    clock.now += 1.0
    limit.observe_rtt(1.0)          # sampleRTT = minRTT: gradient (1 + 25 %) / 1, plus sqrt(16) headroom
    assert limit.gradient == 1.25 and limit.limit == int(16 * 1.25 + 4)
    clock.now += 1.0
    limit.observe_rtt(2.0)          # gradient 1.25 / 2
    assert limit.gradient == 0.625 and limit.limit == int(24 * 0.625 + math.sqrt(24))
    clock.now += 61.0
    assert limit.try_acquire()                           # minRTT is re-measured every 60 s
    assert limit.measuring and limit.limit == 3


def test_to_dict_is_json_ready_and_shows_baselines_and_the_last_sample() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=5, window=2, clock=clock)
    assert limit.try_acquire()
    for _ in range(2):
        limit.observe(ttft_s=0.05, prompt_tokens=100, gaps_s=[0.02, 0.03, 0.04])
    state = json.loads(json.dumps(limit.to_dict()))
    assert state["limit"] == limit.limit and state["in_flight"] == 1
    assert state["baselines"] == {PREFILL: 0.0005, DECODE: 0.03}
    assert state["last_sample"] == {PREFILL: 0.0005, DECODE: 0.03}
    assert state["last_update_s"] == clock.now and state["updates"] == 1
    assert json.loads(json.dumps(WholeRttGradientLimit(clock=clock).to_dict()))["measuring_min_rtt"] is True


# ---- tokens in flight ------------------------------------------------------------------------------------


def test_tokens_in_flight_are_counted_and_bounded_once_a_good_window_carried_them() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=8, window=4, clock=clock)
    assert limit.token_limit is None
    assert [limit.try_acquire(1000) for _ in range(3)] == [True, True, True]    # no token limit yet
    assert limit.tokens_in_flight == 3000
    for _ in range(3):
        limit.release(1000)
    assert limit.tokens_in_flight == 0 and limit.token_limit is None
    for _ in range(4):                        # one good window with up to 3000 tokens in flight ...
        limit.observe(ttft_s=0.02, prompt_tokens=100, gaps_s=[0.02] * 15)
    assert limit.token_limit == 6000          # ... proves 3000: the limit is twice that
    assert limit.has_room(6000) and limit.has_room(6001)      # alone, anything fits
    assert limit.try_acquire(4000) and limit.try_acquire(2000)
    assert not limit.has_room(1) and not limit.try_acquire(1)
    assert limit.in_flight == 2 and limit.tokens_in_flight == 6000
    limit.release(4000)
    limit.release(2000)
    assert limit.try_acquire(50_000)          # alone, the heaviest request always fits
    assert not limit.try_acquire(1)
    limit.release(50_000)
    limit.release(7)                          # unmatched: counted, nothing goes below zero
    assert limit.tokens_in_flight == 0 and limit.in_flight == 0 and limit.unmatched_releases == 1
    assert json.loads(json.dumps(limit.to_dict()))["token_limit"] == 6000


def test_a_request_sent_without_room_is_counted_in_flight_and_released_as_any_other() -> None:
    limit = AdaptiveLimit(initial=2, window=4, clock=Clock())
    assert limit.try_acquire(100) and limit.try_acquire(100) and not limit.try_acquire(100)
    limit.acquire_over(300)                   # sent anyway (the gateway's queue admitted more than the limit)
    assert (limit.in_flight, limit.tokens_in_flight, limit.over_limit) == (3, 500, 1)
    assert not limit.has_room(0)
    for tokens in (100, 100, 300):
        limit.release(tokens)
    assert (limit.in_flight, limit.tokens_in_flight, limit.unmatched_releases) == (0, 0, 0)
    assert limit.to_dict()["over_limit"] == 1


class _KvBackend:
    """A backend bound by its KV cache: a step lasts ``base_gap_s`` times the larger of (tokens in flight /
    ``kv_tokens``) and (streams / 32), at least 1 (beyond its KV cache an engine queues or preempts: every
    stream waits longer). As many requests of ``weight`` tokens start before each step as the limit lets in;
    the limit is given their weight when ``tokens`` (else it counts requests only)."""

    def __init__(self, limit: AdaptiveLimit, clock: Clock, *, tokens: bool, kv_tokens: int = 16_000) -> None:
        self.limit, self.clock, self.tokens, self.kv_tokens = limit, clock, tokens, kv_tokens
        self.running: list[tuple[_Stream, int, int]] = []   # (stream, tokens given to the limit, its tokens)

    def run(self, steps: int, weight: int) -> list[tuple[int, float]]:
        """``steps`` steps of requests of ``weight`` tokens; after each the tokens in flight and the step."""
        out: list[tuple[int, float]] = []
        given = weight if self.tokens else 0
        for _ in range(steps):
            while self.limit.try_acquire(given):
                self.running.append((_Stream(self.clock.now), given, weight))
            in_flight = sum(w for _, _, w in self.running)
            step = 0.02 * max(1.0, in_flight / self.kv_tokens, len(self.running) / 32)
            self.clock.now += step
            still: list[tuple[_Stream, int, int]] = []
            for s, g, w in self.running:
                if s.ttft_s is None:
                    s.ttft_s = self.clock.now - s.start_s
                else:
                    s.gaps_s.append(step)
                if 1 + len(s.gaps_s) >= 16:
                    self.limit.release(g)
                    self.limit.observe(ttft_s=s.ttft_s, prompt_tokens=100, gaps_s=s.gaps_s)
                else:
                    still.append((s, g, w))
            self.running = still
            out.append((in_flight, step))
        return out


@pytest.mark.parametrize("tokens", [True, False])
def test_requests_ten_times_heavier_are_held_to_the_tokens_served_well_at_once(tokens: bool) -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=8, clock=clock)
    backend = _KvBackend(limit, clock, tokens=tokens)
    light = backend.run(3000, 200)
    proven = max(t for t, _ in light[-500:])
    cap = limit.token_limit
    heavy = backend.run(300, 2000)            # the same requests, ten times the tokens each
    most = max(t for t, _ in heavy)
    mean_step = sum(s for _, s in heavy) / len(heavy)
    if tokens:
        assert cap is not None and cap <= 3 * proven
        assert most <= cap                    # at once: within the token limit learned on the light requests
        assert mean_step <= 0.02 * 1.5 + 1e-9  # the streams never slowed beyond the tolerance
    else:                                     # counted in requests: the same count, ten times the tokens
        assert most >= 5 * proven
        assert mean_step > 0.02 * 1.5
    again = backend.run(3000, 200)            # light again: the limit climbs back
    assert max(t for t, _ in again[-500:]) >= 0.8 * proven


def test_a_window_over_tolerance_cuts_a_token_limit_it_reached_and_no_other() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=64, window=4, clock=clock)
    for _ in range(4):
        assert limit.try_acquire(1000)
    for _ in range(4):
        limit.release(1000)
        limit.observe(ttft_s=0.02, prompt_tokens=100, gaps_s=[0.02] * 15)
    assert limit.token_limit == 8000
    for _ in range(2):                        # slow, with 2000 of 8000 tokens in flight: not the token limit's doing
        assert limit.try_acquire(1000)
    for _ in range(2):
        limit.release(1000)
    for _ in range(4):
        limit.observe(ttft_s=0.02, prompt_tokens=100, gaps_s=[0.06] * 15)
    assert limit.gradient is not None and limit.gradient > limit.tolerance
    assert limit.token_limit == 8000
    for _ in range(8):                        # slow with the token limit reached: cut toward 8000 * 1.5 / 3
        assert limit.try_acquire(1000)
    for _ in range(8):
        limit.release(1000)
    for _ in range(4):
        limit.observe(ttft_s=0.02, prompt_tokens=100, gaps_s=[0.06] * 15)
    assert limit.token_limit == int(8000 + limit.smoothing * (8000 * 1.5 / 3 - 8000))


def _window(limit: AdaptiveLimit, requests: int, tokens: int, gap_s: float) -> None:
    """One window of ``limit.window`` finished requests, ``requests`` of ``tokens`` tokens in flight at once."""
    for _ in range(requests):
        assert limit.try_acquire(tokens)
    for _ in range(requests):
        limit.release(tokens)
    for _ in range(limit.window):
        limit.observe(ttft_s=0.02, prompt_tokens=100, gaps_s=[gap_s] * 15)


def test_after_the_slow_start_a_good_window_raises_the_token_limit_a_step_and_only_where_it_bound() -> None:
    limit = AdaptiveLimit(initial=64, window=4, clock=Clock())
    _window(limit, 4, 1000, 0.02)
    assert (limit.slow_start, limit.token_limit) == (True, 8000)
    _window(limit, 8, 1000, 0.06)              # over tolerance at the token limit: cut, the slow start ends
    cut = limit.token_limit
    assert limit.slow_start is False and cut is not None and cut < 8000
    _window(limit, 2, 1000, 0.02)              # good, far below the limit: no move (during the slow start: 2x)
    assert limit.token_limit == cut
    tokens = -(-cut // 4)                      # good with the limit reached (4 requests fill it): one step up,
    _window(limit, 4, tokens - 1, 0.02)        # not twice what was in flight
    assert limit.token_limit == int(cut * (1 + TOKEN_STEP))


# ---- the engine's own queue ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("waits", "grows"), [(0, True), (10, True), (11, False), (20, False)])
def test_a_window_mostly_finding_the_engines_queue_full_raises_neither_limit(waits: int, grows: bool) -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=4, window=20, clock=clock)
    for _ in range(4):
        assert limit.try_acquire(500)
    for i in range(20):             # within tolerance, with 4 of 4 in flight: a window that grows, but for the queue
        if i < 4:
            limit.release(500)
        limit.observe(ttft_s=0.02, prompt_tokens=100, gaps_s=[0.02] * 15, engine_waiting=3 if i < waits else 0)
    assert limit.updates == 1
    if grows:
        assert (limit.limit, limit.token_limit, limit.engine_full_windows) == (8, 4000, 0)
    else:
        assert (limit.limit, limit.token_limit, limit.engine_full_windows) == (4, None, 1)
    assert limit.to_dict()["engine_full_windows"] == limit.engine_full_windows


def test_requests_without_the_engines_queue_do_not_count_for_or_against_it() -> None:
    clock = Clock()
    limit = AdaptiveLimit(initial=4, window=20, clock=clock)
    for _ in range(4):
        assert limit.try_acquire()
    for i in range(20):             # 3 of the 5 that came with the engine's figures found a queue: the engine is full
        if i < 4:
            limit.release()
        waiting: float | None = None if i >= 5 else (2.0 if i < 3 else 0.0)
        limit.observe(ttft_s=0.02, prompt_tokens=100, gaps_s=[0.02] * 15, engine_waiting=waiting)
    assert (limit.limit, limit.engine_full_windows) == (4, 1)
    bad: list[object] = [-1.0, math.nan, math.inf, True, "3"]
    for i in range(20):             # not a queue: a window of them is not a full engine, and nothing raises
        limit.observe(ttft_s=0.02, prompt_tokens=100, gaps_s=[0.02] * 15,
                      engine_waiting=bad[i % len(bad)])  # type: ignore[arg-type]
    assert (limit.updates, limit.engine_full_windows) == (2, 1)


# ---- the output expected of a request -------------------------------------------------------------------------


def test_a_request_is_expected_to_generate_its_max_tokens_until_replies_say_less() -> None:
    from llmslo.gateway._concurrency import OutputEstimate

    est = OutputEstimate(window=100, quantile=0.9, min_samples=20)
    for n in range(19):
        est.observe(n)
    assert est.estimate is None and est.expected(4096) == 4096
    est.observe(19)                           # 0..19: the 18th of 20 is the 0.9 quantile
    assert est.estimate == 17 and est.expected(4096) == 17 and est.expected(10) == 10
    for bad in (-1, 2.5, True, None):         # not a count of tokens: ignored
        est.observe(bad)  # type: ignore[arg-type]
    assert len(est._recent) == 20
    for _ in range(100):                      # the window keeps the last 100: the estimate follows them
        est.observe(300)
    assert est.estimate == 300


@pytest.mark.parametrize(("kw", "field_name"), [({"window": 0}, "window"), ({"quantile": 0.0}, "quantile"),
                                                ({"quantile": 1.5}, "quantile"), ({"min_samples": 0}, "min_samples")])
def test_a_bad_output_estimate_is_refused_naming_the_field(kw: dict[str, object], field_name: str) -> None:
    from llmslo.gateway._concurrency import OutputEstimate

    with pytest.raises(ConfigurationError, match=f"OutputEstimate.{field_name}"):
        OutputEstimate(**kw)  # type: ignore[arg-type]
