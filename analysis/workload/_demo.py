"""A synthetic but realistic workload of request summaries, with an overload burst where survivor bias shows.

:func:`simulate_demo_workload` runs a small, seeded, discrete-event simulation of two model servers
(continuous batching behind a bounded admission queue) fed by the Azure LLM inference trace or by
Poisson arrivals, and returns one request-summary row per request in the schema of
:func:`llmslo.analysis.store.polars_schema`.

For :data:`BURST_DURATION_S` seconds starting :data:`BURST_OFFSET_S` seconds after the first arrival, the
arrivals of a :data:`BURST_FACTOR` times longer stretch of the input are squeezed in (same requests,
shorter gaps). The servers are then overloaded: the queue fills and sheds (``rejected``/``queue_full``),
clients give up before their first token (``client_cancel`` with a null TTFT), a few requests hit their
server ``deadline``. TTFT computed over ``stop``/``length`` requests only looks better than what
clients lived through: the requests that waited longest are exactly the ones missing from it. On the
Azure conversation trace (seed 0) a quarter of the admitted burst requests end without a first token, the
success-only TTFT p99 stays just under the clients' patience (about 10 s) while the Kaplan–Meier survival
at that "p99" is still about 2.5%, and per 30 s window the 8B server's success-only p99 improves while
its shed fraction rises.

What is modelled, per model server (times in seconds of simulated server time):

* admission: a FIFO queue of ``queue_capacity`` requests; an arrival that finds it full is rejected
  after :data:`REJECT_LATENCY_S`;
* scheduling: a batch of at most ``max_batch`` running requests; each engine step prefills the requests
  that join (up to ``prefill_token_budget`` prompt tokens, at least one request) and decodes one token for
  every request already running. Step time = Σ prefill(prompt) + decode(batch size), with
  ``prefill = prefill_base_s + prefill_per_token_s × prompt_tokens`` and
  ``decode = decode_base_s + decode_per_seq_s × running requests``. A joining request's first token is
  committed at the end of its step; every running request commits one token per step;
* clients: a patience on TTFT (lognormal); a request without a first token at ``arrival + patience``
  ends as ``client_cancel`` (``queue_s`` set only if it had been scheduled);
* a share of requests carries a server deadline on the whole request (:data:`DEADLINE_S`); a small share
  fails with an ``error`` (``error_type`` ``cuda_oom`` or ``engine_error``) after a random number of tokens;
  output is capped at a per-request ``max_tokens`` (``length`` when the requested output reaches it).

Decorations that do not feed back into the server model: client-side times (server time plus a
network round trip), a few slow stream readers (``stream_paused_s > 0``; some disconnect mid-stream with
``sent_tokens < generated_tokens``), version ``v2`` for a canary share, and ``itl_s`` for the first
:data:`ITL_ROWS` successful requests (one gap per token after the first, which here is the step time).
"""

from __future__ import annotations

import datetime as dt
import heapq
import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl

from llmslo.analysis.store import polars_schema

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "BURST_DURATION_S",
    "BURST_FACTOR",
    "BURST_OFFSET_S",
    "DEADLINE_S",
    "ITL_ROWS",
    "REJECT_LATENCY_S",
    "SERVERS",
    "DEMO_START_UNIX_S",
    "ServerModel",
    "demo_workload_note",
    "simulate_demo_workload",
]

BURST_OFFSET_S = 900.0
"""Start of the overload burst, seconds after the first arrival (output timeline)."""
BURST_DURATION_S = 180.0
"""Length of the burst, seconds (output timeline)."""
BURST_FACTOR = 4.0
"""Arrival densification inside the burst: input gaps are divided by this factor."""

SYNTHETIC_RATE_PER_S = 5.0
"""Mean arrival rate of the synthetic (no trace) workload, requests per second."""
SYNTHETIC_REQUESTS = 18_000
"""Number of synthetic requests when ``max_requests`` is None (about one hour at 5 req/s)."""

REJECT_LATENCY_S = 0.002
"""Server time to answer a rejected request (429), seconds."""
FINISH_OVERHEAD_S = 0.001
"""Time from the last token commit to the terminal state (flush, bookkeeping), seconds."""
DEADLINE_S = 30.0
"""Server deadline on the whole request, seconds from arrival (for :data:`DEADLINE_SHARE`)."""
DEADLINE_SHARE = 0.3
ERROR_SHARE = 0.003
"""Share of requests that fail with an ``error`` at a random point of their generation."""
MAX_TOKENS = {1: 0.01, 256: 0.1, 1024: 0.89}
"""``max_tokens`` of the requests and their shares (1: classification-style one-token replies)."""
INTERACTIVE_SHARE = 0.8
"""Share of ``interactive`` tenants; the rest are ``batch`` (more patient)."""
PATIENCE_MEDIAN_S = {"interactive": 9.0, "batch": 40.0}
"""Median client patience on TTFT, seconds (lognormal, sigma :data:`PATIENCE_SIGMA`)."""
PATIENCE_SIGMA = 0.3
V2_SHARE = 0.1
"""Share of requests served by the canary version ``v2`` (same behaviour as ``v1``)."""
NETWORK_RTT_MEDIAN_S = 0.02
"""Median network round trip added to server times to get client times, seconds (lognormal)."""
SLOW_CLIENT_SHARE = 0.01
"""Share of successful requests with at least :data:`SLOW_CLIENT_MIN_TOKENS` tokens read slowly."""
SLOW_CLIENT_MIN_TOKENS = 32
SEND_QUEUE_CAPACITY = 16
"""Per-request send-queue capacity, chunks of one token."""
ITL_ROWS = 200
STARVED_SHARE = 0.12
"""Share of the admitted burst requests with long prompts (the longest quarter) that KV-cache pressure
preempts before their first token and never resumes: they wait until the client gives up or the server
deadline ends them. They are the requests a success-only TTFT never sees."""
"""Number of successful requests (earliest arrivals) whose ``itl_s`` is filled."""

_NO_DEADLINE_S = 1e9
# Finish codes of the simulation, mapped to finish reasons at the end.
_FINISHED, _CANCEL, _DEADLINE, _REJECTED, _ERROR = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class ServerModel:
    """One model server: admission queue, batch size and the engine's step-time model (seconds)."""

    model: str
    share: float
    """Share of the arrivals routed to this model."""
    max_batch: int
    queue_capacity: int
    prefill_base_s: float
    prefill_per_token_s: float
    decode_base_s: float
    decode_per_seq_s: float
    prefill_token_budget: int
    """Prompt tokens prefilled per engine step at most (at least one request always joins)."""


SERVERS: tuple[ServerModel, ...] = (
    # 50k prompt tok/s prefill; a 64-wide decode step of 14.4 ms. On the Azure conversation trace
    # (mean 1,155 prompt and 211 output tokens) one request costs about 80 ms of engine time at full
    # batch, so capacity is about 12 req/s against at most ~7 req/s outside the burst and ~18 in it.
    ServerModel("llama-3.1-8b", 0.8, max_batch=64, queue_capacity=32, prefill_base_s=0.01,
                prefill_per_token_s=0.02e-3, decode_base_s=0.008, decode_per_seq_s=0.1e-3,
                prefill_token_budget=8192),
    # About 4x slower per token: capacity about 3 req/s against at most ~1.7 outside the burst. Its
    # queue holds more than a patience's worth of work, so in the burst it rarely fills: its clients
    # cancel (the queue is bounded in length but not in time) instead of being rejected.
    ServerModel("llama-3.1-70b", 0.2, max_batch=32, queue_capacity=64, prefill_base_s=0.03,
                prefill_per_token_s=0.08e-3, decode_base_s=0.02, decode_per_seq_s=0.4e-3,
                prefill_token_budget=4096),
)
"""The two simulated servers (model names, routing shares and constants)."""


@dataclass
class _Outcome:
    """Per-request result of one server's simulation (absolute simulation seconds, NaN where unset).

    The engine keeps a step clock: every running request commits one token per step, so a request's
    tokens are the steps from ``join_step`` (its first token) to ``last_step``; ``runs_*`` record the
    runs of equal steps (steps ``runs_before[r] + 1 …`` of ``runs_dt[r]`` seconds from ``runs_t[r]``).
    """

    code: IntArray
    scheduled: FloatArray
    end: FloatArray
    join_step: IntArray
    last_step: IntArray
    runs_before: IntArray
    runs_t: FloatArray
    runs_dt: FloatArray

    def generated(self) -> IntArray:
        """Tokens committed per request."""
        return np.where(self.join_step >= 0, self.last_step - self.join_step + 1, 0)

    def step_time(self, step: IntArray) -> FloatArray:
        """Commit time of each global step (NaN for step -1, i.e. no token)."""
        run = np.maximum(np.searchsorted(self.runs_before, step, side="left") - 1, 0)
        at = self.runs_t[run] + (step - self.runs_before[run]) * self.runs_dt[run]
        return np.where(step >= 0, at, np.nan)

    def gaps(self, i: int) -> list[float]:
        """Inter-token gaps of request ``i``, seconds: one per token after the first."""
        steps = np.arange(self.join_step[i] + 1, self.last_step[i] + 1)
        run = np.searchsorted(self.runs_before, steps, side="left") - 1
        return [float(g) for g in self.runs_dt[run]]


class _Server:
    """Event loop of one server over its arrivals (sorted by time); equal steps run in bulk."""

    def __init__(self, spec: ServerModel, arrival: FloatArray, prompt: IntArray, end_tokens: IntArray,
                 fails: BoolArray, patience: FloatArray, deadline: FloatArray) -> None:
        n = len(arrival)
        self.spec = spec
        self.arrival = arrival
        self.prompt = prompt
        self.prefill_s = spec.prefill_base_s + spec.prefill_per_token_s * prompt.astype(np.float64)
        self.end_tokens = end_tokens  # tokens committed before the request ends (normally or by error)
        self.fails = fails
        self.deadline_at = arrival + deadline
        self.has_deadline = deadline < _NO_DEADLINE_S
        self.give_up_at = arrival + np.minimum(patience, deadline)
        self.gives_up_by_deadline = deadline < patience
        self.in_queue = np.zeros(n, dtype=np.bool_)
        self.queue: deque[int] = deque()
        self.expiries: list[tuple[float, int]] = []  # heap of (give-up time, queued request)
        self.queued = 0
        self.next_arrival = 0
        self.code = np.full(n, -1, dtype=np.int64)
        self.scheduled = np.full(n, np.nan)
        self.end = np.full(n, np.nan)
        self.join_step = np.full(n, -1, dtype=np.int64)
        self.last_step = np.full(n, -1, dtype=np.int64)

    def _give_up(self, i: int) -> None:
        """The client's patience or the server deadline ran out before the first token."""
        self.code[i] = _DEADLINE if self.gives_up_by_deadline[i] else _CANCEL
        self.end[i] = self.give_up_at[i]

    def _expire_queue(self, until: float) -> None:
        """End every queued request whose give-up time is at or before ``until``."""
        while self.expiries and self.expiries[0][0] <= until:
            _, i = heapq.heappop(self.expiries)
            if self.in_queue[i]:
                self.in_queue[i] = False
                self.queued -= 1
                self._give_up(i)

    def _admit_until(self, t: float) -> None:
        """Admit or reject every arrival up to ``t``, in time order with queue expiries."""
        while self.next_arrival < len(self.arrival) and self.arrival[self.next_arrival] <= t:
            i = self.next_arrival
            self.next_arrival += 1
            self._expire_queue(float(self.arrival[i]))
            if self.queued >= self.spec.queue_capacity:
                self.code[i] = _REJECTED
                self.end[i] = self.arrival[i] + REJECT_LATENCY_S
                continue
            self.in_queue[i] = True
            self.queued += 1
            self.queue.append(i)
            heapq.heappush(self.expiries, (float(self.give_up_at[i]), i))
        self._expire_queue(t)

    def _schedule(self, t: float, free: int) -> list[int]:
        """Move queued requests into the batch (FIFO) within the free slots and the prefill budget."""
        joiners: list[int] = []
        budget = self.spec.prefill_token_budget
        while free > 0 and self.queued > 0:
            i = self.queue[0]
            if not self.in_queue[i]:  # gave up while queued
                self.queue.popleft()
                continue
            if joiners and self.prompt[i] > budget:
                break
            self.queue.popleft()
            self.in_queue[i] = False
            self.queued -= 1
            budget -= int(self.prompt[i])
            free -= 1
            joiners.append(i)
            self.scheduled[i] = t
        return joiners

    def run(self) -> _Outcome:
        spec, n = self.spec, len(self.arrival)
        running: set[int] = set()
        ends: list[tuple[int, int]] = []  # heap of (step at which a running request ends, request)
        deadlines: list[tuple[float, int]] = []  # heap of (deadline, running request)
        runs: list[tuple[int, float, float]] = []
        t, step = 0.0, 0  # simulation time, engine steps so far
        while self.next_arrival < n or self.queued > 0 or running:
            if not running and self.queued == 0:  # idle: wait for the next arrival
                t = max(t, float(self.arrival[self.next_arrival]))
            self._admit_until(t)
            joiners = self._schedule(t, spec.max_batch - len(running))
            if not running and not joiners:
                continue
            dt = sum(float(self.prefill_s[i]) for i in joiners)
            steps = 1
            if running:
                dt += spec.decode_base_s + spec.decode_per_seq_s * len(running)
                while ends[0][1] not in running:
                    heapq.heappop(ends)
                while deadlines and deadlines[0][1] not in running:
                    heapq.heappop(deadlines)
            if not joiners:  # the batch is unchanged until the next end, deadline or arrival
                steps = ends[0][0] - step
                if deadlines:
                    steps = min(steps, math.floor((deadlines[0][0] - t) / dt) + 1)
                if self.next_arrival < n:
                    steps = min(steps, math.ceil((self.arrival[self.next_arrival] - t) / dt))
                steps = max(1, steps)
            runs.append((step, t, dt))
            t_end, last = t + steps * dt, step + steps
            # A deadline strikes before the run's final commit; an error strikes instead of a commit.
            while deadlines and deadlines[0][0] < t_end:
                at, i = heapq.heappop(deadlines)
                if i in running:
                    running.remove(i)
                    self.code[i], self.end[i], self.last_step[i] = _DEADLINE, at, last - 1
            while ends and ends[0][0] <= last:
                _, i = heapq.heappop(ends)
                if i in running:
                    running.remove(i)
                    self._finish(i, last, t_end)
            for i in joiners:  # prefilled in this (single) step: first token at its end
                if self.give_up_at[i] < t_end:
                    self._give_up(i)
                    continue
                self.join_step[i] = last
                end_step = last + int(self.end_tokens[i]) - 1 + int(self.fails[i])
                if end_step == last:  # a one-token reply, or an error during prefill
                    self._finish(i, last, t_end)
                    continue
                running.add(i)
                heapq.heappush(ends, (end_step, i))
                if self.has_deadline[i]:
                    heapq.heappush(deadlines, (float(self.deadline_at[i]), i))
            t, step = t_end, last
        return _Outcome(
            code=self.code, scheduled=self.scheduled, end=self.end, join_step=self.join_step,
            last_step=self.last_step, runs_before=np.array([r[0] for r in runs], dtype=np.int64),
            runs_t=np.array([r[1] for r in runs]), runs_dt=np.array([r[2] for r in runs]),
        )

    def _finish(self, i: int, step: int, at: float) -> None:
        """End request ``i`` at global step ``step`` (time ``at``): its last commit, or its error."""
        if self.fails[i]:
            self.code[i], self.end[i], self.last_step[i] = _ERROR, at, step - 1
            if step - 1 < self.join_step[i]:  # failed during prefill: no token
                self.join_step[i] = self.last_step[i] = -1
        else:
            self.code[i], self.end[i], self.last_step[i] = _FINISHED, at + FINISH_OVERHEAD_S, step


@dataclass(frozen=True)
class _Workload:
    """Arrivals (seconds from the first, output timeline) and requested lengths, sorted by arrival."""

    arrival: FloatArray
    prompt: IntArray
    requested: IntArray


def _read_trace(path: Path, max_requests: int | None) -> _Workload:
    """Arrival offsets and token lengths of an Azure LLM inference trace CSV (timestamps read as UTC)."""
    frame = pl.read_csv(path, columns=["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
                        schema_overrides={"TIMESTAMP": pl.String})
    stamp = pl.col("TIMESTAMP").str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_unit="us", time_zone="UTC")
    frame = frame.with_columns(stamp).sort("TIMESTAMP", maintain_order=True)
    if max_requests is not None:
        frame = frame.head(max_requests)
    offset = (frame["TIMESTAMP"] - frame["TIMESTAMP"].min()).dt.total_microseconds().to_numpy() / 1e6
    return _Workload(
        arrival=offset.astype(np.float64),
        prompt=np.maximum(frame["ContextTokens"].to_numpy().astype(np.int64), 0),
        requested=np.maximum(frame["GeneratedTokens"].to_numpy().astype(np.int64), 1),
    )


def _synthetic(rng: np.random.Generator, n: int) -> _Workload:
    """Poisson arrivals and lognormal lengths shaped like the Azure conversation trace."""
    gaps = rng.exponential(1.0 / SYNTHETIC_RATE_PER_S, n)
    gaps[0] = 0.0
    prompt = np.clip(np.rint(rng.lognormal(math.log(900.0), 0.8, n)), 2, 16_000)
    requested = np.clip(np.rint(rng.lognormal(math.log(150.0), 0.8, n)), 1, 2_000)
    return _Workload(np.cumsum(gaps), prompt.astype(np.int64), requested.astype(np.int64))


def _densify(offset: FloatArray) -> FloatArray:
    """Squeeze ``BURST_FACTOR × BURST_DURATION_S`` seconds of arrivals into the burst window."""
    start, span = BURST_OFFSET_S, BURST_DURATION_S * BURST_FACTOR
    squeezed = start + (offset - start) / BURST_FACTOR
    after = offset - span + BURST_DURATION_S
    return np.where(offset < start, offset, np.where(offset < start + span, squeezed, after))


def _nullable(values: FloatArray) -> pl.Series:
    """A float column with NaN turned into null, rounded to microseconds."""
    return pl.Series(np.round(values, 6)).fill_nan(None)


DEMO_START_UNIX_S = 1_700_000_000.0
"""Where the demo's timeline starts (2023-11-14 22:13:20 UTC), whatever the trace's own dates."""


def _utc(unix_s: float) -> str:
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def demo_workload_note(trace_csv: Path | None, *, start_unix_s: float = DEMO_START_UNIX_S) -> str:
    """What :func:`simulate_demo_workload` makes of ``trace_csv`` (None: synthetic arrivals), for a person: where
    the arrivals come from, the fixed start of the replay beside the trace's own first arrival, and the burst
    squeezed into it. Reads the trace's timestamps (about 20k rows: fast)."""
    squeezed = (f"{BURST_OFFSET_S / 60:g} min in, {BURST_DURATION_S * BURST_FACTOR / 60:g} min of its arrivals "
                f"squeezed into {BURST_DURATION_S / 60:g} min (a {BURST_FACTOR:g}× burst)")
    if trace_csv is None:
        return (f"synthetic arrivals: no trace found; Poisson at {SYNTHETIC_RATE_PER_S:g} req/s from a fixed start, "
                f"{_utc(start_unix_s)} UTC; {squeezed}")
    stamps = pl.read_csv(trace_csv, columns=["TIMESTAMP"], schema_overrides={"TIMESTAMP": pl.String})
    first = stamps.select(pl.col("TIMESTAMP").str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_unit="us",
                                                              time_zone="UTC").min()).item()
    own = f"the trace starts {first:%Y-%m-%d %H:%M:%S} UTC" if first is not None else "the trace has no arrival"
    return (f"arrivals and lengths from {trace_csv}: its gaps between arrivals and its token lengths, replayed "
            f"from a fixed start, {_utc(start_unix_s)} UTC ({own}); {squeezed}, so the replay is "
            f"{BURST_DURATION_S * (BURST_FACTOR - 1) / 60:g} min shorter than the trace")


def simulate_demo_workload(
    trace_csv: Path | None = None,
    *,
    seed: int = 0,
    start_unix_s: float = DEMO_START_UNIX_S,
    max_requests: int | None = None,
) -> pl.DataFrame:
    """Simulate a serving workload with an overload burst; one request-summary row per request.

    ``trace_csv``: an Azure LLM inference trace (``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``)
    whose inter-arrival times and token lengths drive the simulation; ``None`` draws Poisson arrivals at
    :data:`SYNTHETIC_RATE_PER_S` req/s with lognormal lengths. ``seed`` fixes every random draw (same
    arguments, same frame). ``start_unix_s``: wall-clock Unix seconds of the first arrival.
    ``max_requests``: use only the first requests of the trace (default: all of it, or
    :data:`SYNTHETIC_REQUESTS` synthetic ones).

    Arrivals between ``start_unix_s + BURST_OFFSET_S`` and ``+ BURST_DURATION_S`` come
    :data:`BURST_FACTOR` times denser (a workload shorter than the offset has no burst). The frame has
    exactly the columns and dtypes of :func:`~llmslo.analysis.store.polars_schema`, rows in arrival
    order, ``request_id`` ``req-000001``…; every row satisfies the request-summary contract. All
    intervals are seconds of server time from arrival, ``client_*`` add a simulated network round trip.
    About a second (0.6 s on an idle core) for the 19k-request Azure conversation trace.
    """
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"max_requests must be at least 1, got {max_requests}")
    rng_work, rng = np.random.default_rng(seed).spawn(2)
    if trace_csv is not None:
        work = _read_trace(trace_csv, max_requests)
    else:
        work = _synthetic(rng_work, SYNTHETIC_REQUESTS if max_requests is None else max_requests)
    n = len(work.arrival)
    if n == 0:
        raise ValueError(f"no requests in {trace_csv}")
    arrival = _densify(work.arrival)

    # Per-request draws, all made up front so the result does not depend on the simulation's path.
    server_of = rng.choice(len(SERVERS), size=n, p=[s.share for s in SERVERS])
    interactive = rng.random(n) < INTERACTIVE_SHARE
    median = np.where(interactive, PATIENCE_MEDIAN_S["interactive"], PATIENCE_MEDIAN_S["batch"])
    patience = median * np.exp(PATIENCE_SIGMA * rng.standard_normal(n))
    deadline = np.where(rng.random(n) < DEADLINE_SHARE, DEADLINE_S, _NO_DEADLINE_S)
    max_tokens = rng.choice(list(MAX_TOKENS), size=n, p=list(MAX_TOKENS.values()))
    target = np.minimum(work.requested, max_tokens)
    capped = work.requested >= max_tokens
    fails = rng.random(n) < ERROR_SHARE
    end_tokens = np.where(fails, np.floor(rng.random(n) * target).astype(np.int64), target)
    oom = rng.random(n) < 0.7
    v2 = rng.random(n) < V2_SHARE
    rtt = NETWORK_RTT_MEDIAN_S * np.exp(0.5 * rng.standard_normal(n))
    slow = rng.random(n) < SLOW_CLIENT_SHARE
    slow_gone = rng.random(n) < 0.5
    slow_read = rng.uniform(0.3, 0.9, n)
    slow_queued = rng.integers(8, SEND_QUEUE_CAPACITY + 1, n)
    slow_paused = rng.uniform(0.5, 5.0, n)

    code = np.full(n, -1, dtype=np.int64)
    scheduled, first, last, end = (np.full(n, np.nan) for _ in range(4))
    generated = np.zeros(n, dtype=np.int64)
    outcomes: list[_Outcome] = []
    local = np.zeros(n, dtype=np.int64)  # position of each request among its server's requests
    for k, spec in enumerate(SERVERS):
        idx = np.flatnonzero(server_of == k)
        local[idx] = np.arange(len(idx))
        res = _Server(spec, arrival[idx], work.prompt[idx], end_tokens[idx], fails[idx], patience[idx],
                      deadline[idx]).run()
        outcomes.append(res)
        code[idx], scheduled[idx], end[idx] = res.code, res.scheduled, res.end
        first[idx], last[idx] = res.step_time(res.join_step), res.step_time(res.last_step)
        generated[idx] = res.generated()
    finished = code == _FINISHED
    keep_itl = np.flatnonzero(finished)[:ITL_ROWS]
    itl_rows: list[list[float] | None] = [None] * n
    for i in keep_itl.tolist():
        itl_rows[i] = outcomes[server_of[i]].gaps(int(local[i]))

    # Slow stream readers: the producer waits ``paused`` s for send credit. Those who recover get every
    # token ``paused`` s later; those who leave stop reading part-way, and disconnect ``paused`` s later
    # with a full send queue: tokens generated but never sent.
    eligible = finished & slow & (generated >= SLOW_CLIENT_MIN_TOKENS) & (deadline > DEADLINE_S)
    eligible[keep_itl] = False
    gone, recovered = eligible & slow_gone, eligible & ~slow_gone
    paused = np.where(eligible, slow_paused, 0.0)
    cut = np.maximum(slow_queued + 1, np.floor(slow_read * generated).astype(np.int64))
    cut_last = first + (last - first) * (cut - 1) / np.maximum(generated - 1, 1)
    last = np.where(recovered, last + paused, np.where(gone, cut_last, last))
    end = np.where(recovered, end + paused, np.where(gone, cut_last + paused, end))
    generated = np.where(gone, cut, generated)
    sent = np.where(gone, generated - slow_queued, generated)
    max_queued = np.where(gone, slow_queued, np.where(recovered, SEND_QUEUE_CAPACITY, 0))
    code = np.where(gone, _CANCEL, code)

    # KV-cache pressure in the burst: long prompts preempted before their first token starve until the
    # client's patience or the server deadline runs out.
    in_burst = (arrival >= BURST_OFFSET_S) & (arrival < BURST_OFFSET_S + BURST_DURATION_S)
    long_prompt = work.prompt >= np.quantile(work.prompt, 0.75)
    starved = (in_burst & long_prompt & (code == _FINISHED) & ~eligible
               & (rng.random(n) < STARVED_SHARE / 0.25))
    starved[keep_itl] = False
    waited = np.minimum(patience, deadline)
    code = np.where(starved, np.where(deadline < patience, _DEADLINE, _CANCEL), code)
    end = np.where(starved, arrival + waited, end)
    scheduled = np.where(starved & (scheduled - arrival > waited), np.nan, scheduled)
    first = np.where(starved, np.nan, first)
    last = np.where(starved, np.nan, last)
    generated = np.where(starved, 0, generated)
    sent = np.where(starved, 0, sent)
    finished = code == _FINISHED

    reason_names = np.array(["stop", "client_cancel", "deadline", "rejected", "error", "length"])
    reason = reason_names[np.where(finished & capped & (code == _FINISHED), 5, code)]
    rejected = code == _REJECTED
    ttft = first - arrival
    e2e = end - arrival
    return pl.DataFrame(
        {
            "request_id": [f"req-{i:06d}" for i in range(1, n + 1)],
            "model": np.array([s.model for s in SERVERS])[server_of],
            "version": np.where(v2, "v2", "v1"),
            "tenant_class": np.where(interactive, "interactive", "batch"),
            "arrival_unix_s": start_unix_s + arrival,
            "finish_reason": reason,
            "reject_reason": pl.Series(np.where(rejected, "queue_full", "")).replace("", None),
            "error_type": pl.Series(np.where(code == _ERROR, np.where(oom, "cuda_oom", "engine_error"), ""))
            .replace("", None),
            "queue_s": _nullable(scheduled - arrival),
            "ttft_s": _nullable(ttft),
            "last_token_s": _nullable(np.minimum(last, end) - arrival),
            "e2e_s": _nullable(e2e),
            "prompt_tokens": work.prompt,
            "proposed_tokens": np.zeros(n, dtype=np.int64),
            "generated_tokens": generated,
            "sent_tokens": sent,
            "client_ttft_s": _nullable(ttft + rtt),
            "client_e2e_s": _nullable(e2e + rtt),
            "stream_paused_s": np.round(paused, 6),
            "stream_max_queued": max_queued.astype(np.int64),
            "itl_s": pl.Series(itl_rows, dtype=pl.List(pl.Float64)),
            "backend": pl.Series([None] * n, dtype=pl.Utf8),
        },
        schema=polars_schema(),
    )
