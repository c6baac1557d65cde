"""The summary sink: a bounded in-memory queue and a background writer that appends batches to a store.

The request path only appends to the queue (a few hundred nanoseconds); when the queue is full the summary
is dropped and counted (``llmslo_summaries_dropped_total{reason="queue_full"}``). The writer thread takes
batches and hands them to a writer: rotated JSONL files (:class:`JsonlWriter`, standard library), or, with
the ``analysis`` extra, the DuckDB request-summary store or rotated Parquet files
(``llmslo.analysis.DuckDBSummaryWriter``, ``llmslo.analysis.ParquetSummaryWriter``); any object with
``write(rows)`` and ``close()`` will do (:class:`SummaryWriter`). A failing write (locked file, full disk) is
retried with exponential backoff and counted (``llmslo_internal_errors_total``), never raised.

Shutdown. When :meth:`SummarySink.close` returns, within its timeout plus the time to count what is left
(no write is awaited past the timeout), every summary handed to the sink is written or counted dropped, and
those counts are final: what is still queued, and a batch whose write has not returned (a writer blocked on
a lock, a hung disk), are counted as ``store_error`` drops. Such a batch may still reach the store if its
write completes later; it stays counted as dropped (not known to be written), and nothing the writer thread
does after ``close`` returned changes a count.

Wiring. ``Telemetry(sink=sink)`` attaches the sink (:meth:`SummarySink.attach`): its drops are counted on
that telemetry's metrics and its failures on its guard, so the wiring of the example below exports both.
With a journal (``Telemetry(sink=sink, journal=...)``) the sink tells it which summaries are settled, written
or counted dropped (:meth:`SummarySink.on_settled`): a summary still queued when the process dies stays open
in the journal, and is recovered.

The telemetry never imports the analysis package: a server that wants DuckDB passes the writer in.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from llmslo.telemetry import _names as N
from llmslo.telemetry._errors import ConfigurationError
from llmslo.telemetry._guard import Guard
from llmslo.telemetry._metrics import TelemetryMetrics

if TYPE_CHECKING:
    from llmslo.telemetry._lifecycle import Telemetry

Row = Mapping[str, object]


class SummaryWriter(Protocol):
    """Appends a batch of summaries somewhere durable; raises on failure (the sink retries)."""

    def write(self, rows: Sequence[Row]) -> None: ...

    def close(self) -> None: ...


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
"""``json.dumps(row, separators=(",", ":"))`` without making an encoder per row."""


def _native_summary_json() -> Callable[[dict[str, object]], str] | None:
    try:
        from llmslo.telemetry._tokenlog_c import summary_json
    except ImportError:  # no C compiler at install: json writes every row
        return None
    return summary_json


_summary_json = _native_summary_json()


def encode_row(row: Row) -> str:
    """One summary as compact JSON: ``json.dumps(row, separators=(",", ":"))``, written in C where the native
    module is built (``summary_json`` in ``_tokenlog_c.c``; 3-5x faster, ``bench/bench_summary_encoding.py``). A
    float of whole nanoseconds, as the token log's times and gaps are, is written from that integer
    (``0.000015`` where json writes ``1.5e-05``) and reads back as the same float. A row it does not write (a
    nested object, a value json would write as ``NaN``, a type of its own) goes through json as it is."""
    if _summary_json is not None and type(row) is dict:
        try:
            return _summary_json(row)
        except (TypeError, ValueError):
            pass
    return _ENCODE(row)


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
        self._fh.write("".join(encode_row(r) + "\n" for r in rows))
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
    ``retry_max_s``: the backoff after a failed write (seconds, doubling; :meth:`close` cuts a backoff
    short). Pass it as ``Telemetry(sink=...)``, which attaches it (:meth:`attach`); call :meth:`close` at
    shutdown (flushes, waiting at most ``timeout_s``, then counts what is left: see the module docstring).
    ``metrics`` and ``guard`` default to those of the telemetry it is attached to; ``sleep(seconds)``
    replaces the backoff wait (tests).

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
                 sleep: Callable[[float], None] | None = None) -> None:
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
        self._own_guard = guard is None
        self._sleep = sleep if sleep is not None else self._backoff
        self._queue: deque[Row] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._interrupt = threading.Event()
        self._deadline: float | None = None
        # The counts, the batch being written and ``_final`` change together under this lock; once ``_final``
        # is set (by close) no count changes again.
        self._lock = threading.Lock()
        self._inflight: list[Row] = []
        self._final = False
        self.written = 0
        self.dropped: dict[str, int] = {"queue_full": 0, "store_error": 0}
        self.store_errors = 0
        self._listeners: list[Callable[[Sequence[Row]], object]] = []
        self._thread = threading.Thread(target=self._run, name="llmslo-summary-sink", daemon=True)
        self._thread.start()

    def __call__(self, row: Row) -> None:
        """Queue one summary; drop and count it when the queue is full or the sink closed. Never blocks, never
        raises."""
        q = self._queue
        if len(q) >= self.capacity or self._stop.is_set():
            self._drop("queue_full", 1)
            if self._listeners:
                self._settled((row,))
            return
        q.append(row)
        if self._final:  # close finished between the check above and the append: count it here
            self._reclaim()
        elif len(q) >= self.batch_rows:
            self._wake.set()

    submit = __call__

    def attach(self, telemetry: Telemetry) -> None:
        """Count this sink's drops on ``telemetry``'s metrics and its failures on its guard, unless the sink
        was given its own (``Telemetry(sink=...)`` calls this). Drops and failures counted before are added
        to those metrics at once. A sink attached to a second telemetry keeps the first one's."""
        with self._lock:
            if self.metrics is None:
                self.metrics = telemetry.metrics
                for reason, n in self.dropped.items():
                    if n:
                        self._count_drop(reason, n)
            if self._own_guard:
                self._own_guard = False
                earlier, self.guard = self.guard.error_count, telemetry.guard
                if earlier:
                    self._count_safely(lambda: telemetry.metrics.count(N.INTERNAL_ERRORS.key, None, earlier))

    def on_settled(self, listener: Callable[[Sequence[Row]], object]) -> None:
        """Call ``listener(rows)`` with the summaries of each batch once it is written, and with those counted
        dropped once they are (each summary exactly once; on the writer thread, or on the caller's for a
        summary refused at the door). A journal listens so (``Telemetry(journal=...)``): what is settled needs
        no recovery. A listener that raises is counted on the guard."""
        self._listeners.append(listener)

    def _settled(self, rows: Sequence[Row]) -> None:
        for listener in self._listeners:
            try:
                listener(rows)
            except Exception as exc:
                self.guard.error("sink.listener", exc)

    @property
    def queued(self) -> int:
        """Summaries waiting to be written."""
        return len(self._queue)

    # ---- counting (under the lock) ---------------------------------------------------------------------

    def _drop(self, reason: str, n: int) -> None:
        with self._lock:
            self._drop_locked(reason, n)

    def _drop_locked(self, reason: str, n: int) -> None:
        self.dropped[reason] += n
        self._count_drop(reason, n)

    def _count_drop(self, reason: str, n: int) -> None:
        metrics = self.metrics
        if metrics is not None:
            self._count_safely(lambda: metrics.count(N.SUMMARIES_DROPPED.key, {"reason": reason}, n))

    def _count_safely(self, count: Callable[[], None]) -> None:
        try:
            count()
        except Exception as exc:
            self.guard.error("sink.drop", exc)

    def _drain_locked(self) -> list[Row]:
        """Empty the queue; the summaries it held (each popped, so a concurrent append is never lost)."""
        q = self._queue
        rows: list[Row] = []
        try:
            while True:
                rows.append(q.popleft())
        except IndexError:
            return rows

    def _reclaim(self) -> None:
        with self._lock:
            rows = self._drain_locked()
            if rows:
                self._drop_locked("queue_full", len(rows))
        if rows and self._listeners:
            self._settled(rows)

    # ---- the writer thread -----------------------------------------------------------------------------

    def _take_locked(self) -> list[Row]:
        q = self._queue
        batch: list[Row] = []
        try:
            for _ in range(min(self.batch_rows, len(q))):
                batch.append(q.popleft())
        except IndexError:
            pass
        return batch

    def _backoff(self, seconds: float) -> None:
        """Wait ``seconds`` before the next attempt; :meth:`close` ends the wait early, once."""
        self._interrupt.wait(seconds)
        self._interrupt.clear()

    def _write(self, batch: list[Row]) -> bool:
        """Write ``batch``, retrying with backoff; ``False`` when the close deadline passed first."""
        delay = self.retry_initial_s
        while True:
            try:
                self.writer.write(batch)
                return True
            except Exception as exc:
                with self._lock:
                    if self._final:  # close has counted this batch already
                        return False
                    self.store_errors += 1
                self.guard.error("sink.write", exc)
            if self._deadline is not None and time.monotonic() + delay > self._deadline:
                return False
            self._sleep(delay)
            delay = min(delay * 2, self.retry_max_s)

    def _flush(self) -> bool:
        """Write queued batches (all of them once closing); ``False`` once nothing more may be written."""
        while True:
            with self._lock:
                if self._final:
                    return False
                batch = self._inflight = self._take_locked()
            if not batch:
                return True
            ok = self._write(batch)
            lost: list[Row] = []
            with self._lock:
                self._inflight = []
                if self._final:
                    return False
                if not ok:
                    lost = batch + self._drain_locked()
                    self._drop_locked("store_error", len(lost))
                else:
                    self.written += len(batch)
            if self._listeners:
                self._settled(batch if ok else lost)
            if not ok:
                return False
            if not self._stop.is_set() and len(self._queue) < self.batch_rows:
                return True

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            if not stopping:
                self._wake.wait(self.flush_interval_s)
                self._wake.clear()
            if not self._flush() or stopping:
                break
        try:
            self.writer.close()
        except Exception as exc:
            self.guard.error("sink.close", exc)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop accepting summaries and write what is queued, waiting at most ``timeout_s`` seconds; then count
        whatever is not written as ``store_error`` drops (a batch still inside a blocked write included) and
        return. The counts are final from then on. The writer is closed by the writer thread once its last
        write returns. A second call waits for the first call's deadline at most.

        Raises :class:`ConfigurationError` for a ``timeout_s`` that is not a number of seconds >= 0 (the
        sink stays open)."""
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
                math.isfinite(timeout_s) and timeout_s >= 0):
            raise ConfigurationError(
                f"SummarySink.close.timeout_s: must be a finite number of seconds >= 0, got {timeout_s!r}")
        with self._lock:
            if self._deadline is None:
                self._deadline = time.monotonic() + timeout_s
                self._stop.set()
            deadline = self._deadline
        self._wake.set()
        self._interrupt.set()
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            if self._final:
                return
            self._final = True
            lost = self._inflight + self._drain_locked()
            self._inflight = []
            if lost:
                self._drop_locked("store_error", len(lost))
        if lost and self._listeners:
            self._settled(lost)
