"""Records written later (``Telemetry.record_later``): the terminal state is committed at once, its record (summary
row, metrics, exemplar) within the delay, in the order the requests ended; a read of the metrics, a flush, or
switching back writes what waits; nothing is lost or written twice; the waiting stay bounded."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from llmslo.telemetry import ConfigurationError, Telemetry
from llmslo.telemetry._exposition import render_metrics
from llmslo.telemetry._later import MAX_WAITING, SLICE, LaterRecords


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def _finished(tel: Telemetry, rid: str, tokens: int = 3) -> Any:
    t = tel.start(rid, model="m", prompt_tokens=5)
    t.admit()
    t.schedule()
    for _ in range(tokens):
        t.commit()
        t.send()
    assert t.finish("stop")
    return t


def test_a_record_waits_for_the_delay_and_keeps_the_times_of_the_requests_end() -> None:
    async def go() -> None:
        rows: list[dict[str, object]] = []
        tel = Telemetry(version="v", sink=rows.append)
        tel.record_later(0.05)
        t = _finished(tel, "r1")
        assert t.done and t.finish_reason == "stop" and tel.in_flight() == []  # the terminal state: at once
        assert rows == [] and t.summary is None  # its record: later
        await asyncio.sleep(0.2)
        assert [r["request_id"] for r in rows] == ["r1"] and t.summary is rows[0]
        assert rows[0]["e2e_s"] == (t.finish_ns - t.arrival_ns) / 1e9  # the end's own clock reading
        assert rows[0]["generated_tokens"] == rows[0]["sent_tokens"] == 3
        tel.record_later(None)

    run(go())


def test_a_read_of_the_metrics_writes_the_records_waiting_first() -> None:
    async def go() -> None:
        rows: list[dict[str, object]] = []
        tel = Telemetry(version="v", sink=rows.append)
        tel.record_later(60.0)
        _finished(tel, "r1")
        _finished(tel, "r2")
        assert rows == []
        assert tel.metrics.value("requests", model="m", finish_reason="stop", tenant_class="default", version="v") == 2
        assert [r["request_id"] for r in rows] == ["r1", "r2"]
        _finished(tel, "r3")
        text, _ = render_metrics(tel.registry)  # a scrape
        assert b'llmslo_requests_total{finish_reason="stop",model="m",tenant_class="default",version="v"} 3.0' in text
        assert len(rows) == 3
        tel.record_later(None)

    run(go())


def test_the_exemplar_is_stamped_with_the_wall_clock_at_the_requests_end() -> None:
    async def go() -> None:
        now = [1000.0]
        tel = Telemetry(version="v", clock_unix_s=lambda: now[0])
        tel.record_later(60.0)
        _finished(tel, "r1")
        now[0] = 2000.0  # written later: its exemplar keeps the end's time
        text, _ = render_metrics(tel.registry, "application/openmetrics-text")
        line = next(x for x in text.decode().splitlines() if x.startswith("llmslo_requests_total{"))
        assert line.endswith('# {request_id="r1"} 1.0 1000.0'), line
        tel.record_later(None)

    run(go())


def test_records_are_written_in_order_a_slice_at_a_time_each_once() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        later = LaterRecords(loop, 0.01)
        written: list[int] = []
        for i in range(2 * SLICE + 3):
            later.add(lambda i=i: written.append(i))
        assert written == []
        await asyncio.sleep(0.05)
        assert written == list(range(2 * SLICE + 3)) and len(later) == 0
        # a slice per turn of the loop: the reads between them are not held up by a burst of records
        for i in range(2 * SLICE):
            later.add(lambda i=i: written.append(i))
        later._due()
        assert len(written) == 2 * SLICE + 3 + SLICE
        await asyncio.sleep(0)
        assert len(written) == 2 * SLICE + 3 + 2 * SLICE
        later.close()

    run(go())


def test_the_records_waiting_stay_bounded_when_ends_come_faster_than_the_loop_turns() -> None:
    async def go() -> None:
        later = LaterRecords(asyncio.get_running_loop(), 60.0)
        written: list[int] = []
        for i in range(3 * MAX_WAITING):
            later.add(lambda i=i: written.append(i))
            assert len(later) <= MAX_WAITING
        assert written == list(range(len(written))) and len(written) >= 2 * MAX_WAITING  # the oldest first
        later.close()
        assert written == list(range(3 * MAX_WAITING))

    run(go())


def test_switching_back_writes_what_waits_and_a_request_ended_on_another_thread_is_recorded_at_once() -> None:
    async def go() -> None:
        rows: list[dict[str, object]] = []
        tel = Telemetry(version="v", sink=rows.append)
        tel.record_later(60.0)
        _finished(tel, "r1")
        worker = threading.Thread(target=_finished, args=(tel, "on-a-thread"))
        worker.start()
        worker.join()
        assert [r["request_id"] for r in rows] == ["on-a-thread"]  # no loop on that thread to write it later
        tel.record_later(None)
        assert [r["request_id"] for r in rows] == ["on-a-thread", "r1"]
        _finished(tel, "r2")
        assert rows[-1]["request_id"] == "r2"  # at once again
        tel.flush_records()  # nothing waits: nothing happens
        assert len(rows) == 3

    run(go())


@pytest.mark.parametrize("delay", [0, -1.0, float("nan"), True, "0.05"])
def test_a_bad_delay_is_refused_and_changes_nothing(delay: object) -> None:
    async def go() -> None:
        rows: list[dict[str, object]] = []
        tel = Telemetry(version="v", sink=rows.append)
        with pytest.raises(ConfigurationError, match="record_later: expected seconds > 0 or None"):
            tel.record_later(delay)  # type: ignore[arg-type]
        _finished(tel, "r1")
        assert len(rows) == 1

    run(go())


def test_writing_later_needs_a_running_event_loop() -> None:
    tel = Telemetry(version="v")
    with pytest.raises(ConfigurationError, match="needs a running event loop"):
        tel.record_later(0.05)
