"""The cost of one admission decision, beside a bare ``asyncio.Queue.put_nowait`` timed in the same run.

One decision, as a server takes it for every request: ``CircuitBreaker.allow()``, ``TokenBucket.take(1)``
and ``await AdmissionQueue.acquire(tracker)`` with a slot free (the common case: the queue admits, the
tracker records ``admit()``, registers the slot for release and records ``schedule()``). Trackers are made
before the timing (a server has them whether it admits or not) and finished after it. Cases, their order
rotating from one repeat to the next:

* baseline: ``asyncio.Queue.put_nowait`` per request, in the same coroutine loop;
* decision: breaker + bucket + queue (the figure; target <= 5 us);
* queue alone: ``await acquire`` only;
* blocking queue: ``acquire_blocking`` (what a threaded server calls), for information;
* tracker calls: the ``admit()`` + ``add_resource()`` + ``schedule()`` the queue makes, without the queue
  (telemetry's share of the decision), for information.

* keyed limiter: breaker + ``RateLimiter.check`` (per-key buckets by requests and tokens) + queue, what a
  server with per-client limits pays, for information.

Each figure is the median over the repeats of the per-request time within a repeat.

Run: ``.venv/bin/python -m llmslo.bench.bench_controls --repeats 7 --loops 20000``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections.abc import Awaitable, Callable

from llmslo.bench._util import median, spread, table
from llmslo.controls import AdmissionQueue, CircuitBreaker, RateLimit, RateLimiter, TokenBucket
from llmslo.telemetry import RequestTracker, Telemetry

TARGET_DECISION_US = 5.0

Case = Callable[[Telemetry, list[RequestTracker]], Awaitable[float]]


def _queue(tel: Telemetry, n: int) -> AdmissionQueue:
    return AdmissionQueue("m", capacity=1000, concurrency=n, telemetry=tel)


async def baseline(tel: Telemetry, trackers: list[RequestTracker]) -> float:
    q: asyncio.Queue[RequestTracker] = asyncio.Queue()
    put = q.put_nowait
    t0 = time.perf_counter_ns()
    for t in trackers:
        put(t)
    return (time.perf_counter_ns() - t0) / len(trackers)


async def decision(tel: Telemetry, trackers: list[RequestTracker]) -> float:
    q = _queue(tel, len(trackers))
    acquire = q.acquire
    allow = CircuitBreaker("engine", telemetry=tel).allow
    take = TokenBucket(rate_per_s=1e12, capacity=1e12).take
    t0 = time.perf_counter_ns()
    for t in trackers:
        if allow().admitted and take(1.0).allowed:
            await acquire(t)
    elapsed = time.perf_counter_ns() - t0
    assert q.running == len(trackers), "every request must have been admitted"
    return elapsed / len(trackers)


async def keyed_limiter(tel: Telemetry, trackers: list[RequestTracker]) -> float:
    q = _queue(tel, len(trackers))
    acquire = q.acquire
    allow = CircuitBreaker("engine", telemetry=tel).allow
    check = RateLimiter(requests=RateLimit(1e12, 1e12), tokens=RateLimit(1e15, 1e15), telemetry=tel).check
    t0 = time.perf_counter_ns()
    for i, t in enumerate(trackers):
        if allow().admitted and check(f"key-{i % 64}", prompt_tokens=512, max_tokens=256, tracker=t).admitted:
            await acquire(t)
    elapsed = time.perf_counter_ns() - t0
    assert q.running == len(trackers), "every request must have been admitted"
    return elapsed / len(trackers)


async def queue_alone(tel: Telemetry, trackers: list[RequestTracker]) -> float:
    q = _queue(tel, len(trackers))
    acquire = q.acquire
    t0 = time.perf_counter_ns()
    for t in trackers:
        await acquire(t)
    elapsed = time.perf_counter_ns() - t0
    assert q.running == len(trackers), "every request must have been admitted"
    return elapsed / len(trackers)


async def blocking_queue(tel: Telemetry, trackers: list[RequestTracker]) -> float:
    q = _queue(tel, len(trackers))
    acquire = q.acquire_blocking
    t0 = time.perf_counter_ns()
    for t in trackers:
        acquire(t)
    return (time.perf_counter_ns() - t0) / len(trackers)


async def tracker_calls(tel: Telemetry, trackers: list[RequestTracker]) -> float:
    def release() -> None:
        return None

    t0 = time.perf_counter_ns()
    for t in trackers:
        t.admit()
        t.add_resource(release, "admission_slot")
        t.schedule()
    return (time.perf_counter_ns() - t0) / len(trackers)


CASES: dict[str, Case] = {
    "baseline: asyncio.Queue.put_nowait": baseline,
    "decision: breaker + bucket + queue": decision,
    "queue alone (await acquire)": queue_alone,
    "queue, acquire_blocking": blocking_queue,
    "tracker calls the queue makes": tracker_calls,
    "breaker + keyed RateLimiter + queue": keyed_limiter,
}


async def one_repeat(loops: int, order: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in order:
        tel = Telemetry(version="v1")
        trackers = [tel.start(f"r{i}", model="m", tenant_class="interactive") for i in range(loops)]
        gc.collect()
        gc.disable()
        try:
            out[name] = await CASES[name](tel, trackers)
        finally:
            gc.enable()
        for t in trackers:
            t.finish("stop")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7, help="repeats (the median is reported)")
    ap.add_argument("--loops", type=int, default=20_000, help="requests per case and repeat")
    args = ap.parse_args()
    names = list(CASES)
    asyncio.run(one_repeat(min(args.loops, 2000), names))  # warm-up
    runs: dict[str, list[float]] = {n: [] for n in names}
    ratios: list[float] = []
    for r in range(max(1, args.repeats)):
        order = names[r % len(names):] + names[:r % len(names)]
        got = asyncio.run(one_repeat(args.loops, order))
        for n in names:
            runs[n].append(got[n] / 1e3)
        ratios.append(got[names[1]] / got[names[0]])
    base = median(runs[names[0]])
    rows: list[list[object]] = []
    for n in names:
        us = median(runs[n])
        is_figure = n == names[1]
        rows.append([n, us, f"{us / base:.1f}x", f"<= {TARGET_DECISION_US:g}" if is_figure else "(info)",
                     ("yes" if us <= TARGET_DECISION_US else "NO") if is_figure else "-", spread(runs[n])])
    print(f"One admission decision (breaker + bucket + queue), {args.loops:,} requests x {args.repeats} repeats, "
          f"Python {sys.version.split()[0]}; baseline asyncio.Queue.put_nowait = {base:.3f} us "
          f"(decision / baseline, median of per-repeat ratios: {median(ratios):.1f}x)\n")
    print(table(["case", "us per request", "vs baseline", "target (us)", "pass", "range (us)"], rows))


if __name__ == "__main__":
    main()
