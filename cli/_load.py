"""``llmslo load URL``: drive open-loop load against an OpenAI-compatible endpoint and report what the client saw.

This module only wires: it reads the flags, reads a trace through ``llmslo.analysis.workload.read_trace`` or
a schedule file llmslo wrote (``llmslo import``, ``llmslo trace --out``) through
``llmslo.analysis.workload.read_schedule``, and hands the load generator (``llmslo.loadgen``, which reads no
Parquet itself) a plain schedule, picks the summary writer (the DuckDB
store for ``--db``, JSONL files for ``--jsonl``), runs, and prints the ``vllm bench serve``-style table beside
``llmslo report`` over this run's client-side summaries. Its module imports only typer and
light standard-library modules; everything else (asyncio included) is imported when the command runs, so
``llmslo --help`` stays fast.

Exit status: 0 when the run completed (failed requests included); 1 when the target is unreachable from the
start, or a file it names is missing or invalid, or summaries could not be written; 2 for bad flags (naming
the flag and showing the accepted form); 128 + the signal's number after SIGINT / SIGTERM stopped the run
(every summary of an attempt that was sent is still written).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmslo.cli._common import ApiKeyOption, ModelOption, ServerUrl

if TYPE_CHECKING:
    from llmslo.analysis.report import Report
    from llmslo.loadgen import BenchFigures, Goodput, LoadConfig, Progress, RunResult, Schedule, Target

__all__ = ["load_command"]

SINK_CLOSE_TIMEOUT_S = 60.0
"""How long the end of a run waits for the summary writer to finish, seconds."""


class _Tee:
    """A summary writer that hands each batch to several writers (``--db`` and ``--jsonl`` together)."""

    def __init__(self, writers: Sequence[Any]) -> None:
        self.writers = list(writers)

    def write(self, rows: Sequence[Mapping[str, object]]) -> None:
        for w in self.writers:
            w.write(rows)

    def close(self) -> None:
        for w in self.writers:
            w.close()


def _usage(message: str) -> typer.Exit:
    from llmslo.cli._common import EXIT_USAGE, fail

    return fail(message, EXIT_USAGE)


def _input(message: str) -> typer.Exit:
    from llmslo.cli._common import EXIT_INPUT, fail

    return fail(message, EXIT_INPUT)


SERVE_HINT = "llmslo load needs the 'serve' extra (httpx is missing): pip install 'llmslo[serve]'"
ANALYSIS_MODULES = ("duckdb", "pyarrow", "polars")
"""What ``--db``, ``--trace-kind``, ``--schedule`` and the report need (the ``analysis`` extra)."""


def _missing(*modules: str) -> list[str]:
    """The modules of ``modules`` that cannot be imported (checked without importing them)."""
    import importlib.util

    return [m for m in modules if importlib.util.find_spec(m) is None]


def _needs_analysis(flag: str) -> None:
    """Exit 1 with the install hint when ``flag`` needs the analysis extra and it is missing."""
    missing = _missing(*ANALYSIS_MODULES)
    if missing:
        raise _input(f"{flag} needs the 'analysis' extra ({', '.join(missing)} is not installed): "
                     "pip install 'llmslo[analysis]'")


def _seconds(flag: str, text: str | None, *, zero: bool = False) -> float | None:
    from llmslo.loadgen import SpecError, parse_seconds

    if text is None:
        return None
    try:
        return parse_seconds(flag, text, zero=zero)
    except SpecError as exc:
        raise _usage(str(exc)) from None


def _refuse_beside_schedule(trace: tuple[str, Path] | None, flags: Mapping[str, object]) -> None:
    """Exit 2 when a flag that makes or reshapes arrivals comes with ``--schedule`` (whose file is replayed as
    written); ``flags`` maps each such flag to its value (None or empty: not given)."""
    if trace is not None:
        raise _usage("--trace-kind: give a trace (--trace-kind KIND FILE) or a schedule file (--schedule FILE), "
                     "not both; a schedule file is replayed as written")
    for flag, value in flags.items():
        if value is None or value == []:
            continue
        if flag in ("--rate", "--arrivals", "--burstiness"):
            raise _usage(f"{flag}: --schedule FILE replays the file's own arrival times as written; drop {flag} "
                         "(synthetic arrivals: --rate without --schedule)")
        if flag in ("--ramp", "--burst"):
            raise _usage(f"{flag}: --schedule FILE replays the file's offsets as written; drop {flag}, or reshape "
                         f"a trace's arrivals with --trace-kind KIND TRACE {flag} ...")
        raise _usage(f"{flag}: --schedule FILE replays the file's lengths as written; drop {flag}, or replace a "
                     f"trace's lengths with --trace-kind KIND TRACE {flag} N")


def _schedule(trace: tuple[str, Path] | None, *, arrivals: str | None, rate: float | None, burstiness: float | None,
              duration_s: float | None, max_requests: int | None, ramp_s: float | None, bursts: list[str],
              prompt: str | None, output: str | None, seed: int, schedule_file: Path | None = None) -> Schedule:
    """The schedule the flags describe; exits 2 for a bad flag, 1 for a trace or schedule file that cannot be
    read."""
    from llmslo.loadgen import (
        Burst,
        LengthSpec,
        RateProfile,
        SpecError,
        check_limits,
        synthetic_schedule,
        trace_schedule,
    )

    if schedule_file is not None:
        _refuse_beside_schedule(trace, {"--rate": rate, "--arrivals": arrivals, "--burstiness": burstiness,
                                        "--ramp": ramp_s, "--burst": bursts, "--prompt-tokens": prompt,
                                        "--output-tokens": output})
        return _file_schedule(schedule_file, duration_s=duration_s, max_requests=max_requests, seed=seed)
    try:
        profile = RateProfile(ramp_s, tuple(Burst.parse(b) for b in bursts))
        prompt_spec = None if prompt is None else LengthSpec.parse("--prompt-tokens", prompt)
        output_spec = None if output is None else LengthSpec.parse("--output-tokens", output)
        if trace is None:
            if rate is None:
                raise _usage("--rate: required without --trace-kind or --schedule (requests per second, e.g. "
                             "--rate 5), or replay a trace with --trace-kind azure|mooncake|burstgpt FILE, or a "
                             "schedule llmslo wrote with --schedule FILE")
            kind = arrivals or "poisson"
            if kind == "gamma" and burstiness is None:
                raise _usage("--burstiness: gamma arrivals need their coefficient of variation, e.g. "
                             "--arrivals gamma --burstiness 2 (1 is Poisson)")
            return synthetic_schedule(rate_per_s=rate, arrivals=kind, cv=1.0 if burstiness is None else burstiness,
                                      prompt=prompt_spec or LengthSpec(128, 128),
                                      output=output_spec or LengthSpec(128, 128), duration_s=duration_s,
                                      max_requests=max_requests, profile=profile, seed=seed)
        for flag, value in (("--rate", rate), ("--arrivals", arrivals), ("--burstiness", burstiness)):
            if value is not None:
                raise _usage(f"{flag}: a trace replays its own arrival times; drop {flag} or --trace-kind")
        check_limits(duration_s, max_requests)  # before the trace is read
    except SpecError as exc:
        raise _usage(str(exc)) from None
    offsets, prompts, outputs, source = _read_trace(*trace)
    try:
        return trace_schedule(offsets, prompts, outputs, source=source, profile=profile, duration_s=duration_s,
                              max_requests=max_requests, prompt=prompt_spec, output=output_spec, seed=seed)
    except SpecError as exc:  # pragma: no cover - the limits were checked above
        raise _usage(str(exc)) from None
    except ValueError as exc:
        raise _input(str(exc)) from None


def _file_schedule(path: Path, *, duration_s: float | None, max_requests: int | None, seed: int) -> Schedule:
    """The schedule in ``path`` (written by ``llmslo import`` or ``llmslo trace --out``), its offsets and
    lengths as written, cut by ``--duration`` / ``--max-requests``; exits 2 for a bad limit, 1 for a file that
    cannot be read (naming the file, the column or row, and the fix)."""
    import dataclasses

    from llmslo.loadgen import SpecError, check_limits, trace_schedule

    try:
        check_limits(duration_s, max_requests)  # before the file is read
    except SpecError as exc:
        raise _usage(str(exc)) from None
    if not path.is_file():
        raise _input(f"--schedule: no such file {path}")
    _needs_analysis("--schedule")
    from llmslo.analysis.workload import ScheduleFileError, read_schedule

    try:
        read = read_schedule(path)
    except ScheduleFileError as exc:
        raise _input(f"--schedule: {exc}") from None
    try:
        schedule = trace_schedule(read.offsets_s, read.input_tokens, read.output_tokens, source=str(path),
                                  duration_s=duration_s, max_requests=max_requests, seed=seed,
                                  recorded_by="the schedule")
    except ValueError as exc:  # pragma: no cover - read_schedule checked the values
        raise _input(f"--schedule: {exc}") from None
    source = (f"schedule file {path}, replayed as written (offsets and lengths; {len(read):,} arrivals in the "
              "file)")
    return dataclasses.replace(schedule, source=source, notes=(*read.notes, *schedule.notes))


def _read_trace(kind: str, path: Path) -> tuple[list[float], list[int], list[int], str]:
    from llmslo.cli._help import TRACE_KINDS

    if kind not in TRACE_KINDS:
        raise _usage(f"--trace-kind: unknown kind {kind!r}; accepted form: --trace-kind "
                     f"{'|'.join(TRACE_KINDS)} FILE")
    if not path.is_file():
        raise _input(f"--trace-kind: no such file {path}")
    _needs_analysis("--trace-kind")
    from llmslo.analysis.workload import TraceFormatError, read_trace

    try:
        frame, summary = read_trace(kind, path)
    except TraceFormatError as exc:
        raise _input(str(exc)) from None
    return (frame["offset_s"].to_list(), frame["input_tokens"].to_list(), frame["output_tokens"].to_list(),
            f"{kind} trace {path} ({summary.requests:,} requests)")


def _check_outputs(db: Path | None, jsonl: Path | None, attempts_log: Path | None) -> None:
    """Exit 1 before anything is sent when an output cannot be written (nothing is created here)."""
    if db is not None:
        _needs_analysis("--db")
        if db.is_dir():
            raise _input(f"--db: {db} is a folder; name a DuckDB file")
        if not db.parent.is_dir():
            raise _input(f"--db: no folder {db.parent} to create {db.name} in")
        if db.exists():
            from llmslo.analysis.store import Store, StoreError

            try:
                Store.open(db, read_only=True).close()
            except StoreError as exc:
                raise _input(f"--db: {exc}") from None
    if jsonl is not None and jsonl.exists() and not jsonl.is_dir():
        raise _input(f"--jsonl: {jsonl} is a file; name a folder for the JSONL summaries")
    if attempts_log is not None and (attempts_log.is_dir() or not attempts_log.parent.is_dir()):
        raise _input(f"--attempts-log: cannot write {attempts_log} (a folder, or its folder is missing)")


def _target_model(target: Target, model: str | None, api_key: str | None) -> tuple[str, list[str]]:
    """The model to ask for and the notes about it; exits 1 when the target cannot be reached."""
    import asyncio

    from llmslo.loadgen import Unreachable, probe

    try:
        listed = asyncio.run(probe(target, api_key=api_key))
    except Unreachable as exc:
        raise _input(f"{exc}; nothing was sent") from None
    if model is not None:
        if listed and model not in listed:
            return model, [f"the server lists {', '.join(listed[:5])} at /v1/models, not {model!r}"]
        return model, []
    if not listed:
        raise _input(f"{target.models_url} lists no model; pass --model NAME")
    return listed[0], [f"model {listed[0]!r}: the first the server lists at /v1/models"]


class _Bar:
    """A progress bar on standard error while the run goes (only on a terminal)."""

    def __init__(self, total: int) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from llmslo.cli._common import err

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                            TextColumn("{task.completed:,}/{task.total:,}"), TimeElapsedColumn(), console=err(),
                            transient=True)
        self.task = self.bar.add_task("load", total=total)
        self.bar.start()

    def __call__(self, p: Progress) -> None:
        self.bar.update(self.task, completed=p.done,
                        description=f"sent {p.sent:,}  in flight {p.in_flight:,}  failed {p.failed:,}")

    def stop(self) -> None:
        self.bar.stop()


def _sink(db: Path | None, jsonl: Path | None) -> Any:
    """The summary sink for ``--db`` / ``--jsonl`` (None when neither is given)."""
    writers: list[Any] = []
    if db is not None:
        from llmslo.analysis.store import DuckDBSummaryWriter

        writers.append(DuckDBSummaryWriter(db))
    if jsonl is not None:
        from llmslo.telemetry import JsonlWriter

        writers.append(JsonlWriter(jsonl))
    if not writers:
        return None
    from llmslo.telemetry import SummarySink

    return SummarySink(writers[0] if len(writers) == 1 else _Tee(writers))


def _report(rows: list[dict[str, Any]], goodput: Goodput | None) -> Report | None:
    """``llmslo report`` over this run's rows (a temporary store, removed afterwards); None without the
    analysis extra."""
    if _missing(*ANALYSIS_MODULES):
        return None
    import tempfile

    from llmslo.analysis.report import GoodputPolicy, ReportSpec, build_report
    from llmslo.analysis.store import Store, summary_table
    from llmslo.telemetry import DEFAULT_TPOT_S, DEFAULT_TTFT_S

    policy = (GoodputPolicy(ttft_s=goodput.ttft_s, tpot_s=goodput.tpot_s, e2e_s=goodput.e2e_s) if goodput
              else GoodputPolicy(ttft_s=DEFAULT_TTFT_S, tpot_s=DEFAULT_TPOT_S))
    with tempfile.TemporaryDirectory(prefix="llmslo-load-") as tmp, Store.open(Path(tmp) / "client.duckdb") as store:
        if rows:
            store.ingest_frame(summary_table(rows), source="this run (client-side summaries)")
        return build_report(store.con, ReportSpec(policy))


def _run(schedule: Schedule, config: LoadConfig, sink: Any, attempts_log: Path | None,
         progress: bool) -> RunResult:
    import asyncio

    from llmslo.loadgen import run_load

    bar = _Bar(len(schedule)) if progress else None
    log = attempts_log.open("w", encoding="utf-8", buffering=1) if attempts_log is not None else None
    try:
        return asyncio.run(run_load(schedule, config, sink=sink, attempts_log=log, on_progress=bar,
                                    handle_signals=True))
    finally:
        if bar is not None:
            bar.stop()
        if log is not None:
            log.close()


def _print_text(config: LoadConfig, schedule: Schedule, result: RunResult, figures: BenchFigures,
                report: Report | None, notes: list[str]) -> None:
    from llmslo.cli._common import console, shown
    from llmslo.loadgen import render_table

    out = console()
    out.print(f"target: {shown(config.target.url)}  model: {shown(config.model)}  version: {shown(config.version)}",
              highlight=False, soft_wrap=True)
    out.print(f"schedule: {shown(schedule.source)}: {len(schedule):,} arrivals over {schedule.span_s:.1f} s",
              highlight=False, soft_wrap=True)
    header = config.request_id_header
    out.print(f"request ids: {config.request_id} UUIDs, "
              + (f"sent as {shown(header)}" if header is not None else "not sent (--request-id-header off)"),
              highlight=False, soft_wrap=True)
    for note in [*schedule.notes, *notes, *result.notes()]:
        out.print(f"note: {shown(note)}", highlight=False, soft_wrap=True)
    out.print(shown(result.tokens.describe()), highlight=False, soft_wrap=True)
    out.print(shown(render_table(figures, causes=result.top_causes()), newlines=True), highlight=False,
              soft_wrap=True)
    out.print()
    if report is None:
        return
    from llmslo.cli._render import render_report

    out.print("llmslo report over this run's client-side summaries:", highlight=False)
    render_report(report, out)


def _json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if value - value == 0 else None  # NaN and infinities give NaN
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def load_command(
    url: ServerUrl,
    model: ModelOption = None,
    endpoint: Annotated[str | None, typer.Option("--endpoint", help="completions or chat (default: from the "
                                                 "URL, else completions).")] = None,
    api_key: ApiKeyOption = None,
    tenant_class: Annotated[str | None, typer.Option("--tenant-class", help="Sent as X-Tenant-Class; also the "
                                                     "rows' tenant_class (default: default).")] = None,
    version: Annotated[str, typer.Option("--version", help="The version label of the client rows.")] = "client",
    no_stream: Annotated[bool, typer.Option("--no-stream", help="Ask for whole replies (TTFT = reply "
                                            "complete).")] = False,
    no_ignore_eos: Annotated[bool, typer.Option("--no-ignore-eos", help="Do not send ignore_eos (servers that "
                                                "refuse unknown fields).")] = False,
    no_stream_options: Annotated[bool, typer.Option(
        "--no-stream-options", help="Do not ask streams for their usage (stream_options). Without it the field "
        "is dropped by itself once the server refuses it (400/422 naming it); tokens are then counted from "
        "content chunks unless the server sends usage anyway.")] = False,
    no_keep_alive: Annotated[bool, typer.Option(
        "--no-keep-alive", help="Open a new connection for every request, closed at its [DONE], as a client "
        "without a connection pool does (default: connections are kept and reused).")] = False,
    request_id: Annotated[str, typer.Option(
        "--request-id", help="uuid4 (random) or uuid7 (time-ordered, sorts by send time): every request's id, "
        "sent in --request-id-header and kept as the row's request_id.", metavar="uuid4|uuid7")] = "uuid4",
    request_id_header: Annotated[str, typer.Option(
        "--request-id-header", help="The header that carries the id; llmslo serve reads X-Request-Id, so the "
        "client and server rows join on it. off: send none (for servers that refuse the header; the rows "
        "keep their ids).", metavar="NAME|off")] = "X-Request-Id",
    trace: Annotated[tuple[str, Path] | None, typer.Option(
        "--trace-kind", help="Replay a trace: --trace-kind azure|mooncake|burstgpt FILE (its arrivals and "
        "lengths).", metavar="KIND FILE", show_default=False)] = None,
    schedule_file: Annotated[Path | None, typer.Option(
        "--schedule", help="Replay a schedule llmslo wrote (llmslo import azure|mooncake|burstgpt, llmslo trace "
        "--out; Parquet or JSON lines): its offsets and lengths as written (--duration and --max-requests cut it "
        "short).", metavar="FILE", show_default=False)] = None,
    arrivals: Annotated[str | None, typer.Option("--arrivals", help="poisson or gamma (default poisson), at "
                                                 "--rate.")] = None,
    rate: Annotated[float | None, typer.Option("--rate", help="Requests per second (synthetic arrivals).")] = None,
    burstiness: Annotated[float | None, typer.Option(
        "--burstiness", help="Gamma arrivals: coefficient of variation of the gaps (1 = Poisson, 2 burstier, "
        "0.5 smoother).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seeds arrivals, lengths, prompts and behaviours.")] = 0,
    duration: Annotated[str | None, typer.Option("--duration", help="Stop scheduling after this long, e.g. "
                                                 "60s, 5m.")] = None,
    max_requests: Annotated[int | None, typer.Option("--max-requests", help="Schedule at most this many "
                                                     "requests.")] = None,
    ramp: Annotated[str | None, typer.Option("--ramp", help="The rate rises linearly from 0 to full over this "
                                             "long, e.g. 30s.")] = None,
    burst: Annotated[list[str] | None, typer.Option(
        "--burst", help="FACTORx@START+LENGTH, e.g. 3x@60s+30s: the rate times 3 from 60 s for 30 s (for a "
        "trace its gaps are divided by 3 there); repeatable.")] = None,
    prompt_tokens: Annotated[str | None, typer.Option("--prompt-tokens", help="N or MIN-MAX words per prompt "
                                                      "(default 128, or the trace's).")] = None,
    output_tokens: Annotated[str | None, typer.Option("--output-tokens", help="N or MIN-MAX max_tokens "
                                                      "(default 128, or the trace's).")] = None,
    max_concurrency: Annotated[int | None, typer.Option(
        "--max-concurrency", help="Attempts in flight at most: a send waits for a slot (its lateness is "
        "reported).")] = None,
    slow_reader: Annotated[str | None, typer.Option(
        "--slow-reader", help="SHARE@TOKENS_PER_S, e.g. 0.1@20: that share reads at that pace (small "
        "SO_RCVBUF).")] = None,
    cancel: Annotated[str | None, typer.Option("--cancel", help="SHARE@DELAY, e.g. 0.05@2s: that share hangs "
                                               "up DELAY after sending.")] = None,
    timeout: Annotated[str | None, typer.Option("--timeout", help="Client timeout: hang up an attempt after "
                                                "this long, e.g. 30s.")] = None,
    slow_rcvbuf: Annotated[int, typer.Option(
        "--slow-rcvbuf", help="SO_RCVBUF of slow readers' sockets, bytes (smaller stalls loopback streams).")
    ] = 65_536,
    no_honour_retry_after: Annotated[bool, typer.Option(
        "--no-honour-retry-after", help="Keep sending while a 429/503's Retry-After runs.")] = False,
    no_breaker: Annotated[bool, typer.Option("--no-breaker", help="Failures never trip the client breaker "
                                             "(Retry-After is still honoured).")] = False,
    stop_wait: Annotated[str, typer.Option("--stop-wait", help="After Ctrl-C / SIGTERM, wait this long for "
                                           "attempts in flight, then hang up.")] = "10s",
    db: Annotated[Path | None, typer.Option("--db", help="Append the client-side summaries to this DuckDB "
                                            "store.")] = None,
    jsonl: Annotated[Path | None, typer.Option("--jsonl", help="Write the client-side summaries as JSONL files "
                                               "in this folder.")] = None,
    attempts_log: Annotated[Path | None, typer.Option(
        "--attempts-log", help="One JSON line per attempt: times (monotonic ns), status, Retry-After, "
        "chunks.")] = None,
    goodput: Annotated[list[str] | None, typer.Option(
        "--goodput", help="SLOs in ms as vllm bench takes them: 'ttft:500 tpot:50 e2el:3000' (one string or "
        "repeated).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")] = False,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="Never show a progress bar.")] = False,
) -> None:
    """Drive open-loop load against an OpenAI-compatible endpoint; report TTFT, TPOT, ITL and goodput.

    Arrivals come from a trace (--trace-kind, shaped by --ramp and --burst), a schedule file llmslo wrote
    (--schedule, replayed as written) or a seeded Poisson / gamma process (--rate, shaped by --ramp and
    --burst); every send happens at its scheduled time whatever the server does (only
    --max-concurrency holds sends back, and their lateness is reported). Each attempt gives one summary
    row measured on the client clock (rejected, cancelled and failed ones included). A client circuit
    breaker honours Retry-After: arrivals it refuses are recorded rejected / circuit_open, never sent.
    The summary says why attempts failed (e.g. 10 × HTTP 400 (empty body)) and where the token counts
    came from (the server's usage, or content chunks counted).

    Example: llmslo load http://127.0.0.1:8000 --rate 5 --duration 60s --goodput 'ttft:500 tpot:50'
    """
    import dataclasses
    import json

    if _missing("httpx"):
        raise _input(SERVE_HINT)
    from llmslo.loadgen import (
        Behaviours,
        Cancel,
        Goodput,
        LoadConfig,
        SlowReader,
        SpecError,
        Target,
        bench_figures,
        parse_request_id_header,
    )

    try:  # every flag first: a bad one exits 2 before anything is read, sent or created
        target = Target.parse(url, endpoint)
        behaviours = Behaviours(
            SlowReader.parse(slow_reader) if slow_reader is not None else None,
            Cancel.parse(cancel) if cancel is not None else None,
            _seconds("--timeout", timeout), seed)
        goodput_spec = Goodput.parse(goodput or [])
        if arrivals is not None and arrivals not in ("poisson", "gamma"):
            raise SpecError("--arrivals", arrivals, "poisson or gamma", "unknown kind")
        stop_wait_s = _seconds("--stop-wait", stop_wait, zero=True) or 0.0
        config = LoadConfig(target, model if model is not None else "(the first the server lists)",
                            stream=not no_stream, ignore_eos=not no_ignore_eos, api_key=api_key,
                            tenant_class=tenant_class, version=version, max_concurrency=max_concurrency,
                            behaviours=behaviours, honour_retry_after=not no_honour_retry_after,
                            breaker=not no_breaker, slow_rcvbuf_bytes=slow_rcvbuf, stop_wait_s=stop_wait_s,
                            seed=seed, request_id=request_id,
                            request_id_header=parse_request_id_header(request_id_header),
                            stream_options=not no_stream_options, keep_alive=not no_keep_alive)
    except SpecError as exc:
        raise _usage(str(exc)) from None
    schedule = _schedule(trace, arrivals=arrivals, rate=rate, burstiness=burstiness,
                         duration_s=_seconds("--duration", duration), max_requests=max_requests,
                         ramp_s=_seconds("--ramp", ramp), bursts=burst or [], prompt=prompt_tokens,
                         output=output_tokens, seed=seed, schedule_file=schedule_file)
    _check_outputs(db, jsonl, attempts_log)
    chosen, notes = _target_model(target, model, api_key)
    config = dataclasses.replace(config, model=chosen)
    sink = _sink(db, jsonl)
    from llmslo.cli._common import err

    progress = not (as_json or no_progress) and err().is_terminal
    try:
        result = _run(schedule, config, sink, attempts_log, progress)
    finally:
        lost = _close(sink)
    figures = bench_figures(result.rows, result.duration_s, goodput_spec)
    report = _report(result.rows, goodput_spec)
    if report is None:
        notes.append("no report beside the table: it needs the 'analysis' extra (pip install 'llmslo[analysis]')")
    if as_json:
        doc = {"run": {"config": config.to_dict(), "schedule": schedule.to_dict(), **result.to_dict(),
                       "notes": [*schedule.notes, *notes, *result.notes()]},
               "load": figures.to_dict(), "report": None if report is None else report.to_dict()}
        print(json.dumps(_json_safe(doc), indent=2))
    else:
        _print_text(config, schedule, result, figures, report, notes)
    if lost is not None:
        raise _input(lost)
    if result.stopped_by is not None:
        raise typer.Exit(_signal_status(result.stopped_by))


def _signal_status(name: str) -> int:
    """128 + the number of the signal ``name`` (``SIGTERM`` gives 143), the shells' convention."""
    import signal

    sig = signal.Signals.__members__.get(name)
    return 128 + int(sig) if sig is not None else 1


def _close(sink: Any) -> str | None:
    """Close the sink; a sentence when summaries were lost (None when every one was written)."""
    if sink is None:
        return None
    sink.close(timeout_s=SINK_CLOSE_TIMEOUT_S)
    dropped = {reason: n for reason, n in sink.dropped.items() if n}
    if dropped:
        return (f"{sum(dropped.values()):,} summar(ies) could not be written "
                f"({', '.join(f'{n:,} {reason}' for reason, n in dropped.items())})")
    writers = sink.writer.writers if isinstance(sink.writer, _Tee) else [sink.writer]
    rejected = sum(getattr(w, "rows_rejected", 0) for w in writers)
    if rejected:
        return f"the store rejected {rejected:,} summar(ies) as invalid"
    return None
