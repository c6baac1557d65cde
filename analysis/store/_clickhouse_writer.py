"""The ClickHouse writer of the telemetry summary sink: batches of request summaries, one HTTP insert each.

A server hands it to :class:`llmslo.telemetry.SummarySink`, which keeps it off the request path: the request
only appends to the sink's bounded queue (a full queue drops the summary and counts it), and the sink's
thread calls :meth:`ClickHouseSummaryWriter.write` with a batch, retrying a failed write with backoff and
counting the failures::

    from llmslo.analysis.store import ClickHouseSummaryWriter
    from llmslo.telemetry import SummarySink, Telemetry

    sink = SummarySink(ClickHouseSummaryWriter("http://clickhouse:8123?database=llmslo"))
    tel = Telemetry(sink=sink)
    ...
    sink.close(timeout_s=5)   # at shutdown: what is left is written or counted dropped

Each batch is validated with the store's rules and inserted through clickhouse-connect in one statement
(:meth:`ClickHouseStore.ingest_frame`): invalid rows are left out and counted (:attr:`rows_rejected`), rows
whose ``request_id`` is stored already are skipped (a retried batch whose first attempt reached the server
adds nothing). Losses are counted where they happen: the sink counts the summaries it drops (queue full, a
write that never succeeded), this writer the rows it leaves out.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from llmslo.analysis.store._clickhouse import ClickHouseStore
from llmslo.analysis.store._clickhouse_client import ClickHouseUrl, parse_clickhouse_url
from llmslo.analysis.store._schema import arrow_schema
from llmslo.analysis.store._sink_writers import Row, summary_table

__all__ = ["ClickHouseSummaryWriter"]


class ClickHouseSummaryWriter:
    """Appends batches of request summaries to the ClickHouse store at ``url`` (``http://HOST:8123``, or
    ``chdb:///FOLDER`` in tests), creating its tables if missing.

    The connection is made at the first write (never in the constructor, which a server calls at start-up)
    and held until :meth:`close`; a write after a failed one connects again. ``write`` raises
    :class:`~llmslo.analysis.store.ClickHouseError` when ClickHouse cannot be reached (the sink retries and
    counts it). Raises :class:`~llmslo.telemetry.ConfigurationError` for a malformed ``url``.
    """

    def __init__(self, url: str) -> None:
        self.url: ClickHouseUrl = parse_clickhouse_url(url)
        self._store: ClickHouseStore | None = None
        self._schema = arrow_schema()
        self._lock = threading.Lock()
        self.rows_written = 0
        self.rows_rejected = 0
        self.rows_already_stored = 0
        self.rows_conflicting = 0
        self.batches_written = 0

    def write(self, rows: Sequence[Row]) -> None:
        """Validate ``rows`` and insert the valid new ones in one statement; raises on failure."""
        if not rows:
            return
        table = summary_table(rows, self._schema)
        with self._lock:
            if self._store is None:
                self._store = ClickHouseStore.open(self.url)
            try:
                report = self._store.ingest_frame(table, source="<sink>", skip_invalid=True)
            except BaseException:
                store, self._store = self._store, None
                store.close()  # a broken connection is not reused: the retry connects again
                raise
            self.rows_written += report.rows_inserted
            self.rows_rejected += report.rows_rejected
            self.rows_already_stored += report.rows_already_stored
            self.rows_conflicting += report.rows_conflicting
            self.batches_written += 1

    def close(self) -> None:
        """Close the connection (a later write opens it again)."""
        with self._lock:
            if self._store is not None:
                store, self._store = self._store, None
                store.close()
