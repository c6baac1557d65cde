"""Prometheus metrics: catalogue names, buckets holding the SLO thresholds, bounded labels, exemplars,
golden ``/metrics`` text, and a real Prometheus reading them back."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.telemetry import (
    DEFAULT_BUCKETS_S,
    METRICS,
    METRICS_BY_KEY,
    LabelPolicy,
    MetricsServer,
    SloPolicy,
    Telemetry,
    metrics_app,
    render_metrics,
)

GOLDEN = Path(__file__).parent / "golden" / "telemetry"
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def _frozen() -> Telemetry:
    ticks = iter(range(1_000_000_000, 10**12, 10_000_000))  # 10 ms per reading
    tel = Telemetry(clock_ns=lambda: next(ticks), clock_unix_s=lambda: 1_700_000_000.0, version="v1",
                    policies=[SloPolicy(name="interactive", ttft_s=0.1, tpot_s=0.02)])
    t = tel.start("req-golden-1", model="llama", prompt_tokens=12, tenant_class="interactive",
                  slo_class="interactive")
    t.admit()
    t.schedule()
    for _ in range(3):
        t.commit()
        t.send()
    t.commit(k=2, proposed=2)
    t.finish("stop")
    tel.start("req-golden-2", model="llama").reject("queue_full")
    tel.set_queue_capacity("llama", 64)
    tel.set_breaker_state("upstream", "half_open")
    tel.observe_retry_after("llama", "queue_full", 2.0)
    tel.count_breaker_transition("upstream", "open", "half_open")
    tel.count_shed("llama", "queue", "batch")
    tel.count_degraded("llama", "cap_max_tokens")
    tel.count_rate_limit_store_error("open")
    tel.observe_drain(42.0)
    tel.count_drain_closed("idle", 2)
    return tel


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("LLMSLO_UPDATE_GOLDEN") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs; rerun with LLMSLO_UPDATE_GOLDEN=1 and review the diff"


def test_metrics_text_matches_the_golden_files_in_both_formats() -> None:
    tel = _frozen()
    om, om_type = render_metrics(tel.registry, OPENMETRICS)
    plain, plain_type = render_metrics(tel.registry, "")
    assert om_type.startswith("application/openmetrics-text")
    assert plain_type.startswith("text/plain")
    assert b'# {request_id="req-golden-1"}' in om and b"# {" not in plain
    _check_golden("metrics.openmetrics.txt", om.decode())
    _check_golden("metrics.prometheus.txt", plain.decode())


def test_every_exposed_family_comes_from_the_catalogue() -> None:
    tel = _frozen()
    names = {m.name for m in tel.registry.collect()}
    # The GPU gauges are exposed by GpuSampler on its registry, the backends' series by the gateway's pool:
    # exposing them here as well would repeat their families when both share one registry.
    assert names == {m.instrument_name for m in METRICS if "gpu" not in m.labels and "backend" not in m.labels}


def test_default_buckets_contain_the_common_slo_thresholds() -> None:
    for t in (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0):
        assert t in DEFAULT_BUCKETS_S["ttft_s"]
    for t in (0.01, 0.02, 0.05, 0.1, 0.2):
        assert t in DEFAULT_BUCKETS_S["tpot_s"] and t in DEFAULT_BUCKETS_S["itl_s"]
    Telemetry(policies=[SloPolicy(ttft_s=0.25)], buckets={"ttft_s": [0.1, 0.25, 1.0]})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8), st.text(max_size=8),
                          st.sampled_from(["stop", "length", "deadline", "bogus"])), max_size=60))
def test_any_label_values_keep_the_series_count_within_the_declared_bound(
    requests: list[tuple[str, str, str, str]]
) -> None:
    policy = LabelPolicy(max_values={"model": 3, "version": 2, "tenant_class": 2})
    tel = Telemetry(labels=policy)
    for i, (model, version, tenant, reason) in enumerate(requests):
        t = tel.start(f"r{i}", model=model, version=version or "v", tenant_class=tenant)
        t.admit()
        t.commit()
        t.commit()
        t.finish(reason)
    request_children = 4 * 3 * 3  # (model, version, tenant_class) with `other` each
    bound = 0
    for m in METRICS:
        n = 1
        for label in m.labels:
            narrowed = dict(m.narrowed).get(label)
            n *= policy.bound(label, narrowed or m.allowed_values(label))
        bound += n
    assert tel.metrics.series_count() <= bound
    for family in tel.registry.collect():
        children = {tuple(sorted(s.labels.items())) for s in family.samples if "le" not in s.labels}
        assert len(children) <= max(request_children * 8, 1)


def test_the_asgi_app_negotiates_openmetrics_and_plain_text() -> None:
    tel = _frozen()
    app = metrics_app(tel.registry)

    async def get(accept: bytes) -> tuple[dict[str, Any], bytes]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request"}

        async def send(message: Any) -> None:
            sent.append(message)

        await app({"type": "http", "headers": [(b"accept", accept)]}, receive, send)
        return sent[0], sent[1]["body"]

    start, body = asyncio.run(get(OPENMETRICS.encode()))
    assert dict(start["headers"])[b"content-type"].startswith(b"application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    start, body = asyncio.run(get(b"text/plain"))
    assert dict(start["headers"])[b"content-type"].startswith(b"text/plain") and b"# EOF" not in body


def test_the_standalone_server_binds_to_localhost_by_default() -> None:
    tel = _frozen()
    server = MetricsServer(tel.registry)
    try:
        assert server.host == "127.0.0.1"
        req = urllib.request.Request(server.url, headers={"Accept": OPENMETRICS})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert b"llmslo_ttft_seconds_bucket" in resp.read()
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.mark.integration
@pytest.mark.slow
def test_a_real_prometheus_scrapes_the_ttft_histogram_and_a_request_id_exemplar() -> None:
    binary = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if binary is None:
        pytest.skip("the prometheus binary is not installed (Debian package `prometheus`)")
    tel = Telemetry(version="v1")
    for i in range(5):
        t = tel.start(f"req-prom-{i}", model="llama")
        t.admit()
        t.schedule()
        t.commit()
        t.commit()
        t.finish("stop")
    server = MetricsServer(tel.registry)
    port = _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="llmslo-prom-"))
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: llmslo\n    static_configs:\n      - targets: ['127.0.0.1:{server.port}']\n")
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--enable-feature=exemplar-storage"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/api/v1"
    query = 'llmslo_ttft_seconds_bucket{le="+Inf",model="llama"}'
    try:
        deadline = time.monotonic() + 40
        result: list[Any] = []
        exemplars: list[Any] = []
        while time.monotonic() < deadline:
            try:
                result = _get_json(f"{base}/query?query={urllib.parse.quote(query)}")["data"]["result"]
                now = time.time()
                ex_url = (f"{base}/query_exemplars?query={urllib.parse.quote('llmslo_ttft_seconds_bucket')}"
                          f"&start={now - 300}&end={now + 60}")
                exemplars = _get_json(ex_url)["data"]
            except OSError:
                pass
            if result and exemplars:
                break
            time.sleep(0.5)
        assert result, "Prometheus never returned the TTFT histogram"
        assert float(result[0]["value"][1]) == 5
        ids = {e["labels"]["request_id"] for series in exemplars for e in series["exemplars"]}
        assert ids & {f"req-prom-{i}" for i in range(5)}, exemplars
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_ttft_metric_reads_its_bounds_from_the_catalogue() -> None:
    assert METRICS_BY_KEY["ttft"].buckets_s == DEFAULT_BUCKETS_S["ttft_s"]
