"""What the load generator sustains on one core, its cost per streamed chunk, and how accurate its timestamps are.

The server is the tests' SSE server (``tests/_loadgen_server.py``) under uvicorn, in its own process pinned to
one CPU; the client (this process) is pinned to another with ``os.sched_setaffinity``. Two measurements:

1. **Throughput and cost per chunk.** ``--requests`` streams of ``--tokens`` one-token chunks, all due at once,
   ``--concurrency`` in flight, as fast as the server sends. Cases, their order rotating from one repeat to
   the next:

   * bare: an ``httpx.AsyncClient`` streaming each reply with ``aiter_bytes()`` and counting bytes, nothing
     else (the baseline: what any Python client over httpx pays);
   * loadgen: ``llmslo.loadgen.run_load`` over the same server: SSE parsing, a monotonic timestamp per read,
     usage, classification, the token-weighted gaps, one validated summary row per attempt (kept in memory).

   Figures per case: requests/s and chunks/s (wall clock), and client CPU time per chunk (``process_time``);
   the measurement overhead per chunk is loadgen's CPU per chunk minus bare's. Goal: >= 1,000 chunks/s on one
   core. When both cases reach the same wall-clock rate the server is the bottleneck: read the CPU figures.

2. **Timestamp accuracy.** The server records ``time.monotonic_ns()`` just before it hands each chunk to the
   transport (CLOCK_MONOTONIC is one clock for every process on Linux); the client's receive time of that chunk
   minus it is the delay. Paced streams (``--paced-streams`` at ``--paced-tps`` tokens/s each), loadgen beside
   the bare client stamping each read. Median and p99 of the delay; goal < 1 ms.

Each figure is the median over the repeats of the figure within a repeat.

Run: ``.venv/bin/python -m llmslo.bench.bench_loadgen --repeats 5 --requests 200 --tokens 200``
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import httpx

from llmslo.bench._util import median, spread, table
from llmslo.loadgen import Arrival, LoadConfig, Schedule, Target, run_load
from llmslo.loadgen._stats import quantile
from llmslo.tests._loadgen_server import MODEL, ServerProcess

TARGET_CHUNKS_PER_S = 1_000
TARGET_DELAY_MS = 1.0
NS = 1e9


def _body(tokens: int) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "r0 a b c", "max_tokens": tokens, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()


async def bare(url: str, requests: int, tokens: int, concurrency: int) -> dict[str, float]:
    """The baseline: stream each reply with httpx and count its bytes."""
    sem = asyncio.Semaphore(concurrency)
    body = _body(tokens)
    total = 0

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal total
        async with sem, client.stream("POST", url + "/v1/completions", content=body,
                                      headers={"content-type": "application/json", "x-request-id": f"b{i}"}) as r:
            async for data in r.aiter_bytes():
                total += len(data)

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=concurrency, keepalive_expiry=2.0)
    async with httpx.AsyncClient(limits=limits, timeout=None, trust_env=False) as client:
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(requests)))
        return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "bytes": total}


async def loadgen(url: str, requests: int, tokens: int, concurrency: int) -> dict[str, float]:
    """The load generator over the same server, every arrival due at once, ``concurrency`` in flight."""
    schedule = Schedule(tuple(Arrival(i, 0.0, 4, tokens) for i in range(requests)), "bench")
    config = LoadConfig(Target.parse(url), MODEL, max_concurrency=concurrency)
    rows: list[Any] = []
    cpu, wall = time.process_time(), time.perf_counter()
    result = await run_load(schedule, config, sink=rows.append)
    out = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
           "chunks": sum(r["sent_tokens"] for r in rows)}
    if result.finish != {"length": requests}:
        raise SystemExit(f"the load generator's run did not complete cleanly: {result.finish}")
    return out


CASES: dict[str, Callable[[str, int, int, int], Coroutine[Any, Any, dict[str, float]]]] = {"bare": bare,
                                                                                    "loadgen": loadgen}


def throughput(srv: ServerProcess, args: argparse.Namespace) -> list[list[object]]:
    names = list(CASES)
    url = srv.url()
    asyncio.run(loadgen(url, min(20, args.requests), args.tokens, args.concurrency))  # warm-up
    asyncio.run(bare(url, min(20, args.requests), args.tokens, args.concurrency))
    per: dict[str, dict[str, list[float]]] = {n: {"req_s": [], "chunks_s": [], "cpu_us": []} for n in names}
    overhead: list[float] = []
    chunks = args.requests * args.tokens
    for r in range(args.repeats):
        got: dict[str, dict[str, float]] = {}
        for n in names[r % 2:] + names[:r % 2]:
            got[n] = asyncio.run(CASES[n](url, args.requests, args.tokens, args.concurrency))
        if got["loadgen"]["chunks"] != chunks:
            raise SystemExit(f"expected {chunks} chunks, the load generator received {got['loadgen']['chunks']}")
        for n in names:
            per[n]["req_s"].append(args.requests / got[n]["wall_s"])
            per[n]["chunks_s"].append(chunks / got[n]["wall_s"])
            per[n]["cpu_us"].append(got[n]["cpu_s"] / chunks * 1e6)
        overhead.append((got["loadgen"]["cpu_s"] - got["bare"]["cpu_s"]) / chunks * 1e6)
    rows: list[list[object]] = []
    for n in names:
        figure = n == "loadgen"
        cps = median(per[n]["chunks_s"])
        rows.append([n, median(per[n]["req_s"]), cps, median(per[n]["cpu_us"]), 1e6 / median(per[n]["cpu_us"]),
                     f">= {TARGET_CHUNKS_PER_S:,}" if figure else "(baseline)",
                     ("yes" if cps >= TARGET_CHUNKS_PER_S else "NO") if figure else "-", spread(per[n]["chunks_s"])])
    rows.append(["overhead (loadgen - bare)", "-", "-", median(overhead), "-", "(info)", "-", spread(overhead)])
    return rows


# ---- timestamp accuracy --------------------------------------------------------------------------------


async def bare_stamps(url: str, streams: int, tokens: int) -> list[tuple[str, list[int]]]:
    """The baseline: each read stamped with monotonic_ns, the events it completed counted by a blank line."""

    async def one(client: httpx.AsyncClient, rid: str) -> tuple[str, list[int]]:
        stamps: list[int] = []
        buf = b""
        async with client.stream("POST", url + "/v1/completions", content=_body(tokens),
                                 headers={"content-type": "application/json", "x-request-id": rid}) as r:
            async for data in r.aiter_bytes():
                now = time.monotonic_ns()
                buf += data
                n = buf.count(b"\n\n")
                buf = buf.rsplit(b"\n\n", 1)[-1] if n else buf
                stamps.extend([now] * n)
        return rid, stamps[:tokens]

    async with httpx.AsyncClient(timeout=None, trust_env=False) as client:
        return await asyncio.gather(*(one(client, f"s{time.monotonic_ns()}-{i}") for i in range(streams)))


async def loadgen_stamps(url: str, streams: int, tokens: int) -> list[tuple[str, list[int]]]:
    schedule = Schedule(tuple(Arrival(i, 0.0, 4, tokens) for i in range(streams)), "bench")
    log = io.StringIO()
    await run_load(schedule, LoadConfig(Target.parse(url), MODEL), attempts_log=log)
    entries = [json.loads(line) for line in log.getvalue().splitlines()]
    return [(e["request_id"], e["chunk_ns"]) for e in entries]


def delays_ms(srv: ServerProcess, stamps: list[tuple[str, list[int]]]) -> list[float]:
    out: list[float] = []
    for rid, received in stamps:
        sent = srv.stats(rid)["send_ns"][:len(received)]
        out.extend((r - s) / 1e6 for r, s in zip(received, sent, strict=True))
    return out


def accuracy(srv: ServerProcess, args: argparse.Namespace) -> list[list[object]]:
    url = srv.url(tps=args.paced_tps)
    rows: list[list[object]] = []
    for streams in args.paced_streams:
        per: dict[str, dict[str, list[float]]] = {n: {"p50": [], "p99": []} for n in ("bare", "loadgen")}
        for r in range(args.repeats):
            for n in (("bare", "loadgen") if r % 2 == 0 else ("loadgen", "bare")):
                make = bare_stamps if n == "bare" else loadgen_stamps
                ms = sorted(delays_ms(srv, asyncio.run(make(url, streams, args.paced_tokens))))
                per[n]["p50"].append(quantile(ms, 0.5))
                per[n]["p99"].append(quantile(ms, 0.99))
        for n in ("bare", "loadgen"):
            figure = n == "loadgen"
            p50, p99 = median(per[n]["p50"]), median(per[n]["p99"])
            rows.append([n, streams, p50, p99, f"< {TARGET_DELAY_MS:g}" if figure else "(baseline)",
                         ("yes" if p99 < TARGET_DELAY_MS else "NO") if figure else "-", spread(per[n]["p99"])])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="repeats (the median is reported)")
    ap.add_argument("--requests", type=int, default=200, help="streams per throughput case and repeat")
    ap.add_argument("--tokens", type=int, default=200, help="one-token chunks per stream")
    ap.add_argument("--concurrency", type=int, default=16, help="streams in flight (throughput)")
    ap.add_argument("--paced-streams", type=lambda t: [int(x) for x in t.split(",")], default=[1, 8],
                    help="concurrent paced streams, a comma-separated list of cases (accuracy)")
    ap.add_argument("--paced-tokens", type=int, default=100, help="chunks per paced stream")
    ap.add_argument("--paced-tps", type=float, default=100.0, help="chunks per second of each paced stream")
    ap.add_argument("--client-cpu", type=int, default=0, help="the CPU the client is pinned to")
    ap.add_argument("--server-cpu", type=int, default=1, help="the CPU the server is pinned to")
    args = ap.parse_args()
    args.repeats = max(1, args.repeats)
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {args.client_cpu})
    with ServerProcess(cpus={args.server_cpu}) as srv:
        rows = throughput(srv, args)
        acc = accuracy(srv, args)
    print(f"Load generator on one core (CPU {args.client_cpu}; server under uvicorn on CPU {args.server_cpu}; "
          f"{len(cpus)} CPUs here), Python {sys.version.split()[0]}, httpx {httpx.__version__}: {args.requests} "
          f"streams x {args.tokens} chunks, {args.concurrency} in flight, {args.repeats} repeats\n")
    print(table(["case", "requests/s", "chunks/s", "client CPU us/chunk", "chunks/s per CPU-second",
                 "target (chunks/s)", "pass", "range (chunks/s)"], rows))
    print(f"\nTimestamp accuracy: client receive - server send per chunk, streams of {args.paced_tokens} chunks "
          f"at {args.paced_tps:g} chunks/s each\n")
    print(table(["client", "streams", "median (ms)", "p99 (ms)", "target p99 (ms)", "pass", "range p99 (ms)"],
                acc))


if __name__ == "__main__":
    main()
