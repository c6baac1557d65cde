"""The gateway's adaptive limit with tokens in flight against the same limit counting requests, on a backend bound
by its KV cache, when the requests turn heavier.

A discrete-event simulation, no network, no sleeping. One backend with continuous batching and a KV cache of
``--kv-tokens`` tokens: a request joins the batch when the cache has room for its prompt and its output (first
come, first served: a head that does not fit holds the rest back in the engine's queue), and frees it when it
ends. A decode step lasts ``base_gap * max(1, running / slots)`` seconds and gives every decoding stream one
token; a request's first token comes ``prefill * prompt_tokens`` seconds after it joins. So TTFT = the engine's
queue + prefill, and beyond its KV cache an engine holds requests in its queue, where no limit sees them but
through their TTFT.

Open-loop Poisson arrivals at ``--rate`` requests/s, every answer ``--output-tokens`` long (``max_tokens`` the
same). Three phases of ``--phase-s`` seconds each: short prompts (``--light-prompt`` tokens: the cache holds far
more of them than the decode step serves well, so compute is the bound), long prompts (``--heavy-prompt``
tokens: the cache holds a few), short again. The same arrivals go through
:class:`llmslo.gateway._concurrency.AdaptiveLimit` (a) given each request's weight, ``prompt + max_tokens``
tokens, as the gateway gives it, and (b) given none, so it counts requests only; each on its latency alone, and
told the engine's queue as well (at each request's end, as a gateway that reads the engine's metrics tells it
with ``--engine``); beside them, for information, no limit. A refused request is not retried.

Per controller and phase: the median limit in requests, admitted and refused requests, goodput (requests arriving
in the phase with TTFT <= ``--slo-ttft-s`` and mean inter-token gap <= 100 ms, per second), TTFT p50/p99 of the
admitted (a request still queued at the end counts as infinitely late), the most tokens the limit let in at once,
and over the first ``--early-s`` seconds of each phase the goodput alone (how fast each limit met the change);
then the ratios, and the limits over time.

Run: ``.venv/bin/python -m llmslo.bench.bench_gateway_tokens`` (``--help`` for the knobs).
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from llmslo.bench._util import median, table
from llmslo.bench.bench_gateway_concurrency import Arrival, Request, _ratio, decode_step
from llmslo.gateway._concurrency import AdaptiveLimit

PHASES = ("short prompts", "long prompts", "short again")
SLO_GAP_S = 0.1
@dataclass(frozen=True, slots=True)
class Controller:
    name: str
    limited: bool = True
    weigh: bool = False           # the limit is given each request's tokens
    engine_queue: bool = False    # the limit is told the engine's queue


CONTROLLERS = (
    Controller("tokens in flight", weigh=True),
    Controller("requests only"),
    Controller("tokens + engine queue", weigh=True, engine_queue=True),
    Controller("requests + engine queue", engine_queue=True),
    Controller("no limit", limited=False),
)


@dataclass(frozen=True, slots=True)
class Backend:
    """The simulated engine: ``kv_tokens`` of KV cache, ``slots`` sequences at ``base_gap_s`` per token (more
    slow every step in proportion), ``prefill_s`` seconds per prompt token."""

    kv_tokens: int
    slots: int
    base_gap_s: float
    prefill_s: float

    def step_s(self, running: int) -> float:
        return self.base_gap_s * max(1.0, running / self.slots)


def weight(a: Arrival) -> int:
    """A request's tokens in flight as the gateway counts them: prompt + max_tokens (here the output's length)."""
    return a.prompt_tokens + a.output_tokens


@dataclass(slots=True)
class Outcome:
    arrival: Arrival
    admitted: bool
    given: int = 0                # the tokens the limit was given for it (0: it counts requests only)
    ttft_s: float = math.inf
    mean_gap_s: float = math.inf

    def good(self, slo_ttft_s: float) -> bool:
        return self.admitted and self.ttft_s <= slo_ttft_s and self.mean_gap_s <= SLO_GAP_S


def arrivals(rate: float, phase_s: float, prompts: Sequence[int], output_tokens: int, seed: int) -> list[Arrival]:
    """Poisson arrivals at ``rate`` per second over ``len(prompts)`` phases, each phase's prompts of that size
    (+-10 %, uniform)."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    t = rng.expovariate(rate)
    while t < phase_s * len(prompts):
        size = prompts[min(len(prompts) - 1, int(t // phase_s))]
        out.append(Arrival(t, rng.randint(int(size * 0.9), int(size * 1.1)), output_tokens))
        t += rng.expovariate(rate)
    return out


@dataclass(slots=True)
class Run:
    name: str
    outcomes: list[Outcome]
    samples: list[tuple[float, int | None, int | None, int]]  # each second: (t, limit, token limit, tokens let in)
    most_tokens: list[int]                                    # per phase: the most tokens in flight at once


def simulate(backend: Backend, trace: list[Arrival], ctl: Controller, phase_s: float) -> Run:
    """Run ``trace`` through one controller."""
    now = [0.0]
    limit = AdaptiveLimit(initial=8, max_limit=512, clock=lambda: now[0]) if ctl.limited else None
    outcomes: list[Outcome] = []
    waiting: deque[tuple[Request, Outcome]] = deque()
    batch: list[tuple[Request, Outcome]] = []
    kv_used = 0
    in_flight_tokens = 0
    most = [0] * len(PHASES)
    samples: list[tuple[float, int | None, int | None, int]] = []
    next_sample = 0.0
    i = 0
    t = 0.0
    for _ in range(50_000_000):  # a bound on the loop, far above any run here
        while waiting and kv_used + weight(waiting[0][0].arrival) <= backend.kv_tokens:  # join, first come first
            req, out = waiting.popleft()
            kv_used += weight(req.arrival)
            req.first_token_s = req.last_token_s = t + backend.prefill_s * req.arrival.prompt_tokens
            req.tokens = 1
            batch.append((req, out))
        if not batch:
            if i >= len(trace):
                break
            t = max(t, trace[i].at_s)
        step = backend.step_s(len(batch)) if batch else 0.0
        end = t + step
        while i < len(trace) and trace[i].at_s <= end:          # arrivals during this step, in order
            a = trace[i]
            now[0] = a.at_s
            while next_sample <= a.at_s:
                samples.append((next_sample, None if limit is None else limit.limit,
                                None if limit is None else limit.token_limit, in_flight_tokens))
                next_sample += 1.0
            given = weight(a) if ctl.weigh else 0
            out = Outcome(a, limit is None or limit.try_acquire(given), given)
            outcomes.append(out)
            if out.admitted:
                waiting.append((Request(a), out))
                in_flight_tokens += weight(a)
                p = min(len(PHASES) - 1, int(a.at_s // phase_s))
                most[p] = max(most[p], in_flight_tokens)
            i += 1
        now[0] = end
        batch, done = decode_step(batch, t, step)
        for req, out in done:
            kv_used -= weight(req.arrival)
            in_flight_tokens -= weight(req.arrival)
            if limit is not None:
                limit.release(out.given)
                limit.observe(ttft_s=out.ttft_s, prompt_tokens=req.arrival.prompt_tokens, gaps_s=req.gaps_s,
                              engine_waiting=len(waiting) if ctl.engine_queue else None)
        t = end
    return Run(ctl.name, outcomes, samples, most)


def _nearest_rank(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    return values[max(1, math.ceil(q * len(values))) - 1]


def summarise(run: Run, phase_s: float, early_s: float, slo_ttft_s: float) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    for p in range(len(PHASES)):
        mine = [o for o in run.outcomes if min(len(PHASES) - 1, int(o.arrival.at_s // phase_s)) == p]
        early = [o for o in mine if o.arrival.at_s - p * phase_s < early_s]
        ttfts = [o.ttft_s for o in mine if o.admitted]
        rows.append({
            "admitted": sum(o.admitted for o in mine),
            "refused": sum(not o.admitted for o in mine),
            "goodput": sum(o.good(slo_ttft_s) for o in mine) / phase_s,
            "early_goodput": sum(o.good(slo_ttft_s) for o in early) / early_s,
            "ttft_p50": _nearest_rank(ttfts, 0.5),
            "ttft_p99": _nearest_rank(ttfts, 0.99),
            "most_tokens": run.most_tokens[p],
            "limit": median([float(v) for t, v, _, _ in run.samples
                             if v is not None and min(2, int(t // phase_s)) == p]),
        })
    return rows


def _s(x: float) -> str:
    return "-" if x != x else ("never" if math.isinf(x) else f"{x:.3g} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=20.0,
                    help="arrivals per second (capacity: about 25 with short prompts, 5.5 with long ones)")
    ap.add_argument("--phase-s", type=float, default=300.0, help="seconds per phase (3 phases)")
    ap.add_argument("--kv-tokens", type=int, default=65_536, help="the KV cache, tokens")
    ap.add_argument("--slots", type=int, default=32, help="sequences decoded at the base gap")
    ap.add_argument("--base-gap-s", type=float, default=0.02, help="seconds per token")
    ap.add_argument("--prefill-s", type=float, default=0.00005, help="seconds per prompt token")
    ap.add_argument("--light-prompt", type=int, default=512, help="prompt tokens, first and last phase")
    ap.add_argument("--heavy-prompt", type=int, default=8192, help="prompt tokens, middle phase")
    ap.add_argument("--output-tokens", type=int, default=64, help="tokens per answer (and its max_tokens)")
    ap.add_argument("--slo-ttft-s", type=float, default=2.0, help="goodput's TTFT bound, seconds")
    ap.add_argument("--early-s", type=float, default=60.0, help="the first seconds of each phase, reported apart")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    phase_s = args.phase_s
    backend = Backend(args.kv_tokens, args.slots, args.base_gap_s, args.prefill_s)
    prompts = (args.light_prompt, args.heavy_prompt, args.light_prompt)
    trace = arrivals(args.rate, phase_s, prompts, args.output_tokens, args.seed)
    t0 = time.perf_counter()
    runs = [simulate(backend, trace, ctl, phase_s) for ctl in CONTROLLERS]
    wall = time.perf_counter() - t0
    summaries = [summarise(r, phase_s, args.early_s, args.slo_ttft_s) for r in runs]
    per_s = args.slots / args.base_gap_s / args.output_tokens   # requests/s while compute is the bound
    heavy_fit = args.kv_tokens // (args.heavy_prompt + args.output_tokens)
    heavy_per_s = min(per_s, heavy_fit / (args.output_tokens * args.base_gap_s))

    print(f"Tokens in flight on a simulated backend bound by its KV cache: {len(trace):,} arrivals at "
          f"{args.rate:g}/s over 3 x {phase_s:g} s, {args.output_tokens}-token answers; prompts of "
          f"{args.light_prompt}, {args.heavy_prompt}, {args.light_prompt} tokens (+-10 %). KV cache "
          f"{args.kv_tokens:,} tokens ({heavy_fit} long-prompt requests at once), {args.slots} slots at "
          f"{args.base_gap_s * 1e3:g} ms/token, prefill {args.prefill_s * 1e6:g} us/prompt token: capacity about "
          f"{per_s:.3g} requests/s with short prompts, {heavy_per_s:.3g} with long ones. Goodput: TTFT <= "
          f"{args.slo_ttft_s:g} s and mean gap <= {SLO_GAP_S * 1e3:g} ms, per second. Simulated in {wall:.1f} s.\n")
    rows: list[list[object]] = []
    for run, summary in zip(runs, summaries, strict=True):
        for p, s in enumerate(summary):
            rows.append([run.name, PHASES[p], s["limit"], int(s["admitted"]), int(s["refused"]), s["goodput"],
                         s["early_goodput"], _s(s["ttft_p50"]), _s(s["ttft_p99"]), int(s["most_tokens"])])
    print(table(["controller", "phase", "limit (median, requests)", "admitted", "refused", "goodput (/s)",
                 f"goodput, first {args.early_s:g} s", "TTFT p50", "TTFT p99", "most tokens let in at once"], rows))
    print()
    ratio_rows: list[list[object]] = []
    for mode, (ours, count) in (("latency alone", (summaries[0], summaries[1])),
                                ("with the engine's queue", (summaries[2], summaries[3]))):
        for p in range(len(PHASES)):
            ratio_rows.append([mode, PHASES[p], _ratio(ours[p]["goodput"], count[p]["goodput"]),
                               _ratio(ours[p]["early_goodput"], count[p]["early_goodput"]),
                               _ratio(count[p]["ttft_p99"], ours[p]["ttft_p99"])])
    print(table(["limits told", "phase", "goodput tokens / requests only", f"first {args.early_s:g} s",
                 "TTFT p99 requests only / tokens"], ratio_rows))
    step = max(1, int(phase_s // 10))
    print(f"\nEvery {step} s (the long prompts from {phase_s:g} s to {2 * phase_s:g} s): limit in requests / token "
          "limit (- before it has one) / tokens in flight")
    for run in runs[:4]:
        print(f"  {run.name:<23} " + " ".join(
            f"{lim}/{'-' if tok is None else tok}/{held}" for t, lim, tok, held in run.samples if int(t) % step == 0))


if __name__ == "__main__":
    main()
