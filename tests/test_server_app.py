"""The server's ASGI app in process (httpx.ASGITransport, or the ASGI callable driven directly): the wire
contract's routes and event shapes, refusals with Retry-After, one terminal state per request under races, the
drain's last events, and the no-telemetry mode."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from llmslo.server import ServerApp, ServerConfig
from llmslo.telemetry import Telemetry

MODEL = "llmslo-sim"
Rows = list[dict[str, Any]]


def make_app(**config: Any) -> tuple[ServerApp, Rows]:
    rows: Rows = []
    cfg = ServerConfig(**{"speed": 200.0, **config})
    tel = Telemetry(version=cfg.version, sink=rows.append) if cfg.telemetry else None
    return ServerApp(cfg, tel), rows


def events(text: str) -> list[Any]:
    """The ``data:`` payloads of a server-sent event stream (``[DONE]`` kept as the string)."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def run(app: ServerApp, body: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        transport = httpx.ASGITransport(app, client=("10.0.0.1", 5000))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                return await asyncio.wait_for(body(client), timeout=60)
        finally:
            await app.close()

    return asyncio.run(main())


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "three words here", "max_tokens": 5, **fields}


# ---- the wire contract ------------------------------------------------------------------------------------


def test_a_streamed_completion_has_the_contract_shape_and_usage() -> None:
    app, rows = make_app()
    r = run(app, lambda c: c.post("/v1/completions", headers={"X-Request-Id": "req-1"}, json=completion(
        stream=True, stream_options={"include_usage": True}, ignore_eos=True, max_tokens=6)))
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
    assert r.headers["x-request-id"] == "req-1"
    evs = events(r.text)
    tokens, usage, done = evs[:6], evs[6], evs[7:]
    assert done == ["[DONE]"]
    for i, ev in enumerate(tokens):
        assert ev["id"] == "cmpl-req-1" and ev["object"] == "text_completion" and ev["model"] == MODEL
        assert isinstance(ev["created"], int)
        (choice,) = ev["choices"]
        assert choice["index"] == 0 and choice["text"].endswith(" ")
        assert choice["finish_reason"] == ("length" if i == 5 else None)
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 6,
                                                         "total_tokens": 9}
    (row,) = rows
    assert row["request_id"] == "req-1" and row["finish_reason"] == "length"
    assert row["prompt_tokens"] == 3 and row["generated_tokens"] == row["sent_tokens"] == 6


def test_a_streamed_chat_completion_has_the_chunk_shape_with_the_role_first() -> None:
    app, rows = make_app()
    body = {"model": MODEL, "messages": [{"role": "system", "content": "be brief"},
                                         {"role": "user", "content": [{"type": "text", "text": "hi there"}]}],
            "max_completion_tokens": 3, "max_tokens": 99, "stream": True, "ignore_eos": True}
    r = run(app, lambda c: c.post("/v1/chat/completions", json=body))
    evs = events(r.text)
    assert evs[-1] == "[DONE]" and len(evs) == 4  # no usage chunk unless asked
    deltas = [ev["choices"][0]["delta"] for ev in evs[:3]]
    assert deltas[0]["role"] == "assistant" and all("role" not in d for d in deltas[1:])
    assert all(ev["object"] == "chat.completion.chunk" for ev in evs[:3])
    assert [ev["choices"][0]["finish_reason"] for ev in evs[:3]] == [None, None, "length"]
    assert rows[0]["prompt_tokens"] == 4 and rows[0]["generated_tokens"] == 3


def test_non_streamed_completions_carry_the_text_the_finish_reason_and_usage() -> None:
    app, rows = make_app(mean_output_tokens=3.0)

    async def body(c: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        text = await c.post("/v1/completions", json=completion(max_tokens=400))
        chat = await c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 4, "ignore_eos": True,
                                                          "messages": [{"role": "user", "content": "a b"}]})
        return text, chat

    text, chat = run(app, body)
    t = text.json()
    assert t["object"] == "text_completion" and t["choices"][0]["finish_reason"] == "stop"  # natural, < 400
    n = t["usage"]["completion_tokens"]
    assert len(t["choices"][0]["text"].split()) == n and t["usage"]["total_tokens"] == n + 3
    c = chat.json()
    assert c["object"] == "chat.completion" and c["choices"][0]["message"]["role"] == "assistant"
    assert c["choices"][0]["finish_reason"] == "length" and c["usage"]["completion_tokens"] == 4
    assert [r["finish_reason"] for r in rows] == ["stop", "length"]
    assert rows[0]["sent_tokens"] == n


def test_a_model_the_server_does_not_serve_is_404_model_not_found() -> None:
    app, rows = make_app()
    r = run(app, lambda c: c.post("/v1/completions", json=completion(model="gpt-4")))
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "model_not_found" and "gpt-4" in r.json()["error"]["message"]
    assert rows[0]["finish_reason"] == "error" and rows[0]["error_type"] == "model_not_found"


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/completions", b"{not json", "body"),
    ("/v1/completions", b"[1, 2]", "body"),
    ("/v1/completions", json.dumps({"prompt": "x"}).encode(), "model"),
    ("/v1/completions", json.dumps(completion(prompt={"text": "a"})).encode(), "prompt"),
    ("/v1/completions", json.dumps(completion(prompt=[])).encode(), "prompt"),
    ("/v1/completions", json.dumps(completion(prompt=["a", "b"])).encode(), "prompt"),
    ("/v1/completions", json.dumps(completion(prompt=[1, -2])).encode(), "prompt[1]"),
    ("/v1/completions", json.dumps(completion(prompt=[1, "a"])).encode(), "prompt[1]"),
    ("/v1/completions", json.dumps(completion(prompt=[[1, 2.5]])).encode(), "prompt[0][1]"),
    ("/v1/completions", json.dumps(completion(prompt=[True])).encode(), "prompt[0]"),
    ("/v1/completions", json.dumps(completion(max_tokens=0)).encode(), "max_tokens"),
    ("/v1/completions", json.dumps(completion(max_tokens="5")).encode(), "max_tokens"),
    ("/v1/completions", json.dumps(completion(stream="yes")).encode(), "stream"),
    ("/v1/completions", json.dumps(completion(stream_options={"include_usage": 1})).encode(),
     "stream_options.include_usage"),
    ("/v1/completions", json.dumps(completion(max_tokens=10**6)).encode(), "max_tokens"),
    ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": []}).encode(), "messages"),
    ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": [{"content": 3}]}).encode(),
     "messages[0].content"),
])
def test_a_malformed_body_is_400_naming_the_field(path: str, body: bytes, field: str) -> None:
    app, rows = make_app()
    r = run(app, lambda c: c.post(path, content=body))
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"].startswith(f"{field}:") and error["type"] == "invalid_request_error"
    assert error["code"] == 400
    assert rows[0]["finish_reason"] == "error" and rows[0]["generated_tokens"] == 0


@pytest.mark.parametrize(("prompt", "tokens"), [
    ("three words here", 3),
    (["three words here"], 3),
    ([101, 7, 0, 99999], 4),
    ([[101, 7]], 2),
    ([""], 0),
])
def test_a_prompt_is_a_string_token_ids_or_a_list_of_one_of_those(prompt: Any, tokens: int) -> None:
    """What OpenAI's /v1/completions takes as one prompt; a prompt of token ids counts one token per id."""
    app, rows = make_app()
    r = run(app, lambda c: c.post("/v1/completions", json=completion(prompt=prompt, max_tokens=2, ignore_eos=True)))
    assert r.status_code == 200, r.text
    assert r.json()["usage"] == {"prompt_tokens": tokens, "completion_tokens": 2, "total_tokens": tokens + 2}
    assert rows[0]["prompt_tokens"] == tokens and rows[0]["finish_reason"] == "length"


def test_a_batch_of_prompts_is_refused_saying_to_send_one_request_each() -> None:
    app, rows = make_app()
    r = run(app, lambda c: c.post("/v1/completions", json=completion(prompt=["a b", [1, 2], "c"])))
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"] == ("prompt: a batch of 3 prompts is not served here: send one request per prompt "
                                "(each gets its own summary, TTFT and finish reason)")
    assert error["param"] == "prompt" and error["type"] == "invalid_request_error"
    assert rows[0]["finish_reason"] == "error"


def test_the_request_id_is_taken_when_valid_echoed_everywhere_and_replaced_when_not() -> None:
    app, rows = make_app()

    async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [await c.post("/v1/completions", json=completion(), headers={"X-Request-Id": "a.B:c-9_"}),
                await c.post("/v1/completions", json=completion(), headers={"X-Request-Id": "bad/" + "x" * 130}),
                await c.post("/v1/completions", json=completion(model="x"), headers={"X-Request-Id": "r-404"}),
                await c.get("/nowhere", headers={"X-Request-Id": "r-route"}),
                await c.get("/metrics", headers={"X-Request-Id": "r-metrics"})]

    ok, bad, missing, route, metrics = run(app, body)
    assert ok.headers["x-request-id"] == "a.B:c-9_" == rows[0]["request_id"]
    replaced = bad.headers["x-request-id"]
    assert len(replaced) == 32 and int(replaced, 16) >= 0 and rows[1]["request_id"] == replaced
    assert missing.headers["x-request-id"] == "r-404" and route.status_code == 404
    assert route.headers["x-request-id"] == "r-route" and metrics.headers["x-request-id"] == "r-metrics"


def test_the_tenant_class_is_taken_from_the_header_when_configured() -> None:
    app, rows = make_app(tenant_classes=("interactive", "batch"))

    async def body(c: httpx.AsyncClient) -> None:
        for cls in ("batch", "gold", None):
            await c.post("/v1/completions", json=completion(), headers={"X-Tenant-Class": cls} if cls else {})

    run(app, body)
    assert [r["tenant_class"] for r in rows] == ["batch", "default", "default"]


def test_health_ready_models_metrics_and_unknown_routes() -> None:
    app, _ = make_app()

    async def body(c: httpx.AsyncClient) -> dict[str, httpx.Response]:
        await c.post("/v1/completions", json=completion(), headers={"X-Request-Id": "seen-1"})
        return {"health": await c.get("/health"), "ready": await c.get("/ready"), "models": await c.get("/v1/models"),
                "metrics": await c.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}),
                "get_completions": await c.get("/v1/completions"), "other": await c.get("/v2/x")}

    r = run(app, body)
    assert r["health"].status_code == 200 and r["ready"].json() == {"ready": True, "draining": False}
    assert r["models"].json()["data"][0]["id"] == MODEL
    assert r["metrics"].headers["content-type"].startswith("application/openmetrics-text")
    assert 'request_id="seen-1"' in r["metrics"].text  # exemplars, as the scraper asked for OpenMetrics
    assert r["get_completions"].status_code == 405 and r["other"].status_code == 404


# ---- refusals ----------------------------------------------------------------------------------------------


def test_overload_gives_429_with_retry_after_and_rejected_queue_full_summaries() -> None:
    app, rows = make_app(max_num_seqs=1, max_queue=1, speed=20.0)

    async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
        reqs = [c.post("/v1/completions", json=completion(max_tokens=8, ignore_eos=True, stream=True),
                       headers={"X-Request-Id": f"o{i}"}) for i in range(12)]
        return list(await asyncio.gather(*reqs))

    answers = run(app, body)
    refused = [r for r in answers if r.status_code == 429]
    served = [r for r in answers if r.status_code == 200]
    assert len(refused) >= 8 and len(served) >= 2 and len(refused) + len(served) == 12
    for r in refused:
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "queue_full" and r.json()["error"]["code"] == 429
    by_id = {row["request_id"]: row for row in rows}
    assert len(by_id) == 12
    for r in refused:
        row = by_id[r.headers["x-request-id"]]
        assert (row["finish_reason"], row["reject_reason"]) == ("rejected", "queue_full")
    for r in served:
        assert by_id[r.headers["x-request-id"]]["finish_reason"] == "length"


def test_a_queue_timeout_answers_429_with_retry_after_and_says_deadline_as_its_summary_does() -> None:
    # One slot, a long request holding it; the second waits in the queue past its timeout.
    app, rows = make_app(max_num_seqs=1, max_queue=4, queue_timeout_s=0.2, speed=1.0)

    async def body(c: httpx.AsyncClient) -> httpx.Response:
        long = asyncio.ensure_future(c.post("/v1/completions", json=completion(max_tokens=64, ignore_eos=True),
                                            headers={"X-Request-Id": "long"}))
        await asyncio.sleep(0.05)
        waiting = await c.post("/v1/completions", json=completion(max_tokens=4), headers={"X-Request-Id": "wait"})
        await long
        return waiting

    waited = run(app, body)
    assert waited.status_code == 429 and int(waited.headers["retry-after"]) >= 1
    assert waited.json()["error"]["type"] == "deadline"
    row = next(r for r in rows if r["request_id"] == "wait")
    assert (row["finish_reason"], row["reject_reason"]) == ("deadline", None)


def test_the_rate_limit_refuses_per_key_with_retry_after() -> None:
    app, rows = make_app(rate_limit=0.5, rate_burst=1)

    async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [await c.post("/v1/completions", json=completion(), headers={"Authorization": "Bearer a"}),
                await c.post("/v1/completions", json=completion(), headers={"Authorization": "Bearer a"}),
                await c.post("/v1/completions", json=completion(), headers={"Authorization": "Bearer b"}),
                await c.post("/v1/completions", json=completion())]  # keyed by the client address

    first, second, other, by_address = run(app, body)
    assert (first.status_code, second.status_code, other.status_code, by_address.status_code) == (200, 429, 200, 200)
    assert second.json()["error"]["type"] == "rate_limited" and int(second.headers["retry-after"]) >= 1
    assert rows[1]["reject_reason"] == "rate_limited"


def test_a_token_cost_beyond_the_token_limit_burst_is_400_not_429_forever() -> None:
    app, _ = make_app(token_rate_limit=10, token_burst=50)
    r = run(app, lambda c: c.post("/v1/completions", json=completion(max_tokens=60)))
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens:")


def test_engine_errors_end_streams_with_an_error_event_then_open_the_breaker() -> None:
    app, rows = make_app(error_rate=1.0, breaker_failures=2, breaker_open_s=60.0)

    async def body(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [await c.post("/v1/completions", json=completion(stream=True, max_tokens=20)) for _ in range(3)]

    failed1, failed2, refused = run(app, body)
    for r in (failed1, failed2):
        evs = events(r.text)
        assert evs[-1] == "[DONE]"
        assert evs[-2]["error"]["type"] == "engine_error"
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "circuit_open"
    assert 55 <= int(refused.headers["retry-after"]) <= 60
    assert [(r["finish_reason"], r["error_type"] or r["reject_reason"]) for r in rows] == [
        ("error", "engine_error"), ("error", "engine_error"), ("rejected", "circuit_open")]


def test_the_request_timeout_ends_a_stream_with_a_deadline_error_event() -> None:
    app, rows = make_app(speed=1.0, request_timeout_s=0.2)
    r = run(app, lambda c: c.post("/v1/completions", json=completion(stream=True, max_tokens=500, ignore_eos=True,
                                                                     stream_options={"include_usage": True})))
    evs = events(r.text)
    assert evs[-1] == "[DONE]" and evs[-2]["error"]["type"] == "deadline"
    assert evs[-2]["error"]["code"] == "request_timeout"
    assert all("usage" not in ev for ev in evs[:-1] if isinstance(ev, dict))
    assert rows[0]["finish_reason"] == "deadline" and 0 < rows[0]["generated_tokens"] < 500


# ---- the drain ------------------------------------------------------------------------------------------------


def test_while_draining_ready_is_503_and_new_requests_get_503_draining_with_retry_after() -> None:
    app, rows = make_app(drain_settle_s=60.0)

    async def body(c: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        assert app.drain is not None
        app.drain.begin(from_version="sim-1", to_version="sim-2")
        return await c.get("/ready"), await c.post("/v1/completions", json=completion())

    ready, refused = run(app, body)
    assert ready.status_code == 503
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "draining"
    assert refused.headers["retry-after"] == "1"
    assert (rows[0]["finish_reason"], rows[0]["reject_reason"]) == ("rejected", "draining")


@pytest.mark.parametrize(("drain", "last"), [
    ({"drain_max_inflight_s": 0.05, "drain_idle_s": None}, "early"),
    ({"drain_max_inflight_s": None, "drain_idle_s": None, "drain_budget_s": 0.1}, "budget"),
])
def test_streams_the_drain_closes_end_with_its_terminal_event(drain: dict[str, Any], last: str) -> None:
    app, rows = make_app(speed=1.0, drain_settle_s=0.0, drain_poll_s=0.01, **drain)

    async def body(c: httpx.AsyncClient) -> tuple[httpx.Response, Any]:
        assert app.drain is not None
        reply = asyncio.create_task(c.post("/v1/completions", json=completion(
            stream=True, max_tokens=300, ignore_eos=True, stream_options={"include_usage": True})))
        while not app.telemetry or not app.telemetry.in_flight():
            await asyncio.sleep(0.005)
        app.drain.begin(from_version="sim-1", to_version="sim-2")
        record = await app.drain.run()
        return await reply, record

    reply, record = run(app, body)
    evs = events(reply.text)
    assert evs[-1] == "[DONE]"
    if last == "early":
        final, usage = evs[-3], evs[-2]
        assert final["choices"][0]["finish_reason"] == "server_draining" and final["choices"][0]["text"] == ""
        assert final["drain_reason"] == "max_inflight" and final["retryable"] is True
        assert usage["usage"]["completion_tokens"] == len(evs) - 3
        assert record.closed_by_reason["max_inflight"] == 1
    else:
        assert evs[-2]["error"]["type"] == "server_draining"
        assert evs[-2]["error"]["code"] == "drain_budget_exhausted"
        assert record.closed_by_reason["budget_exhausted"] == 1 and record.decision == "terminate"
    assert rows[0]["finish_reason"] == "server_draining"


# ---- one terminal state under races (the ASGI callable driven directly) -------------------------------------


class Client:
    """An ASGI client that hangs up after ``hang_up_after`` body chunks (never when None)."""

    def __init__(self, body: dict[str, Any], hang_up_after: int | None) -> None:
        self.body = json.dumps(body).encode()
        self.hang_up_after = hang_up_after
        self.gone = asyncio.Event()
        self.sent_body = False
        self.messages: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if not self.sent_body:
            self.sent_body = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.gone.is_set():
            return  # as uvicorn: nothing reaches a client that is gone
        self.messages.append(message)
        chunks = sum(1 for m in self.messages if m["type"] == "http.response.body")
        if self.hang_up_after is not None and chunks >= self.hang_up_after:
            self.gone.set()
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.gone.set()  # a complete response: the server then reports a disconnect


def test_every_request_has_one_terminal_state_under_cancel_deadline_and_drain_races() -> None:
    rng = random.Random(11)
    app, rows = make_app(speed=10.0, request_timeout_s=0.2, drain_settle_s=0.0, drain_poll_s=0.01,
                         drain_max_inflight_s=0.195, max_num_seqs=8, kv_blocks=64, block_size=4)
    clients = [Client(completion(stream=rng.random() < 0.8, max_tokens=rng.randrange(1, 150), ignore_eos=True),
                      rng.choice([None, None, None, 3, 30])) for _ in range(40)]

    async def main() -> None:
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "client": ("h", 1)}

        async def arrive(i: int, c: Client) -> None:
            await asyncio.sleep(rng.random() * 0.05)  # arrivals spread over 50 ms: the deadline and drain race
            await app({**scope, "headers": [(b"x-request-id", f"q{i}".encode())]}, c.receive, c.send)

        handlers = [asyncio.create_task(arrive(i, c)) for i, c in enumerate(clients)]
        await asyncio.sleep(0.1)
        assert app.drain is not None
        app.drain.begin()
        await asyncio.wait_for(asyncio.gather(*handlers, app.drain.run()), timeout=30)
        await app.close()

    asyncio.run(main())
    assert sorted(r["request_id"] for r in rows) == sorted(f"q{i}" for i in range(40))  # one summary each
    reasons = {r["finish_reason"] for r in rows}
    assert reasons <= {"length", "client_cancel", "deadline", "server_draining", "rejected"}
    assert app.engine.kv_blocks_free == 64  # every request's blocks released
    engine = app.engine
    assert getattr(engine, "running", 0) == 0 and getattr(engine, "waiting", 0) == 0
    for client, row in zip(clients, sorted(rows, key=lambda r: int(str(r["request_id"])[1:])), strict=True):
        bodies = [m for m in client.messages if m["type"] == "http.response.body"]
        if row["finish_reason"] != "client_cancel" and bodies:  # a client still there saw the response end
            assert bodies[-1].get("more_body", False) is False


# ---- the no-telemetry mode ---------------------------------------------------------------------------------------


def test_the_no_telemetry_mode_serves_the_same_stream_without_metrics() -> None:
    app, _ = make_app(telemetry=False)

    async def body(c: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        return (await c.post("/v1/completions", json=completion(stream=True, ignore_eos=True,
                                                                 stream_options={"include_usage": True})),
                await c.get("/metrics"))

    stream, metrics = run(app, body)
    evs = events(stream.text)
    assert [ev["choices"][0]["finish_reason"] for ev in evs[:5]] == [None] * 4 + ["length"]
    assert evs[5]["usage"]["completion_tokens"] == 5 and evs[6] == "[DONE]"
    assert metrics.status_code == 404


# ---- the process's signal handling, driven in process ------------------------------------------------------


class _Uvicorn:
    """What the run's signal handling uses of uvicorn's server: ``should_exit``."""

    should_exit = False


def _signal_run(app: ServerApp, cfg: ServerConfig, said: list[str] | None = None) -> Any:
    from llmslo.server import RunResult
    from llmslo.server._run import _Run

    return _Run(cfg, app, _Uvicorn(), RunResult(), (said if said is not None else []).append)  # type: ignore[arg-type]


def test_return_to_pool_keeps_serving_and_the_next_signal_drains_again() -> None:
    app, rows = make_app(speed=2.0, drain_settle_s=0.0, drain_poll_s=0.01, drain_budget_s=0.1, drain_idle_s=None,
                         drain_max_inflight_s=None, on_budget="return_to_pool")
    said: list[str] = []
    run_state = _signal_run(app, app.config, said)

    async def body(c: httpx.AsyncClient) -> tuple[httpx.Response, bool, int]:
        reply = asyncio.create_task(c.post("/v1/completions", json=completion(stream=True, max_tokens=40,
                                                                             ignore_eos=True)))
        while not app.telemetry or not app.telemetry.in_flight():
            await asyncio.sleep(0.005)
        run_state.on_signal()
        assert run_state.drain_task is not None
        await run_state.drain_task
        ready_after = (await c.get("/ready")).status_code
        return await reply, run_state.server.should_exit, ready_after

    reply, should_exit, ready_after = run(app, body)
    assert should_exit is False and ready_after == 200  # back in the pool, serving
    assert run_state.result.drains[0].decision == "return_to_pool" and run_state.result.drains[0].remaining == 1
    assert events(reply.text)[-2]["choices"][0]["finish_reason"] == "length"  # the stream went on
    assert rows[0]["finish_reason"] == "length"
    assert run_state.signals == 0  # a later signal starts a new drain
    spent = run_state.result.drains[0].actual_drain_s
    assert said == [
        "signal: draining: /ready is 503 and new requests get 503 draining; settle 0s (a second signal ends every "
        "request at once)",
        "settled: draining 1 request in flight (budget 100ms, then return_to_pool; closing none early)",
        f"drain budget spent after {spent:.2f}s: closed 0, 0 finished on their own; 1 request still in flight: back "
        "in the pool, serving (the next signal drains again)",
    ]


def test_a_second_signal_ends_every_request_at_once_with_the_budget_event() -> None:
    app, rows = make_app(speed=1.0, drain_settle_s=60.0)
    said: list[str] = []
    run_state = _signal_run(app, app.config, said)

    async def body(c: httpx.AsyncClient) -> httpx.Response:
        reply = asyncio.create_task(c.post("/v1/completions", json=completion(stream=True, max_tokens=500,
                                                                             ignore_eos=True)))
        while not app.telemetry or not app.telemetry.in_flight():
            await asyncio.sleep(0.005)
        run_state.on_signal()  # the drain begins its 60 s settle time
        run_state.on_signal()  # the operator insists
        assert run_state.stop_task is not None
        await run_state.stop_task
        return await reply

    reply = run(app, body)
    assert run_state.server.should_exit is True
    error = events(reply.text)[-2]["error"]
    assert (error["type"], error["code"]) == ("server_draining", "drain_budget_exhausted")
    assert rows[0]["finish_reason"] == "server_draining"
    assert said == ["signal: draining: /ready is 503 and new requests get 503 draining; settle 1m (a second "
                    "signal ends every request at once)",
                    "signal again: ending the 1 request in flight now (server_draining), then exit"]


def test_the_drain_record_document_is_an_update_record(tmp_path: Any) -> None:
    from llmslo.controls import DrainRecord
    from llmslo.server._run import drain_record_document, write_drain_record

    cfg = ServerConfig(version="v1", next_version="v2", drain_record=tmp_path / "d" / "drain.json")
    record = DrainRecord("v1", "v2", None, None, 1_796_000_000.5, 120.0, 5.0, 1.0, 0, {"idle": 0}, {}, 0, 0, 0, 0,
                         0, "drained")
    doc = drain_record_document(cfg, record)
    assert doc == {"update_id": "v1-to-v2-1796000000", "drain": record.to_dict()}
    path = write_drain_record(cfg, record)
    assert json.loads(path.read_text()) == doc
    assert [p.name for p in path.parent.iterdir()] == ["drain.json"]  # no temporary file left
    named = ServerConfig(version="v1", next_version="v2", update_id="u-1", drain_record=path)
    assert drain_record_document(named, record)["update_id"] == "u-1"


def test_after_the_drain_the_server_lingers_answering_before_it_exits() -> None:
    app, _ = make_app(drain_settle_s=0.0, drain_poll_s=0.01, exit_linger_s=0.3)
    run_state = _signal_run(app, app.config)

    async def body(c: httpx.AsyncClient) -> tuple[bool, int, int, bool]:
        run_state.on_signal()
        await asyncio.sleep(0.15)  # drained at once (nothing in flight), now lingering
        lingering = run_state.server.should_exit
        ready, metrics = (await c.get("/ready")).status_code, (await c.get("/metrics")).status_code
        assert run_state.drain_task is not None
        await run_state.drain_task
        return lingering, ready, metrics, run_state.server.should_exit

    lingering, ready, metrics, exiting = run(app, body)
    assert (lingering, ready, metrics, exiting) == (False, 503, 200, True)
