"""``llmslo gpu``: sample GPUs into the store, import GPU/engine time series, correlate them with latency."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmslo.cli._common import EXIT_INPUT, EXIT_USAGE, shown
from llmslo.cli._common import console as _console
from llmslo.cli._common import duration as _common_duration
from llmslo.cli._common import err as _err
from llmslo.cli._common import fail as _fail
from llmslo.cli._common import parse_time as _parse_time
from llmslo.cli._help import GPU_IMPORT_KINDS
from llmslo.telemetry import LlmsloError

if TYPE_CHECKING:
    import duckdb
    import polars as pl
    from rich.table import Table

    from llmslo.analysis.gpu import Correlation, LagResult, TimeOverlap

__all__ = ["gpu_app"]

gpu_app = typer.Typer(name="gpu", help="GPU samples: record (NVML), import (nvidia-smi, dmon, vLLM engine), "
                      "correlate with request latency.", no_args_is_help=True, add_completion=False)
DbOption = Annotated[Path, typer.Option("--db", help="DuckDB store file.", show_default=False)]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")]


@gpu_app.command("sample")
def sample(
    db: DbOption,
    interval: Annotated[str, typer.Option("--interval", help="Time between samples, e.g. 1s, 500ms.")] = "1s",
    duration: Annotated[str | None, typer.Option("--duration", help="Stop after this long (default: Ctrl-C).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Sample every GPU through NVML into the store's gpu_samples table until stopped.

    Needs the 'gpu' extra (nvidia-ml-py) and an NVIDIA driver; without them it says why and exits 1
    (a store the command created is then removed). With --json, one JSON object at the end: the store,
    the interval (s) and the samples written.
    """
    from llmslo.analysis.store import Store

    interval_s = _common_duration("interval", interval)
    until_s = _common_duration("duration", duration) if duration else None
    try:
        with Store.open(db) as store:
            written = _sample_into(store.con, db, interval_s, until_s)
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        print(json.dumps({"db": str(db), "interval_s": interval_s, "duration_s": until_s,
                          "samples_written": written}, indent=2))
    else:
        _err().print(f"{written:,} GPU samples written to {shown(db)}", highlight=False)


def _sample_into(con: duckdb.DuckDBPyConnection, db: Path, interval_s: float, until_s: float | None) -> int:
    """Sample until ``until_s`` seconds have passed (or Ctrl-C); the samples written. Exits 1 without NVML."""
    import polars as pl

    from llmslo.analysis.gpu import store_gpu_samples
    from llmslo.telemetry import GpuSampler

    pending: list[dict[str, Any]] = []
    sampler = GpuSampler(interval_s=interval_s, sink=pending.extend)
    if not sampler.start():
        raise _fail(f"no GPU samples: {sampler.unavailable_reason}", EXIT_INPUT)
    until = time.monotonic() + until_s if until_s is not None else None
    written = 0
    try:
        _err().print(f"sampling every {interval_s:g} s into {shown(db)} (Ctrl-C to stop)", highlight=False)
        while until is None or time.monotonic() < until:
            time.sleep(min(1.0, interval_s))
            batch, pending[:] = list(pending), []
            if batch:
                written += store_gpu_samples(con, pl.DataFrame(batch, schema=_schema(), orient="row"))
    except KeyboardInterrupt:
        pass
    finally:
        sampler.stop()
        if pending:
            written += store_gpu_samples(con, pl.DataFrame(pending, schema=_schema(), orient="row"))
    return written


def _schema() -> dict[str, Any]:
    import polars as pl

    from llmslo.analysis.gpu import GPU_COLUMNS

    types = {"DOUBLE NOT NULL": pl.Float64, "DOUBLE": pl.Float64, "VARCHAR NOT NULL": pl.String, "BIGINT": pl.Int64}
    return {c: types[t] for c, t in GPU_COLUMNS.items()}


@gpu_app.command("import")
def import_(
    kind: Annotated[str, typer.Argument(help=f"One of: {', '.join(GPU_IMPORT_KINDS)}.", show_default=False)],
    file: Annotated[Path, typer.Argument(help="The file to import.", show_default=False)],
    db: DbOption,
    start: Annotated[str | None, typer.Option(
        "--start", help="When time 0 of a file with relative times ('time [s]', dmon without Date/Time) was: Unix "
        "seconds or ISO 8601 (UTC unless it says otherwise). Such a file needs it; one with its own times takes "
        "none.", show_default=False)] = None,
    interval: Annotated[str, typer.Option(
        "--interval", help="dmon without a time column: time between its samples.")] = "1s",
    as_json: JsonOption = False,
) -> None:
    """Import nvidia-smi --query-gpu CSV, nvidia-smi dmon output or a vLLM engine time series.

    A file whose times are relative to its run's start (a vLLM engine series, nvidia-smi with 'time [s]'
    instead of 'timestamp', dmon without Date/Time) needs --start, the time of its time 0, so that it lines
    up with the requests of the same run; without it the file is refused (exit 1) and nothing is written.

    Idempotent: a file is known by the SHA-256 of its bytes and the kind it is read as; importing it
    again (under any name) with the same --start (and --interval for dmon) writes nothing, and with
    other ones it is refused (its samples would be stored twice). With --json, one JSON object: the
    file, kind, table, content_sha256, rows_written, rows_recorded, already_imported and db.
    """
    from llmslo.analysis.gpu import import_gpu_file
    from llmslo.analysis.store import Store

    if kind not in GPU_IMPORT_KINDS:
        raise _fail(f"unknown GPU import kind {kind!r}; choose from {', '.join(GPU_IMPORT_KINDS)}", EXIT_USAGE)
    interval_s = _common_duration("interval", interval)
    start_unix_s = _parse_time("start", start) if start is not None else None
    if not file.is_file():
        raise _fail(f"no such file {file}", EXIT_INPUT)
    try:
        with Store.open(db) as store:
            done = import_gpu_file(store.con, kind, file, start_unix_s=start_unix_s, interval_s=interval_s)
    except LlmsloError as exc:
        raise _fail(str(exc), EXIT_INPUT) from None
    if as_json:
        print(json.dumps({**done.to_dict(), "db": str(db)}, indent=2))
    elif done.already_imported:
        _console().print(f"{shown(file)} ({shown(kind)}) was imported before ({done.rows_recorded:,} rows, sha256 "
                         f"{done.content_sha256[:12]}…): nothing written to {shown(db)}", highlight=False)
    else:
        _console().print(f"{done.rows_written:,} rows from {shown(file)} ({shown(kind)}) written to {shown(db)}",
                         highlight=False)


@gpu_app.command("correlate")
def correlate_command(
    db: DbOption,
    bucket: Annotated[str, typer.Option("--bucket", help="Time bucket for alignment.")] = "1s",
    max_lag: Annotated[str, typer.Option("--max-lag", help="Largest lead/lag searched.")] = "30s",
    as_json: JsonOption = False,
) -> None:
    """Correlate GPU and engine signals with TTFT, TPOT, queue time, in-flight and throughput.

    Pearson and Spearman over time buckets, and for each signal the lag (seconds) at which it best
    matches each target, which says which moves first. Correlation is not causation. Samples and requests
    are correlated only over the time they share, which is printed (--json: overlap); request summaries
    without arrival times (imported from files that recorded none) are left out and counted. A store
    without GPU or engine samples, without a pair of series to correlate, or whose samples and requests do
    not overlap in time is an error (exit 1).
    """
    from llmslo.analysis.gpu import aligned_frame, correlate, lagged_correlation, time_overlap
    from llmslo.analysis.store import Store

    b = _common_duration("bucket", bucket)
    lag_s = _common_duration("max-lag", max_lag)
    try:
        with Store.open(db, read_only=True) as store:
            overlap = time_overlap(store.con)
            _refuse_without_overlap(db, overlap)
            frame = aligned_frame(store.con, bucket_s=b)
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    _check_correlatable(db, frame, b, overlap)
    frame = overlap.restrict(frame)
    rows = [c for c in correlate(frame) if c.pearson is not None]
    if not rows:
        raise _fail(f"{db}: no signal and target share 10 buckets of {b:g} s with variation in both "
                    f"({frame.height:,} buckets in all): record for longer or pass a smaller --bucket", EXIT_INPUT)
    lags = [lagged_correlation(frame, c.signal, c.target, max_lag_s=lag_s) for c in rows]
    if as_json:
        print(json.dumps({"bucket_s": b, "buckets": frame.height, "overlap": overlap.to_dict(),
                          "correlations": [c.to_dict() for c in rows],
                          "lags": [x.to_dict() for x in lags if x is not None]}, indent=2))
        return
    out = _console()
    out.print(_correlation_table(rows, lags, frame.height, b))
    for line in _time_lines(overlap):
        out.print(f"[dim]{shown(line)}[/dim]", highlight=False)


def _utc(unix_s: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(unix_s, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _span(lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None:
        return "none"
    return f"{_utc(lo)} to {_utc(hi)} UTC ({hi - lo:,.0f} s)"


def _left_out(overlap: TimeOverlap) -> str | None:
    n = overlap.requests_without_arrival
    if not n:
        return None
    files = overlap.files_without_arrival
    named = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    return (f"{n:,} request summaries come from imports with no arrival times ({named}) and are left out: they "
            "cannot be placed in time")


def _time_lines(overlap: TimeOverlap) -> list[str]:
    """What was correlated over which time, and what was left out, one sentence a line."""
    samples = _span(overlap.samples_from_unix_s, overlap.samples_to_unix_s)
    ov = overlap.overlap
    if ov is not None:
        share = ""
        if overlap.samples_from_unix_s is not None and overlap.samples_to_unix_s is not None:
            whole = overlap.samples_to_unix_s - overlap.samples_from_unix_s
            share = f", {(ov[1] - ov[0]) / whole:.0%} of the samples' span" if whole > 0 else ""
        lines = [f"time: GPU and engine samples {samples}; requests (first arrival to last finish) "
                 f"{_span(overlap.requests_from_unix_s, overlap.requests_to_unix_s)}; correlated over their "
                 f"overlap only, {_span(*ov)}{share}"]
    else:
        lines = [f"time: GPU and engine samples {samples}; no request summary can be placed beside them, so the "
                 "engine's series are correlated with each other"]
    left = _left_out(overlap)
    return [*lines, left] if left else lines


def _refuse_without_overlap(db: Path, overlap: TimeOverlap) -> None:
    """Exit 1 with both spans when there are samples and placed requests that share no time."""
    if not overlap.both or overlap.overlap is not None:
        return
    samples = _span(overlap.samples_from_unix_s, overlap.samples_to_unix_s)
    requests = _span(overlap.requests_from_unix_s, overlap.requests_to_unix_s)
    raise _fail(
        f"{db}: the GPU and engine samples ({samples}) and the request summaries ({requests}, first arrival to last "
        "finish) do not overlap in time: there is nothing to correlate. Samples of a file with relative times "
        "imported with --start 0 sit in 1970: import the run's GPU and engine files into a fresh store with "
        "--start set to when the run started (Unix seconds or ISO 8601), beside the requests of that same run",
        EXIT_INPUT)


def _check_correlatable(db: Path, frame: pl.DataFrame, bucket_s: float, overlap: TimeOverlap) -> None:
    """Exit 1 with the reason when ``frame`` holds no GPU/engine signal, or nothing to correlate it with."""
    from llmslo.analysis.gpu import GPU_SIGNALS, REQUEST_TARGETS

    cols = [c for c in frame.columns if c != "t"]
    signals = [c for c in cols if c not in REQUEST_TARGETS]
    record = (f"record them with `llmslo gpu sample --db {db}` or import them with "
              f"`llmslo gpu import KIND FILE --db {db}` ({', '.join(GPU_IMPORT_KINDS)})")
    left = _left_out(overlap)
    if not signals:
        what = "request summaries but no" if cols or left else "no request summaries and no"
        raise _fail(f"{db} holds {what} GPU or engine samples to correlate: {record}", EXIT_INPUT)
    engine = [c for c in signals if c not in GPU_SIGNALS]
    if not engine and not any(c in REQUEST_TARGETS for c in cols):
        unplaced = f" ({left})" if left else ""
        raise _fail(f"{db} holds GPU samples but neither request summaries placed in time{unplaced} nor engine "
                    f"samples to correlate them with ({frame.height:,} buckets of {bucket_s:g} s): ingest the "
                    f"requests of the same run (`llmslo ingest FILES --db {db}`) or import the engine's series",
                    EXIT_INPUT)


def _correlation_table(rows: list[Correlation], lags: list[LagResult | None], buckets: int, b: float) -> Table:
    from rich.table import Table

    t = Table(title=f"Correlations over {buckets:,} buckets of {b:g} s", title_justify="left")
    for col in ("signal", "target", "n", "pearson", "spearman", "best lag", "r at lag", "moves first"):
        t.add_column(col, justify="left" if col in ("signal", "target", "moves first") else "right")
    for c, x in sorted(zip(rows, lags, strict=True), key=lambda p: -abs(p[0].pearson or 0.0)):
        t.add_row(shown(c.signal), shown(c.target), f"{c.n:,}", f"{c.pearson:+.2f}",
                  "-" if c.spearman is None else f"{c.spearman:+.2f}",
                  "-" if x is None else f"{x.best_lag_s:+g}s", "-" if x is None else f"{x.r_at_best:+.2f}",
                  "-" if x is None else shown(x.leader))
    return t
