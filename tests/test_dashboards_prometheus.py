"""Every PromQL expression of the dashboards, run by a real Prometheus scraping a real ``Telemetry``.

Prometheus (Debian's package) scrapes, every second, the ``/metrics`` of a :class:`~llmslo.telemetry.Telemetry`
served by :class:`~llmslo.telemetry.MetricsServer`, with the rules ``llmslo rules generate`` makes from
``examples/chat-slo.yaml`` loaded. Requests flow the whole time: finished (fast and slow, so every SLO of the
spec burns and its alerts fire), cancelled, rejected, shed, degraded; a circuit breaker trips, the server
drains, a stream pauses, a GPU reports through the NVML sampler. Then every panel query, with Grafana's template
variables substituted, must return data (not nothing, not only NaN), every exemplar-enabled query must bring
back ``request_id`` exemplars, and every variable look-up must list values. A misspelt series, label or window
returns nothing and fails. Skipped without the ``prometheus`` binary, failed under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from llmslo.controls import AdmissionQueue, CircuitBreaker
from llmslo.dashboards import panel_queries, variable_queries
from llmslo.gateway import BackendSpec, GatewayConfig, Pool, PoolCollector
from llmslo.ops._prometheus import Prometheus, PrometheusError, running_prometheus
from llmslo.rules import render
from llmslo.telemetry import GpuSampler, MetricsServer, SendQueue, SloPolicy, StreamPolicy, Telemetry
from llmslo.tests._dashboards import LABEL_VALUES, example_model, generated
from llmslo.tests._tools import require_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = "chat"
"""The scrape job: the example spec's ``scrape.job``, so its operational alerts select these targets."""
SLOS = ("goodput", "ttft", "tpot")
SUBSTITUTIONS = {"$__rate_interval": "1m", "$job": JOB, "$model": "chat", "$service": "chat"}
"""What Grafana would put in place of each template variable here (``$slo``: each of :data:`SLOS`)."""
WAIT_S = 30.0
"""The longest wait for Prometheus to start, scrape and evaluate until every query answers."""
TRAFFIC_MAX_S = 90.0
"""The traffic thread stops by itself after this long, whatever the test does."""


class FakeClock:
    """A monotonic clock in nanoseconds that moves only when told (the request intervals are exact)."""

    def __init__(self) -> None:
        self.now_ns = 1_000_000_000

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += round(seconds * 1e9)


class OneGpu:
    """An NVML stand-in with one GPU and fixed readings (the calls :class:`GpuSampler` makes)."""

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=60 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 412_000  # milliwatts

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 71

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return 1980 if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 0


def _request(tel: Telemetry, clock: FakeClock, rid: str, *, ttft_s: float, gap_s: float, tokens: int,
             reason: str = "stop", unsent: int = 0) -> None:
    """One admitted request: first token after ``ttft_s``, then a token every ``gap_s``; the last ``unsent``
    tokens never reach the client."""
    t = tel.start(rid, model="chat", tenant_class="interactive", slo_class="interactive", prompt_tokens=12)
    t.admit()
    clock.advance(0.005)
    t.schedule()
    clock.advance(ttft_s - 0.005)
    t.commit(k=2, proposed=3)  # a speculative step: two tokens accepted of three proposed
    t.send(2)
    for i in range(tokens - 2):
        clock.advance(gap_s)
        t.commit()
        if i < tokens - 2 - unsent:
            t.send()
    t.finish(reason)


def _traffic_round(tel: Telemetry, clock: FakeClock, n: int) -> None:
    """Fast good requests, slow ones (TTFT 3 s, TPOT 200 ms: bad for every SLO of the spec), a client cancel
    with unsent tokens, a rejection, a shed and a degraded request."""
    _request(tel, clock, f"req-{n}-fast", ttft_s=0.3, gap_s=0.02, tokens=8)
    _request(tel, clock, f"req-{n}-slow", ttft_s=3.0, gap_s=0.2, tokens=6, reason="length")
    _request(tel, clock, f"req-{n}-cancel", ttft_s=0.5, gap_s=0.03, tokens=5, reason="client_cancel", unsent=2)
    tel.start(f"req-{n}-rejected", model="chat", tenant_class="batch", slo_class="interactive").reject("queue_full")
    tel.count_shed("chat", "queue", "batch")
    tel.count_degraded("chat", "cap_max_tokens")


async def _pause_one_stream(tel: Telemetry) -> None:
    """A stream whose client reads slower than the engine writes: the producer waits once for credit."""
    t = tel.start("req-paused", model="chat", tenant_class="interactive", slo_class="interactive")
    t.admit()
    t.schedule()
    queue: SendQueue[str] = SendQueue(t, StreamPolicy(capacity=1))
    t.commit()
    queue.put("token")  # the queue is full: no credit until the client reads
    waiting = asyncio.create_task(queue.wait_credit())
    await asyncio.sleep(0)
    assert await queue.get() == "token"
    await waiting
    t.finish("stop")


def _serving_state(tel: Telemetry) -> None:
    """The controls' and the sampler's series: queue capacity, a tripped breaker, a drain under way, a
    paused stream, one GPU, a gateway's backend (with a token limit)."""
    AdmissionQueue("chat", capacity=16, concurrency=4, telemetry=tel)
    breaker = CircuitBreaker("engine", consecutive_failures=2, telemetry=tel)
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == "open"
    tel.begin_drain()
    tel.count_drain_closed("idle", 2)
    asyncio.run(_pause_one_stream(tel))
    sampler = GpuSampler(nvml=OneGpu(), registry=tel.registry)
    assert sampler.open()
    sampler.sample_once()
    pool = Pool(GatewayConfig(backends=(BackendSpec("llama-a", "http://127.0.0.1:9"),)), tel)
    tel.registry.register(PoolCollector(pool))  # a gateway's backend, taken out of the pool once
    pool.set_in_pool(pool.backends["llama-a"], False, "drained")
    limit = pool.backends["llama-a"].limit      # one window within tolerance that carried tokens: a token limit
    assert limit.try_acquire(300)
    limit.release(300)
    for _ in range(limit.window):
        limit.observe(ttft_s=0.05, prompt_tokens=100, gaps_s=[0.02] * 8)
    assert limit.token_limit == 600


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    require_tool("prometheus", "Debian package `prometheus`")
    clock = FakeClock()
    tel = Telemetry(version="v1", clock_ns=clock, policies=[SloPolicy(name="interactive", ttft_s=2.0, tpot_s=0.1)])
    _serving_state(tel)
    _traffic_round(tel, clock, 0)
    server = MetricsServer(tel.registry)
    stop = threading.Event()

    def traffic() -> None:
        started, n = time.monotonic(), 1
        while not stop.is_set() and time.monotonic() - started < TRAFFIC_MAX_S:
            _traffic_round(tel, clock, n)
            n += 1
            stop.wait(0.1)

    thread = threading.Thread(target=traffic, name="dashboards-traffic", daemon=True)
    thread.start()
    folder = tmp_path_factory.mktemp("prometheus")
    rules = folder / "rules.yml"
    rules.write_text(render(example_model(), "rules.yml", with_tests=False).rules)
    try:
        with running_prometheus(folder, [f"127.0.0.1:{server.port}"], job=JOB, rule_files=[rules]) as prometheus:
            yield prometheus
    finally:
        stop.set()
        thread.join(timeout=10)
        server.stop()


def _exemplars(live: Prometheus, expr: str) -> list[Any]:
    now = time.time()
    return live.exemplars(expr, now - 600, now + 60)


def _substitute(text: str, slo: str | None = None) -> str:
    for variable, value in sorted(SUBSTITUTIONS.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(variable, value)
    return text.replace("$slo", slo) if slo is not None else text


def _queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expression with the variables substituted), each repeated SLO row once
    per SLO of the spec."""
    out = []
    for name, dashboard in sorted(generated().items()):
        for q in panel_queries(dashboard.data):
            for slo in (SLOS if "$slo" in q.expr else (None,)):
                out.append((name, f"{q.panel} [{q.ref_id}]", _substitute(q.expr, slo)))
    return out


def _has_data(result: list[Any]) -> bool:
    """Whether an instant query answered at least one sample that is a number (NaN is no data)."""
    return any(not math.isnan(float(sample["value"][1])) for sample in result)


def _answering(live: Prometheus, queries: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The queries that do not return data now (all of them while Prometheus is not up yet)."""
    failing = []
    for item in queries:
        try:
            ok = _has_data(live.query(item[2]))
        except PrometheusError:
            ok = False
        if not ok:
            failing.append(item)
    return failing


@pytest.fixture(scope="module")
def unanswered(live: Prometheus) -> list[tuple[str, str, str]]:
    """Waits (at most :data:`WAIT_S`) until every query returns data; the queries that still do not."""
    queries = _queries()
    assert len(queries) > 80
    deadline = time.monotonic() + WAIT_S
    failing = queries
    while time.monotonic() < deadline:
        failing = _answering(live, queries)
        if not failing:
            break
        time.sleep(1.0)
    return failing


def test_every_dashboard_query_returns_data_from_a_real_prometheus(unanswered: list[tuple[str, str, str]]) -> None:
    listed = "\n".join(f"  {name} / {panel}: {expr}" for name, panel, expr in unanswered)
    assert not unanswered, f"{len(unanswered)} of {len(_queries())} queries gave no data in {WAIT_S:g} s:\n{listed}"


def test_every_exemplar_query_brings_back_request_ids(live: Prometheus, unanswered: list[tuple[str, str, str]]) -> None:
    for name, dashboard in sorted(generated().items()):
        for q in panel_queries(dashboard.data):
            if not q.exemplar:
                continue
            found = _exemplars(live, _substitute(q.expr))
            ids = {e["labels"].get("request_id", "") for series in found for e in series["exemplars"]}
            assert any(i.startswith("req-") for i in ids), f"{name} / {q.panel}: no request_id exemplar: {found}"


def test_every_variable_lists_the_values_the_dashboards_select(live: Prometheus,
                                                               unanswered: list[tuple[str, str, str]]) -> None:
    expected = {"job": {JOB}, "model": {"chat"}, "service": {"chat"}, "slo": set(SLOS)}
    for name, dashboard in sorted(generated().items()):
        for v in variable_queries(dashboard.data):
            match = LABEL_VALUES.match(v.query)
            assert match, v
            values = set(live.get(f"/api/v1/label/{match.group('label')}/values",
                                  {"match[]": _substitute(match.group("series"))}))
            assert expected[v.name] <= values, f"{name} variable {v.name}: {v.query} listed {sorted(values)}"
