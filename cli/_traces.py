"""``llmslo trace``: read a production trace as an arrival schedule and describe it as load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmslo.cli._common import EXIT_INPUT, EXIT_USAGE, shown
from llmslo.cli._common import console as _console
from llmslo.cli._common import duration as _duration
from llmslo.cli._common import fail as _fail
from llmslo.cli._help import TRACE_KINDS
from llmslo.telemetry import format_duration

if TYPE_CHECKING:
    from rich.console import Console

    from llmslo.analysis.workload import TraceSummary

__all__ = ["trace_command"]

_BARS = " ▁▂▃▄▅▆▇█"
_WRITERS = (".parquet", ".jsonl", ".ndjson")


def _opt(x: float | None, fmt: str = "{:.3g}") -> str:
    return "-" if x is None else fmt.format(x)


def _sparkline(counts: list[int]) -> str:
    top = max(counts) if counts else 0
    if top <= 0:
        return ""
    # an empty bucket is a space; any arrival shows at least the lowest bar
    return "".join(_BARS[max(1, round(c / top * (len(_BARS) - 1))) if c else 0] for c in counts)


def _print_summary(out: Console, s: TraceSummary, written: Path | None) -> None:
    from rich.table import Table

    from llmslo.analysis.workload import TRACE_NOTE

    out.print(f"[bold]{shown(s.source)}[/bold] ({shown(s.kind)}): {shown(TRACE_NOTE)}", highlight=False, soft_wrap=True)
    t = Table(title="Arrivals", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("requests", f"{s.requests:,}")
    t.add_row("duration (first to last arrival)", f"{s.duration_s:,.1f} s")
    t.add_row("mean rate", f"{_opt(s.mean_rate_per_s)} requests/s")
    t.add_row("inter-arrival CV (1 = Poisson)", _opt(s.interarrival_cv))
    t.add_row("peak-to-mean rate, 1 s buckets", _opt(s.peak_to_mean_1s))
    t.add_row("peak-to-mean rate, 60 s buckets", _opt(s.peak_to_mean_60s))
    if s.start_unix_s is not None:
        from datetime import UTC, datetime

        t.add_row("first arrival (UTC)", datetime.fromtimestamp(s.start_unix_s, UTC).isoformat(timespec="seconds"))
    if s.models:
        t.add_row("requests per model", shown(", ".join(f"{m}: {n:,}" for m, n in s.models.items())))
    t.add_row("requests with 0 output tokens", f"{s.zero_output_requests:,}")
    out.print(t)
    lengths = Table(title="Token lengths (tokens)", title_justify="left")
    for col in ("", "p50", "p90", "p99", "max", "mean"):
        lengths.add_column(col, justify="right" if col else "left")
    for name, st in (("input", s.input_tokens), ("output", s.output_tokens)):
        lengths.add_row(name, f"{st.p50:,.0f}", f"{st.p90:,.0f}", f"{st.p99:,.0f}", f"{st.max:,}", f"{st.mean:,.1f}")
    out.print(lengths)
    counts = [b.requests for b in s.rate_over_time]
    if counts:
        width = format_duration(s.bucket_s)
        out.print(f"requests per {width} ({len(counts)} buckets, min {min(counts):,}, max {max(counts):,}; "
                  f"the last may be partial):", highlight=False)
        out.print(f"  {_sparkline(counts)}", highlight=False, soft_wrap=True)
    if s.prefix is not None:
        p = s.prefix
        block = f" of {p.block_tokens} tokens" if p.block_tokens else ""
        out.print(
            f"prefix blocks{block}: {p.blocks_total:,} in {p.requests_with_prefix_ids:,} requests, "
            f"{p.unique_blocks:,} distinct; first block shared with an earlier request: "
            f"{_opt(p.first_block_shared_fraction, '{:.2%}')}; hit rate of an unbounded prefix cache: "
            f"{_opt(p.prefix_block_hit_fraction, '{:.1%}')} of blocks", highlight=False, soft_wrap=True)
    for note in s.notes:
        out.print(f"[yellow]note:[/yellow] {shown(note)}", highlight=False, soft_wrap=True)
    if written is not None:
        from llmslo.analysis.workload import replay_command

        out.print(f"schedule written to {shown(written)}; replay it with `{shown(replay_command(written))}` "
                  "(URL: your server)", highlight=False, soft_wrap=True)


def trace_command(
    kind: Annotated[str, typer.Argument(help=f"Trace format: {', '.join(TRACE_KINDS)} or auto.", show_default=False)],
    file: Annotated[Path, typer.Argument(help="The trace file.", show_default=False)],
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write the arrival schedule to this .parquet (or .jsonl) file.")] = None,
    bucket: Annotated[str, typer.Option("--bucket", help="Width of the rate-over-time buckets, e.g. 10s, 1m.")] = "1m",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")] = False,
) -> None:
    """Read an Azure, Mooncake or BurstGPT trace as an arrival schedule and describe it as load.

    The schedule has one row per request: offset_s (seconds after the first arrival), input_tokens,
    output_tokens, prefix_ids (Mooncake's 512-token block hashes, else null) and, for BurstGPT,
    source_model. A trace has no latency: it drives load replay (llmslo load URL --schedule FILE replays
    the file --out writes) and length analysis, it is not a set of request summaries. The summary gives
    duration, mean rate, requests per bucket of time, burstiness (inter-arrival CV; peak-to-mean of 1 s
    and 60 s rates), length quantiles and prefix sharing.

    Example: llmslo trace azure AzureLLMInferenceTrace_conv.csv --out schedule.parquet
    """
    from llmslo.analysis.workload import TRACE_KINDS as KINDS
    from llmslo.analysis.workload import TraceFormatError, read_trace

    if kind not in (*KINDS, "auto"):
        raise _fail(f"unknown trace kind {kind!r}: expected one of {', '.join(KINDS)} or auto", EXIT_USAGE)
    bucket_s = _duration("bucket", bucket)
    if out is not None and out.suffix.lower() not in _WRITERS:
        raise _fail(f"--out: write a {' or '.join(_WRITERS)} file, not {out.name!r}", EXIT_USAGE)
    try:
        schedule, summary = read_trace(kind, file, bucket_s=bucket_s)
    except TraceFormatError as exc:
        raise _fail(str(exc), EXIT_INPUT) from None
    if out is not None:
        try:
            if out.suffix.lower() == ".parquet":
                schedule.write_parquet(out)
            else:
                schedule.write_ndjson(out)
        except OSError as exc:
            raise _fail(f"--out: cannot write {out}: {exc.strerror or exc}", EXIT_INPUT) from None
    if as_json:
        doc = summary.to_dict()
        doc["schedule_written_to"] = str(out) if out is not None else None
        if out is not None:
            from llmslo.analysis.workload import replay_command

            doc["replay_command"] = replay_command(out)
        print(json.dumps(doc, indent=2))
    else:
        _print_summary(_console(), summary, out)
