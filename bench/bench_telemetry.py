"""Instrumentation cost per request and per token, side by side, and the summary sink's throughput.

One simulated request: arrival, admitted, scheduled, 256 output tokens with one commit per token (each also
handed to the transport), finish ``stop``. Ways to instrument it, timed in the same run (their order rotates
from one repeat to the next):

* bare: ``list.append(time.monotonic_ns())`` per token, nothing else (the per-token baseline);
* (a) plain prometheus-client as servers do today: ``.labels()`` children looked up per request, an ITL
  ``observe`` per token, TTFT/TPOT/e2e/queue observes, token and request counter increments;
* (b) llmslo, same metrics plus request-id exemplars, no tracing (``commit()`` + ``send()`` per token);
* (b') llmslo, ``commit()`` only per token (what the engine loop itself calls);
* (b-py) as (b) with the pure-Python token log forced (what a server gets when the native module was not
  built at install: no C compiler); (b) itself uses the native log when it is built, as a server would;
* (c) llmslo with tracing (request span, three phase spans, GenAI metrics) to an in-memory span exporter
  (``SimpleSpanProcessor``, so the export is inside the timing) and an in-memory metric reader.

Request ids are made before the timing (a server has them whether it instruments or not). Per-token cost is
the slope between a 256-token and a 1-token request; the fixed per-request cost is the
1-token request minus one token. Each figure is the median over the repeats of the figure computed within a
repeat (ratios too: numerator and denominator come from the same repeat). Targets: (b) per token <= 2x
bare; (b) fixed <= 20 us; (a) / (b) per request >= 5. The sink: pre-built summaries pushed into
``SummarySink(DuckDBSummaryWriter)`` (an on-disk DuckDB file) until ``close()`` returns; target >= 50,000
summaries/s with memory bounded by the queue (the deepest queue never exceeds its capacity).

Run: ``.venv/bin/python -m llmslo.bench.bench_telemetry --repeats 3 --loops 500 --sink-rows 100000``
"""

from __future__ import annotations

import argparse
import functools
import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from llmslo.bench._util import current_rss_mb, median, table, temp_dir
from llmslo.telemetry import DEFAULT_BUCKETS_S, METRICS_BY_KEY, SummarySink, Telemetry
from llmslo.telemetry._tokenlog import NativeTokenLog, PyTokenLog

TOKENS = 256
TARGET_PER_TOKEN_X = 2.0
TARGET_FIXED_US = 20.0
TARGET_VS_PROMETHEUS_X = 5.0
TARGET_SINK_PER_S = 50_000


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


def _request_ids(loops: int) -> list[str]:
    """Made before the timing starts: a server has its request ids whether it instruments or not."""
    return [f"req-{i}" for i in range(loops)]


def _llmslo_loop(tel: Telemetry, n: int, loops: int, after: Callable[[], object] | None = None,
                 send_too: bool = True) -> float:
    ids = _request_ids(loops)
    t0 = time.perf_counter_ns()
    for rid in ids:
        t = tel.start(rid, model="m", prompt_tokens=100)
        t.admit()
        t.schedule()
        commit, send = t.commit, t.send
        if send_too:
            for _ in range(n):
                commit()
                send()
        else:
            for _ in range(n):
                commit()
        t.finish("stop")
        if after is not None:
            after()
    return (time.perf_counter_ns() - t0) / loops


def llmslo(n: int, loops: int) -> float:
    return _llmslo_loop(Telemetry(version="v1"), n, loops)


def llmslo_pure_python(n: int, loops: int) -> float:
    """(b) with the pure-Python token log, as without the native module."""
    tel = Telemetry(version="v1")
    tel._new_token_log = functools.partial(PyTokenLog, time.monotonic_ns)  # as without the native module
    return _llmslo_loop(tel, n, loops)


def llmslo_commit_only(n: int, loops: int) -> float:
    """Only the per-token call the engine makes (``commit``), for comparison with the bare append."""
    return _llmslo_loop(Telemetry(version="v1"), n, loops, send_too=False)


def _tracing_case() -> Callable[[int, int], float] | None:
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from llmslo.telemetry import RequestTracing
    except ImportError:
        return None

    def llmslo_tracing(n: int, loops: int) -> float:
        spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
        tel = Telemetry(version="v1", tracing=RequestTracing(tracer_provider=provider, meter_provider=meters))
        try:
            return _llmslo_loop(tel, n, loops, after=spans.clear)  # cleared: the exporter would grow forever
        finally:
            provider.shutdown()
            meters.shutdown()

    return llmslo_tracing


def _prefill(path: Path, rows: int) -> None:
    """``rows`` synthetic summaries already in the store, so each batch is checked against them (ids)."""
    import pyarrow as pa

    from llmslo.analysis import Store
    from llmslo.bench._data import synthetic_summaries

    with Store.open(path) as store:
        done = 0
        while done < rows:
            n = min(1_000_000, rows - done)
            t = synthetic_summaries(n, seed=done)
            ids = pa.array([f"stored-{i}" for i in range(done, done + n)])
            store.ingest_frame(t.set_column(t.schema.get_field_index("request_id"), "request_id", ids),
                               source="prefill")
            done += n


def sink_throughput(rows: int, prefill: int = 0) -> dict[str, Any]:
    try:
        from llmslo.analysis.store._sink_writers import DuckDBSummaryWriter
    except ImportError as exc:
        return {"error": f"needs the analysis extra: {exc}"}
    with temp_dir() as d:
        capacity = 100_000
        if prefill:
            _prefill(d / "s.duckdb", prefill)
        writer = DuckDBSummaryWriter(d / "s.duckdb")
        template = Telemetry()
        t = template.start("x", model="m", prompt_tokens=10)
        t.commit()
        t.commit()
        t.finish("stop")
        assert t.summary is not None
        base = t.summary
        made = [{**base, "request_id": f"r{i}"} for i in range(rows)]
        rss_before = current_rss_mb()
        sink = SummarySink(writer, capacity=capacity, batch_rows=50_000, flush_interval_s=0.05)
        deepest = 0
        waits = 0
        t0 = time.perf_counter()
        for i, row in enumerate(made):
            while sink.queued >= capacity:  # a bench producer waits; a server would drop and count
                waits += 1
                time.sleep(0.001)
            sink(row)
            if not i & 1023:
                deepest = max(deepest, sink.queued)
        sink.close(timeout_s=120)
        elapsed = time.perf_counter() - t0
        return {"rate": sink.written / elapsed, "written": sink.written, "stored": writer.rows_written,
                "lost": sink.dropped["queue_full"] + sink.dropped["store_error"], "deepest": deepest,
                "capacity": capacity, "waits": waits, "rss_growth_mb": current_rss_mb() - rss_before}


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--loops", type=int, default=2000)
    ap.add_argument("--sink-rows", type=int, default=300_000)
    ap.add_argument("--sink-prefill", type=int, default=0,
                    help="summaries already in the store before the sink starts (each batch is checked against "
                         "their ids)")
    args = ap.parse_args()
    fns: dict[str, Callable[[int, int], float]] = {
        "bare append": bare, "(a) prometheus-client": plain_prometheus, "(b) llmslo": llmslo,
        "(b') llmslo commit() only": llmslo_commit_only, "(b-py) llmslo, pure-Python token log": llmslo_pure_python,
    }
    tracing = _tracing_case()
    if tracing is not None:
        fns["(c) llmslo + tracing (in-memory)"] = tracing
    names = list(fns)
    # per repeat: name -> (per request 256 tokens ns, per token ns, fixed ns)
    per_repeat: list[dict[str, tuple[float, float, float]]] = []
    for r in range(args.repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        res: dict[str, tuple[float, float, float]] = {}
        for name in order:
            fn = fns[name]
            fn(TOKENS, max(1, args.loops // 20))  # warm up
            gc.collect()
            big = fn(TOKENS, args.loops)
            one = fn(1, args.loops * 4)
            tok = (big - one) / (TOKENS - 1)
            res[name] = (big, tok, one - tok)
        per_repeat.append(res)

    def med(name: str, i: int) -> float:
        return median([rep[name][i] for rep in per_repeat])

    def med_ratio(num: str, den: str, i: int, j: int | None = None) -> float:
        return median([rep[num][i] / rep[den][i if j is None else j] for rep in per_repeat])

    print(f"One request, {TOKENS} tokens, one commit per token; medians of {args.repeats} repeats "
          f"x {args.loops} requests (order rotated per repeat); token log in (b): "
          f"{'native' if NativeTokenLog is not None else 'pure Python (the native module is not built)'}")
    print(table(["method", "per request (us)", "per token (ns)", "fixed per request (us)"],
                [[n, med(n, 0) / 1000, med(n, 1), med(n, 2) / 1000] for n in names]))
    per_token_x = med_ratio("(b) llmslo", "bare append", 1)
    commit_x = med_ratio("(b') llmslo commit() only", "bare append", 1)
    fixed_us = med("(b) llmslo", 2) / 1000
    vs_prom = med_ratio("(a) prometheus-client", "(b) llmslo", 0)
    checks = [
        ["(b) per token / bare append", per_token_x, f"<= {TARGET_PER_TOKEN_X:g}",
         _verdict(per_token_x <= TARGET_PER_TOKEN_X)],
        ["(b) fixed per request (us)", fixed_us, f"<= {TARGET_FIXED_US:g}", _verdict(fixed_us <= TARGET_FIXED_US)],
        ["(a) / (b) per request", vs_prom, f">= {TARGET_VS_PROMETHEUS_X:g}",
         _verdict(vs_prom >= TARGET_VS_PROMETHEUS_X)],
        ["(b') commit() per token / bare append (info)", commit_x, "-", ""],
        ["(b-py) per token / bare append (info)", med_ratio("(b-py) llmslo, pure-Python token log", "bare append", 1),
         "-", ""],
        ["(b-py) fixed per request (us) (info)", med("(b-py) llmslo, pure-Python token log", 2) / 1000, "-", ""],
    ]
    if tracing is not None:
        c = "(c) llmslo + tracing (in-memory)"
        checks.append(["(c) fixed per request (us) (info)", med(c, 2) / 1000, "-", ""])
        checks.append(["(c) / (b) per request (info)", med_ratio(c, "(b) llmslo", 0), "-", ""])
    else:
        checks.append(["(c) tracing", "not measured: the otlp extra is missing", "-", ""])
    print()
    print(table(["check", "figure", "target", "verdict"], checks))
    sink = sink_throughput(args.sink_rows, args.sink_prefill)
    print()
    if "error" in sink:
        print(f"sink: not measured ({sink['error']})")
        return
    bounded = sink["deepest"] <= sink["capacity"]
    print(table([f"sink (SummarySink -> DuckDBSummaryWriter, on-disk file, {args.sink_prefill:,} already stored)",
                 "figure", "target", "verdict"], [
        ["summaries/s (until close() returned)", sink["rate"], f">= {TARGET_SINK_PER_S:,}",
         _verdict(sink["rate"] >= TARGET_SINK_PER_S)],
        ["deepest queue / capacity", f"{sink['deepest']:,} / {sink['capacity']:,}", "<= capacity",
         _verdict(bounded)],
        ["RSS change while sinking (MiB, info)", sink["rss_growth_mb"], "-", ""],
        ["written / stored / lost", f"{sink['written']:,} / {sink['stored']:,} / {sink['lost']:,}", "-", ""],
    ]))


if __name__ == "__main__":
    main()
