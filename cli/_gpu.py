"""``llmslo gpu``: sample GPUs into the store, import GPU/engine time series, correlate them with latency."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from llmslo.cli._common import console as _console
from llmslo.cli._common import duration as _common_duration
from llmslo.cli._common import err as _err
from llmslo.cli._common import fail as _fail
from llmslo.cli._help import GPU_IMPORT_KINDS
from llmslo.telemetry import LlmsloError

__all__ = ["gpu_app"]

gpu_app = typer.Typer(name="gpu", help="GPU samples: record (NVML), import (nvidia-smi, dmon, vLLM engine), "
                      "correlate with request latency.", no_args_is_help=True, add_completion=False)
DbOption = Annotated[Path, typer.Option("--db", help="DuckDB store file.", show_default=False)]


@gpu_app.command("sample")
def sample(
    db: DbOption,
    interval: Annotated[str, typer.Option("--interval", help="Time between samples, e.g. 1s, 500ms.")] = "1s",
    duration: Annotated[str | None, typer.Option("--duration", help="Stop after this long (default: Ctrl-C).")] = None,
) -> None:
    """Sample every GPU through NVML into the store's gpu_samples table until stopped.

    Needs the 'gpu' extra (nvidia-ml-py) and an NVIDIA driver; without them it says why and exits 1.
    """
    import polars as pl

    from llmslo.analysis.gpu import store_gpu_samples
    from llmslo.analysis.store import Store
    from llmslo.telemetry import GpuSampler

    interval_s = _common_duration("interval", interval)
    until = time.monotonic() + _common_duration("duration", duration) if duration else None
    pending: list[dict[str, Any]] = []
    sampler = GpuSampler(interval_s=interval_s, sink=pending.extend)
    try:
        store = Store.open(db)
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    written = 0
    try:
        if not sampler.start():
            raise _fail(f"no GPU samples: {sampler.unavailable_reason}")
        _err().print(f"sampling every {interval_s:g} s into {db} (Ctrl-C to stop)")
        while until is None or time.monotonic() < until:
            time.sleep(min(1.0, interval_s))
            batch, pending[:] = list(pending), []
            if batch:
                written += store_gpu_samples(store.con, pl.DataFrame(batch, schema=_schema(), orient="row"))
    except KeyboardInterrupt:
        pass
    finally:
        sampler.stop()
        if pending:
            written += store_gpu_samples(store.con, pl.DataFrame(pending, schema=_schema(), orient="row"))
        store.close()
    _err().print(f"{written} GPU samples written to {db}")


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
) -> None:
    """Import nvidia-smi --query-gpu CSV, nvidia-smi dmon output or a vLLM engine time series."""
    from llmslo.analysis.gpu import import_gpu_file
    from llmslo.analysis.store import Store

    if not file.is_file():
        raise _fail(f"no such file {file}", 2)
    try:
        with Store.open(db) as store:
            n = import_gpu_file(store.con, kind, file, start_unix_s=start,
                                interval_s=_common_duration("interval", interval))
    except LlmsloError as exc:
        raise _fail(str(exc), 2 if isinstance(exc, ValueError) else 1) from None
    _console().print(f"{n:,} rows from {file} ({kind}) written to {db}")


@gpu_app.command("correlate")
def correlate_command(
    db: DbOption,
    bucket: Annotated[str, typer.Option("--bucket", help="Time bucket for alignment.")] = "1s",
    max_lag: Annotated[str, typer.Option("--max-lag", help="Largest lead/lag searched.")] = "30s",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Correlate GPU and engine signals with TTFT, TPOT, queue time, in-flight and throughput.

    Pearson and Spearman over time buckets, and for each signal the lag (seconds) at which it best
    matches each target, which says which moves first. Correlation is not causation.
    """
    from rich.table import Table

    from llmslo.analysis.gpu import aligned_frame, correlate, lagged_correlation
    from llmslo.analysis.store import Store

    b = _common_duration("bucket", bucket)
    lag_s = _common_duration("max-lag", max_lag)
    try:
        with Store.open(db, read_only=True) as store:
            frame = aligned_frame(store.con, bucket_s=b)
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    if frame.height == 0:
        raise _fail(f"{db} holds no GPU samples, engine samples or request summaries to correlate")
    rows = [c for c in correlate(frame) if c.pearson is not None]
    lags = [lagged_correlation(frame, c.signal, c.target, max_lag_s=lag_s) for c in rows]
    if as_json:
        print(json.dumps({"bucket_s": b, "buckets": frame.height,
                          "correlations": [c.to_dict() for c in rows],
                          "lags": [x.to_dict() for x in lags if x is not None]}, indent=2))
        return
    t = Table(title=f"Correlations over {frame.height:,} buckets of {b:g} s", title_justify="left")
    for col in ("signal", "target", "n", "pearson", "spearman", "best lag", "r at lag", "moves first"):
        t.add_column(col, justify="left" if col in ("signal", "target", "moves first") else "right")
    for c, x in sorted(zip(rows, lags, strict=True), key=lambda p: -abs(p[0].pearson or 0.0)):
        t.add_row(c.signal, c.target, f"{c.n:,}", f"{c.pearson:+.2f}",
                  "-" if c.spearman is None else f"{c.spearman:+.2f}",
                  "-" if x is None else f"{x.best_lag_s:+g}s", "-" if x is None else f"{x.r_at_best:+.2f}",
                  "-" if x is None else x.leader)
    _console().print(t)
