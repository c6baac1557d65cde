"""The report's primitives on more than one engine: DuckDB (default) and ClickHouse (fleet scale).

An :class:`Engine` runs the queries of :func:`~llmslo.analysis.report.build_report` and of the anomaly scan;
its :class:`Dialect` writes their primitives (exact quantiles, SLO-aligned bucket counts, goodput under a
policy, token sums, the censoring-aware TTFT, the KS scan's inputs) in that engine's SQL. The same report
comes out of either, figure for figure (tested: exact counts, quantiles within 1e-12):

* :class:`DuckDBEngine`: a DuckDB store (``Store.con``: the report also takes the connection itself), or
  :func:`open_parquet`: hive-partitioned Parquet files read out of core under a memory limit, with partition
  pruning for a time range, or :func:`open_store_range`: a store seen through a time range;
* :class:`ClickHouseEngine`: a :class:`~llmslo.analysis.store.ClickHouseStore` (embedded ``chdb`` or a
  server over HTTP), ``quantilesExactInclusive`` where DuckDB is exact, never the sampled ``quantile``.
"""

from __future__ import annotations

from llmslo.analysis._extra import require

require("llmslo.analysis.engines", "duckdb", "pyarrow")

from llmslo.analysis.engines._base import Dialect, DuckDBEngine, Engine, TimeRange, as_engine
from llmslo.analysis.engines._clickhouse import ClickHouseDialect, ClickHouseEngine, km_quantiles_by_group_sql
from llmslo.analysis.engines._duckdb import open_parquet, open_store_range, parse_memory_limit, quiet_progress

__all__ = [
    "ClickHouseDialect",
    "ClickHouseEngine",
    "Dialect",
    "DuckDBEngine",
    "Engine",
    "TimeRange",
    "as_engine",
    "km_quantiles_by_group_sql",
    "open_parquet",
    "open_store_range",
    "parse_memory_limit",
    "quiet_progress",
]
