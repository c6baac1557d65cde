"""How a column of an input is read as its contract type: the one rule every reader of request summaries follows.

``llmslo ingest`` (into a DuckDB store, and through the same checks into ClickHouse) and ``llmslo report
--source`` (Parquet files read in place) see an input's columns as DuckDB types and ask :func:`input_conversion`
how each becomes its contract type (``str``, ``float``, ``int``, ``float_list``):

* ``"cast"``: a plain ``CAST`` keeps every value: text as text; any integer, float or exact decimal as a float;
  an integer as an integer; a list of numbers as a list of floats; a column of nulls as nulls;
* ``"narrow"``: an integer type wider than ``BIGINT`` (``HUGEINT``, ``UBIGINT``) for an integer column: a cast
  that fails for a value beyond ``BIGINT``'s range;
* ``"parse"``: each value converts on its own or not at all (text read as numbers, a float or text read as a
  whole number): only ingest, which checks every row, reads these;
* None: no value of that type is one of the column.

Exact decimals (``DECIMAL(p,s)``: DuckDB's ``epoch_ms(t) * 0.001``, Arrow's ``decimal128``) become floats
(``DOUBLE``) when that changes no value by more than :data:`DECIMAL_MAX_LOSS_S` (a microsecond): always when
their scale is at most :data:`DECIMAL_EXACT_SCALE` digits (nothing below a microsecond to lose), and for a
finer scale when no value of the input moves further than that (:func:`lossy_decimals` measures each value's
change to within 1e-12 s; a float holds any value below 2^33 s, about 270 years, to better than a
microsecond, so nanosecond arrivals pass). Otherwise the input is refused with the column, its type and the
fix: write it as ``DOUBLE``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import duckdb

from llmslo.telemetry import COLUMNS, Column

Conversion = Literal["cast", "narrow", "parse"]

DECIMAL_EXACT_SCALE = 6
"""Decimal places (the scale of ``DECIMAL(p,s)``) up to which an exact decimal is read as a float without looking
at its values: it holds nothing finer than a microsecond."""
DECIMAL_MAX_LOSS_S = 1e-6
"""The most a value of a finer exact decimal may change (seconds) when it is read as a float: a microsecond."""

_INT_TYPES = {
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT",
    "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT",
}
_WIDE_INT_TYPES = {"HUGEINT", "UBIGINT", "UHUGEINT"}
"""Integer types with values a BIGINT cannot hold."""
_DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")


def type_family(duck_type: str) -> str:
    """The family of a DuckDB type name: ``text``, ``int``, ``float`` (floats and exact decimals), ``list`` (of
    numbers), ``null``, ``json`` or ``other``."""
    t = duck_type.upper()
    if t.endswith("[]"):  # before the scalars: DECIMAL(4,3)[] is a list
        inner = type_family(t[:-2])
        return "list" if inner in ("int", "float") else "other"
    if t in ("VARCHAR", "STRING") or t.startswith("ENUM"):
        return "text"
    if t in _INT_TYPES:
        return "int"
    if t in ("FLOAT", "DOUBLE", "REAL") or t.startswith("DECIMAL"):
        return "float"
    if t in ('"NULL"', "NULL"):
        return "null"
    if t == "JSON":
        return "json"
    return "other"


def input_conversion(column: Column, duck_type: str) -> Conversion | None:
    """How values of the DuckDB type ``duck_type`` become ``column``'s contract type (the module docstring)."""
    family = type_family(duck_type)
    if family == "null":
        return "cast"
    if column.kind == "str":
        return "cast" if family == "text" else None
    if column.kind == "float":
        return "cast" if family in ("int", "float") else "parse" if family == "text" else None
    if column.kind == "int":
        if family == "int":
            return "narrow" if duck_type.upper() in _WIDE_INT_TYPES else "cast"
        return "parse" if family in ("float", "text") else None
    return "cast" if family == "list" else "parse" if family == "text" else None


def _fine_decimal(duck_type: str) -> bool:
    """Whether ``duck_type`` is an exact decimal (or a list of them) finer than :data:`DECIMAL_EXACT_SCALE`."""
    found = _DECIMAL.fullmatch(duck_type.upper().removesuffix("[]"))
    return found is not None and int(found.group(2)) > DECIMAL_EXACT_SCALE


def _loss_sql(x: str) -> str:
    """SQL of ``|CAST(x AS DOUBLE) - x|`` (seconds) for an exact decimal ``x``, computed without rounding it away.

    With ``d`` the float, ``i``/``f`` the whole and fractional parts of ``x`` (exact decimals) and ``trunc(d)``
    an integer float (exact as a decimal): ``x - d = (i - trunc(d)) + (f - (d - trunc(d)))``, each term exact or
    within 1e-12 s of it.
    """
    d = f"CAST({x} AS DOUBLE)"
    return (f"abs(CAST(trunc({x}) - CAST(trunc({d}) AS DECIMAL(38,0)) AS DOUBLE) "
            f"+ (CAST({x} - trunc({x}) AS DOUBLE) - ({d} - trunc({d}))))")


@dataclass(frozen=True)
class LossyDecimal:
    """An exact decimal column that a float cannot hold to a microsecond: its name, DuckDB type, the largest
    change of a value read as a float (``loss_s``, seconds), and that value's 1-based row and text."""

    column: str
    duck_type: str
    loss_s: float
    row: int
    value: str

    def message(self) -> str:
        """What is wrong and the fix, for a person."""
        return (f"{self.column} is {self.duck_type}, an exact decimal finer than a microsecond: read as a float, "
                f"the value {self.value} (row {self.row}) changes by {self.loss_s:.2g} s (more than "
                f"{DECIMAL_MAX_LOSS_S:g} s); cast it to DOUBLE when you write it")


def lossy_decimals(con: duckdb.DuckDBPyConnection, source_sql: str, row_sql: str,
                   types: Mapping[str, str]) -> list[LossyDecimal]:
    """The contract columns of ``source_sql`` (an input whose columns have the DuckDB ``types``) that are exact
    decimals finer than :data:`DECIMAL_EXACT_SCALE` and whose values change by more than
    :data:`DECIMAL_MAX_LOSS_S` as floats; ``row_sql`` numbers its rows from 1.

    Reads nothing when no column is such a decimal; otherwise one scan of those columns.
    """
    fine = [c.name for c in COLUMNS if c.name in types and _fine_decimal(types[c.name])
            and input_conversion(c, types[c.name]) == "cast"]
    if not fine:
        return []
    parts = []
    for k, name in enumerate(fine):
        raw = '"' + name.replace('"', '""') + '"'
        loss = (f"list_max(list_transform({raw}, lambda g: {_loss_sql('g')}))" if types[name].endswith("[]")
                else _loss_sql(raw))
        parts.append(f"max({loss}) AS l{k}, arg_max({row_sql}, {loss}) AS r{k}, "
                     f"arg_max(CAST({raw} AS VARCHAR), {loss}) AS v{k}")
    found = con.sql(f"SELECT {', '.join(parts)} FROM {source_sql}").fetchall()[0]
    out = []
    for k, name in enumerate(fine):
        loss_s, row, value = found[3 * k:3 * k + 3]
        if loss_s is not None and float(loss_s) > DECIMAL_MAX_LOSS_S:
            out.append(LossyDecimal(name, types[name], float(loss_s), int(row), str(value)))
    return out
