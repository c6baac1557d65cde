"""Paths of the gateway that have code but no test at its level, driven as tests/test_gateway.py drives it (an
in-process gateway, scripted backends): the breaker's TTFT bound, a 5xx retried on another backend, token budgets
settled from usage, a Retry-After from the queue's drain rate, the key table under 10,000 API keys, and health
checks taking a backend out of the pool and back."""

from __future__ import annotations

import asyncio
import gc
import logging
import tracemalloc
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from llmslo.gateway import BudgetConfig, Gateway
from llmslo.tests._gateway_support import ScriptedBackend, running
from llmslo.tests.test_gateway import client, events, run, stream


@dataclass
class Scripted(ScriptedBackend):
    """A scripted backend whose generation requests all follow ``script`` (unless the request names its own in
    ``x-script``): two backends of one gateway then behave differently for the same request."""

    script: str | None = None

    async def _answer(self, method: str, path: str, headers: dict[str, str], raw: bytes,
                      reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> bool:
        if self.script is not None and path not in ("/health", "/v1/models"):
            headers.setdefault("x-script", self.script)
        return await super()._answer(method, path, headers, raw, reader, writer, head)


async def until(condition: Any, what: str, timeout_s: float = 10.0) -> None:
    """Wait (polling every 10 ms) until ``condition()`` holds; fail naming ``what`` after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"not within {timeout_s:g} s: {what}")


def fill_limit(gw: Gateway, backend: str) -> None:
    """Take every place of ``backend``'s concurrency limit: the routing then tries the other backends first (the
    power of two choices prefers those with room), and ``backend`` only when none of them is left."""
    limit = gw.pool.backends[backend].limit
    for _ in range(10_000):
        if not limit.try_acquire():
            return
    pytest.fail("the limit never filled")


def failures_of(gw: Gateway, backend: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The failure kinds ``backend``'s breaker is told of from now on (the breaker itself still hears them)."""
    breaker = gw.pool.backends[backend].breaker
    kinds: list[str] = []
    original = breaker.record_failure

    def record_failure(kind: str = "5xx") -> Any:
        kinds.append(kind)
        return original(kind)

    monkeypatch.setattr(breaker, "record_failure", record_failure)
    return kinds


# ---- 1. the breaker's TTFT bound ---------------------------------------------------------------------------------

SLOW = "script:tokens=3,ttft=0.6"
"""A first token 0.6 s after the request: over the bound of 0.3 s of these tests."""
FAST = "script:tokens=3"
"""A first token at once: well under the bound."""


def test_a_first_token_later_than_the_ttft_bound_counts_one_slow_ttft_failure_per_request_and_one_under_it_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> tuple[list[str], list[str], list[int]]:
        a, b = Scripted(script=SLOW), Scripted(script=FAST)
        async with running([a, b], ttft_bound_s=0.3, breaker_failures=100) as (gw, _rows), client(gw.port) as c:
            slow, fast = failures_of(gw, "a", monkeypatch), failures_of(gw, "b", monkeypatch)
            gw.pool.set_in_pool(gw.pool.backends["b"], False, "test: a alone")
            codes = [(await stream(c, "hi"))[0] for _ in range(2)]
            gw.pool.set_in_pool(gw.pool.backends["b"], True, "test")
            gw.pool.set_in_pool(gw.pool.backends["a"], False, "test: b alone")
            codes += [(await stream(c, "hi"))[0] for _ in range(4)]
            return slow, fast, codes

    slow, fast, codes = run(go())
    assert codes == [200] * 6  # a slow first token does not cut the stream
    assert slow == ["slow_ttft", "slow_ttft"]  # one per slow request
    assert fast == []


def test_a_backend_slower_than_the_ttft_bound_opens_its_breaker_and_new_requests_go_to_the_other() -> None:
    """docs/gateway.md: "(with --ttft-bound) a first token later than the bound count[s] as [a failure];
    --breaker-failures in a row open it". Each slow request here is one such failure, three in a row."""

    async def go() -> tuple[list[str], list[str], list[str]]:
        a, b = Scripted(script=SLOW), Scripted(script=FAST)
        async with running([a, b], ttft_bound_s=0.3, breaker_failures=3, breaker_open_s=60.0) as (gw, rows):
            async with client(gw.port) as c:
                gw.pool.set_in_pool(gw.pool.backends["b"], False, "test: a alone")
                states = []
                for _ in range(3):
                    status, _, _ = await stream(c, "hi")
                    assert status == 200
                    states.append(gw.pool.backends["a"].breaker.state)
                gw.pool.set_in_pool(gw.pool.backends["b"], True, "test")
                after = [(await stream(c, "hi"))[1]["x-llmslo-backend"] for _ in range(6)]
            await until(lambda: len(rows) == 9, "nine summaries")
        return states, after, [str(r["backend"]) for r in rows[3:]]

    states, after, served = run(go())
    assert states == ["closed", "closed", "open"]
    assert after == ["b"] * 6 and served == ["b"] * 6


# ---- 2. a 5xx before anything reached the client is retried on another backend ------------------------------------

@pytest.mark.parametrize("status", [500, 503])
def test_a_5xx_answered_before_the_client_got_anything_is_retried_on_another_backend(status: int) -> None:
    async def go() -> None:
        a, b = Scripted(script=f"script:status={status}"), Scripted(model="served-by-b", script="script:tokens=2")
        async with running([a, b], retries=1, breaker_failures=3, breaker_open_s=60.0) as (gw, rows):
            fill_limit(gw, "b")  # a is tried first, every time it is routable
            async with client(gw.port) as c:
                replies = [await c.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2})
                           for _ in range(5)]
            await until(lambda: len(rows) == 5, "five summaries")
            breaker = gw.pool.backends["a"].breaker.state
        assert [r.status_code for r in replies] == [200] * 5
        assert [r.headers["x-llmslo-backend"] for r in replies] == ["b"] * 5
        assert [r.json()["model"] for r in replies] == ["served-by-b"] * 5  # b's reply, not a's error
        assert len(a.seen) == 3 and len(b.seen) == 5  # a answered 5xx three times: its breaker opened
        assert breaker == "open"
        assert [(r["backend"], r["version"], r["finish_reason"]) for r in rows] == [("b", "v2", "length")] * 5

    run(go())


def test_a_stream_that_fails_after_it_began_is_not_retried_and_ends_with_the_error_event() -> None:
    async def go() -> None:
        a, b = Scripted(script="script:tokens=10,die=3"), Scripted(script="script:tokens=2")
        async with running([a, b], retries=1) as (gw, rows):
            fill_limit(gw, "b")
            async with client(gw.port) as c:
                status, headers, raw = await stream(c, "hi")
            await until(lambda: len(rows) == 1, "one summary")
        got = events(raw)
        assert status == 200 and headers["x-llmslo-backend"] == "a"
        assert [e["choices"][0]["text"] for e in got[:-1] if isinstance(e, dict)] == ["t0 ", "t1 ", "t2 "]
        last = got[-1]
        assert isinstance(last, dict) and last["error"]["code"] == "backend_failed"
        assert b.seen == []  # not retried: the client already had a's first chunks
        assert (rows[0]["backend"], rows[0]["error_type"], rows[0]["generated_tokens"]) == ("a", "backend_failed", 3)

    run(go())


# ---- 3. token budgets settle at the gateway ----------------------------------------------------------------------

RATE_PER_MIN = 0.06
"""Tokens per minute of these budgets: 0.001 a second, so a bucket refills nothing that matters during a test."""


async def bucket_level(c: httpx.AsyncClient, capacity: int, key: str) -> float:
    """The tokens ``key``'s bucket holds now, read through the gateway: a request costing the whole ``capacity``
    is refused (the bucket is not full) with the wait its bucket needs, ``(capacity - held) / rate``; a refusal
    takes nothing."""
    body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": capacity - 3}
    r = await c.post("/v1/completions", json=body, headers={"authorization": key})
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limited", r.text
    return capacity - float(r.json()["error"]["retry_after_s"]) * RATE_PER_MIN / 60.0


def test_a_reply_that_used_less_than_it_reserved_is_refunded_so_a_later_request_fits() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        budget = BudgetConfig(tokens_per_min=RATE_PER_MIN, token_burst=100.0)
        async with running([a], budget=budget) as (gw, rows), client(gw.port) as c:
            key = {"authorization": "Bearer k1"}
            # 3 prompt token ids + max_tokens 50 reserved; the backend uses 7 + 5 (its usage)
            first = asyncio.ensure_future(c.post(
                "/v1/completions", json={"model": "m", "prompt": [1, 2, 3], "max_tokens": 50},
                headers={**key, "x-script": "script:tokens=5,ttft=0.5"}))
            await until(lambda: len(a.seen) == 1, "the first request at the backend")
            during = await bucket_level(c, 100, key["authorization"])
            assert (await first).status_code == 200
            await until(lambda: any(r["finish_reason"] == "length" for r in rows), "its summary")
            (done,) = [r for r in rows if r["finish_reason"] == "length"]
            used = int(str(done["prompt_tokens"])) + int(str(done["generated_tokens"]))
            after = await bucket_level(c, 100, key["authorization"])
            # 3 + 80: more than the 47 left under the reservation, less than what is left once it is settled
            later = await c.post("/v1/completions", json={"model": "m", "prompt": [1, 2, 3], "max_tokens": 80},
                                 headers={**key, "x-script": "script:tokens=5"})
        assert during == pytest.approx(100 - 53, abs=0.05)
        assert used == 12 and after == pytest.approx(100 - used, abs=0.05)
        assert later.status_code == 200

    run(go())


def test_a_stream_the_client_cancels_is_charged_what_was_generated() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        budget = BudgetConfig(tokens_per_min=RATE_PER_MIN, token_burst=300.0)
        async with running([a], budget=budget) as (gw, rows), client(gw.port) as c:
            key = "Bearer k1"
            body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 200, "stream": True}  # 203 reserved
            async with c.stream("POST", "/v1/completions", json=body,
                                headers={"authorization": key, "x-script": "script:tokens=200,gap=0.02"}) as r:
                got = 0
                async for part in r.aiter_raw():
                    got += part.count(b"data: ")
                    if got >= 3:
                        during = await bucket_level(c, 300, key)
                        break
            await until(lambda: len(rows) == 2, "the cancelled stream's summary")
            (row,) = [r for r in rows if r["finish_reason"] == "client_cancel"]
            charged = int(str(row["prompt_tokens"])) + int(str(row["generated_tokens"]))
            after = await bucket_level(c, 300, key)
            # 3 + 197 = 200: more than the 97 left under the reservation
            later = await c.post("/v1/completions", json={"model": "m", "prompt": [1, 2, 3], "max_tokens": 197},
                                 headers={"authorization": key, "x-script": "script:tokens=5"})
        assert during == pytest.approx(300 - 203, abs=0.05)
        assert row["prompt_tokens"] == 3 and 3 <= int(str(row["generated_tokens"])) < 90
        assert after == pytest.approx(300 - charged, abs=0.05)  # charged what was generated, not 0, not 203
        assert later.status_code == 200

    run(go())


# ---- 4. a Retry-After from the queue's drain rate ----------------------------------------------------------------

QUEUE = 10


async def queue_full_retry_after(service_s: float) -> list[float]:
    """The ``retry_after_s`` of the 429 ``queue_full`` answers to requests sent to a full queue (``QUEUE``
    places, one request served at a time, each for ``service_s``) once it has seen one request leave it."""
    a = ScriptedBackend()
    # one tenant class: it is refused only once the queue is full (with more, the lower ones are shed before)
    config = {"concurrency": 1, "queue_capacity": QUEUE, "tenant_classes": ("default",)}
    async with running([a], **config) as (gw, _rows), client(gw.port) as c:
        body = {"model": "m", "prompt": "hi", "max_tokens": 1}
        headers = {"x-script": f"script:tokens=1,ttft={service_s}"}
        sent = [asyncio.ensure_future(c.post("/v1/completions", json=body, headers=headers))
                for _ in range(1 + QUEUE)]  # one served, the rest fill the queue
        try:
            await until(lambda: "m" in gw.app.queues and gw.app.queues["m"].depth == QUEUE, "a full queue")
            estimator = gw.app.queues["m"].retry_after
            await until(lambda: estimator.drain_rate() is not None, "one request leaving the queue", 20.0)
            probes = [asyncio.ensure_future(c.post("/v1/completions", json=body, headers=headers))
                      for _ in range(QUEUE + 3)]  # refill the places the departures freed, then be refused
            sent += probes
            done, _ = await asyncio.wait(probes, timeout=10.0, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.sleep(0.2)  # the other refusals of the burst
            refused = [p.result() for p in probes if p.done() and not p.cancelled() and p.exception() is None
                       and p.result().status_code == 429]
            assert done and refused, "no request was refused"
            assert all(r.json()["error"]["type"] == "queue_full" for r in refused)
            for r in refused:  # the header is the body's seconds, rounded up
                assert r.headers["retry-after"] == str(max(1, -int(-r.json()["error"]["retry_after_s"] // 1)))
            return [float(r.json()["error"]["retry_after_s"]) for r in refused]
        finally:
            for f in sent:  # the clients leave: the queue empties at once
                f.cancel()
            await asyncio.gather(*sent, return_exceptions=True)


def test_the_retry_after_of_a_full_queue_follows_how_fast_the_backend_drains_it() -> None:
    fast = run(queue_full_retry_after(0.1))
    slow = run(queue_full_retry_after(0.8))
    # about QUEUE x service time (1 s and 8 s, each within +-20 % jitter and the gateway's own time): a constant
    # would give both the same, the 5 s fallback too
    assert min(slow) > 2 * max(fast), (fast, slow)


# ---- 5. 10,000 API keys --------------------------------------------------------------------------------------------

MAX_KEYS = 1000
"""The key table's cap in this test (``BudgetConfig.max_keys``, documented default 10,000): below 5,000, so that
the table is full well before the first measurement and any growth between 5,000 and 10,000 keys would be a leak."""
LIMITER_FILE = "*/controls/_ratelimit.py"


async def post_raw(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: str) -> int:
    """One request on a kept-alive connection, with ``key`` as its API key; its status (httpx costs more than the
    gateway here)."""
    body = b'{"model": "m", "prompt": "hi", "max_tokens": 1}'
    writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\n"
                 b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (key.encode(), len(body), body))
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


def test_ten_thousand_api_keys_keep_the_key_table_and_its_memory_bounded() -> None:
    async def go() -> dict[int, tuple[int, int, int, int]]:
        a = ScriptedBackend()
        budget = BudgetConfig(requests_per_s=100_000.0, max_keys=MAX_KEYS)  # the overflow bucket never runs dry
        marks: dict[int, tuple[int, int, int, int]] = {}
        async with running([a], budget=budget) as (gw, rows):
            limiter = gw.app.limiter
            assert limiter is not None and limiter.max_keys == MAX_KEYS
            conns = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(4)]
            try:
                async def keys(lo: int, hi: int) -> None:
                    async def one_connection(j: int) -> None:
                        reader, writer = conns[j]
                        for i in range(lo + j, hi, len(conns)):
                            assert await post_raw(reader, writer, f"key-{i:05d}") == 200
                    await asyncio.gather(*(one_connection(j) for j in range(len(conns))))

                for n in (5000, 10_000):
                    await keys(n - 5000, n)
                    rows.clear()  # the test's own list of summaries, not the gateway's
                    a.seen.clear()
                    gc.collect()
                    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, LIMITER_FILE)])
                    held = sum(s.size for s in snapshot.statistics("filename"))
                    marks[n] = (len(limiter), len(limiter.store), held,  # type: ignore[arg-type]
                                tracemalloc.get_traced_memory()[0])
            finally:
                for _, writer in conns:
                    writer.close()
        return marks

    tracemalloc.start()  # before the gateway: every allocation it makes, and frees, is seen
    try:
        marks = run(go())
    finally:
        tracemalloc.stop()
    (keys5, slots5, held5, total5), (keys10, slots10, held10, total10) = marks[5000], marks[10_000]
    assert keys5 == keys10 == MAX_KEYS  # full, and never past the cap
    assert slots5 <= MAX_KEYS + 1 and slots10 <= MAX_KEYS + 1  # the keys' buckets and the overflow's
    assert held5 > 100 * 1024  # the measurement sees the table (about 600 KiB here)
    assert held10 - held5 < 16 * 1024, (held5, held10)  # no growth of the limiter's own structures
    assert total10 - total5 < 256 * 1024, (total5, total10)  # nor of the gateway's (a key leaked: ~2.5 MiB)


# ---- 6. health checks ----------------------------------------------------------------------------------------------

def test_a_failing_health_check_takes_a_backend_out_and_a_passing_one_brings_it_back(
        caplog: pytest.LogCaptureFixture) -> None:
    def changes(metrics: str) -> str:
        (line,) = [x for x in metrics.splitlines() if x.startswith('llmslo_backend_pool_changes_total{backend="a"}')]
        return line.rsplit(" ", 1)[1]

    async def go() -> None:
        a, b = ScriptedBackend(), ScriptedBackend()
        async with running([a, b], health_interval_s=0.05) as (gw, _rows), client(gw.port) as c:
            backend_a = gw.pool.backends["a"]
            body = {"model": "m", "prompt": "hi", "max_tokens": 1}
            before = changes((await c.get("/metrics")).text)
            a.healthy = False
            await until(lambda: not backend_a.healthy, "a marked unhealthy")
            seen = len(a.seen)
            await asyncio.sleep(0.3)  # several more failing checks: still one change
            out = [(await c.post("/v1/completions", json=body)).headers["x-llmslo-backend"] for _ in range(10)]
            during = changes((await c.get("/metrics")).text)
            down = [r.getMessage() for r in caplog.records if r.name == "llmslo.gateway"]
            assert len(a.seen) == seen
            a.healthy = True
            await until(lambda: backend_a.healthy, "a healthy again")
            back: list[str] = []
            for _ in range(200):  # a has its share of the requests again
                back.append((await c.post("/v1/completions", json=body)).headers["x-llmslo-backend"])
                if back.count("a") >= 3:
                    break
            after = changes((await c.get("/metrics")).text)
            up = [r.getMessage() for r in caplog.records if r.name == "llmslo.gateway"]
        assert out == ["b"] * 10
        assert (before, during, after) == ("0.0", "1.0", "2.0")
        assert len(down) == 1 and down[0].startswith("backend a unhealthy: health check answered 503"), down
        assert len(up) == 2 and up[1].startswith("backend a healthy"), up
        assert back.count("a") >= 3

    with caplog.at_level(logging.WARNING, logger="llmslo.gateway"):
        run(go())

