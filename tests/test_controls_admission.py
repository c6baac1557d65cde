"""The admission queue: bounded, priority classes, a concurrency limit, every outcome once through telemetry."""

from __future__ import annotations

import asyncio
import functools
import random
import threading
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.controls import AdmissionQueue, Decision, LoadShedder, RetryAfterEstimator
from llmslo.telemetry import ConfigurationError, RequestTracker, Telemetry

MODEL = "m"
HANG_S = 10.0


def run_async(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test in a fresh event loop (fixtures are passed through); a waiter the queue never wakes
    fails the test after ``HANG_S`` instead of hanging it."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), HANG_S))
    return wrapper


class FakeClock:
    """Monotonic seconds moved by hand; ``ns`` gives the same time to the telemetry."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def ns(self) -> int:
        return int(self.t * 1e9)

    def advance(self, s: float) -> None:
        self.t += s


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def tel(clock: FakeClock) -> Telemetry:
    return Telemetry(version="v1", clock_ns=clock.ns)


def queue(tel: Telemetry | None, clock: Callable[[], float], **kw: object) -> AdmissionQueue:
    est = RetryAfterEstimator(jitter=0.0, clock=clock)
    args: dict[str, object] = {"capacity": 2, "concurrency": 1, "queue_timeout_s": 30.0}
    args.update(kw)
    return AdmissionQueue(MODEL, telemetry=tel, clock=clock, retry_after=est, **args)  # type: ignore[arg-type]


def start(tel: Telemetry, name: str, cls: str = "batch") -> RequestTracker:
    return tel.start(name, model=MODEL, tenant_class=cls)


async def settle() -> None:
    """Let every ready task run until it waits again."""
    for _ in range(5):
        await asyncio.sleep(0)


def queued_gauge(tel: Telemetry) -> float:
    return tel.metrics.value("queued", model=MODEL)


# ---- configuration ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kw", "message"), [
    ({"capacity": 0}, "AdmissionQueue.capacity: must be an integer >= 1, got 0"),
    ({"capacity": 2.5}, "AdmissionQueue.capacity: must be an integer >= 1, got 2.5"),
    ({"concurrency": 0}, "AdmissionQueue.concurrency: must be an integer >= 1, got 0"),
    ({"token_capacity": 0}, "AdmissionQueue.token_capacity: must be an integer >= 1, got 0"),
    ({"token_capacity": 1.5}, "AdmissionQueue.token_capacity: must be an integer >= 1, got 1.5"),
    ({"queue_timeout_s": 0}, "AdmissionQueue.queue_timeout_s: must be a finite number > 0 seconds, got 0"),
    ({"queue_timeout_s": float("inf")}, "AdmissionQueue.queue_timeout_s: must be a finite number > 0"),
    ({"classes": ("a", "a")}, "AdmissionQueue.classes: class names must be distinct"),
    ({"classes": ()}, "AdmissionQueue.classes: must be a non-empty sequence"),
    ({"shedder": LoadShedder(classes=("x", "y"))}, "AdmissionQueue.shedder: its classes ['x', 'y'] differ"),
])
def test_bad_configuration_raises_naming_the_field(kw: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"capacity": 2, "concurrency": 1}
    args.update(kw)
    with pytest.raises(ConfigurationError) as err:
        AdmissionQueue(MODEL, **args)  # type: ignore[arg-type]
    assert str(err.value).startswith(message)


def test_queue_capacity_is_exported_at_construction(tel: Telemetry, clock: FakeClock) -> None:
    queue(tel, clock, capacity=7)
    assert tel.metrics.value("queue_capacity", model=MODEL) == 7


# ---- the deterministic state machine ---------------------------------------------------------------------

@run_async
async def test_a_free_slot_admits_and_schedules_at_once_and_is_released_at_the_terminal_state(
        tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock)
    t = start(tel, "a")
    d = await q.acquire(t)
    assert d.admitted and d.http_status == 200
    assert t.admitted_ns is not None and t.scheduled_ns is not None
    assert (q.running, q.depth, queued_gauge(tel)) == (1, 0, 0)
    t.finish("stop")
    assert (q.running, t.released) == (0, 1)


@run_async
async def test_waiters_are_served_interactive_first_then_fifo(tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock, capacity=5)
    holder = start(tel, "holder")
    assert (await q.acquire(holder)).admitted
    names = ["b1", "b2", "i1", "i2"]
    trackers = {n: start(tel, n, "interactive" if n[0] == "i" else "batch") for n in names}
    order: list[str] = []

    async def wait(n: str) -> None:
        assert (await q.acquire(trackers[n])).admitted
        order.append(n)

    tasks = [asyncio.create_task(wait(n)) for n in names]
    await settle()
    assert q.depth_by_class() == {"interactive": 2, "batch": 2}
    assert queued_gauge(tel) == 4
    holder.finish("stop")
    for n in ["i1", "i2", "b1", "b2"]:
        await settle()
        assert order[-1] == n
        trackers[n].finish("stop")
    await asyncio.gather(*tasks)
    assert order == ["i1", "i2", "b1", "b2"]
    assert (q.depth, q.running, queued_gauge(tel)) == (0, 0, 0)


@run_async
async def test_a_full_queue_rejects_queue_full_with_429_and_a_reported_retry_after(
        tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock, capacity=1)
    assert (await q.acquire(start(tel, "holder"))).admitted
    waiter = asyncio.create_task(q.acquire(start(tel, "w")))
    await settle()
    t = start(tel, "late")
    d = await q.acquire(t)
    assert not d.admitted and d.reason == "queue_full" and d.http_status == 429
    assert d.retry_after_s is not None and d.retry_after_header is not None
    assert ("retry-after", d.retry_after_header) in d.headers()
    assert t.finish_reason == "rejected" and t.reject_reason == "queue_full"
    assert t.admitted_ns is None  # refused at the door: never admitted
    assert tel.metrics.value("retry_after", model=MODEL, reject_reason="queue_full") == 1
    assert tel.metrics.value("rejected_requests", model=MODEL, version="v1", tenant_class="batch",
                             reject_reason="queue_full") == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


@run_async
async def test_a_higher_class_displaces_the_newest_waiter_of_the_lowest_class(
        tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock, capacity=2)
    holder = start(tel, "holder")
    assert (await q.acquire(holder)).admitted
    b1, b2, i1 = start(tel, "b1"), start(tel, "b2"), start(tel, "i1", "interactive")
    t1 = asyncio.create_task(q.acquire(b1))
    await settle()
    t2 = asyncio.create_task(q.acquire(b2))
    await settle()
    t3 = asyncio.create_task(q.acquire(i1))
    await settle()
    d2 = await t2
    assert not d2.admitted and d2.reason == "queue_full" and d2.retry_after_s is not None
    assert b2.reject_reason == "queue_full" and b2.released == 1
    assert q.depth_by_class() == {"interactive": 1, "batch": 1}
    assert queued_gauge(tel) == 2
    holder.finish("stop")
    await settle()
    assert t3.done() and (await t3).admitted and not t1.done()
    i1.finish("stop")
    assert (await t1).admitted
    b1.finish("stop")
    assert (q.depth, q.running) == (0, 0)


@run_async
async def test_an_arrival_not_above_the_lowest_waiting_class_is_refused_not_displacing(
        tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock, capacity=1)
    assert (await q.acquire(start(tel, "holder"))).admitted
    i1 = start(tel, "i1", "interactive")
    t1 = asyncio.create_task(q.acquire(i1))
    await settle()
    for name, cls in (("i2", "interactive"), ("b1", "batch")):
        d = await q.acquire(start(tel, name, cls))
        assert not d.admitted and d.reason == "queue_full"
    assert not t1.done() and q.depth == 1
    i1.finish("client_cancel")
    assert not (await t1).admitted and q.depth == 0


@run_async
async def test_an_unknown_class_is_the_lowest_and_is_displaced_first(tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock, capacity=1)
    assert (await q.acquire(start(tel, "holder"))).admitted
    odd = start(tel, "odd", "no-such-class")
    t1 = asyncio.create_task(q.acquire(odd))
    await settle()
    assert q.depth_by_class() == {"interactive": 0, "batch": 1}
    t2 = asyncio.create_task(q.acquire(start(tel, "i", "interactive")))
    await settle()
    assert not (await t1).admitted and odd.reject_reason == "queue_full"
    t2.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t2


@run_async
async def test_a_queue_timeout_finishes_deadline_not_rejected_and_answers_429(
        tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock, capacity=2, queue_timeout_s=10.0)
    assert (await q.acquire(start(tel, "holder"))).admitted
    w = start(tel, "w")
    task = asyncio.create_task(q.acquire(w))
    await settle()
    clock.advance(9.0)
    assert q.sweep() == 0 and not task.done()
    clock.advance(1.0)
    assert q.sweep() == 1
    d = await task
    assert not d.admitted and d.reason == "queue_full" and d.detail == "queue_timeout"
    assert d.http_status == 429 and d.retry_after_s is not None
    assert w.finish_reason == "deadline" and w.reject_reason is None and w.admitted_ns is not None
    assert (q.depth, queued_gauge(tel), w.released) == (0, 0, 1)
    assert tel.metrics.value("retry_after", model=MODEL, reject_reason="queue_full") == 1


@run_async
async def test_a_full_queue_times_out_overdue_waiters_before_refusing(tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock, capacity=1, queue_timeout_s=5.0)
    assert (await q.acquire(start(tel, "holder"))).admitted
    old = start(tel, "old")
    t_old = asyncio.create_task(q.acquire(old))
    await settle()
    clock.advance(6.0)
    new = start(tel, "new")
    t_new = asyncio.create_task(q.acquire(new))
    await settle()
    assert (await t_old).detail == "queue_timeout" and old.finish_reason == "deadline"
    assert not t_new.done() and q.depth == 1
    new.finish("client_cancel")
    assert not (await t_new).admitted


@run_async
async def test_a_per_call_timeout_of_zero_never_waits(tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock)
    assert (await q.acquire(start(tel, "holder"))).admitted
    t = start(tel, "impatient")
    d = await q.acquire(t, timeout_s=0)
    assert not d.admitted and d.reason == "queue_full" and t.admitted_ns is None and q.depth == 0


@run_async
async def test_a_request_ended_elsewhere_while_waiting_leaves_the_queue_with_its_reason(
        tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock)
    holder = start(tel, "holder")
    assert (await q.acquire(holder)).admitted
    w = start(tel, "w")
    task = asyncio.create_task(q.acquire(w))
    await settle()
    w.finish("server_draining")
    d = await task
    assert not d.admitted and d.reason == "draining" and d.http_status == 503
    assert (q.depth, q.running, w.released) == (0, 1, 1)
    holder.finish("stop")
    assert q.running == 0


@run_async
async def test_a_cancelled_waiting_task_leaves_the_queue_and_its_later_end_frees_nothing(
        tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock)
    holder = start(tel, "holder")
    assert (await q.acquire(holder)).admitted
    w = start(tel, "w")
    task = asyncio.create_task(q.acquire(w))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert q.depth == 0
    w.finish("client_cancel")
    assert (q.running, w.released) == (1, 1)
    holder.finish("stop")
    assert q.running == 0


@run_async
async def test_an_already_finished_request_gets_no_slot(tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock)
    t = start(tel, "gone")
    t.finish("client_cancel")
    d = await q.acquire(t)
    assert not d.admitted and (q.running, q.depth) == (0, 0)


def test_blocking_acquire_waits_for_the_slot_a_finishing_request_frees(tel: Telemetry) -> None:
    q = AdmissionQueue(MODEL, capacity=2, concurrency=1, telemetry=tel)
    holder = start(tel, "holder")
    assert q.acquire_blocking(holder).admitted
    w = start(tel, "w")
    out: list[Decision] = []
    th = threading.Thread(target=lambda: out.append(q.acquire_blocking(w)))
    th.start()
    while q.depth == 0:
        threading.Event().wait(0.001)
    holder.finish("stop")
    th.join(5)
    assert out and out[0].admitted and w.scheduled_ns is not None and q.running == 1
    w.finish("stop")
    assert q.running == 0


def test_blocking_acquire_times_itself_out(tel: Telemetry) -> None:
    q = AdmissionQueue(MODEL, capacity=2, concurrency=1, queue_timeout_s=0.01, telemetry=tel)
    assert q.acquire_blocking(start(tel, "holder")).admitted
    w = start(tel, "w")
    d = q.acquire_blocking(w)
    assert d.detail == "queue_timeout" and w.finish_reason == "deadline" and q.depth == 0


@run_async
async def test_the_shedder_is_consulted_on_entry_degrading_before_shedding(tel: Telemetry, clock: FakeClock) -> None:
    shedder = LoadShedder(queue_levels={"interactive": 1.0, "batch": 0.5}, degrade=[("cap_max_tokens", 0.5)],
                          clock=clock)
    q = queue(tel, clock, capacity=4, shedder=shedder)
    holder = start(tel, "holder")
    assert (await q.acquire(holder)).admitted
    applied: list[str] = []

    def degrade(action: str) -> bool:
        applied.append(action)
        return True

    w1 = start(tel, "w1")  # depth 0 of 4: keep
    t1 = asyncio.create_task(q.acquire(w1, degrade=degrade))
    await settle()
    assert applied == []
    w2 = start(tel, "w2")  # depth 1/4 = 0.25 = half the batch level: degraded
    t2 = asyncio.create_task(q.acquire(w2, degrade=degrade))
    await settle()
    assert applied == ["cap_max_tokens"]
    assert tel.metrics.value("degraded_requests", model=MODEL, action="cap_max_tokens") == 1
    shed = start(tel, "shed")  # depth 2/4 = the batch level: shed
    d = await q.acquire(shed, degrade=degrade)
    assert not d.admitted and d.reason == "queue_full" and shed.admitted_ns is None
    assert tel.metrics.value("shed_requests", model=MODEL, signal="queue", tenant_class="batch") == 1
    i = start(tel, "i", "interactive")  # same depth: interactive is degraded, not shed
    t3 = asyncio.create_task(q.acquire(i, degrade=degrade))
    await settle()
    assert applied == ["cap_max_tokens"] * 2 and q.depth == 3
    for t in (w1, w2, i, holder):
        t.finish("client_cancel")
    await asyncio.gather(t1, t2, t3)
    assert (q.depth, q.running) == (0, 0)


@run_async
async def test_a_failing_degrade_hook_is_counted_not_raised(tel: Telemetry, clock: FakeClock) -> None:
    shedder = LoadShedder(queue_levels={"interactive": 1.0, "batch": 1.0}, degrade=[("cap", 0.01)], clock=clock)
    q = queue(tel, clock, shedder=shedder)
    holder = start(tel, "holder")
    assert (await q.acquire(holder)).admitted

    def broken(action: str) -> bool:
        raise RuntimeError("boom")

    first = start(tel, "first")
    t_first = asyncio.create_task(q.acquire(first, degrade=broken))  # depth 0: no stage applies
    await settle()
    t = start(tel, "t")
    task = asyncio.create_task(q.acquire(t, degrade=broken))  # depth 1 of 2: the stage applies and fails
    await settle()
    assert tel.metrics.value("internal_errors") == 1
    holder.finish("stop")
    assert (await t_first).admitted
    first.finish("stop")
    assert (await task).admitted
    assert tel.metrics.value("degraded_requests", model=MODEL, action="cap") == 0


# ---- races -----------------------------------------------------------------------------------------------

def _check_accounting(tel: Telemetry, q: AdmissionQueue, trackers: list[RequestTracker],
                      decisions: dict[str, Decision]) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    for t in trackers:
        assert t.done, t.request_id
        d = decisions.get(t.request_id)
        if t.finish_reason == "rejected":
            outcomes["rejected"] += 1
        elif t.finish_reason == "deadline" and d is not None and d.detail == "queue_timeout":
            outcomes["timed_out"] += 1
        elif d is not None and d.admitted:
            outcomes["admitted"] += 1
            assert t.scheduled_ns is not None
        else:
            outcomes["ended_waiting"] += 1
        if t.admitted_ns is not None:
            assert t.released == 1, t.request_id  # the admission slot resource, exactly once
        assert sum(t.ignored.values()) <= 1
    assert (q.depth, q.running) == (0, 0)
    assert queued_gauge(tel) == 0 and tel.metrics.value("in_flight", model=MODEL) == 0
    assert sum(outcomes.values()) == len(trackers)
    return outcomes


def test_threads_entering_leaving_and_cancelling_concurrently_settle_each_request_once() -> None:
    tel = Telemetry(version="v1")
    q = AdmissionQueue(MODEL, capacity=2, concurrency=1, queue_timeout_s=0.02, telemetry=tel)
    trackers: list[RequestTracker] = []
    decisions: dict[str, Decision] = {}
    lock = threading.Lock()

    def worker(k: int) -> None:
        rng = random.Random(k)
        for j in range(60):
            t = start(tel, f"t{k}-{j}", rng.choice(["interactive", "batch", "weird"]))
            with lock:
                trackers.append(t)
            if rng.random() < 0.2:  # a client cancel racing the wait, from another thread
                threading.Timer(rng.random() * 0.005, t.finish, ("client_cancel",)).start()
            d = q.acquire_blocking(t)
            with lock:
                decisions[t.request_id] = d
            if d.admitted:
                threading.Event().wait(rng.random() * 0.002)
                t.finish(rng.choice(["stop", "error", "deadline"]))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    threading.Event().wait(0.05)  # the last cancel timers
    outcomes = _check_accounting(tel, q, trackers, decisions)
    assert outcomes["admitted"] > 0 and outcomes["rejected"] + outcomes["timed_out"] > 0


def test_asyncio_tasks_entering_leaving_and_cancelling_concurrently_settle_each_request_once() -> None:
    tel = Telemetry(version="v1")
    q = AdmissionQueue(MODEL, capacity=8, concurrency=4, queue_timeout_s=0.02, telemetry=tel)
    trackers: list[RequestTracker] = []
    decisions: dict[str, Decision] = {}

    async def one(i: int, rng: random.Random) -> None:
        t = start(tel, f"a{i}", rng.choice(["interactive", "batch"]))
        trackers.append(t)
        try:
            d = await q.acquire(t)
            decisions[t.request_id] = d
            if d.admitted:
                await asyncio.sleep(rng.random() * 0.002)
                t.finish("stop")
        except asyncio.CancelledError:
            t.finish("client_cancel")  # what the server's request scope does
            raise

    async def main() -> None:
        rng = random.Random(7)
        tasks = [asyncio.create_task(one(i, rng)) for i in range(400)]
        for task in tasks:
            if rng.random() < 0.15:
                asyncio.get_running_loop().call_later(rng.random() * 0.01, task.cancel)
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), 3 * HANG_S))
    outcomes = _check_accounting(tel, q, trackers, decisions)
    assert outcomes["admitted"] > 0 and outcomes["rejected"] > 0


def test_threads_and_asyncio_tasks_share_one_queue() -> None:
    tel = Telemetry(version="v1")
    q = AdmissionQueue(MODEL, capacity=4, concurrency=2, queue_timeout_s=0.05, telemetry=tel)
    trackers: list[RequestTracker] = []
    decisions: dict[str, Decision] = {}
    lock = threading.Lock()

    def record(t: RequestTracker, d: Decision) -> None:
        with lock:
            trackers.append(t)
            decisions[t.request_id] = d

    def thread_worker(k: int) -> None:
        for j in range(40):
            t = start(tel, f"th{k}-{j}")
            d = q.acquire_blocking(t)
            record(t, d)
            if d.admitted:
                threading.Event().wait(0.001)
                t.finish("stop")

    async def task(i: int) -> None:
        t = start(tel, f"as{i}", "interactive")
        d = await q.acquire(t)
        record(t, d)
        if d.admitted:
            await asyncio.sleep(0.001)
            t.finish("stop")

    async def main() -> None:
        await asyncio.gather(*(task(i) for i in range(120)))

    threads = [threading.Thread(target=thread_worker, args=(k,)) for k in range(3)]
    for th in threads:
        th.start()
    asyncio.run(asyncio.wait_for(main(), 3 * HANG_S))
    for th in threads:
        th.join(60)
    outcomes = _check_accounting(tel, q, trackers, decisions)
    assert outcomes["admitted"] > 0


# ---- property --------------------------------------------------------------------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from(["interactive", "batch", "other"])),
    st.tuples(st.just("finish_running"), st.integers(0, 10)),
    st.tuples(st.just("end_waiting"), st.integers(0, 10)),
    st.tuples(st.just("advance"), st.floats(0.0, 4.0)),
), max_size=40)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 4), concurrency=st.integers(1, 3), ops=OPS)
def test_depth_never_exceeds_capacity_and_every_request_settles_once(
        capacity: int, concurrency: int, ops: list[tuple[str, object]]) -> None:
    clock = FakeClock()
    tel = Telemetry(version="v1", clock_ns=clock.ns)
    q = queue(tel, clock, capacity=capacity, concurrency=concurrency, queue_timeout_s=5.0)
    trackers: list[RequestTracker] = []
    decisions: dict[str, Decision] = {}

    async def enter(t: RequestTracker) -> None:
        decisions[t.request_id] = await q.acquire(t)

    async def main() -> None:
        tasks = []
        for i, (op, arg) in enumerate(ops):
            if op == "arrive":
                t = start(tel, f"r{i}", str(arg))
                trackers.append(t)
                tasks.append(asyncio.create_task(enter(t)))
            elif op == "finish_running":
                running = [t for t in trackers if decisions.get(t.request_id, Decision(False, "queue_full")).admitted
                           and not t.done]
                if running:
                    running[int(str(arg)) % len(running)].finish("stop")
            elif op == "end_waiting":
                waiting = [t for t in trackers if t.request_id not in decisions and not t.done]
                if waiting:
                    waiting[int(str(arg)) % len(waiting)].finish("client_cancel")
            else:
                clock.advance(float(str(arg)))
                q.sweep()
            await settle()
            assert 0 <= q.depth <= capacity and 0 <= q.running <= concurrency
            assert queued_gauge(tel) == q.depth
        for t in trackers:
            t.finish("stop")
        await asyncio.gather(*tasks)

    asyncio.run(asyncio.wait_for(main(), 3 * HANG_S))
    _check_accounting(tel, q, trackers, decisions)


# ---- a concurrency that moves (an adaptive limit) --------------------------------------------------------

@run_async
async def test_more_slots_admit_waiting_requests_at_once_and_fewer_wait_for_running_ones_to_end(
        tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock, capacity=4, concurrency=1)
    first = start(tel, "r1")
    assert (await q.acquire(first)).admitted
    waiting = [start(tel, f"w{i}") for i in range(2)]
    tasks = [asyncio.ensure_future(q.acquire(t)) for t in waiting]
    await settle()
    assert q.depth == 2 and not any(t.done() for t in tasks)
    q.set_concurrency(3)
    await settle()
    assert all(t.done() and t.result().admitted for t in tasks) and q.running == 3
    q.set_concurrency(1)
    late = start(tel, "late")
    late_task = asyncio.ensure_future(q.acquire(late))
    await settle()
    assert not late_task.done()
    first.finish("stop")
    waiting[0].finish("stop")
    await settle()
    assert not late_task.done() and q.running == 1  # still one running: the one slot is taken
    waiting[1].finish("stop")
    await settle()
    assert late_task.done() and late_task.result().admitted
    with pytest.raises(ConfigurationError, match="concurrency"):
        q.set_concurrency(0)


# ---- tokens --------------------------------------------------------------------------------------------------

@run_async
async def test_slots_are_granted_while_the_tokens_fit_first_come_first_served(
        tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock, capacity=8, concurrency=10, token_capacity=1000)
    a, b = start(tel, "a"), start(tel, "b")
    assert (await q.acquire(a, tokens=600)).admitted
    assert (await q.acquire(b, tokens=400)).admitted          # 1000 of 1000: fits exactly
    assert (q.running, q.tokens_running) == (2, 1000)
    heavy, light = start(tel, "heavy"), start(tel, "light")
    heavy_task = asyncio.ensure_future(q.acquire(heavy, tokens=500))
    await settle()
    light_task = asyncio.ensure_future(q.acquire(light, tokens=1))
    await settle()
    assert q.depth == 2 and not heavy_task.done() and not light_task.done()  # the light one waits its turn
    b.finish("stop")                          # 600 + 500 > 1000: the head still waits, and so does the light one
    await settle()
    assert q.depth == 2 and q.tokens_running == 600
    a.finish("stop")
    await settle()
    assert heavy_task.done() and heavy_task.result().admitted
    assert light_task.done() and light_task.result().admitted
    assert (q.running, q.tokens_running, q.depth) == (2, 501, 0)
    heavy.finish("stop")
    light.finish("stop")
    assert (q.running, q.tokens_running) == (0, 0)


@run_async
async def test_a_request_heavier_than_the_capacity_gets_a_slot_alone(tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock, capacity=4, concurrency=10, token_capacity=100)
    small, huge = start(tel, "small"), start(tel, "huge")
    assert (await q.acquire(small, tokens=10)).admitted
    huge_task = asyncio.ensure_future(q.acquire(huge, tokens=5000))
    await settle()
    assert not huge_task.done()
    small.finish("stop")
    await settle()
    assert huge_task.done() and huge_task.result().admitted and q.tokens_running == 5000
    after = start(tel, "after")
    after_task = asyncio.ensure_future(q.acquire(after, tokens=1))
    await settle()
    assert not after_task.done()              # nothing fits beside it
    huge.finish("stop")
    await settle()
    assert after_task.done() and after_task.result().admitted


@run_async
async def test_a_larger_token_capacity_admits_waiting_requests_and_none_removes_the_bound(
        tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock, capacity=4, concurrency=10, token_capacity=100)
    first = start(tel, "first")
    assert (await q.acquire(first, tokens=100)).admitted
    waiting = [start(tel, f"w{i}") for i in range(3)]
    tasks = [asyncio.ensure_future(q.acquire(t, tokens=100)) for t in waiting]
    await settle()
    assert q.depth == 3
    q.set_token_capacity(200)
    await settle()
    assert [t.done() for t in tasks] == [True, False, False]
    q.set_token_capacity(None)
    await settle()
    assert all(t.done() and t.result().admitted for t in tasks) and q.tokens_running == 400
    with pytest.raises(ConfigurationError, match="token_capacity"):
        q.set_token_capacity(0)
    for t in [first, *waiting]:
        t.finish("stop")
    assert (q.running, q.tokens_running) == (0, 0)


def test_without_a_token_capacity_tokens_change_nothing(tel: Telemetry, clock: FakeClock) -> None:
    q = queue(tel, clock, capacity=4, concurrency=2)
    trackers = [start(tel, f"r{i}") for i in range(3)]
    decisions = [q.acquire_blocking(t, tokens=10**9, timeout_s=0) for t in trackers]
    assert [d.admitted for d in decisions] == [True, True, False]
    assert q.tokens_running == 2 * 10**9


@pytest.mark.parametrize("bad", [True, -5, 2.5, "3", None])
def test_a_weight_that_is_not_a_count_of_tokens_weighs_nothing(tel: Telemetry, clock: FakeClock, bad: object) -> None:
    q = queue(tel, clock, capacity=4, concurrency=2, token_capacity=10)
    t = start(tel, "r")
    assert q.acquire_blocking(t, tokens=bad, timeout_s=0).admitted  # type: ignore[arg-type]
    assert q.tokens_running == 0
    t.finish("stop")
    assert (q.running, q.tokens_running) == (0, 0)
