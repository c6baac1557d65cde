"""Which stored request summaries a report looks at, and what the store holds.

:class:`RowSelection` names the rows (models, versions, tenant classes, an arrival-time range);
:func:`selected_rows` makes every reader on the connection (the report, the anomaly scan, GPU alignment,
the rollout comparison) see only them, for the duration of a ``with`` block, by shadowing the summary
table with a temporary table of the selected rows (the store itself is never written, so a read-only
connection is enough). :func:`store_contents` says what the store holds: rows, the arrival range of the
rows that carry arrival times, the label values with their counts and every table with its row count.

Values are passed as query parameters, never spliced into SQL, so a label such as ``'); DROP TABLE x; --``
selects exactly the rows that carry it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import duckdb

from llmslo.analysis.report._provenance import placeable_rows
from llmslo.analysis.store import SUMMARY_TABLE, table_names
from llmslo.telemetry import ConfigurationError

__all__ = ["LABEL_COLUMNS", "LabelCount", "RowSelection", "SelectedRows", "StoreContents", "TableRows",
           "selected_rows", "store_contents"]

LABEL_COLUMNS: tuple[str, ...] = ("model", "version", "tenant_class")
"""Columns a :class:`RowSelection` can restrict to a set of values."""


def _values(field: str, values: Sequence[str] | None) -> tuple[str, ...] | None:
    if values is None:
        return None
    out = tuple(values)
    if not out:
        raise ConfigurationError(f"RowSelection.{field}: an empty set selects no row; use None for every value")
    if not all(isinstance(v, str) for v in out):
        raise ConfigurationError(f"RowSelection.{field}: values must be text, got {out!r}")
    return tuple(sorted(set(out)))


@dataclass(frozen=True)
class RowSelection:
    """The rows to look at: ``models``, ``versions``, ``tenant_classes`` (None: every value) and the arrival
    range ``[from_unix_s, to_unix_s)`` (Unix seconds; None: unbounded on that side).

    A time bound (or ``placeable_only``) keeps only rows that carry arrival times: rows imported from files
    without them (arrival 0, see :func:`~llmslo.analysis.report.placeable_rows`) cannot be placed in time.
    Raises :class:`~llmslo.telemetry.ConfigurationError` naming the field for an empty value set, a bound
    that is not a finite number, or ``from_unix_s >= to_unix_s``.

    Example::

        RowSelection(models=("llama",), from_unix_s=1_700_000_000.0, to_unix_s=1_700_003_600.0)
    """

    models: tuple[str, ...] | None = None
    versions: tuple[str, ...] | None = None
    tenant_classes: tuple[str, ...] | None = None
    from_unix_s: float | None = None
    to_unix_s: float | None = None
    placeable_only: bool = False

    def __post_init__(self) -> None:
        for name in ("models", "versions", "tenant_classes"):
            object.__setattr__(self, name, _values(name, getattr(self, name)))
        for name in ("from_unix_s", "to_unix_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and math.isfinite(value)):
                raise ConfigurationError(f"RowSelection.{name}: must be finite Unix seconds, got {value!r}")
        lo, hi = self.from_unix_s, self.to_unix_s
        if lo is not None and hi is not None and not lo < hi:
            raise ConfigurationError(f"RowSelection: from_unix_s ({lo!r}) must be before to_unix_s ({hi!r})")

    @property
    def everything(self) -> bool:
        """True when the selection keeps every stored row."""
        return (self.models is None and self.versions is None and self.tenant_classes is None
                and self.from_unix_s is None and self.to_unix_s is None and not self.placeable_only)

    @property
    def timed(self) -> bool:
        """True when only rows with arrival times are kept (a time bound or ``placeable_only``)."""
        return self.placeable_only or self.from_unix_s is not None or self.to_unix_s is not None

    def labels(self) -> dict[str, tuple[str, ...] | None]:
        """The value sets by column name (``model``, ``version``, ``tenant_class``)."""
        return {"model": self.models, "version": self.versions, "tenant_class": self.tenant_classes}


@dataclass(frozen=True)
class SelectedRows:
    """What :func:`selected_rows` kept: ``selected`` of the ``stored`` rows, of which ``without_arrival``
    rows (from imports without arrival times) were left out because the selection is timed."""

    selected: int
    stored: int
    without_arrival: int


def _where(con: duckdb.DuckDBPyConnection, selection: RowSelection) -> tuple[str, list[Any], int]:
    """The WHERE condition of the selection with its parameters, and how many rows it leaves out for
    lack of arrival times (0 unless timed)."""
    parts: list[str] = []
    params: list[Any] = []
    for column, values in selection.labels().items():
        if values is not None:
            parts.append(f"list_contains(?, {column})")
            params.append(list(values))
    without = 0
    if selection.timed:
        placed = placeable_rows(con)
        without = placed.left_out
        if placed.condition != "TRUE":
            parts.append(f"({placed.condition})")
    if selection.from_unix_s is not None:
        parts.append("arrival_unix_s >= ?")
        params.append(float(selection.from_unix_s))
    if selection.to_unix_s is not None:
        parts.append("arrival_unix_s < ?")
        params.append(float(selection.to_unix_s))
    return " AND ".join(parts) or "TRUE", params, without


def _count(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> int:
    rows = con.execute(sql, params).fetchall() if params else con.sql(sql).fetchall()
    return int(rows[0][0])


@contextmanager
def selected_rows(con: duckdb.DuckDBPyConnection, selection: RowSelection) -> Iterator[SelectedRows]:
    """Within the block, every query on ``con`` that names the summary table reads only the selected rows.

    A temporary table of the selected rows shadows the stored table (temporary tables come first in
    DuckDB's search path); it is dropped when the block ends, whatever happens. The store is not written:
    a read-only connection works. A selection of every row (:attr:`RowSelection.everything`) makes no
    table at all. Raises :class:`~llmslo.analysis.report.ReportDataError` (for a timed selection) when a
    stored arrival time cannot be placed.
    """
    stored = _count(con, f"SELECT count(*) FROM {SUMMARY_TABLE}")
    if selection.everything:
        yield SelectedRows(stored, stored, 0)
        return
    if SUMMARY_TABLE in _temp_tables(con):
        raise ConfigurationError("selected_rows: a selection is already active on this connection; end it first")
    where, params, without = _where(con, selection)
    (catalog,) = con.sql("SELECT current_database()").fetchall()[0]
    source = f'"{str(catalog).replace(chr(34), chr(34) * 2)}".main.{SUMMARY_TABLE}'
    con.execute(f"CREATE TEMP TABLE {SUMMARY_TABLE} AS SELECT * FROM {source} WHERE {where}", params or None)
    try:
        yield SelectedRows(_count(con, f"SELECT count(*) FROM temp.{SUMMARY_TABLE}"), stored, without)
    finally:
        con.execute(f"DROP TABLE IF EXISTS temp.{SUMMARY_TABLE}")


def _temp_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.sql("SELECT table_name FROM duckdb_tables() WHERE database_name = 'temp'").fetchall()
    return {str(r[0]) for r in rows}


@dataclass(frozen=True)
class LabelCount:
    """One value of a label column and how many stored requests carry it."""

    value: str
    requests: int


@dataclass(frozen=True)
class TableRows:
    """One table of the store and its row count."""

    table: str
    rows: int


@dataclass(frozen=True)
class StoreContents:
    """What the store holds: ``requests`` (stored summaries), ``with_arrival`` of them carrying arrival
    times, whose first and last arrival are ``arrival_from_unix_s`` / ``arrival_to_unix_s`` (Unix seconds;
    None without any), the values of each label column with their counts (``labels``, by column, most
    frequent first), and every table with its rows (by name)."""

    requests: int
    with_arrival: int
    arrival_from_unix_s: float | None
    arrival_to_unix_s: float | None
    labels: dict[str, tuple[LabelCount, ...]]
    tables: tuple[TableRows, ...]

    @property
    def without_arrival(self) -> int:
        """Rows from imports without arrival times: they fit no window or time range."""
        return self.requests - self.with_arrival


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def store_contents(con: duckdb.DuckDBPyConnection) -> StoreContents:
    """What the store open on ``con`` holds (see :class:`StoreContents`); reads only, so a read-only
    connection works. Raises :class:`~llmslo.analysis.report.ReportDataError` when a stored arrival time
    cannot be placed (:func:`~llmslo.analysis.report.stored_arrival_range`)."""
    tables = tuple(TableRows(t, _count(con, f"SELECT count(*) FROM {_quoted(t)}")) for t in sorted(table_names(con)))
    requests = _count(con, f"SELECT count(*) FROM {SUMMARY_TABLE}")
    placed = placeable_rows(con)
    lo, hi, n = con.sql(
        f"SELECT min(arrival_unix_s), max(arrival_unix_s), count(*) FROM {SUMMARY_TABLE} WHERE {placed.condition}"
    ).fetchall()[0]
    labels: dict[str, tuple[LabelCount, ...]] = {}
    for column in LABEL_COLUMNS:
        rows = con.sql(
            f"SELECT {column}, count(*) AS n FROM {SUMMARY_TABLE} GROUP BY 1 ORDER BY n DESC, 1"
        ).fetchall()
        labels[column] = tuple(LabelCount(str(v), int(k)) for v, k in rows)
    return StoreContents(requests, int(n), None if lo is None else float(lo), None if hi is None else float(hi),
                         labels, tables)
