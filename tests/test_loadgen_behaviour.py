"""Client behaviours against the test server under uvicorn: Retry-After honoured (no attempt earlier than it),
the breaker, a slow reader the server feels, the concurrency bound and the lateness it causes, stopping with
every summary written; and the seeded choice of which requests get a behaviour."""

from __future__ import annotations

import asyncio
import io
import json
import math
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from llmslo.loadgen import Behaviours, Cancel, LoadConfig, LoadRun, RequestPlan, SlowReader, Target
from llmslo.telemetry import validate_summary
from llmslo.tests._loadgen_server import ServerProcess
from llmslo.tests._loadgen_util import MODEL, at, run

pytestmark = pytest.mark.integration
NS = 1e9


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as srv:
        yield srv


def _every(step_s: float, n: int) -> list[float]:
    return [i * step_s for i in range(n)]


def _retry_after_violations(entries: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """Attempts sent while an earlier answer's Retry-After ran: (request id, seconds too early)."""
    holds = [(e["headers_ns"], e["headers_ns"] + float(e["retry_after"]) * NS) for e in entries
             if e["status"] in (429, 503) and e["retry_after"] is not None]
    bad = []
    for e in entries:
        sent = e["sent_ns"]
        if sent is None:
            continue
        for start, end in holds:
            if start < sent < end:
                bad.append((e["request_id"], (end - sent) / NS))
    return bad


# ---- Retry-After and the breaker ------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "kind"), [(429, "rate_limited"), (503, "draining")])
def test_no_attempt_is_sent_before_a_retry_after_has_passed(server: ServerProcess, status: int, kind: str) -> None:
    url = server.url(status=status, type=kind, retry_after=1, reject_first=1, key=uuid.uuid4().hex)
    result, entries = run(url, at(*_every(0.05, 40)))
    assert _retry_after_violations(entries) == []
    refused = [e for e in entries if e["breaker_refused"]]
    assert refused, "arrivals during the Retry-After must be refused, not sent"
    assert all(r["finish_reason"] == "rejected" and r["reject_reason"] == "circuit_open" and r["client_e2e_s"] is None
               for r in result.rows if r["request_id"] in {e["request_id"] for e in refused})
    first = next(e for e in entries if e["status"] == status)
    assert all(first["headers_ns"] <= e["scheduled_ns"] < first["headers_ns"] + 1.05 * NS for e in refused)
    assert [r["finish_reason"] for r in result.rows].count("length") == 40 - 1 - len(refused)


def test_without_honouring_retry_after_the_arrivals_are_sent(server: ServerProcess) -> None:
    url = server.url(status=429, type="rate_limited", retry_after=1, reject_first=1, key=uuid.uuid4().hex)
    result, entries = run(url, at(*_every(0.05, 20)), honour_retry_after=False)
    assert not any(e["breaker_refused"] for e in entries) and result.sent == 20
    assert _retry_after_violations(entries)  # sent inside the window, as asked


def test_consecutive_failures_trip_the_client_breaker_unless_it_is_switched_off(server: ServerProcess) -> None:
    result, entries = run(server.url(status=500), at(*_every(0.05, 12)))
    opened = result.breaker_events[0]
    assert (opened.from_state, opened.to_state, opened.why) == ("closed", "open", "5 consecutive failures")
    sent = [e for e in entries if not e["breaker_refused"]]
    assert len(sent) >= 5 and all(e["error_type"] == "http_500" for e in sent)
    assert all(e["sent_ns"] < opened.time_s * NS for e in sent)             # nothing sent once it opened
    assert result.refused == 12 - len(sent) >= 1
    result, _ = run(server.url(status=500), at(*_every(0.02, 12)), breaker=False)
    assert result.sent == 12 and result.refused == 0


# ---- slow reader ---------------------------------------------------------------------------------------


def test_a_slow_reader_reads_at_its_pace_and_the_server_feels_it() -> None:
    """2,000 events of ~1 kB read at 1,000 tokens/s: the server's own sends stretch over most of the 2 s (a
    receive buffer the kernel grew would absorb about half of the stream and let the server finish early)."""
    tokens, pace = 2000, 1000.0
    with ServerProcess(sndbuf=65_536) as srv:
        slow, _ = run(srv.url(tokens=tokens, pad=1000), at(0.0, output=tokens),
                      behaviours=Behaviours(slow_reader=SlowReader(1.0, pace)))
        row = slow.rows[0]
        seen = srv.stats(row["request_id"])
        fast = run(srv.url(tokens=tokens, pad=1000), at(0.0, output=tokens))[0].rows[0]
        fast_seen = srv.stats(fast["request_id"])
    read_s = (tokens - 1) / pace
    assert row["finish_reason"] == "length" and row["generated_tokens"] == tokens
    assert row["last_token_s"] - row["ttft_s"] >= 0.95 * read_s             # the client kept its pace
    server_s = (seen["last_send_ns"] - seen["first_send_ns"]) / NS
    assert server_s >= 0.7 * read_s, f"the server sent for {server_s:.3f} s of a {read_s:.1f} s read"
    assert (fast_seen["last_send_ns"] - fast_seen["first_send_ns"]) / NS < server_s


def test_behaviours_go_to_their_share_of_requests_by_seed() -> None:
    b = Behaviours(slow_reader=SlowReader(0.25, 10.0), cancel=Cancel(0.1, 1.0), timeout_s=30.0, seed=5)
    plans = [b.plan(i) for i in range(4000)]
    for share, n in ((0.25, sum(p.slow_tokens_per_s == 10.0 for p in plans)),
                     (0.10, sum(p.cancel_after_s == 1.0 for p in plans))):
        assert abs(n - share * 4000) <= 5 * math.sqrt(4000 * share * (1 - share))
    assert all(p.timeout_s == 30.0 for p in plans)
    assert plans == [b.plan(i) for i in range(4000)]                       # the same seed, the same choice
    other = Behaviours(slow_reader=SlowReader(0.25, 10.0), seed=6)
    assert [p.slow_tokens_per_s for p in plans] != [other.plan(i).slow_tokens_per_s for i in range(4000)]


def test_the_earlier_of_cancel_and_timeout_decides_the_hang_up() -> None:
    assert RequestPlan(None, 2.0, 5.0).deadline_s == 2.0 and RequestPlan(None, 2.0, 5.0).deadline_cause == "cancel"
    assert RequestPlan(None, 9.0, 5.0).deadline_cause == "timeout" and RequestPlan(None, 9.0, 5.0).deadline_s == 5.0
    assert RequestPlan().deadline_s is None and RequestPlan().deadline_cause is None


# ---- concurrency bound and lateness ------------------------------------------------------------------------


def _peak_in_flight(entries: list[dict[str, Any]]) -> int:
    events = sorted([(e["sent_ns"], 1) for e in entries] + [(e["end_ns"], -1) for e in entries])
    peak = now = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def test_max_concurrency_bounds_attempts_in_flight_and_late_sends_are_counted(server: ServerProcess) -> None:
    url = server.url(tps=50, tokens=10)
    result, entries = run(url, at(*[0.0] * 12), max_concurrency=3)
    assert _peak_in_flight(entries) == 3
    late = sorted(e["late_s"] for e in entries)
    assert sum(1 for x in late if x >= 0.1) >= 9             # they waited for a reply (~0.2 s) to free a slot
    assert result.lateness.sent == 12 and result.lateness.late == sum(1 for x in late if x > 0.010)
    assert result.lateness.max_s == late[-1] and any("late" in n for n in result.notes())
    _, entries = run(url, at(*[0.0] * 12))
    assert _peak_in_flight(entries) == 12                    # without the bound all of them are in flight


# ---- stopping --------------------------------------------------------------------------------------------


def _stopped_run(url: str, *, stop_after_s: float, stop_wait_s: float, twice: bool = False) -> tuple[Any, list[Any]]:
    log = io.StringIO()
    rows: list[dict[str, Any]] = []
    cfg = LoadConfig(Target.parse(url), MODEL, stop_wait_s=stop_wait_s)
    lr = LoadRun(at(*_every(0.05, 40), output=100), cfg, sink=lambda r: rows.append(dict(r)), attempts_log=log)

    async def main() -> Any:
        task = asyncio.create_task(lr.run())
        await asyncio.sleep(stop_after_s)
        lr.request_stop("test")
        if twice:
            await asyncio.sleep(0.05)
            lr.request_stop("test")
        return await task

    result = asyncio.run(main())
    entries = [json.loads(line) for line in log.getvalue().splitlines()]
    assert rows == result.rows and len(entries) == len(rows) == 40 - result.unsent
    assert all(validate_summary(r) == [] for r in rows)
    return result, entries


def test_a_stop_sends_nothing_more_hangs_up_after_its_wait_and_loses_no_summary(server: ServerProcess) -> None:
    result, entries = _stopped_run(server.url(tps=20), stop_after_s=0.4, stop_wait_s=0.3)
    assert result.stopped_by == "test" and result.unsent > 0
    hung = [e for e in entries if e["hangup"] == "stop"]
    assert hung and result.hung_up_at_stop == len(hung)
    assert all((e["finish_reason"] == "client_cancel") == (e["server_finish_reason"] is None) for e in hung)
    last_send = max(e["sent_ns"] for e in entries)
    assert all(e["end_ns"] >= last_send for e in hung)


def test_a_second_stop_hangs_up_at_once(server: ServerProcess) -> None:
    result, entries = _stopped_run(server.url(tps=20), stop_after_s=0.3, stop_wait_s=60.0, twice=True)
    hung = [e for e in entries if e["hangup"] == "stop"]
    assert result.hung_up_at_stop == len(hung) >= 1
    assert all(e["end_ns"] - min(h["end_ns"] for h in hung) < 5e9 for e in hung)   # not after the 60 s wait
