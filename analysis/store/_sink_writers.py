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
from operator import itemgetter
from pathlib import Path

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
    """Appends batches of request summaries to Parquet files in ``folder``, rotated every ``rotate_rows`` rows.

    A file is written as ``summaries-<unix seconds>-<n>.parquet.partial`` and renamed to
    ``summaries-<unix seconds>-<n>.parquet`` once complete (rotation or :meth:`close`), so a reader never
    sees a file without its footer. :attr:`files` lists the completed files; load them with
    ``llmslo ingest`` or :meth:`Store.ingest_files`. ``compression`` is a Parquet codec name.

    Raises :class:`ConfigurationError` naming the field for a bad ``rotate_rows``.
    """

    def __init__(self, folder: str | os.PathLike[str], *, rotate_rows: int = 1_000_000,
                 compression: str = "zstd") -> None:
        if isinstance(rotate_rows, bool) or not isinstance(rotate_rows, int) or rotate_rows < 1:
            raise ConfigurationError(f"ParquetSummaryWriter.rotate_rows: must be an integer >= 1, got {rotate_rows!r}")
        self.folder = Path(folder)
        self.rotate_rows = rotate_rows
        self.compression = compression
        self._schema = arrow_schema()
        self._writer: pq.ParquetWriter | None = None
        self._partial: Path | None = None
        self._rows = 0
        self._n = 0
        self.files: list[Path] = []

    def write(self, rows: Sequence[Row]) -> None:
        """Append ``rows`` to the current file, starting a new one every ``rotate_rows`` rows."""
        if not rows:
            return
        table = summary_table(rows, self._schema)
        start = 0
        while start < table.num_rows:
            if self._writer is None or self._rows >= self.rotate_rows:
                self._finish_file()
                self._open_file()
            assert self._writer is not None
            take = min(self.rotate_rows - self._rows, table.num_rows - start)
            self._writer.write_table(table.slice(start, take))
            self._rows += take
            start += take

    def _open_file(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._n += 1
        self._partial = self.folder / f"summaries-{int(time.time())}-{self._n}.parquet.partial"
        self._writer = pq.ParquetWriter(self._partial, self._schema, compression=self.compression)
        self._rows = 0

    def _finish_file(self) -> None:
        writer, partial = self._writer, self._partial
        self._writer = self._partial = None
        if writer is None or partial is None:
            return
        writer.close()
        done = partial.with_name(partial.name.removesuffix(".partial"))
        partial.replace(done)
        self.files.append(done)

    def close(self) -> None:
        """Complete the current file (footer written, renamed without ``.partial``)."""
        self._finish_file()
