"""The gateway's request path against scripted backends (tests/_gateway_support.py): streams passed on byte
for byte, usage settled, bad input refused, clients leaving, backends dying, stalling, retried, drained."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest

from llmslo.gateway import BudgetConfig
from llmslo.telemetry import ConfigurationError, validate_summary
from llmslo.tests._gateway_support import ScriptedBackend, running


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def client(port: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30)


def events(raw: bytes) -> list[dict[str, Any] | str]:
    out: list[dict[str, Any] | str] = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[6:]
            out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


async def stream(c: httpx.AsyncClient, prompt: str, **extra: Any) -> tuple[int, dict[str, str], bytes]:
    body = {"model": "m", "prompt": prompt, "max_tokens": 8, "stream": True, **extra}
    async with c.stream("POST", "/v1/completions", json=body) as r:
        raw = b"".join([part async for part in r.aiter_raw()])
        return r.status_code, dict(r.headers), raw


def test_a_stream_passes_byte_for_byte_and_its_summary_takes_usage() -> None:
    async def go() -> None:
        b = ScriptedBackend()
        async with running([b]) as (gw, rows):
            async with client(gw.port) as c:
                status, headers, raw = await stream(c, "script:tokens=6", stream_options={"include_usage": True})
            await asyncio.sleep(0.05)
        assert status == 200 and headers["x-llmslo-backend"] == "a"
        assert raw.count(b"data: ") == 9 and raw.endswith(b"data: [DONE]\n\n")  # 6 chunks, finish, usage, DONE
        forwarded = b.seen[0]
        assert forwarded.headers["x-request-id"] == headers["x-request-id"]
        (row,) = rows
        assert row["finish_reason"] == "length" and row["version"] == "v1" and row["backend"] == "a"
        assert row["generated_tokens"] == row["sent_tokens"] == 6 and row["prompt_tokens"] == 7
        assert row["request_id"] == headers["x-request-id"] and validate_summary(row) == []

    run(go())


def test_usage_the_gateway_asked_for_is_withheld_from_a_client_that_did_not() -> None:
    async def go() -> None:
        b = ScriptedBackend()
        async with running([b]) as (gw, rows):
            async with client(gw.port) as c:
                _, _, raw = await stream(c, "script:tokens=4")
            await asyncio.sleep(0.05)
        assert b.seen[0].body["stream_options"] == {"include_usage": True}
        got = events(raw)
        assert not any(isinstance(e, dict) and "usage" in e for e in got)
        assert got[-1] == "[DONE]" and len(got) == 6
        assert rows[0]["prompt_tokens"] == 7 and rows[0]["generated_tokens"] == 4

    run(go())


def test_bad_requests_get_clear_errors_and_reach_no_backend() -> None:
    async def go() -> None:
        b = ScriptedBackend()
        async with running([b], models=("m",), max_body_bytes=10_000) as (gw, rows), client(gw.port) as c:
            bad_json = await c.post("/v1/completions", content=b"{nope")
            not_object = await c.post("/v1/completions", json=[1, 2])
            unknown = await c.post("/v1/completions", json={"model": "other", "prompt": "x"})
            control = await c.post("/v1/completions", json={"model": "m\x00x", "prompt": "x"})
            huge = await c.post("/v1/completions", content=b"x" * 20_000)
            bad_max = await c.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": -1})
            no_route = await c.get("/v2/nothing", headers={"x-request-id": "route-1"})
            wrong_method = await c.get("/v1/completions")
            ids = await c.post("/v1/completions", json={"model": "m", "prompt": [1, 2, 3], "max_tokens": 2})
            texts = await c.post("/v1/completions", json={"model": "m", "prompt": ["a", "b"], "max_tokens": 2})
        assert bad_json.status_code == 400 and "not JSON" in bad_json.json()["error"]["message"]
        assert not_object.status_code == 400
        assert unknown.status_code == 404 and "'other' is not served" in unknown.json()["error"]["message"]
        assert control.status_code == 400 and "control characters" in control.json()["error"]["message"]
        assert huge.status_code == 413 and "20000 bytes" in huge.json()["error"]["message"]
        assert bad_max.status_code == 400 and "max_tokens" in bad_max.json()["error"]["message"]
        assert no_route.status_code == 404 and no_route.headers["x-request-id"] == "route-1"
        assert wrong_method.status_code == 405 and wrong_method.headers["x-request-id"]  # one of its own
        assert ids.status_code == 200 and texts.status_code == 200
        assert [s.body["prompt"] for s in b.seen] == [[1, 2, 3], ["a", "b"]]  # forwarded as sent
        reasons = sorted(str(r.get("error_type")) for r in rows if r["finish_reason"] == "error")
        assert reasons == ["bad_request"] * 4 + ["model_not_found"]

    run(go())


def test_a_client_that_leaves_cancels_the_backend_request_at_once() -> None:
    async def go() -> None:
        b = ScriptedBackend()
        async with running([b]) as (gw, rows):
            async with client(gw.port) as c:
                body = {"model": "m", "prompt": "script:tokens=200,gap=0.02", "stream": True}
                async with c.stream("POST", "/v1/completions", json=body) as r:
                    got = 0
                    async for part in r.aiter_raw():
                        got += part.count(b"data: ")
                        if got >= 3:
                            break
            for _ in range(100):
                if rows and b.seen[0].cancelled:
                    break
                await asyncio.sleep(0.02)
        (row,) = rows
        assert row["finish_reason"] == "client_cancel"
        assert b.seen[0].cancelled and b.seen[0].chunks_sent < 50
        assert row["generated_tokens"] >= row["sent_tokens"] >= 3

    run(go())


def test_a_backend_that_dies_mid_stream_ends_it_with_an_error_event_and_opens_its_breaker() -> None:
    async def go() -> None:
        a, b = ScriptedBackend(), ScriptedBackend()
        async with running([a, b], breaker_failures=2, breaker_open_s=60.0) as (gw, rows):
            gw.pool.backends["b"].in_pool = False  # everything goes to a first
            async with client(gw.port) as c:
                results = [await stream(c, "script:tokens=10,die=3") for _ in range(2)]
                assert gw.pool.backends["a"].breaker.state == "open"
                gw.pool.backends["b"].in_pool = True
                after = [await stream(c, "script:tokens=2") for _ in range(4)]
            await asyncio.sleep(0.05)
        for status, _, raw in results:
            last = events(raw)[-1]
            assert status == 200 and isinstance(last, dict) and last["error"]["code"] == "backend_failed"
        assert all(h["x-llmslo-backend"] == "b" for _, h, _ in after)
        assert len(a.seen) == 2 and len(b.seen) == 4
        failed = [r for r in rows if r["finish_reason"] == "error"]
        assert [r["error_type"] for r in failed] == ["backend_failed"] * 2
        assert all(r["generated_tokens"] == 3 for r in failed)

    run(go())


@pytest.mark.parametrize(("status", "opens"), [(400, False), (404, False), (422, False), (500, True), (503, True)])
def test_a_backend_answering_a_clients_mistake_keeps_its_breaker_closed(status: int, opens: bool) -> None:
    async def go() -> tuple[str, list[int]]:
        a = ScriptedBackend()
        async with running([a], breaker_failures=2, breaker_open_s=60.0) as (gw, _rows), client(gw.port) as c:
            body = {"model": "m", "prompt": f"script:status={status}", "max_tokens": 2}
            codes = [(await c.post("/v1/completions", json=body)).status_code for _ in range(3)]
            return gw.pool.backends["a"].breaker.state, codes
    state, codes = run(go())
    # a 4xx is the request's fault, not the backend's: passed on, and the backend stays routable for the others
    assert state == ("open" if opens else "closed")
    assert codes == ([status, status, 503] if opens else [status] * 3)


def test_a_backend_that_refuses_or_answers_5xx_first_is_retried_on_another() -> None:
    async def go() -> None:
        a, b = ScriptedBackend(), ScriptedBackend()
        async with running([a, b], retries=1) as (gw, rows), client(gw.port) as c:
            served = []
            for _ in range(6):
                r = await c.post("/v1/completions", json={"model": "m", "prompt": "script:tokens=2",
                                                          "max_tokens": 2})
                served.append((r.status_code, r.headers["x-llmslo-backend"]))
            await a.close()  # a refuses connections from now on
            for _ in range(4):
                r = await c.post("/v1/completions", json={"model": "m", "prompt": "script:tokens=2"})
                served.append((r.status_code, r.headers["x-llmslo-backend"]))
        assert all(status == 200 for status, _ in served)
        assert all(backend == "b" for _, backend in served[6:])
        assert [r["finish_reason"] for r in rows] == ["length"] * 10

    run(go())


def test_a_5xx_passes_to_the_client_when_no_other_backend_is_left() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        async with running([a], retries=1) as (gw, rows):
            async with client(gw.port) as c:
                r = await c.post("/v1/completions", json={"model": "m", "prompt": "script:status=500"})
            await asyncio.sleep(0.05)
        assert r.status_code == 500 and r.json()["error"]["type"] == "engine_error"
        assert len(a.seen) == 1
        assert rows[0]["finish_reason"] == "error" and rows[0]["error_type"] == "http_500"

    run(go())


def test_a_stalled_stream_ends_with_an_error_event() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        async with running([a], stall_s=0.3) as (gw, rows):
            async with client(gw.port) as c:
                status, _, raw = await stream(c, "script:tokens=10,stall=2")
            await asyncio.sleep(0.05)
        last = events(raw)[-1]
        assert status == 200 and isinstance(last, dict) and last["error"]["code"] == "backend_stalled"
        assert rows[0]["error_type"] == "backend_stalled" and rows[0]["generated_tokens"] == 2

    run(go())


def test_the_request_timeout_ends_a_stream_with_a_deadline_event() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        async with running([a], request_timeout_s=0.3) as (gw, rows):
            async with client(gw.port) as c:
                status, _, raw = await stream(c, "script:tokens=100,gap=0.05")
            await asyncio.sleep(0.05)
        last = events(raw)[-1]
        assert status == 200 and isinstance(last, dict) and last["error"]["type"] == "deadline"
        assert rows[0]["finish_reason"] == "deadline"

    run(go())


def test_one_deadline_check_serves_every_request_and_starts_again_after_an_idle_spell() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        async with running([a], request_timeout_s=0.3) as (gw, rows):
            async with client(gw.port) as c1, client(gw.port) as c2:
                both = await asyncio.gather(stream(c1, "script:tokens=100,gap=0.05"),
                                            stream(c2, "script:tokens=3,gap=0.01"))
            assert [status for status, _, _ in both] == [200, 200]
            await asyncio.sleep(0.2)       # nothing in flight: the check stops
            assert gw.app._check_handle is None and not gw.app.exchanges
            async with client(gw.port) as c:
                status, _, raw = await stream(c, "script:tokens=100,gap=0.05")  # and starts again
            await asyncio.sleep(0.05)
        assert status == 200 and events(raw)[-1]["error"]["type"] == "deadline"
        assert sorted(r["finish_reason"] for r in rows) == ["deadline", "deadline", "length"]

    run(go())


def test_draining_a_backend_takes_it_out_first_and_closes_its_idle_streams_with_the_drain_event() -> None:
    async def go() -> None:
        a, b = ScriptedBackend(), ScriptedBackend()
        async with running([a, b], drain_idle_s=0.2, drain_budget_s=5.0) as (gw, rows):
            gw.pool.backends["b"].in_pool = False
            async with client(gw.port) as c, httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{gw.admin_port}", timeout=30) as admin:
                long = asyncio.ensure_future(stream(c, "script:tokens=3,stall=1"))
                await asyncio.sleep(0.2)
                gw.pool.backends["b"].in_pool = True
                drain = asyncio.ensure_future(admin.post("/admin/backends/a/drain?wait=1"))
                await asyncio.sleep(0.05)
                assert (await admin.post("/admin/backends/a/drain")).status_code == 409
                after = [await stream(c, "script:tokens=2") for _ in range(5)]
                record = (await drain).json()
                _status, _, raw = await long
                # a has nothing outstanding now: only its removal keeps the power of two choices off it
                after += [await stream(c, "script:tokens=2") for _ in range(10)]
                listing = (await admin.get("/admin/backends")).json()
        assert record["decision"] == "drained" and record["closed_by_reason"]["idle"] == 1
        assert isinstance(events(raw)[-1], dict) and events(raw)[-1]["finish_reason"] == "server_draining"
        assert all(h["x-llmslo-backend"] == "b" for _, h, _ in after) and len(a.seen) == 1
        assert {x["id"]: x["in_pool"] for x in listing} == {"a": False, "b": True}
        assert sorted(str(r["finish_reason"]) for r in rows) == ["length"] * 15 + ["server_draining"]

    run(go())


def test_token_budgets_admit_no_more_than_the_budget_and_settle_from_usage() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        # each request reserves its 3 prompt token ids + max_tokens 8; the burst holds 5 of them
        budget = BudgetConfig(tokens_per_min=60.0 * 0.001, token_burst=5 * (3 + 8))
        async with running([a], budget=budget) as (gw, rows):
            async with client(gw.port) as c:
                body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 8}
                headers = {"authorization": "Bearer k1", "x-script": "script:tokens=8,gap=0.01"}
                replies = await asyncio.gather(*(c.post("/v1/completions", json=body, headers=headers)
                                                 for _ in range(20)))
            await asyncio.sleep(0.05)
        ok = [r for r in replies if r.status_code == 200]
        refused = [r for r in replies if r.status_code == 429]
        assert len(ok) == 5 and len(refused) == 15
        assert all(r.json()["error"]["type"] == "rate_limited" and "retry-after" in r.headers for r in refused)
        assert len(a.seen) == 5
        served = [r for r in rows if r["finish_reason"] == "length"]
        assert sum(int(str(r["prompt_tokens"])) + int(str(r["generated_tokens"])) for r in served) == 5 * (7 + 8)

    run(go())


@pytest.mark.parametrize("quantile", [None, 0.5])
def test_a_budget_reserves_a_quantile_of_the_models_outputs_when_asked(quantile: float | None) -> None:
    async def go() -> list[int]:
        a = ScriptedBackend()
        # a burst of 500 tokens; each request: 3 prompt token ids, max_tokens 1,000, and 5 tokens generated
        budget = BudgetConfig(tokens_per_min=60_000.0, token_burst=500.0, reserve_quantile=quantile)
        async with running([a], budget=budget) as (gw, _), client(gw.port) as c:
            small = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 5}
            for _ in range(20):    # twenty complete replies of 5 tokens: the model's outputs are known
                assert (await c.post("/v1/completions", json=small, headers={"x-script": "script:tokens=5"})
                        ).status_code == 200
            large = {**small, "max_tokens": 1000}
            replies = [await c.post("/v1/completions", json=large, headers={"x-script": "script:tokens=5"})
                       for _ in range(3)]
        return [r.status_code for r in replies]

    codes = run(go())
    # max_tokens reserved: 3 + 1000 never fits a burst of 500; the median of the outputs reserved: 3 + 5 does
    assert codes == ([429] * 3 if quantile is None else [200] * 3)


def test_a_bad_reserve_quantile_is_refused_naming_the_flag() -> None:
    for bad in (0.0, 1.5, -1.0, True):
        with pytest.raises(ConfigurationError, match=r"reserve_quantile: must be a fraction in \(0, 1\], e.g. "
                                                      r"--reserve-quantile 0.9"):
            BudgetConfig(tokens_per_min=100.0, reserve_quantile=bad)


def test_a_full_queue_answers_429_with_a_retry_after() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        config = {"concurrency": 1, "queue_capacity": 1, "queue_timeout_s": 10.0}
        async with running([a], **config) as (gw, _rows), client(gw.port) as c:
            body = {"model": "m", "prompt": "script:tokens=5,gap=0.05", "max_tokens": 5}
            replies = await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(4)))
        codes = sorted(r.status_code for r in replies)
        assert codes == [200, 200, 429, 429]
        full = [r for r in replies if r.status_code == 429]
        assert all(r.json()["error"]["type"] == "queue_full" and float(r.headers["retry-after"]) >= 1 for r in full)
        # one Content-Type (httpx joins repeated headers with ', ')
        assert all(r.headers.get_list("content-type") == ["application/json"] for r in full)

    run(go())


def test_the_models_health_ready_and_metrics_routes() -> None:
    async def go() -> None:
        a = ScriptedBackend(model="smol")
        async with running([a]) as (gw, _), client(gw.port) as c:
            models = (await c.get("/v1/models")).json()
            ready = await c.get("/ready")
            await c.post("/v1/completions", json={"model": "smol", "prompt": "hi", "max_tokens": 2})
            metrics = (await c.get("/metrics")).text
            gw.pool.set_in_pool(gw.pool.backends["a"], False, "test")
            unready = await c.get("/ready")
            after = (await c.get("/metrics")).text
        assert [m["id"] for m in models["data"]] == ["smol"]
        assert ready.status_code == 200 and unready.status_code == 503
        assert 'llmslo_requests_total{finish_reason="length"' in metrics
        for line in ('llmslo_backend_routable{backend="a"} 1.0', 'llmslo_backend_requests_total{backend="a"} 1.0',
                     'llmslo_backend_pool_changes_total{backend="a"} 0.0',
                     'llmslo_backend_concurrency_limit_requests{backend="a"} 2.0'):
            assert line in metrics
        assert 'llmslo_backend_routable{backend="a"} 0.0' in after
        assert 'llmslo_backend_pool_changes_total{backend="a"} 1.0' in after

    run(go())


@pytest.mark.parametrize("text", ["http://h:1/v1", "ftp://h:1", "http://h:notaport"])
def test_a_bad_backend_url_is_refused_with_the_fix(text: str) -> None:
    from llmslo.gateway import backend_from_arg
    from llmslo.telemetry import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"http://HOST:PORT|bad port"):
        backend_from_arg(text, 1)


@pytest.mark.parametrize(("text", "ident", "version", "slots"), [
    ("a=http://127.0.0.1:8001@v1,slots=4", "a", "v1", 4),
    ("http://127.0.0.1:8001,slots=16", "b1", "unknown", 16),
    ("a=http://127.0.0.1:8001@v1", "a", "v1", 1),
    ("a=http://127.0.0.1:8001@v,2", "a", "v,2", 1),  # a comma alone belongs to the version
])
def test_a_backend_argument_takes_its_slots_and_starts_its_limit_at_twice_them(
        text: str, ident: str, version: str, slots: int) -> None:
    from llmslo.gateway import GatewayConfig, Pool, backend_from_arg
    from llmslo.telemetry import Telemetry

    spec = backend_from_arg(text, 1)
    assert (spec.id, spec.url, spec.version, spec.slots) == (ident, "http://127.0.0.1:8001", version, slots)
    pool = Pool(GatewayConfig(backends=(spec,)), Telemetry(version="gateway"))
    assert pool.backends[ident].limit.limit == 2 * slots


@pytest.mark.parametrize("text", ["a=http://h:1@v1,slots=four", "a=http://h:1,slots=", "a=http://h:1,slots=-2",
                                  "a=http://h:1,slots=0", "a=http://h:1,slots=5000"])
def test_bad_slots_in_a_backend_argument_are_refused_with_the_fix(text: str) -> None:
    from llmslo.gateway import backend_from_arg
    from llmslo.telemetry import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"slots"):
        backend_from_arg(text, 1)


def test_without_a_fixed_concurrency_the_queue_and_the_routing_follow_the_backends_limits() -> None:
    async def go() -> None:
        a, b = ScriptedBackend(), ScriptedBackend()
        async with running([a, b]) as (gw, _), client(gw.port) as c:
            await c.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2})
            q = gw.app.queues["m"]
            limits = {x.id: x.limit.limit for x in gw.pool.backends.values()}
            assert q.concurrency == sum(limits.values()) == 4  # one slot each: a limit of 2 each to start
            full = gw.pool.backends["a"].limit
            while full.try_acquire():  # a is at its limit: the power of two choices must not take it
                pass
            served = [(await c.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2}))
                      .headers["x-llmslo-backend"] for _ in range(8)]
            gw.pool.set_in_pool(gw.pool.backends["b"], False, "test")
            assert q.concurrency == limits["a"]
        assert served == ["b"] * 8

    run(go())


def test_the_queue_and_the_routing_bound_tokens_in_flight_once_the_backends_learned_their_token_limits() -> None:
    async def go() -> None:
        a, b = ScriptedBackend(), ScriptedBackend()
        async with running([a, b]) as (gw, _), client(gw.port) as c:
            body = {"model": "m", "prompt": "x" * 400, "max_tokens": 100}     # 100 + 100 tokens in flight each
            r = await c.post("/v1/completions", json=body)
            assert r.status_code == 200
            q = gw.app.queues["m"]
            assert q.token_capacity is None     # no window within tolerance yet: requests are counted alone
            for backend in gw.pool.backends.values():      # one good window each, 1000 tokens in flight at most
                lim = backend.limit
                assert lim.try_acquire(1000)
                lim.release(1000)
                for _ in range(lim.window):
                    lim.observe(ttft_s=0.01, prompt_tokens=100, gaps_s=[0.01] * 4)
                assert lim.token_limit == 2000
            gw.app.rebalance()
            assert q.token_capacity == 4000
            full = gw.pool.backends["a"].limit
            assert full.try_acquire(1950)       # a has 50 tokens of room: not enough for a request of 200
            served = [(await c.post("/v1/completions", json=body)).headers["x-llmslo-backend"] for _ in range(8)]
            assert served == ["b"] * 8
            assert q.tokens_running == 0 and full.tokens_in_flight == 1950
            assert gw.pool.backends["b"].limit.tokens_in_flight == 0    # each request's tokens released at its end
            metrics = (await c.get("/metrics")).text
        assert 'llmslo_backend_concurrency_limit_tokens{backend="a"} 2000.0' in metrics
        assert 'llmslo_backend_in_flight_tokens{backend="a"} 1950.0' in metrics

    run(go())


def test_a_models_complete_replies_set_the_tokens_its_requests_are_expected_to_generate() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        async with running([a]) as (gw, rows), client(gw.port) as c:
            body = {"model": "m", "prompt": "script:tokens=5", "max_tokens": 4096, "stream": True}
            for _ in range(25):
                assert (await c.post("/v1/completions", json=body)).status_code == 200
            est = gw.app.outputs["m"]
            assert est.estimate == 5 and est.expected(4096) == 5
        assert [r["generated_tokens"] for r in rows] == [5] * 25

    run(go())


def test_many_api_keys_keep_the_budget_state_bounded() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        budget = BudgetConfig(requests_per_s=1000.0, max_keys=50)
        async with running([a], budget=budget) as (gw, rows), client(gw.port) as c:
            replies = [await c.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 1},
                                    headers={"authorization": f"Bearer key-{i}"}) for i in range(200)]
            limiter = gw.app.limiter
            assert limiter is not None and len(limiter) <= 50
        assert all(r.status_code == 200 for r in replies) and len(rows) == 200

    run(go())


def test_a_request_id_with_control_characters_is_replaced_before_it_reaches_the_backend() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        async with running([a]) as (gw, rows):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()
            writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-request-id: bad\x01id\x7f\r\n"
                         b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                         % (len(body), body))
            answer = await reader.read()
            writer.close()
        head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1")
        assert head.startswith("HTTP/1.1 200")
        sent = a.seen[0].headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f-]{36}", sent) and f"x-request-id: {sent}" in head
        assert rows[0]["request_id"] == sent

    run(go())


def test_a_client_that_never_reads_stops_the_backend_and_holds_bounded_memory() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        async with running([a]) as (gw, _rows):
            import socket

            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gw.port))
            body = json.dumps({"model": "m", "prompt": "script:tokens=200000", "stream": True}).encode()
            await asyncio.get_running_loop().sock_sendall(
                sock, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      b"content-length: %d\r\n\r\n%s" % (len(body), body))
            sent: list[int] = []
            for _ in range(10):
                await asyncio.sleep(0.2)
                sent.append(a.seen[0].chunks_sent if a.seen else 0)
            buffered = max(conn.transport.get_write_buffer_size() for conn in gw._conns
                           if conn.transport is not None)
            sock.close()
        assert 0 < sent[-1] == sent[-2] == sent[-3] < 200000  # the backend was stopped: nothing more went out
        assert buffered <= 64 * 1024 + 64 * 1024 + 16  # the transport's high-water mark, plus one read

    run(go())


def test_under_load_max_tokens_is_capped_before_anyone_is_refused() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        config = {"concurrency": 1, "queue_capacity": 8, "degrade_max_tokens": 3}
        async with running([a], **config) as (gw, rows), client(gw.port) as c:
            body = {"model": "m", "prompt": "script:tokens=3,ttft=0.15", "max_tokens": 50}
            limit = gw.pool.backends["a"].limit
            weights: list[int] = []     # the tokens in flight on the backend, every 10 ms while any are

            async def watch() -> None:
                while True:
                    if limit.tokens_in_flight:
                        weights.append(limit.tokens_in_flight)
                    await asyncio.sleep(0.01)

            watcher = asyncio.ensure_future(watch())
            replies = []
            for _ in range(6):  # one at a time into the queue, so each sees the depth before it
                replies.append(asyncio.ensure_future(c.post("/v1/completions", json=body)))
                await asyncio.sleep(0.02)
            replies = await asyncio.gather(*replies)
            watcher.cancel()
            metrics = (await c.get("/metrics")).text
        assert all(r.status_code == 200 for r in replies)
        asked = [s.body["max_tokens"] for s in a.seen]
        assert asked[0] == 50 and 3 in asked  # the first found the queue empty; later ones were capped
        capped = asked.count(3)
        assert f'llmslo_degraded_requests_total{{action="cap_max_tokens",model="m"}} {float(capped)}' in metrics
        assert len(rows) == 6
        full = weights[0]     # the first request, alone and not capped; a capped one weighs 3 output tokens, not 50
        assert full - 47 in weights

    run(go())


def test_requests_the_queue_admits_beyond_a_backends_limit_are_counted_on_it_while_they_run() -> None:
    async def go() -> tuple[int, int, int, int]:
        a = ScriptedBackend()
        async with running([a], concurrency=4) as (gw, _rows), client(gw.port) as c:
            limit = gw.pool.backends["a"].limit        # slots 1: a limit of 2
            body = {"model": "m", "prompt": "script:tokens=2,ttft=1.0", "max_tokens": 2}
            replies = [asyncio.ensure_future(c.post("/v1/completions", json=body)) for _ in range(4)]
            for _ in range(300):                        # until all 4 run (each waits 1 s for its first token)
                await asyncio.sleep(0.01)
                if limit.in_flight == 4:
                    break
            during = (limit.limit, limit.in_flight, limit.over_limit)
            assert all(r.status_code == 200 for r in await asyncio.gather(*replies))
            return (*during, limit.in_flight)

    assert run(go()) == (2, 4, 2, 0)


def test_a_stream_framed_by_the_connections_close_is_complete_at_its_end() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        async with running([a]) as (gw, rows), client(gw.port) as c:
            status, _, raw = await stream(c, "script:tokens=4,plain=1", stream_options={"include_usage": True})
            await asyncio.sleep(0.05)
        assert status == 200 and events(raw)[-1] == "[DONE]"
        assert rows[0]["finish_reason"] == "length" and rows[0]["generated_tokens"] == 4

    run(go())


def test_a_stall_check_never_outlives_its_request_to_cut_the_next_one_on_the_same_connection() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        async with running([a], stall_s=0.3) as (gw, rows), client(gw.port) as c:
            first = await stream(c, "script:tokens=6,gap=0.1")  # longer than the stall check: it re-arms
            second = await stream(c, "script:tokens=10,gap=0.1")  # the kept-alive connection again
            await asyncio.sleep(0.05)
        assert first[0] == second[0] == 200
        assert [r["finish_reason"] for r in rows] == ["length", "length"]

    run(go())


def test_a_client_that_expects_100_continue_gets_it_before_sending_its_body() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        async with running([a]) as (gw, rows):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()
            writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
                         b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                         % len(body))
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2.0)
            writer.write(body)
            answer = await reader.read()
            writer.close()
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert answer.startswith(b"HTTP/1.1 200") and len(rows) == 1

    run(go())


def test_with_no_routable_backend_the_retry_after_is_the_time_left_until_the_first_breaker_half_opens() -> None:
    from llmslo.controls import CircuitBreaker
    from llmslo.gateway import BackendSpec, GatewayConfig, Pool
    from llmslo.gateway._pool import FAILURE_KINDS, RETRY_AFTER_FLOOR_S
    from llmslo.telemetry import Telemetry

    now = [1000.0]
    specs = tuple(BackendSpec(i, f"http://127.0.0.1:{9000 + n}", models=models)
                  for n, (i, models) in enumerate((("a", ("m",)), ("b", ("m",)), ("c", ("other",)))))
    config = GatewayConfig(backends=specs, breaker_failures=1, breaker_open_s=60.0)
    pool = Pool(config, Telemetry(version="gateway"))
    for b in pool.backends.values():  # the pool's breakers, on a clock the test moves
        b.breaker = CircuitBreaker(b.id, consecutive_failures=1, error_rate=None, open_s=config.breaker_open_s,
                                   failure_kinds=FAILURE_KINDS, clock=lambda: now[0])
    a, b, c = (pool.backends[i] for i in "abc")
    a.breaker.record_failure("connect")
    now[0] += 45.0
    assert pool.retry_after_s("m") == pytest.approx(15.0)  # what is left of a's 60 s, not 60 s again
    assert pool.retry_after_s("other") == RETRY_AFTER_FLOOR_S  # c, the one backend for it, is not open
    b.breaker.record_failure("connect")
    c.breaker.record_failure("connect")
    now[0] += 5.0
    assert pool.retry_after_s("m") == pytest.approx(10.0)  # the first of a and b to half-open
    assert pool.retry_after_s("other") == pytest.approx(55.0)  # only c serves it
    pool.set_in_pool(a, False, "test")
    assert pool.retry_after_s("m") == pytest.approx(55.0)  # a is out of the pool: b's time
    now[0] += 54.5
    assert pool.retry_after_s("m") == RETRY_AFTER_FLOOR_S  # 0.5 s left: the floor
    assert [x.breaker.state for x in (a, b, c)] == ["half_open", "open", "open"]


def test_the_queue_sheds_the_lowest_class_from_half_full_and_a_class_alone_only_when_full() -> None:
    from llmslo.gateway import BackendSpec, GatewayApp, GatewayConfig
    from llmslo.telemetry import Telemetry

    def shed_from(classes: tuple[str, ...], tenant: str) -> float:
        config = GatewayConfig(backends=(BackendSpec("a", "http://127.0.0.1:9000"),), tenant_classes=classes)
        shedder = GatewayApp(config, Telemetry(version="gateway")).shedder
        return min(f / 100 for f in range(1, 101) if shedder.assess(tenant, f / 100).shed)

    three = ("interactive", "default", "batch")
    assert [shed_from(three, c) for c in three] == [1.0, 0.75, 0.5]
    assert shed_from(("default",), "default") == 1.0


def test_the_state_kept_per_model_is_bounded_the_rest_shares_one_entry() -> None:
    from llmslo.gateway._proxy import MAX_MODELS, _per_model

    table: dict[str, list[str]] = {}
    made: list[str] = []

    def make(name: str) -> list[str]:
        made.append(name)
        return [name]

    for i in range(MAX_MODELS + 10):
        assert _per_model(table, f"m{i}", make) == [f"m{i}" if i < MAX_MODELS else "other"]
    assert _per_model(table, "m3", make) == ["m3"]          # an existing one is found, not made again
    assert len(table) == MAX_MODELS + 1 and made.count("other") == 1


def test_a_closed_client_connection_leaves_no_cycle_for_the_garbage_collector() -> None:
    import gc

    from llmslo.gateway._http import FrontConnection, Responder

    async def go() -> None:
        async with running([ScriptedBackend()]) as (gw, _):
            for _ in range(3):  # a connection each
                async with client(gw.port) as c:
                    await stream(c, "script:tokens=2")
            await asyncio.sleep(0.05)

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run(go())
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, FrontConnection | Responder)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == []  # freed as each connection closed, not found later by a collection
