"""Reading back the arrival schedules llmslo writes, for ``llmslo load URL --schedule FILE``.

``llmslo import azure|mooncake|burstgpt`` writes ``<store stem>.<trace stem>.schedule.parquet`` and
``llmslo trace KIND TRACE --out FILE`` writes a ``.parquet`` or JSON-lines file, both with the columns of
:data:`~llmslo.analysis.workload.SCHEDULE_SCHEMA` (``offset_s``, ``input_tokens``, ``output_tokens``,
``prefix_ids``; ``source_model`` for BurstGPT). :func:`read_schedule` reads either form back (recognised by
content: Parquet by its magic bytes, else JSON lines), checks what a replay needs and returns the columns
as plain lists, so the load generator (which loads no polars or pyarrow) gets a plain schedule.

What a replay needs: ``offset_s`` (numbers: seconds after the start of the run, finite, >= 0, in arrival
order), ``input_tokens`` and ``output_tokens`` (whole numbers of tokens >= 0), no empty cell, at least one
row. Anything else raises :class:`ScheduleFileError` naming the file, the column or the row, and the fix:
a trace given instead of its schedule points to ``--trace-kind``, request summaries to ``llmslo ingest``.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from llmslo.analysis.workload._traces import trace_kind_of_line
from llmslo.telemetry import LlmsloError

__all__ = ["ScheduleFile", "ScheduleFileError", "read_schedule", "replay_command"]

PARQUET_MAGIC = b"PAR1"
REQUIRED = ("offset_s", "input_tokens", "output_tokens")
"""The columns a replay reads; ``prefix_ids`` and ``source_model`` are optional and not replayed."""
HOW_TO_WRITE = ("write one from a trace with `llmslo trace KIND TRACE --out FILE.parquet` or "
                "`llmslo import KIND TRACE --db STORE`")
"""The fix for a file that is no schedule."""
_SUMMARY_COLUMNS = {"request_id", "arrival_unix_s", "ttft_s", "e2e_s", "finish_reason"}


def replay_command(path: Path | str) -> str:
    """The command that replays the schedule at ``path`` (``URL`` stands for the reader's server)."""
    return f"llmslo load URL --schedule {shlex.quote(str(path))}"


class ScheduleFileError(LlmsloError, ValueError):
    """A file cannot be replayed as an arrival schedule; the message names the file, what is wrong (the column,
    the row) and the fix. ``source`` is the file as given, ``column`` the column at fault (None for the whole
    file), ``row`` the 1-based row (None for a whole column)."""

    def __init__(self, source: str, message: str, *, column: str | None = None, row: int | None = None) -> None:
        self.source = source
        self.column = column
        self.row = row
        super().__init__(f"{source}: {message}")


@dataclass(frozen=True)
class ScheduleFile:
    """A schedule read back: one entry per arrival in file order, ``offsets_s`` (seconds after the start),
    ``input_tokens`` and ``output_tokens``; ``form`` (``Parquet`` or ``JSON lines``) and ``notes`` (what the
    file holds that a replay does not use)."""

    source: str
    form: str
    offsets_s: list[float]
    input_tokens: list[int]
    output_tokens: list[int]
    notes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.offsets_s)


def _first_line(path: Path) -> str:
    with path.open("rb") as fh:
        for raw in fh:
            if raw.strip():
                return raw.decode("utf-8", errors="replace")
    return ""


def _frame(path: Path, source: str) -> tuple[pl.DataFrame, str]:
    """The file as a frame and its form; :class:`ScheduleFileError` for anything that is neither form."""
    with path.open("rb") as fh:
        head = fh.read(4)
    if head == PARQUET_MAGIC:
        try:
            return pl.read_parquet(path), "Parquet"
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise ScheduleFileError(source, f"a damaged Parquet file ({exc}); {HOW_TO_WRITE}") from None
    first = _first_line(path)
    kind = trace_kind_of_line(first)
    if kind is not None:
        article = "an" if kind[:1] in "aeiou" else "a"
        raise ScheduleFileError(
            source, f"{article} {kind} trace, not an arrival schedule: replay the trace with "
            f"`llmslo load URL --trace-kind {kind} {shlex.quote(source)}`, or write its schedule with "
            f"`llmslo trace {kind} {shlex.quote(source)} --out schedule.parquet`")
    try:
        obj = json.loads(first) if first.strip() else None
    except json.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        raise ScheduleFileError(source, "not an arrival schedule: neither a Parquet file nor JSON lines (one "
                                f"object per line); {HOW_TO_WRITE}")
    try:
        return pl.read_ndjson(path, infer_schema_length=None), "JSON lines"
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise ScheduleFileError(source, f"cannot be read as JSON lines ({exc}); {HOW_TO_WRITE}") from None


def _check_columns(frame: pl.DataFrame, source: str) -> None:
    present = frame.columns
    if _SUMMARY_COLUMNS & set(present) and not set(REQUIRED) <= set(present):
        raise ScheduleFileError(source, "holds request summaries (llmslo ingest loads them), not an arrival "
                                f"schedule; {HOW_TO_WRITE}")
    for name in REQUIRED:
        if name not in present:
            has = ", ".join(present) if present else "no columns"
            raise ScheduleFileError(
                source, f"column {name!r} is missing (the file has {has}); an arrival schedule has "
                f"{', '.join(REQUIRED)}: {HOW_TO_WRITE}", column=name)
    dtype = frame.schema["offset_s"]
    if not dtype.is_numeric():
        raise ScheduleFileError(source, f"column 'offset_s' is {dtype}; expected seconds after the start as "
                                f"numbers (Float64), as llmslo writes them: {HOW_TO_WRITE}", column="offset_s")
    for name in REQUIRED[1:]:
        dtype = frame.schema[name]
        if not dtype.is_integer():
            raise ScheduleFileError(source, f"column {name!r} is {dtype}; expected whole numbers of tokens "
                                    f"(Int64), as llmslo writes them: {HOW_TO_WRITE}", column=name)


def _check_values(offsets: list[float | None], inputs: list[int | None], outputs: list[int | None],
                  source: str) -> None:
    previous = 0.0
    for i, (offset, inp, out) in enumerate(zip(offsets, inputs, outputs, strict=True)):
        row = i + 1
        if offset is None:
            raise ScheduleFileError(source, f"row {row}: offset_s is empty; every arrival needs its offset",
                                    column="offset_s", row=row)
        if not math.isfinite(offset):
            raise ScheduleFileError(source, f"row {row}: offset_s {offset!r} is not a finite number of seconds",
                                    column="offset_s", row=row)
        if offset < 0:
            raise ScheduleFileError(source, f"row {row}: offset_s {offset!r} is negative (seconds after the "
                                    "start)", column="offset_s", row=row)
        if offset < previous:
            raise ScheduleFileError(source, f"row {row}: offset_s {offset!r} is before the previous arrival "
                                    f"({previous!r}); a schedule lists its arrivals in time order",
                                    column="offset_s", row=row)
        previous = offset
        for name, value in (("input_tokens", inp), ("output_tokens", out)):
            if value is None:
                raise ScheduleFileError(source, f"row {row}: {name} is empty; every arrival needs its lengths",
                                        column=name, row=row)
            if value < 0:
                raise ScheduleFileError(source, f"row {row}: {name} {value} is negative (tokens)", column=name,
                                        row=row)


def read_schedule(path: str | Path) -> ScheduleFile:
    """Read a schedule that llmslo wrote (Parquet or JSON lines) for replay.

    Raises :class:`ScheduleFileError` for a missing file or one that is no such schedule (see the module
    docstring); nothing is returned then.
    """
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise ScheduleFileError(source, "no such file")
    frame, form = _frame(path, source)
    _check_columns(frame, source)
    if frame.height == 0:
        raise ScheduleFileError(source, f"the schedule holds no arrivals; {HOW_TO_WRITE}")
    offsets = [None if v is None else float(v) for v in frame["offset_s"].to_list()]
    inputs: list[int | None] = frame["input_tokens"].to_list()
    outputs: list[int | None] = frame["output_tokens"].to_list()
    _check_values(offsets, inputs, outputs, source)
    notes: list[str] = []
    if "prefix_ids" in frame.columns and (carrying := frame.height - frame["prefix_ids"].null_count()):
        notes.append(f"prefix_ids ({carrying:,} arrivals) are not replayed: every prompt starts with a word of "
                     "its own, so no two share a cached prefix")
    if "source_model" in frame.columns:
        notes.append("source_model is not replayed: every request asks for the one model of the run (--model)")
    other = [c for c in frame.columns if c not in (*REQUIRED, "prefix_ids", "source_model")]
    if other:
        notes.append(f"column(s) {', '.join(other)} not replayed (a schedule is offsets and lengths)")
    return ScheduleFile(source, form, [float(v) for v in offsets if v is not None],
                        [int(v) for v in inputs if v is not None], [int(v) for v in outputs if v is not None],
                        tuple(notes))
