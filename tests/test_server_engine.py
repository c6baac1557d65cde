"""The simulated continuous-batching engine (llmslo.server): step timing from the fitted profile, the KV-block
budget (waiting, growth, preemption, release exactly once), output lengths, backpressure, failure injection.

Timing tests run the engine and the telemetry on one virtual clock (the engine's sleep advances it), so every
interval is exact and no assertion depends on the machine's speed."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from llmslo.server import PROFILES, EngineConfig, KvCache, Sequence, SimulatedEngine
from llmslo.server._engine import ENGINE_ERROR, WORDS
from llmslo.server._plain import PlainQueue
from llmslo.telemetry import ConfigurationError, LlmsloError, RequestTracker, SendQueue, StreamPolicy, Telemetry

PROFILE = PROFILES["llama2-70b/h100-80gb"]


class VirtualTime:
    """One clock for the engine's steps and the telemetry's timestamps; sleeping advances it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    def clock_ns(self) -> int:
        return round(self.now * 1e9)

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


class Harness:
    """An engine on virtual time, a telemetry whose summaries are kept, and a way to run requests."""

    def __init__(self, **config: Any) -> None:
        self.time = VirtualTime()
        self.rows: list[dict[str, object]] = []
        self.tel = Telemetry(version="t", sink=self.rows.append, clock_ns=self.time.clock_ns)
        self.engine = SimulatedEngine(EngineConfig(PROFILE, **config), sleep=self.time.sleep, clock=self.time.clock)
        self.seqs: list[Sequence] = []

    def start(self, rid: str, prompt: int, max_tokens: int, *, ignore_eos: bool = True,
              capacity: int | None = None) -> tuple[RequestTracker, PlainQueue[Any] | SendQueue[Any]]:
        t = self.tel.start(rid, model="m", prompt_tokens=prompt)
        t.admit()
        queue: PlainQueue[Any] | SendQueue[Any] = (
            PlainQueue(t) if capacity is None else SendQueue(t, StreamPolicy(capacity=capacity, idle_s=None,
                                                                                 max_duration_s=None)))
        t.add_resource(queue.close, "stream")
        self.seqs.append(self.engine.submit(t, prompt, max_tokens, ignore_eos=ignore_eos, stream=queue,
                                            pause_at=capacity))
        return t, queue

    async def consume(self, t: RequestTracker, queue: PlainQueue[Any] | SendQueue[Any]) -> list[tuple[str, Any]]:
        """Read the stream to its end; finish the request as the server does once everything was sent."""
        tokens: list[tuple[str, Any]] = []
        while (item := await queue.get()) is not None and not t.done:
            tokens.append(item)
        if not t.done and tokens and tokens[-1][1] is not None:
            if isinstance(queue, PlainQueue):
                t.send(len(tokens))
            t.finish(tokens[-1][1])
        return tokens

    async def run(self, *requests: tuple[str, int, int]) -> dict[str, dict[str, object]]:
        """Run requests ``(id, prompt tokens, max_tokens)`` to their end; their summaries by id."""
        started = [self.start(rid, prompt, n) for rid, prompt, n in requests]
        await asyncio.gather(*(self.consume(t, q) for t, q in started))
        return {str(r["request_id"]): r for r in self.rows}


async def _with_engine(h: Harness, body: Any) -> Any:
    task = asyncio.create_task(h.engine.run())
    try:
        return await asyncio.wait_for(body, timeout=30)
    finally:
        h.engine.close()
        await task


def test_ignore_eos_generates_exactly_max_tokens_and_ends_length() -> None:
    h = Harness()
    rows = asyncio.run(_with_engine(h, h.run(("a", 12, 37))))
    assert rows["a"]["finish_reason"] == "length"
    assert rows["a"]["generated_tokens"] == rows["a"]["sent_tokens"] == 37


def test_natural_lengths_are_seeded_per_request_and_end_stop_when_shorter() -> None:
    def lengths(seed: int) -> dict[str, tuple[object, object]]:
        h = Harness(seed=seed, mean_output_tokens=20.0)

        async def body() -> dict[str, tuple[object, object]]:
            started = [h.start(f"r{i}", 4, 60, ignore_eos=False) for i in range(40)]
            await asyncio.gather(*(h.consume(t, q) for t, q in started))
            return {str(r["request_id"]): (r["generated_tokens"], r["finish_reason"]) for r in h.rows}

        out: dict[str, tuple[object, object]] = asyncio.run(_with_engine(h, body()))
        return out

    first, again, other = lengths(7), lengths(7), lengths(8)
    assert first == again  # seed + request id decide the length
    assert first != other
    reasons = {reason for _, reason in first.values()}
    assert reasons == {"stop", "length"}  # shorter than max_tokens: stop; capped: length
    for generated, reason in first.values():
        assert isinstance(generated, int) and 1 <= generated <= 60
        assert (reason == "length") == (generated == 60)


def test_prefill_gives_the_first_token_and_grows_with_the_prompt() -> None:
    h = Harness()
    short = asyncio.run(_with_engine(h, h.run(("short", 10, 2))))["short"]
    h = Harness()
    long = asyncio.run(_with_engine(h, h.run(("long", 1500, 2))))["long"]
    assert short["ttft_s"] == pytest.approx(PROFILE.prefill_s(10), abs=1e-9)
    assert long["ttft_s"] == pytest.approx(PROFILE.prefill_s(1500), abs=1e-9)
    assert float(long["ttft_s"]) > float(short["ttft_s"])  # type: ignore[arg-type]


def test_decode_step_time_grows_with_the_batch() -> None:
    h = Harness()
    alone = asyncio.run(_with_engine(h, h.run(("alone", 8, 20))))["alone"]
    h = Harness()
    batch = asyncio.run(_with_engine(h, h.run(*((f"b{i}", 8, 20) for i in range(8)))))
    tpot_alone = (float(alone["last_token_s"]) - float(alone["ttft_s"])) / 19  # type: ignore[arg-type]
    assert tpot_alone == pytest.approx(PROFILE.decode_s(1), rel=1e-6)
    for row in batch.values():  # all joined in one step: every later step decodes 8 sequences
        tpot = (float(row["last_token_s"]) - float(row["ttft_s"])) / 19  # type: ignore[arg-type]
        assert tpot == pytest.approx(PROFILE.decode_s(8), rel=1e-6)
        assert tpot > tpot_alone


def test_a_request_waits_in_the_engine_queue_when_kv_blocks_run_out() -> None:
    h = Harness(kv_blocks=3, block_size=16)  # 48 tokens: one 31-token request at a time

    async def body() -> dict[str, dict[str, object]]:
        a = h.start("a", 30, 8)
        b = h.start("b", 30, 8)
        consumers = [asyncio.create_task(h.consume(*a)), asyncio.create_task(h.consume(*b))]
        for _ in range(100):
            await asyncio.sleep(0)
            if h.engine.running:
                break
        assert h.engine.running == 1 and h.engine.waiting == 1  # b waits for blocks
        assert b[0].timeline_ns()["scheduled"] is None
        await asyncio.gather(*consumers)
        return {str(r["request_id"]): r for r in h.rows}

    rows = asyncio.run(_with_engine(h, body()))
    assert float(rows["b"]["queue_s"]) >= float(rows["a"]["e2e_s"])  # type: ignore[arg-type]
    assert rows["a"]["generated_tokens"] == rows["b"]["generated_tokens"] == 8
    assert h.engine.kv_blocks_free == 3


def test_kv_growth_preempts_the_newest_sequence_and_recomputes_it() -> None:
    h = Harness(kv_blocks=6, block_size=4)  # 24 tokens; two requests that grow to 14 tokens each
    rows = asyncio.run(_with_engine(h, h.run(("old", 4, 10), ("new", 4, 10))))
    assert h.engine.preemptions > 0
    assert {r["generated_tokens"] for r in rows.values()} == {10}
    assert {r["finish_reason"] for r in rows.values()} == {"length"}
    assert h.engine.kv_blocks_free == 6


def test_kv_blocks_are_released_exactly_once_whatever_ends_the_request() -> None:
    h = Harness(kv_blocks=40, block_size=8, max_num_seqs=6)
    rng = random.Random(3)
    endings = ["finish", "client_cancel", "deadline", "server_draining", "error"]

    async def end_later(t: RequestTracker, how: str, delay_steps: int) -> None:
        for _ in range(delay_steps):
            await asyncio.sleep(0)
        t.finish(how)
        t.finish("client_cancel")  # a second, racing signal: ignored
        t.finish("deadline")

    async def body() -> None:
        jobs = []
        for i in range(60):
            t, q = h.start(f"r{i}", rng.randrange(1, 60), rng.randrange(1, 40))
            jobs.append(h.consume(t, q))
            how = rng.choice(endings)
            if how != "finish":
                jobs.append(end_later(t, how, rng.randrange(0, 50)))
        await asyncio.gather(*jobs)

    asyncio.run(_with_engine(h, body()))
    assert len(h.rows) == 60 and len({r["request_id"] for r in h.rows}) == 60  # one terminal state each
    assert [s.releases for s in h.seqs] == [1] * 60
    assert h.engine.kv_blocks_free == 40


def test_a_paused_stream_gets_no_tokens_until_its_client_reads() -> None:
    h = Harness()

    async def body() -> tuple[int, int]:
        slow = h.start("slow", 4, 30, capacity=2)
        fast = h.start("fast", 4, 30)
        await h.consume(*fast)  # 30 steps pass while nobody reads the slow stream
        generated_while_unread = h.seqs[0].generated
        tokens = await h.consume(*slow)
        return generated_while_unread, len(tokens)

    unread, read = asyncio.run(_with_engine(h, body()))
    assert unread == 2  # the stream's capacity: the engine gave it no more tokens
    assert read == 30
    row = next(r for r in h.rows if r["request_id"] == "slow")
    assert float(row["stream_paused_s"]) > 0  # type: ignore[arg-type]
    assert row["generated_tokens"] == row["sent_tokens"] == 30


def test_failure_injection_fails_requests_with_engine_error_and_frees_their_blocks() -> None:
    h = Harness(error_rate=1.0)
    rows = asyncio.run(_with_engine(h, h.run(*((f"e{i}", 5, 20) for i in range(5)))))
    assert {r["finish_reason"] for r in rows.values()} == {"error"}
    assert {r["error_type"] for r in rows.values()} == {ENGINE_ERROR}
    assert h.engine.kv_blocks_free == h.engine.kv.total


def test_tokens_are_words_of_the_simulated_vocabulary() -> None:
    h = Harness()

    async def body() -> list[tuple[str, Any]]:
        t, q = h.start("w", 3, 12)
        return await h.consume(t, q)

    tokens = asyncio.run(_with_engine(h, body()))
    assert all(text.endswith(" ") and text[:-1] in WORDS for text, _ in tokens)
    assert [reason for _, reason in tokens] == [None] * 11 + ["length"]


def test_a_request_larger_than_the_kv_cache_is_refused_by_check() -> None:
    h = Harness(kv_blocks=4, block_size=16)
    assert h.engine.check(30, 34) is None
    problem = h.engine.check(30, 35)
    assert problem is not None and "exceed the KV cache (64 tokens)" in problem


def test_the_kv_cache_refuses_a_second_release() -> None:
    kv = KvCache(4)
    assert kv.take(3)
    kv.give(3)
    with pytest.raises(LlmsloError, match="released twice"):
        kv.give(1)


@pytest.mark.parametrize(("field", "value"), [("max_num_seqs", 0), ("kv_blocks", -1), ("block_size", 1.5),
                                              ("speed", 0), ("mean_output_tokens", float("nan")),
                                              ("error_rate", 1.5), ("seed", "x")])
def test_engine_config_names_the_bad_field(field: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=f"EngineConfig.{field}"):
        EngineConfig(PROFILE, **{field: value})  # type: ignore[arg-type]
