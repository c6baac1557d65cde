"""Routing on the engines' own load: each profiled backend's ``/metrics`` read through its engine profile (real
expositions of vLLM, SGLang, NIM and llama.cpp served over HTTP), the choice between two backends it changes, and
the fallback to outstanding requests when the figures are missing, stale or unreadable."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llmslo.analysis.scrape import parse_exposition
from llmslo.engines import ENGINES, RELATED, EngineProfile
from llmslo.gateway import BackendSpec, Gateway, GatewayConfig, Pool, backend_from_arg, load_pool
from llmslo.gateway._engine_load import EngineFigures, EngineLoad, profile_series, read_figures
from llmslo.telemetry import ConfigurationError, Telemetry
from llmslo.tests._gateway_support import ScriptedBackend

REAL = Path(__file__).resolve().parents[2] / "shared" / "real_data" / "prometheus"
PROFILES = {**ENGINES, **RELATED}

LLAMACPP_BUSY = """\
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 9
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1200
"""
"""A hand-written llama-server exposition (its names as the engine's profile has them) under load."""


def _llamacpp(waiting: int, running: int) -> str:
    return LLAMACPP_BUSY.replace("requests_deferred 9", f"requests_deferred {waiting}").replace(
        "requests_processing 4", f"requests_processing {running}")


def _real(name: str) -> str:
    path = REAL / name
    if not path.is_file():
        pytest.skip(f"real exposition {path} is missing (the shared real_data folder is not mounted here)")
    return path.read_text(encoding="utf-8")


def _expected(profile: EngineProfile, text: str, concept: str) -> list[float]:
    """The values of ``concept``'s series in ``text`` as the project's own exposition parser reads them (the
    current name first, as the profile prefers it)."""
    scrape = parse_exposition(text)
    for series in profile_series(profile, concept):
        values = [s.value for f in scrape.families.values() for s in f.samples if s.name == series.name]
        if values:
            return values
    return []


# ---- a fake /metrics server (threading http.server on 127.0.0.1) ---------------------------------------------


@dataclass
class Answer:
    """What the fake server answers on ``/metrics``: ``status``, ``body``, and its framing (``length``,
    ``chunked``, or ``close``: the body ends when the connection closes)."""

    body: str
    status: int = 200
    framing: str = "length"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        answer = self.server.answer
        self.server.paths.append(self.path)
        data = answer.body.encode()
        self.send_response(answer.status)
        self.send_header("content-type", "text/plain; version=0.0.4")
        if answer.framing == "length":
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif answer.framing == "chunked":
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(0, len(data), 1000):
                part = data[i:i + 1000]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, answer: Answer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer
        self.paths: list[str] = []


@contextlib.contextmanager
def metrics_server(answer: Answer) -> Iterator[_Server]:
    """A ``/metrics`` server on 127.0.0.1 answering ``answer`` (changeable while it runs); stopped on the way out."""
    server = _Server(answer)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5.0)


def _read(engine: str, answer: Answer, path: str = "/metrics") -> EngineLoad:
    """An :class:`EngineLoad` of ``engine`` after one read of the fake server answering ``answer``."""
    with metrics_server(answer) as server:
        load = EngineLoad(PROFILES[engine], "127.0.0.1", server.server_address[1], path, interval_s=1.0)
        asyncio.run(load.read())
        assert server.paths == [path]
    return load


# ---- reading the real expositions ----------------------------------------------------------------------------


@pytest.mark.parametrize(("engine", "file"), [
    ("sglang", "sglang_llama3.1-8b_metrics_docs_example.prom.txt"),
    ("sglang", "sglang_v0.5.10_opt125m_datadog_fixture.prom.txt"),
    ("vllm", "vllm_opt125m_datadog_fixture_mixed_v0_v1.prom.txt"),
    ("nim", "nim_llama3.1-8b_datadog_fixture.prom.txt"),
    ("llamacpp", "llamacpp_b11434_smollm2_after_load.prom.txt"),
])
@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
def test_a_real_exposition_served_over_http_gives_the_profiles_waiting_running_and_kv_usage(
        engine: str, file: str, framing: str) -> None:
    text = _real(file)
    profile = PROFILES[engine]
    load = _read(engine, Answer(text, framing=framing))
    assert load.last_error is None and load.read_failures == 0
    figures = load.fresh()
    assert figures is not None
    assert figures.waiting == sum(_expected(profile, text, "waiting"))
    assert figures.running == sum(_expected(profile, text, "running"))
    kv = _expected(profile, text, "kv_usage")
    assert figures.kv_usage == (max(kv) if kv else None)
    assert (figures.kv_usage is None) == (profile.get("kv_usage") is None)  # llama.cpp has none


def test_the_overloaded_sglang_exposition_shows_its_queue() -> None:
    text = _real("sglang_llama3.1-8b_metrics_docs_example.prom.txt")
    figures = _read("sglang", Answer(text)).fresh()
    assert figures is not None
    assert figures.waiting > figures.running > 0 and 0 < (figures.kv_usage or 0) < 1


def test_the_current_kv_series_wins_over_the_deprecated_one_which_is_read_where_it_is_alone() -> None:
    both = ('vllm:num_requests_running{model_name="m"} 1\nvllm:num_requests_waiting{model_name="m"} 2\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.5\nvllm:gpu_cache_usage_perc{model_name="m"} 0.25\n')
    assert read_figures(ENGINES["vllm"], both, 0.0).kv_usage == 0.5
    old = "\n".join(line for line in both.splitlines() if "kv_cache" not in line) + "\n"
    assert read_figures(ENGINES["vllm"], old, 0.0).kv_usage == 0.25


def test_label_sets_are_summed_for_the_queues_and_the_fullest_kv_cache_is_kept() -> None:
    text = "".join(f'vllm:num_requests_waiting{{engine="{e}"}} {w}\nvllm:num_requests_running{{engine="{e}"}} {r}\n'
                   f'vllm:kv_cache_usage_perc{{engine="{e}"}} {kv}\n' for e, w, r, kv in ((0, 3, 1, 0.2),
                                                                                          (1, 4, 2, 0.7)))
    assert read_figures(ENGINES["vllm"], text, 5.0) == EngineFigures(waiting=7, running=3, kv_usage=0.7,
                                                                      read_s=5.0)


def test_the_hand_written_llamacpp_exposition_has_no_kv_usage() -> None:
    figures = _read("llamacpp", Answer(LLAMACPP_BUSY), path="/custom/metrics").fresh()
    assert figures is not None and (figures.waiting, figures.running, figures.kv_usage) == (9, 4, None)


@pytest.mark.parametrize(("answer", "reason"), [
    (Answer("oops", status=500), "answered 500"),
    (Answer("not an exposition {{{\n"), "no waiting series"),
    (Answer('llamacpp:requests_deferred{a="b} 1\n'), "cannot be parsed"),
    (Answer(LLAMACPP_BUSY.replace("requests_deferred", "something_else")), "llamacpp:requests_deferred"),
])
def test_a_failed_read_is_counted_with_its_reason_and_gives_no_figures(answer: Answer, reason: str) -> None:
    load = _read("llamacpp", answer)
    assert load.fresh() is None and load.read_failures == 1
    assert load.last_error is not None and reason in load.last_error and "GET /metrics" in load.last_error


def test_a_backend_that_cannot_be_reached_is_a_counted_failure() -> None:
    with metrics_server(Answer("")) as server:
        port = server.server_address[1]
    load = EngineLoad(ENGINES["llamacpp"], "127.0.0.1", port, "/metrics", interval_s=1.0)
    assert asyncio.run(load.read()) is False
    assert load.read_failures == 1 and load.figures is None and load.last_error


def test_figures_older_than_three_intervals_are_stale_and_a_failed_read_keeps_the_last_until_then() -> None:
    now = [100.0]
    with metrics_server(Answer(LLAMACPP_BUSY)) as server:
        load = EngineLoad(ENGINES["llamacpp"], "127.0.0.1", server.server_address[1], "/metrics", interval_s=0.5,
                          clock=lambda: now[0])
        assert asyncio.run(load.read())
        server.answer = Answer("down", status=503)
        now[0] += 1.5
        assert asyncio.run(load.read()) is False
        assert load.fresh() is not None  # three intervals old: still used
        assert load.status()["engine_read_age_s"] == 1.5 and load.status()["engine_fresh"] is True
        now[0] += 0.01
        assert load.fresh() is None and load.status()["engine_fresh"] is False
        assert load.status()["engine_read_failures"] == 1


# ---- the choice between two backends ------------------------------------------------------------------------


def _pool(clock: list[float], *, engine: str | None = "llamacpp", seed: int = 7, n: int = 2) -> Pool:
    specs = tuple(BackendSpec(f"b{i}", f"http://127.0.0.1:{9000 + i}", slots=2, engine=engine) for i in range(n))
    return Pool(GatewayConfig(backends=specs, engine_interval_s=1.0), Telemetry(version="gateway"),
                rng=random.Random(seed), clock=lambda: clock[0])


def _picks(pool: Pool, n: int) -> list[str]:
    """``n`` picks, each request held (outstanding) until the end: the ids chosen, in order."""
    chosen = []
    for _ in range(n):
        backend = pool.pick("m")
        assert backend is not None
        backend.outstanding += 1
        chosen.append(backend.id)
    return chosen


def _set(pool: Pool, bid: str, waiting: float, kv: float | None, read_s: float) -> None:
    engine = pool.backends[bid].engine
    assert engine is not None
    engine.figures = EngineFigures(waiting=waiting, running=2, kv_usage=kv, read_s=read_s)


def test_a_backend_with_a_long_engine_queue_gets_fewer_new_requests_than_an_idle_one() -> None:
    clock = [10.0]
    pool = _pool(clock)
    _set(pool, "b0", waiting=0, kv=0.1, read_s=10.0)
    _set(pool, "b1", waiting=12, kv=0.1, read_s=10.0)
    picks = _picks(pool, 40)
    assert picks.count("b1") < picks.count("b0")
    # the queue counts as outstanding requests would: b0 takes the first 12, then they alternate
    assert picks[:12] == ["b0"] * 12 and picks.count("b0") - picks.count("b1") == 12
    plain = _pool(clock, engine=None)
    assert abs(_picks(plain, 40).count("b0") - 20) <= 1  # without figures: outstanding requests alone


def test_on_equal_engine_load_the_lower_kv_usage_is_taken() -> None:
    clock = [10.0]
    pool = _pool(clock)
    _set(pool, "b0", waiting=1, kv=0.9, read_s=10.0)
    _set(pool, "b1", waiting=1, kv=0.3, read_s=10.0)
    assert pool.pick("m") is pool.backends["b1"]
    _set(pool, "b1", waiting=1, kv=None, read_s=10.0)  # one without KV usage: no tie-break
    first = _pool(clock, engine=None).pick("m")
    assert first is not None and pool.pick("m") is pool.backends[first.id]


@pytest.mark.parametrize("missing", ["stale", "never read", "one stale"])
def test_without_fresh_figures_on_both_routing_is_exactly_outstanding_requests_and_counted(missing: str) -> None:
    clock = [100.0]
    pool = _pool(clock, n=3)
    if missing != "never read":
        for bid in pool.backends:
            _set(pool, bid, waiting=50 if bid == "b0" else 0, kv=0.5, read_s=96.9 if missing == "stale" else 100.0)
    if missing == "one stale":
        _set(pool, "b0", waiting=50, kv=0.5, read_s=96.9)
    plain = _pool(clock, engine=None, n=3)
    assert _picks(pool, 30) == _picks(plain, 30)  # the same seed: the same choices as with no engine at all
    fallbacks = sum(b.engine.fallbacks for b in pool.backends.values() if b.engine is not None)
    assert fallbacks > 0
    assert pool.backends["b0"].status()["engine_fallbacks"] == pool.backends["b0"].engine.fallbacks  # type: ignore[union-attr]


def test_failed_reads_and_fallbacks_are_series_per_backend() -> None:
    """``llmslo_backend_engine_read_failures_total`` and ``..._fallbacks_total`` carry each backend's counts, 0 for a
    backend whose engine is not read, in the exposition a scrape of the gateway gets."""
    from prometheus_client import CollectorRegistry, generate_latest

    from llmslo.gateway._metrics import PoolCollector

    clock = [100.0]
    specs = (BackendSpec("read", "http://127.0.0.1:9000", engine="vllm"), BackendSpec("plain", "http://127.0.0.1:9001"))
    pool = Pool(GatewayConfig(backends=specs, engine_interval_s=1.0), Telemetry(version="gateway"),
                rng=random.Random(3), clock=lambda: clock[0])
    engine = pool.backends["read"].engine
    assert engine is not None
    engine._failed("answered 500, not 200")
    engine._failed("no exposition within 1 s")
    _picks(pool, 6)  # never read: each choice between the two weighs "read" by outstanding requests alone
    registry = CollectorRegistry()
    registry.register(PoolCollector(pool))
    text = generate_latest(registry).decode()
    values = {(s.name, s.label("backend")): s.value for _, s in parse_exposition(text).samples()}
    assert values[("llmslo_backend_engine_read_failures_total", "read")] == 2
    assert values[("llmslo_backend_engine_read_failures_total", "plain")] == 0
    assert values[("llmslo_backend_engine_fallbacks_total", "read")] == engine.fallbacks > 0
    assert values[("llmslo_backend_engine_fallbacks_total", "plain")] == 0


def test_the_fallback_is_not_taken_while_the_figures_are_fresh() -> None:
    clock = [100.0]
    pool = _pool(clock, n=3)
    for bid in pool.backends:
        _set(pool, bid, waiting=50 if bid == "b0" else 0, kv=0.5, read_s=97.0)  # three intervals old: fresh
    assert "b0" not in _picks(pool, 30)
    assert all(b.engine is not None and b.engine.fallbacks == 0 for b in pool.backends.values())


# ---- configuration -------------------------------------------------------------------------------------------


def test_a_bad_engine_in_a_pool_file_is_refused_naming_the_backend_and_the_field(tmp_path: Path) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text("backends:\n  - {id: a, url: 'http://127.0.0.1:8001', engine: llamacpp}\n"
                    "  - {id: b, url: 'http://127.0.0.1:8002', engine: vllm2}\n")
    with pytest.raises(ConfigurationError) as err:
        load_pool(pool)
    message = str(err.value)
    assert "backend 2" in message and "'b'" in message and "engine 'vllm2' is not known" in message
    assert "use one of llamacpp, nim, sglang, tgi, trtllm, vllm" in message


def test_a_pool_file_sets_the_engine_and_its_metrics_path_and_a_bad_path_is_refused(tmp_path: Path) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text("backends:\n  - {id: a, url: 'http://127.0.0.1:8001', engine: sglang, metrics_path: /m}\n"
                    "  - {id: b, url: 'http://127.0.0.1:8002'}\n")
    a, b = load_pool(pool).backends
    assert (a.engine, a.metrics_path, b.engine, b.metrics_path) == ("sglang", "/m", None, "/metrics")
    pool.write_text("backends:\n  - {id: a, url: 'http://127.0.0.1:8001', engine: sglang, metrics_path: 'm?x=1'}\n")
    with pytest.raises(ConfigurationError, match=r"backend 1: backend 'a': metrics_path must be a path like /metrics"):
        load_pool(pool)


def test_backend_args_take_the_engine_and_the_interval_must_be_positive() -> None:
    assert backend_from_arg("a=http://127.0.0.1:8001@v1", 1, engine="vllm").engine == "vllm"
    assert backend_from_arg("http://127.0.0.1:8001", 1).engine is None
    with pytest.raises(ConfigurationError, match="engine_interval_s: must be a number of seconds > 0"):
        GatewayConfig(backends=(BackendSpec("a", "http://127.0.0.1:8001"),), engine_interval_s=0)


# ---- a running gateway ---------------------------------------------------------------------------------------


class MeteredBackend(ScriptedBackend):
    """A scripted backend that also answers ``/metrics`` with a llama.cpp exposition (``metrics_status`` 200, or
    an error status)."""

    def __init__(self, waiting: int) -> None:
        super().__init__()
        self.exposition = _llamacpp(waiting, running=1)
        self.metrics_status = 200
        self.metrics_reads = 0

    async def _answer(self, method: str, path: str, headers: dict[str, str], raw: bytes,
                      reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> bool:
        if path != "/metrics":
            return await super()._answer(method, path, headers, raw, reader, writer, head)
        self.metrics_reads += 1
        body = self.exposition.encode() if self.metrics_status == 200 else b"down"
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s"
                     % (self.metrics_status, len(body), body))
        return True


async def _until(admin: httpx.AsyncClient, bid: str, key: str, want: object) -> dict[str, object]:
    """The backend's admin state once ``key`` is ``want`` (at most 200 polls)."""
    for _ in range(200):
        state: dict[str, object] = (await admin.get(f"/admin/backends/{bid}")).json()
        if state[key] == want:
            return state
        await asyncio.sleep(0.02)
    raise AssertionError(f"backend {bid}: {key} never became {want!r}; last state {state}")


@contextlib.asynccontextmanager
async def metered_gateway(backends: dict[str, MeteredBackend]) -> AsyncIterator[tuple[httpx.AsyncClient,
                                                                                     httpx.AsyncClient]]:
    """A gateway reading the llama.cpp metrics of ``backends`` (id -> backend, started here) every 50 ms: its
    admin and front clients; everything is stopped on the way out."""
    for b in backends.values():
        await b.start()
    specs = tuple(BackendSpec(bid, b.url, engine="llamacpp") for bid, b in backends.items())
    gw = Gateway(GatewayConfig(backends=specs, port=0, admin_port=0, health_interval_s=60.0,
                               engine_interval_s=0.05, drain_settle_s=0.0), Telemetry(version="gateway"))
    try:
        await gw.start()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.admin_port}") as admin, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.port}") as client:
            yield admin, client
    finally:
        await gw.close()
        for b in backends.values():
            await b.close()


def test_a_gateway_reads_the_engines_shows_the_figures_routes_on_them_and_falls_back_when_a_read_fails() -> None:
    async def go() -> None:
        idle, busy = MeteredBackend(waiting=0), MeteredBackend(waiting=30)
        async with metered_gateway({"idle": idle, "busy": busy}) as (admin, client):
            shown = await _until(admin, "busy", "engine_fresh", True)
            await _until(admin, "idle", "engine_fresh", True)
            assert (shown["engine"], shown["engine_waiting"], shown["engine_running"]) == ("llamacpp", 30, 1)
            assert shown["engine_kv_usage"] is None and isinstance(shown["engine_read_age_s"], float)
            body = {"model": "m", "prompt": "script:tokens=1", "max_tokens": 1}
            for _ in range(10):
                assert (await client.post("/v1/completions", json=body)).status_code == 200
            assert (len(idle.seen), len(busy.seen)) == (10, 0)

            busy.metrics_status = 500
            stale = await _until(admin, "busy", "engine_fresh", False)
            assert stale["engine_read_failures"] >= 1 and "answered 500" in str(stale["engine_last_error"])
            for _ in range(30):
                assert (await client.post("/v1/completions", json=body)).status_code == 200
            assert len(busy.seen) > 0  # outstanding requests decide again: the idle queue no longer counts
            after = (await admin.get("/admin/backends/busy")).json()
            assert after["engine_fallbacks"] > 0 and after["engine_waiting"] == 30  # kept, shown with its age
            plain = (await admin.post("/admin/backends", json={"id": "p", "url": idle.url})).json()
            assert plain["engine"] is None and plain["engine_fresh"] is False
            bad = await admin.post("/admin/backends", json={"id": "q", "url": idle.url, "engine": "vlm"})
            assert bad.status_code == 400 and "engine 'vlm' is not known" in bad.text

    asyncio.run(go())


def test_the_status_line_shows_the_engine_figures() -> None:
    from llmslo.cli._gateway import _backend_line

    base: dict[str, object] = {"id": "a", "url": "http://127.0.0.1:1", "version": "v", "routable": True,
                               "breaker": "closed", "outstanding": 0, "served": 3}
    assert "engine" not in _backend_line({**base, "engine": None})
    line = _backend_line({**base, "engine": "sglang", "engine_waiting": 12.0, "engine_running": 3.0,
                          "engine_kv_usage": 0.25, "engine_read_age_s": 0.4, "engine_fresh": True})
    assert line.endswith("engine sglang: waiting 12 running 3 kv 25%, read 0.4 s ago")
    stale = _backend_line({**base, "engine": "llamacpp", "engine_waiting": 1.0, "engine_running": 0.0,
                           "engine_kv_usage": None, "engine_read_age_s": 9.0, "engine_fresh": False,
                           "engine_last_error": "GET /metrics: answered 500, not 200"})
    assert "kv n/a" in stale and "stale: routing on outstanding requests; GET /metrics: answered 500" in stale
    assert "not read yet" in _backend_line({**base, "engine": "vllm", "engine_read_age_s": None})


def test_the_status_line_shows_the_backends_slots_and_concurrency_limits() -> None:
    from llmslo.cli._gateway import _backend_line

    line = _backend_line({"id": "a", "url": "http://127.0.0.1:1", "version": "v", "routable": True,
                          "breaker": "closed", "slots": 4, "limit": {"limit": 8, "in_flight": 1, "token_limit": None,
                                                                     "tokens_in_flight": 300},
                          "outstanding": 1, "served": 3})
    assert line == ("a  http://127.0.0.1:1  version v  routable  breaker closed  slots 4  limit 8  tokens 300/-  "
                    "outstanding 1  served 3")
    learned = _backend_line({"id": "a", "limit": {"limit": 8, "token_limit": 4096, "tokens_in_flight": 0,
                                                  "over_limit": 0}})
    assert "  limit 8  tokens 0/4096  " in learned
    over = _backend_line({"id": "a", "limit": {"limit": 2, "token_limit": None, "tokens_in_flight": 0,
                                               "over_limit": 17}})
    assert "  limit 2 (17 sent past it)  tokens 0/-  " in over
    opened = _backend_line({"id": "a", "url": "u", "version": "v", "in_pool": True, "healthy": True,
                            "breaker": "open", "routable": False})
    assert opened.startswith("a  u  version v  not routable  breaker open  ")   # the breaker said once


def test_the_cli_refuses_an_unknown_engine_and_engine_metrics_with_a_pool(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from llmslo.cli._app import app

    runner = CliRunner()
    bad = runner.invoke(app, ["gateway", "--backend", "http://127.0.0.1:8001", "--engine-metrics", "vlm"])
    assert bad.exit_code != 0 and "--engine-metrics: 'vlm' is not a known engine; use one of llamacpp" in bad.output
    pool = tmp_path / "pool.yaml"
    pool.write_text(json.dumps({"backends": [{"url": "http://127.0.0.1:8001"}]}))
    both = runner.invoke(app, ["gateway", "--pool", str(pool), "--engine-metrics", "vllm"])
    assert both.exit_code != 0 and "in a pool file set engine: on each backend" in both.output


def test_the_read_and_health_intervals_come_from_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from llmslo.cli import _gateway as cli
    from llmslo.cli._app import app

    seen: list[GatewayConfig] = []
    monkeypatch.setattr(cli, "_run", lambda config, version, writer: seen.append(config))
    runner = CliRunner()
    base = ["gateway", "--backend", "http://127.0.0.1:8001", "--engine-metrics", "vllm"]
    ok = runner.invoke(app, [*base, "--engine-interval", "250ms", "--health-interval", "5s"])
    assert ok.exit_code == 0, ok.output
    assert (seen[-1].engine_interval_s, seen[-1].health_interval_s) == (0.25, 5.0)
    assert runner.invoke(app, base).exit_code == 0 and (seen[-1].engine_interval_s, seen[-1].health_interval_s) == (
        1.0, 2.0)
    bad = runner.invoke(app, [*base, "--engine-interval", "0s"])
    assert bad.exit_code == 2 and "--engine-interval" in bad.output and len(seen) == 2


@pytest.mark.integration
@pytest.mark.slow  # starts a real llama-server
def test_a_gateway_reads_the_slots_a_real_llama_server_is_processing(tmp_path: Path) -> None:
    from llmslo.ops import running_llama_server
    from llmslo.tests.test_live_llamacpp import require_engine

    require_engine()
    with running_llama_server(tmp_path, parallel=2, context_tokens=4096) as engine:
        async def go() -> None:
            spec = BackendSpec("llama", engine.url, slots=2, engine="llamacpp")
            gw = Gateway(GatewayConfig(backends=(spec,), port=0, admin_port=0, health_interval_s=60.0,
                                       engine_interval_s=0.1, drain_settle_s=0.0), Telemetry(version="gateway"))
            await gw.start()
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.admin_port}") as admin, \
                        httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.port}", timeout=60.0) as client:
                    idle = await _until(admin, "llama", "engine_fresh", True)
                    assert (idle["engine_running"], idle["engine_waiting"], idle["engine_kv_usage"]) == (0, 0, None)
                    # 1,800 tokens (ignore_eos: no early end) keep a slot processing for about 12 s here; the
                    # test stops at the first read that shows it and cancels the rest
                    body = {"model": engine.alias, "max_tokens": 1800, "stream": True, "ignore_eos": True,
                            "messages": [{"role": "user", "content": "Count from one to two hundred."}]}
                    lines: list[str] = []

                    async def read_all() -> int:
                        async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
                            async for line in stream.aiter_lines():
                                lines.append(line)
                            return stream.status_code

                    reader = asyncio.create_task(read_all())
                    seen: dict[str, object] = {}
                    deadline = time.monotonic() + 60.0   # wall clock, not a count of polls: a busy machine polls slowly
                    while not reader.done() and time.monotonic() < deadline:
                        seen = (await admin.get("/admin/backends/llama")).json()
                        if seen["engine_running"] == 1:
                            break
                        await asyncio.sleep(0.02)
                    ended = reader.done()
                    status: int | str = "open"
                    reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        status = await reader
                    assert seen.get("engine_running") == 1, (
                        f"the engine never read as running while the stream was open (stream ended: {ended}, "
                        f"status {status}, {len(lines)} lines, last {lines[-3:]!r}); "
                        f"last state {seen}")
                    assert seen["engine_fresh"] is True and seen["engine_read_failures"] == 0
            finally:
                await gw.close()

        asyncio.run(go())


@pytest.mark.parametrize(("waiting", "limit", "full_windows"), [(0, 4, 0), (30, 2, 2)])
def test_a_backend_whose_engine_queues_requests_keeps_its_limit(waiting: int, limit: int, full_windows: int) -> None:
    async def go() -> dict[str, object]:
        async with metered_gateway({"a": MeteredBackend(waiting=waiting)}) as (admin, client):
            await _until(admin, "a", "engine_fresh", True)
            body = {"model": "m", "prompt": "script:tokens=2", "max_tokens": 2}
            for _ in range(40):     # two windows, one request at a time: the first doubles the limit, but for
                assert (await client.post("/v1/completions", json=body)).status_code == 200   # the queue
            state: dict[str, object] = (await admin.get("/admin/backends/a")).json()
            return state

    state = asyncio.run(go())
    shown = state["limit"]
    assert isinstance(shown, dict)
    assert (shown["updates"], shown["limit"], shown["engine_full_windows"]) == (2, limit, full_windows)
