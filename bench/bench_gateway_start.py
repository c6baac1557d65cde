"""The gateway's CPU to start a request: from a whole request in the connection's callback to its write to the
backend, beside the least a Python proxy on the same callback does.

A request's start is what a request arriving in a group waits for, once for every request of the group before it
(``bench_gateway --wire``: streams that end together send their next requests together): it decides the added
TTFT's tail. Both cases run in this process, on the event loop the gateway runs on, with stand-ins for the sockets
(no system call is counted):

- **gateway**: :class:`llmslo.gateway.Gateway`'s handler behind its own front connection
  (``FrontConnection.data_received`` of one whole streamed chat request, about 400 bytes, on a new connection):
  the head, the JSON body, the tracker, admission and shedding, the breaker and the route, the backend's request
  written on a kept-alive connection (a stand-in that counts the writes and never answers);
- **floor** (the baseline): the same front connection with a handler that only builds the backend's request
  from the head's lines as they came and the body, and writes it.

Requests start ``--in-flight`` at a time: each group is started (timed: thread CPU time), then ended (untimed: the
handlers cancelled, their trackers finished), so the garbage collector sees as many requests alive as a gateway
with that many streams. As ``llmslo gateway`` does once started, the heap alive before the runs is frozen out of
the collector's reach (``settle_heap``); the collector stays on (its share is part of the cost). Medians of
``--repeats``.

``--parts`` also times the parts of a start each alone (``timeit``, the best of 5 rounds, on the same gateway's
objects: the head's parse, the body's parse and checks, a tracker started and finished, the route, the breaker's
decision), the one sizeable part of a request's end (the backend's concurrency limit taking the reply's sample: its
TTFT and the median of its gaps, for replies of 20 and 200 chunks), and the gateway's case again with the garbage
collector off (its share of a start).

Run: ``.venv/bin/python -m llmslo.bench.bench_gateway_start --requests 5000 --repeats 5 [--parts]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
import timeit
import uuid
from collections.abc import Callable
from typing import Any

from llmslo.bench._util import median, table
from llmslo.gateway import BackendSpec, Gateway, GatewayConfig
from llmslo.gateway._http import FrontConnection, Request, Responder, UpstreamConnection, _parse_head
from llmslo.gateway._loop import event_loop_factory
from llmslo.gateway._run import settle_heap
from llmslo.telemetry import Telemetry

BODY = json.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "hello " * 40}],
                   "max_tokens": 20, "stream": True, "stream_options": {"include_usage": True}}).encode()


def request_bytes(request_id: str) -> bytes:
    """One whole request as ``llmslo load`` sends it (head and body)."""
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nuser-agent: python-httpx\r\n"
            b"accept: */*\r\naccept-encoding: gzip, deflate\r\nconnection: keep-alive\r\n"
            b"content-type: application/json\r\nx-request-id: " + request_id.encode() + b"\r\n"
            b"content-length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)


class StandInTransport(asyncio.Transport):
    """A client's socket, stood in for: what is written is kept in :attr:`out`."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closing = False

    def write(self, data: Any) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class Backend:
    """The backend's kept-alive connections, stood in for: every write is kept (bytes), no response comes."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.waiting: list[asyncio.Future[bytes]] = []
        self.transport = StandInTransport()

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    async def readuntil(self, separator: bytes) -> bytes:
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        return await fut

    def at_eof(self) -> bool:
        return False

    async def acquire(self) -> tuple[UpstreamConnection, bool]:
        return UpstreamConnection(self, self), True  # type: ignore[arg-type]


def _gateway(backend: Backend) -> Gateway:
    config = GatewayConfig(backends=(BackendSpec("a", "http://127.0.0.1:9"),), port=0, admin_port=0,
                           concurrency=1_000_000, queue_capacity=1_000_000, health_interval_s=3600.0)
    gw = Gateway(config, Telemetry(version="bench"))
    for b in gw.pool.backends.values():
        b.healthy = True
        b.upstream.acquire = backend.acquire  # type: ignore[method-assign]
    return gw


_NONE: frozenset[bytes] = frozenset()


def _floor_handler(backend: Backend) -> Callable[[Request, Responder], Any]:
    async def handle(req: Request, res: Responder) -> None:
        head = b"%s %s HTTP/1.1\r\n" % (req.method.encode(), req.target.encode("latin-1"))
        backend.write(head + req.header_lines(_NONE) + b"\r\n" + req.body)
        await backend.readuntil(b"\r\n\r\n")

    return handle


async def _run(case: str, requests: int, in_flight: int) -> tuple[float, int]:
    """CPU ns per request start of ``case`` (``gateway`` or ``floor``), and the backend's writes."""
    backend = Backend()
    gw = _gateway(backend) if case == "gateway" else None
    handler = gw.app.handle if gw is not None else _floor_handler(backend)
    raw = [request_bytes(str(uuid.uuid4())) for _ in range(requests)]
    spent = 0
    gc.collect()
    for start in range(0, requests, in_flight):
        group = raw[start:start + in_flight]
        c0 = time.thread_time_ns()
        for data in group:
            conn = FrontConnection(handler, 1 << 20)
            conn.connection_made(StandInTransport())
            conn.data_received(data)
        spent += time.thread_time_ns() - c0
        for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:  # end the group
            task.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    if gw is not None:
        gw.tel.registry.unregister(gw.tel.metrics)
    return spent / requests, len(backend.writes)


def measure(requests: int, in_flight: int) -> dict[str, tuple[float, int]]:
    """Both cases once, on the gateway's event loop: ``case -> (CPU ns per request, backend writes)``."""
    out: dict[str, tuple[float, int]] = {}
    for case in ("floor", "gateway"):
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            out[case] = runner.run(_run(case, requests, in_flight))
    return out


def parts(number: int = 20_000) -> dict[str, float]:
    """µs per call of each part of a start, timed alone (the best of 5 rounds of ``number`` calls) on one gateway's
    objects, on the gateway's event loop."""
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(_parts(number))


async def _parts(number: int) -> dict[str, float]:
    gw = _gateway(Backend())
    app = gw.app
    raw = request_bytes(str(uuid.uuid4()))
    end = raw.find(b"\r\n\r\n")
    head = raw[:end]
    req, _ = _parse_head(head, 1 << 20)
    req.body = raw[end + 4:]
    rid = str(uuid.uuid4())
    backend = next(iter(app.pool.backends.values()))

    def tracker() -> None:
        app.tel.start(rid, model="bench-model", prompt_tokens=50).finish("error", error_type="bench")

    short, long = ([0.03 + 0.0001 * (i % 7) for i in range(n - 1)] for n in (20, 200))  # a reply's gaps, s

    def sample(gaps: list[float]) -> Callable[[], object]:
        return lambda: backend.limit.observe(ttft_s=0.05, prompt_tokens=50, gaps_s=gaps)

    cases: dict[str, Callable[[], object]] = {
        "the head's parse": lambda: _parse_head(head, 1 << 20),
        "the body's parse and checks": lambda: app._parse(req),
        "a tracker, started and finished": tracker,
        "the route (a backend picked)": lambda: app.pool.pick("bench-model", frozenset(), 500),
        "the breaker's decision": backend.breaker.allow,
        "at the end: the limit's sample, 20 chunks": sample(short),
        "at the end: the limit's sample, 200 chunks": sample(long),
    }
    out = {name: min(timeit.repeat(f, number=number, repeat=5)) / number * 1e6 for name, f in cases.items()}
    gw.tel.registry.unregister(gw.tel.metrics)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000, help="requests started per case and repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--in-flight", type=int, default=64, help="requests alive at once (started, then ended)")
    ap.add_argument("--parts", action="store_true",
                    help="also time each part of a start alone, and the gateway's case with the garbage collector off")
    args = ap.parse_args()
    if args.requests < 1 or args.repeats < 1 or args.in_flight < 1:
        raise SystemExit("--requests, --repeats and --in-flight: expected integers >= 1")
    runs: dict[str, list[float]] = {"floor": [], "gateway": []}
    settle_heap()
    for _ in range(args.repeats):
        for case, (ns, writes) in measure(args.requests, args.in_flight).items():
            if writes != args.requests:
                raise SystemExit(f"{case}: {writes} of {args.requests} requests reached the backend")
            runs[case].append(ns)
    floor, gateway = median(runs["floor"]), median(runs["gateway"])
    print(f"A request's start, CPU per request (us): medians of {args.repeats} repeats x {args.requests:,} "
          f"requests, {args.in_flight} alive at once")
    print(table(["case", "CPU per request (us)", "beside the floor"], [
        ["floor: parse the head, write the request", floor / 1000, "baseline"],
        ["gateway: parse, admit, route, write", gateway / 1000, f"{gateway / floor:.2f}x"],
    ]))
    print(f"A group of 30 requests arriving together: the last waits {30 * gateway / 1e6:.2f} ms for the gateway's "
          f"starts (sockets not counted), {30 * floor / 1e6:.2f} ms at the floor.")
    if args.parts:
        print_parts(args.requests, args.repeats, args.in_flight, gateway)


def print_parts(requests: int, repeats: int, in_flight: int, gateway_ns: float) -> None:
    """The parts of a start, each timed alone, and the garbage collector's share (the gateway's case again with it
    off, medians of ``repeats``; ``gateway_ns``: the case with it on, from the same run)."""
    off: list[float] = []
    gc.disable()
    try:
        for _ in range(repeats):
            off.append(measure(requests, in_flight)["gateway"][0])
    finally:
        gc.enable()
    rows: list[list[object]] = [[name, us] for name, us in parts().items()]
    rows.append(["the garbage collector, per start", (gateway_ns - median(off)) / 1000])
    print("Parts of a start, each timed alone (us per call, the best of 5 rounds), and the concurrency limit's "
          "sample of a reply at its end; the collector's share: the "
          f"gateway's case with it on ({gateway_ns / 1000:.1f} us) less with it off ({median(off) / 1000:.1f} us)")
    print(table(["part", "us"], rows))


if __name__ == "__main__":
    main()
