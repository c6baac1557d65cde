"""A request's handler runs from the connection's callback until it first waits (``start_eagerly``): a request is
written to its backend without waiting for a task's turn; what a task would do after that is unchanged (results,
exceptions, cancellation), and requests answered at once follow each other in a loop, not by recursion."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from llmslo.bench.bench_gateway_start import StandInTransport
from llmslo.gateway import BackendSpec, GatewayConfig, _run
from llmslo.gateway._http import FrontConnection, Request, Responder
from llmslo.gateway._loop import start_eagerly
from llmslo.gateway._run import settle_heap
from llmslo.telemetry import Telemetry
from llmslo.tests._gateway_support import ScriptedBackend


def test_a_coroutine_that_never_waits_runs_to_its_end_at_once_and_makes_no_task() -> None:
    ran: list[str] = []

    async def quick() -> None:
        ran.append("done")

    async def main() -> None:
        assert start_eagerly(quick()) is None
        assert ran == ["done"]  # before this coroutine waited once

    asyncio.run(main())


@pytest.mark.parametrize("outcome", ["result", "exception"])
def test_a_coroutine_runs_until_it_waits_then_a_task_gives_it_the_awaited_outcome(outcome: str) -> None:
    steps: list[object] = []

    async def main() -> None:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def handler() -> None:
            steps.append("before")
            try:
                steps.append(await fut)
            except ValueError as exc:
                steps.append(f"raised {exc}")

        task = start_eagerly(handler())
        assert steps == ["before"] and task is not None and not task.done()
        if outcome == "result":
            fut.set_result(7)
        else:
            fut.set_exception(ValueError("bad"))
        await task
        assert steps == ["before", 7 if outcome == "result" else "raised bad"]

    asyncio.run(main())


@pytest.mark.parametrize("when", ["before its first step", "while it waits"])
def test_cancelling_the_task_reaches_the_coroutine_where_it_waits(when: str) -> None:
    seen: list[str] = []

    async def main() -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def handler() -> None:
            try:
                await fut
            except asyncio.CancelledError:
                seen.append("cancelled at its await")
                raise

        task = start_eagerly(handler())
        assert task is not None
        if when == "while it waits":
            await asyncio.sleep(0)  # the task's first step: it now waits on fut
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == ["cancelled at its await"]

    asyncio.run(main())


REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"


def test_a_request_reaches_its_handler_inside_the_connections_callback() -> None:
    started: list[str] = []

    async def handler(req: Request, res: Responder) -> None:
        started.append(req.path)  # as the gateway parses, admits, routes and writes to the backend
        await asyncio.sleep(0.01)  # the backend's answer
        res.send(200, [(b"content-type", b"application/json")], b"{}")

    async def main() -> None:
        conn = FrontConnection(handler, 1 << 20)
        transport = StandInTransport()
        conn.connection_made(transport)
        conn.data_received(REQUEST)
        assert started == ["/v1/chat/completions"]  # before the loop ran anything else
        await asyncio.sleep(0.1)
        assert transport.out.startswith(b"HTTP/1.1 200")

    asyncio.run(main())


def test_thousands_of_requests_sent_at_once_and_answered_at_once_follow_each_other_without_recursion() -> None:
    answered: list[int] = []

    async def handler(req: Request, res: Responder) -> None:
        answered.append(1)
        res.send(404, [(b"content-type", b"application/json")], b"{}")

    async def main() -> None:
        conn = FrontConnection(handler, 1 << 20)
        transport = StandInTransport()
        conn.connection_made(transport)
        conn.data_received(b"GET /nothing HTTP/1.1\r\nhost: x\r\n\r\n" * 5000)
        await asyncio.sleep(0)
        assert len(answered) == 5000 and transport.out.count(b"HTTP/1.1 404") == 5000

    asyncio.run(main())


def test_settling_the_heap_freezes_what_is_alive_out_of_the_collectors_reach() -> None:
    kept = [object() for _ in range(10)] + [[] for _ in range(1000)]  # tracked: lists
    try:
        settle_heap()
        assert gc.get_freeze_count() >= 1000
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0 and kept


def test_serve_settles_the_heap_once_the_gateway_has_started(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    monkeypatch.setattr(_run, "settle_heap", lambda: order.append("settled"))

    async def main() -> None:
        backend = ScriptedBackend()
        await backend.start()
        config = GatewayConfig(backends=(BackendSpec("a", backend.url),), port=0, admin_port=0,
                               drain_settle_s=0.0, health_interval_s=60.0)

        def ready(gw: Any) -> None:
            order.append(f"ready on {gw.port}")
            asyncio.get_running_loop().create_task(gw.close())

        try:
            await _run.serve(config, Telemetry(), on_ready=ready)
        finally:
            await backend.close()

    asyncio.run(main())
    assert order[0] == "settled" and order[1].startswith("ready on ") and order[1] != "ready on 0"


def test_two_coroutines_waiting_on_the_same_future_both_get_its_result() -> None:
    got: list[int] = []

    async def main() -> None:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def handler() -> None:
            got.append(await fut)

        tasks = [start_eagerly(handler()) for _ in range(2)]
        await asyncio.sleep(0)  # both tasks take their first step: both wait on fut
        fut.set_result(5)
        await asyncio.gather(*[t for t in tasks if t is not None])

    asyncio.run(main())
    assert got == [5, 5]
