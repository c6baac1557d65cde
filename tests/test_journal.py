"""The write-ahead journal of requests (``llmslo.telemetry.Journal``): appends in memory, batched writes, the
progress of open requests, rotation under a size cap, the caps on what it holds, a real crash (SIGKILL) and the
recovery of what it left (torn last line included), and its wiring into ``Telemetry`` and ``SummarySink``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from llmslo.telemetry import (
    CRASH_ERROR_TYPE,
    ConfigurationError,
    Journal,
    JournalInUse,
    JsonlWriter,
    SummarySink,
    Telemetry,
    crash_row,
    read_journal,
    recover_journal,
    stored_in_jsonl,
    validate_summary,
)

T0 = 1_790_000_000.0
"""Unix seconds all the tests' arrivals are counted from (a time a store accepts)."""


class Clock:
    """A settable wall clock (Unix seconds)."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def journals() -> Iterator[Any]:
    """Makes journals whose thread stays idle (flushes are the test's), closed at the end."""
    made: list[Journal] = []

    def make(folder: Path, **kw: Any) -> Journal:
        kw.setdefault("flush_interval_s", 60.0)
        kw.setdefault("progress_interval_s", 0.0)
        j = Journal(folder, **kw)
        made.append(j)
        return j

    yield make
    for j in made:
        j.close(timeout_s=5)


def segment_lines(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted(folder.glob("segment-*.wal")) for line in p.read_text().splitlines()]


def wait_for(check: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


# ---- writing -----------------------------------------------------------------------------------------------


def test_entries_wait_in_memory_until_a_flush_writes_them_and_a_close_ends_one(tmp_path: Path, journals: Any) -> None:
    clock = Clock()
    j = journals(tmp_path / "j", clock_unix_s=clock)
    j.open_request("a", T0 + 1, "m", "v1", "default", 10)
    j.open_request("b", T0 + 2, "m", "v1", "batch")
    j.open_request("c", T0 + 3, "m2", "v2", "default", 5)
    j.close_request("a")
    assert not [line for line in segment_lines(tmp_path / "j") if "o" in line]  # nothing written yet
    clock.t = T0 + 4
    j.flush()
    state = read_journal(tmp_path / "j")
    assert [e.request_id for e in state.pending] == ["b", "c"] and state.closed == 1 and state.torn_lines == 0
    b, c = state.pending
    assert (b.arrival_unix_s, b.model, b.version, b.tenant_class, b.prompt_tokens) == (T0 + 2, "m", "v1", "batch", None)
    assert (c.model, c.version, c.prompt_tokens, c.known_until_unix_s) == ("m2", "v2", 5, T0 + 4)
    assert j.entries_written == 3


def test_a_request_closed_in_the_batch_it_ended_in_is_written_closed_only(tmp_path: Path, journals: Any) -> None:
    j = journals(tmp_path / "j")
    for rid in ("a", "b"):
        j.open_request(rid, T0, "m", "v1", "default", 10)
    j.flush()
    j.end_request("a")
    j.end_request("b")
    j.close_request("a")  # a's summary written before this batch: its end says nothing more
    j.flush()
    batch = segment_lines(tmp_path / "j")[-3:]
    assert batch[0] == {"x": ["a"]} and batch[1] == {"d": ["b"]} and "t" in batch[2]
    state = read_journal(tmp_path / "j")
    assert [(e.request_id, e.ended) for e in state.pending] == [("b", True)] and state.closed == 1


def test_enough_waiting_entries_wake_the_writer_before_its_interval(tmp_path: Path, journals: Any) -> None:
    j = journals(tmp_path / "j", flush_entries=3)
    for i in range(4):
        j.open_request(f"r{i}", T0, "m", "v", "default")
    assert wait_for(lambda: len(read_journal(tmp_path / "j").pending) == 4), "the writer was not woken"


def test_progress_is_read_at_flush_time_and_written_only_when_it_changed(tmp_path: Path, journals: Any) -> None:
    j = journals(tmp_path / "j")
    progress: list[object] = [12, 3, 2, 0.25, 0.5, 0.75]
    j.open_request("s", T0, "m", "v", "default", None, lambda: tuple(progress))
    j.flush()
    j.flush()  # unchanged: no second progress line
    progress[1:3] = [6, 6]
    progress[5] = 1.25
    j.flush()
    g_lines = [line["g"] for line in segment_lines(tmp_path / "j") if "g" in line]
    assert g_lines == [{"s": [12, 3, 2, 250_000, 500_000, 750_000]}, {"s": [12, 6, 6, 250_000, 500_000, 1_250_000]}]
    (entry,) = read_journal(tmp_path / "j").pending
    assert entry.progress is not None and entry.progress.sent_tokens == 6 and entry.progress.prompt_tokens == 12


def test_a_progress_callable_that_raises_is_counted_and_the_entry_kept(tmp_path: Path, journals: Any) -> None:
    j = journals(tmp_path / "j")

    def broken() -> Sequence[object]:
        raise RuntimeError("boom")

    j.open_request("s", T0, "m", "v", "default", 4, broken)
    j.flush()
    assert j.guard.errors.get("journal.progress") == 1
    assert [e.request_id for e in read_journal(tmp_path / "j").pending] == ["s"]


def test_segments_rotate_at_the_size_cap_keeping_only_the_open_requests(tmp_path: Path, journals: Any) -> None:
    folder = tmp_path / "j"
    j = journals(folder, segment_bytes=2_000)
    j.open_request("long", T0, "m", "v", "default", 7, lambda: (7, 1, 1, 0.1, 0.2, 0.2))
    biggest = 0
    for i in range(300):  # ~ 30 kB of short requests through a 2 kB cap
        j.open_request(f"short-{i}", T0 + i, "m", "v", "default", 3)
        j.close_request(f"short-{i}")
        if i % 10 == 9:
            j.flush()
            biggest = max(biggest, sum(p.stat().st_size for p in folder.glob("segment-*.wal")))
    segments = sorted(folder.glob("segment-*.wal"))
    assert len(segments) == 1 and segments[0].name != "segment-00000001.wal"  # rotated, the old ones deleted
    assert biggest < 2_000 + 1_000  # the cap, plus the batch that crossed it, plus a checkpoint of one request
    state = read_journal(folder)
    (entry,) = state.pending  # the checkpoint carried the open request, with its progress
    assert entry.request_id == "long" and entry.progress is not None and entry.progress.generated_tokens == 1


def test_beyond_max_open_or_capacity_a_request_is_not_journaled_and_counted(tmp_path: Path, journals: Any) -> None:
    j = journals(tmp_path / "j", max_open=2, capacity=3)
    for i in range(4):  # the fourth finds 3 waiting: buffer_full
        j.open_request(f"r{i}", T0, "m", "v", "default")
    j.flush()  # of the three taken, the third finds two open: max_open
    assert j.dropped == {"buffer_full": 1, "max_open": 1, "too_long": 0}
    assert [e.request_id for e in read_journal(tmp_path / "j").pending] == ["r0", "r1"]
    j.close_request("r0")
    j.open_request("x" * 2_000, T0, "m", "v", "default")
    j.flush()
    assert j.dropped == {"buffer_full": 1, "max_open": 1, "too_long": 1}
    assert j.guard.errors.get("journal.max_open") == 1 and j.guard.errors.get("journal.too_long") == 1


def test_a_bad_entry_is_counted_and_the_others_written(tmp_path: Path, journals: Any) -> None:
    j = journals(tmp_path / "j")
    j.open_request(12345, T0, "m", "v", "default")  # type: ignore[arg-type]
    j.open_request("ok", float("nan"), "m", "v", "default")
    j.open_request("inf", float("inf"), "m", "v", "default")
    j.open_request("before-1970", -1.0, "m", "v", "default")
    j.open_request("a-microsecond-before-1970", -1e-6, "m", "v", "default")
    j.open_request("text-count", T0, "m", "v", "default", "12")  # type: ignore[arg-type]
    j.open_request("float-count", T0, "m", "v", "default", 12.5)  # type: ignore[arg-type]
    j.open_request("fine", T0, "m", "v", "default", True)  # a bool is an integer: 1
    j.flush()
    assert j.guard.errors.get("journal.entry") == 7
    (fine,) = read_journal(tmp_path / "j").pending
    assert (fine.request_id, fine.prompt_tokens) == ("fine", 1)


def test_a_clean_close_with_nothing_open_leaves_no_segment(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j", flush_interval_s=60)
    j.open_request("a", T0, "m", "v", "default")
    j.close_request("a")
    j.close()
    assert list((tmp_path / "j").glob("segment-*.wal")) == []
    j.open_request("late", T0, "m", "v", "default")  # after close: not journaled, counted
    assert j.dropped["buffer_full"] == 1


def test_close_waits_for_a_hung_write_at_most_its_timeout_and_keeps_the_journal(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j", flush_interval_s=60)
    release = threading.Event()
    writing = threading.Event()
    real = j._write

    def hung(text: str) -> None:  # a disk that does not answer
        writing.set()
        release.wait(30)
        real(text)

    j._write = hung  # type: ignore[method-assign]
    j.open_request("a", T0, "m", "v", "default")
    flusher = threading.Thread(target=j.flush)
    flusher.start()
    assert writing.wait(10)
    closer = threading.Thread(target=j.close, kwargs={"timeout_s": 0.2})
    closer.start()
    closer.join(30)
    assert not closer.is_alive() and not release.is_set()  # close returned while the write still hangs
    assert j.is_closed and j.guard.errors.get("journal.close") == 1
    release.set()
    flusher.join(10)
    assert [e.request_id for e in read_journal(tmp_path / "j").pending] == ["a"]  # kept for the next start


def test_a_second_writer_or_a_recovery_is_refused_while_a_journal_is_open(tmp_path: Path, journals: Any) -> None:
    journals(tmp_path / "j")
    with pytest.raises(JournalInUse, match=rf"the journal .* is in use by process {os.getpid()} \(a running server"):
        Journal(tmp_path / "j")
    with pytest.raises(JournalInUse, match=f"in use by process {os.getpid()}"):
        recover_journal(tmp_path / "j", lambda rows: None)


@pytest.mark.parametrize(("field", "value"), [("segment_bytes", 0), ("max_open", True), ("flush_interval_s", 0),
                                              ("progress_interval_s", -1), ("capacity", 1.5)])
def test_a_bad_parameter_names_the_field_and_makes_nothing(tmp_path: Path, field: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=f"Journal.{field}: must be"):
        Journal(tmp_path / "j", **{field: value})
    assert not (tmp_path / "j").exists()


# ---- a crash and the recovery ------------------------------------------------------------------------------

CRASH = """
import os, signal, sys
from llmslo.telemetry import Journal
t0 = float(sys.argv[2])
now = [t0 + 8]
j = Journal(sys.argv[1], flush_interval_s=60, progress_interval_s=0, clock_unix_s=lambda: now[0])
j.open_request("waiting", t0, "m", "v1", "batch", 7, lambda: (7, 0, 0, 0.5, None, None))
j.open_request("streaming", t0 + 1, "m", "v1", "default", None, lambda: (12, 5, 4, 0.5, 0.75, 1.5))
j.open_request("done", t0 + 2, "m", "v1", "default", 3)
j.close_request("done")
j.open_request("blind", t0 + 3, "m", "v1", "default", 3)  # no progress to read
j.open_request("ended", t0 + 4, "m", "v1", "default", 3, lambda: (3, 10, 9, 0.1, 0.2, 2.4))
j.flush()
now[0] = t0 + 10
j.end_request("ended")  # ended; its summary handed to the sink, not yet written
j.flush()
j.open_request("unflushed", t0 + 3, "m", "v1", "default", 3)  # in memory only when the process dies
os.kill(os.getpid(), signal.SIGKILL)
"""


def crashed(folder: Path) -> Path:
    """A journal whose process was killed (SIGKILL): three requests in flight (one without progress), one ended
    with its summary unwritten, one closed, one not yet flushed; its batches (progress read) at T0 + 8 and
    T0 + 10."""
    out = subprocess.run([sys.executable, "-c", CRASH, str(folder), repr(T0)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == -9, out.stderr
    return folder


def test_a_killed_process_leaves_its_open_requests_and_recovery_makes_one_crash_row_each(tmp_path: Path) -> None:
    folder = crashed(tmp_path / "j")
    written: list[list[dict[str, object]]] = []
    report = recover_journal(folder, lambda rows: written.append(rows))
    assert (report.recovered, report.ended, report.already_stored, report.torn_lines) == (4, 1, 0, 0)
    assert report.message() == ("recovered 4 requests from the journal (1 of them had ended, their summaries "
                                "unwritten); 0 already had summaries")
    (rows,) = written
    by_id = {r["request_id"]: r for r in rows}
    assert set(by_id) == {"waiting", "streaming", "blind", "ended"}
    for row in rows:
        assert validate_summary(row) == [], row
        assert (row["finish_reason"], row["error_type"]) == ("error", CRASH_ERROR_TYPE)
    waiting, streaming, blind, ended = by_id["waiting"], by_id["streaming"], by_id["blind"], by_id["ended"]
    # the last time it was known in flight (its process's last batch, T0 + 10, when its progress was read and it
    # still had no token) minus its arrival: a lower bound
    assert (waiting["e2e_s"], waiting["ttft_s"], waiting["generated_tokens"], waiting["queue_s"]) == (10.0, None, 0,
                                                                                                      0.5)
    assert (waiting["prompt_tokens"], waiting["tenant_class"], waiting["arrival_unix_s"]) == (7, "batch", T0)
    assert (blind["e2e_s"], blind["ttft_s"]) == (0.0, None)  # never seen without a token: TTFT censored at 0
    assert (streaming["e2e_s"], streaming["prompt_tokens"], streaming["generated_tokens"],
            streaming["sent_tokens"]) == (9.0, 12, 5, 4)
    assert (streaming["queue_s"], streaming["ttft_s"], streaming["last_token_s"]) == (0.5, 0.75, 1.5)
    # ended between the batches at T0 + 8 and T0 + 10: last known in flight at T0 + 8
    assert (ended["e2e_s"], ended["generated_tokens"], ended["sent_tokens"], ended["last_token_s"]) == (4.0, 10, 9, 2.4)
    assert list(folder.glob("segment-*.wal")) == []  # emptied: everything open is in the rows
    again = recover_journal(folder, lambda rows: written.append(rows))
    assert (again.recovered, again.already_stored, len(written)) == (0, 0, 1)  # idempotent


def test_a_row_without_a_token_ends_where_it_was_last_seen_without_one(tmp_path: Path, journals: Any) -> None:
    clock = Clock(T0 + 1)
    j = journals(tmp_path / "j", clock_unix_s=clock, progress_interval_s=5.0)
    j.open_request("queued", T0, "m", "v", "default", 9, lambda: (9, 0, 0, None, None, None))
    j.open_request("streaming", T0, "m", "v", "default", 9, lambda: (9, 2, 2, 0.1, 0.3, 0.6))
    j.flush()  # T0 + 1: progress read
    clock.t = T0 + 3
    j.flush()  # T0 + 3: alive, no read (its first token may have come since the read at T0 + 1)
    rows = {r["request_id"]: r for r in (crash_row(e) for e in read_journal(tmp_path / "j").pending)}
    assert rows["queued"]["e2e_s"] == 1.0  # censored where it surely had no token: at the read
    assert rows["streaming"]["e2e_s"] == 3.0  # in flight at the last batch


def test_a_torn_last_line_is_skipped_counted_and_not_fatal(tmp_path: Path) -> None:
    folder = crashed(tmp_path / "j")
    (segment,) = folder.glob("segment-*.wal")
    with segment.open("a") as fh:
        fh.write('{"o":"torn","a":17900')  # a write cut short by the crash
    state = read_journal(folder)
    assert state.torn_lines == 1 and {e.request_id for e in state.pending} == {"waiting", "streaming", "blind",
                                                                               "ended"}
    report = recover_journal(folder, lambda rows: None)
    assert (report.recovered, report.torn_lines) == (4, 1)
    assert report.message().endswith("; 1 torn line skipped (a write cut short by the crash)")


def test_requests_that_already_have_a_summary_get_no_second_row(tmp_path: Path) -> None:
    folder = crashed(tmp_path / "j")
    written: list[dict[str, object]] = []

    def write(rows: list[dict[str, object]]) -> int:
        written.extend(rows)
        return 1  # the destination already held one of them and skipped it

    report = recover_journal(folder, write, stored=lambda ids: {"waiting", "blind"} & set(ids))
    assert [r["request_id"] for r in written] == ["streaming", "ended"]
    assert (report.recovered, report.already_stored) == (1, 3)
    assert report.message() == ("recovered 1 request from the journal (1 of them had ended, their summaries "
                                "unwritten); 3 already had summaries")


def test_a_failed_write_keeps_the_journal_for_the_next_attempt(tmp_path: Path) -> None:
    folder = crashed(tmp_path / "j")

    def failing(rows: list[dict[str, object]]) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        recover_journal(folder, failing)
    assert recover_journal(folder, lambda rows: None).recovered == 4


def test_a_new_journal_carries_what_a_killed_one_left_with_its_own_last_time(tmp_path: Path) -> None:
    folder = crashed(tmp_path / "j")
    clock = Clock(T0 + 500)  # the next process starts much later
    j = Journal(folder, flush_interval_s=60, clock_unix_s=clock)
    assert j.carried == 4
    j.open_request("new", T0 + 501, "m", "v1", "default")
    j.flush()
    j.close()  # entries left open: the segments stay
    state = read_journal(folder)
    rows = {r["request_id"]: r for r in (crash_row(e) for e in state.pending)}
    assert set(rows) == {"waiting", "streaming", "blind", "ended", "new"}
    assert rows["waiting"]["e2e_s"] == 10.0  # still the killed process's last time, not the new one's
    assert rows["ended"]["e2e_s"] == 4.0 and [e.ended for e in state.pending] == [False, False, False, True, False]
    assert rows["new"]["e2e_s"] == 0.0


def test_stored_in_jsonl_finds_the_ids_the_writer_wrote(tmp_path: Path) -> None:
    writer = JsonlWriter(tmp_path / "s")
    tel = Telemetry(sink=lambda row: writer.write([row]))
    for rid in ("a", 'q"uote', "c"):
        tel.start(rid, model="m").finish("stop")
    writer.close()
    with (tmp_path / "s" / "broken.jsonl").open("w") as fh:
        fh.write('{"request_id":"b","mod\n')
    assert stored_in_jsonl(tmp_path / "s", ["a", 'q"uote', "b", "z"]) == {"a", 'q"uote'}
    assert stored_in_jsonl(tmp_path / "missing", ["a"]) == set()


# ---- with Telemetry and the summary sink -------------------------------------------------------------------


class SlowWriter:
    """A summary writer that holds each batch until released."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.release = threading.Event()

    def write(self, rows: Sequence[Any]) -> None:
        self.release.wait(30)
        self.rows.extend(rows)

    def close(self) -> None:
        pass


def test_a_tracker_stays_open_in_the_journal_until_the_sink_wrote_its_summary(tmp_path: Path,
                                                                              journals: Any) -> None:
    j = journals(tmp_path / "j")
    writer = SlowWriter()
    sink = SummarySink(writer, flush_interval_s=0.01)
    tel = Telemetry(sink=sink, journal=j, version="v7")
    t = tel.start("r1", model="m", tenant_class="batch")
    t.prompt_tokens = 9  # known after arrival, as a server parses the body later
    t.admit()
    t.schedule()
    for _ in range(3):
        t.commit()
        t.send()
    j.flush()
    (entry,) = read_journal(tmp_path / "j").pending
    assert (entry.version, entry.tenant_class) == ("v7", "batch")
    assert entry.progress is not None and (entry.progress.prompt_tokens, entry.progress.generated_tokens,
                                           entry.progress.sent_tokens) == (9, 3, 3)
    t.finish("stop")
    j.flush()
    (entry,) = read_journal(tmp_path / "j").pending  # handed over, not written: ended, no more progress read
    assert entry.ended and (entry.progress is not None and entry.progress.generated_tokens == 3)
    summary = t.summary
    assert summary is not None and 0 <= float(crash_row(entry)["e2e_s"]) <= float(summary["e2e_s"])  # type: ignore[arg-type]
    writer.release.set()
    sink.close(timeout_s=10)
    j.flush()
    assert read_journal(tmp_path / "j").pending == () and [r["request_id"] for r in writer.rows] == ["r1"]


def test_summaries_the_sink_drops_are_closed_too(tmp_path: Path, journals: Any) -> None:
    j = journals(tmp_path / "j")
    writer = SlowWriter()
    sink = SummarySink(writer, capacity=1, flush_interval_s=60)
    tel = Telemetry(sink=sink, journal=j)
    for rid in ("kept", "dropped"):
        tel.start(rid, model="m").finish("stop")
    assert sink.dropped["queue_full"] == 1
    j.flush()
    assert [e.request_id for e in read_journal(tmp_path / "j").pending] == ["kept"]
    sink.close(timeout_s=0)  # the queued one is counted dropped at the close: settled as well
    j.flush()
    assert read_journal(tmp_path / "j").pending == ()
    writer.release.set()


def test_the_sink_tells_each_summary_once_written_or_dropped(tmp_path: Path) -> None:
    settled: list[str] = []
    writer = SlowWriter()
    writer.release.set()
    sink = SummarySink(writer, capacity=2, flush_interval_s=60)
    sink.on_settled(lambda rows: settled.extend(str(r["request_id"]) for r in rows))
    for i in range(3):
        sink({"request_id": f"r{i}"})
    assert settled == ["r2"]  # refused at the door
    sink.close(timeout_s=10)
    assert sorted(settled) == ["r0", "r1", "r2"] and sink.written == 2


def test_without_a_sink_that_tells_the_entry_closes_at_the_terminal_state(tmp_path: Path, journals: Any) -> None:
    j = journals(tmp_path / "j")
    rows: list[Any] = []
    tel = Telemetry(sink=rows.append, journal=j)
    t = tel.start("r1", model="m")
    j.flush()
    assert len(read_journal(tmp_path / "j").pending) == 1
    t.finish("client_cancel")
    j.flush()
    assert read_journal(tmp_path / "j").pending == () and len(rows) == 1


def test_telemetry_refuses_a_journal_that_is_not_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"Telemetry\.journal: expected a Journal"):
        Telemetry(journal=object())  # type: ignore[arg-type]


def test_a_journal_that_raises_never_reaches_the_request(tmp_path: Path) -> None:
    class Broken:
        def open_request(self, *args: object) -> None:
            raise RuntimeError("boom")

        def end_request(self, request_id: str) -> None:
            raise RuntimeError("boom")

        def close_request(self, request_id: str) -> None:
            raise RuntimeError("boom")

        def close_rows(self, rows: object) -> None:
            raise RuntimeError("boom")

    tel = Telemetry(journal=Broken())
    t = tel.start("r1", model="m")
    assert t.finish("stop") and t.summary is not None
    assert tel.guard.errors == {"journal.open": 1, "journal.close": 1}


# ---- llmslo ingest --recover -------------------------------------------------------------------------------


@pytest.mark.integration
def test_ingest_recover_loads_each_row_once_and_the_report_censors_the_one_without_a_token(tmp_path: Path) -> None:
    pytest.importorskip("duckdb", reason="llmslo ingest needs the analysis extra")
    from typer.testing import CliRunner

    from llmslo.cli._app import app

    runner = CliRunner()
    folder = crashed(tmp_path / "j")
    db = str(tmp_path / "s.duckdb")
    first = runner.invoke(app, ["ingest", "--recover", str(folder), "--db", db])
    assert first.exit_code == 0, first.output
    said = " ".join(first.output.split())
    assert (f"journal {folder}: recovered 4 requests from the journal (1 of them had ended, their summaries "
            "unwritten); 0 already had summaries") in said and "4 request summaries" in said
    again = runner.invoke(app, ["ingest", "--recover", str(folder), "--db", db, "--json"])
    assert again.exit_code == 0, again.output
    out = json.loads(again.output)
    assert out["recovery"] == {"journal": str(folder), "recovered": 0, "already_stored": 0, "torn_lines": 0}
    assert out["store_rows"] == 4  # nothing added twice

    report = runner.invoke(app, ["report", "--db", db, "--json"])
    assert report.exit_code == 0, report.output
    (group,) = json.loads(report.output)["groups"]
    aware = group["survivor_bias"]["ttft_censoring_aware"]
    # waiting and blind had no token: censored at their e2e_s (10 s, 0 s); streaming and ended had one each
    assert (aware["count"], aware["events"], aware["censored"], aware["at_least_s"]) == (4, 2, 2, 10.0)


def test_ingest_recover_names_a_missing_journal(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from llmslo.cli._app import app

    result = CliRunner().invoke(app, ["ingest", "--recover", str(tmp_path / "none.journal"), "--db",
                                      str(tmp_path / "s.duckdb")])
    assert result.exit_code == 1
    assert f"--recover: no journal folder at {tmp_path / 'none.journal'}" in " ".join(result.output.split())
    assert list(tmp_path.iterdir()) == []


def test_ingest_recover_is_refused_while_a_server_writes_the_journal(tmp_path: Path, journals: Any) -> None:
    pytest.importorskip("duckdb", reason="llmslo ingest needs the analysis extra")
    from typer.testing import CliRunner

    from llmslo.cli._app import app

    journals(tmp_path / "j")
    result = CliRunner().invoke(app, ["ingest", "--recover", str(tmp_path / "j"), "--db", str(tmp_path / "s.duckdb")])
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert f"in use by process {os.getpid()} (a running server writes it): recover it once that server has stopped" \
        in said, said
    assert not (tmp_path / "s.duckdb").exists()  # refused before anything changed


def test_an_ended_request_holds_no_reference_to_its_progress_source(tmp_path: Path, journals: Any) -> None:
    import gc
    import weakref

    class Source:
        def progress(self) -> tuple[int, int, int, None, None, None]:
            return (3, 1, 1, None, None, None)

    j = journals(tmp_path / "j")
    source = Source()
    gone = weakref.ref(source)
    j.open_request("r", T0, "m", "v", "default", 3, source.progress)
    j.flush()
    j.end_request("r")
    j.flush()  # ended, its summary not yet written: still open in the journal
    del source
    gc.collect()
    assert gone() is None  # the request's tracker is not kept alive until its summary is written
    assert [e.request_id for e in read_journal(tmp_path / "j").pending] == ["r"]
