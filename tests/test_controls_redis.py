"""Shared rate-limit buckets through Redis: the atomic script against a real ``redis-server`` started here
(127.0.0.1, a free port, no persistence, stopped by pid), two limiters sharing one bucket like two replicas,
and Redis going away (killed, or frozen) under each fail mode: admitted or refused, counted, never hung.

Tests that need the server skip, saying why, when ``redis-server`` or the ``redis`` package is missing
(``.ci/setup`` installs both)."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from llmslo.controls import (
    Decision,
    LocalBuckets,
    RateLimit,
    RateLimiter,
    RedisBuckets,
    RedisScripting,
    redis_client,
)
from llmslo.telemetry import ConfigurationError, Telemetry, render_metrics

REDIS_SERVER = shutil.which("redis-server")
try:
    import redis
except ImportError:  # pragma: no cover - .ci/setup installs it
    redis = None  # type: ignore[assignment]

needs_server = pytest.mark.skipif(
    REDIS_SERVER is None or redis is None,
    reason="needs redis-server (Debian package redis-server) and the redis package (pip install 'redis>=5'); "
           ".ci/setup installs both")
needs_redis_package = pytest.mark.skipif(redis is None, reason="needs the redis package (pip install 'redis>=5')")


class FakeClock:
    """Seconds moved by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _store_errors(tel: Telemetry) -> dict[str, float]:
    text = render_metrics(tel.registry, "")[0].decode()
    return {s.labels["fail_mode"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "llmslo_rate_limit_store_errors_total"}


@dataclass
class Server:
    """A redis-server this test started: its port and process."""

    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, timeout_s: float = 0.1) -> RedisScripting:
        return redis_client(self.url, timeout_s=timeout_s)

    def kill(self) -> None:
        """Stop the server at once (SIGKILL to its pid) and reap it."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start(port: int) -> Server:
    assert REDIS_SERVER is not None
    process = subprocess.Popen(
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = Server(port, process)
    probe = redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.2, socket_connect_timeout=0.2)
    for _ in range(100):
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode} on port {port}")
        with contextlib.suppress(redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            if probe.ping():
                probe.close()
                return server
        time.sleep(0.05)
    server.kill()
    raise RuntimeError(f"redis-server did not answer PING on port {port} within 5 s")


@pytest.fixture
def server() -> Iterator[Server]:
    """A fresh redis-server on a free port of 127.0.0.1, stopped by pid after the test."""
    srv = _start(_free_port())
    try:
        yield srv
    finally:
        if srv.process.poll() is None:
            os.kill(srv.process.pid, signal.SIGCONT)  # in case a test froze it
            os.kill(srv.process.pid, signal.SIGTERM)
            try:
                srv.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                srv.kill()


def _within(seconds: float, fn: Callable[[], Decision]) -> tuple[Decision, float]:
    """``fn()``'s decision and how long it took; fails (instead of hanging the suite) beyond ``seconds``."""
    out: list[tuple[Decision, float]] = []

    def run() -> None:
        start = time.monotonic()
        decision = fn()
        out.append((decision, time.monotonic() - start))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the decision hung for more than {seconds} s"
    return out[0]


# ---- no server: the import boundary, configuration and the fail modes with a failing client -------------

def test_importing_the_controls_does_not_import_redis() -> None:
    code = "import sys, llmslo.controls; assert 'redis' not in sys.modules, 'redis imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


class FailingClient:
    """A client whose calls fail like a Redis that went away, counting them."""

    def __init__(self, error: Exception | None = None, reply: object = None) -> None:
        self.calls = 0
        self.error = error
        self.reply = reply

    def _call(self) -> object:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.reply

    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any:
        return self._call()

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return self._call()

    def script_load(self, script: str) -> Any:
        return self._call()


@pytest.mark.parametrize(("fail_mode", "admitted"), [("open", True), ("closed", False)])
def test_a_failing_store_decides_by_the_fail_mode_counts_it_and_rests_for_retry_after_s(
        fail_mode: str, admitted: bool) -> None:
    clock = FakeClock(100.0)
    client = FailingClient(ConnectionError("Connection refused"))
    tel = Telemetry()
    limiter = RateLimiter(requests=RateLimit(1.0, 5.0), telemetry=tel, clock=clock,
                          store=RedisBuckets(client, fail_mode=fail_mode, retry_after_s=2.0, clock=clock))
    first = limiter.check("k", model="m")
    assert first.admitted is admitted and client.calls == 1
    clock.now = 101.5
    second = limiter.check("k", model="m")  # inside the interval: Redis is not asked
    assert second.admitted is admitted and client.calls == 1
    if not admitted:
        assert (first.reason, first.retry_after_s, second.retry_after_s) == ("rate_limited", 2.0, 0.5)
        assert first.detail == "the rate-limit store is unavailable (failing closed)"
    clock.now = 102.0
    limiter.check("k", model="m")
    assert client.calls == 2
    assert _store_errors(tel) == {fail_mode: 3.0}


def test_a_reply_the_script_never_gives_is_a_store_error() -> None:
    tel = Telemetry()
    limiter = RateLimiter(requests=RateLimit(1.0, 5.0), telemetry=tel, clock=FakeClock(),
                          store=RedisBuckets(FailingClient(reply=[b"x"]), fail_mode="closed", clock=FakeClock()))
    assert not limiter.check("k").admitted
    assert _store_errors(tel)["closed"] == 1.0


def test_a_failed_reconcile_returns_zero_and_never_raises() -> None:
    limiter = RateLimiter(tokens=RateLimit(1.0, 100.0), clock=FakeClock(),
                          store=RedisBuckets(FailingClient(TimeoutError("timed out")), fail_mode="open"))
    assert limiter.reconcile("k", reserved=100, actual=10) == 0.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"fail_mode": "local"}, "RedisBuckets.fail_mode: must be one of closed, open, got 'local'"),
    ({"fail_mode": "open", "retry_after_s": 0}, "RedisBuckets.retry_after_s: must be a finite number > 0"),
    ({"fail_mode": "open", "prefix": ""}, "RedisBuckets.prefix: must be text of 1 to 64 characters"),
    ({"fail_mode": "open", "max_call_s": math.inf}, "RedisBuckets.max_call_s: must be a finite number > 0"),
])
def test_a_bad_store_configuration_raises_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        RedisBuckets(FailingClient(), **kwargs)
    assert str(caught.value).startswith(message)


def test_a_client_without_the_script_methods_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"^RedisBuckets\.client: needs a callable eval\(\)"):
        RedisBuckets(object(), fail_mode="open")  # type: ignore[arg-type]


@needs_redis_package
def test_a_redis_client_that_may_wait_unbounded_is_refused_and_redis_client_is_bounded() -> None:
    with pytest.raises(ConfigurationError, match=r"^RedisBuckets\.client: one call may wait inf s"):
        RedisBuckets(redis.Redis(host="127.0.0.1", port=1, socket_timeout=None, socket_connect_timeout=None),
                     fail_mode="open")
    with pytest.raises(ConfigurationError, match=r"^RedisBuckets\.client: one call may wait [0-9.]+ s"):
        RedisBuckets(redis.Redis(host="127.0.0.1", port=1), fail_mode="open")  # redis-py's defaults
    retrying = redis.Redis(host="127.0.0.1", port=1, socket_timeout=0.05, socket_connect_timeout=0.05,
                           retry=redis.retry.Retry(redis.backoff.NoBackoff(), 10))
    with pytest.raises(ConfigurationError, match=r"one call may wait 1\.1 s .* above max_call_s=0\.5"):
        RedisBuckets(retrying, fail_mode="open")
    RedisBuckets(redis_client("redis://127.0.0.1:1/0", timeout_s=0.1), fail_mode="open")  # 2 × 0.1 s


@pytest.mark.parametrize("timeout_s", [0, -1, math.nan, 11, True])
def test_redis_client_refuses_a_bad_timeout(timeout_s: float) -> None:
    with pytest.raises(ConfigurationError, match=r"^redis_client\.timeout_s: must be a number of seconds"):
        redis_client(timeout_s=timeout_s)


# ---- a real redis-server ------------------------------------------------------------------------------

def _pair(server: Server, clock: Callable[[], float] | None, **limits: RateLimit) -> tuple[RateLimiter, ...]:
    """Two limiters sharing one Redis, each with its own client, like two replicas."""
    return tuple(RateLimiter(**limits, store=RedisBuckets(server.client(), fail_mode="closed", server_clock=clock))
                 for _ in range(2))


_ops = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.floats(0, 3), st.integers(0, 60),
                          st.integers(0, 60), st.integers(-1, 40)), max_size=25)


@needs_server
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops)
def test_the_redis_script_decides_exactly_as_the_in_process_buckets(server: Server, ops: list[Any]) -> None:
    clock = FakeClock(1_700_000_000.0 + len(ops))  # a wall-clock-sized time, as a shared clock gives
    client = server.client()
    client.flushdb()  # type: ignore[attr-defined]
    limits = {"requests": RateLimit(0.7, 4.0), "tokens": RateLimit(9.5, 100.0)}
    local = RateLimiter(**limits, store=LocalBuckets(clock), clock=clock)
    shared = RateLimiter(**limits, store=RedisBuckets(client, fail_mode="closed", server_clock=clock), clock=clock)
    for key, dt, prompt, max_tokens, used in ops:
        clock.now += dt
        want, got = (lim.check(key, prompt_tokens=prompt, max_tokens=max_tokens) for lim in (local, shared))
        assert (got.admitted, got.detail) == (want.admitted, want.detail)
        assert got.retry_after_s == want.retry_after_s  # the same double arithmetic in Lua and Python
        if want.admitted and used >= 0:
            assert shared.reconcile(key, prompt + max_tokens, used) == local.reconcile(key, prompt + max_tokens, used)


@needs_server
def test_two_replicas_share_one_bucket(server: Server) -> None:
    clock = FakeClock(1000.0)
    one, two = _pair(server, clock, tokens=RateLimit(1.0, 100.0))
    assert one.check("tenant", prompt_tokens=60).admitted
    refusal = two.check("tenant", prompt_tokens=60)  # the other replica sees the 40 left
    assert not refusal.admitted and refusal.retry_after_s == pytest.approx(20.0)
    assert two.reconcile("tenant", reserved=60, actual=20) == pytest.approx(40.0)
    assert two.check("tenant", prompt_tokens=60).admitted and not one.check("tenant", prompt_tokens=60).admitted


@needs_server
def test_replicas_racing_on_one_bucket_admit_exactly_its_capacity(server: Server) -> None:
    replicas = _pair(server, None, requests=RateLimit(1e-6, 60.0), tokens=RateLimit(1e-6, 6000.0))
    admitted: list[int] = []
    barrier = threading.Barrier(6)

    def worker(n: int) -> None:
        limiter = replicas[n % 2]
        barrier.wait()
        for _ in range(40):
            if limiter.check("shared", prompt_tokens=50, max_tokens=50).admitted:
                admitted.append(n)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(admitted) == 60 and {n % 2 for n in admitted} == {0, 1}


@needs_server
def test_with_redis_time_the_wait_is_the_time_until_the_bucket_refills(server: Server) -> None:
    limiter = RateLimiter(requests=RateLimit(0.01, 2.0), store=RedisBuckets(server.client(), fail_mode="closed"))
    assert limiter.check("k").admitted and limiter.check("k").admitted
    refusal = limiter.check("k")
    assert not refusal.admitted and refusal.retry_after_s is not None
    assert 0 < refusal.retry_after_s <= 100.0  # needs 1 request at 0.01 per second, minus what refilled


@needs_server
def test_redis_keys_are_hashed_short_and_expire_once_full(server: Server) -> None:
    client = server.client()
    limiter = RateLimiter(requests=RateLimit(1.0, 10.0), tokens=RateLimit(100.0, 1000.0),
                          store=RedisBuckets(client, fail_mode="closed", prefix="t:"))
    api_key = "sk-secret-" + "x" * 100
    assert limiter.check(api_key, prompt_tokens=500).admitted
    names = sorted(k.decode() for k in client.keys("*"))  # type: ignore[attr-defined]
    assert len(names) == 2 and all(api_key not in n and n.startswith("t:{") and len(n) < 45 for n in names)
    ttls = [client.pttl(n) for n in names]  # type: ignore[attr-defined]
    assert 0 < ttls[0] <= 1000 + 1000 and 0 < ttls[1] <= 5000 + 1000  # refill time + 1 s, milliseconds


@needs_server
def test_a_flushed_script_cache_is_reloaded_by_the_next_decision(server: Server) -> None:
    client = server.client()
    store = RedisBuckets(client, fail_mode="closed")
    store.load_scripts()
    limiter = RateLimiter(requests=RateLimit(0.001, 1.0), store=store)
    assert limiter.check("k").admitted
    client.script_flush()  # type: ignore[attr-defined]
    assert not limiter.check("k").admitted  # refused by the bucket, not by a store error
    assert limiter.check("other").admitted


@needs_server
@pytest.mark.parametrize(("fail_mode", "admitted"), [("open", True), ("closed", False)])
def test_redis_killed_mid_run_admits_or_refuses_by_fail_mode_counted_without_hanging(
        server: Server, fail_mode: str, admitted: bool) -> None:
    tel = Telemetry()
    clock = FakeClock()
    limiter = RateLimiter(requests=RateLimit(0.001, 3.0), telemetry=tel, clock=clock,
                          store=RedisBuckets(server.client(timeout_s=0.1), fail_mode=fail_mode, clock=clock))
    assert [limiter.check("k").admitted for _ in range(4)] == [True, True, True, False]
    server.kill()
    for step in range(3):
        clock.now = 2.0 * step  # past the store's 1 s rest each time: every decision tries Redis again
        decision, _ = _within(5.0, lambda: limiter.check("k"))
        assert decision.admitted is admitted
        assert decision.admitted or decision.reason == "rate_limited"
    assert _store_errors(tel)[fail_mode] == 3.0


@needs_server
def test_a_frozen_redis_costs_one_bounded_timeout_then_recovers(server: Server) -> None:
    tel = Telemetry()
    clock = FakeClock()
    limiter = RateLimiter(requests=RateLimit(0.001, 5.0), telemetry=tel, clock=clock,
                          store=RedisBuckets(server.client(timeout_s=0.1), fail_mode="closed", clock=clock))
    assert limiter.check("k").admitted
    os.kill(server.process.pid, signal.SIGSTOP)  # accepts connections, answers nothing
    decision, took_s = _within(5.0, lambda: limiter.check("k"))
    assert not decision.admitted and decision.retry_after_s == 1.0
    assert took_s < 2.0  # one read timeout of 0.1 s (generous bound), never redis-py's default wait
    resting, _ = _within(5.0, lambda: limiter.check("k"))  # within the store's rest: fail mode at once
    assert not resting.admitted
    os.kill(server.process.pid, signal.SIGCONT)
    clock.now = 1.0
    assert limiter.check("k").admitted  # Redis again: the bucket still holds 3
    assert _store_errors(tel)["closed"] == 2.0
