"""Production traces (Azure LLM inference, Mooncake, BurstGPT) to one arrival schedule, and its summary.

A trace holds arrival times and token counts, never latency: it describes load, not how a server
served it. Each reader returns the same **arrival schedule**, a polars frame with one row per request
in arrival order (ties keep file order):

================  ==============  ==========================================================
column            type            meaning
================  ==============  ==========================================================
``offset_s``      Float64         arrival, seconds after the first arrival of the trace (first row 0.0)
``input_tokens``  Int64           prompt length, tokens
``output_tokens`` Int64           output length the trace recorded, tokens
``prefix_ids``    List(Int64)     prefix-block hashes (Mooncake: one per 512-token block); null when
                                  the trace has none
``source_model``  String          model named by the trace (BurstGPT only; absent otherwise)
================  ==============  ==========================================================

A load generator replays it by sending request ``i`` at ``start + offset_s[i]``.
:func:`summarize_schedule` describes a schedule: duration, mean rate, the rate per bucket of time,
burstiness (coefficient of variation of inter-arrival gaps; peak-to-mean ratio of per-second and
per-minute rates), length quantiles and, for Mooncake, prefix sharing.

Formats (as published):

* Azure LLM inference trace 2023 (CSV): ``TIMESTAMP`` (``2023-11-16 18:15:46.6805900``, up to 9
  fractional digits, no zone: read as UTC), ``ContextTokens``, ``GeneratedTokens``.
* Mooncake (JSONL, one object a line): ``timestamp`` (milliseconds from the trace start),
  ``input_length``, ``output_length``, ``hash_ids`` (512-token prefix-block hashes).
* BurstGPT (CSV): ``Timestamp`` (seconds from the trace start), ``Model``, ``Request tokens``,
  ``Response tokens``, ``Total tokens``, ``Log Type``. Its files "with fails" mark a failed request
  with 0 response tokens; the summary counts them.

A malformed file raises :class:`TraceFormatError` naming the file, the line and the field; nothing
is returned. CSV line numbers count the header as line 1 (records span one line in these formats).
"""

from __future__ import annotations

import csv
import difflib
import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt
import polars as pl

from llmslo.telemetry import LlmsloError

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "SCHEDULE_SCHEMA",
    "TRACE_KINDS",
    "TRACE_NOTE",
    "LengthStats",
    "PrefixStats",
    "RateBucket",
    "TraceFormatError",
    "TraceSummary",
    "detect_trace_kind",
    "read_azure_trace",
    "read_burstgpt_trace",
    "read_mooncake_trace",
    "read_trace",
    "summarize_schedule",
    "trace_kind_of_line",
]

TRACE_KINDS: tuple[str, ...] = ("azure", "mooncake", "burstgpt")
"""Trace formats :func:`read_trace` reads."""

TRACE_NOTE = (
    "a trace holds arrival times and token counts only, no latency: it becomes an arrival schedule for "
    "load replay, not request summaries (nothing is added to a store)"
)
"""What importing a trace produces, for import reports and command help."""

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per prefix block of the Mooncake traces' ``hash_ids``."""

SCHEDULE_SCHEMA: Mapping[str, pl.DataType] = {
    "offset_s": pl.Float64(),
    "input_tokens": pl.Int64(),
    "output_tokens": pl.Int64(),
    "prefix_ids": pl.List(pl.Int64()),
}
"""Columns every arrival schedule has, in order (``source_model``, a String, follows when present)."""

DEFAULT_BUCKET_S = 60.0
"""Default width of the rate-over-time buckets, seconds."""

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
_AZURE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S%.f"
_MAX_EXACT_INT = 2.0**53

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class TraceFormatError(LlmsloError, ValueError):
    """A trace file cannot be read; nothing was returned.

    ``source`` is the file, ``line`` the 1-based line (None for a whole-file problem), ``field`` the
    column or key, ``value`` the offending text (None when absent), ``more`` how many further lines
    have problems.
    """

    def __init__(self, source: str, line: int | None, field: str | None, value: str | None, message: str,
                 more: int = 0) -> None:
        self.source = source
        self.line = line
        self.field = field
        self.value = value
        self.more = more
        where = source if line is None else f"{source}: line {line}"
        if field is not None:
            where += f", field {field!r}"
        shown = "" if value is None else f": value {value!r}"
        extra = f" ({more} more line(s) have problems)" if more else ""
        super().__init__(f"{where}{shown}: {message}{extra}; nothing was read")


@dataclass(frozen=True)
class LengthStats:
    """Quantiles of a token length (linear interpolation between order statistics), tokens."""

    p50: float
    p90: float
    p99: float
    max: int
    mean: float


@dataclass(frozen=True)
class RateBucket:
    """Arrivals in ``[start_s, start_s + width)`` seconds after the first arrival."""

    start_s: float
    requests: int
    rate_per_s: float


@dataclass(frozen=True)
class PrefixStats:
    """Prefix sharing among requests that carry prefix-block ids, in arrival order.

    ``first_block_shared_fraction``: fraction of those requests whose first block is the first block
    of an earlier request. ``prefix_block_hit_fraction``: blocks of each request's longest prefix made
    only of blocks seen in earlier requests, over all blocks: the block hit rate of an unbounded prefix
    cache. ``block_tokens``: tokens per block, when the format fixes it.
    """

    requests_with_prefix_ids: int
    first_block_shared_fraction: float | None
    prefix_block_hit_fraction: float | None
    blocks_total: int
    unique_blocks: int
    block_tokens: int | None


@dataclass(frozen=True)
class TraceSummary:
    """What a schedule looks like as load.

    Times in seconds after the first arrival; rates in requests per second. ``mean_rate_per_s`` is
    requests / ``duration_s`` (first to last arrival). ``interarrival_cv`` is the population standard
    deviation of the gaps between consecutive arrivals over their mean (1 for a Poisson process, above
    1 bursty). ``peak_to_mean_1s`` / ``peak_to_mean_60s``: the busiest 1 s / 60 s bucket's rate over the
    mean rate. ``rate_over_time`` counts arrivals per ``bucket_s`` (the last bucket may be partial).
    ``start_unix_s`` is the wall-clock first arrival when the trace has one (Azure). ``models`` counts
    requests per ``source_model`` when the trace names models.
    """

    kind: str
    source: str
    requests: int
    start_unix_s: float | None
    duration_s: float
    mean_rate_per_s: float | None
    interarrival_cv: float | None
    peak_to_mean_1s: float | None
    peak_to_mean_60s: float | None
    bucket_s: float
    rate_over_time: tuple[RateBucket, ...]
    input_tokens: LengthStats
    output_tokens: LengthStats
    zero_output_requests: int
    prefix: PrefixStats | None = None
    models: Mapping[str, int] | None = None
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (nested dataclasses become dictionaries, tuples lists)."""
        out = asdict(self)
        out["rate_over_time"] = [asdict(b) for b in self.rate_over_time]
        out["models"] = dict(self.models) if self.models is not None else None
        out["notes"] = list(self.notes)
        out["what"] = TRACE_NOTE
        return out


# ---------------------------------------------------------------------------------------------------
# reading


def _display(path: Path | str) -> str:
    return str(path)


def _read_csv_strings(path: Path, required: Sequence[str]) -> pl.DataFrame:
    """Every column as text, with ``__line`` (1-based file line); blank lines dropped."""
    source = _display(path)
    if not path.is_file():
        raise TraceFormatError(source, None, None, None, "no such file")
    try:
        frame = pl.read_csv(path, infer_schema=False, row_index_name="__row")
    except pl.exceptions.NoDataError:
        raise TraceFormatError(source, None, None, None, "the file is empty") from None
    except (pl.exceptions.ComputeError, pl.exceptions.PolarsError, UnicodeDecodeError) as exc:
        _locate_csv_problem(path, exc)
    missing = [c for c in required if c not in frame.columns]
    if missing:
        present = [c for c in frame.columns if c != "__row"]
        near = difflib.get_close_matches(missing[0], present, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise TraceFormatError(
            source, 1, missing[0], None,
            f"required column is missing{hint}; the header has {', '.join(map(repr, present))}",
        )
    data_cols = [c for c in frame.columns if c != "__row"]
    blank = pl.all_horizontal(pl.col(c).is_null() | (pl.col(c).str.strip_chars() == "") for c in data_cols)
    frame = frame.filter(~blank).with_columns((pl.col("__row").cast(pl.Int64) + 2).alias("__line"))
    if frame.height == 0:
        raise TraceFormatError(source, None, None, None, "the file has a header but no requests")
    return frame


def _locate_csv_problem(path: Path, exc: BaseException) -> NoReturn:
    """Raise a :class:`TraceFormatError` at the first line the CSV reader could not read."""
    source = _display(path)
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            width = len(header) if header else 0
            for record in reader:
                if record and len(record) != width:
                    raise TraceFormatError(
                        source, reader.line_num, None, ",".join(record),
                        f"expected {width} fields as in the header, found {len(record)}",
                    )
    except UnicodeDecodeError as err:
        raise TraceFormatError(source, None, None, None, f"not UTF-8 text ({err})") from None
    except csv.Error as err:
        raise TraceFormatError(source, None, None, None, f"not a readable CSV file ({err})") from None
    raise TraceFormatError(source, None, None, None, f"not a readable CSV file ({exc})") from None


def _first_problem(frame: pl.DataFrame, source: str, checks: Sequence[tuple[str, pl.Expr, str]]) -> None:
    """Raise at the earliest line where a check's predicate is true (``checks``: field, predicate, message)."""
    flags = frame.select(
        pl.col("__line"),
        *[pred.fill_null(True).alias(f"__bad{i}") for i, (_, pred, _) in enumerate(checks)],
    )
    any_bad = pl.any_horizontal(pl.col(f"__bad{i}") for i in range(len(checks)))
    bad = flags.filter(any_bad)
    if bad.height == 0:
        return
    first = bad.row(0, named=True)
    for i, (name, _, message) in enumerate(checks):
        if first[f"__bad{i}"]:
            line = int(first["__line"])
            raw = frame.filter(pl.col("__line") == line)[name][0]
            raise TraceFormatError(source, line, name, None if raw is None else str(raw), message,
                                   more=bad.height - 1)


def _count_expr(name: str) -> tuple[pl.Expr, pl.Expr]:
    """(parsed Int64, bad predicate) for a non-negative integer token count given as text."""
    as_float = pl.col(name).str.strip_chars().cast(pl.Float64, strict=False)
    ok = as_float.is_finite() & (as_float >= 0) & (as_float == as_float.floor()) & (as_float < _MAX_EXACT_INT)
    return as_float.cast(pl.Int64, strict=False), ~ok


def _order_note(offsets_ns: pl.Series) -> tuple[pl.Series, str | None]:
    """Stable arrival order; a note when the file was not in time order."""
    values = offsets_ns.to_numpy()
    disorder = int(np.count_nonzero(values[1:] < values[:-1])) if len(values) > 1 else 0
    order = pl.Series(np.argsort(values, kind="stable"))
    note = None
    if disorder:
        note = f"{disorder} line(s) came earlier in time than the line before them: requests were sorted by arrival"
    return order, note


def _seconds_after(ns: pl.Series, first_ns: int) -> FloatArray:
    """Nanosecond stamps to float seconds after ``first_ns`` (a true division: 125e9 ns is 125.0 s)."""
    return (ns.to_numpy().astype(np.int64) - first_ns).astype(np.float64) / 1e9


def _schedule_without_prefixes(typed: pl.DataFrame, **extra: pl.DataType) -> tuple[pl.DataFrame, int]:
    """The arrival schedule of ``typed`` (sorted; columns ``ns``, ``input_tokens``, ``output_tokens`` and the
    ``extra`` ones, kept with their types) with null ``prefix_ids``, and its first arrival in ns."""
    first_ns = int(typed["ns"].min())  # type: ignore[arg-type]
    schedule = pl.DataFrame({
        "offset_s": _seconds_after(typed["ns"], first_ns),
        "input_tokens": typed["input_tokens"],
        "output_tokens": typed["output_tokens"],
        "prefix_ids": pl.Series("prefix_ids", [None] * typed.height, dtype=pl.List(pl.Int64())),
        **{name: typed[name] for name in extra},
    }, schema={**SCHEDULE_SCHEMA, **extra})
    return schedule, first_ns


def read_azure_trace(path: str | Path) -> tuple[pl.DataFrame, float, tuple[str, ...]]:
    """Read an Azure LLM inference trace CSV into an arrival schedule.

    Returns the schedule (see the module docstring), the first arrival as Unix seconds (the
    ``TIMESTAMP`` column has no zone and is read as UTC) and notes. Raises :class:`TraceFormatError`.
    """
    path = Path(path)
    source = _display(path)
    raw = _read_csv_strings(path, _AZURE_COLUMNS)
    stamp = pl.col("TIMESTAMP").str.strip_chars().str.to_datetime(
        _AZURE_TIME_FORMAT, time_unit="ns", time_zone="UTC", strict=False)
    inp, inp_bad = _count_expr("ContextTokens")
    out, out_bad = _count_expr("GeneratedTokens")
    _first_problem(raw, source, [
        ("TIMESTAMP", stamp.is_null(), "expected a time like 2023-11-16 18:15:46.6805900 (UTC, no zone)"),
        ("ContextTokens", inp_bad, "expected a non-negative whole number of tokens"),
        ("GeneratedTokens", out_bad, "expected a non-negative whole number of tokens"),
    ])
    typed = raw.select(stamp.dt.epoch("ns").alias("ns"), inp.alias("input_tokens"), out.alias("output_tokens"))
    order, note = _order_note(typed["ns"])
    schedule, first_ns = _schedule_without_prefixes(typed[order])
    return schedule, first_ns / 1e9, (note,) if note else ()


def read_burstgpt_trace(path: str | Path) -> tuple[pl.DataFrame, tuple[str, ...]]:
    """Read a BurstGPT CSV into an arrival schedule (with ``source_model``) and notes.

    ``Timestamp`` is seconds from the trace start. Notes count rows whose ``Total tokens`` differs
    from request + response tokens and rows with 0 response tokens (failed requests in BurstGPT's
    files "with fails"). Raises :class:`TraceFormatError`.
    """
    path = Path(path)
    source = _display(path)
    raw = _read_csv_strings(path, _BURSTGPT_COLUMNS)
    ts = pl.col("Timestamp").str.strip_chars().cast(pl.Float64, strict=False)
    inp, inp_bad = _count_expr("Request tokens")
    out, out_bad = _count_expr("Response tokens")
    tot, tot_bad = _count_expr("Total tokens")
    model = pl.col("Model").str.strip_chars()
    _first_problem(raw, source, [
        ("Timestamp", ~(ts.is_finite() & (ts >= 0)), "expected a non-negative number of seconds"),
        ("Model", model.is_null() | (model == ""), "expected a model name"),
        ("Request tokens", inp_bad, "expected a non-negative whole number of tokens"),
        ("Response tokens", out_bad, "expected a non-negative whole number of tokens"),
        ("Total tokens", tot_bad, "expected a non-negative whole number of tokens"),
    ])
    typed = raw.select(
        (ts * 1e9).round().cast(pl.Int64).alias("ns"), inp.alias("input_tokens"), out.alias("output_tokens"),
        tot.alias("total"), model.alias("source_model"),
    )
    order, note = _order_note(typed["ns"])
    typed = typed[order]
    notes = [note] if note else []
    mismatch = typed.filter(pl.col("total") != pl.col("input_tokens") + pl.col("output_tokens")).height
    if mismatch:
        notes.append(f"{mismatch} row(s) have Total tokens different from Request + Response tokens")
    schedule, _ = _schedule_without_prefixes(typed, source_model=pl.String())
    return schedule, tuple(notes)


def _json_count(obj: Mapping[str, Any], key: str) -> int | str:
    """The non-negative integer at ``key``, or a message saying what is wrong."""
    if key not in obj:
        return "required key is missing"
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "expected a non-negative whole number"
    if not math.isfinite(value) or value < 0 or value != math.floor(value) or value >= _MAX_EXACT_INT:
        return "expected a non-negative whole number"
    return int(value)


def read_mooncake_trace(path: str | Path) -> tuple[pl.DataFrame, tuple[str, ...]]:
    """Read a Mooncake trace (JSONL) into an arrival schedule with ``prefix_ids``, and notes.

    ``timestamp`` is milliseconds from the trace start; ``hash_ids`` (optional, may be null) become
    ``prefix_ids``. Blank lines are skipped. Notes count requests whose number of blocks differs from
    ceil(input_length / 512). Raises :class:`TraceFormatError` at the first bad line.
    """
    path = Path(path)
    source = _display(path)
    if not path.is_file():
        raise TraceFormatError(source, None, None, None, "no such file")
    stamps: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    prefixes: list[list[int] | None] = []
    block_mismatch = 0
    try:
        fh = path.open(encoding="utf-8")
        with fh:
            for number, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise TraceFormatError(source, number, None, text.strip()[:80],
                                           f"not a JSON object ({exc.msg})") from None
                if not isinstance(obj, dict):
                    raise TraceFormatError(source, number, None, text.strip()[:80], "expected a JSON object")
                ts = obj.get("timestamp")
                if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
                    raise TraceFormatError(source, number, "timestamp", None if ts is None else repr(ts),
                                           "expected a non-negative number of milliseconds")
                counts: list[int] = []
                for key in ("input_length", "output_length"):
                    got = _json_count(obj, key)
                    if isinstance(got, str):
                        raise TraceFormatError(source, number, key,
                                               repr(obj[key]) if key in obj else None, got)
                    counts.append(got)
                ids = obj.get("hash_ids")
                if ids is not None:
                    if not isinstance(ids, list) or not all(
                        isinstance(h, int) and not isinstance(h, bool) and abs(h) < 2**63 for h in ids
                    ):
                        raise TraceFormatError(source, number, "hash_ids", repr(ids)[:80],
                                               "expected a list of integer block hashes")
                    if len(ids) != -(-counts[0] // MOONCAKE_BLOCK_TOKENS):
                        block_mismatch += 1
                stamps.append(float(ts))
                inputs.append(counts[0])
                outputs.append(counts[1])
                prefixes.append(ids)
    except UnicodeDecodeError as err:
        raise TraceFormatError(source, None, None, None, f"not UTF-8 text ({err})") from None
    if not stamps:
        raise TraceFormatError(source, None, None, None, "the file holds no requests")
    ms = np.asarray(stamps, dtype=np.float64)
    order_series, note = _order_note(pl.Series(ms))
    order = order_series.to_numpy()
    notes = [note] if note else []
    if block_mismatch:
        notes.append(f"{block_mismatch} request(s) have a number of hash_ids different from "
                     f"ceil(input_length / {MOONCAKE_BLOCK_TOKENS})")
    ms = ms[order]
    schedule = pl.DataFrame({
        "offset_s": (ms - ms[0]) / 1e3,
        "input_tokens": np.asarray(inputs, dtype=np.int64)[order],
        "output_tokens": np.asarray(outputs, dtype=np.int64)[order],
        "prefix_ids": pl.Series("prefix_ids", [prefixes[i] for i in order], dtype=pl.List(pl.Int64())),
    }, schema=dict(SCHEDULE_SCHEMA))
    return schedule, tuple(notes)


def detect_trace_kind(path: str | Path) -> str | None:
    """Which of :data:`TRACE_KINDS` a file looks like (from its header or first object), else None."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            first = ""
            for line in fh:
                if line.strip():
                    first = line
                    break
    except OSError:
        return None
    return trace_kind_of_line(first)


def trace_kind_of_line(text: str) -> str | None:
    """Which of :data:`TRACE_KINDS` a trace's first non-empty line (CSV header or JSON object) belongs to."""
    first = text.strip().lstrip("\ufeff")
    if first.startswith("{"):
        try:
            obj = json.loads(first)
        except json.JSONDecodeError:
            return None
        if isinstance(obj, dict) and {"timestamp", "input_length", "output_length"} <= set(obj):
            return "mooncake"
        return None
    header = {h.strip() for h in next(csv.reader([first]), [])}
    if set(_AZURE_COLUMNS) <= header:
        return "azure"
    if {"Timestamp", "Request tokens", "Response tokens"} <= header:
        return "burstgpt"
    return None


def _refuse_parquet(path: Path, kind: str) -> None:
    """Raise :class:`TraceFormatError` when ``path`` is a Parquet file (an arrival schedule llmslo wrote, most
    likely): every trace format is text, and its reader would only say the bytes are not UTF-8."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except OSError:
        return  # the reader says what is wrong with the path
    if head == b"PAR1":
        what = "a trace" if kind == "auto" else f"an {kind} trace" if kind[:1] in "aeiou" else f"a {kind} trace"
        source = _display(path)
        raise TraceFormatError(source, None, None, None,
                               f"a Parquet file, not {what} (traces are CSV or JSON lines); an arrival "
                               "schedule that llmslo wrote (llmslo import, llmslo trace --out) is replayed with "
                               f"`llmslo load URL --schedule {shlex.quote(source)}`")


def read_trace(kind: str, path: str | Path, *, bucket_s: float = DEFAULT_BUCKET_S) -> tuple[pl.DataFrame, TraceSummary]:
    """Read a trace of ``kind`` (one of :data:`TRACE_KINDS`, or ``auto``) into a schedule and its summary.

    ``bucket_s`` is the width of the rate-over-time buckets, seconds. Raises :class:`TraceFormatError`
    for a malformed file and ``ValueError`` for an unknown kind.

    >>> schedule, summary = read_trace("azure", "AzureLLMInferenceTrace_conv.csv")  # doctest: +SKIP
    >>> summary.requests, summary.mean_rate_per_s  # doctest: +SKIP
    """
    path = Path(path)
    _refuse_parquet(path, kind)
    if kind == "auto":
        detected = detect_trace_kind(path)
        if detected is None:
            raise TraceFormatError(_display(path), None, None, None,
                                   f"not recognised as any trace kind ({', '.join(TRACE_KINDS)})")
        kind = detected
    start: float | None = None
    if kind == "azure":
        schedule, start, notes = read_azure_trace(path)
    elif kind == "mooncake":
        schedule, notes = read_mooncake_trace(path)
    elif kind == "burstgpt":
        schedule, notes = read_burstgpt_trace(path)
    else:
        raise ValueError(f"unknown trace kind {kind!r}: expected one of {', '.join(TRACE_KINDS)} or auto")
    summary = summarize_schedule(schedule, kind=kind, source=_display(path), bucket_s=bucket_s,
                                 start_unix_s=start, notes=notes)
    return schedule, summary


# ---------------------------------------------------------------------------------------------------
# summary


def _lengths(values: IntArray) -> LengthStats:
    q = np.quantile(values.astype(np.float64), [0.5, 0.9, 0.99])
    return LengthStats(p50=float(q[0]), p90=float(q[1]), p99=float(q[2]), max=int(values.max()),
                       mean=float(values.mean()))


def _peak_to_mean(offsets: FloatArray, width_s: float, mean_rate: float | None) -> float | None:
    if mean_rate is None or mean_rate <= 0:
        return None
    counts = np.bincount(np.floor(offsets / width_s).astype(np.int64))
    return float(counts.max() / width_s / mean_rate)


def _prefix_stats(prefixes: Sequence[Sequence[int] | None], block_tokens: int | None) -> PrefixStats | None:
    carrying = [p for p in prefixes if p is not None]
    if not carrying:
        return None
    seen_first: set[int] = set()
    seen_blocks: set[int] = set()
    shared_first = 0
    with_blocks = 0
    hit_blocks = 0
    total_blocks = 0
    for blocks in carrying:
        total_blocks += len(blocks)
        if blocks:
            with_blocks += 1
            if blocks[0] in seen_first:
                shared_first += 1
            seen_first.add(blocks[0])
        hit = 0
        for b in blocks:
            if b not in seen_blocks:
                break
            hit += 1
        hit_blocks += hit
        seen_blocks.update(blocks)
    return PrefixStats(
        requests_with_prefix_ids=len(carrying),
        first_block_shared_fraction=shared_first / with_blocks if with_blocks else None,
        prefix_block_hit_fraction=hit_blocks / total_blocks if total_blocks else None,
        blocks_total=total_blocks,
        unique_blocks=len(seen_blocks),
        block_tokens=block_tokens,
    )


def summarize_schedule(
    schedule: pl.DataFrame,
    *,
    kind: str,
    source: str,
    bucket_s: float = DEFAULT_BUCKET_S,
    start_unix_s: float | None = None,
    notes: Sequence[str] = (),
) -> TraceSummary:
    """Summarise an arrival schedule (columns of :data:`SCHEDULE_SCHEMA`, arrival order, at least one row).

    ``bucket_s``: width of the rate-over-time buckets, seconds (> 0). Raises ``ValueError`` for an
    empty schedule or a non-positive bucket width.
    """
    if schedule.height == 0:
        raise ValueError("an empty schedule has no summary")
    if not bucket_s > 0 or not math.isfinite(bucket_s):
        raise ValueError(f"bucket_s must be a positive number of seconds, got {bucket_s!r}")
    offsets = schedule["offset_s"].to_numpy().astype(np.float64)
    offsets = offsets - offsets[0]
    n = len(offsets)
    duration = float(offsets[-1])
    mean_rate = n / duration if duration > 0 else None
    gaps = np.diff(offsets)
    cv = None
    if len(gaps) >= 2 and gaps.mean() > 0:
        cv = float(gaps.std() / gaps.mean())
    counts = np.bincount(np.floor(offsets / bucket_s).astype(np.int64))
    buckets = tuple(
        RateBucket(start_s=i * bucket_s, requests=int(c), rate_per_s=float(c) / bucket_s)
        for i, c in enumerate(counts)
    )
    outputs = schedule["output_tokens"].to_numpy().astype(np.int64)
    models = None
    if "source_model" in schedule.columns:
        by_model = schedule.group_by("source_model").len().sort("source_model")
        models = {str(m): int(c) for m, c in by_model.iter_rows()}
    prefix = None
    if "prefix_ids" in schedule.columns and schedule["prefix_ids"].null_count() < n:
        block = MOONCAKE_BLOCK_TOKENS if kind == "mooncake" else None
        prefix = _prefix_stats(schedule["prefix_ids"].to_list(), block)
    return TraceSummary(
        kind=kind,
        source=source,
        requests=n,
        start_unix_s=start_unix_s,
        duration_s=duration,
        mean_rate_per_s=mean_rate,
        interarrival_cv=cv,
        peak_to_mean_1s=_peak_to_mean(offsets, 1.0, mean_rate),
        peak_to_mean_60s=_peak_to_mean(offsets, 60.0, mean_rate),
        bucket_s=float(bucket_s),
        rate_over_time=buckets,
        input_tokens=_lengths(schedule["input_tokens"].to_numpy().astype(np.int64)),
        output_tokens=_lengths(outputs),
        zero_output_requests=int(np.count_nonzero(outputs == 0)),
        prefix=prefix,
        models=models,
        notes=tuple(notes),
    )
