"""The request-summary store: schema, validation, the DuckDB ``Store`` and the sink writers.

The light door of the analysis: a server that writes summaries imports this subpackage alone, which loads
duckdb and pyarrow only (no polars, numpy or scipy; :func:`polars_schema` imports polars when called).
"""

from __future__ import annotations

from llmslo.analysis._extra import require

require("llmslo.analysis.store", "duckdb", "pyarrow")

from llmslo.analysis.store._clickhouse import (
    ClickHouseStore,
    clickhouse_meta_ddl,
    clickhouse_summary_ddl,
    clickhouse_type,
)
from llmslo.analysis.store._clickhouse_client import (
    DEFAULT_DATABASE,
    ClickHouseClient,
    ClickHouseError,
    ClickHouseUrl,
    connect_clickhouse,
    parse_clickhouse_url,
)
from llmslo.analysis.store._clickhouse_otel import (
    OTEL_REJECTED_TABLE,
    OTEL_TRACES_TABLE,
    otel_summary_select,
    otel_summary_view_sql,
    otel_summary_view_statements,
    otel_traces_ddl,
)
from llmslo.analysis.store._clickhouse_writer import ClickHouseSummaryWriter
from llmslo.analysis.store._input_types import (
    DECIMAL_EXACT_SCALE,
    DECIMAL_MAX_LOSS_S,
    LossyDecimal,
    input_conversion,
    lossy_decimals,
)
from llmslo.analysis.store._schema import (
    IMPORTS_TABLE,
    META_TABLE,
    SUMMARY_TABLE,
    arrow_schema,
    imports_ddl,
    polars_schema,
    summary_ddl,
    table_names,
)
from llmslo.analysis.store._sink_writers import DuckDBSummaryWriter, ParquetSummaryWriter, summary_table
from llmslo.analysis.store._store import IngestReport, Store, StoreError, StoreVersionError, open_store
from llmslo.analysis.store._validation import (
    ARRIVAL_MAX_AHEAD_S,
    ARRIVAL_MIN_UNIX_S,
    INTERVAL_MAX_S,
    RESERVED_COLUMNS,
    InvalidInputError,
    RowError,
)

__all__ = [
    "ARRIVAL_MAX_AHEAD_S",
    "ARRIVAL_MIN_UNIX_S",
    "ClickHouseClient",
    "ClickHouseError",
    "ClickHouseStore",
    "ClickHouseSummaryWriter",
    "ClickHouseUrl",
    "DECIMAL_EXACT_SCALE",
    "DECIMAL_MAX_LOSS_S",
    "DEFAULT_DATABASE",
    "DuckDBSummaryWriter",
    "IMPORTS_TABLE",
    "INTERVAL_MAX_S",
    "IngestReport",
    "InvalidInputError",
    "LossyDecimal",
    "META_TABLE",
    "OTEL_REJECTED_TABLE",
    "OTEL_TRACES_TABLE",
    "ParquetSummaryWriter",
    "RESERVED_COLUMNS",
    "RowError",
    "SUMMARY_TABLE",
    "Store",
    "StoreError",
    "StoreVersionError",
    "arrow_schema",
    "clickhouse_meta_ddl",
    "clickhouse_summary_ddl",
    "clickhouse_type",
    "connect_clickhouse",
    "imports_ddl",
    "input_conversion",
    "lossy_decimals",
    "open_store",
    "otel_summary_select",
    "otel_summary_view_sql",
    "otel_summary_view_statements",
    "otel_traces_ddl",
    "parse_clickhouse_url",
    "polars_schema",
    "summary_ddl",
    "summary_table",
    "table_names",
]
