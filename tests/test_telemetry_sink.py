"""The summary sink never blocks or raises on the request path; losses are counted; shutdown flushes."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq

from llmslo.analysis import Store
from llmslo.analysis.store._sink_writers import DuckDBSummaryWriter, ParquetSummaryWriter
from llmslo.telemetry import JsonlWriter, SummarySink, Telemetry, validate_summary


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
    assert tel.guard.errors == {}


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
