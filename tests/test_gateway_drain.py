"""The gateway draining itself (what SIGTERM does): readiness false first, new requests refused 503 draining,
idle streams closed with the drain's event, the record, then the close."""

from __future__ import annotations

import asyncio
import json

import httpx

from llmslo.tests._gateway_support import ScriptedBackend, running


def test_the_gateway_drains_itself_readiness_first_then_its_streams() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        async with running([a], drain_settle_s=0.3, drain_idle_s=0.3, drain_budget_s=5.0) as (gw, rows), \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.port}", timeout=30) as c:
            body = {"model": "m", "prompt": "script:tokens=5,stall=1", "stream": True}

            async def long() -> bytes:
                async with c.stream("POST", "/v1/completions", json=body) as r:
                    return b"".join([part async for part in r.aiter_raw()])

            streaming = asyncio.ensure_future(long())
            await asyncio.sleep(0.2)
            drain = asyncio.ensure_future(gw.drain_and_stop())
            await asyncio.sleep(0.05)
            ready = await c.get("/ready")
            refused = await c.post("/v1/completions", json={"model": "m", "prompt": "hi"})
            raw = await streaming
            record = await drain
        assert ready.status_code == 503 and ready.json()["draining"] is True
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "draining"
        assert refused.headers["retry-after"] == "1"
        last = json.loads(raw.split(b"data: ")[-1])
        assert last["finish_reason"] == "server_draining" and last["drain_reason"] == "idle"
        assert record.decision == "drained" and record.closed_by_reason["idle"] == 1
        assert sorted(str(r["finish_reason"]) for r in rows) == ["rejected", "server_draining"]
        assert gw.stopped.is_set()

    asyncio.run(asyncio.wait_for(go(), 60))
