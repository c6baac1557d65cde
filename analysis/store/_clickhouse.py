"""The request-summary store in ClickHouse: the fleet-scale form of :class:`~llmslo.analysis.store.Store`.

Tables (in the URL's database), derived from :data:`llmslo.telemetry.COLUMNS` like the DuckDB DDL:

* :data:`SUMMARY_TABLE`: ``MergeTree``, ``PARTITION BY`` the UTC day of ``arrival_unix_s``, ``ORDER BY (model,
  version, arrival_unix_s)``; the identity columns are ``LowCardinality``. ClickHouse arrays cannot be NULL:
  a summary without ``itl_s`` is stored with an empty list (no gap either way, so every figure is the same);
* :data:`META_TABLE`: the schema version, as in the DuckDB store.

Ingest validates every row with exactly the DuckDB store's rules, by loading the input into a DuckDB
staging store first (same errors, ``--skip-invalid`` and ``.rejected.jsonl`` files), so an invalid input writes
nothing to ClickHouse. The valid rows then go to ClickHouse in Arrow batches of :data:`CHUNK_ROWS`.

Idempotency on ``request_id`` is a check at ingest, not a ``ReplacingMergeTree``: before each batch is
inserted, the stored rows with the batch's ids are read from the days (partitions) the batch's arrivals fall
in; a row whose id is stored with the same content is skipped and counted as already stored, one stored
with other content is skipped and counted as conflicting (the stored row is kept), as the DuckDB store
does. A ``ReplacingMergeTree`` removes duplicates only when it merges parts, some time after the insert and
only within a partition, so every report would have to read ``FINAL`` (slower, and counts are wrong until
the merge), and it would silently keep one of two different rows instead of reporting the conflict. The
check reads only the partitions of the batch's days, so its cost follows the input, not the store; a row
that reuses a stored ``request_id`` on another day is not looked for (a global lookup would read every
stored id: the table is ordered by model, version and arrival). A batch is inserted in one statement; an
ingest of several batches that fails midway (the server went away) leaves the earlier batches stored, and
running it again completes it: the stored rows are skipped.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmslo.analysis.store._clickhouse_client import ClickHouseClient, ClickHouseUrl, connect_clickhouse
from llmslo.analysis.store._schema import META_TABLE, SUMMARY_TABLE, columns_added_since
from llmslo.analysis.store._store import (
    CONFLICT_IDS_KEPT,
    IngestReport,
    ProgressCallback,
    Store,
    StoreError,
    StoreVersionError,
)
from llmslo.telemetry import COLUMN_NAMES, COLUMNS, SCHEMA_VERSION, Column

if TYPE_CHECKING:
    import polars as pl

__all__ = [
    "CHUNK_ROWS",
    "DAY_SQL",
    "ClickHouseStore",
    "clickhouse_meta_ddl",
    "clickhouse_summary_ddl",
    "clickhouse_type",
]

CHUNK_ROWS = 1_000_000
"""Rows per ClickHouse insert (one Arrow batch, one statement) and per id lookup."""
DAY_SQL = "toDate(toDateTime(toUInt32(least(greatest(arrival_unix_s, 0), 4294967295))))"
"""The partition key: the UTC day of ``arrival_unix_s`` (clamped to the DateTime range, so that no stored value
can make the expression fail)."""
_LOW_CARDINALITY = frozenset({"model", "version", "tenant_class", "finish_reason", "reject_reason", "error_type"})
_TYPES = {"str": "String", "float": "Float64", "int": "Int64", "float_list": "Array(Float64)"}
ORDER_BY: tuple[str, ...] = ("model", "version", "arrival_unix_s")


def clickhouse_type(column: Column) -> str:
    """The ClickHouse type of a contract column (arrays are never Nullable in ClickHouse)."""
    base = _TYPES[column.kind]
    if column.kind == "float_list":
        return base
    if column.nullable:
        base = f"Nullable({base})"
    return f"LowCardinality({base})" if column.name in _LOW_CARDINALITY else base


def clickhouse_summary_ddl(table: str = SUMMARY_TABLE) -> str:
    """``CREATE TABLE`` of the summary table: MergeTree, partitioned by day, ordered by model/version/arrival."""
    cols = ",\n  ".join(f"{c.name} {clickhouse_type(c)}" for c in COLUMNS)
    return (f"CREATE TABLE IF NOT EXISTS {table} (\n  {cols}\n) ENGINE = MergeTree\n"
            f"PARTITION BY {DAY_SQL}\nORDER BY ({', '.join(ORDER_BY)})")


def clickhouse_meta_ddl(table: str = META_TABLE) -> str:
    """``CREATE TABLE`` of the metadata table (one value per key: read it with ``FINAL``)."""
    return f"CREATE TABLE IF NOT EXISTS {table} (key String, value String) ENGINE = ReplacingMergeTree ORDER BY key"


def _text(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _day(unix_s: float) -> str:
    clamped = min(max(unix_s, 0.0), 4_294_967_295.0) if unix_s == unix_s else 0.0
    return datetime.fromtimestamp(int(clamped), tz=UTC).strftime("%Y-%m-%d")


class ClickHouseStore:
    """An open request-summary store in ClickHouse (embedded ``chdb`` or a server): see the module docstring.

    Example::

        with ClickHouseStore.open("chdb:///var/lib/llmslo") as store:
            reports = store.ingest_files(["day1.parquet"])

    Raises :class:`StoreError` when the database holds a summary table without llmslo's metadata,
    :class:`StoreVersionError` for another schema version, and
    :class:`~llmslo.analysis.store.ClickHouseError` when ClickHouse cannot be reached.
    """

    def __init__(self, client: ClickHouseClient) -> None:
        self.client = client
        self.url: ClickHouseUrl = client.url

    @classmethod
    def open(cls, url: str | ClickHouseUrl, *, create: bool = True) -> ClickHouseStore:
        """Connect to the store at ``url`` (``chdb:///FOLDER`` or ``http://HOST:8123``, ``?database=NAME``);
        with ``create`` its database and tables are made when missing."""
        client = connect_clickhouse(url, create=create)
        store = cls(client)
        try:
            store._check_or_init(create=create)
        except BaseException:
            client.close()
            raise
        return store

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> ClickHouseStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tables(self) -> set[str]:
        """Names of the tables in the store's database."""
        rows = self.client.query_arrow("SELECT name FROM system.tables WHERE database = currentDatabase()")
        return {str(n) for n in rows.column("name").to_pylist()}

    def _check_or_init(self, *, create: bool) -> None:
        tables = self.tables()
        shown = self.url.shown
        if META_TABLE in tables:
            found_text = self.meta("schema_version")
            found = int(found_text) if found_text is not None else None
            added = columns_added_since(found) if found != SCHEMA_VERSION else ()
            if added:
                for c in added:  # an older schema: the columns it lacks, null in the rows stored before
                    self.client.command(f"ALTER TABLE {SUMMARY_TABLE} ADD COLUMN IF NOT EXISTS {c.name} "
                                        f"{clickhouse_type(c)}")
                self.client.insert_arrow(META_TABLE, pa.table({"key": ["schema_version"],
                                                               "value": [str(SCHEMA_VERSION)]}))
                return
            if found != SCHEMA_VERSION:
                raise StoreVersionError(
                    f"store {shown} has request-summary schema version {found}, this llmslo reads version "
                    f"{SCHEMA_VERSION}: ingest the source files into another database (?database=NEW), or use the "
                    "llmslo release that wrote it")
            return
        if SUMMARY_TABLE in tables:
            raise StoreError(f"{shown} holds a table {SUMMARY_TABLE} but no {META_TABLE}: it was not made by llmslo; "
                             "choose another database (?database=NAME)")
        if not create:
            raise StoreError(f"no store at {shown}: create one with `llmslo ingest FILES --database clickhouse "
                             f"--url URL`")
        self.client.command(clickhouse_summary_ddl())
        self.client.command(clickhouse_meta_ddl())
        self.client.insert_arrow(META_TABLE, pa.table({"key": ["schema_version"], "value": [str(SCHEMA_VERSION)]}))

    def meta(self, key: str) -> str | None:
        """A value recorded in the store's metadata table."""
        rows = self.client.query_arrow(f"SELECT value FROM {META_TABLE} FINAL WHERE key = {_text(key)}")
        values = rows.column("value").to_pylist()
        return str(values[0]) if values else None

    def count(self) -> int:
        """Number of stored summaries."""
        rows = self.client.query_arrow(f"SELECT count() AS n FROM {SUMMARY_TABLE}")
        return int(rows.column("n")[0].as_py())

    # ---- ingest ----------------------------------------------------------------------------------

    def ingest_files(
        self,
        paths: Sequence[str | os.PathLike[str]],
        *,
        skip_invalid: bool = False,
        on_progress: ProgressCallback | None = None,
    ) -> list[IngestReport]:
        """Validate JSONL/CSV/Parquet files exactly as :meth:`Store.ingest_files` does, then load the valid rows
        whose ``request_id`` is not stored yet; one report per file (see the module docstring)."""
        with tempfile.TemporaryDirectory(prefix="llmslo-clickhouse-ingest-") as tmp, \
                Store.open(Path(tmp) / "staging.duckdb") as staging:
            staged = staging.ingest_files(paths, skip_invalid=skip_invalid, on_progress=on_progress)
            return self._load(staging.con, staged, on_progress)

    def ingest_frame(
        self,
        frame: pl.DataFrame | pa.Table,
        *,
        source: str = "<frame>",
        skip_invalid: bool = False,
        on_progress: ProgressCallback | None = None,
    ) -> IngestReport:
        """Validate and load a polars or Arrow frame (staged in memory: meant for batches, e.g. a sink's)."""
        staging = _memory_store()
        try:
            staged = staging.ingest_frame(frame, source=source, skip_invalid=skip_invalid, on_progress=on_progress)
            return self._load(staging.con, [staged], on_progress)[0]
        finally:
            staging.close()

    def _load(self, con: duckdb.DuckDBPyConnection, staged: list[IngestReport],
              on_progress: ProgressCallback | None) -> list[IngestReport]:
        """Move the staged rows (in input order) to ClickHouse, batch by batch, leaving out stored ids."""
        counts = [r.rows_inserted for r in staged]
        total = sum(counts)
        owner = np.repeat(np.arange(len(staged)), counts)  # the input of each staged row, in staged order
        inserted = [0] * len(staged)
        same = [0] * len(staged)
        conflicting = [0] * len(staged)
        conflict_ids: list[list[str]] = [[] for _ in staged]
        done = 0
        cols = ", ".join(COLUMN_NAMES)
        reader = con.sql(f"SELECT {cols} FROM {SUMMARY_TABLE} ORDER BY rowid").to_arrow_reader(CHUNK_ROWS)
        for batch in _batches(reader, CHUNK_ROWS):
            mine = owner[done:done + batch.num_rows]
            stored = self._stored_rows(batch)
            keep = np.ones(batch.num_rows, dtype=bool)
            if stored.num_rows:
                for pos, rid, differs in _compared(con, batch, stored):
                    keep[pos] = False
                    k = int(mine[pos])
                    if differs:
                        conflicting[k] += 1
                        if len(conflict_ids[k]) < CONFLICT_IDS_KEPT:
                            conflict_ids[k].append(rid)
                    else:
                        same[k] += 1
            fresh = batch.filter(pa.array(keep))
            if fresh.num_rows:
                self.client.insert_arrow(SUMMARY_TABLE, _for_clickhouse(fresh))
            for k, n in zip(*np.unique(mine[keep], return_counts=True), strict=True):
                inserted[int(k)] += int(n)
            done += batch.num_rows
            if on_progress:
                on_progress("loading into ClickHouse", done, total)
        out: list[IngestReport] = []
        for k, r in enumerate(staged):
            ids = (*r.conflicting_ids, *conflict_ids[k])[:CONFLICT_IDS_KEPT]
            out.append(IngestReport(r.source, r.rows_read, inserted[k], r.rows_already_stored + same[k],
                                    r.rows_rejected, r.rejected_path, r.errors,
                                    r.rows_conflicting + conflicting[k], ids))
        return out

    def _stored_rows(self, batch: pa.Table) -> pa.Table:
        """The stored rows whose ``request_id`` the batch holds, read from the days of the batch's arrivals."""
        arrivals = batch.column("arrival_unix_s").to_numpy()
        days = sorted({_day(float(d) * 86_400.0) for d in np.unique(np.floor(arrivals / 86_400.0))})
        in_days = ", ".join(f"toDate({_text(d)})" for d in days)
        ids = pa.table({"request_id": batch.column("request_id")})
        ref = self.client.external_ref("ids")
        return self.client.query_arrow(
            f"SELECT {', '.join(COLUMN_NAMES)} FROM {SUMMARY_TABLE} WHERE {DAY_SQL} IN ({in_days}) "
            f"AND request_id IN (SELECT request_id FROM {ref})",
            external={"ids": ids},
        )


def _memory_store() -> Store:
    """A DuckDB request-summary store in memory: the staging area that validates a batch."""
    store = Store(duckdb.connect(), "<staging>")
    store._check_or_init(create=True)
    return store


def _batches(reader: pa.RecordBatchReader, rows: int) -> Iterator[pa.Table]:
    """``rows``-row tables from a record-batch reader (the last one shorter)."""
    buffer: list[pa.RecordBatch] = []
    held = 0
    for b in reader:
        buffer.append(b)
        held += b.num_rows
        while held >= rows:
            table = pa.Table.from_batches(buffer)
            yield table.slice(0, rows).combine_chunks()
            rest = table.slice(rows)
            buffer, held = rest.to_batches(), rest.num_rows
    if held:
        yield pa.Table.from_batches(buffer).combine_chunks()


def _compared(con: duckdb.DuckDBPyConnection, batch: pa.Table, stored: pa.Table) -> list[tuple[int, str, bool]]:
    """``(position in batch, request_id, differs)`` for each batch row whose id is stored: ``differs`` when no
    stored row of that id has the same content (nulls equal nulls; no ``itl_s`` equals an empty list)."""
    named = batch.append_column("__pos", pa.array(np.arange(batch.num_rows, dtype=np.int64)))
    con.register("__llmslo_ch_batch", named)
    con.register("__llmslo_ch_stored", stored)
    try:
        def value(side: str, c: str) -> str:
            return f"coalesce({side}.{c}, []::DOUBLE[])" if c == "itl_s" else f"{side}.{c}"

        differs = " OR ".join(f"{value('n', c)} IS DISTINCT FROM {value('s', c)}"
                              for c in COLUMN_NAMES if c != "request_id")
        rows = con.sql(
            f"SELECT n.__pos, n.request_id, bool_and({differs}) FROM __llmslo_ch_batch AS n "
            f"JOIN __llmslo_ch_stored AS s ON n.request_id = s.request_id GROUP BY n.__pos, n.request_id "
            "ORDER BY n.__pos"
        ).fetchall()
    finally:
        con.unregister("__llmslo_ch_batch")
        con.unregister("__llmslo_ch_stored")
    return [(int(p), str(r), bool(d)) for p, r, d in rows]


def _for_clickhouse(table: pa.Table) -> pa.Table:
    """The batch as ClickHouse stores it: a missing ``itl_s`` as an empty list (its arrays are not Nullable)."""
    index = table.schema.get_field_index("itl_s")
    itl = table.column(index)
    if itl.null_count == 0:
        return table
    return table.set_column(index, "itl_s", pc.fill_null(itl, pa.scalar([], type=itl.type)))

