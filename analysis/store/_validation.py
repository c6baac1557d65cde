"""Vectorised validation of request-summary inputs, derived from the telemetry contract.

An input is any DuckDB table expression (a registered Arrow table, ``read_parquet(...)``, a staged
CSV/JSONL table) plus a 1-based row-number expression. :func:`column_plan` decides, from the source
column types, how each contract column is converted and how a wrong type is detected;
:func:`violation_conditions` lists every rule as a SQL predicate over the converted columns. The
same predicates serve the fast "is anything wrong?" pass and the detailed error listing.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from llmslo.analysis.store._input_types import input_conversion
from llmslo.telemetry import COLUMNS, COUNT_COLUMNS, INTERVAL_COLUMNS, RULES, Column, LlmsloError

ROW = "__row"
"""Name of the 1-based row-number column carried through validation."""

RESERVED_COLUMNS: tuple[str, ...] = ("__json", "__r", ROW, "file_row_number")
"""Column names ingest uses internally while reading an input (row numbers, the JSONL object, the Parquet
reader's ``file_row_number``): an input column of one of these names is refused, never read or dropped."""

ARRIVAL_MIN_UNIX_S = 0.0
"""Earliest accepted ``arrival_unix_s``: the Unix epoch, 1970-01-01T00:00:00Z, in seconds.

A negative arrival is no wall-clock time. The bound is not later because importers write ``0`` for files
that record no start times, and offsets from ``0`` for clocks that are not Unix time (their reports say so).
"""
ARRIVAL_MAX_AHEAD_S = 86_400.0
"""Latest accepted ``arrival_unix_s``: this many seconds (one day) after the ingest's own clock.

A day covers any clock skew between the server and the machine that ingests; anything later is no arrival
yet (milliseconds or nanoseconds taken for seconds, or garbage such as 1.7e308, which overflows the
window arithmetic of the report).
"""
INTERVAL_MAX_S = 30 * 86_400.0
"""Largest accepted interval (``queue_s``, ``ttft_s``, ``e2e_s``, every ``*_s`` duration and each ``itl_s``
gap), seconds: 30 days.

No serving stack holds a request open that long (batch APIs complete within a day); a larger value is a unit
mistake (nanoseconds taken for seconds) or garbage. The bound also keeps sums over many rows finite.
"""


@dataclass(frozen=True)
class RowError:
    """One problem in one input: the file, the 1-based row (None for a whole-file problem),
    the column, the offending value as text, the rule broken and a message saying what is expected."""

    source: str
    row: int | None
    column: str
    value: str | None
    rule: str
    message: str

    def describe(self) -> str:
        where = f"{self.source}: row {self.row}" if self.row is not None else self.source
        shown = "null" if self.value is None else repr(self.value)
        return f"{where}, column {self.column}: value {shown} breaks rule {self.rule!r}: {self.message}"


class InvalidInputError(LlmsloError):
    """Input rows break the request-summary contract; nothing was written.

    ``errors`` lists the problems (possibly capped); ``invalid_rows`` counts the invalid rows.
    """

    def __init__(self, errors: Sequence[RowError], invalid_rows: int, shown: int = 20) -> None:
        self.errors = list(errors)
        self.invalid_rows = invalid_rows
        lines = [e.describe() for e in self.errors[:shown]]
        more = len(self.errors) - shown
        if more > 0:
            lines.append(f"... and {more} more problems")
        if self.errors and all(e.row is None for e in self.errors):  # --skip-invalid cannot help
            head = "The input cannot be read as request summaries; nothing was written. Fix the file(s):"
        else:
            head = (
                f"{invalid_rows} invalid row(s); nothing was written. "
                "Fix the rows, or pass --skip-invalid to load the valid rows and write the rejected ones "
                "beside the input."
            )
        super().__init__(head + "\n" + "\n".join(lines))


@dataclass(frozen=True)
class ColumnPlan:
    """How one contract column is read from an input.

    ``value`` is the SQL of the converted value (typed as the contract says); ``bad_type`` is a SQL
    predicate true when a present value has the wrong type (None when a wrong type is impossible);
    ``shown`` is SQL rendering the raw value as text for error messages.
    """

    column: Column
    value: str
    bad_type: str | None
    shown: str
    bad_message: str | None = None
    """What a wrong type breaks, when more precise than "must be of type ..."."""


_TARGET = {"str": "VARCHAR", "float": "DOUBLE", "int": "BIGINT", "float_list": "DOUBLE[]"}
_INT_RANGE = "a whole number from -2^63 to 2^63 - 1"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _integral(double_sql: str) -> str:
    return (
        f"CASE WHEN isfinite({double_sql}) AND {double_sql} = trunc({double_sql}) "
        f"AND abs({double_sql}) < 9.2e18 THEN CAST({double_sql} AS BIGINT) END"
    )


def _plan_json(col: Column, raw: str) -> ColumnPlan:
    jtype = f"json_type({raw})"
    numeric = f"{jtype} IN ('DOUBLE', 'BIGINT', 'UBIGINT')"
    if col.kind == "str":
        value = f"CASE WHEN {jtype} = 'VARCHAR' THEN {raw} ->> '$' END"
    elif col.kind == "float":
        value = f"CASE WHEN {numeric} THEN TRY_CAST({raw} AS DOUBLE) END"
    elif col.kind == "int":
        value = (
            f"CASE WHEN {jtype} IN ('BIGINT', 'UBIGINT') THEN TRY_CAST({raw} AS BIGINT) "
            f"WHEN {jtype} = 'DOUBLE' THEN {_integral(f'TRY_CAST({raw} AS DOUBLE)')} END"
        )
    else:
        value = f"CASE WHEN {jtype} = 'ARRAY' THEN TRY_CAST({raw} AS DOUBLE[]) END"
    bad = f"({raw} IS NOT NULL AND {jtype} <> 'NULL' AND ({value}) IS NULL)"
    return ColumnPlan(col, value, bad, f"CAST({raw} AS VARCHAR)", _int_message(col))


def _int_message(col: Column) -> str | None:
    """The wrong-type message of an integer column (None for the others)."""
    return f"{col.name} must be of type int ({_INT_RANGE})" if col.kind == "int" else None


def _plan_typed(col: Column, raw: str, duck_type: str) -> ColumnPlan:
    """The plan of a typed input column, by :func:`input_conversion` (the rule every reader follows)."""
    target = _TARGET[col.kind]
    shown = f"CAST({raw} AS VARCHAR)"
    how = input_conversion(col, duck_type)
    if how == "cast":
        return ColumnPlan(col, f"CAST({raw} AS {target})", None, shown)
    if how == "narrow":
        value = f"TRY_CAST({raw} AS BIGINT)"
    elif how == "parse":
        value = _integral(f"TRY_CAST({raw} AS DOUBLE)") if col.kind == "int" else f"TRY_CAST({raw} AS {target})"
    else:  # e.g. a number where a string belongs, or a boolean anywhere
        return ColumnPlan(col, f"CAST(NULL AS {target})", f"({raw} IS NOT NULL)", shown, _int_message(col))
    return ColumnPlan(col, value, f"({raw} IS NOT NULL AND ({value}) IS NULL)", shown, _int_message(col))


def _plan_absent(col: Column) -> ColumnPlan:
    target = _TARGET[col.kind]
    if col.default is None:
        value = f"CAST(NULL AS {target})"
    elif isinstance(col.default, str):
        value = "'" + col.default.replace("'", "''") + "'"
    else:
        value = f"CAST({col.default!r} AS {target})"
    return ColumnPlan(col, value, None, "NULL")


def column_plan(
    source: str, source_types: Mapping[str, str], *, json_column: str | None = None
) -> tuple[list[ColumnPlan], list[RowError]]:
    """Plan the conversion of every contract column from an input's columns.

    ``source_types`` maps input column names to DuckDB type names. With ``json_column``, values
    are read from keys of that JSON-object column (JSONL) and ``source_types`` names the keys seen.
    Returns the plans and the whole-input problems: unknown columns (with the nearest contract
    name) and missing required columns.
    """
    names = {c.name for c in COLUMNS}
    problems: list[RowError] = []
    for name in source_types:
        if name in names:
            continue
        near = difflib.get_close_matches(name, sorted(names), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        problems.append(RowError(
            source, None, name, None, "unknown_column",
            f"column {name!r} is not part of the request summary{hint}; "
            "rename or drop it (see `llmslo ingest --help` for the columns)",
        ))
    plans: list[ColumnPlan] = []
    for col in COLUMNS:
        if col.name not in source_types:
            if col.required:
                problems.append(RowError(
                    source, None, col.name, None, "missing",
                    f"required column {col.name!r} ({col.kind}: {col.doc}) is missing",
                ))
            plans.append(_plan_absent(col))
        elif json_column is not None:
            plans.append(_plan_json(col, f"({_q(json_column)} -> '$.{col.name}')"))
        else:
            duck_type = source_types[col.name]
            plans.append(_plan_typed(col, _q(col.name), duck_type))
    return plans, problems


def reserved_column_errors(source: str, names: Iterable[str]) -> list[RowError]:
    """A whole-input problem for each input column named like one of :data:`RESERVED_COLUMNS`."""
    return [
        RowError(source, None, name, None, "reserved_column",
                 f"column {name!r} is a name llmslo uses internally while reading an input (not part of "
                 "the request summary); rename or drop it")
        for name in names if name in RESERVED_COLUMNS
    ]


@dataclass(frozen=True)
class Condition:
    """One rule as a SQL predicate over converted columns: TRUE marks a violating row."""

    rule: str
    column: str
    sql: str
    message: str


def _sql_list(values: Sequence[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def _utc(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _range_conditions(col: Column, latest_arrival_unix_s: float) -> list[Condition]:
    """The plausibility bounds of a column (:data:`ARRIVAL_MIN_UNIX_S`, :data:`INTERVAL_MAX_S`); finite
    values only (a non-finite one breaks ``non_finite`` already)."""
    name = _q(col.name)
    if col.name == "arrival_unix_s":
        return [Condition(
            "implausible_arrival", col.name,
            f"isfinite({name}) AND ({name} < {ARRIVAL_MIN_UNIX_S!r} OR {name} > {latest_arrival_unix_s!r})",
            f"{col.name} must be wall-clock Unix seconds from {ARRIVAL_MIN_UNIX_S:g} ({_utc(ARRIVAL_MIN_UNIX_S)}) "
            f"to one day after now ({_utc(latest_arrival_unix_s)}); is it in milliseconds or nanoseconds?",
        )]
    if col.name not in INTERVAL_COLUMNS:
        return []
    message = (f"{col.name} must be at most {INTERVAL_MAX_S:,.0f} s (30 days); "
               "is it in milliseconds or nanoseconds?")
    if col.kind == "float":
        return [Condition("interval_too_long", col.name, f"isfinite({name}) AND {name} > {INTERVAL_MAX_S!r}",
                          message)]
    if col.kind == "float_list":
        return [Condition(
            "interval_too_long", col.name,
            f"len(list_filter({name}, lambda g: isfinite(g) AND g > {INTERVAL_MAX_S!r})) > 0",
            message.replace(f"{col.name} must", f"every {col.name} gap must"),
        )]
    return []


def violation_conditions(plans: Sequence[ColumnPlan], *, now_unix_s: float | None = None) -> list[Condition]:
    """Every per-row rule of the contract, in a stable order (duplicates are checked apart).

    ``now_unix_s`` (default: the clock) places the latest plausible arrival (:data:`ARRIVAL_MAX_AHEAD_S`).
    """
    latest_arrival = (time.time() if now_unix_s is None else now_unix_s) + ARRIVAL_MAX_AHEAD_S
    out: list[Condition] = []
    for plan in plans:
        col = plan.column
        name = _q(col.name)
        bad = f"__bad_{col.name}" if plan.bad_type is not None else None
        if bad is not None:
            out.append(Condition("type", col.name, bad, plan.bad_message or f"{col.name} must be of type {col.kind}"))
        if not col.nullable:
            present = f"{name} IS NULL" + (f" AND NOT {bad}" if bad else "")
            out.append(Condition("null", col.name, present, f"{col.name} must not be null"))
        if col.kind == "str" and not col.nullable:
            out.append(Condition("empty", col.name, f"{name} = ''", f"{col.name} must not be empty"))
        if col.allowed is not None:
            out.append(Condition(
                "not_allowed", col.name, f"{name} NOT IN ({_sql_list(col.allowed)})",
                f"{col.name} must be one of: {', '.join(col.allowed)}",
            ))
        if col.kind == "float":
            out.append(Condition(
                "non_finite", col.name, f"NOT isfinite({name})", f"{col.name} must be finite (no NaN/inf)"
            ))
        if col.kind == "float_list":
            out.append(Condition(
                "type", col.name, f"len(list_filter({name}, lambda g: g IS NULL)) > 0",
                f"{col.name} must be a list of numbers (no nulls, no text)",
            ))
        if (col.name in INTERVAL_COLUMNS and col.kind == "float") or col.name in COUNT_COLUMNS:
            out.append(Condition("negative", col.name, f"{name} < 0", f"{col.name} must be >= 0"))
        out.extend(_range_conditions(col, latest_arrival))
    for rule in RULES:
        out.append(Condition(rule.name, rule.column, rule.sql, rule.message))
    return out


def typed_select(plans: Sequence[ColumnPlan], source_sql: str, row_sql: str) -> str:
    """SQL selecting the row number, every converted column and each wrong-type flag."""
    parts = [f"{row_sql} AS {ROW}"]
    for plan in plans:
        parts.append(f"{plan.value} AS {_q(plan.column.name)}")
        if plan.bad_type is not None:
            parts.append(f"{plan.bad_type} AS __bad_{plan.column.name}")
    for plan in plans:
        parts.append(f"{plan.shown} AS __shown_{plan.column.name}")
    return f"SELECT {', '.join(parts)} FROM {source_sql}"


def typed_select_fast(plans: Sequence[ColumnPlan], source_sql: str) -> str:
    """Like :func:`typed_select` without row numbers and raw renderings (the fast path)."""
    parts = [f"{plan.value} AS {_q(plan.column.name)}" for plan in plans]
    parts += [f"{p.bad_type} AS __bad_{p.column.name}" for p in plans if p.bad_type is not None]
    return f"SELECT {', '.join(parts)} FROM {source_sql}"


INVALID_ROW = "__llmslo_invalid_row__"
"""Message of the DuckDB error that :func:`checked_select` raises on the first row breaking a rule."""


def any_violation(conds: Sequence[Condition]) -> str:
    """SQL predicate over converted columns: TRUE when a row breaks at least one of ``conds``."""
    return " OR ".join(f"({c.sql})" for c in conds)


def checked_select(
    plans: Sequence[ColumnPlan], conds: Sequence[Condition], source_sql: str, where: str = "",
    exclude_ids: str | None = None,
) -> str:
    """SQL selecting the converted contract columns of ``source_sql`` that raises on an invalid row.

    The validation rides in the scan that feeds the insert: a row breaking any of ``conds`` makes
    the statement fail with a DuckDB ``InvalidInputException`` whose message contains
    :data:`INVALID_ROW` (the caller then lists the errors in detail). ``where`` (``" WHERE ..."`` or
    empty) selects source rows, e.g. a range of row numbers. With ``exclude_ids`` (the name of a table
    with a ``request_id`` column), rows whose ``request_id`` is listed there are left out, but only
    after they were checked: the check comes first in one ``CASE``, so an invalid row is an error
    even when its id is excluded.
    """
    names = ", ".join(_q(p.column.name) for p in plans)
    skip = f" WHEN request_id IN (SELECT request_id FROM {exclude_ids}) THEN FALSE" if exclude_ids else ""
    return (
        f"SELECT {names} FROM ({typed_select_fast(plans, source_sql)}{where}) "
        f"WHERE CASE WHEN {any_violation(conds)} THEN error('{INVALID_ROW}'){skip} ELSE TRUE END"
    )
