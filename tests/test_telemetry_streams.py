"""Bounded streams: the producer pauses at capacity, the slow-consumer policy ends the request, the simulator."""

from __future__ import annotations

import asyncio
import json

import pytest
import typer
from typer.testing import CliRunner

from llmslo.cli._telemetry import stream_sim_command
from llmslo.telemetry import (
    ConfigurationError,
    SendQueue,
    StreamClosed,
    StreamPolicy,
    Telemetry,
    simulate_stream,
    validate_summary,
)


def test_the_producer_never_runs_more_than_capacity_ahead_of_a_slow_consumer() -> None:
    rows: list[dict[str, object]] = []
    tel = Telemetry(sink=rows.append)

    async def main() -> int:
        t = tel.start("r1", model="m")
        q: SendQueue[int] = SendQueue(t, StreamPolicy(capacity=4, idle_s=None, max_duration_s=None))
        ahead = 0

        async def produce() -> None:
            nonlocal ahead
            for i in range(40):
                await q.wait_credit()
                t.commit()
                q.put(i)
                ahead = max(ahead, t.generated_tokens - t.sent_tokens)
            q.close()

        async def consume() -> None:
            async for _ in q:
                await asyncio.sleep(0.0005)

        await asyncio.gather(produce(), consume())
        t.finish("stop")
        return ahead

    assert asyncio.run(main()) <= 4
    (row,) = rows
    assert row["sent_tokens"] == row["generated_tokens"] == 40
    assert row["stream_max_queued"] == 4
    assert isinstance(row["stream_paused_s"], float) and row["stream_paused_s"] > 0
    assert validate_summary(row) == []


@pytest.mark.parametrize(("draining", "reason"), [(False, "deadline"), (True, "server_draining")])
def test_a_vanished_consumer_ends_the_request_after_the_idle_threshold(draining: bool, reason: str) -> None:
    rows: list[dict[str, object]] = []
    tel = Telemetry(sink=rows.append)
    if draining:
        tel.begin_drain()

    async def main() -> None:
        t = tel.start("r1", model="m")
        q: SendQueue[int] = SendQueue(t, StreamPolicy(capacity=2, idle_s=0.05, max_duration_s=5))
        with pytest.raises(StreamClosed):
            for i in range(10):
                await q.wait_credit()
                t.commit()
                q.put(i)

    asyncio.run(main())
    (row,) = rows
    assert row["finish_reason"] == reason
    assert row["generated_tokens"] == 2 and row["sent_tokens"] == 0
    assert tel.metrics.value("paused_streams", model="m") == 0


def test_the_simulator_follows_the_tick_rule_exactly() -> None:
    r = simulate_stream(5, [0, 0, 0, 1], capacity=2, deadline_tick=None)
    assert [(s.sent, s.generated, s.queued, s.paused) for s in r.trace[:6]] == [
        (0, 1, 1, False), (0, 1, 2, False), (0, 0, 2, True), (1, 1, 2, False), (1, 1, 2, False), (1, 1, 2, False)]
    assert (r.sent, r.generated, r.unsent, r.paused_ticks) == (5, 5, 0, 1)
    assert r.terminal.reason == "stop" and r.terminal.cleanup_count == 1


def test_a_deadline_tick_ends_the_stream_and_does_nothing_else() -> None:
    bounded = simulate_stream(100, 0, capacity=4, deadline_tick=10)
    unbounded = simulate_stream(100, 0, capacity=None, deadline_tick=10)
    assert bounded.terminal.reason == "deadline" and bounded.ticks == 10
    assert (bounded.generated, bounded.unsent, bounded.paused_ticks) == (4, 4, 6)
    assert (unbounded.generated, unbounded.unsent, unbounded.max_queued) == (10, 10, 10)
    assert simulate_stream(3, 1, capacity=1, deadline_tick=0).generated == 0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"tokens": -1, "drain_per_tick": 1, "capacity": 1}, "tokens"),
    ({"tokens": 5, "drain_per_tick": [], "capacity": 1}, "drain_per_tick"),
    ({"tokens": 5, "drain_per_tick": 1, "capacity": 0}, "capacity"),
    ({"tokens": 5, "drain_per_tick": 0, "capacity": 1}, "deadline_tick"),
])
def test_the_simulator_rejects_bad_arguments_naming_them(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field):
        simulate_stream(**kwargs)  # type: ignore[arg-type]


def test_stream_policy_rejects_bad_watermarks_naming_the_field() -> None:
    with pytest.raises(ConfigurationError, match=r"StreamPolicy\.low"):
        StreamPolicy(capacity=4, high=4, low=4)
    with pytest.raises(ConfigurationError, match=r"StreamPolicy\.capacity"):
        StreamPolicy(capacity=0)


def test_stream_sim_prints_json() -> None:
    app = typer.Typer()
    app.command()(stream_sim_command)
    result = CliRunner().invoke(app, ["--tokens", "10", "--drain", "0,1", "--capacity", "3", "--deadline", "8",
                                      "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["terminal"]["reason"] == "deadline" and data["generated"] + 0 == data["sent"] + data["unsent"]
    table = CliRunner().invoke(app, ["--tokens", "3"])
    assert table.exit_code == 0 and "deepest queue" in table.output


def test_the_example_server_streams_and_records_one_summary() -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "server_asgi.py"
    spec = importlib.util.spec_from_file_location("llmslo_example_server", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows: list[dict[str, object]] = []
    module.tel.sink = rows.append
    body: list[bytes] = []

    bodies_read = 0

    async def receive() -> dict[str, object]:  # as an ASGI server does: the body, then nothing until a disconnect
        nonlocal bodies_read
        bodies_read += 1
        if bodies_read == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.body":
            body.append(message["body"])  # type: ignore[arg-type]

    async def main() -> None:
        await module.generate(receive, send, max_tokens=5)

    asyncio.run(main())
    assert b"".join(body).count(b"token") == 5
    assert rows[0]["finish_reason"] == "length" and rows[0]["sent_tokens"] == 5
    assert validate_summary(rows[0]) == []
