"""What the report asks of a database: run SQL, list tables, and write each primitive in its dialect.

:class:`Database` runs a query and answers rows (dicts or tuples) or a polars frame; :class:`Dialect` is the SQL
of the report's primitives. The base :class:`Dialect` is DuckDB's, the report's SQL as it was written for
DuckDB (:class:`~llmslo.analysis.databases.ClickHouseDialect` overrides what ClickHouse writes differently):

* exact quantiles (:meth:`Dialect.exact_quantiles`, linear interpolation between order statistics);
* SLO-aligned bucket counts (:meth:`Dialect.distribution`: count, mean, quantiles, max, cumulative counts at
  each bound, inclusive);
* goodput under a policy (the policy's own SQL, :meth:`GoodputPolicy.good_sql`, counted by
  :meth:`Dialect.count_if`) and token sums (:meth:`Dialect.sum_where`);
* the censoring-aware TTFT (Kaplan–Meier: DuckDB ranks rows in a window, ClickHouse sorts one array per
  group; :attr:`Dialect.inverse_cdf_shortcut` says whether the main aggregate answers uncensored groups);
* the inputs of the windowed KS scan (:meth:`Database.frame` of a plain query, the same on both).

Every summary query names the table :data:`~llmslo.analysis.store.SUMMARY_TABLE` without a schema: a DuckDB
store, a DuckDB view over Parquet files and a ClickHouse database all answer to that name.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import duckdb

from llmslo.analysis.store import SUMMARY_TABLE, table_names
from llmslo.telemetry import ConfigurationError

if TYPE_CHECKING:
    import polars as pl

__all__ = ["Dialect", "DuckDBDatabase", "Database", "TimeRange", "as_database"]


@dataclass(frozen=True)
class TimeRange:
    """Arrivals in ``[from_unix_s, to_unix_s)`` (Unix seconds; None: unbounded on that side).

    Raises :class:`ConfigurationError` naming ``--from``/``--to`` for a bound that is not finite, or an empty
    range."""

    from_unix_s: float | None = None
    to_unix_s: float | None = None

    def __post_init__(self) -> None:
        for name, value in (("--from", self.from_unix_s), ("--to", self.to_unix_s)):
            if value is not None and not (math.isfinite(value) and 0 <= value <= 253_402_300_799.0):
                raise ConfigurationError(f"{name}: must be Unix seconds between 1970 and the year 9999, got {value!r}")
        lo, hi = self.from_unix_s, self.to_unix_s
        if lo is not None and hi is not None and hi <= lo:
            raise ConfigurationError(f"--to ({hi!r}) must be after --from ({lo!r}): the range holds no arrival")

    @property
    def bounded(self) -> bool:
        return self.from_unix_s is not None or self.to_unix_s is not None

    def condition(self, double: str = "CAST('{}' AS DOUBLE)") -> str:
        """SQL keeping the rows whose ``arrival_unix_s`` lies in the range (``TRUE`` when unbounded)."""
        parts = []
        if self.from_unix_s is not None:
            parts.append(f"arrival_unix_s >= {double.format(repr(float(self.from_unix_s)))}")
        if self.to_unix_s is not None:
            parts.append(f"arrival_unix_s < {double.format(repr(float(self.to_unix_s)))}")
        return " AND ".join(parts) or "TRUE"

    def holds(self, first_unix_s: float, last_unix_s: float) -> bool:
        """Whether every arrival between ``first_unix_s`` and ``last_unix_s`` (inclusive) lies in the range."""
        return ((self.from_unix_s is None or first_unix_s >= self.from_unix_s)
                and (self.to_unix_s is None or last_unix_s < self.to_unix_s))


def _day_hour(unix_s: float) -> tuple[str, int]:
    t = datetime.fromtimestamp(unix_s, tz=UTC)
    return t.strftime("%Y-%m-%d"), t.hour


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@functools.lru_cache(maxsize=256)
def quantile_decimal(q: float) -> str:
    """The shortest round-trip decimal form of the fraction ``q``, never in exponent form (``"0.99"``).

    As a SQL literal it is a DECIMAL, which DuckDB's ``quantile_disc`` turns into an index with exact
    integer arithmetic. Raises ``ValueError`` unless ``0 < q < 1``.
    """
    qf = float(q)
    if not (math.isfinite(qf) and 0.0 < qf < 1.0):
        raise ValueError(f"quantile must be strictly between 0 and 1, got {q!r}")
    text = format(Decimal(repr(qf)), "f")  # shortest round-trip decimal, never in exponent form
    whole, digits = text.split(".", 1)
    return f"{whole}.{digits.rstrip('0')}"


class Dialect:
    """The SQL of the report's primitives, as DuckDB writes it (see the module docstring).

    Expressions are SQL text over the columns of the summary rows; ``cond`` is a boolean expression;
    quantiles are fractions in (0, 1); bounds are seconds.
    """

    name = "duckdb"
    inverse_cdf_shortcut = True
    """Whether the main aggregate answers the Kaplan–Meier TTFT of groups without censoring (DuckDB's exact
    ``quantile_disc``); otherwise every admitted group goes through :meth:`Database` 's Kaplan–Meier query."""

    def double(self, value: float) -> str:
        """An exact DOUBLE literal (parsed from the shortest round-trip text)."""
        return f"CAST('{value!r}' AS DOUBLE)"

    def is_finite(self, expr: str) -> str:
        return f"isfinite({expr})"

    def count_if(self, cond: str) -> str:
        """Rows where ``cond`` holds (0, never NULL)."""
        return f"coalesce(count_if({cond}), 0)"

    def count_where(self, expr: str, cond: str) -> str:
        """Non-null values of ``expr`` among the rows where ``cond`` holds."""
        return f"count({expr}) FILTER (WHERE {cond})"

    def sum_where(self, expr: str, cond: str) -> str:
        """Sum of ``expr`` over the rows where ``cond`` holds (0 when none)."""
        return f"coalesce(sum(CASE WHEN {cond} THEN {expr} END), 0)"

    def min_of(self, expr: str) -> str:
        """Smallest ``expr`` of a group, NULL when it has no value."""
        return f"min({expr})"

    def max_of(self, expr: str) -> str:
        """Largest ``expr`` of a group, NULL when it has no value."""
        return f"max({expr})"

    def min_where(self, expr: str, cond: str) -> str:
        """Smallest ``expr`` where ``cond`` holds, NULL when no row does."""
        return f"min({expr}) FILTER (WHERE {cond})"

    def max_where(self, expr: str, cond: str) -> str:
        """Largest ``expr`` where ``cond`` holds, NULL when no row does."""
        return f"max({expr}) FILTER (WHERE {cond})"

    def exact_quantiles(self, expr: str, quantiles: Sequence[float], cond: str | None = None) -> str:
        """A list of exact quantiles of ``expr`` (linear interpolation, numpy's default), NULL or NaNs without
        values; over the rows where ``cond`` holds when given."""
        qs = ", ".join(repr(q) for q in quantiles)
        where = f" FILTER (WHERE {cond})" if cond is not None else ""
        return f"quantile_cont({expr}, [{qs}]){where}"

    def nearest_rank_quantiles(self, expr: str, quantiles: Sequence[float], cond: str | None = None) -> str:
        """A list of nearest-rank quantiles of ``expr`` (docs/definitions.md, "Quantiles"): for ``n`` values and
        each ``q``, the value of rank ``ceil(n q)`` in ascending order (the inverse empirical distribution
        function, always an observed value; the rank is computed in exact integer arithmetic). NULL or NaNs
        without values; over the rows where ``cond`` holds when given."""
        qs = ", ".join(quantile_decimal(q) for q in quantiles)  # DECIMAL fractions: an exact rank
        where = f" FILTER (WHERE {cond})" if cond is not None else ""
        return f"quantile_disc({expr}, [{qs}]){where}"

    def distinct_sorted(self, expr: str) -> str:
        """The sorted distinct non-null values of ``expr`` in a group, as a list."""
        return f"list(DISTINCT {expr} ORDER BY {expr}) FILTER (WHERE {expr} IS NOT NULL)"

    def unnest(self, expr: str) -> str:
        """One row per element of the list ``expr``."""
        return f"unnest({expr})"

    def has_elements(self, column: str) -> str:
        """TRUE for a row whose list column ``column`` is recorded (DuckDB: not NULL)."""
        return f"{column} IS NOT NULL"

    def contains_mark(self, column: str) -> str:
        """TRUE when the text ``column`` holds a ``#`` (ids of imported rows: ``<prefix>#<n>``)."""
        return f"contains({column}, '#')"

    def id_prefix(self, column: str) -> str:
        """The part of ``column`` before its first ``#``."""
        return f"split_part({column}, '#', 1)"

    def text(self, value: str) -> str:
        """A string literal."""
        return "'" + value.replace("'", "''") + "'"

    def presence(self, probes: Mapping[str, str], table: str) -> str:
        """One row of booleans: for each probe (name → condition), does a row of ``table`` satisfy it?"""
        parts = (f"EXISTS (SELECT 1 FROM {table} WHERE {cond}) AS {name}" for name, cond in probes.items())
        return f"SELECT {', '.join(parts)}"

    def tag_imports(self, source: str, prefixes: Sequence[str]) -> str:
        """``source`` (a relation ``__summaries``) plus the column ``__import``: the ``request_id`` prefix of a
        row whose import has no arrival times (one of ``prefixes``), else NULL.

        DuckDB joins with the (few) prefixes; the guard spares ``split_part`` on ids without ``#`` (live rows),
        about half the join's cost on 10M rows.
        """
        values = ", ".join(f"({self.text(p)})" for p in prefixes)
        prefix = (f"CASE WHEN {self.contains_mark('__summaries.request_id')} THEN "
                  f"{self.id_prefix('__summaries.request_id')} END")
        return f"{source} LEFT JOIN (VALUES {values}) AS __imports(__import) ON {prefix} = __imports.__import"

    def distribution(self, expr: str, alias: str, bounds: Sequence[float], quantiles: Sequence[float],
                     *, with_quantiles: bool = True) -> tuple[list[str], list[str]]:
        """Aggregates (``inner``, with aliases) and their projection (``outer``) for one interval: mean,
        exact quantiles (unless ``with_quantiles`` is false), max, count and cumulative bucket counts
        ``<alias>__le<i>`` (values ``<= bound i``).

        DuckDB: one ``histogram(expr, bounds)`` (a MAP bound → values in ``(previous bound, bound]``, ``inf``
        for the rest), summed up in the projection: the same integers as ``count(expr)`` and one
        ``count_if(expr <= bound)`` per bound for finite values (the store holds no others), for less
        (DuckDB 2.0, 10M rows: about 0.8 s of CPU against 1.25 s for the five intervals), and returned as
        plain integers (a MAP costs more to convert to Python than the query to run, with many groups).
        """
        inner = [f"avg({expr}) AS {_quote(alias + '__mean')}",
                 f"{self.exact_quantiles(expr, quantiles)} AS {_quote(alias + '__q')}",
                 f"max({expr}) AS {_quote(alias + '__max')}"]
        outer = [_quote(alias + "__mean"), _quote(alias + "__q"), _quote(alias + "__max")]
        if not with_quantiles:
            del inner[1], outer[1]
        hist = _quote(f"{alias}__hist")
        inner.append(f"histogram({expr}, [{', '.join(self.double(b) for b in bounds)}]) AS {hist}")
        previous = ""
        for i, b in enumerate(bounds):
            name = _quote(f"{alias}__le{i}")
            outer.append(f"{previous}coalesce({hist}[{self.double(b)}], 0) AS {name}")
            previous = f"{name} + "
        outer.append(f"coalesce(list_sum(map_values({hist})), 0) AS {_quote(f'{alias}__count')}")
        return inner, outer


class Database(ABC):
    """Where the request summaries are, and how to query them: see the module docstring.

    :attr:`summaries` is the relation the summary queries read: the table, or a subquery of it restricted
    to a time range.
    """

    name: str
    dialect: Dialect
    summaries: str = SUMMARY_TABLE
    holistic_budget_bytes: int | None = None
    """Memory the exact quantiles of one query may hold (bytes): with a budget they run apart from the main
    aggregate, packed into queries that fit it (DuckDB under a memory limit: it spills sorts and hash tables,
    not the values of an exact quantile). None: they run inside the main aggregate."""
    empty_lists: frozenset[str] = frozenset()
    """List columns known to hold no element in any row (Parquet: from the files' statistics, read with their
    schemas): the report does not scan them to find out."""

    @abstractmethod
    def rows(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        """Every row of ``sql`` as a dict (column name → Python value); ``params`` bind ``?`` (DuckDB only)."""

    @abstractmethod
    def tuples(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """Every row of ``sql`` as a tuple."""

    @abstractmethod
    def frame(self, sql: str) -> pl.DataFrame:
        """The result of ``sql`` as a polars frame."""

    @abstractmethod
    def tables(self) -> set[str]:
        """Names of the tables (and views) the queries can read."""

    @abstractmethod
    def columns(self, table: str) -> set[str]:
        """Column names of ``table``."""

    def query_progress(self) -> float | None:
        """Percent done of the query running now (from another thread), None when the database cannot tell."""
        return None

    def close(self) -> None:  # noqa: B027 - most databases hold nothing of their own to release
        """Release what the database opened itself (not a connection it was given)."""


class DuckDBDatabase(Database):
    """A DuckDB connection: a store (:class:`~llmslo.analysis.store.Store` ``.con``) or a view over Parquet files.

    Queries go through ``con.sql`` exactly as the report always sent them, so any object with DuckDB's
    ``sql`` method (a wrapper that records or times queries) can stand in for the connection. ``owned``: the
    database closes the connection in :meth:`close`.
    """

    name = "duckdb"

    def __init__(self, con: duckdb.DuckDBPyConnection, *, owned: bool = False, dialect: Dialect | None = None,
                 holistic_budget_bytes: int | None = None) -> None:
        self.con = con
        self.dialect = dialect or Dialect()
        self._owned = owned
        self.holistic_budget_bytes = holistic_budget_bytes

    def _rel(self, sql: str, params: list[Any] | None) -> duckdb.DuckDBPyRelation:
        return self.con.sql(sql, params=params) if params is not None else self.con.sql(sql)

    def rows(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        rel = self._rel(sql, params)
        names = list(rel.columns)
        return [dict(zip(names, r, strict=True)) for r in rel.fetchall()]

    def tuples(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._rel(sql, params).fetchall()]

    def frame(self, sql: str) -> pl.DataFrame:
        frame: pl.DataFrame = self.con.sql(sql).pl()
        return frame

    def tables(self) -> set[str]:
        return table_names(self.con)

    def columns(self, table: str) -> set[str]:
        rows = self.con.sql("SELECT column_name FROM duckdb_columns() WHERE table_name = ?", params=[table]).fetchall()
        return {str(r[0]) for r in rows}

    def query_progress(self) -> float | None:
        progress = getattr(self.con, "query_progress", None)
        if progress is None:
            return None
        try:
            value = float(progress())
        except duckdb.Error:
            return None
        return value if value >= 0 else None

    def close(self) -> None:
        if self._owned:
            self.con.close()


def as_database(source: duckdb.DuckDBPyConnection | Database) -> Database:
    """``source`` as a :class:`Database`: a database as it is, anything else as a DuckDB connection."""
    return source if isinstance(source, Database) else DuckDBDatabase(source)
