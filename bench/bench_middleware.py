"""The server's CPU cost of the ASGI middleware: a Starlette SSE app with ``LlmsloMiddleware`` against the same
app without it.

Two uvicorn processes serve the tests' Starlette app (``tests/_middleware_app.py``: vLLM's chunk shapes, a role
chunk, a finish chunk and a ``usage`` chunk per stream): (on) with the middleware added as ``vllm serve
--middleware`` adds it (no arguments; the process-wide telemetry, summaries written as JSONL through
``LLMSLO_SUMMARY_PATH``, metrics at ``/llmslo/metrics``); (off) the bare app, the baseline measured in the same
run. Each repeat drives the same fixed load into each server: ``--requests`` streamed chat completions of
``--tokens`` tokens, as fast as the app sends them, from ``--concurrency`` keep-alive connections of a small
asyncio client in this process, in ``--chunks`` parts that alternate between the servers (so a change in the
machine's load falls on both). The server's CPU time (all its threads, from ``/proc/PID/task/*/schedstat``) is
read before and after each part; the figure per request is the sum over the requests, per chunk over the content
chunks. Medians of the repeats; the overhead is ``on / off - 1`` within one repeat, then its median. Target:
<= 3 % of a request's CPU time. ``--control`` runs a second bare server: its difference from the first is the
measurement's noise floor.

On a shared machine CPU time moves with the other processes' load; ``--instructions`` counts instructions
instead (each server under valgrind's callgrind, all threads, collection switched on for the measured load
only), which that load does not move.

``--app llama-cpp-python`` runs the same comparison on a real Python engine: llama-cpp-python's OpenAI server
(``tests/_llama_cpp_python_app.py``: SmolLM2-135M on the CPU, the wheel ``.ci/build-llama-cpp-python`` builds)
with the middleware (``make_app``) and without it (``bare_app``). Both servers get the same prompts at temperature
0, so the same replies; a reply may end before ``--tokens`` (the model's end of text), and the figures per chunk
divide by the content chunks the client read. There the request's CPU is mostly the model's.

Run: ``.venv/bin/python -m llmslo.bench.bench_middleware --repeats 5 --requests 300 --tokens 64 --control``,
``.venv/bin/python -m llmslo.bench.bench_middleware --instructions --requests 100 --tokens 64`` and
``.venv/bin/python -m llmslo.bench.bench_middleware --app llama-cpp-python --repeats 3 --requests 8 --concurrency 1``
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

TARGET_OVERHEAD = 0.03
CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
APP = "llmslo.tests._middleware_app:app"
_ENGINE = "llmslo.tests._llama_cpp_python_app"
ENGINE_APPS = {"on": f"{_ENGINE}:make_app", "off": f"{_ENGINE}:bare_app", "off2": f"{_ENGINE}:bare_app"}
"""``--app llama-cpp-python``: the uvicorn factory of each server."""
ENGINE_MODEL = "smollm2"
CONTENT = re.compile(rb'"content":\s?"[^"]')
"""A content chunk as the client reads it: a non-empty text."""


class Server:
    """One uvicorn process serving the test app on 127.0.0.1 (optionally under callgrind), stopped by its pid."""

    def __init__(self, name: str, env: dict[str, str], callgrind: Path | None = None, app: str = APP,
                 factory: bool = False, model: str = "test-model") -> None:
        from llmslo.tests._middleware_app import free_port

        self.name = name
        self.callgrind = callgrind
        self.model = model
        self.whole_process = factory  # the engine: its threads come and go
        self.port = free_port()
        prefix = [] if callgrind is None else [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={callgrind}", "--instr-atstart=no"]
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "uvicorn", app, *(["--factory"] if factory else []), "--host",
             "127.0.0.1", "--port", str(self.port), "--no-access-log", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **env})
        deadline = time.monotonic() + (300 if callgrind else 120)
        while True:
            try:
                drive(self.port, 1, 1, 1, 0, model)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise SystemExit(f"{name}: uvicorn did not start") from None
                time.sleep(0.2)

    def cpu_s(self) -> float:
        """CPU seconds of the process, all its threads: ``schedstat`` of each thread (nanoseconds) where no thread
        exits during a measurement (the test app), else ``utime + stime`` (clock ticks; a thread that exited is
        still counted there, and the engine's thread pool starts and ends threads)."""
        if not self.whole_process:
            try:
                return sum(int(p.read_text().split()[0]) for p in Path(f"/proc/{self.proc.pid}/task").glob(
                    "*/schedstat")) / 1e9
            except (OSError, ValueError, IndexError):
                pass
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * CLOCK_TICK_S

    def instructions(self, requests: int, tokens: int, concurrency: int, offset: int) -> float:
        """Instructions the process executed (all threads) for one load, under callgrind."""
        assert self.callgrind is not None
        pid = str(self.proc.pid)
        subprocess.run(["callgrind_control", "--instr=on", pid], check=True, capture_output=True, timeout=300)
        received = drive(self.port, requests, tokens, concurrency, offset, self.model)
        time.sleep(1.5)  # the sink's flush (every second) falls inside
        before = set(self.callgrind.parent.glob(self.callgrind.name + "*"))
        subprocess.run(["callgrind_control", "--dump", pid], check=True, capture_output=True, timeout=300)
        subprocess.run(["callgrind_control", "--instr=off", pid], check=True, capture_output=True, timeout=300)
        if received != requests * tokens:
            raise SystemExit(f"{self.name}: received {received} tokens, expected {requests * tokens}")
        (dump,) = set(self.callgrind.parent.glob(self.callgrind.name + "*")) - before
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


async def _one_connection(port: int, bodies: list[bytes]) -> int:
    """Send each request on one keep-alive connection; read each streamed response to its end. Content chunks
    read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**24)
    tokens = 0
    try:
        for body in bodies:
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"the server answered {head.splitlines()[0]!r}")
            data = await reader.readuntil(b"\r\n0\r\n\r\n")  # the end of the chunked event stream
            tokens += len(CONTENT.findall(data))
    finally:
        writer.close()
        await writer.wait_closed()
    return tokens


def drive(port: int, requests: int, tokens: int, concurrency: int, offset: int, model: str = "test-model") -> int:
    """The fixed load: ``requests`` streamed chat completions (temperature 0) over ``concurrency`` connections;
    content chunks read."""
    bodies = [json.dumps({"model": model, "messages": [{"role": "user", "content": f"Tell a long story, number "
                                                                                   f"{offset + i}."}],
                          "max_tokens": tokens, "temperature": 0, "stream": True,
                          "stream_options": {"include_usage": True}}).encode()
              for i in range(requests)]
    shares = [bodies[k::concurrency] for k in range(concurrency)]

    async def main() -> int:
        return sum(await asyncio.gather(*(_one_connection(port, share) for share in shares if share)))

    return asyncio.run(main())


def measure(server: Server, requests: int, tokens: int, concurrency: int, offset: int,
            exact: bool = True) -> tuple[float, int]:
    """CPU seconds of one load on ``server``, and the content chunks its client read (``exact``: every reply has
    ``tokens`` of them, else the server is refused)."""
    before = server.cpu_s()
    received = drive(server.port, requests, tokens, concurrency, offset, server.model)
    time.sleep(0.2)  # the last summaries leave the request path (the sink's thread is counted too)
    spent = server.cpu_s() - before
    if (received != requests * tokens) if exact else received < requests:
        raise SystemExit(f"{server.name}: received {received} content chunks, expected "
                         f"{'' if exact else 'at least '}{requests * tokens if exact else requests}")
    return spent, received


def _envs(tmp: Path, names: list[str], summaries: bool = True) -> dict[str, dict[str, str]]:
    """Each server's environment (``summaries``: the middleware writes its summaries as JSONL)."""
    on = {"LLMSLO_TEST_MIDDLEWARE": "1", "LLMSLO_MODEL": "test-model", "LLMSLO_VERSION": "bench"}
    if summaries:
        on["LLMSLO_SUMMARY_PATH"] = str(tmp / "summaries")
    return {name: (on if name == "on" else {"LLMSLO_TEST_MIDDLEWARE": "0"}) for name in names}


def _summaries(folder: Path) -> tuple[int, int]:
    """Summaries the ``on`` server wrote, and those of them with every token counted."""
    rows = [json.loads(line) for path in folder.glob("*.jsonl") for line in path.read_text().splitlines()]
    return len(rows), sum(1 for r in rows if r["finish_reason"] in ("length", "stop") and r["generated_tokens"] > 0)


LABELS = {"on": "on: LlmsloMiddleware (env-configured, JSONL summaries)", "off": "off: the bare app (baseline)",
          "off2": "off2: the bare app again (control)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--app", choices=("test", "llama-cpp-python"), default="test",
                    help="test: the tests' Starlette app (no model: the harshest baseline); llama-cpp-python: its "
                         "OpenAI server on SmolLM2 (a real Python engine; .ci/build-llama-cpp-python)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=64, help="content chunks (one token each) per reply (at most, "
                                                           "with --app llama-cpp-python)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=None,
                    help="each repeat alternates the servers this many times (a share of the requests each; "
                         "default 6, 2 with --app llama-cpp-python)")
    ap.add_argument("--control", action="store_true", help="a second bare server: the measurement's noise floor")
    ap.add_argument("--no-summaries", action="store_true",
                    help="the middleware writes no summaries (LLMSLO_SUMMARY_PATH unset): the sink's share")
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions under valgrind's callgrind instead (slow: use fewer requests)")
    args = ap.parse_args()
    engine = args.app == "llama-cpp-python"
    if args.instructions:
        if engine:
            raise SystemExit("--instructions runs the test app only (the model's instructions would drown the rest)")
        count_instructions(args)
        return
    chunks = args.chunks if args.chunks is not None else (2 if engine else 6)
    names = ["on", "off", "off2"] if args.control else ["on", "off"]
    runs: list[dict[str, float]] = []  # CPU seconds per request, per server, one entry per repeat
    read: list[dict[str, int]] = []  # content chunks read, per server, one entry per repeat
    with temp_dir() as tmp:
        envs = _envs(tmp, names, summaries=not args.no_summaries)
        if engine:
            servers = {name: Server(name, envs[name], app=ENGINE_APPS[name], factory=True, model=ENGINE_MODEL)
                       for name in names}
        else:
            servers = {name: Server(name, envs[name]) for name in names}
        try:
            for server in servers.values():  # warm up: imports, caches, the first connections
                measure(server, max(2 if engine else 20, args.requests // 10), args.tokens, args.concurrency, 0,
                        exact=not engine)
            offset = 10**6
            part = max(1, args.requests // chunks)
            for r in range(args.repeats):
                spent = {name: 0.0 for name in names}
                got = {name: 0 for name in names}
                for k in range(chunks):
                    order = names if (r + k) % 2 == 0 else names[::-1]
                    for name in order:  # the same prompts for each server
                        cpu, chunks_read = measure(servers[name], part, args.tokens, args.concurrency, offset,
                                                   exact=not engine)
                        spent[name] += cpu
                        got[name] += chunks_read
                    offset += part
                runs.append({name: cpu / (part * chunks) for name, cpu in spent.items()})
                read.append(got)
        finally:
            for server in servers.values():
                server.stop()
        written, complete = _summaries(tmp / "summaries")
    per_reply = median([x["on"] for x in read]) / (part * chunks)
    what = (f"llama-cpp-python's OpenAI server (SmolLM2-135M, CPU), streamed chat completions of at most "
            f"{args.tokens} tokens ({per_reply:.1f} content chunks per reply)" if engine
            else f"the test app, streamed chat completions of {args.tokens} tokens")
    print(f"Server CPU time (all threads) under one fixed load: {what}, {part * chunks} per repeat, "
          f"{args.concurrency} connections; medians of {args.repeats} repeats (the servers' order alternated)")
    rows: list[list[object]] = []
    for name in names:
        per_request = median([x[name] for x in runs]) * 1e6
        rows.append([LABELS[name], per_request, per_request / per_reply])
    overhead = median([x["on"] / x["off"] - 1 for x in runs])
    added = median([x["on"] - x["off"] for x in runs]) * 1e6
    checks: list[list[object]] = [
        [f"overhead per request, {args.tokens} tokens", f"{overhead * 100:.1f} %", f"<= {TARGET_OVERHEAD * 100:g} %",
         "PASS" if overhead <= TARGET_OVERHEAD else "MISS"],
        ["added CPU per request (us, info)", added, "-", ""],
        ["added CPU per chunk (us, info)", added / per_reply, "-", ""],
    ]
    if engine:
        same = all(x["on"] == x["off"] for x in read)
        checks.append(["the servers' replies, content chunks (info)",
                       "the same" if same else ", ".join(f"{x['on']} vs {x['off']}" for x in read), "-", ""])
    if args.control:
        floor = median([x["off2"] / x["off"] - 1 for x in runs])
        checks.append(["off2 / off - 1 (the noise floor, info)", f"{floor * 100:.1f} %", "-", ""])
    if not args.no_summaries:
        checks.append(["summaries written by on, complete (info)", f"{complete:,} of {written:,}", "-", ""])
    if args.no_summaries:
        rows[0][0] = str(rows[0][0]).replace("JSONL summaries", "no summaries")
    if engine:
        for row in rows:
            row[0] = str(row[0]).replace("the bare app", "the bare server")
    print(table(["server", "CPU per request (us)", "CPU per chunk (us)"], rows))
    print()
    print(table(["check", "figure", "target", "verdict"], checks))


def count_instructions(args: argparse.Namespace) -> None:
    """The instruction counts of one load on each server, under callgrind (deterministic up to the scheduling
    of the event loop, so one run is enough)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    counts: dict[str, float] = {}
    with temp_dir() as tmp:
        envs = _envs(tmp, ["on", "off"])
        servers = {name: Server(name, envs[name], tmp / f"cg-{name}.out") for name in ("on", "off")}
        try:
            for name, server in servers.items():
                drive(server.port, max(16, args.requests // 10), args.tokens, args.concurrency, 0)  # warm up
                counts[name] = server.instructions(args.requests, args.tokens, args.concurrency, 10**6)
        finally:
            for server in servers.values():
                server.stop()
    n = args.tokens
    print(f"Server instructions (all threads, valgrind callgrind) of one fixed load: {args.requests} streamed chat "
          f"completions of {n} tokens, {args.concurrency} connections")
    rows = [[LABELS[name], counts[name] / args.requests / 1e3, counts[name] / (args.requests * n) / 1e3]
            for name in ("on", "off")]
    overhead = counts["on"] / counts["off"] - 1
    print(table(["server", "thousand instructions per request", "per chunk"], rows))
    print()
    print(table(["check", "figure", "target", "verdict"], [[
        f"overhead per request, {n} tokens", f"{overhead * 100:.1f} %", f"<= {TARGET_OVERHEAD * 100:g} %",
        "PASS" if overhead <= TARGET_OVERHEAD else "MISS"]]))


if __name__ == "__main__":
    main()
