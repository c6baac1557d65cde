"""The gateway's pool changes through the admin API: a backend added, one removed for good, and the times a rolling
update measures its removal's propagation by (when a backend left the pool, when it last got a request)."""

from __future__ import annotations

import asyncio
import time

import httpx

from llmslo.tests._gateway_support import ScriptedBackend, running

BODY = {"model": "m", "prompt": "script:tokens=2", "max_tokens": 2, "stream": True}


def test_a_backend_added_takes_requests_once_healthy_and_one_removed_takes_none() -> None:
    async def go() -> None:
        old, new = ScriptedBackend(), ScriptedBackend()
        await new.start()
        async with running([old]) as (gw, _rows):
            front = f"http://127.0.0.1:{gw.port}"
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.admin_port}") as admin, \
                    httpx.AsyncClient(base_url=front) as client:
                added = await admin.post("/admin/backends", json={"id": "n1", "url": new.url, "version": "v2"})
                assert added.status_code == 201, added.text
                assert added.json()["routable"] is True and added.json()["version"] == "v2"
                taken = await admin.post("/admin/backends", json={"id": "n1", "url": "http://127.0.0.1:9"})
                assert taken.status_code == 409, taken.text  # one check, the pool's: its message, with the fix
                assert taken.json()["error"]["message"] == "backend id 'n1' is taken; pick another"
                assert taken.json()["error"]["type"] == "conflict"
                assert gw.pool.backends["n1"].spec.url == new.url  # the backend holding the id is unchanged
                bad = await admin.post("/admin/backends", json={"id": "n2", "url": new.url, "slot": 2})
                assert bad.status_code == 400 and "unknown key(s) slot" in bad.text
                assert "n2" not in gw.pool.backends

                drained = await admin.post("/admin/backends/a/drain?wait=1")
                assert drained.status_code == 200 and drained.json()["decision"] == "drained"
                before = time.time()
                for _ in range(4):
                    assert (await client.post("/v1/completions", json=BODY)).status_code == 200
                a = (await admin.get("/admin/backends/a")).json()
                n1 = (await admin.get("/admin/backends/n1")).json()
                assert a["removed_unix_s"] is not None and a["removed_unix_s"] <= before
                assert a["last_routed_unix_s"] is None  # no request reached it, before or after its removal
                assert n1["served"] == 4 and n1["last_routed_unix_s"] >= before

                gone = await admin.delete("/admin/backends/a")
                assert gone.status_code == 200
                assert [b["id"] for b in (await admin.get("/admin/backends")).json()] == ["n1"]
                assert (await admin.get("/admin/backends/a")).status_code == 404
        await new.close()

    asyncio.run(go())


def test_a_backend_with_requests_in_flight_is_not_removed() -> None:
    async def go() -> None:
        async with running([ScriptedBackend()]) as (gw, _rows), \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.admin_port}") as admin, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.port}") as client:
            slow = asyncio.ensure_future(client.post(
                "/v1/completions", json={**BODY, "prompt": "script:tokens=3,gap=0.3"}))
            for _ in range(100):
                if gw.pool.backends["a"].outstanding:
                    break
                await asyncio.sleep(0.01)
            refused = await admin.delete("/admin/backends/a")
            assert refused.status_code == 409 and "in flight" in refused.text
            assert (await slow).status_code == 200
            assert "a" in gw.pool.backends

    asyncio.run(go())


def test_queue_s_at_the_gateway_is_its_admission_wait_not_the_backends_answer() -> None:
    """A backend that answers a whole reply after 0.4 s: that time is the engine's (in ttft_s), not the gateway's
    queue (definitions.md: queue_s at the gateway)."""
    async def go() -> None:
        async with running([ScriptedBackend()]) as (gw, rows):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.port}") as client:
                reply = await client.post("/v1/completions", json={**BODY, "stream": False,
                                                                    "prompt": "script:tokens=2,ttft=0.4"})
                assert reply.status_code == 200
            for _ in range(100):
                if rows:
                    break
                await asyncio.sleep(0.01)
            (row,) = rows
            assert row["queue_s"] is not None and row["queue_s"] < 0.2 <= row["ttft_s"]

    asyncio.run(go())
