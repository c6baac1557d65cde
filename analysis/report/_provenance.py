"""What the stored rows can support: imports without arrival times, and arrival times a report can place.

:func:`arrivalless_imports` reads the provenance that ``llmslo import`` recorded
(:data:`~llmslo.analysis.store.IMPORTS_TABLE`, and the ``import:<file name>`` metadata keys of older
stores) and returns the imports whose rows carry no real arrival times, keyed by the part of
``request_id`` before ``#`` that their rows share, each with the run duration the source recorded
(seconds) or the reason there is none. :func:`stored_arrival_range` checks that every stored
``arrival_unix_s`` is a time a report can place (Unix seconds, 1970 to the year 9999), and
:func:`check_window_count` that a window length gives a number of windows a report can hold.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import duckdb

from llmslo.analysis.databases import Database, Dialect, as_database
from llmslo.analysis.store import IMPORTS_TABLE, META_TABLE, SUMMARY_TABLE
from llmslo.telemetry import ConfigurationError, LlmsloError, format_duration

Source = duckdb.DuckDBPyConnection | Database
"""What these functions read: a DuckDB connection (a store's ``con``) or a database."""

__all__ = [
    "ARRIVAL_MAX_UNIX_S",
    "ARRIVAL_MIN_UNIX_S",
    "LEGACY_IMPORT_REASON",
    "MAX_WINDOWS",
    "ArrivallessImport",
    "ReportDataError",
    "arrivalless_imports",
    "check_window_count",
    "id_prefix_sql",
    "stored_arrival_range",
]

ARRIVAL_MIN_UNIX_S = 0.0
"""The earliest arrival time a report places: 1970-01-01 00:00:00 UTC (Unix seconds)."""
ARRIVAL_MAX_UNIX_S = 253_402_300_799.0
"""The latest: 9999-12-31 23:59:59 UTC (Unix seconds), the last second a calendar date can show."""
MAX_WINDOWS = 100_000
"""The most time windows one report (or one series of an anomaly scan) holds."""
LEGACY_IMPORT_REASON = "imported before run durations were recorded; re-import"
"""Why an arrival-less import written by an older llmslo has no per-second rates."""


class ReportDataError(LlmsloError):
    """The stored rows hold values a report cannot use; the message names the rows and the fix."""


@dataclass(frozen=True)
class ArrivallessImport:
    """The rows of one or more imported files that carry no arrival times, and what their rates divide by.

    ``prefix`` is the part of ``request_id`` before ``#`` of their rows; ``files`` the file names;
    ``run_duration_s`` the run's duration as the source recorded it (seconds), None when unknown, and then
    ``problem`` says why (older import, none recorded, or files that disagree), without naming the files.
    """

    prefix: str
    files: tuple[str, ...]
    run_duration_s: float | None
    problem: str | None


def id_prefix_sql(column: str = "request_id") -> str:
    """SQL (DuckDB's) of the part of ``column`` before the first ``#``: what joins a row to its import."""
    return f"split_part({column}, '#', 1)"


@dataclass
class _Record:
    """One provenance record of an import without arrival times (new or older layout)."""

    prefix: str
    file: str
    arrivals: bool
    duration_s: float | None
    note: str | None
    legacy: bool


def _records(database: Database) -> list[_Record]:
    """Every provenance record (with and without arrivals), from the imports table and older metadata."""
    out: list[_Record] = []
    tables = database.tables()
    if IMPORTS_TABLE in tables:
        if "id_prefix" in database.columns(IMPORTS_TABLE):
            for prefix, source, arrivals, duration, note in database.tuples(
                f"SELECT id_prefix, source, arrivals_available, run_duration_s, run_duration_note "
                f"FROM {IMPORTS_TABLE} ORDER BY source"
            ):
                name = Path(str(source)).name
                if prefix is None:  # recorded before the column existed: rows named "<file name>#<index>"
                    out.append(_Record(name.split("#", 1)[0], name, bool(arrivals), None, None, legacy=True))
                elif prefix != "":  # "": the import wrote no request summaries
                    out.append(_Record(str(prefix), name, bool(arrivals), None if duration is None else float(duration),
                                       None if note is None else str(note), legacy=False))
        else:  # before id_prefix: rows are named "<file name>#<index>"
            for source, arrivals in database.tuples(
                f"SELECT source, arrivals_available FROM {IMPORTS_TABLE} ORDER BY source"
            ):
                name = Path(str(source)).name
                out.append(_Record(name.split("#", 1)[0], name, bool(arrivals), None, None, legacy=True))
    if META_TABLE in tables:
        for key, value in database.tuples(
            f"SELECT key, value FROM {META_TABLE} WHERE key LIKE 'import:%' ORDER BY key"
        ):
            try:
                meta = json.loads(value)
            except json.JSONDecodeError:
                continue
            name = str(key).removeprefix("import:")
            arrivals = not (isinstance(meta, dict) and meta.get("arrivals_available") is False)
            out.append(_Record(name.split("#", 1)[0], name, arrivals, None, None, legacy=True))
    return out


def _resolve(prefix: str, records: list[_Record]) -> ArrivallessImport:
    """One prefix's records (at least one without arrivals) as one :class:`ArrivallessImport`."""
    files = tuple(sorted({r.file for r in records}))
    if any(r.arrivals for r in records):
        return ArrivallessImport(prefix, files, None,
                                 f"imported files with request ids {prefix}#… disagree on whether "
                                 "they carry arrival times")
    if any(r.legacy for r in records):
        return ArrivallessImport(prefix, files, None, LEGACY_IMPORT_REASON)
    durations = {r.duration_s for r in records}
    if None in durations:
        notes = sorted({r.note for r in records if r.duration_s is None and r.note})
        why = f" ({'; '.join(notes)})" if notes else ""
        return ArrivallessImport(prefix, files, None, f"no run duration{why}")
    if len(durations) > 1 or not all(d is not None and math.isfinite(d) and d > 0 for d in durations):
        found = ", ".join(format_duration(d) if d is not None and math.isfinite(d) and d >= 0 else repr(d)
                          for d in sorted(durations, key=lambda d: -1.0 if d is None else d))
        return ArrivallessImport(prefix, files, None,
                                 f"the recorded run durations ({found}) are not one positive duration")
    (duration,) = durations
    return ArrivallessImport(prefix, files, duration, None)


def arrivalless_imports(con: Source) -> dict[str, ArrivallessImport]:
    """The imports whose rows carry no arrival times, keyed by their rows' ``request_id`` prefix.

    Empty for a store without imports, or whose imports all recorded arrival times (then the rows need
    no join with the provenance at all). ``con``: a DuckDB connection or a database.
    """
    by_prefix: dict[str, list[_Record]] = {}
    for r in _records(as_database(con)):
        by_prefix.setdefault(r.prefix, []).append(r)
    return {prefix: _resolve(prefix, records) for prefix, records in sorted(by_prefix.items())
            if any(not r.arrivals for r in records)}


def unplaceable_arrival(dialect: Dialect) -> str:
    """SQL true for a row whose ``arrival_unix_s`` is not a finite number between :data:`ARRIVAL_MIN_UNIX_S`
    and :data:`ARRIVAL_MAX_UNIX_S` (the rows :func:`stored_arrival_range` refuses)."""
    return (f"(NOT {dialect.is_finite('arrival_unix_s')} OR arrival_unix_s < {ARRIVAL_MIN_UNIX_S!r} "
            f"OR arrival_unix_s > {ARRIVAL_MAX_UNIX_S!r})")


def stored_arrival_range(con: Source) -> tuple[float, float] | None:
    """``(first, last)`` stored ``arrival_unix_s`` (Unix seconds), None without rows.

    Raises :class:`ReportDataError`, naming up to three rows, when an arrival time is not a finite number
    between :data:`ARRIVAL_MIN_UNIX_S` and :data:`ARRIVAL_MAX_UNIX_S`: no window, span or calendar date
    can be computed from it. ``con``: a DuckDB connection or a database.
    """
    database = as_database(con)
    d = database.dialect
    bad = unplaceable_arrival(d)
    lo, hi, n_bad = database.tuples(
        f"SELECT {d.min_of('arrival_unix_s')}, {d.max_of('arrival_unix_s')}, {d.count_if(bad)} "
        f"FROM {database.summaries}"
    )[0]
    if n_bad:
        examples = database.tuples(
            f"SELECT request_id, arrival_unix_s FROM {database.summaries} WHERE {bad} "
            "ORDER BY request_id LIMIT 3"
        )
        shown = ", ".join(f"{rid!r} ({float(t)!r})" for rid, t in examples)
        raise ReportDataError(
            f"{SUMMARY_TABLE}.arrival_unix_s: {n_bad:,} row(s) hold an arrival time that is not Unix seconds "
            f"between {ARRIVAL_MIN_UNIX_S:.0f} (1970) and {ARRIVAL_MAX_UNIX_S:.0f} (the year 9999), e.g. "
            f"{shown}; delete those rows (DELETE FROM {SUMMARY_TABLE} WHERE request_id IN (...)) or re-ingest "
            "their source with correct arrival times"
        )
    if lo is None or hi is None:
        return None
    return float(lo), float(hi)


@dataclass(frozen=True)
class PlaceableRows:
    """Which stored rows have arrival times: ``condition`` (SQL over the summary table; ``TRUE`` when every
    row has them), how many rows it ``left_out`` (rows of imports without arrival times), and the names of
    those imports' ``files``."""

    condition: str
    left_out: int
    files: tuple[str, ...]


def placeable_rows(con: Source) -> PlaceableRows:
    """The stored rows that can be placed in time (windows, periods), after checking every stored arrival.

    Raises :class:`ReportDataError` for an arrival time that cannot be placed at all
    (:func:`stored_arrival_range`). Rows that came from imports without arrival times are left out; no
    join with the provenance is made when there are none. ``con``: a DuckDB connection or a database (the
    condition is then written in the database's SQL, over its summaries).
    """
    database = as_database(con)
    d = database.dialect
    stored_arrival_range(database)
    imports = arrivalless_imports(database)
    if not imports:
        return PlaceableRows("TRUE", 0, ())
    listed = ", ".join(d.text(p) for p in imports)
    keep = f"NOT ({d.contains_mark('request_id')} AND {d.id_prefix('request_id')} IN ({listed}))"
    (left_out,) = database.tuples(f"SELECT count(*) FROM {database.summaries} WHERE NOT ({keep})")[0]
    files = tuple(sorted({f for i in imports.values() for f in i.files}))
    return PlaceableRows(keep, int(left_out), files)


def check_window_count(
    con: Source,
    window_s: float,
    arrivals: tuple[float, float] | None,
    *,
    until_unix_s: float | None = None,
    option: str = "--window",
) -> int:
    """How many ``window_s`` windows (aligned to multiples of it in Unix time) hold a stored arrival (one
    at or before ``until_unix_s``, when given).

    Cheap when the arrival range ``arrivals`` (Unix seconds, from :func:`stored_arrival_range`) spans at
    most :data:`MAX_WINDOWS` windows (returns that bound); otherwise the windows that hold a row are
    counted. Raises :class:`ConfigurationError` naming ``option`` and the count when they exceed
    :data:`MAX_WINDOWS`. ``con``: a DuckDB connection or a database.
    """
    if arrivals is None:
        return 0
    lo, hi = arrivals
    if until_unix_s is not None:
        if until_unix_s < lo:
            return 0
        hi = min(hi, until_unix_s)
    spanned = math.floor(hi / window_s) - math.floor(lo / window_s) + 1
    if spanned <= MAX_WINDOWS:
        return spanned
    database = as_database(con)
    d = database.dialect
    where = "" if until_unix_s is None else f" WHERE arrival_unix_s <= {d.double(until_unix_s)}"
    (held,) = database.tuples(
        f"SELECT count(DISTINCT floor(arrival_unix_s / {d.double(window_s)})) FROM {database.summaries}{where}"
    )[0]
    if int(held) > MAX_WINDOWS:
        raise ConfigurationError(
            f"{option} {format_duration(window_s)} gives {int(held):,} windows over the stored arrivals "
            f"({format_duration(hi - lo)} from first to last), more than the {MAX_WINDOWS:,} a report holds: "
            f"choose a longer {option}"
        )
    return int(held)
