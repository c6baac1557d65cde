"""Storage forms of the request-summary contract: DuckDB DDL and Arrow/polars schemas.

Everything here is derived from :data:`llmslo.telemetry.COLUMNS`; nothing restates a column.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from llmslo.telemetry import COLUMNS, SCHEMA_VERSION, Column

if TYPE_CHECKING:
    import polars as pl

SUMMARY_TABLE = "request_summaries"
META_TABLE = "llmslo_meta"
IMPORTS_TABLE = "llmslo_imports"
"""One row per imported file (``llmslo import``): where it came from and what its rows can support."""

_DUCKDB_TYPES = {"str": "VARCHAR", "float": "DOUBLE", "int": "BIGINT", "float_list": "DOUBLE[]"}
_ARROW_TYPES = {
    "str": pa.string(),
    "float": pa.float64(),
    "int": pa.int64(),
    "float_list": pa.list_(pa.float64()),
}


def duckdb_type(column: Column) -> str:
    """The DuckDB type of a contract column."""
    return _DUCKDB_TYPES[column.kind]


COLUMNS_ADDED_SINCE: dict[int, tuple[str, ...]] = {1: ("backend",)}
"""The columns each older schema version lacks (all optional, null in the rows stored before): a store of such a
version is upgraded when it is opened by adding them."""


def columns_added_since(version: int | None) -> tuple[Column, ...] | None:
    """The columns a store of schema ``version`` lacks, or None when it cannot be upgraded (unknown version)."""
    names = COLUMNS_ADDED_SINCE.get(version) if version is not None else None
    if names is None:
        return None
    by_name = {c.name: c for c in COLUMNS}
    return tuple(by_name[n] for n in names)


def summary_ddl(table: str = SUMMARY_TABLE) -> str:
    """``CREATE TABLE`` statement of the summary table (no key index: uniqueness is enforced on ingest)."""
    cols = ",\n  ".join(
        f"{c.name} {duckdb_type(c)}{'' if c.nullable else ' NOT NULL'}" for c in COLUMNS
    )
    return f"CREATE TABLE IF NOT EXISTS {table} (\n  {cols}\n)"


def arrow_schema() -> pa.Schema:
    """The Arrow schema of a request-summary table, with each column's doc as field metadata."""
    return pa.schema(
        [
            pa.field(c.name, _ARROW_TYPES[c.kind], nullable=c.nullable, metadata={"doc": c.doc})
            for c in COLUMNS
        ],
        metadata={"llmslo_schema_version": str(SCHEMA_VERSION)},
    )


def polars_schema() -> pl.Schema:
    """The polars schema of a request-summary frame (imports polars: the store itself does not need it)."""
    import polars as pl

    types: dict[str, pl.DataType] = {
        "str": pl.String(),
        "float": pl.Float64(),
        "int": pl.Int64(),
        "float_list": pl.List(pl.Float64()),
    }
    return pl.Schema({c.name: types[c.kind] for c in COLUMNS})


def table_names(con: duckdb.DuckDBPyConnection) -> set[str]:
    """Names of the tables in the database open on ``con`` (what a store holds)."""
    return {str(r[0]) for r in con.sql("SELECT table_name FROM duckdb_tables()").fetchall()}


def imports_ddl(table: str = IMPORTS_TABLE) -> str:
    """``CREATE TABLE`` statement of the import provenance table, keyed by the file's content hash.

    ``content_sha256`` is the SHA-256 of the file's bytes (hex), so the same file imported again, under any
    name, replaces its record; ``arrivals_available`` is false when the file records no request start times
    (its rows fit no window, and their per-second rates come from ``run_duration_s`` or are null);
    ``conversions`` are the sentences of the
    import report; ``imported_unix_s`` is the wall-clock time of the import. ``id_prefix`` is the part before
    ``#`` of every ``request_id`` the import wrote (join rows to their import on
    ``split_part(request_id, '#', 1) = id_prefix``); ``run_duration_s`` is the run's duration in seconds as
    the file recorded it (NULL where it records none) and ``run_duration_note`` says where it came from or
    why it is absent. These three were added later: a store created before lacks them until the next
    import adds them (``ALTER TABLE ... ADD COLUMN IF NOT EXISTS``).
    """
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (\n"
        "  content_sha256 VARCHAR PRIMARY KEY,\n"
        "  source VARCHAR NOT NULL,\n"
        "  kind VARCHAR NOT NULL,\n"
        "  tool VARCHAR NOT NULL,\n"
        "  rows_read BIGINT NOT NULL,\n"
        "  rows_imported BIGINT NOT NULL,\n"
        "  rows_inserted BIGINT NOT NULL,\n"
        "  rows_already_stored BIGINT NOT NULL,\n"
        "  arrivals_available BOOLEAN NOT NULL,\n"
        "  arrival_note VARCHAR NOT NULL,\n"
        "  conversions VARCHAR[] NOT NULL,\n"
        "  missing_fields VARCHAR[] NOT NULL,\n"
        "  finish_reasons MAP(VARCHAR, BIGINT) NOT NULL,\n"
        "  imported_unix_s DOUBLE NOT NULL,\n"
        "  id_prefix VARCHAR,\n"
        "  run_duration_s DOUBLE,\n"
        "  run_duration_note VARCHAR\n"
        ")"
    )
