"""The summary sink: a bounded in-memory queue and a background writer that appends batches to a store.

The request path only appends to the queue (a few hundred nanoseconds); when the queue is full the summary
is dropped and counted (``llmslo_summaries_dropped_total{reason="queue_full"}``). The writer thread takes
batches and hands them to a writer: rotated JSONL files (:class:`JsonlWriter`, standard library), or, with
the ``analysis`` extra, the DuckDB request-summary store or rotated Parquet files
(``llmslo.analysis.DuckDBSummaryWriter``, ``llmslo.analysis.ParquetSummaryWriter``); any object with
``write(rows)`` and ``close()`` will do (:class:`SummaryWriter`). A failing write (locked file, full disk) is
retried with exponential backoff and counted, never raised; whatever is still unwritten when the sink closes
past its deadline is dropped and counted (``store_error``).

The telemetry never imports the analysis package: a server that wants DuckDB passes the writer in.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from llmslo.telemetry import _names as N
from llmslo.telemetry._errors import ConfigurationError
from llmslo.telemetry._guard import Guard
from llmslo.telemetry._metrics import TelemetryMetrics

Row = Mapping[str, object]


class SummaryWriter(Protocol):
    """Appends a batch of summaries somewhere durable; raises on failure (the sink retries)."""

    def write(self, rows: Sequence[Row]) -> None: ...

    def close(self) -> None: ...


class JsonlWriter:
    """Appends batches to JSONL files in ``folder``, rotated every ``rotate_rows`` rows
    (``summaries-<unix seconds>-<n>.jsonl``); load them with ``llmslo ingest``."""

    def __init__(self, folder: str | os.PathLike[str], *, rotate_rows: int = 1_000_000) -> None:
        if rotate_rows < 1:
            raise ConfigurationError("JsonlWriter.rotate_rows: must be >= 1")
        self.folder = Path(folder)
        self.rotate_rows = rotate_rows
        self._fh: Any = None
        self._rows = 0
        self._n = 0
        self.files: list[Path] = []

    def write(self, rows: Sequence[Row]) -> None:
        if self._fh is None or self._rows >= self.rotate_rows:
            self.close()
            self.folder.mkdir(parents=True, exist_ok=True)
            self._n += 1
            path = self.folder / f"summaries-{int(time.time())}-{self._n}.jsonl"
            self._fh = path.open("a", encoding="utf-8")
            self.files.append(path)
            self._rows = 0
        self._fh.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
        self._fh.flush()
        self._rows += len(rows)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class SummarySink:
    """A bounded queue of request summaries and a background writer (a daemon thread).

    ``capacity``: the most summaries held in memory; ``batch_rows``: the most written per batch;
    ``flush_interval_s``: the longest a summary waits before a write (seconds); ``retry_initial_s`` and
    ``retry_max_s``: the backoff after a failed write (seconds, doubling). Pass it as ``Telemetry(sink=...)``;
    call :meth:`close` at shutdown (flushes, waiting at most ``timeout_s``).

    Example::

        from llmslo.analysis import DuckDBSummaryWriter   # the analysis extra

        sink = SummarySink(DuckDBSummaryWriter("summaries.duckdb"))
        tel = Telemetry(sink=sink)
        ...
        sink.close()
    """

    def __init__(self, writer: SummaryWriter, *, capacity: int = 100_000, batch_rows: int = 20_000,
                 flush_interval_s: float = 1.0, retry_initial_s: float = 0.05, retry_max_s: float = 5.0,
                 metrics: TelemetryMetrics | None = None, guard: Guard | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        for name, value in (("capacity", capacity), ("batch_rows", batch_rows)):
            if not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"SummarySink.{name}: must be an integer >= 1, got {value!r}")
        for name, fvalue in (("flush_interval_s", flush_interval_s), ("retry_initial_s", retry_initial_s),
                             ("retry_max_s", retry_max_s)):
            if not isinstance(fvalue, (int, float)) or not 0 < fvalue < float("inf"):
                raise ConfigurationError(f"SummarySink.{name}: must be a positive number of seconds")
        self.writer = writer
        self.capacity = capacity
        self.batch_rows = batch_rows
        self.flush_interval_s = flush_interval_s
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.metrics = metrics
        self.guard = guard if guard is not None else Guard()
        self._sleep = sleep
        self._queue: deque[Row] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._deadline: float | None = None
        self.written = 0
        self.dropped: dict[str, int] = {"queue_full": 0, "store_error": 0}
        self.store_errors = 0
        self._thread = threading.Thread(target=self._run, name="llmslo-summary-sink", daemon=True)
        self._thread.start()

    def __call__(self, row: Row) -> None:
        """Queue one summary; drop and count it when the queue is full. Never blocks, never raises."""
        q = self._queue
        if len(q) >= self.capacity or self._stop.is_set():
            self._drop("queue_full", 1)
            return
        q.append(row)
        if len(q) >= self.batch_rows:
            self._wake.set()

    submit = __call__

    @property
    def queued(self) -> int:
        """Summaries waiting to be written."""
        return len(self._queue)

    def _drop(self, reason: str, n: int) -> None:
        self.dropped[reason] += n
        if self.metrics is not None:
            try:
                self.metrics.count(N.SUMMARIES_DROPPED.key, {"reason": reason}, n)
            except Exception as exc:
                self.guard.error("sink.drop", exc)

    def _take(self) -> list[Row]:
        q = self._queue
        batch: list[Row] = []
        try:
            for _ in range(min(self.batch_rows, len(q))):
                batch.append(q.popleft())
        except IndexError:
            pass
        return batch

    def _write(self, batch: list[Row]) -> bool:
        """Write ``batch``, retrying with backoff; ``False`` when the close deadline passed first."""
        delay = self.retry_initial_s
        while True:
            try:
                self.writer.write(batch)
                self.written += len(batch)
                return True
            except Exception as exc:
                self.store_errors += 1
                self.guard.error("sink.write", exc)
            if self._deadline is not None and time.monotonic() + delay > self._deadline:
                return False
            self._sleep(delay)
            delay = min(delay * 2, self.retry_max_s)

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            if not stopping:
                self._wake.wait(self.flush_interval_s)
                self._wake.clear()
            while self._queue:
                batch = self._take()
                if batch and not self._write(batch):
                    self._drop("store_error", len(batch) + len(self._queue))
                    self._queue.clear()
                    break
                if not self._stop.is_set() and len(self._queue) < self.batch_rows:
                    break
            if stopping:
                break
        try:
            self.writer.close()
        except Exception as exc:
            self.guard.error("sink.close", exc)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop accepting summaries, write what is queued (giving up after ``timeout_s`` seconds, counting the
        rest as ``store_error`` drops), close the writer."""
        self._deadline = time.monotonic() + timeout_s
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout_s + 1)


