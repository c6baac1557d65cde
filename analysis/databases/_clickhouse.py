"""The report's primitives on ClickHouse: the dialect, the database, and Kaplan–Meier by one array per group.

Exact where DuckDB is exact: quantiles are ``quantilesExactInclusive`` (linear interpolation between order
statistics, numpy's default: the same definition as DuckDB's ``quantile_cont``), never the sampled
``quantile`` (approximate beyond 8,192 values). Aggregates over no row are made NULL where DuckDB returns
NULL (``-OrNull``), and bucket counts are one ``countIf(x <= bound)`` per bound (inclusive, like DuckDB's
``histogram`` sums).

Kaplan–Meier (:func:`km_quantiles_by_group_sql`). The same estimator as
:mod:`llmslo.analysis.report._survival` (read its docstring for the definition and the ``1e-12`` tolerance),
computed in one pass: each group's ``(t, event)`` pairs are gathered into one array sorted by time, events
before censorings at a tie. Row ``j`` (1-based) has the descending rank ``a_j = N - j + 1``; the survival just
after event row ``j`` is ``((a_j - 1) / N) · exp(Σ ln(a_i / (a_i - 1)))`` over the censored rows ``i`` before
it (the telescoped product DuckDB's ranking method uses, with the same arithmetic), and the q-quantile is the
time of the first event row at which it falls to ``1 - q + 1e-12``. Memory: the group's pairs (16 bytes a
row), as ``quantilesExactInclusive`` holds its values too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from llmslo.analysis.databases._base import Database, Dialect, TimeRange, _quote, quantile_decimal
from llmslo.analysis.store import SUMMARY_TABLE, ClickHouseClient, ClickHouseStore

if TYPE_CHECKING:
    import polars as pl

__all__ = ["ClickHouseDialect", "ClickHouseDatabase", "km_quantiles_by_group_sql"]

KM_TOLERANCE = 1e-12
"""As :data:`llmslo.analysis.report._survival.KM_TOLERANCE` (the report checks that they agree)."""


class ClickHouseDialect(Dialect):
    """The report's primitives in ClickHouse SQL (see the module docstring)."""

    name = "clickhouse"
    inverse_cdf_shortcut = False

    def text(self, value: str) -> str:
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

    def is_finite(self, expr: str) -> str:
        return f"isFinite({expr})"

    def count_if(self, cond: str) -> str:
        return f"countIf({cond})"

    def count_where(self, expr: str, cond: str) -> str:
        return f"countIf({expr} IS NOT NULL AND ({cond}))"

    def sum_where(self, expr: str, cond: str) -> str:
        return f"coalesce(sumIf({expr}, {cond}), 0)"

    def min_of(self, expr: str) -> str:
        return f"minOrNull({expr})"

    def max_of(self, expr: str) -> str:
        return f"maxOrNull({expr})"

    def min_where(self, expr: str, cond: str) -> str:
        return f"minIfOrNull({expr}, {cond})"

    def max_where(self, expr: str, cond: str) -> str:
        return f"maxIfOrNull({expr}, {cond})"

    def exact_quantiles(self, expr: str, quantiles: Sequence[float], cond: str | None = None) -> str:
        qs = ", ".join(repr(q) for q in quantiles)
        if cond is None:
            return f"quantilesExactInclusive({qs})({expr})"
        return f"quantilesExactInclusiveIf({qs})({expr}, {cond})"

    def nearest_rank_quantiles(self, expr: str, quantiles: Sequence[float], cond: str | None = None) -> str:
        # rank ceil(n k / D) for q = k / D, in integers; the sorted values are bound once by a one-element map
        scale = 10 ** max(len(quantile_decimal(q).split(".", 1)[1]) for q in quantiles)
        ks = ", ".join(str(round(float(quantile_decimal(q)) * scale)) for q in quantiles)
        values = f"groupArrayIf({expr}, {cond})" if cond is not None else f"groupArray({expr})"
        pick = (f"arrayMap(__nr_k -> if(length(__nr_s) = 0, nan, toFloat64(__nr_s[toUInt64(intDiv(length(__nr_s) * "
                f"__nr_k + {scale - 1}, {scale}))])), [{ks}])")
        return f"arrayMap(__nr_s -> {pick}, [arraySort({values})])[1]"

    def distinct_sorted(self, expr: str) -> str:
        return f"arraySort(groupUniqArray({expr}))"

    def unnest(self, expr: str) -> str:
        return f"arrayJoin({expr})"

    def has_elements(self, column: str) -> str:
        return f"notEmpty({column})"  # ClickHouse arrays are never NULL: a summary without gaps has []

    def contains_mark(self, column: str) -> str:
        return f"(position({column}, '#') > 0)"

    def id_prefix(self, column: str) -> str:
        return f"splitByChar('#', {column})[1]"

    def presence(self, probes: Mapping[str, str], table: str) -> str:
        parts = (f"(SELECT count() > 0 FROM (SELECT 1 FROM {table} WHERE {cond} LIMIT 1)) AS {name}"
                 for name, cond in probes.items())
        return f"SELECT {', '.join(parts)}"

    def tag_imports(self, source: str, prefixes: Sequence[str]) -> str:
        listed = ", ".join(self.text(p) for p in prefixes)
        rid = "request_id"
        tag = (f"CASE WHEN {self.contains_mark(rid)} AND {self.id_prefix(rid)} IN ({listed}) "
               f"THEN {self.id_prefix(rid)} END AS __import")
        return f"(SELECT *, {tag} FROM {source}) AS __summaries"

    def distribution(self, expr: str, alias: str, bounds: Sequence[float], quantiles: Sequence[float],
                     *, with_quantiles: bool = True) -> tuple[list[str], list[str]]:
        names = [f"{alias}__mean", f"{alias}__q", f"{alias}__max", f"{alias}__count"]
        inner = [f"avgOrNull({expr}) AS {_quote(names[0])}",
                 f"{self.exact_quantiles(expr, quantiles)} AS {_quote(names[1])}",
                 f"maxOrNull({expr}) AS {_quote(names[2])}",
                 f"count({expr}) AS {_quote(names[3])}"]
        inner += [f"countIf({expr} <= {self.double(b)}) AS {_quote(f'{alias}__le{i}')}" for i, b in enumerate(bounds)]
        outer = [_quote(n) for n in names] + [_quote(f"{alias}__le{i}") for i in range(len(bounds))]
        if not with_quantiles:
            del inner[1], outer[1]
        return inner, outer


def km_quantiles_by_group_sql(source_sql: str, keys: Sequence[str], quantiles: Sequence[float],
                              labels: Sequence[str], *, success: bool = False) -> str:
    """ClickHouse SQL of the Kaplan–Meier quantiles of ``t`` (seconds) per group of ``keys`` (module docstring).

    ``source_sql`` yields the ``keys`` plus ``t`` (Float64 seconds, finite, ``>= 0``) and ``event`` (TRUE
    observed at ``t``, FALSE right-censored). One row per group, ordered by ``keys``: the keys, ``n``,
    ``n_events``, ``n_censored``, one column per label (seconds; NULL where the curve never falls to ``1 - q``)
    and ``max_censored_t`` (NULL without censoring).

    With ``success`` the source also yields ``success`` (TRUE for a successful request) and each row has, per
    label, the survivor-bias comparison of DuckDB's ``km_quantiles_by_id_sql``: ``so_<label>`` (the
    nearest-rank quantile of the successful events' times), ``s_at_<label>`` (the survival there) and
    ``gw_at_<label>`` (Greenwood's sum there), by the same arithmetic over the sorted array.
    """
    keyed = "".join(f"{k}, " for k in keys)
    compared = ""
    if success:
        scale = 10 ** max(len(quantile_decimal(q).split(".", 1)[1]) for q in quantiles)
        parts = []
        for q, label in zip(quantiles, labels, strict=True):
            k = round(float(quantile_decimal(q)) * scale)
            x = (f"if(length(__km_so) = 0, NULL, __km_so[toUInt64(intDiv(length(__km_so) * {k} + {scale - 1}, "
                 f"{scale}))])")
            upto = f"e = 1 AND t <= {x}"
            parts.append(
                f"{x} AS {_quote('so_' + label)},\n"
                f"  if(length(__km_so) = 0, NULL, "
                f"if(arrayExists((t, e, a) -> {upto} AND a = 1, __km_t, __km_e, __km_a), "
                f"0., exp(arraySum(arrayMap((t, e, a) -> if({upto} AND a > 1, ln(toFloat64(a - 1) / a), 0.), "
                f"__km_t, __km_e, __km_a))))) AS {_quote('s_at_' + label)},\n"
                f"  if(length(__km_so) = 0, NULL, arraySum(arrayMap((t, e, a) -> if({upto} AND a > 1, "
                f"1. / (toFloat64(a) * (a - 1)), 0.), __km_t, __km_e, __km_a))) AS {_quote('gw_at_' + label)}")
        compared = ",\n  " + ",\n  ".join(parts)
    flag = ", toInt8(success)" if success else ""
    so = (",\n      arrayMap(p -> p.1, arrayFilter(p -> p.2 = 1 AND p.3 = 1, __km_pairs)) AS __km_so"
          if success else "")
    so_col = "__km_so, " if success else ""
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    order = f" ORDER BY {', '.join(keys)}" if keys else ""
    picks = []
    for q, label in zip(quantiles, labels, strict=True):
        thr = f"CAST('{(1.0 - q) + KM_TOLERANCE!r}' AS DOUBLE)"
        index = f"arrayFirstIndex((e, s) -> e = 1 AND s <= {thr}, __km_e, __km_s)"
        picks.append(f"if({index} = 0, NULL, __km_t[{index}]) AS {_quote(label)}")
    return f"""SELECT {keyed}__km_n AS n, __km_ne AS n_events, __km_n - __km_ne AS n_censored,
  {', '.join(picks)},
  if(__km_n = __km_ne, NULL, arrayMax(arrayFilter((t, e) -> e = 0, __km_t, __km_e))) AS max_censored_t{compared}
FROM (
  SELECT {keyed}__km_t, __km_e, __km_n, __km_ne, {so_col}
    arrayMap(j -> __km_n - j + 1, arrayEnumerate(__km_t)) AS __km_a,
    arrayCumSum(arrayMap((a, e) -> if(e = 0 AND a > 1, ln(toFloat64(a) / (a - 1)), 0.),
                         __km_a, __km_e)) AS __km_f,
    arrayMap((a, f) -> (toFloat64(a - 1) / __km_n) * exp(f), __km_a, __km_f) AS __km_s
  FROM (
    SELECT {keyed}arrayMap(p -> p.1, __km_pairs) AS __km_t, arrayMap(p -> p.2, __km_pairs) AS __km_e,
      toInt64(length(__km_pairs)) AS __km_n, toInt64(arraySum(__km_e)) AS __km_ne{so}
    FROM (
      SELECT {keyed}arraySort(p -> (p.1, -p.2), groupArray((toFloat64(t), toInt8(event){flag}))) AS __km_pairs
      FROM ({source_sql}) AS __km_source{group}
    )
  )
){order}"""


class ClickHouseDatabase(Database):
    """A ClickHouse store (:class:`~llmslo.analysis.store.ClickHouseStore`, embedded chdb or a server).

    With a bounded ``time_range`` the summary queries read only the arrivals in it (ClickHouse prunes the
    day partitions outside it). ``owned``: :meth:`close` closes the store.
    """

    name = "clickhouse"

    def __init__(self, store: ClickHouseStore, *, owned: bool = False, time_range: TimeRange | None = None) -> None:
        self.store = store
        self.client: ClickHouseClient = store.client
        self.dialect = ClickHouseDialect()
        self._owned = owned
        if time_range is not None and time_range.bounded:
            self.summaries = f"(SELECT * FROM {SUMMARY_TABLE} WHERE {time_range.condition()})"

    @classmethod
    def open(cls, url: str, *, time_range: TimeRange | None = None) -> ClickHouseDatabase:
        """A database over the existing store at ``url`` (nothing is created)."""
        return cls(ClickHouseStore.open(url, create=False), owned=True, time_range=time_range)

    def _table(self, sql: str, params: list[Any] | None) -> pa.Table:
        if params:
            raise ValueError("the ClickHouse database takes no query parameters: write literals")
        return self.client.query_arrow(sql)

    def rows(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self._table(sql, params).to_pylist()
        return rows

    def tuples(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        table = self._table(sql, params)
        columns = [c.to_pylist() for c in table.columns]
        return list(zip(*columns, strict=True)) if columns else []

    def frame(self, sql: str) -> pl.DataFrame:
        import polars as pl

        frame = pl.from_arrow(self._table(sql, None))
        assert isinstance(frame, pl.DataFrame)
        return frame

    def tables(self) -> set[str]:
        return self.store.tables()

    def columns(self, table: str) -> set[str]:
        rows = self.client.query_arrow("SELECT name FROM system.columns WHERE database = currentDatabase() "
                                       f"AND table = {self.dialect.text(table)}")
        return {str(n) for n in rows.column("name").to_pylist()}

    def close(self) -> None:
        if self._owned:
            self.store.close()
