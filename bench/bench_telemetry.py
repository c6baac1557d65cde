"""Instrumentation cost per request and per token, side by side, and the summary sink's throughput.

One simulated request: arrival, admitted, scheduled, 256 output tokens with one commit per token (each also
handed to the transport), finish ``stop``. Ways to instrument it, timed in the same run:

* bare: ``list.append(time.monotonic_ns())`` per token, nothing else (the per-token baseline);
* (a) plain prometheus-client as servers do today: ``.labels()`` children looked up per request, an ITL
  ``observe`` per token, TTFT/TPOT/e2e/queue observes, token and request counter increments;
* (b) llmslo, same metrics plus request-id exemplars, no tracing.

Per-token cost of (b) is the slope between a 256-token and a 1-token request; its fixed per-request cost is the
1-token request minus one token. Targets: per-token <= 2x bare, fixed <= 20 us, (b) >= 5x cheaper than (a)
per request. The sink: pre-built summaries pushed into ``SummarySink(DuckDBWriter)`` until ``close()`` returns
(on-disk DuckDB file); target >= 50,000 summaries/s with memory bounded by the queue. Medians over repeats.

Run: ``.venv/bin/python -m llmslo.bench.bench_telemetry``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram

from llmslo.bench._util import median, table, temp_dir
from llmslo.telemetry import DEFAULT_BUCKETS_S, METRICS_BY_KEY, DuckDBWriter, SummarySink, Telemetry

TOKENS = 256


def bare(n: int, loops: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(loops):
        out: list[int] = []
        append = out.append
        now = time.monotonic_ns
        for _ in range(n):
            append(now())
    return (time.perf_counter_ns() - t0) / loops


def plain_prometheus(n: int, loops: int) -> float:
    reg = CollectorRegistry()
    lab = ["model", "version", "tenant_class"]

    def hist(key: str) -> Histogram:
        m = METRICS_BY_KEY[key]
        return Histogram(m.name, m.help, lab, registry=reg, buckets=DEFAULT_BUCKETS_S[f"{key}_s"])

    ttft, tpot, itl, e2e, queue = (hist(k) for k in ("ttft", "tpot", "itl", "e2e", "queue"))
    gen = Counter(METRICS_BY_KEY["generated_tokens"].instrument_name, "g", lab, registry=reg)
    sent = Counter(METRICS_BY_KEY["sent_tokens"].instrument_name, "s", lab, registry=reg)
    prompt = Counter(METRICS_BY_KEY["prompt_tokens"].instrument_name, "p", lab, registry=reg)
    reqs = Counter(METRICS_BY_KEY["requests"].instrument_name, "r", [*lab, "finish_reason"], registry=reg)
    now = time.monotonic_ns
    t0 = time.perf_counter_ns()
    for _ in range(loops):
        labels = ("m", "v1", "default")
        arrival = now()
        scheduled = now()
        itl_child = itl.labels(*labels)
        sent_child = sent.labels(*labels)
        first = last = 0
        for i in range(n):
            t = now()
            if i == 0:
                first = t
            else:
                itl_child.observe((t - last) / 1e9)
            last = t
            sent_child.inc()
        end = now()
        ttft.labels(*labels).observe((first - arrival) / 1e9)
        if n > 1:
            tpot.labels(*labels).observe((last - first) / 1e9 / (n - 1))
        e2e.labels(*labels).observe((end - arrival) / 1e9)
        queue.labels(*labels).observe((scheduled - arrival) / 1e9)
        gen.labels(*labels).inc(n)
        prompt.labels(*labels).inc(100)
        reqs.labels(*labels, "stop").inc()
    return (time.perf_counter_ns() - t0) / loops


def llmslo(n: int, loops: int) -> float:
    tel = Telemetry(version="v1")
    t0 = time.perf_counter_ns()
    for i in range(loops):
        t = tel.start(f"req-{i}", model="m", prompt_tokens=100)
        t.admit()
        t.schedule()
        commit, send = t.commit, t.send
        for _ in range(n):
            commit()
            send()
        t.finish("stop")
    return (time.perf_counter_ns() - t0) / loops


def llmslo_commit_only(n: int, loops: int) -> float:
    """Only the per-token call the engine makes (``commit``), for comparison with the bare append."""
    tel = Telemetry(version="v1")
    t0 = time.perf_counter_ns()
    for i in range(loops):
        t = tel.start(f"req-{i}", model="m")
        commit = t.commit
        for _ in range(n):
            commit()
        t.finish("stop")
    return (time.perf_counter_ns() - t0) / loops


def sink_throughput(rows: int) -> tuple[float, int]:
    with temp_dir() as d:
        capacity = 100_000
        sink = SummarySink(DuckDBWriter(d / "s.duckdb"), capacity=capacity, batch_rows=50_000, flush_interval_s=0.05)
        template = Telemetry(sink=None)
        t = template.start("x", model="m", prompt_tokens=10)
        t.commit()
        t.commit()
        t.finish("stop")
        assert t.summary is not None
        base = t.summary
        made = [{**base, "request_id": f"r{i}"} for i in range(rows)]
        t0 = time.perf_counter()
        deepest = 0
        for row in made:
            while sink.queued >= capacity:  # a bench producer waits; a server would drop and count
                time.sleep(0.001)
            sink(row)
            deepest = max(deepest, sink.queued) if not (len(made) & 1023) else deepest
        sink.close(timeout_s=120)
        elapsed = time.perf_counter() - t0
        return sink.written / elapsed, sink.dropped["queue_full"] + sink.dropped["store_error"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--loops", type=int, default=2000)
    ap.add_argument("--sink-rows", type=int, default=300_000)
    args = ap.parse_args()
    fns: dict[str, Callable[[int, int], float]] = {
        "bare append": bare, "(a) prometheus-client": plain_prometheus, "(b) llmslo": llmslo,
        "(b) llmslo commit() only": llmslo_commit_only,
    }
    res: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for name, fn in fns.items():
            for n in (1, TOKENS):
                res.setdefault((name, n), []).append(fn(n, args.loops))
    rows = []
    per_token: dict[str, float] = {}
    fixed: dict[str, float] = {}
    for name in fns:
        big, one = median(res[(name, TOKENS)]), median(res[(name, 1)])
        per_token[name] = (big - one) / (TOKENS - 1)
        fixed[name] = one - per_token[name]
        rows.append([name, big / 1000, per_token[name], fixed[name] / 1000])
    print(f"One request, {TOKENS} tokens, one commit per token; medians of {args.repeats} repeats x {args.loops}")
    print(table(["method", "per request (us)", "per token (ns)", "fixed per request (us)"], rows))
    b_req, a_req = median(res[("(b) llmslo", TOKENS)]), median(res[("(a) prometheus-client", TOKENS)])
    print()
    print(table(["check", "figure", "target", "ok"], [
        ["(b) per token / bare append", per_token["(b) llmslo"] / per_token["bare append"], "<= 2", ""],
        ["(b) commit() per token / bare append",
         per_token["(b) llmslo commit() only"] / per_token["bare append"], "<= 2", ""],
        ["(b) fixed per request (us)", fixed["(b) llmslo"] / 1000, "<= 20", ""],
        ["(a) / (b) per request", a_req / b_req, ">= 5", ""],
    ]))
    print("(c) llmslo with tracing to an in-memory exporter: not measured (tracing not implemented)")
    rate, lost = sink_throughput(args.sink_rows)
    print()
    print(table(["sink", "summaries/s", "target", "lost"], [["SummarySink -> DuckDB store", rate, ">= 50,000", lost]]))


if __name__ == "__main__":
    main()
