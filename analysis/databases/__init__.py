"""The report's primitives on more than one database: DuckDB (default) and ClickHouse (fleet scale).

A :class:`Database` runs the queries of :func:`~llmslo.analysis.report.build_report` and of the anomaly scan;
its :class:`Dialect` writes their primitives (exact quantiles, SLO-aligned bucket counts, goodput under a
policy, token sums, the censoring-aware TTFT, the KS scan's inputs) in that database's SQL. The same report
comes out of either, figure for figure (tested: exact counts, quantiles within 1e-12):

* :class:`DuckDBDatabase`: a DuckDB store (``Store.con``: the report also takes the connection itself), or
  :func:`open_parquet`: hive-partitioned Parquet files read out of core under a memory limit, with partition
  pruning for a time range, or :func:`open_store_range`: a store seen through a time range;
* :class:`ClickHouseDatabase`: a :class:`~llmslo.analysis.store.ClickHouseStore` (embedded ``chdb`` or a
  server over HTTP), ``quantilesExactInclusive`` where DuckDB is exact, never the sampled ``quantile``.
"""

from __future__ import annotations

from llmslo.analysis._extra import require

require("llmslo.analysis.databases", "duckdb", "pyarrow")

from llmslo.analysis.databases._base import Database, Dialect, DuckDBDatabase, TimeRange, as_database
from llmslo.analysis.databases._clickhouse import ClickHouseDatabase, ClickHouseDialect, km_quantiles_by_group_sql
from llmslo.analysis.databases._duckdb import open_parquet, open_store_range, parse_memory_limit, quiet_progress

__all__ = [
    "ClickHouseDialect",
    "ClickHouseDatabase",
    "Dialect",
    "DuckDBDatabase",
    "Database",
    "TimeRange",
    "as_database",
    "km_quantiles_by_group_sql",
    "open_parquet",
    "open_store_range",
    "parse_memory_limit",
    "quiet_progress",
]
