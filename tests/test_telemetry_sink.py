"""The summary sink never blocks or raises on the request path; losses are counted; shutdown flushes, and when
``close`` returns every summary is written or counted dropped, on the sink and on ``/metrics``."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmslo.analysis import Store
from llmslo.analysis.store._sink_writers import DuckDBSummaryWriter, ParquetSummaryWriter
from llmslo.telemetry import JsonlWriter, MetricsServer, SummarySink, Telemetry, validate_summary


class LockedStore:
    """A writer that fails like a locked file until ``unlock`` is set."""

    def __init__(self) -> None:
        self.unlock = threading.Event()
        self.failed = threading.Event()
        self.rows: list[object] = []
        self.failures = 0

    def write(self, rows: Sequence[object]) -> None:
        if not self.unlock.is_set():
            self.failures += 1
            self.failed.set()
            raise OSError("database is locked")
        self.rows.extend(rows)

    def close(self) -> None:
        pass


class BlockingStore:
    """A writer whose ``write`` blocks until ``release`` is set (a hung disk, a store another process holds),
    then stores the batch."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.closed = threading.Event()
        self.rows: list[object] = []

    def write(self, rows: Sequence[object]) -> None:
        self.entered.set()
        self.release.wait(timeout=120)
        self.rows.extend(rows)

    def close(self) -> None:
        self.closed.set()


def _scrape(server: MetricsServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the ``/metrics`` text ``server`` serves, by name and labels."""
    with urllib.request.urlopen(server.url, timeout=10) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _dropped(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], reason: str) -> float:
    return samples.get(("llmslo_summaries_dropped_total", (("reason", reason),)), 0.0)


def _requests(tel: Telemetry, n: int) -> None:
    for i in range(n):
        t = tel.start(f"r{i}", model="m", prompt_tokens=3)
        t.commit()
        t.commit()
        t.send(2)
        t.finish("stop")


def test_summaries_reach_the_duckdb_store_and_shutdown_flushes(tmp_path: Path) -> None:
    sink = SummarySink(DuckDBSummaryWriter(tmp_path / "s.duckdb"), flush_interval_s=60)
    tel = Telemetry(sink=sink)
    _requests(tel, 500)
    sink.close(timeout_s=30)
    assert sink.written == 500 and sink.dropped == {"queue_full": 0, "store_error": 0}
    with Store.open(tmp_path / "s.duckdb", read_only=True) as store:
        assert store.count() == 500


def test_a_locked_store_is_retried_counted_and_never_raised_and_the_queue_stays_bounded() -> None:
    store = LockedStore()
    sink = SummarySink(store, capacity=100, batch_rows=10, flush_interval_s=0.01, retry_initial_s=0.005,
                       retry_max_s=0.02)
    tel = Telemetry(sink=sink)
    sink.metrics = tel.metrics
    _requests(tel, 1000)
    assert sink.queued <= 100
    assert sink.dropped["queue_full"] >= 1000 - 110
    assert tel.metrics.value("summaries_dropped", reason="queue_full") == sink.dropped["queue_full"]
    assert store.failed.wait(timeout=30), "the sink never tried the locked store"  # a loaded machine is slow
    store.unlock.set()
    sink.close(timeout_s=10)
    assert store.failures >= 1 and sink.store_errors == store.failures
    assert len(store.rows) + sink.dropped["queue_full"] + sink.dropped["store_error"] == 1000
    assert tel.guard.errors == {"sink.write": store.failures}  # each failed write is an internal error


def test_a_store_that_never_recovers_loses_the_rest_at_close_counted() -> None:
    store = LockedStore()
    sink = SummarySink(store, capacity=50, batch_rows=10, retry_initial_s=0.01, retry_max_s=0.05)
    for i in range(30):
        sink({"request_id": str(i)})
    sink.close(timeout_s=0.3)
    assert store.rows == []
    assert sink.dropped["store_error"] + sink.queued == 30


def test_jsonl_files_rotate_and_hold_valid_summaries(tmp_path: Path) -> None:
    writer = JsonlWriter(tmp_path, rotate_rows=100)
    sink = SummarySink(writer, batch_rows=50)
    tel = Telemetry(sink=sink)
    _requests(tel, 250)
    sink.close()
    import json

    lines = [json.loads(line) for f in writer.files for line in f.read_text().splitlines()]
    assert len(lines) == 250 and len(writer.files) >= 3
    assert all(validate_summary(r) == [] for r in lines)


def test_parquet_files_rotate_complete_and_load_into_the_store(tmp_path: Path) -> None:
    writer = ParquetSummaryWriter(tmp_path / "pq", rotate_rows=100)
    sink = SummarySink(writer, batch_rows=70)
    tel = Telemetry(sink=sink, record_itl=True)
    _requests(tel, 250)
    sink.close()
    assert sink.written == 250 and len(writer.files) == 3
    assert not list((tmp_path / "pq").glob("*.partial"))
    assert [pq.read_metadata(f).num_rows for f in writer.files] == [100, 100, 50]
    with Store.open(tmp_path / "s.duckdb") as store:
        store.ingest_files(writer.files)
        assert store.count() == 250


def test_the_duckdb_writer_leaves_out_invalid_rows_and_skips_stored_ids(tmp_path: Path) -> None:
    tel = Telemetry()
    _requests(tel, 1)
    good = tel.start("r0", model="m")
    good.finish("stop")
    assert good.summary is not None
    writer = DuckDBSummaryWriter(tmp_path / "s.duckdb")
    writer.write([good.summary, {**good.summary, "request_id": "bad", "ttft_s": -1.0}])
    writer.write([good.summary])
    writer.close()
    assert (writer.rows_written, writer.rows_rejected, writer.rows_already_stored) == (1, 1, 1)


def test_close_returns_with_every_summary_written_or_counted_dropped_while_the_writer_blocks() -> None:
    """The writer blocks inside ``write`` until after ``close`` returned (so ``close`` cannot have waited for
    it): at that return every summary is written or dropped, and the counts stay as they were when the
    blocked write later completes."""
    store = BlockingStore()
    sink = SummarySink(store, capacity=100_000, batch_rows=20_000, flush_interval_s=60)  # a full batch wakes it
    tel = Telemetry(sink=sink)
    try:
        for i in range(50_000):
            sink({"request_id": f"r{i}"})
        assert store.entered.wait(timeout=30), "the sink never called the writer"
        t0 = time.monotonic()
        sink.close(timeout_s=0.5)
        print(f"close(timeout_s=0.5) returned after {time.monotonic() - t0:.2f} s")
        assert not store.rows  # still blocked
        final = (sink.written, dict(sink.dropped))
        assert sink.written + sink.dropped["queue_full"] + sink.dropped["store_error"] == 50_000
        assert sink.dropped["store_error"] == 50_000 and sink.queued == 0
        assert tel.metrics.value("summaries_dropped", reason="store_error") == 50_000
    finally:
        store.release.set()
    assert store.closed.wait(timeout=30), "the writer thread never finished"
    assert len(store.rows) == 20_000  # the blocked batch did land: it was counted dropped as not known written
    assert (sink.written, sink.dropped) == final
    assert tel.metrics.value("summaries_dropped", reason="store_error") == 50_000
    sink({"request_id": "late"})  # after close: dropped and counted, never queued
    assert sink.dropped["queue_full"] == 1 and sink.queued == 0


def test_close_counts_everything_while_a_duckdb_file_is_locked_by_another_process(tmp_path: Path) -> None:
    """Another process holds the DuckDB file lock; the writer fails and backs off for longer than the close
    timeout. ``close`` still returns with every summary counted, on the sink and on ``/metrics``."""
    path = tmp_path / "s.duckdb"
    code = ("import sys, duckdb\n"
            f"con = duckdb.connect({str(path)!r})\nprint('locked', flush=True)\nsys.stdin.read()\n")
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            sink = SummarySink(DuckDBSummaryWriter(path), flush_interval_s=0.01, retry_initial_s=30,
                               retry_max_s=60)
            tel = Telemetry(sink=sink)
            server = MetricsServer(tel.registry)
            try:
                _requests(tel, 5_000)
                deadline = time.monotonic() + 60
                while sink.store_errors < 1 and time.monotonic() < deadline:  # then it backs off for 30 s
                    time.sleep(0.01)
                assert sink.store_errors >= 1, "the sink never tried the locked file"
                sink.close(timeout_s=0.5)
                assert sink.written == 0 and sink.dropped == {"queue_full": 0, "store_error": 5_000}
                samples = _scrape(server)
            finally:
                server.stop()
        finally:
            holder.kill()  # the process this test started, by its handle
    assert _dropped(samples, "store_error") == 5_000
    assert samples[("llmslo_internal_errors_total", ())] == sink.store_errors


def test_the_wiring_the_readme_shows_exports_queue_drops_and_write_failures_on_metrics() -> None:
    """``SummarySink(writer)`` then ``Telemetry(sink=sink)``, nothing else: the sink's queue drops reach
    ``llmslo_summaries_dropped_total`` and its failed writes ``llmslo_internal_errors_total``, as the
    ``/metrics`` text shows them."""
    store = LockedStore()
    sink = SummarySink(store, capacity=100, batch_rows=10, flush_interval_s=0.01, retry_initial_s=0.005,
                       retry_max_s=0.02)
    tel = Telemetry(sink=sink)
    server = MetricsServer(tel.registry)
    try:
        _requests(tel, 1000)
        assert store.failed.wait(timeout=30), "the sink never tried the locked store"
        sink.close(timeout_s=0.2)
        samples = _scrape(server)
    finally:
        server.stop()
    assert sink.dropped["queue_full"] >= 1000 - 110 and sink.dropped["store_error"] >= 1
    assert sink.dropped["queue_full"] + sink.dropped["store_error"] == 1000
    assert _dropped(samples, "queue_full") == sink.dropped["queue_full"]
    assert _dropped(samples, "store_error") == sink.dropped["store_error"]
    assert samples[("llmslo_internal_errors_total", ())] == sink.store_errors >= 1


def test_drops_before_the_sink_is_attached_reach_the_metrics_too() -> None:
    store = LockedStore()
    sink = SummarySink(store, capacity=1)
    sink({"request_id": "a"})
    sink({"request_id": "b"})  # the queue is full: dropped before any Telemetry took the sink
    tel = Telemetry(sink=sink)
    assert tel.metrics.value("summaries_dropped", reason="queue_full") == sink.dropped["queue_full"] == 1
    store.unlock.set()
    sink.close()


@pytest.mark.parametrize("timeout_s", [-1, float("nan"), "2"])
def test_a_bad_close_timeout_raises_naming_it_and_leaves_the_sink_open(timeout_s: object) -> None:
    store = LockedStore()
    store.unlock.set()
    sink = SummarySink(store)
    with pytest.raises(Exception, match=r"SummarySink\.close\.timeout_s"):
        sink.close(timeout_s=timeout_s)  # type: ignore[arg-type]
    sink({"request_id": "a"})
    sink.close()
    assert store.rows == [{"request_id": "a"}]
