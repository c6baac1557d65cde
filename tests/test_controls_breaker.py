"""The circuit breaker: trips on a streak or on k bad windows, open refuses, half-open lets a bounded number
of probes through (threads and asyncio too), honours Retry-After, audits and reports every change."""

from __future__ import annotations

import asyncio
import itertools
import threading
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.controls import (
    DEFAULT_FAILURE_KINDS,
    RETRY_AFTER_MAX_S,
    CircuitBreaker,
    classify_exception,
    classify_status,
)
from llmslo.telemetry import ConfigurationError, Telemetry


class Clock:
    """Monotonic seconds moved by hand."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A telemetry stand-in that records what the breaker reports."""

    def __init__(self) -> None:
        self.states: list[tuple[str, str]] = []
        self.transitions: list[tuple[str, str, str]] = []

    def set_breaker_state(self, breaker: str, state: str) -> None:
        self.states.append((breaker, state))

    def count_breaker_transition(self, breaker: str, from_state: str, to_state: str) -> None:
        self.transitions.append((breaker, from_state, to_state))


def streak_breaker(clock: Clock, **kw: object) -> CircuitBreaker:
    """A breaker that trips on a streak of 3 only (no rate), open 10 s."""
    kw.setdefault("consecutive_failures", 3)
    kw.setdefault("error_rate", None)
    kw.setdefault("open_s", 10.0)
    return CircuitBreaker("engine", clock=clock, **kw)  # type: ignore[arg-type]


def rate_breaker(clock: Clock, **kw: object) -> CircuitBreaker:
    """The documents' example: above 60 % for 3 windows (10 s, at least 5 requests), no streak rule."""
    kw.setdefault("consecutive_failures", None)
    return CircuitBreaker("engine", error_rate=0.6, windows=3, window_s=10.0, min_requests=5, clock=clock,
                          **kw)  # type: ignore[arg-type]


def fill_window(b: CircuitBreaker, clock: Clock, failed: int, ok: int) -> None:
    """Record ``failed`` failures and ``ok`` successes inside the current window, then move to the next one."""
    start = clock.now
    for _ in range(failed):
        b.record_failure("5xx")
    for _ in range(ok):
        b.record_success()
    clock.now = start + 10.0


def trip(b: CircuitBreaker) -> None:
    while b.state != "open":
        b.record(False)


# ---- tripping --------------------------------------------------------------------------------------------


def test_it_trips_on_n_consecutive_failures_and_a_success_resets_the_streak() -> None:
    clock = Clock()
    b = streak_breaker(clock)
    b.record(False)
    b.record(False)
    b.record(True)  # breaks the streak
    b.record(False)
    assert b.record(False) is None and b.state == "closed"
    event = b.record(False)
    assert event is not None and (event.from_state, event.to_state) == ("closed", "open")
    assert "3 consecutive failures" in event.why and b.state == "open"


def test_it_trips_on_an_error_rate_above_the_threshold_for_k_consecutive_windows() -> None:
    clock = Clock()
    b = rate_breaker(clock)
    b.record_success()  # opens the first window at 100 s
    clock.now = 110.0
    for _ in range(2):
        fill_window(b, clock, failed=4, ok=1)  # 80 %
        assert b.state == "closed"
    fill_window(b, clock, failed=4, ok=1)  # the third bad window ends: trips
    assert b.state == "open"
    assert "error rate above 0.6 for 3 consecutive windows" in b.events()[-1].why


def test_a_window_at_the_threshold_or_below_breaks_the_streak() -> None:
    clock = Clock()
    b = rate_breaker(clock)
    b.record_success()
    clock.now = 110.0
    fill_window(b, clock, failed=4, ok=1)
    fill_window(b, clock, failed=4, ok=1)
    fill_window(b, clock, failed=3, ok=2)  # exactly 60 %: not above
    fill_window(b, clock, failed=4, ok=1)
    fill_window(b, clock, failed=4, ok=1)
    assert b.state == "closed"
    fill_window(b, clock, failed=4, ok=1)
    assert b.state == "open"


def test_a_quiet_window_is_not_judged_so_one_failure_in_it_never_trips() -> None:
    clock = Clock()
    b = rate_breaker(clock)
    b.record_success()
    clock.now = 110.0
    for _ in range(6):
        fill_window(b, clock, failed=1, ok=0)  # 100 % of one request: under min_requests
    assert b.state == "closed"
    fill_window(b, clock, failed=4, ok=1)
    fill_window(b, clock, failed=4, ok=1)
    fill_window(b, clock, failed=1, ok=0)  # quiet: breaks the streak of bad windows
    fill_window(b, clock, failed=4, ok=1)
    fill_window(b, clock, failed=4, ok=1)
    assert b.state == "closed"


def test_windows_without_any_traffic_break_the_streak() -> None:
    clock = Clock()
    b = rate_breaker(clock)
    b.record_success()
    clock.now = 110.0
    fill_window(b, clock, failed=5, ok=0)
    fill_window(b, clock, failed=5, ok=0)
    clock.now += 30.0  # three windows with nothing in them
    fill_window(b, clock, failed=5, ok=0)
    fill_window(b, clock, failed=5, ok=0)
    assert b.state == "closed"


# ---- open and half-open ----------------------------------------------------------------------------------


def test_open_refuses_circuit_open_with_the_time_until_half_open() -> None:
    clock = Clock()
    b = streak_breaker(clock)
    trip(b)
    clock.now += 4.0
    d = b.allow()
    assert not d.admitted and d.reason == "circuit_open" and d.http_status == 503
    assert d.retry_after_s == pytest.approx(6.0) and d.retry_after_header == "6"
    clock.now += 6.0
    assert b.allow().admitted and b.state == "half_open"


def test_half_open_lets_exactly_the_probes_through_and_closes_when_all_succeed() -> None:
    clock = Clock()
    b = streak_breaker(clock, half_open_probes=3)
    trip(b)
    clock.now += 10.0
    decisions = [b.allow() for _ in range(5)]
    assert [d.admitted for d in decisions] == [True, True, True, False, False]
    assert decisions[-1].reason == "circuit_open"
    assert b.record_success() is None and b.record_success() is None
    event = b.record_success()
    assert event is not None and (event.from_state, event.to_state) == ("half_open", "closed")
    assert b.allow().admitted


def test_one_failed_probe_opens_the_breaker_again_for_open_s() -> None:
    clock = Clock()
    b = streak_breaker(clock, half_open_probes=2)
    trip(b)
    clock.now += 10.0
    assert b.allow().admitted and b.allow().admitted
    b.record_success()
    event = b.record_failure("timeout")
    assert event is not None and (event.from_state, event.to_state) == ("half_open", "open")
    d = b.allow()
    assert not d.admitted and d.retry_after_s == pytest.approx(10.0)


def test_a_probe_that_never_reports_counts_as_failed_after_the_probe_timeout() -> None:
    clock = Clock()
    b = streak_breaker(clock, probe_timeout_s=5.0)
    trip(b)
    clock.now += 10.0
    assert b.allow().admitted
    clock.now += 2.0
    d = b.allow()
    assert not d.admitted and d.retry_after_s == pytest.approx(3.0)
    clock.now += 3.0
    assert b.state == "open" and "no probe outcome within 5 s" in b.events()[-1].why


def test_half_open_without_traffic_waits_for_a_probe_however_long() -> None:
    clock = Clock()
    b = streak_breaker(clock, probe_timeout_s=5.0)
    trip(b)
    clock.now += 1000.0
    assert b.state == "half_open" and b.allow().admitted


def test_outcomes_reported_half_open_with_no_probe_out_are_ignored_and_counted() -> None:
    clock = Clock()
    b = streak_breaker(clock, half_open_probes=1)
    trip(b)
    clock.now += 10.0
    assert b.state == "half_open"
    b.record_success()  # a request let through before the trip, reporting late
    assert b.ignored_outcomes == 1 and b.state == "half_open"


def test_outcomes_reported_while_open_change_nothing() -> None:
    clock = Clock()
    b = streak_breaker(clock)
    trip(b)
    n = len(b.events())
    for _ in range(10):
        b.record(True)
    assert b.state == "open" and len(b.events()) == n


# ---- what counts as a failure ----------------------------------------------------------------------------


def test_only_the_configured_kinds_count_as_failures() -> None:
    clock = Clock()
    b = streak_breaker(clock)
    for _ in range(5):
        b.record_failure("4xx")  # the client's fault, not the upstream's
        b.record_status(404)
        b.record_status(200)
        b.record_exception(ValueError("bad input"))
    assert b.state == "closed"
    b.record_status(503)
    b.record_exception(TimeoutError())
    b.record_exception(MemoryError())
    assert b.state == "open"
    assert {"5xx", "timeout", "oom"} == DEFAULT_FAILURE_KINDS


def test_failure_kinds_are_configurable() -> None:
    clock = Clock()
    b = streak_breaker(clock, failure_kinds={"exception"})
    for _ in range(3):
        b.record_status(500)
    assert b.state == "closed"
    for _ in range(3):
        b.record_exception(RuntimeError("engine crashed"))
    assert b.state == "open"


class OutOfMemoryError(RuntimeError):
    """Named as CUDA's."""


class ReadTimeout(Exception):
    """Named as an HTTP client's."""


@pytest.mark.parametrize(("exc", "kind"), [
    (TimeoutError(), "timeout"), (ReadTimeout(), "timeout"),
    (MemoryError(), "oom"), (OutOfMemoryError(), "oom"), (KeyError("x"), "exception"),
])
def test_exceptions_are_classified_by_class(exc: BaseException, kind: str) -> None:
    assert classify_exception(exc) == kind


@pytest.mark.parametrize(("status", "kind"), [(500, "5xx"), (599, "5xx"), (429, "4xx"), (200, None),
                                              (302, None), (600, None), (True, None), ("500", None)])
def test_statuses_are_classified_by_class(status: object, kind: str | None) -> None:
    assert classify_status(status) == kind  # type: ignore[arg-type]


# ---- the client side: Retry-After ------------------------------------------------------------------------


def test_a_honoured_retry_after_refuses_until_it_passed() -> None:
    clock = Clock()
    b = streak_breaker(clock)
    assert b.honour_retry_after(7)
    d = b.allow()
    assert not d.admitted and d.reason == "circuit_open" and d.retry_after_s == pytest.approx(7.0)
    assert b.honour_retry_after("2")  # a shorter one never shortens the wait
    clock.now += 7.0
    assert b.allow().admitted and b.state == "closed"


def test_retry_after_as_an_http_date_is_read_on_the_wall_clock() -> None:
    clock = Clock()
    wall = 1_700_000_000.0
    b = streak_breaker(clock, wall_clock=lambda: wall)
    header = format_datetime(datetime.fromtimestamp(wall + 30, tz=UTC), usegmt=True)
    assert b.honour_retry_after(header)
    assert b.allow().retry_after_s == pytest.approx(30.0)


@pytest.mark.parametrize("value", ["soon", "-5", "", "1e999", "x" * 10_000, float("nan"), -1.0, float("inf"),
                                   True, None, b"5"])
def test_an_unreadable_retry_after_is_ignored_never_raised(value: object) -> None:
    b = streak_breaker(Clock())
    assert b.honour_retry_after(value) is False  # type: ignore[arg-type]
    assert b.allow().admitted


def test_a_huge_retry_after_is_capped() -> None:
    b = streak_breaker(Clock())
    assert b.honour_retry_after(10**12)
    assert b.allow().retry_after_s == pytest.approx(RETRY_AFTER_MAX_S)


# ---- audit and telemetry ---------------------------------------------------------------------------------


def test_state_changes_are_audit_events_kept_in_a_bounded_list() -> None:
    clock = Clock()
    b = streak_breaker(clock, audit_size=4, half_open_probes=1)
    for _ in range(3):
        trip(b)
        clock.now += 10.0
        assert b.allow().admitted
        b.record_success()
    events = b.events()
    assert len(events) == 4  # 9 changes, the last 4 kept
    assert [(e.from_state, e.to_state) for e in events] == [
        ("half_open", "closed"), ("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    assert events[2].time_s == events[1].time_s + 10.0
    assert events[-1].to_dict()["why"] == "all 1 half-open probes succeeded"


def test_every_change_is_reported_as_state_and_transition() -> None:
    clock = Clock()
    rec = Recorder()
    b = streak_breaker(clock, telemetry=rec)
    trip(b)
    clock.now += 10.0
    b.allow()
    b.record_success()
    assert rec.states == [("engine", s) for s in ("closed", "open", "half_open", "closed")]
    assert rec.transitions == [("engine", "closed", "open"), ("engine", "open", "half_open"),
                               ("engine", "half_open", "closed")]


def test_a_reporter_that_raises_never_reaches_the_caller() -> None:
    class Broken(Recorder):
        def count_breaker_transition(self, breaker: str, from_state: str, to_state: str) -> None:
            raise RuntimeError("exporter down")

    b = streak_breaker(Clock(), telemetry=Broken())
    trip(b)
    assert b.state == "open" and b.report_errors == 1


def test_the_real_telemetry_exposes_state_and_transitions() -> None:
    tel = Telemetry()
    clock = Clock()
    b = streak_breaker(clock, telemetry=tel)
    trip(b)

    def sample(name: str, **labels: str) -> float | None:
        return tel.registry.get_sample_value(name, {"breaker": "engine", **labels})

    assert sample("llmslo_breaker_state", state="open") == 1.0
    assert sample("llmslo_breaker_state", state="closed") == 0.0
    assert b.report_errors == 0
    assert sample("llmslo_breaker_transitions_total", from_state="closed", to_state="open") == 1.0


def test_a_refused_tracker_is_rejected_circuit_open_and_its_retry_after_observed() -> None:
    tel = Telemetry()
    clock = Clock()
    b = streak_breaker(clock, telemetry=tel)
    served = tel.start("ok", model="llama")
    assert b.allow(served).admitted and served.finish_reason is None  # admitted: the tracker is untouched
    trip(b)
    clock.now += 4.0
    refused = tel.start("r1", model="llama")
    decision = b.allow(refused)
    assert not decision.admitted and decision.http_status == 503
    assert (refused.finish_reason, refused.reject_reason) == ("rejected", "circuit_open")
    labels = {"model": "llama", "reject_reason": "circuit_open"}
    assert tel.registry.get_sample_value("llmslo_retry_after_seconds_count", labels) == 1.0
    assert tel.registry.get_sample_value("llmslo_retry_after_seconds_sum", labels) == pytest.approx(6.0)
    assert b.report_errors == 0


# ---- configuration ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"name": ""}, "name"),
    ({"consecutive_failures": 0}, "consecutive_failures"),
    ({"consecutive_failures": True}, "consecutive_failures"),
    ({"error_rate": 1.0}, "error_rate"),
    ({"error_rate": 0}, "error_rate"),
    ({"consecutive_failures": None, "error_rate": None}, "consecutive_failures"),
    ({"windows": 0}, "windows"),
    ({"window_s": float("nan")}, "window_s"),
    ({"min_requests": -1}, "min_requests"),
    ({"open_s": 0}, "open_s"),
    ({"half_open_probes": 0}, "half_open_probes"),
    ({"probe_timeout_s": float("inf")}, "probe_timeout_s"),
    ({"failure_kinds": "5xx"}, "failure_kinds"),
    ({"audit_size": 0}, "audit_size"),
])
def test_bad_configuration_raises_at_construction_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    kwargs = {"name": "engine", **kwargs}
    with pytest.raises(ConfigurationError, match=rf"CircuitBreaker\.{field}:"):
        CircuitBreaker(**kwargs)  # type: ignore[arg-type]


# ---- the bound on probes ---------------------------------------------------------------------------------

OPS = st.one_of(st.just("allow"), st.just("ok"), st.just("fail"),
                st.floats(min_value=0.0, max_value=25.0, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(OPS, max_size=120), probes=st.integers(1, 4), streak=st.integers(1, 3),
       rate=st.booleans())
def test_never_more_probes_than_configured_through_one_half_open_period(
        ops: list[object], probes: int, streak: int, rate: bool) -> None:
    clock = Clock()
    b = CircuitBreaker("engine", consecutive_failures=streak, error_rate=0.5 if rate else None, windows=1,
                       window_s=3.0, min_requests=2, open_s=5.0, half_open_probes=probes, probe_timeout_s=4.0,
                       audit_size=1000, clock=clock)
    through: dict[int, int] = {}
    for op in ops:
        if op == "allow":
            admitted = b.allow().admitted
            if admitted and b.state == "half_open":
                period = len(b.events())  # each entry into half-open is a new event
                through[period] = through.get(period, 0) + 1
        elif op in ("ok", "fail"):
            b.record(op == "ok")
        else:
            clock.now += float(op)  # type: ignore[arg-type]
    assert all(n <= probes for n in through.values())
    events = b.events()
    assert all(a.to_state == c.from_state for a, c in itertools.pairwise(events))
    assert all(a.time_s <= c.time_s for a, c in itertools.pairwise(events))


def ask_five(b: CircuitBreaker, barrier: threading.Barrier, admitted: list[bool]) -> None:
    """Wait for the others, then ask the breaker five times (list.append is atomic)."""
    barrier.wait()
    for _ in range(5):
        admitted.append(b.allow().admitted)


def test_racing_threads_get_exactly_the_probes_through_half_open() -> None:
    clock = Clock()
    b = streak_breaker(clock, half_open_probes=3, consecutive_failures=1)
    for _ in range(100):
        trip(b)
        clock.now += 10.0
        n_threads = 12
        barrier = threading.Barrier(n_threads)
        admitted: list[bool] = []
        threads = [threading.Thread(target=ask_five, args=(b, barrier, admitted)) for _ in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=10)
        assert sum(admitted) == 3 and len(admitted) == 5 * n_threads
        for _ in range(3):
            b.record_success()
        assert b.state == "closed"


def test_racing_asyncio_tasks_get_exactly_the_probes_through_half_open() -> None:
    clock = Clock()
    b = streak_breaker(clock, half_open_probes=2, consecutive_failures=1)

    async def ask(delay: int) -> bool:
        for _ in range(delay):
            await asyncio.sleep(0)
        return b.allow().admitted

    async def main() -> None:
        for i in range(200):
            trip(b)
            clock.now += 10.0
            results = await asyncio.gather(*(ask((i + k) % 4) for k in range(8)))
            assert sum(results) == 2
            if i % 2:
                b.record_failure("oom")
            else:
                b.record_success()
                b.record_success()
            assert b.state == ("open" if i % 2 else "closed")

    asyncio.run(main())
