"""Open-loop schedules: Poisson and gamma arrivals at their rate and coefficient of variation (seeded), the ramp
and the burst, trace replay (the real Azure and Mooncake traces when present), and the specs' errors."""

from __future__ import annotations

import itertools
import math
import os
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.loadgen import (
    Burst,
    LengthSpec,
    RateProfile,
    SpecError,
    synthetic_schedule,
    trace_schedule,
)

REAL = Path(os.environ.get("LLMSLO_REAL_DATA", Path(__file__).resolve().parents[2] / "shared" / "real_data"))
AZURE = REAL / "azure" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = REAL / "mooncake" / "conversation_trace.jsonl"


def _gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *offsets[:-1]], offsets, strict=True)]


def _count(offsets: list[float], lo: float, hi: float) -> int:
    return sum(1 for t in offsets if lo <= t < hi)


# ---- rate and burstiness within statistical bounds ---------------------------------------------------------

N = 20_000
RATE = 50.0


@pytest.mark.parametrize(("kind", "cv"), [("poisson", 1.0), ("gamma", 2.0), ("gamma", 0.5)])
def test_arrivals_have_the_rate_and_coefficient_of_variation_asked_for(kind: str, cv: float) -> None:
    """Mean gap within 5 standard errors of 1/rate; the gaps' CV within 5 (delta-method) standard errors."""
    s = synthetic_schedule(rate_per_s=RATE, arrivals=kind, cv=cv, max_requests=N, seed=7)
    gaps = _gaps([a.offset_s for a in s])
    assert len(gaps) == N
    mean = statistics.fmean(gaps)
    rate_se = cv / math.sqrt(N)  # relative standard error of the mean gap
    assert abs(1.0 / mean / RATE - 1.0) <= 5 * rate_se
    shape = 1.0 / cv**2  # gamma gaps: Var(s) ~ theta^2 (2k + 6) / 4n, so SE(cv) ~ sqrt((2k + 6) / 4n) / k
    cv_se = math.sqrt((2 * shape + 6) / (4 * N)) / shape
    assert abs(statistics.pstdev(gaps) / mean - cv) <= 5 * cv_se


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    def offsets(seed: int) -> list[float]:
        return [a.offset_s for a in synthetic_schedule(rate_per_s=10, max_requests=50, seed=seed)]

    assert offsets(3) == offsets(3)
    assert offsets(3) != offsets(4)


def test_lengths_come_from_their_own_stream_so_they_move_no_arrival() -> None:
    a = synthetic_schedule(rate_per_s=10, max_requests=200, seed=1, prompt=LengthSpec(10, 10))
    b = synthetic_schedule(rate_per_s=10, max_requests=200, seed=1, prompt=LengthSpec(5, 500),
                           output=LengthSpec(1, 64))
    assert [x.offset_s for x in a] == [x.offset_s for x in b]
    assert {x.prompt_tokens for x in a} == {10}
    assert all(5 <= x.prompt_tokens <= 500 and 1 <= x.output_tokens <= 64 for x in b)
    assert len({x.prompt_tokens for x in b}) > 50


def test_duration_and_max_requests_end_a_synthetic_schedule() -> None:
    s = synthetic_schedule(rate_per_s=100, duration_s=5.0, seed=2)
    assert s.arrivals and s.span_s <= 5.0
    assert abs(len(s) - 500) <= 5 * math.sqrt(500)
    assert len(synthetic_schedule(rate_per_s=100, duration_s=5.0, max_requests=30, seed=2)) == 30
    with pytest.raises(SpecError, match="--duration"):
        synthetic_schedule(rate_per_s=100)


# ---- ramp and burst ----------------------------------------------------------------------------------------


def test_a_ramp_rises_linearly_to_the_rate() -> None:
    """Rate r t / R on [0, R): a quarter of the ramp's arrivals in its first half, three quarters in the second
    (Poisson counts, 5 sigma); the full rate after it."""
    r, ramp = 200.0, 20.0
    s = synthetic_schedule(rate_per_s=r, duration_s=30.0, profile=RateProfile(ramp_s=ramp), seed=3)
    t = [a.offset_s for a in s]
    for lo, hi, expected in ((0, ramp / 2, r * ramp / 8), (ramp / 2, ramp, 3 * r * ramp / 8), (ramp, 30, r * 10)):
        assert abs(_count(t, lo, hi) - expected) <= 5 * math.sqrt(expected), (lo, hi)


def test_a_burst_multiplies_the_rate_inside_its_window_only() -> None:
    r = 100.0
    s = synthetic_schedule(rate_per_s=r, duration_s=30.0, profile=RateProfile(bursts=(Burst.parse("3x@10s+5s"),)),
                           seed=4)
    t = [a.offset_s for a in s]
    for lo, hi, expected in ((0, 10, r * 10), (10, 15, 3 * r * 5), (15, 30, r * 15)):
        assert abs(_count(t, lo, hi) - expected) <= 5 * math.sqrt(expected), (lo, hi)


def test_a_burst_divides_a_traces_gaps_by_its_factor_there() -> None:
    offsets = [float(i) for i in range(101)]  # one arrival a second
    s = trace_schedule(offsets, [1] * 101, [1] * 101, source="uniform",
                       profile=RateProfile(bursts=(Burst(2.0, 20.0, 10.0),)))
    t = [a.offset_s for a in s]
    assert t[:21] == offsets[:21]                                       # before: untouched
    assert t[20:41] == pytest.approx([20 + i / 2 for i in range(21)])    # 20 trace seconds in 10 s
    assert t[41:] == pytest.approx([o - 10 for o in offsets[41:]])       # after: shifted by what it saved


PROFILES = st.builds(
    RateProfile,
    st.one_of(st.none(), st.floats(0.5, 50)),
    st.lists(st.builds(Burst, st.floats(0.1, 10), st.floats(0, 100), st.floats(0.5, 30)), max_size=3).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(PROFILES, st.floats(0, 150))
def test_warp_inverts_the_integral_of_the_multiplier(profile: RateProfile, t: float) -> None:
    """The multiplier is constant or linear between its breakpoints, so the midpoint rule on each piece is
    exact: an integral computed apart from the profile's own segments."""
    cuts = {0.0, t, *(x for b in profile.bursts for x in (b.start_s, b.end_s) if x < t)}
    if profile.ramp_s is not None and profile.ramp_s < t:
        cuts.add(profile.ramp_s)
    points = sorted(cuts)
    u = math.fsum((b - a) * profile.multiplier((a + b) / 2) for a, b in itertools.pairwise(points))
    assert profile.warp(u) == pytest.approx(t, rel=1e-9, abs=1e-9)


# ---- trace replay ------------------------------------------------------------------------------------------


def _read(kind: str, path: Path) -> tuple[list[float], list[int], list[int]]:
    if not path.is_file():
        pytest.skip(f"real data missing: {path} (see ../shared/real_data/README.md)")
    from llmslo.analysis.workload import read_trace

    frame, _ = read_trace(kind, path)
    return frame["offset_s"].to_list(), frame["input_tokens"].to_list(), frame["output_tokens"].to_list()


@pytest.mark.parametrize(("kind", "path"), [("azure", AZURE), ("mooncake", MOONCAKE)])
def test_a_real_trace_is_replayed_as_recorded(kind: str, path: Path) -> None:
    offsets, prompts, outputs = _read(kind, path)
    s = trace_schedule(offsets, prompts, outputs, source=kind)
    assert len(s) == len(offsets)
    assert [a.offset_s for a in s] == offsets
    assert [a.prompt_tokens for a in s] == [max(1, p) for p in prompts]
    assert [a.output_tokens for a in s] == [max(1, o) for o in outputs]
    raised = sum(1 for p in prompts if p < 1) + sum(1 for o in outputs if o < 1)
    assert bool(s.notes) == bool(raised)


@pytest.mark.parametrize(("kind", "path"), [("azure", AZURE), ("mooncake", MOONCAKE)])
def test_a_real_trace_in_a_burst_packs_factor_times_its_arrivals(kind: str, path: Path) -> None:
    """The run's window [60 s, 90 s) of a 3x burst holds exactly the trace's arrivals of [60 s, 150 s)."""
    offsets, prompts, outputs = _read(kind, path)
    s = trace_schedule(offsets, prompts, outputs, source=kind, duration_s=300.0,
                       profile=RateProfile(bursts=(Burst.parse("3x@60s+30s"),)))
    t = [a.offset_s for a in s]
    assert _count(t, 60.0, 90.0) == _count(offsets, 60.0, 150.0)
    assert _count(t, 0.0, 60.0) == _count(offsets, 0.0, 60.0)
    assert max(t) <= 300.0
    assert len(s) == _count(offsets, 0.0, 360.0) + sum(1 for o in offsets if o == 360.0)


def test_a_trace_can_be_cut_and_its_lengths_replaced() -> None:
    offsets = [0.0, 0.5, 1.0, 2.0, 3.0]
    s = trace_schedule(offsets, [5, 0, 7, 8, 9], [0, 3, 4, 5, 6], source="t", duration_s=1.5)
    assert [a.offset_s for a in s] == [0.0, 0.5, 1.0]
    assert [(a.prompt_tokens, a.output_tokens) for a in s] == [(5, 1), (1, 3), (7, 4)]
    assert len(s.notes) == 2 and all("sent as 1 token" in n for n in s.notes)
    s = trace_schedule(offsets, [5] * 5, [5] * 5, source="t", max_requests=2, output=LengthSpec(9, 9))
    assert [a.output_tokens for a in s] == [9, 9]
    with pytest.raises(ValueError, match="row 1"):
        trace_schedule([0.0, -1.0], [1, 1], [1, 1], source="t")


# ---- bad specifications name the flag and show the accepted form ------------------------------------------


@pytest.mark.parametrize(("parse", "text", "flag"), [
    (lambda t: LengthSpec.parse("--prompt-tokens", t), "0", "--prompt-tokens"),
    (lambda t: LengthSpec.parse("--output-tokens", t), "64-8", "--output-tokens"),
    (lambda t: LengthSpec.parse("--output-tokens", t), "many", "--output-tokens"),
    (Burst.parse, "3x60s+30s", "--burst"),
    (Burst.parse, "0x@60s+30s", "--burst"),
    (Burst.parse, "3x@60s+0s", "--burst"),
    (Burst.parse, "3x@soon+30s", "--burst"),
])
def test_a_bad_spec_names_its_flag_and_the_accepted_form(parse: object, text: str, flag: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse(text)  # type: ignore[operator]
    message = str(caught.value)
    assert message.startswith(flag) and "accepted form" in message and repr(text) in message


@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"rate_per_s": 0.0, "max_requests": 5}, "--rate"),
    ({"rate_per_s": float("inf"), "max_requests": 5}, "--rate"),
    ({"rate_per_s": 5.0, "max_requests": 0}, "--max-requests"),
    ({"rate_per_s": 5.0, "duration_s": -1.0}, "--duration"),
    ({"rate_per_s": 5.0, "max_requests": 5, "arrivals": "uniform"}, "--arrivals"),
    ({"rate_per_s": 5.0, "max_requests": 5, "arrivals": "gamma", "cv": 0.0}, "--burstiness"),
    ({"rate_per_s": 5.0, "max_requests": 5, "cv": 2.0}, "--burstiness"),
])
def test_a_bad_synthetic_spec_names_its_flag(kwargs: dict[str, object], flag: str) -> None:
    with pytest.raises(SpecError, match=rf"^{flag}"):
        synthetic_schedule(**kwargs)  # type: ignore[arg-type]


def test_a_ramp_must_be_positive() -> None:
    with pytest.raises(SpecError, match=r"^--ramp"):
        RateProfile(ramp_s=0.0)
