"""The write-ahead journal's cost per request, beside the same work without it, measured in the same run.

Three measurements, each the median of the repeats (the cases alternate within a repeat):

* **request path**: what a request pays on its own thread, ``open_request`` + ``end_request`` +
  ``close_request`` (three appends to the journal's deques), against the floor of three bare ``deque.append``;
* **writer**: what the journal's thread pays per request to write those entries (``flush()`` timed on the
  caller's thread over batches of the size a 50 ms flush sees at ``--rate`` requests per second: the ``o``,
  ``d`` and ``x`` lines, the batch's ``t`` line, one ``write()`` to the file);
* **in Telemetry** (the figure the target is about): the CPU time per request of ``Telemetry(sink=...,
  journal=Journal(dir))`` minus the same without the journal, everything the journal costs included: the
  request path, the sink telling it what was written, and the writing. A request: start, admit, schedule, one
  committed and sent token, finish ``stop``, with ``--open`` requests in flight at a time. The sink and the
  journal write on the same thread, every ``--rate``/20 requests (as their threads do every 50 ms at that
  rate), so that the figure is the journal's work alone: with their own threads, a loop that makes requests
  a hundred times faster than a server keeps thousands of finished requests alive until the next write (and
  measures the memory that costs), and the machine's other work lands in the figure too. Target: <= 2 us per
  request.

Also, for information: one progress read of an open request (the journal's thread asks each open request
for its progress every ``progress_interval_s``, 1 s by default, and writes what changed): a request pays it
once a second while it runs.

``--instructions`` counts the instructions of the "in Telemetry" case instead, with and without the journal,
under valgrind's callgrind (two sizes of run, so that start-up cancels out): a figure the machine's other work
does not move; it is also given in microseconds at the measured baseline's instructions per microsecond.

Run: ``.venv/bin/python -m llmslo.bench.bench_journal --repeats 5 --requests 20000`` and
``.venv/bin/python -m llmslo.bench.bench_journal --instructions --requests 3000``
"""

from __future__ import annotations

import argparse
import functools
import gc
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llmslo.bench._util import median, table, temp_dir
from llmslo.telemetry import Journal, Telemetry

TARGET_US = 2.0
T0 = 1_790_000_000.0


def _ids(n: int, tag: str) -> list[str]:
    return [f"{tag}-{i:08d}-0123456789abcdef" for i in range(n)]  # about a uuid's length


def bare_appends(n: int) -> float:
    """ns per request: three appends to a deque (the floor of the request path)."""
    q: deque[Any] = deque()
    ids = _ids(n, "b")
    t0 = time.perf_counter_ns()
    for rid in ids:
        q.append((rid, T0, "m", "v1", "default", 128, None))
        q.append(rid)
        q.append(rid)
    return (time.perf_counter_ns() - t0) / n


def _journal(folder: Path, **kw: Any) -> Journal:
    return Journal(folder, flush_interval_s=3600.0, flush_entries=1 << 30, capacity=1 << 30, max_open=1 << 30, **kw)


def journal_appends(folder: Path, n: int) -> float:
    """ns per request: open_request + end_request + close_request (the journal's thread idle meanwhile)."""
    j = _journal(folder)
    ids = _ids(n, "j")
    try:
        op, end, close = j.open_request, j.end_request, j.close_request
        t0 = time.perf_counter_ns()
        for rid in ids:
            op(rid, T0, "m", "v1", "default", 128, None)
            end(rid)
            close(rid)
        return (time.perf_counter_ns() - t0) / n
    finally:
        j.close()


def journal_writes(folder: Path, n: int, batch: int) -> float:
    """ns per request: the journal's thread writing ``batch`` requests at a time (opened in one batch, ended and
    closed in the next, as requests that outlive a flush)."""
    j = _journal(folder)
    ids = _ids(n, "w")
    spent = 0
    try:
        for start in range(0, n, batch):
            part = ids[start:start + batch]
            for rid in part:
                j.open_request(rid, T0, "m", "v1", "default", 128, None)
            t0 = time.perf_counter_ns()
            j.flush()
            spent += time.perf_counter_ns() - t0
            for rid in part:
                j.end_request(rid)
                j.close_request(rid)
            t0 = time.perf_counter_ns()
            j.flush()
            spent += time.perf_counter_ns() - t0
        return spent / n
    finally:
        j.close()


def progress_read(folder: Path, open_requests: int, reads: int) -> float:
    """ns per open request per progress read (each read finds every request moved on by one token)."""
    j = _journal(folder, progress_interval_s=0.0)
    tel = Telemetry()
    trackers = [tel.start(rid, model="m", prompt_tokens=128) for rid in _ids(open_requests, "p")]
    for t in trackers:
        t.admit()
        t.schedule()
        j.open_request(t.request_id, t.arrival_unix_s, "m", "v1", "default", 128, t.journal_progress)
    spent = 0
    try:
        j.flush()
        for _ in range(reads):
            for t in trackers:
                t.commit()
                t.send()
            t0 = time.perf_counter_ns()
            j.flush()
            spent += time.perf_counter_ns() - t0
        return spent / (open_requests * reads)
    finally:
        for t in trackers:
            t.finish("stop")
        j.close()


class TickSink:
    """A summary sink that keeps the rows of a tick and, when told, "writes" them: it tells its listeners, as a
    :class:`SummarySink` does once a batch is written (no thread, so the timing stays on one thread)."""

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self.listeners: list[Callable[[Sequence[Any]], object]] = []

    def __call__(self, row: Any) -> None:
        self.rows.append(row)

    def on_settled(self, listener: Callable[[Sequence[Any]], object]) -> None:
        self.listeners.append(listener)

    def write(self) -> None:
        rows, self.rows = self.rows, []
        for listener in self.listeners:
            listener(rows)


def in_telemetry(folder: Path | None, n: int, in_flight: int, tick: int) -> float:
    """CPU ns per request of Telemetry with a journal in ``folder`` (or none), on one thread: ``in_flight``
    requests open at a time (each starts, is admitted, scheduled, gets a token, and finishes ``stop`` when
    ``in_flight`` later ones have started); every ``tick`` requests the sink writes what it holds (telling the
    journal) and the journal writes its batch, as their threads would every 50 ms at ``tick`` x 20 requests/s."""
    sink = TickSink()
    # made (its first segment synced) untimed; progress reads apart (timed on their own: they cost by the second)
    journal = _journal(folder, progress_interval_s=1e9) if folder is not None else None
    tel = Telemetry(sink=sink, journal=journal)
    ids = _ids(n, "t")
    window: deque[Any] = deque()
    gc.collect()
    c0 = time.thread_time_ns()
    for i, rid in enumerate(ids):
        t = tel.start(rid, model="m", prompt_tokens=128)
        t.admit()
        t.schedule()
        t.commit()
        t.send()
        window.append(t)
        if len(window) > in_flight:
            window.popleft().finish("stop")
        if i % tick == tick - 1:
            sink.write()
            if journal is not None:
                journal.flush()
    while window:
        window.popleft().finish("stop")
    sink.write()
    if journal is not None:
        journal.flush()
    spent = time.thread_time_ns() - c0
    if journal is not None:
        journal.close()
    tel.registry.unregister(tel.metrics)
    return spent / n


def _collected(mode: str, n: int, args: argparse.Namespace) -> int:
    """Instructions of a process that runs one "in Telemetry" case of ``n`` requests under callgrind."""
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-m",
                          "llmslo.bench.bench_journal", "--one", mode, "--requests", str(n), "--open", str(args.open),
                          "--rate", str(args.rate)], capture_output=True, text=True, timeout=3600)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise SystemExit(f"callgrind run failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return int(found.group(1))


def count_instructions(args: argparse.Namespace) -> None:
    """Instructions per request with and without the journal (callgrind), beside the time figure."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    n = args.requests
    per = {mode: (_collected(mode, 3 * n, args) - _collected(mode, n, args)) / (2 * n) for mode in ("base", "journal")}
    base_ns = median([in_telemetry(None, n, args.open, max(1, int(args.rate * 0.05))) for _ in range(5)])
    extra = per["journal"] - per["base"]
    us = base_ns / 1000 * extra / per["base"]
    print(f"Instructions per request of the \"in Telemetry\" case (valgrind callgrind, runs of {n:,} and {3 * n:,} "
          f"requests, {args.open} in flight)")
    print(table(["case", "instructions per request", "beside"], [
        ["Telemetry", per["base"], f"baseline, {base_ns / 1000:.2f} us of CPU here (median of 5)"],
        ["Telemetry + Journal", per["journal"], f"+{extra / per['base']:.0%}"],
    ]))
    print()
    print(table(["check", "figure", "target", "verdict"], [
        ["journal, amortised per request (us, from instructions)", us, f"<= {TARGET_US:g}",
         _verdict(us <= TARGET_US)],
        ["journal, instructions per request", extra, "-", ""],
    ]))


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=1000.0,
                    help="requests per second the writer's batches stand for (a 50 ms flush takes rate/20)")
    ap.add_argument("--open", type=int, default=256, help="requests in flight (and open during the progress reads)")
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions under valgrind's callgrind instead (noise-free on a busy machine)")
    ap.add_argument("--one", choices=("base", "journal"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:  # one case, for --instructions
        with temp_dir() as d:
            in_telemetry(d / "t" if args.one == "journal" else None, args.requests, args.open,
                         max(1, int(args.rate * 0.05)))
        return
    if args.instructions:
        count_instructions(args)
        return
    batch = max(1, int(args.rate * 0.05))
    runs: dict[str, list[float]] = {k: [] for k in ("bare", "appends", "writes", "progress", "tel", "tel+journal",
                                                    "diff")}
    with temp_dir() as d:
        for r in range(args.repeats):
            cases: list[tuple[str, Callable[[], float]]] = [
                ("bare", functools.partial(bare_appends, args.requests)),
                ("appends", functools.partial(journal_appends, d / f"a{r}", args.requests)),
                ("writes", functools.partial(journal_writes, d / f"w{r}", args.requests, batch)),
                ("progress", functools.partial(progress_read, d / f"p{r}", args.open, 20)),
            ]
            for name, case in cases:
                gc.collect()
                runs[name].append(case())
            pair = [("tel", None), ("tel+journal", d / f"t{r}")]
            if r % 2:
                pair.reverse()
            got = {name: in_telemetry(folder, args.requests, args.open, batch) for name, folder in pair}
            runs["tel"].append(got["tel"])
            runs["tel+journal"].append(got["tel+journal"])
            runs["diff"].append(got["tel+journal"] - got["tel"])

    def med(name: str) -> float:
        return median(runs[name])

    print(f"The journal per request: medians of {args.repeats} repeats x {args.requests:,} requests; writer batches "
          f"of {batch} requests (a 50 ms flush at {args.rate:g} req/s)")
    print(table(["case", "per request (ns)", "beside"], [
        ["request path: open + end + close", med("appends"), f"three bare deque appends: {med('bare'):.0f} ns"],
        ["writer: the entries written (journal's thread)", med("writes"), "-"],
        ["Telemetry, CPU per request", med("tel"), "without the journal (baseline)"],
        ["Telemetry + Journal, CPU per request", med("tel+journal"), "with the journal"],
        ["progress read, per open request per read (info)", med("progress"), f"{args.open} open requests"],
    ]))
    diff_us = med("diff") / 1000
    print()
    print(table(["check", "figure", "target", "verdict"], [
        ["journal, amortised per request (us)", diff_us, f"<= {TARGET_US:g}",
         _verdict(diff_us <= TARGET_US)],
        ["request path alone (us)", med("appends") / 1000, "-", ""],
    ]))


if __name__ == "__main__":
    main()
