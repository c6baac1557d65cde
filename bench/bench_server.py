"""The server's CPU cost of telemetry and controls: ``llmslo serve`` with both on against ``--no-telemetry``.

Two ``llmslo serve`` processes run side by side, the same engine and HTTP work in each: (on) telemetry, the
controls (admission queue, breaker, drain controller) and summaries written as JSONL, as a user runs it;
(off) ``--no-telemetry``, which keeps only what the request path needs (no tracker, metrics, summaries or
controls). Each repeat drives the same fixed load into each server: ``--requests`` streamed completions of
``--tokens`` tokens (``ignore_eos``; one load per size given) from ``--concurrency`` keep-alive connections of a
small asyncio client in this process, in ``--chunks`` parts that alternate between the two servers (so a
change in the machine's load falls on both). The server's CPU time (all its threads' time on a CPU, from
``/proc/PID/task/*/schedstat``) is read before and after each part; the figure per request is the sum over
the requests, per token over the tokens sent. Medians of the repeats; the overhead is ``on / off - 1``
within one repeat, then its median. Target: <= 5 % of a request's CPU time.

On a shared machine the CPU time of either server moves with the other processes' load (10 % and more from
one run to the next here); ``--instructions`` counts instructions instead, each server under valgrind's
callgrind (all threads; collection switched on for the measured load only), which that load does not move.

Run: ``.venv/bin/python -m llmslo.bench.bench_server --repeats 5 --requests 400 --tokens 64,256 --concurrency 16``
and ``.venv/bin/python -m llmslo.bench.bench_server --instructions --requests 100 --tokens 64,256``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from llmslo.bench._util import median, table, temp_dir

TARGET_OVERHEAD = 0.05
READY = re.compile(r"serving \S+ on http://127\.0\.0\.1:(\d+)")
CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


class Server:
    """One ``llmslo serve --port 0`` process (stopped by its pid)."""

    def __init__(self, name: str, args: list[str], callgrind: Path | None = None) -> None:
        self.name = name
        self.callgrind = callgrind
        prefix = [] if callgrind is None else [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={callgrind}", "--instr-atstart=no"]
        self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "llmslo.cli", "serve", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = READY.search(line)
        if not found:
            self.stop()
            raise SystemExit(f"{name}: llmslo serve did not start: {line!r}")
        self.port = int(found.group(1))

    def cpu_s(self) -> float:
        """CPU seconds of the process, all its threads: the sum of each thread's time on a CPU from
        ``/proc/PID/task/*/schedstat`` (nanoseconds); ``utime + stime`` of ``/proc/PID/stat`` (clock ticks)
        where schedstat is missing."""
        try:
            return sum(int(p.read_text().split()[0]) for p in Path(f"/proc/{self.proc.pid}/task").glob(
                "*/schedstat")) / 1e9
        except (OSError, ValueError, IndexError):
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) * CLOCK_TICK_S

    def instructions(self, requests: int, tokens: int, concurrency: int, offset: int) -> float:
        """Instructions the process executed (all threads, callgrind) for one load: instrumentation is switched on
        for the load only (and the sink's next flush), then dumped and read."""
        assert self.callgrind is not None
        pid = str(self.proc.pid)
        subprocess.run(["callgrind_control", "--instr=on", pid], check=True, capture_output=True, timeout=120)
        received = drive(self.port, requests, tokens, concurrency, offset)
        time.sleep(1.5)  # the sink's flush (every second) falls inside
        dumps_before = set(self.callgrind.parent.glob(self.callgrind.name + "*"))
        subprocess.run(["callgrind_control", "--dump", pid], check=True, capture_output=True, timeout=120)
        subprocess.run(["callgrind_control", "--instr=off", pid], check=True, capture_output=True, timeout=120)
        if received != requests * tokens:
            raise SystemExit(f"{self.name}: received {received} tokens, expected {requests * tokens}")
        (dump,) = set(self.callgrind.parent.glob(self.callgrind.name + "*")) - dumps_before
        found = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.M)
        if not found:
            raise SystemExit(f"{self.name}: no instruction total in {dump}")
        return float(found.group(1))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


async def _one_connection(port: int, bodies: list[bytes]) -> int:
    """Send each request on one keep-alive connection; read each streamed response to its end. Tokens read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**24)
    tokens = 0
    try:
        for body in bodies:
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"the server answered {head.splitlines()[0]!r}")
            data = await reader.readuntil(b"\r\n0\r\n\r\n")  # the end of the chunked event stream
            tokens += data.count(b'"text": ') - data.count(b'"choices": []')
    finally:
        writer.close()
        await writer.wait_closed()
    return tokens


def drive(port: int, requests: int, tokens: int, concurrency: int, offset: int) -> int:
    """The fixed load: ``requests`` streamed completions over ``concurrency`` connections; tokens received."""
    bodies = [json.dumps({"model": "llmslo-sim", "prompt": f"request {offset + i} of the benchmark",
                          "max_tokens": tokens, "ignore_eos": True, "stream": True}).encode()
              for i in range(requests)]
    shares = [bodies[k::concurrency] for k in range(concurrency)]

    async def main() -> int:
        return sum(await asyncio.gather(*(_one_connection(port, share) for share in shares if share)))

    return asyncio.run(main())


def measure(server: Server, requests: int, tokens: int, concurrency: int, offset: int) -> tuple[float, float]:
    """CPU seconds per request and per token of one load on ``server``."""
    before = server.cpu_s()
    received = drive(server.port, requests, tokens, concurrency, offset)
    time.sleep(0.2)  # the last summaries leave the request path (the sink's thread is counted too)
    spent = server.cpu_s() - before
    if received != requests * tokens:
        raise SystemExit(f"{server.name}: received {received} tokens, expected {requests * tokens}")
    return spent / requests, spent / received


def _paused(folder: Path) -> tuple[int, int]:
    """Requests of the ``on`` server whose stream paused (the client fell behind), of all its summaries."""
    rows = [json.loads(line) for path in folder.glob("*.jsonl") for line in path.read_text().splitlines()]
    return sum(1 for row in rows if row.get("stream_paused_s")), len(rows)


def _loads(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--tokens: expected comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise SystemExit(f"--tokens: each size must be >= 1, got {text!r}")
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--tokens", default="64,256", help="output tokens per request: one load per size")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=8,
                    help="each repeat alternates the two servers this many times (a share of the requests each)")
    ap.add_argument("--speed", type=float, default=10.0,
                    help="engine time scale of both servers (low enough that the client keeps up: a stream "
                         "that pauses measures backpressure, not telemetry)")
    ap.add_argument("--control", action="store_true",
                    help="run a second --no-telemetry server beside them: its difference from the first is the "
                         "measurement's noise floor")
    ap.add_argument("--instructions", action="store_true",
                    help="count the instructions of each load under valgrind's callgrind instead (noise-free on a "
                         "shared machine; slow: use fewer requests)")
    args = ap.parse_args()
    sizes = _loads(args.tokens)
    common = ["--speed", str(args.speed), "--max-num-seqs", str(max(args.concurrency, 1)), "--drain-settle", "0"]
    if args.instructions:
        count_instructions(args, sizes, common)
        return
    names = ["on", "off", "off2"] if args.control else ["on", "off"]
    runs: dict[int, list[dict[str, tuple[float, float]]]] = {n: [] for n in sizes}
    with temp_dir() as tmp:
        servers = {"on": Server("on", [*common, "--jsonl", str(tmp / "summaries")]),
                   "off": Server("off", [*common, "--no-telemetry"])}
        if args.control:
            servers["off2"] = Server("off2", [*common, "--no-telemetry"])
        try:
            for server in servers.values():  # warm up: imports, caches, the first connections
                measure(server, max(20, args.requests // 10), sizes[0], args.concurrency, 0)
            offset = args.requests
            chunk = max(1, args.requests // args.chunks)
            for r in range(args.repeats):
                for n in sizes:
                    spent = {name: [0.0, 0.0] for name in names}  # CPU seconds, requests
                    for k in range(args.chunks):  # fine alternation: a change of the machine's load hits all
                        order = names if (r + k) % 2 == 0 else names[::-1]
                        for name in order:
                            per_request, _ = measure(servers[name], chunk, n, args.concurrency, offset)
                            spent[name][0] += per_request * chunk
                            spent[name][1] += chunk
                            offset += chunk
                    runs[n].append({name: (cpu / count, cpu / (count * n)) for name, (cpu, count) in spent.items()})
        finally:
            for server in servers.values():
                server.stop()
        paused, rows = _paused(tmp / "summaries")
    print(f"Server CPU time (all threads) under one fixed load per size: {args.requests} streamed requests, "
          f"{args.concurrency} connections, engine speed {args.speed:g}; medians of {args.repeats} repeats (the "
          "servers' order alternated)")
    labels = {"on": "on: telemetry + controls + JSONL summaries", "off": "off: --no-telemetry (baseline)",
              "off2": "off2: --no-telemetry again (control)"}
    table_rows: list[list[object]] = []
    checks: list[list[object]] = []
    for n in sizes:
        rs = runs[n]
        for name in names:
            table_rows.append([n, labels[name], median([x[name][0] for x in rs]) * 1e6,
                               median([x[name][1] for x in rs]) * 1e6])
        overhead = median([x["on"][0] / x["off"][0] - 1 for x in rs])
        added = median([x["on"][0] - x["off"][0] for x in rs]) * 1e6
        checks.append([f"overhead per request, {n} tokens", f"{overhead * 100:.1f} %",
                       f"<= {TARGET_OVERHEAD * 100:g} %", "PASS" if overhead <= TARGET_OVERHEAD else "MISS"])
        checks.append([f"added CPU per request, {n} tokens (us, info)", added, "-", ""])
        if args.control:
            floor = median([x["off2"][0] / x["off"][0] - 1 for x in rs])
            checks.append([f"off2 / off - 1, {n} tokens (the noise floor, info)", f"{floor * 100:.1f} %", "-", ""])
    checks.append(["requests whose stream paused (on, info)", f"{paused:,} of {rows:,}", "-", ""])
    print(table(["tokens", "server", "CPU per request (us)", "CPU per token (us)"], table_rows))
    print()
    print(table(["check", "figure", "target", "verdict"], checks))


def count_instructions(args: argparse.Namespace, sizes: list[int], common: list[str]) -> None:
    """The instruction counts of one load per size on each server, under callgrind (deterministic up to the
    scheduling of the event loop, so one run is enough)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    counts: dict[int, dict[str, float]] = {n: {} for n in sizes}
    with temp_dir() as tmp:
        servers = {"on": Server("on", [*common, "--jsonl", str(tmp / "summaries")], tmp / "cg-on.out"),
                   "off": Server("off", [*common, "--no-telemetry"], tmp / "cg-off.out")}
        try:
            for name, server in servers.items():
                drive(server.port, max(16, args.requests // 10), sizes[0], args.concurrency, 0)  # warm up
                for n in sizes:
                    counts[n][name] = server.instructions(args.requests, n, args.concurrency, 10**6)
        finally:
            for server in servers.values():
                server.stop()
    print(f"Server instructions (all threads, valgrind callgrind) of one fixed load per size: {args.requests} "
          f"streamed requests, {args.concurrency} connections, engine speed {args.speed:g}")
    rows: list[list[object]] = []
    checks: list[list[object]] = []
    for n in sizes:
        for name, label in (("on", "on: telemetry + controls + JSONL summaries"),
                            ("off", "off: --no-telemetry (baseline)")):
            rows.append([n, label, counts[n][name] / args.requests / 1e3, counts[n][name] / (args.requests * n) / 1e3])
        overhead = counts[n]["on"] / counts[n]["off"] - 1
        checks.append([f"overhead per request, {n} tokens", f"{overhead * 100:.1f} %",
                       f"<= {TARGET_OVERHEAD * 100:g} %", "PASS" if overhead <= TARGET_OVERHEAD else "MISS"])
    print(table(["tokens", "server", "thousand instructions per request", "per token"], rows))
    print()
    print(table(["check", "figure", "target", "verdict"], checks))


if __name__ == "__main__":
    main()
