"""Writers for the telemetry summary sink: batches of request summaries into the DuckDB store or Parquet files.

Both implement the writer protocol of :class:`llmslo.telemetry.SummarySink` (``write(rows)``, ``close()``)
by shape, without importing the telemetry runtime: a server that wants summaries in DuckDB installs the
``analysis`` extra and passes one of these to its sink::

    from llmslo.analysis import DuckDBSummaryWriter
    from llmslo.telemetry import SummarySink, Telemetry

    sink = SummarySink(DuckDBSummaryWriter("summaries.duckdb"))
    tel = Telemetry(sink=sink)
    ...
    sink.close()   # at shutdown: flushes what is queued

A batch becomes one Arrow table (one Python-to-Arrow conversion per column, no per-row inserts) and is
appended in one statement. ``write`` raises on failure (a locked file, a full disk); the sink retries it
with backoff and counts the failures, so nothing here ever reaches the server's request path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from operator import itemgetter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmslo.analysis.store._schema import arrow_schema
from llmslo.analysis.store._store import IngestReport, Store
from llmslo.telemetry import ConfigurationError

Row = Mapping[str, object]


def summary_table(rows: Sequence[Row], schema: pa.Schema | None = None) -> pa.Table:
    """The request summaries ``rows`` (mappings, as the telemetry emits them) as an Arrow table.

    Columns follow the request-summary schema; a column absent from every row (``itl_s`` unless the
    telemetry records it) is null; a key a row lacks reads as null. Raises ``pyarrow.ArrowInvalid`` /
    ``ArrowTypeError`` for a value of the wrong type.
    """
    schema = schema if schema is not None else arrow_schema()
    n = len(rows)
    first = rows[0] if n else {}
    arrays: list[pa.Array] = []
    for f in schema:
        name = f.name
        if name not in first and not any(name in r for r in rows):
            arrays.append(pa.nulls(n, f.type))
            continue
        try:
            values: list[object] = list(map(itemgetter(name), rows))  # the fast path: every row has the key
        except KeyError:
            values = [r.get(name) for r in rows]
        arrays.append(pa.array(values, type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


class DuckDBSummaryWriter:
    """Appends batches of request summaries to the store at ``path`` (a DuckDB file, created if missing).

    Each batch goes through :meth:`Store.ingest_frame` with ``skip_invalid``: it is validated against
    the contract, rows whose ``request_id`` is already stored are skipped (counted in
    :attr:`rows_already_stored`, or in :attr:`rows_conflicting` when the stored row differs), invalid rows
    are left out and counted in :attr:`rows_rejected`. The file is opened at the first write and held until
    :meth:`close`.
    Raises :class:`llmslo.analysis.StoreError` (through the sink, which retries) when the file cannot be
    opened.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._store: Store | None = None
        self._schema = arrow_schema()
        self.rows_written = 0
        self.rows_rejected = 0
        self.rows_already_stored = 0
        self.rows_conflicting = 0

    def write(self, rows: Sequence[Row]) -> None:
        """Append ``rows`` in one transaction; raises on failure (nothing of the batch is then written)."""
        if not rows:
            return
        if self._store is None:
            self._store = Store.open(self.path)
        report: IngestReport = self._store.ingest_frame(summary_table(rows, self._schema), source="<sink>",
                                                        skip_invalid=True)
        self.rows_written += report.rows_inserted
        self.rows_rejected += report.rows_rejected
        self.rows_already_stored += report.rows_already_stored
        self.rows_conflicting += report.rows_conflicting

    def close(self) -> None:
        """Close the store file (a later write opens it again)."""
        if self._store is not None:
            store, self._store = self._store, None
            store.close()


class ParquetSummaryWriter:
    """Appends batches of request summaries to Parquet files under ``folder``, hive-partitioned by the UTC hour
    of arrival, rotated every ``rotate_rows`` rows.

    With ``partitioned`` (the default) a row goes to ``folder/date=YYYY-MM-DD/hour=HH/`` by its
    ``arrival_unix_s`` (UTC; a value that is no time, such as NaN, goes to 1970-01-01 hour 00): ``llmslo report
    --source 'folder/**/*.parquet' --from … --to …`` then opens only the hours it needs. Each partition has
    its own file, written as ``summaries-<unix seconds>-<n>.parquet.partial`` and renamed to
    ``summaries-<unix seconds>-<n>.parquet`` once complete (rotation, :meth:`close`, or when more than
    ``max_open`` partitions are open: the one written least recently is completed), so a reader never sees a
    file without its footer. Without ``partitioned`` the files lie in ``folder`` itself. The files hold every
    column (the folder names repeat what ``arrival_unix_s`` says): :attr:`files` lists the completed ones;
    load them with ``llmslo ingest`` or :meth:`Store.ingest_files`. ``compression`` is a Parquet codec name.

    Raises :class:`ConfigurationError` naming the field for a bad ``rotate_rows`` or ``max_open``.
    """

    def __init__(self, folder: str | os.PathLike[str], *, rotate_rows: int = 1_000_000,
                 compression: str = "zstd", partitioned: bool = True, max_open: int = 8) -> None:
        for name, value in (("rotate_rows", rotate_rows), ("max_open", max_open)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"ParquetSummaryWriter.{name}: must be an integer >= 1, got {value!r}")
        self.folder = Path(folder)
        self.rotate_rows = rotate_rows
        self.compression = compression
        self.partitioned = partitioned
        self.max_open = max_open
        self._schema = arrow_schema()
        self._open: dict[str, _OpenFile] = {}  # by partition folder, least recently written first
        self._n = 0
        self.files: list[Path] = []

    def write(self, rows: Sequence[Row]) -> None:
        """Append ``rows`` to the files of their partitions, starting a new file every ``rotate_rows`` rows."""
        if rows:
            self.write_table(summary_table(rows, self._schema))

    def write_table(self, table: pa.Table) -> None:
        """Append an Arrow table of summaries, e.g. a bulk export of a store's own rows::

            writer.write_table(store.con.sql("SELECT * FROM request_summaries").to_arrow_table())

        The table has the fields of :func:`arrow_schema`, in any order, of the same types. A field the schema
        says is never null may be marked nullable (DuckDB marks every column so): its values are checked
        instead. Raises :class:`~llmslo.telemetry.ConfigurationError` (a ``ValueError``) naming the field and
        the difference (missing, unknown, another type, nulls where none may be); nothing is written then.
        """
        table = self._conformed(table)
        for part, piece in self._split(table):
            self._append(part, piece)

    def _conformed(self, table: pa.Table) -> pa.Table:
        """``table`` with the writer's schema exactly (see :meth:`write_table`), or the refusal."""
        if table.schema.equals(self._schema):
            return table
        where = "ParquetSummaryWriter.write_table"
        names = table.schema.names
        wanted = self._schema.names
        for name in sorted({n for n in names if names.count(n) > 1}):
            raise ConfigurationError(f"{where}: field {name!r} appears {names.count(name)} times")
        missing = [n for n in wanted if n not in names]
        if missing:
            raise ConfigurationError(f"{where}: field {missing[0]!r} is missing"
                                     + (f" (and {', '.join(map(repr, missing[1:]))})" if missing[1:] else "")
                                     + "; the table needs every field of arrow_schema()")
        unknown = [n for n in names if n not in wanted]
        if unknown:
            raise ConfigurationError(f"{where}: field {unknown[0]!r} is not in arrow_schema()"
                                     + (f" (nor {', '.join(map(repr, unknown[1:]))})" if unknown[1:] else "")
                                     + "; select the schema's fields only")
        columns = []
        for f in self._schema:
            got = table.schema.field(f.name)
            if not got.type.equals(f.type):
                raise ConfigurationError(f"{where}: field {f.name!r} is {got.type}; arrow_schema() has {f.type}")
            column = table.column(f.name)
            if not f.nullable and column.null_count:
                first = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
                raise ConfigurationError(
                    f"{where}: field {f.name!r} holds {column.null_count:,} null{'s' if column.null_count > 1 else ''}"
                    f" (first at row {first}); arrow_schema() says it is never null")
            columns.append(column)
        return pa.Table.from_arrays(columns, schema=self._schema)

    def _split(self, table: pa.Table) -> list[tuple[str, pa.Table]]:
        """``(partition folder, its rows)`` of a batch, in order of first appearance."""
        if not self.partitioned:
            return [("", table)]
        arrival = np.asarray(table.column("arrival_unix_s").to_numpy(zero_copy_only=False), dtype=np.float64)
        hours = np.floor(np.nan_to_num(arrival, nan=0.0, posinf=0.0, neginf=0.0) / 3600.0)
        hours = np.clip(hours, 0.0, _LAST_HOUR).astype(np.int64)
        out: list[tuple[str, pa.Table]] = []
        unique, first = np.unique(hours, return_index=True)
        for hour in unique[np.argsort(first)]:
            when = datetime.fromtimestamp(int(hour) * 3600, tz=UTC)
            part = f"date={when:%Y-%m-%d}/hour={when:%H}"
            out.append((part, table.filter(pa.array(hours == hour)) if len(unique) > 1 else table))
        return out

    def _append(self, part: str, table: pa.Table) -> None:
        start = 0
        while start < table.num_rows:
            current = self._open.pop(part, None)
            if current is not None and current.rows >= self.rotate_rows:
                self._finish(current)
                current = None
            if current is None:
                while len(self._open) >= self.max_open:
                    oldest = next(iter(self._open))
                    self._finish(self._open.pop(oldest))
                current = self._start(part)
            self._open[part] = current  # the most recently written goes last
            take = min(self.rotate_rows - current.rows, table.num_rows - start)
            current.writer.write_table(table.slice(start, take))
            current.rows += take
            start += take

    def _start(self, part: str) -> _OpenFile:
        folder = self.folder / part if part else self.folder
        folder.mkdir(parents=True, exist_ok=True)
        self._n += 1
        partial = folder / f"summaries-{int(time.time())}-{self._n}.parquet.partial"
        return _OpenFile(pq.ParquetWriter(partial, self._schema, compression=self.compression), partial)

    def _finish(self, current: _OpenFile) -> None:
        current.writer.close()
        done = current.partial.with_name(current.partial.name.removesuffix(".partial"))
        current.partial.replace(done)
        self.files.append(done)

    def close(self) -> None:
        """Complete every open file (footer written, renamed without ``.partial``)."""
        while self._open:
            self._finish(self._open.pop(next(iter(self._open))))


_LAST_HOUR = 253_402_300_799 // 3600
"""The last hour a partition names: 9999-12-31 23:00 UTC."""


class _OpenFile:
    """One partition's file being written: its writer, its ``.partial`` path and the rows it holds."""

    def __init__(self, writer: pq.ParquetWriter, partial: Path) -> None:
        self.writer = writer
        self.partial = partial
        self.rows = 0
