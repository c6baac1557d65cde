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
from llmslo.cli._help import GPU_IMPORT_KINDS
from llmslo.telemetry import LlmsloError

if TYPE_CHECKING:
    import duckdb
    import polars as pl
    from rich.table import Table

    from llmslo.analysis.gpu import Correlation, LagResult

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
    start: Annotated[float, typer.Option(
        "--start", help="Unix seconds of time 0 for files with relative times ('time [s]').")] = 0.0,
    interval: Annotated[str, typer.Option(
        "--interval", help="dmon without a time column: time between its samples.")] = "1s",
    as_json: JsonOption = False,
) -> None:
    """Import nvidia-smi --query-gpu CSV, nvidia-smi dmon output or a vLLM engine time series.

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
    if not file.is_file():
        raise _fail(f"no such file {file}", EXIT_INPUT)
    try:
        with Store.open(db) as store:
            done = import_gpu_file(store.con, kind, file, start_unix_s=start, interval_s=interval_s)
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
    matches each target, which says which moves first. Correlation is not causation. A store without
    GPU or engine samples, or without a pair of series to correlate, is an error (exit 1).
    """
    from llmslo.analysis.gpu import aligned_frame, correlate, lagged_correlation
    from llmslo.analysis.store import Store

    b = _common_duration("bucket", bucket)
    lag_s = _common_duration("max-lag", max_lag)
    try:
        with Store.open(db, read_only=True) as store:
            frame = aligned_frame(store.con, bucket_s=b)
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    _check_correlatable(db, frame, b)
    rows = [c for c in correlate(frame) if c.pearson is not None]
    if not rows:
        raise _fail(f"{db}: no signal and target share 10 buckets of {b:g} s with variation in both "
                    f"({frame.height:,} buckets in all): record for longer or pass a smaller --bucket", EXIT_INPUT)
    lags = [lagged_correlation(frame, c.signal, c.target, max_lag_s=lag_s) for c in rows]
    if as_json:
        print(json.dumps({"bucket_s": b, "buckets": frame.height,
                          "correlations": [c.to_dict() for c in rows],
                          "lags": [x.to_dict() for x in lags if x is not None]}, indent=2))
        return
    _console().print(_correlation_table(rows, lags, frame.height, b))


def _check_correlatable(db: Path, frame: pl.DataFrame, bucket_s: float) -> None:
    """Exit 1 with the reason when ``frame`` holds no GPU/engine signal, or nothing to correlate it with."""
    from llmslo.analysis.gpu import GPU_SIGNALS, REQUEST_TARGETS

    cols = [c for c in frame.columns if c != "t"]
    signals = [c for c in cols if c not in REQUEST_TARGETS]
    record = (f"record them with `llmslo gpu sample --db {db}` or import them with "
              f"`llmslo gpu import KIND FILE --db {db}` ({', '.join(GPU_IMPORT_KINDS)})")
    if not signals:
        what = "request summaries but no" if cols else "no request summaries and no"
        raise _fail(f"{db} holds {what} GPU or engine samples to correlate: {record}", EXIT_INPUT)
    engine = [c for c in signals if c not in GPU_SIGNALS]
    if not engine and not any(c in REQUEST_TARGETS for c in cols):
        raise _fail(f"{db} holds GPU samples but neither request summaries nor engine samples to correlate them "
                    f"with ({frame.height:,} buckets of {bucket_s:g} s): ingest the requests of the same run "
                    f"(`llmslo ingest FILES --db {db}`) or import the engine's series", EXIT_INPUT)


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
