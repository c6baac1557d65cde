"""Load shedding (queue length, recent p99 latency, GPU utilisation), lowest priority first, degrading first."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.controls import AdmissionQueue, LoadShedder, RetryAfterEstimator, ShedVerdict, queue_shed_levels
from llmslo.telemetry import SHED_SIGNALS, ConfigurationError, Telemetry

CLASSES = ("interactive", "batch")


class FakeClock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


class Gpu:
    """A utilisation reader that counts its readings."""

    def __init__(self, value: object) -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> float | None:
        self.calls += 1
        if isinstance(self.value, Exception):
            raise self.value
        return self.value  # type: ignore[return-value]


# ---- configuration ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kw", "message"), [
    ({"queue_levels": {"gold": 0.5}}, "LoadShedder.queue_levels: unknown class 'gold'; the classes are"),
    ({"queue_levels": {"interactive": 0.4, "batch": 0.5}},
     "LoadShedder.queue_levels['interactive']: a higher-priority class must not be shed before a lower one"),
    ({"queue_levels": {"interactive": 0.5}},  # batch without a level would never be shed by the queue
     "LoadShedder.queue_levels['interactive']: a higher-priority class must not be shed before a lower one"),
    ({"queue_levels": {"batch": 1.5}}, "LoadShedder.queue_levels['batch']: must be a finite number in (0, 1]"),
    ({"latency_levels_s": {"batch": -1.0}}, "LoadShedder.latency_levels_s['batch']: must be a finite number > 0"),
    ({"gpu_levels": {"batch": 0.9}}, "LoadShedder.gpu: gpu_levels are set but no gpu reader is given"),
    ({"degrade": [("a", 0.8), ("b", 0.5)]}, "LoadShedder.degrade['b']: stages must be in increasing order"),
    ({"degrade": [("a", 1.0)]}, "LoadShedder.degrade['a']: the fraction must be in (0, 1), got 1.0"),
    ({"degrade": ["cap"]}, "LoadShedder.degrade: each stage must be (action name, fraction)"),
    ({"latency_window": 0}, "LoadShedder.latency_window: must be an integer >= 1, got 0"),
    ({"latency_min_samples": 0}, "LoadShedder.latency_min_samples: must be an integer in [1, latency_window]"),
    ({"refresh_s": 0}, "LoadShedder.refresh_s: must be a finite number > 0 seconds, got 0"),
    ({"classes": "interactive"}, "LoadShedder.classes: must be a non-empty sequence of class names"),
])
def test_bad_configuration_raises_naming_the_field(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        LoadShedder(**kw)  # type: ignore[arg-type]
    assert str(err.value).startswith(message)


# ---- signals ---------------------------------------------------------------------------------------------

def test_the_queue_signal_sheds_batch_before_interactive_and_degrades_before_shedding() -> None:
    s = LoadShedder(queue_levels={"interactive": 1.0, "batch": 0.5}, degrade=[("cap_max_tokens", 0.8)])
    assert s.assess("batch", 0.3) == ShedVerdict(False)
    degraded = s.assess("batch", 0.42)
    assert not degraded.shed and degraded.actions == ("cap_max_tokens",) and degraded.signal == "queue"
    assert s.assess("batch", 0.5).shed and s.assess("batch", 0.5).signal == "queue"
    assert s.assess("interactive", 0.5) == ShedVerdict(False)
    assert s.assess("interactive", 0.85).actions == ("cap_max_tokens",)
    assert s.assess("interactive", 1.0).shed


def test_stages_apply_in_order_as_pressure_rises() -> None:
    s = LoadShedder(queue_levels={"interactive": 1.0, "batch": 1.0},
                    degrade=[("truncate_input", 0.5), ("cap_max_tokens", 0.7), ("lighter_model", 0.9)])
    assert [s.assess("batch", q).actions for q in (0.4, 0.6, 0.8, 0.95)] == [
        (), ("truncate_input",), ("truncate_input", "cap_max_tokens"),
        ("truncate_input", "cap_max_tokens", "lighter_model")]
    assert s.assess("batch", 1.0) == ShedVerdict(True, "queue", (), 1.0)


def test_queue_shed_levels_rise_evenly_from_the_lowest_class_to_a_full_queue() -> None:
    levels = queue_shed_levels(("gold", "silver", "bronze"), 0.4)
    assert levels == pytest.approx({"gold": 1.0, "silver": 0.7, "bronze": 0.4})
    assert list(levels) == ["gold", "silver", "bronze"]
    assert queue_shed_levels(("only",), 0.6) == {"only": 0.6}  # a class alone is the lowest one
    s = LoadShedder(queue_levels=queue_shed_levels(CLASSES, 0.5))
    assert s.assess("batch", 0.5).shed and not s.assess("interactive", 0.99).shed


def test_an_unknown_class_is_shed_as_the_lowest() -> None:
    s = LoadShedder(queue_levels={"interactive": 1.0, "batch": 0.5})
    assert s.assess("nobody-knows", 0.5).shed
    assert s.assess(None, 0.5).shed  # type: ignore[arg-type]


def test_the_latency_signal_uses_the_p99_of_recent_samples() -> None:
    clock = FakeClock()
    s = LoadShedder(latency_levels_s={"interactive": 10.0, "batch": 2.0}, latency_min_samples=100, clock=clock)
    for i in range(99):
        s.observe_latency(1.0 + i / 100)  # 1.00 .. 1.98
    assert s.p99_s() is None and not s.assess("batch").shed  # too few samples to trust
    clock.t += 1.0
    s.observe_latency(5.0)  # one slow request of 100: the p99 (nearest rank) is the 99th, 1.98
    assert s.p99_s() == pytest.approx(1.98)
    assert not s.assess("batch").shed
    s.observe_latency(6.0)
    clock.t += 1.0
    assert s.p99_s() == 5.0  # 101 samples: rank ceil(99.99) = 100
    verdict = s.assess("batch")
    assert verdict.shed and verdict.signal == "latency"
    assert not s.assess("interactive").shed


def test_old_latencies_age_out_so_shedding_recovers() -> None:
    clock = FakeClock()
    s = LoadShedder(latency_levels_s={"interactive": 10.0, "batch": 2.0}, latency_min_samples=5,
                    latency_max_age_s=30.0, clock=clock)
    for _ in range(10):
        s.observe_latency(9.0)
    assert s.assess("batch").shed
    clock.t += 31.0  # shed requests report no latency: only ageing lets the signal fall
    assert s.p99_s() is None and not s.assess("batch").shed


def test_the_p99_is_recomputed_at_most_every_refresh_interval() -> None:
    clock = FakeClock()
    s = LoadShedder(latency_levels_s={"interactive": 10.0, "batch": 2.0}, latency_min_samples=1,
                    refresh_s=5.0, clock=clock)
    s.observe_latency(1.0)
    assert s.p99_s() == 1.0
    s.observe_latency(3.0)
    assert s.p99_s() == 1.0
    clock.t += 5.0
    assert s.p99_s() == 3.0


def test_bad_latencies_are_ignored() -> None:
    s = LoadShedder(latency_levels_s={"interactive": 10.0, "batch": 2.0}, latency_min_samples=1)
    for bad in (float("nan"), -1.0, float("inf"), "3"):
        s.observe_latency(bad)  # type: ignore[arg-type]
    assert s.p99_s() is None


def test_the_gpu_signal_sheds_by_utilisation_and_is_read_at_most_every_refresh() -> None:
    clock = FakeClock()
    gpu = Gpu(0.95)
    s = LoadShedder(gpu_levels={"interactive": 1.0, "batch": 0.9}, gpu=gpu, refresh_s=2.0, clock=clock)
    assert s.assess("batch") == ShedVerdict(True, "gpu", (), pytest.approx(0.95 / 0.9))  # type: ignore[arg-type]
    assert not s.assess("interactive").shed
    assert gpu.calls == 1
    gpu.value = 0.5
    clock.t += 1.0
    assert s.assess("batch").shed and gpu.calls == 1
    clock.t += 1.0
    assert not s.assess("batch").shed and gpu.calls == 2


@pytest.mark.parametrize("reading", [None, float("nan"), 1.5, -0.1, "0.99", True])
def test_a_missing_or_impossible_gpu_reading_is_ignored(reading: object) -> None:
    s = LoadShedder(gpu_levels={"interactive": 1.0, "batch": 0.5}, gpu=Gpu(reading))
    assert s.gpu_utilisation() is None and not s.assess("batch").shed


def test_a_failing_gpu_reader_is_counted_and_ignored() -> None:
    tel = Telemetry(version="v1")
    s = LoadShedder(gpu_levels={"interactive": 1.0, "batch": 0.5}, gpu=Gpu(RuntimeError("nvml gone")),
                    telemetry=tel)
    assert not s.assess("batch").shed
    assert tel.metrics.value("internal_errors") == 1


def test_the_strongest_signal_names_the_shed() -> None:
    clock = FakeClock()
    s = LoadShedder(queue_levels={"interactive": 1.0, "batch": 0.5}, gpu_levels={"interactive": 1.0, "batch": 0.5},
                    gpu=Gpu(0.9), clock=clock)
    assert s.assess("batch", 0.6).signal == "gpu"
    assert s.assess("batch", 0.95).signal == "queue"
    assert set(SHED_SIGNALS) == {"queue", "latency", "gpu"}


def test_standalone_reports_count_shed_and_degraded() -> None:
    tel = Telemetry(version="v1")
    s = LoadShedder(queue_levels={"interactive": 1.0, "batch": 0.5}, telemetry=tel)
    s.report_shed("m", "queue", "unknown-class")
    s.report_degraded("m", "cap_max_tokens")
    assert tel.metrics.value("shed_requests", model="m", signal="queue", tenant_class="batch") == 1
    assert tel.metrics.value("degraded_requests", model="m", action="cap_max_tokens") == 1


def test_the_queue_sheds_by_latency_at_the_door() -> None:
    tel = Telemetry(version="v1")
    clock = FakeClock()
    shedder = LoadShedder(latency_levels_s={"interactive": 10.0, "batch": 2.0}, latency_min_samples=1, clock=clock)
    q = AdmissionQueue("m", capacity=4, concurrency=4, shedder=shedder, telemetry=tel, clock=clock,
                       retry_after=RetryAfterEstimator(jitter=0.0, clock=clock))
    shedder.observe_latency(3.0)

    async def main() -> None:
        b = tel.start("b", model="m", tenant_class="batch")
        d = await q.acquire(b)
        assert not d.admitted and d.reason == "queue_full" and d.http_status == 429
        assert d.retry_after_s == q.retry_after.fallback_s
        assert b.reject_reason == "queue_full" and b.admitted_ns is None
        i = tel.start("i", model="m", tenant_class="interactive")
        assert (await q.acquire(i)).admitted
        i.finish("stop")

    asyncio.run(main())
    assert tel.metrics.value("shed_requests", model="m", signal="latency", tenant_class="batch") == 1
    assert tel.metrics.value("retry_after", model="m", reject_reason="queue_full") == 1
    assert (q.depth, q.running) == (0, 0)


# ---- property --------------------------------------------------------------------------------------------

LEVEL = st.floats(0.05, 1.0)
READING = st.one_of(st.none(), st.floats(0.0, 3.0))


@st.composite
def monotone_levels(draw: st.DrawFn, upper: float) -> dict[str, float]:
    """A level per class with interactive's at least batch's (or a missing one meaning 'never')."""
    batch = draw(LEVEL) * upper
    interactive = batch + draw(st.floats(0.0, 1.0)) * (upper - batch)
    out = {"batch": batch}
    if draw(st.booleans()):
        out["interactive"] = interactive
    return out


@settings(max_examples=300, deadline=None)
@given(queue=monotone_levels(1.0), latency=monotone_levels(20.0), q=READING, p99=READING, gpu=READING,
       stages=st.lists(st.floats(0.05, 0.95), max_size=3))
def test_interactive_is_never_shed_or_degraded_more_than_batch_under_the_same_signals(
        queue: dict[str, float], latency: dict[str, float], q: float | None, p99: float | None,
        gpu: float | None, stages: list[float]) -> None:
    degrade = [(f"stage{k}", at) for k, at in enumerate(sorted(stages))]
    s = LoadShedder(queue_levels=queue, latency_levels_s=latency, gpu_levels={"batch": 0.5}, gpu=lambda: None,
                    degrade=degrade)
    values = [("queue", q), ("latency", None if p99 is None else p99 * 10), ("gpu", gpu)]
    hi, lo = s.verdict(0, values), s.verdict(1, values)
    if hi.shed:
        assert lo.shed
    if not lo.shed:
        assert set(hi.actions) <= set(lo.actions)
    assert hi.pressure <= lo.pressure or math.isclose(hi.pressure, lo.pressure)
