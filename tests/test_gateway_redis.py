"""Gateway replicas share their budgets through a real ``redis-server``: of 20 parallel requests split across two
gateways against a budget worth 5, 5 are admitted in all."""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from llmslo.gateway import BudgetConfig
from llmslo.tests._gateway_support import ScriptedBackend, running
from llmslo.tests.test_controls_redis import Server, needs_server, server

__all__ = ["server"]  # the fixture, imported so that this module's tests can take it


@needs_server
def test_two_gateways_share_one_token_budget_through_redis(server: Server) -> None:
    async def go() -> None:
        budget = BudgetConfig(tokens_per_min=0.06, token_burst=5 * (3 + 8), redis_url=server.url)
        body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 8}
        headers = {"authorization": "Bearer shared-key", "x-script": "script:tokens=8,gap=0.01"}
        a, b = ScriptedBackend(), ScriptedBackend()
        async with contextlib.AsyncExitStack() as stack:
            one, rows_one = await stack.enter_async_context(running([a], budget=budget))
            two, rows_two = await stack.enter_async_context(running([b], budget=budget))
            c1 = await stack.enter_async_context(httpx.AsyncClient(base_url=f"http://127.0.0.1:{one.port}"))
            c2 = await stack.enter_async_context(httpx.AsyncClient(base_url=f"http://127.0.0.1:{two.port}"))
            replies = await asyncio.gather(*(c.post("/v1/completions", json=body, headers=headers)
                                             for c in (c1, c2) * 10))
            await asyncio.sleep(0.05)
        assert sorted(r.status_code for r in replies) == [200] * 5 + [429] * 15
        assert len(a.seen) + len(b.seen) == 5
        served = [r for r in rows_one + rows_two if r["finish_reason"] == "length"]
        assert len(served) == 5

    asyncio.run(asyncio.wait_for(go(), 60))
