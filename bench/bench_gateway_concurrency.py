"""The gateway's adaptive concurrency limit against Envoy's whole-request gradient, on a simulated backend.

A discrete-event simulation, no network, no sleeping. One backend with continuous batching: up to
``--batch-max`` sequences share one decode step (KV cache bound; beyond it requests wait in the engine's
queue); a step lasts ``base_gap * max(1, running / slots)`` seconds (free up to ``--slots`` sequences, then
compute-bound: every stream slows in proportion) and gives every decoding stream one token. A request's
first token comes ``prefill * prompt_tokens`` seconds after it joins the batch, so TTFT = engine queueing +
prefill. Open-loop Poisson arrivals above capacity (``--rate`` requests/s), half short answers (16 tokens),
half long (512), prompts uniform in 128..1024 tokens. Three phases of ``--phase-s`` seconds each: normal,
the backend 3x slower per token (prefill and decode), normal again.

The same arrivals go through (a) :class:`llmslo.gateway._concurrency.AdaptiveLimit` (TTFT per prompt token
and each stream's median gap) and (b) :class:`~llmslo.gateway._concurrency.WholeRttGradientLimit` (Envoy's
gradient on whole-request time; ``--envoy-interval-s`` between its updates and ``--envoy-min-rtt-requests``
for its minRTT, both chosen so an update sees a handful of requests), in Envoy's default mode (the limit
pinned to 3 while minRTT is measured) and (b') with minRTT from live traffic (nothing pinned); beside them,
for information, (c) no limit but the engine's own ``batch-max``. A refused request is not retried.

Per controller and phase: the median limit (sampled every second; also over the phase's second half), the
share of seconds pinned for a minRTT measurement, admitted and refused requests, goodput
(requests arriving in the phase with TTFT <= 1 s and mean inter-token gap <= 0.1 s, per second), the
refused share of short and of long requests; then the ratio ours / theirs, and the limit over time.

Run: ``.venv/bin/python -m llmslo.bench.bench_gateway_concurrency`` (``--help`` for the knobs).
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from llmslo.bench._util import median, table
from llmslo.gateway._concurrency import AdaptiveLimit, WholeRttGradientLimit

SHORT_TOKENS = 16
LONG_TOKENS = 512
PROMPT_TOKENS = (128, 1024)
SLO_TTFT_S = 1.0
SLO_GAP_S = 0.1
SLOW_FACTOR = 3.0
PHASES = ("normal", "3x slower", "normal again")


@dataclass(frozen=True, slots=True)
class Backend:
    """The simulated engine: ``slots`` sequences decode at ``base_gap_s`` per token, beyond that every step
    slows in proportion; at most ``batch_max`` in the batch; ``prefill_s`` seconds per prompt token."""

    slots: int
    batch_max: int
    base_gap_s: float
    prefill_s: float
    slow_from_s: float
    slow_until_s: float

    def factor(self, t: float) -> float:
        """How many times slower per token the backend is at time ``t`` (seconds)."""
        return SLOW_FACTOR if self.slow_from_s <= t < self.slow_until_s else 1.0

    def step_s(self, running: int, t: float) -> float:
        """The duration of one decode step (seconds) with ``running`` sequences in the batch."""
        return self.base_gap_s * self.factor(t) * max(1.0, running / self.slots)


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(slots=True)
class Request:
    arrival: Arrival
    first_token_s: float = math.inf
    last_token_s: float = 0.0
    tokens: int = 0
    gaps_s: list[float] = field(default_factory=list)


@dataclass(slots=True)
class Outcome:
    """One arrival's fate: admitted or not; when admitted its TTFT and mean gap (seconds)."""

    arrival: Arrival
    admitted: bool
    ttft_s: float = math.nan
    mean_gap_s: float = math.nan

    @property
    def good(self) -> bool:
        gap_ok = self.arrival.output_tokens <= 1 or self.mean_gap_s <= SLO_GAP_S
        return self.admitted and self.ttft_s <= SLO_TTFT_S and gap_ok


class Controller:
    """What the simulation drives: a limit with acquire/release, fed each finished request."""

    name = ""

    def try_acquire(self) -> bool:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def limit(self) -> int | None:
        raise NotImplementedError

    def pinned(self) -> bool:
        """True while the limit is pinned low to measure a baseline."""
        return False

    def finished(self, req: Request, now: float) -> None:
        raise NotImplementedError


class Ours(Controller):
    name = "ours (per unit of work)"

    def __init__(self, clock: Callable[[], float]) -> None:
        self.inner = AdaptiveLimit(initial=8, max_limit=256, clock=clock)

    def try_acquire(self) -> bool:
        return self.inner.try_acquire()

    def release(self) -> None:
        self.inner.release()

    def limit(self) -> int:
        return self.inner.limit

    def finished(self, req: Request, now: float) -> None:
        self.inner.observe(ttft_s=req.first_token_s - req.arrival.at_s, prompt_tokens=req.arrival.prompt_tokens,
                           gaps_s=req.gaps_s)


class Theirs(Controller):
    def __init__(self, clock: Callable[[], float], interval_s: float, min_rtt_requests: int, pin: bool) -> None:
        self.name = "whole-RTT gradient" + ("" if pin else ", live minRTT")
        self.inner = WholeRttGradientLimit(initial=8, max_limit=256, update_interval_s=interval_s,
                                           min_rtt_requests=min_rtt_requests, pin_min_rtt=pin, clock=clock)

    def try_acquire(self) -> bool:
        return self.inner.try_acquire()

    def release(self) -> None:
        self.inner.release()

    def limit(self) -> int:
        return self.inner.limit

    def pinned(self) -> bool:
        return self.inner.measuring and self.inner.pin_min_rtt

    def finished(self, req: Request, now: float) -> None:
        self.inner.observe_rtt(now - req.arrival.at_s)


class NoLimit(Controller):
    name = "no limit (engine batch only)"

    def try_acquire(self) -> bool:
        return True

    def release(self) -> None:
        return None

    def limit(self) -> None:
        return None

    def finished(self, req: Request, now: float) -> None:
        return None


def arrivals(rate: float, duration_s: float, seed: int) -> list[Arrival]:
    """Poisson arrivals at ``rate`` per second for ``duration_s`` seconds, half short and half long answers."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        tokens = SHORT_TOKENS if rng.random() < 0.5 else LONG_TOKENS
        out.append(Arrival(t, rng.randint(*PROMPT_TOKENS), tokens))
        t += rng.expovariate(rate)
    return out


def simulate(backend: Backend, trace: list[Arrival], make: Callable[[Callable[[], float]], Controller],
             ) -> tuple[Controller, list[Outcome], list[tuple[float, int | None, bool]]]:
    """Run ``trace`` through one controller. Returns it, one outcome per arrival, and every second the limit
    and whether it was pinned to measure a baseline."""
    now = [0.0]
    ctl = make(lambda: now[0])
    outcomes: list[Outcome] = []
    queue: deque[tuple[Request, Outcome]] = deque()
    batch: list[tuple[Request, Outcome]] = []
    limits: list[tuple[float, int | None, bool]] = []
    next_sample = 0.0
    i = 0
    t = 0.0
    max_steps = 50_000_000  # a bound on the loop, far above any run here
    for _ in range(max_steps):
        while queue and len(batch) < backend.batch_max:      # join the batch at this step boundary
            req, out = queue.popleft()
            req.first_token_s = req.last_token_s = t + backend.prefill_s * backend.factor(t) * req.arrival.prompt_tokens
            req.tokens = 1
            batch.append((req, out))
        if not batch:
            if i >= len(trace):
                break
            t = max(t, trace[i].at_s)
        step = backend.step_s(len(batch), t) if batch else 0.0
        end = t + step
        while i < len(trace) and trace[i].at_s <= end:        # arrivals during this step, in order
            a = trace[i]
            now[0] = a.at_s
            while next_sample <= a.at_s:
                limits.append((next_sample, ctl.limit(), ctl.pinned()))
                next_sample += 1.0
            out = Outcome(a, ctl.try_acquire())
            outcomes.append(out)
            if out.admitted:
                queue.append((Request(a), out))
            i += 1
        now[0] = end
        batch, done = decode_step(batch, t, step)
        for req, _ in done:
            ctl.release()
            ctl.finished(req, end)
        t = end
    return ctl, outcomes, limits


class Finished(Protocol):
    """What :func:`decode_step` fills in for a finished request: its TTFT and mean gap (seconds)."""

    ttft_s: float
    mean_gap_s: float


OutcomeT = TypeVar("OutcomeT", bound=Finished)


def decode_step(batch: list[tuple[Request, OutcomeT]], t: float, step: float,
                ) -> tuple[list[tuple[Request, OutcomeT]], list[tuple[Request, OutcomeT]]]:
    """One decode step of ``step`` seconds from ``t``: a token for every stream whose first token came by ``t``
    (its gap recorded); those with all their tokens are finished, their TTFT and mean gap set. Returns the batch
    still running and the finished, in batch order."""
    end = t + step
    still: list[tuple[Request, OutcomeT]] = []
    done: list[tuple[Request, OutcomeT]] = []
    for req, out in batch:
        if req.first_token_s <= t and step > 0:
            req.gaps_s.append(end - req.last_token_s)
            req.last_token_s = end
            req.tokens += 1
        if req.tokens >= req.arrival.output_tokens and req.last_token_s <= end:
            out.ttft_s = req.first_token_s - req.arrival.at_s
            out.mean_gap_s = math.fsum(req.gaps_s) / len(req.gaps_s) if req.gaps_s else 0.0
            done.append((req, out))
        else:
            still.append((req, out))
    return still, done


def phase_of(t: float, phase_s: float) -> int:
    return min(len(PHASES) - 1, int(t // phase_s))


def summarise(outcomes: list[Outcome], limits: list[tuple[float, int | None, bool]], phase_s: float,
              ) -> list[dict[str, float]]:
    """Per phase: median limit (all of it, its second half), the share of seconds pinned, admitted, refused,
    goodput (per second), refused share of short and long requests."""
    rows: list[dict[str, float]] = []
    for p in range(len(PHASES)):
        mine = [o for o in outcomes if phase_of(o.arrival.at_s, phase_s) == p]
        short = [o for o in mine if o.arrival.output_tokens == SHORT_TOKENS]
        long_ = [o for o in mine if o.arrival.output_tokens == LONG_TOKENS]
        seconds = [(t, v, pin) for t, v, pin in limits if phase_of(t, phase_s) == p]
        lims = [float(v) for t, v, _ in seconds if v is not None]
        late = [float(v) for t, v, _ in seconds if v is not None and t % phase_s >= phase_s / 2]
        rows.append({
            "limit": median(lims),
            "limit_late": median(late),
            "pinned": _share([pin for _, _, pin in seconds]),
            "admitted": sum(o.admitted for o in mine),
            "refused": sum(not o.admitted for o in mine),
            "goodput": sum(o.good for o in mine) / phase_s,
            "short_refused": _share([not o.admitted for o in short]),
            "long_refused": _share([not o.admitted for o in long_]),
        })
    return rows


def _share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else math.nan


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f} %"


def _ratio(a: float, b: float) -> str:
    if b == 0:
        return "inf" if a > 0 else "-"
    return f"{a / b:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=9.0, help="arrivals per second (capacity is about 6)")
    ap.add_argument("--phase-s", type=float, default=300.0, help="seconds per phase (3 phases)")
    ap.add_argument("--slots", type=int, default=32, help="sequences decoded at the base gap")
    ap.add_argument("--batch-max", type=int, default=256, help="most sequences in the batch (KV cache)")
    ap.add_argument("--base-gap-s", type=float, default=0.02, help="seconds per token, normal phase")
    ap.add_argument("--prefill-s", type=float, default=0.0002, help="seconds per prompt token, normal phase")
    ap.add_argument("--envoy-interval-s", type=float, default=2.0, help="the whole-RTT limit's update interval")
    ap.add_argument("--envoy-min-rtt-requests", type=int, default=20, help="requests per minRTT measurement")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    phase_s = args.phase_s
    backend = Backend(args.slots, args.batch_max, args.base_gap_s, args.prefill_s, phase_s, 2 * phase_s)
    trace = arrivals(args.rate, 3 * phase_s, args.seed)
    makers: list[Callable[[Callable[[], float]], Controller]] = [
        Ours,
        lambda clock: Theirs(clock, args.envoy_interval_s, args.envoy_min_rtt_requests, True),
        lambda clock: Theirs(clock, args.envoy_interval_s, args.envoy_min_rtt_requests, False),
        lambda clock: NoLimit(),
    ]
    t0 = time.perf_counter()
    results = []
    for make in makers:
        ctl, outcomes, limits = simulate(backend, trace, make)
        results.append((ctl, summarise(outcomes, limits, phase_s), limits))
    wall = time.perf_counter() - t0
    mean_tokens = (SHORT_TOKENS + LONG_TOKENS) / 2
    capacity = args.slots / args.base_gap_s / mean_tokens   # requests/s at the knee (beyond it: the same tokens/s)

    print(f"Adaptive concurrency on a simulated backend: {len(trace):,} arrivals at {args.rate:g}/s over "
          f"3 x {phase_s:g} s, half {SHORT_TOKENS}-token and half {LONG_TOKENS}-token answers; {args.slots} slots "
          f"at {args.base_gap_s * 1e3:g} ms/token, batch max {args.batch_max}, prefill "
          f"{args.prefill_s * 1e3:g} ms/prompt token (capacity about {capacity:.2g} requests/s); the middle phase "
          f"{SLOW_FACTOR:g}x slower per token (about {capacity / SLOW_FACTOR:.2g} requests/s). "
          f"Goodput: TTFT <= {SLO_TTFT_S:g} s and mean gap <= {SLO_GAP_S * 1e3:g} ms, per second. "
          f"Whole-RTT: update every {args.envoy_interval_s:g} s, minRTT over {args.envoy_min_rtt_requests} "
          f"requests (p50, 25 % buffer, re-measured every 60 s). Simulated in {wall:.1f} s.\n")
    rows: list[list[object]] = []
    for ctl, summary, _ in results:
        for p, s in enumerate(summary):
            rows.append([ctl.name, PHASES[p], s["limit"], s["limit_late"], _pct(s["pinned"]), int(s["admitted"]),
                         int(s["refused"]), s["goodput"], _pct(s["short_refused"]), _pct(s["long_refused"])])
    print(table(["controller", "phase", "limit (median)", "limit, 2nd half", "pinned for minRTT", "admitted",
                 "refused", "goodput (/s)", "short refused", "long refused"], rows))
    ours, pinned, live = results[0][1], results[1][1], results[2][1]
    print()
    print(table(["phase", "goodput ours / whole-RTT", "ours / whole-RTT live", "short refused ours / whole-RTT",
                 "ours / whole-RTT live"],
                [[PHASES[p], _ratio(ours[p]["goodput"], pinned[p]["goodput"]),
                  _ratio(ours[p]["goodput"], live[p]["goodput"]),
                  _ratio(ours[p]["short_refused"], pinned[p]["short_refused"]),
                  _ratio(ours[p]["short_refused"], live[p]["short_refused"])] for p in range(len(PHASES))]))
    step = max(1, int(phase_s // 10))
    print(f"\nLimit every {step} s (the slowdown from {phase_s:g} s to {2 * phase_s:g} s):")
    for ctl, _, limits in results[:3]:
        print(f"  {ctl.name:<34} " + " ".join(f"{v:>3}" for t, v, _ in limits if int(t) % step == 0))


if __name__ == "__main__":
    main()
