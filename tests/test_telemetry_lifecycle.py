"""The request lifecycle: one terminal state, cleanup once, one valid summary, a guard around everything."""

from __future__ import annotations

import asyncio
import math
import random
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.analysis import GoodputPolicy
from llmslo.telemetry import (
    ConfigurationError,
    LabelPolicy,
    SloPolicy,
    Telemetry,
    _tokenlog,
    current_tracker,
    validate_summary,
)

SIGNALS = ("deadline", "client_cancel", "error", "server_draining")


@pytest.fixture(autouse=True, params=["native", "python"])
def token_log(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every lifecycle test runs with the native token log and again with the pure-Python one."""
    if request.param == "native" and _tokenlog.NativeTokenLog is None:
        pytest.skip("the native token log is not built (see test_telemetry_tokenlog.py)")
    if request.param == "python":
        monkeypatch.setattr(_tokenlog, "NativeTokenLog", None)
    return str(request.param)


class FakeClock:
    """Monotonic nanoseconds that advance by ``step_ns`` on every reading."""

    def __init__(self, step_ns: int = 1_000_000) -> None:
        self.now = 1_000_000_000
        self.step_ns = step_ns
        self.lock = threading.Lock()

    def __call__(self) -> int:
        with self.lock:
            self.now += self.step_ns
            return self.now


def make(**kwargs: object) -> tuple[Telemetry, list[dict[str, object]]]:
    rows: list[dict[str, object]] = []
    kwargs.setdefault("clock_ns", FakeClock())
    kwargs.setdefault("clock_unix_s", lambda: 1_700_000_000.0)
    tel = Telemetry(sink=rows.append, **kwargs)  # type: ignore[arg-type]
    return tel, rows


def test_a_streamed_request_emits_one_valid_summary_with_the_definitions_intervals() -> None:
    tel, rows = make(clock_ns=FakeClock(step_ns=10_000_000))
    t = tel.start("r1", model="m", prompt_tokens=7)  # arrival at +10 ms
    t.admit()
    t.schedule()  # +30 ms
    for _ in range(4):
        t.commit()
        t.send()
    t.commit(k=2, proposed=3)
    assert t.finish("stop")
    (row,) = rows
    assert validate_summary(row) == []
    assert row["generated_tokens"] == 6 and row["sent_tokens"] == 4 and row["proposed_tokens"] == 3
    assert row["queue_s"] == pytest.approx(0.02)
    assert row["ttft_s"] == pytest.approx(0.03)
    assert row["last_token_s"] == pytest.approx(0.07)
    assert row["e2e_s"] == pytest.approx(0.08)
    assert tel.metrics.value("in_flight", model="m") == 0
    assert tel.metrics.value("itl", model="m", version="unknown", tenant_class="default") == 5


def test_a_commit_of_k_tokens_adds_k_itl_samples_of_gap_over_k() -> None:
    tel, rows = make(clock_ns=FakeClock(step_ns=10_000_000), record_itl=True)
    t = tel.start("r1", model="m")
    t.commit()
    t.commit(k=4)
    t.finish("length")
    assert rows[0]["itl_s"] == pytest.approx([0.0025] * 4)


def test_invalid_token_counts_are_dropped_and_counted_at_the_terminal_state() -> None:
    tel, rows = make()
    t = tel.start("r1", model="m")
    t.commit()
    t.commit(k=0)
    t.commit(k=2, proposed=-1)
    t.send(-5)
    t.send(2)
    t.finish("stop")
    (row,) = rows
    assert row["generated_tokens"] == 3 and row["sent_tokens"] == 2 and row["proposed_tokens"] == 0
    assert validate_summary(row) == []
    assert tel.guard.dropped == {"invalid_count": 3}
    assert tel.metrics.value("observations_dropped", reason="invalid_count") == 3


def test_later_finish_signals_are_no_ops_counted_by_reason() -> None:
    tel, rows = make()
    t = tel.start("r1", model="m")
    assert t.finish("deadline")
    assert not t.finish("client_cancel")
    assert not t.finish("client_cancel")
    assert not t.reject("queue_full")
    assert t.finish_reason == "deadline"
    assert t.ignored == {"client_cancel": 2, "rejected": 1}
    assert len(rows) == 1
    assert tel.metrics.value("terminal_signals_ignored", model="m", finish_reason="client_cancel") == 2


def test_resources_are_released_once_in_reverse_order_even_when_one_raises() -> None:
    tel, _ = make()
    order: list[str] = []
    t = tel.start("r1", model="m")
    t.add_resource(lambda: order.append("kv"), "kv_blocks")
    t.add_resource(lambda: 1 / 0, "batch_slot")
    t.add_resource(lambda: order.append("buffer"), "stream_buffer")
    t.finish("error", error_type="OOM")
    t.finish("deadline")
    assert order == ["buffer", "kv"]
    assert t.released == 3
    assert tel.guard.errors == {"release:batch_slot": 1}
    assert tel.metrics.value("internal_errors") == 1


def test_a_resource_added_after_the_terminal_state_is_released_at_once() -> None:
    tel, _ = make()
    t = tel.start("r1", model="m")
    t.finish("stop")
    freed: list[int] = []
    t.add_resource(lambda: freed.append(1))
    assert freed == [1]


def test_a_rejected_request_carries_its_reason_and_counts_as_attempted_not_good() -> None:
    tel, rows = make()
    t = tel.start("r1", model="m")
    t.reject("rate_limited")
    assert rows[0]["finish_reason"] == "rejected" and rows[0]["reject_reason"] == "rate_limited"
    assert validate_summary(rows[0]) == []
    labels = {"model": "m", "version": "unknown", "tenant_class": "default"}
    assert tel.metrics.value("rejected_requests", **labels, reject_reason="rate_limited") == 1
    assert tel.metrics.value("goodput_attempted", **labels, slo_class="default") == 1
    assert tel.metrics.value("goodput_good", **labels, slo_class="default") == 0


def test_a_failing_sink_and_bad_client_timings_never_reach_the_server() -> None:
    def broken(row: dict[str, object]) -> None:
        raise OSError("disk full")

    tel = Telemetry(sink=broken)
    t = tel.start("r1", model="m")
    t.report_client_ttft(math.nan)
    t.report_client_ttft(-1.0)
    t.report_client_ttft(math.inf)
    assert t.finish("stop")
    assert tel.guard.errors == {"sink": 1}
    assert tel.guard.dropped == {"nan": 1, "negative": 1, "infinite": 1}
    assert tel.metrics.value("observations_dropped", reason="nan") == 1


def test_an_unknown_finish_reason_becomes_a_counted_error_not_an_exception() -> None:
    tel, rows = make()
    t = tel.start("r1", model="m")
    assert t.finish("done")
    assert rows[0]["finish_reason"] == "error" and rows[0]["error_type"] == "invalid_finish_reason"
    assert validate_summary(rows[0]) == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"policies": [SloPolicy(ttft_s=0.25)]}, "SloPolicy.ttft_s"),
        ({"buckets": {"ttft_s": [1.0, 0.5]}}, "buckets['ttft_s']"),
        ({"buckets": {"latency": [1.0]}}, "buckets['latency']"),
        ({"policies": []}, "Telemetry.policies"),
        ({"version": ""}, "Telemetry.version"),
    ],
)
def test_configuration_errors_raise_at_construction_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field.replace("[", r"\[").replace("]", r"\]")):
        Telemetry(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["request_id", "prompt", "user_id", "session_id", "text"])
def test_free_text_can_never_be_a_label(name: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        LabelPolicy(values={name: ["a"]})
    with pytest.raises(ConfigurationError, match=name):
        LabelPolicy(max_values={name: 3})


@pytest.mark.parametrize(("field", "value"), [("ttft_s", -1.0), ("tpot_s", math.nan), ("e2e_s", 0)])
def test_a_bad_slo_threshold_raises_naming_it(field: str, value: float) -> None:
    with pytest.raises(ConfigurationError, match=f"SloPolicy.{field}"):
        SloPolicy(**{field: value})  # type: ignore[arg-type]


_CON: list[object] = []


def _duckdb() -> Any:
    if not _CON:
        import duckdb

        _CON.append(duckdb.connect())
    return _CON[0]


rows_strategy = st.fixed_dictionaries({
    "finish_reason": st.sampled_from(["stop", "length", "client_cancel", "deadline", "error"]),
    "ttft_s": st.one_of(st.none(), st.sampled_from([0.1, 0.5, 1.0, 2.0]), st.floats(0, 5)),
    "decode_s": st.floats(0, 30),
    "generated_tokens": st.integers(0, 300),
    "e2e_extra_s": st.floats(0, 10),
})


@settings(max_examples=300, deadline=None)
@given(rows_strategy, st.booleans(), st.sampled_from([None, 0.1, 0.2]), st.sampled_from([None, 5.0]))
def test_the_server_verdict_agrees_with_the_analysis_goodput_policy(
    r: dict[str, object], one_passes: bool, tpot: float | None, e2e: float | None
) -> None:
    n = int(r["generated_tokens"])  # type: ignore[call-overload]
    ttft = r["ttft_s"] if n else None
    last = None if ttft is None else float(ttft) + float(r["decode_s"])  # type: ignore[arg-type]
    row = {"finish_reason": r["finish_reason"], "ttft_s": ttft, "last_token_s": last, "generated_tokens": n,
           "e2e_s": (last or 0.0) + float(r["e2e_extra_s"])}  # type: ignore[arg-type]
    ours = SloPolicy(ttft_s=2.0, tpot_s=tpot, e2e_s=e2e, one_token_passes_tpot=one_passes)
    theirs = GoodputPolicy(ttft_s=2.0, tpot_s=tpot, e2e_s=e2e, one_token_passes_tpot=one_passes)
    con = _duckdb()
    sql = (f"SELECT {theirs.good_sql()} FROM (SELECT ?::VARCHAR AS finish_reason, ?::DOUBLE AS ttft_s, "
           "?::DOUBLE AS last_token_s, ?::BIGINT AS generated_tokens, ?::DOUBLE AS e2e_s)")
    (expected,) = con.sql(sql, params=[row["finish_reason"], row["ttft_s"], row["last_token_s"],
                                       row["generated_tokens"], row["e2e_s"]]).fetchall()[0]
    assert ours.is_good(row) == bool(expected)


def test_the_context_manager_finishes_stop_error_or_cancel_and_exposes_the_tracker() -> None:
    tel, rows = make()

    async def main() -> None:
        async with tel.request("ok", model="m") as t:
            assert current_tracker() is t
            t.commit()
        with pytest.raises(RuntimeError):
            async with tel.request("bad", model="m"):
                raise RuntimeError("backend")

        async def slow() -> None:
            async with tel.request("cancelled", model="m"):
                await asyncio.sleep(10)

        task = asyncio.create_task(slow())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert [(r["request_id"], r["finish_reason"], r["error_type"]) for r in rows] == [
        ("ok", "stop", None), ("bad", "error", "RuntimeError"), ("cancelled", "client_cancel", None)]
    assert current_tracker() is None


def test_a_scope_left_normally_after_its_request_finished_signals_nothing_more() -> None:
    """The handler commits the terminal state itself (``length``); leaving the block is then no signal: the
    request keeps that state and no ignored signal is counted. An exception after the end still is one."""
    tel, rows = make()
    with tel.request("done", model="m") as t:
        t.commit()
        t.finish("length")
    assert t.ignored == {} and tel.metrics.value("terminal_signals_ignored", model="m", finish_reason="stop") == 0
    with pytest.raises(RuntimeError), tel.request("late-error", model="m") as late:
        late.finish("client_cancel")
        raise RuntimeError("after the end")
    assert late.ignored == {"error": 1}
    assert [(r["request_id"], r["finish_reason"]) for r in rows] == [("done", "length"),
                                                                     ("late-error", "client_cancel")]


def test_the_decorator_tracks_each_call_of_sync_and_async_handlers() -> None:
    tel, rows = make()

    @tel.instrument(model="m", request_id=lambda rid: rid)
    async def handler(rid: str) -> int:
        t = current_tracker()
        assert t is not None
        t.commit()
        return 1

    @tel.instrument(model="m")
    def sync_handler() -> int:
        return 2

    assert asyncio.run(handler("abc")) == 1
    assert sync_handler() == 2
    assert rows[0]["request_id"] == "abc" and rows[0]["generated_tokens"] == 1
    assert len(rows) == 2


def _check_one_terminal(tel: Telemetry, rows: list[dict[str, object]], released: list[int], n: int) -> None:
    assert len(rows) == n
    assert all(count == 1 for count in released)
    assert all(validate_summary(r) == [] for r in rows)
    assert not tel.in_flight()
    assert tel.metrics.value("in_flight", model="m") == 0


def test_racing_threads_always_leave_one_terminal_state_one_cleanup_and_one_summary() -> None:
    rng = random.Random(7)
    tel, rows = make(clock_ns=FakeClock(step_ns=1000))
    released: list[int] = []
    rounds = 400
    for i in range(rounds):
        t = tel.start(f"r{i}", model="m")
        t.admit()
        slot = len(released)
        released.append(0)

        def release(slot: int = slot) -> None:
            released[slot] += 1

        t.add_resource(release, "kv")
        signals = [rng.choice(SIGNALS) for _ in range(rng.randint(2, 5))]
        barrier = threading.Barrier(len(signals) + 1)
        wins: list[bool] = []

        def fire(reason: str, t: object = t, barrier: threading.Barrier = barrier, wins: list[bool] = wins) -> None:
            barrier.wait()
            for _ in range(rng.randint(0, 3)):
                t.commit()  # type: ignore[attr-defined]
            if reason == "server_draining":
                wins.append(tel.finish_all() > 0)
            else:
                wins.append(t.finish(reason))  # type: ignore[attr-defined]

        threads = [threading.Thread(target=fire, args=(s,)) for s in signals]
        for th in threads:
            th.start()
        barrier.wait()
        for th in threads:
            th.join(timeout=10)
        assert sum(wins) == 1
        assert sum(t.ignored.values()) <= len(signals) - 1
    _check_one_terminal(tel, rows, released, rounds)


def test_racing_asyncio_tasks_always_leave_one_terminal_state_one_cleanup_and_one_summary() -> None:
    rng = random.Random(11)
    tel, rows = make(clock_ns=FakeClock(step_ns=1000))
    released: list[int] = []
    rounds = 3000

    async def fire(t: object, reason: str, delay: int) -> bool:
        for _ in range(delay):
            await asyncio.sleep(0)
        t.commit()  # type: ignore[attr-defined]
        if reason == "server_draining":
            tel.finish_all()  # may finish other requests too: its wins are not this request's
            return False
        return bool(t.finish(reason))  # type: ignore[attr-defined]

    async def one(i: int) -> None:
        t = tel.start(f"r{i}", model="m")
        t.admit()
        slot = len(released)
        released.append(0)
        t.add_resource(lambda: released.__setitem__(slot, released[slot] + 1), "kv")
        signals = [rng.choice(SIGNALS) for _ in range(rng.randint(2, 5))]
        wins = await asyncio.gather(*(fire(t, s, rng.randint(0, 3)) for s in signals))
        assert t.done and sum(wins) <= 1  # a drain fired by another request may have won

    async def main() -> None:
        for start in range(0, rounds, 100):
            await asyncio.gather(*(one(i) for i in range(start, start + 100)))

    asyncio.run(main())
    _check_one_terminal(tel, rows, released, rounds)
