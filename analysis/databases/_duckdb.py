"""DuckDB databases beyond one store file: partitioned Parquet out of core, and a store seen through a time range.

:func:`open_parquet` reads the files that :class:`~llmslo.analysis.store.ParquetSummaryWriter` writes
(hive-partitioned, ``date=YYYY-MM-DD/hour=HH/*.parquet`` by UTC arrival) lazily: an in-memory DuckDB with a
view named :data:`~llmslo.analysis.store.SUMMARY_TABLE` over ``read_parquet``, so that the report, the
anomaly scan and every other query run on it unchanged. DuckDB streams the files; with ``memory_limit`` it
keeps its own memory under that limit and spills what does not fit (sorts, hash tables) to a temporary
folder. A time range (``from_unix_s``, ``to_unix_s``: arrivals in ``[from, to)``) prunes the partitions
outside it from their folder names, before any file is opened (only the files kept are handed to
``read_parquet``), and then filters the rows exactly: the rows of the files whose footer statistics do not put
every arrival inside the range (a file inside it is read whole, without reading its arrival column for the
filter).

:func:`open_store_range` shows a DuckDB store file the same way, restricted to a time range (no pruning:
one file).

The rows are read as written: the sink writes summaries that the telemetry validated, and the report checks
what it needs of them (arrival times it can place). Files from elsewhere should go through ``llmslo
ingest``, which checks every rule. Each file's schema is checked against the contract when opened (a
missing required column or a wrong type is an error naming the file): its column types are read by the rule
ingest follows (:func:`~llmslo.analysis.store.input_conversion`; e.g. an exact decimal becomes a float when
that loses nothing beyond a microsecond), except types whose values would each need checking (text read as
numbers), which are left to ingest.
"""

from __future__ import annotations

import glob as globbing
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from llmslo.analysis.databases._base import DuckDBDatabase, TimeRange, _day_hour
from llmslo.analysis.store import (
    IMPORTS_TABLE,
    META_TABLE,
    SUMMARY_TABLE,
    StoreError,
    input_conversion,
    lossy_decimals,
    table_names,
)
from llmslo.telemetry import COLUMNS, SCHEMA_VERSION, ConfigurationError

__all__ = ["open_parquet", "open_store_range", "parse_memory_limit", "quiet_progress"]

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_memory_limit(text: str) -> int:
    """Bytes of a memory limit written like ``4GB``, ``512MiB`` or ``2.5GB`` (decimal and binary units).

    Raises :class:`ConfigurationError` naming ``--memory-limit`` for anything else, or below 64 MB (DuckDB
    needs that much to run at all).
    """
    raw = text.strip().upper().replace(" ", "")
    number = raw.rstrip("KMGTIB")
    unit = raw[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if unit not in _UNITS or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"--memory-limit: {text!r} is no size; write e.g. 4GB, 512MB or 2GiB")
    size = int(value * _UNITS[unit])
    if size < 64 * 10**6:
        raise ConfigurationError(f"--memory-limit: {text!r} is below 64MB, too little for DuckDB to run")
    return size


HOLISTIC_SHARE = 0.5
"""Share of the memory limit that the exact quantiles of one query may hold (the rest: DuckDB's scans, hash
tables and buffers, which it spills)."""


def _budget(memory_limit: int | None) -> int | None:
    return None if memory_limit is None else int(memory_limit * HOLISTIC_SHARE)


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _connect(memory_limit: int | None, temp_directory: str | None) -> duckdb.DuckDBPyConnection:
    config: dict[str, str | bool | int | float | list[str]] = {"preserve_insertion_order": False}
    if memory_limit is not None:
        config["memory_limit"] = f"{memory_limit // 2**20}MiB"
    config["temp_directory"] = temp_directory or tempfile.gettempdir()
    con = duckdb.connect(":memory:", config=config)
    quiet_progress(con)
    return con


def quiet_progress(con: duckdb.DuckDBPyConnection) -> None:
    """Keep the progress of long queries readable (:meth:`DuckDBDatabase.query_progress`) but never printed by
    DuckDB itself, which would mix its bar with the report on standard output."""
    con.execute("SET enable_progress_bar = true")
    con.execute("SET enable_progress_bar_print = false")


def _files(source: str) -> tuple[str, list[str]]:  # (pattern, files)
    """The glob of ``source`` (a folder stands for every Parquet file under it) and the files it matches."""
    pattern = str(Path(source) / "**" / "*.parquet") if Path(source).is_dir() else source
    files = sorted(f for f in globbing.glob(pattern, recursive=True) if os.path.isfile(f))
    if not files:
        raise StoreError(f"--source: no Parquet file matches {pattern!r}: give a folder or a pattern such as "
                         "'DIR/**/*.parquet'")
    return pattern, files


def _hive(files: list[str]) -> bool:
    """Whether every file lies under ``date=…/hour=…`` folders (then they are pruned by those)."""
    return all("date=" in Path(f).parent.parent.name and "hour=" in Path(f).parent.name for f in files)


@dataclass(frozen=True)
class _Footer:
    """What a file's footer says: its columns and their types, and its list columns without any element."""

    types: dict[str, str]
    """Each column's DuckDB type, as DuckDB reads the file."""
    empty_lists: set[str]
    arrivals: tuple[float, float] | None = None
    """The first and last ``arrival_unix_s`` by the statistics of every row group, when they all have them and
    count no null (Unix seconds); None when they prove nothing."""

    @property
    def names(self) -> set[str]:
        """The file's column names."""
        return set(self.types)


def _chunks(meta: pq.FileMetaData, name: str) -> list[list[pq.ColumnChunkMetaData]]:
    """The column chunks of the column ``name`` (its leaves: one for a scalar, the element of a list), one list per
    row group of the file."""
    groups = (meta.row_group(g) for g in range(meta.num_row_groups))
    return [[c for c in (group.column(i) for i in range(group.num_columns)) if c.path_in_schema.split(".")[0] == name]
            for group in groups]


def _empty_lists(meta: pq.FileMetaData, schema: pa.Schema) -> set[str]:
    """The list columns of a file whose every row group's statistics count as many nulls as leaf slots: no
    element anywhere (a row group without statistics proves nothing)."""
    lists = {f.name for f in schema if pa.types.is_list(f.type) or pa.types.is_large_list(f.type)}
    return {name for name in lists if all(
        c.statistics is not None and c.statistics.has_null_count and c.statistics.null_count == c.num_values
        for group in _chunks(meta, name) for c in group)}


def _arrivals(meta: pq.FileMetaData) -> tuple[float, float] | None:
    """``(min, max)`` of ``arrival_unix_s`` over the row groups of a file by their statistics; None when a row
    group has no such statistics, counts a null, or the file has no row group."""
    bounds = []
    for group in _chunks(meta, "arrival_unix_s"):
        stats = group[0].statistics if len(group) == 1 else None
        if stats is None or not stats.has_min_max or not stats.has_null_count or stats.null_count:
            return None
        bounds.append((float(stats.min), float(stats.max)))
    return (min(lo for lo, _ in bounds), max(hi for _, hi in bounds)) if bounds else None


def _duckdb_types(con: duckdb.DuckDBPyConnection, path: str, schema: pa.Schema,
                  known: dict[pa.Schema, dict[str, str]]) -> dict[str, str]:
    """Each column's DuckDB type as DuckDB reads ``path`` (whose Arrow schema is ``schema``): asked of DuckDB once
    per schema (``known`` keeps the answers; the files of a sink share one schema)."""
    key = schema.remove_metadata()
    if key not in known:
        described = con.sql(f"SELECT * FROM read_parquet({_text(path)}, hive_partitioning = false) LIMIT 0")
        known[key] = {name: str(t) for name, t in zip(described.columns, described.types, strict=True)}
    return known[key]


def _check_schema(con: duckdb.DuckDBPyConnection, path: str, known: dict[pa.Schema, dict[str, str]]) -> _Footer:
    """The column types of ``path`` and its list columns known empty; raises :class:`StoreError` naming it when
    a required contract column is missing, or a column's type is not read as the contract's by
    :func:`~llmslo.analysis.store.input_conversion` (the rule ``llmslo ingest`` follows: a type whose values
    would each need checking is left to ingest), or is an exact decimal a float cannot hold to a microsecond
    (:func:`~llmslo.analysis.store.lossy_decimals`, which reads those columns; otherwise only the footer is).
    ``known``: the DuckDB types of the schemas met so far (:func:`_duckdb_types`)."""
    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
        types = _duckdb_types(con, path, schema, known)
    except (pa.ArrowInvalid, OSError, duckdb.Error) as exc:
        raise StoreError(f"{path}: not a readable Parquet file ({exc})") from None
    problems = []
    for c in COLUMNS:
        if c.name not in types:
            if c.required:
                problems.append(f"required column {c.name!r} is missing")
        elif input_conversion(c, types[c.name]) not in ("cast", "narrow"):
            problems.append(f"column {c.name!r} is {types[c.name]}, the contract says {c.kind}")
    if problems:
        raise StoreError(f"{path}: not request summaries of schema version {SCHEMA_VERSION}: {'; '.join(problems)} "
                         "(write the files with ParquetSummaryWriter, or ingest them with `llmslo ingest`)")
    numbered = f"read_parquet({_text(path)}, hive_partitioning = false, file_row_number = true)"
    lossy = lossy_decimals(con, numbered, "(file_row_number + 1)", types)
    if lossy:
        raise StoreError(f"{path}: column {'; column '.join(d.message() for d in lossy)}")
    return _Footer(types, _empty_lists(meta, schema), _arrivals(meta))


def _columns_sql(present: set[str], read: bool = True) -> str:
    """The contract's columns in storage order, typed as the DuckDB store types them; a column some file lacks
    reads as its default (NULL, or e.g. 0 for ``proposed_tokens``). Without ``read``, typed NULLs only."""
    duck = {"str": "VARCHAR", "float": "DOUBLE", "int": "BIGINT", "float_list": "DOUBLE[]"}
    out = []
    for c in COLUMNS:
        default = ("NULL" if c.default is None else _text(c.default) if isinstance(c.default, str)
                   else repr(c.default))
        value = f"CAST({default} AS {duck[c.kind]})"
        if c.name in present and read:
            value = f"CAST({c.name} AS {duck[c.kind]})" if c.default is None else \
                f"coalesce(CAST({c.name} AS {duck[c.kind]}), {value})"
        out.append(f"{value} AS {c.name}")
    return ", ".join(out)


def _read_sql(files: list[tuple[str, _Footer]], where: str | None) -> str:
    """The contract's columns (:func:`_columns_sql`) of ``files`` (paths and their footers), one ``read_parquet``,
    keeping the rows where ``where`` holds (None: every row)."""
    present = set().union(*(f.names for _, f in files))
    options = ", hive_partitioning = false"
    if any(f.types != files[0][1].types for _, f in files):
        # older files without some optional column, or columns of other types (e.g. DOUBLE and DECIMAL): read by
        # name, each column as the type that holds every file's values (else DuckDB casts every file to the
        # first one's types, and a DOUBLE read as DECIMAL(24,3) loses its microseconds)
        options += ", union_by_name = true"
    listed = "[" + ", ".join(_text(p) for p, _ in files) + "]"
    return (f"SELECT {_columns_sql(present)} FROM read_parquet({listed}{options})"
            + (f" WHERE {where}" if where is not None else ""))


def _in_range(path: str, window: TimeRange) -> bool:
    """Whether the hive partition of ``path`` (``date=…/hour=…``) may hold an arrival of ``window``."""
    parent = Path(path).parent
    try:
        day = parent.parent.name.split("=", 1)[1]
        hour = int(parent.name.split("=", 1)[1])
    except (IndexError, ValueError):
        return True
    key = (day, hour)
    if window.from_unix_s is not None and key < _day_hour(window.from_unix_s):
        return False
    return not (window.to_unix_s is not None and key > _day_hour(window.to_unix_s))


def open_parquet(
    source: str,
    *,
    memory_limit: int | None = None,
    time_range: TimeRange | None = None,
    temp_directory: str | None = None,
) -> DuckDBDatabase:
    """A database over the request-summary Parquet files of ``source`` (a folder, or a glob such as
    ``'DIR/**/*.parquet'``), read lazily: see the module docstring.

    ``memory_limit`` (bytes) is DuckDB's own limit (it spills to ``temp_directory``, default the system's
    temporary folder); ``time_range`` keeps the arrivals in it. Partitions outside the range are pruned from
    their folder names: their files are never opened (not even their footers). The footers of the files
    kept are read first: raises :class:`StoreError` when nothing matches or a file's schema is not the
    contract's.
    """
    _, files = _files(source)
    window = time_range or TimeRange()
    hive = _hive(files)
    kept = [f for f in files if _in_range(f, window)] if hive else files
    con = _connect(memory_limit, temp_directory)
    try:
        known: dict[pa.Schema, dict[str, str]] = {}
        footers = [_check_schema(con, path, known) for path in kept]
    except BaseException:
        con.close()
        raise
    # a list column is empty everywhere when every file lacks it or holds no element of it
    empty_lists = frozenset(c.name for c in COLUMNS if c.kind == "float_list" and footers and all(
        c.name not in f.names or c.name in f.empty_lists for f in footers))
    # a file whose statistics put every arrival inside the range is read without the row filter (which would
    # read the arrival column of every row, and keep them all)
    inside = [not window.bounded or (f.arrivals is not None and window.holds(*f.arrivals)) for f in footers]
    try:
        if kept:
            # the partitions are pruned here, from the folder names: DuckDB reads the files kept, whose rows
            # hold every column (the folder names add nothing to read)
            parts = [_read_sql([(p, f) for p, f, i in zip(kept, footers, inside, strict=True) if i == whole],
                               None if whole else window.condition())
                     for whole in (True, False) if whole in inside]
            view = " UNION ALL ".join(parts)
        else:
            view = f"SELECT {_columns_sql(set(), False)} FROM (SELECT 1) AS nothing WHERE FALSE"
        con.execute(f"CREATE TEMP VIEW {SUMMARY_TABLE} AS {view}")
        _empty_meta(con)
    except duckdb.Error as exc:
        con.close()
        raise StoreError(f"--source {source}: cannot read the files: {exc}") from None
    database = DuckDBDatabase(con, owned=True, holistic_budget_bytes=_budget(memory_limit))
    database.empty_lists = empty_lists
    return database


def _empty_meta(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(f"CREATE TEMP TABLE {META_TABLE} (key VARCHAR, value VARCHAR)")
    con.execute(f"INSERT INTO {META_TABLE} VALUES ('schema_version', '{SCHEMA_VERSION}')")


def open_store_range(
    path: str | os.PathLike[str],
    time_range: TimeRange,
    *,
    memory_limit: int | None = None,
    temp_directory: str | None = None,
) -> DuckDBDatabase:
    """A database over the DuckDB store at ``path`` (opened read-only) showing only the arrivals in ``time_range``.

    The store's provenance and metadata tables are copied (they are small); the summaries are a view. Raises
    :class:`StoreError` when ``path`` is no store.
    """
    p = Path(path)
    if not p.is_file():
        raise StoreError(f"no store at {p}: create one with `llmslo ingest FILES --db {p}`")
    con = _connect(memory_limit, temp_directory)
    try:
        con.execute(f"ATTACH {_text(str(p))} AS llmslo_store (READ_ONLY)")
        stored = {str(r[0]) for r in con.sql(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'llmslo_store'").fetchall()}
        if SUMMARY_TABLE not in stored or META_TABLE not in stored:
            raise StoreError(f"{p} is a DuckDB file but not an llmslo store")
        con.execute(f"CREATE TEMP VIEW {SUMMARY_TABLE} AS SELECT * FROM llmslo_store.{SUMMARY_TABLE} "
                    f"WHERE {time_range.condition()}")
        for table in (META_TABLE, IMPORTS_TABLE):
            if table in stored:
                con.execute(f"CREATE TEMP TABLE {table} AS SELECT * FROM llmslo_store.{table}")
        assert META_TABLE in table_names(con)
    except duckdb.Error as exc:
        con.close()
        raise StoreError(f"cannot open store {p}: {exc}") from None
    except BaseException:
        con.close()
        raise
    return DuckDBDatabase(con, owned=True, holistic_budget_bytes=_budget(memory_limit))

