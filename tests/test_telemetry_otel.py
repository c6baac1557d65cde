"""OpenTelemetry: spans and GenAI metrics reach real OTLP receivers (HTTP and gRPC), content stays out unless
enabled and redacted, a dead collector never stalls shutdown for long, and importing the telemetry loads no
OpenTelemetry.

The receivers are real servers on 127.0.0.1 decoding the opentelemetry-proto messages; what they received is
checked, never the exporters' ``force_flush`` result (it says True even when the export failed)."""

from __future__ import annotations

import gzip
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from llmslo.telemetry import ConfigurationError, OtlpExport, RequestTracing, SloPolicy, Telemetry, render_metrics

pytest.importorskip("opentelemetry.sdk")
grpc = pytest.importorskip("grpc")

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc  # noqa: E402
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

GENAI_METRICS = {"gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token",
                 "gen_ai.server.request.duration", "gen_ai.client.token.usage"}


class Point:
    """One histogram data point as exported: its attributes, observation count and explicit bucket bounds."""

    def __init__(self, attrs: dict[str, Any], count: int, bounds: list[float]) -> None:
        self.attrs, self.count, self.bounds = attrs, count, bounds


class Received:
    """What a receiver decoded: spans as ``{name: attributes}`` lists, metric names and the latest histogram
    data point of each series (cumulative temporality, so the latest export holds every request)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[tuple[str, dict[str, Any], bytes, bytes]] = []
        self.metrics: set[str] = set()
        self.points: dict[tuple[str, tuple[tuple[str, Any], ...]], Point] = {}

    def add_traces(self, req: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self.lock:
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        attrs = {kv.key: _value(kv.value) for kv in span.attributes}
                        self.spans.append((span.name, attrs, span.span_id, span.parent_span_id))

    def add_metrics(self, req: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        with self.lock:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        self.metrics.add(m.name)
                        if m.WhichOneof("data") != "histogram":
                            continue
                        for dp in m.histogram.data_points:
                            attrs = {kv.key: _value(kv.value) for kv in dp.attributes}
                            self.points[(m.name, tuple(sorted(attrs.items())))] = Point(
                                attrs, dp.count, list(dp.explicit_bounds))

    def histogram(self, name: str) -> list[Point]:
        """The latest data point of every series of histogram ``name``."""
        with self.lock:
            return [p for (n, _), p in self.points.items() if n == name]

    def wait_for(self, n_request_spans: int, metric_names: set[str], timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                done = (sum(1 for name, *_ in self.spans if not name.startswith("llmslo.")) >= n_request_spans
                        and metric_names <= self.metrics)
            if done:
                return
            time.sleep(0.05)

    def by_request(self) -> dict[str, dict[str, Any]]:
        return {attrs["llmslo.request_id"]: attrs for name, attrs, *_ in self.spans if "llmslo.request_id" in attrs}


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Received]]:
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            encoding = self.headers.get("Content-Encoding", "")
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            if self.path == "/v1/traces":
                treq = trace_service_pb2.ExportTraceServiceRequest()
                treq.ParseFromString(body)
                received.add_traces(treq)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            elif self.path == "/v1/metrics":
                mreq = metrics_service_pb2.ExportMetricsServiceRequest()
                mreq.ParseFromString(body)
                received.add_metrics(mreq)
                reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    received = Received()

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: Any) -> Any:
            received.add_traces(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: Any) -> Any:
            received.add_metrics(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.stop(grace=None).wait(5)


def _serve(tel: Telemetry) -> None:
    """Three requests: a streamed reply, a failed one, a rejected one."""
    t = tel.start("req-ok", model="llama", prompt_tokens=7)
    t.admit()
    t.schedule()
    for _ in range(5):
        t.commit()
        t.send()
    t.finish("stop")
    e = tel.start("req-err", model="llama", prompt_tokens=3)
    e.admit()
    e.schedule()
    e.commit()
    e.finish("error", error_type="EngineCrash")
    tel.start("req-rej", model="llama").reject("queue_full")


def _check_arrived(received: Received) -> None:
    received.wait_for(3, GENAI_METRICS)
    spans = received.by_request()
    assert set(spans) == {"req-ok", "req-err", "req-rej"}
    ok = spans["req-ok"]
    assert ok["gen_ai.operation.name"] == "chat" and ok["gen_ai.request.model"] == "llama"
    assert ok["gen_ai.usage.input_tokens"] == 7 and ok["gen_ai.usage.output_tokens"] == 5
    assert ok["gen_ai.response.finish_reasons"] == ["stop"] and ok["llmslo.finish_reason"] == "stop"
    assert ok["llmslo.generated_tokens"] == 5 and ok["llmslo.sent_tokens"] == 5
    assert ok["llmslo.prompt_tokens"] == 7 and ok["llmslo.proposed_tokens"] == 0
    assert ok["llmslo.ttft_s"] >= 0 and "llmslo.tpot_s" in ok
    assert spans["req-err"]["error.type"] == "EngineCrash"
    assert spans["req-rej"]["llmslo.reject_reason"] == "queue_full"
    names = [name for name, *_ in received.spans]
    assert "chat llama" in names
    assert {"llmslo.queue", "llmslo.prefill", "llmslo.decode"} <= set(names)
    request_ids = {sid for name, attrs, sid, _ in received.spans if attrs.get("llmslo.request_id") == "req-ok"}
    decode_parents = {parent for name, _, _, parent in received.spans if name == "llmslo.decode"}
    assert request_ids <= decode_parents
    assert received.metrics >= GENAI_METRICS
    assert not any("gen_ai.input.messages" in attrs for _, attrs, *_ in received.spans)


def test_spans_and_genai_metrics_reach_a_real_otlp_http_receiver(http_receiver: tuple[str, Received]) -> None:
    endpoint, received = http_receiver
    export = OtlpExport(protocol="http/protobuf", endpoint=endpoint, service_name="llmslo-test")
    try:
        tel = Telemetry(tracing=RequestTracing(tracer_provider=export.tracer_provider,
                                               meter_provider=export.meter_provider))
        _serve(tel)
        export.force_flush()
        _check_arrived(received)
        assert tel.guard.errors == {}
    finally:
        export.shutdown()


def test_spans_and_genai_metrics_reach_a_real_otlp_grpc_receiver_configured_by_otel_variables(
        grpc_receiver: tuple[str, Received], monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, received = grpc_receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    export = OtlpExport()
    assert export.traces_protocol == export.metrics_protocol == "grpc"
    try:
        tel = Telemetry(tracing=RequestTracing(tracer_provider=export.tracer_provider,
                                               meter_provider=export.meter_provider))
        _serve(tel)
        export.force_flush()
        _check_arrived(received)
        assert tel.guard.errors == {}
    finally:
        export.shutdown()


def _export_through(endpoint: str, received: Received, tel_kwargs: dict[str, Any],
                    tracing_kwargs: dict[str, Any]) -> None:
    """Serve :func:`_serve`'s three requests with tracing exported over OTLP/HTTP to ``endpoint``, and wait
    until the receiver holds their spans and the four GenAI metrics."""
    export = OtlpExport(protocol="http/protobuf", endpoint=endpoint)
    try:
        tel = Telemetry(tracing=RequestTracing(tracer_provider=export.tracer_provider,
                                               meter_provider=export.meter_provider, **tracing_kwargs),
                        **tel_kwargs)
        _serve(tel)
        export.force_flush()
        received.wait_for(3, GENAI_METRICS)
        assert tel.guard.errors == {}
    finally:
        export.shutdown()


def test_every_genai_metric_and_span_carries_the_attributes_its_convention_requires(
        http_receiver: tuple[str, Received]) -> None:
    """Per instrument, as the GenAI semantic conventions define them: the provider, operation, request and
    response model and the server's address and port everywhere; TTFT and TPOT for the successful response
    only; ``error.type`` on the request duration (a failed and a rejected request) and on no other metric."""
    endpoint, received = http_receiver
    _export_through(endpoint, received, {}, {"provider_name": "acme", "server_address": "llm.internal",
                                             "server_port": 8443})
    common = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "acme", "gen_ai.request.model": "llama",
              "gen_ai.response.model": "llama", "server.address": "llm.internal", "server.port": 8443}
    for name in ("gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token"):
        assert [(p.attrs, p.count) for p in received.histogram(name)] == [(common, 1)], name  # req-ok only
    duration = {p.attrs.get("error.type"): p for p in received.histogram("gen_ai.server.request.duration")}
    assert set(duration) == {None, "EngineCrash", "queue_full"}
    for error_type, point in duration.items():
        assert point.count == 1
        assert point.attrs == (common if error_type is None else {**common, "error.type": error_type})
    tokens = {p.attrs["gen_ai.token.type"]: p for p in received.histogram("gen_ai.client.token.usage")}
    assert set(tokens) == {"input", "output"}
    for token_type, point in tokens.items():
        assert point.attrs == {**common, "gen_ai.token.type": token_type}
        assert point.count == 2  # the streamed and the failed request; the rejected one used no tokens
    spans = received.by_request()
    for attrs in spans.values():
        assert {k: attrs[k] for k in common} == common
    assert "error.type" not in spans["req-ok"]
    assert spans["req-err"]["error.type"] == "EngineCrash"
    assert spans["req-rej"]["error.type"] == "queue_full"


def test_the_provider_defaults_to_llmslo_and_no_server_address_is_invented(
        http_receiver: tuple[str, Received]) -> None:
    endpoint, received = http_receiver
    _export_through(endpoint, received, {}, {})
    points = [p for name in GENAI_METRICS for p in received.histogram(name)]
    assert points and all(p.attrs["gen_ai.provider.name"] == "llmslo" for p in points)
    assert not any("server.address" in p.attrs or "server.port" in p.attrs for p in points)
    assert all(attrs["gen_ai.provider.name"] == "llmslo" for attrs in received.by_request().values())


def test_bucket_advisories_are_the_conventions_with_the_slo_thresholds_merged_in(
        http_receiver: tuple[str, Received]) -> None:
    """The bounds are the GenAI convention's explicit bucket boundaries (written out here as the convention
    states them) plus every SLO threshold of the telemetry's policies that is not among them."""
    endpoint, received = http_receiver
    policies = [SloPolicy(ttft_s=2.0, tpot_s=0.02), SloPolicy(name="batch", ttft_s=30.0, tpot_s=0.2, e2e_s=600.0)]
    _export_through(endpoint, received, {"policies": policies}, {})
    expected = {
        "gen_ai.server.time_to_first_token": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                              1.0, 2.0, 2.5, 5.0, 7.5, 10.0, 30.0],
        "gen_ai.server.time_per_output_token": [0.01, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                                0.75, 1.0, 2.5],
        "gen_ai.server.request.duration": [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                                           20.48, 40.96, 81.92, 600.0],
        "gen_ai.client.token.usage": [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                                      16777216, 67108864],
    }
    for name, bounds in expected.items():
        points = received.histogram(name)
        assert points, name
        assert [p.bounds for p in points] == [bounds] * len(points), name


def test_a_stream_the_server_ends_is_an_error_of_the_duration_and_a_client_cancel_is_not() -> None:
    tel, _, spans, reader = _in_memory()
    for rid, reason in (("r-deadline", "deadline"), ("r-drain", "server_draining"), ("r-cancel", "client_cancel")):
        t = tel.start(rid, model="m")
        t.commit()
        t.commit()
        t.finish(reason)
    data = reader.get_metrics_data()
    assert data is not None
    points = {m.name: [dict(p.attributes or {}) for p in m.data.data_points]
              for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert sorted(str(a.get("error.type")) for a in points["gen_ai.server.request.duration"]) == [
        "None", "deadline", "server_draining"]
    assert "gen_ai.server.time_to_first_token" not in points  # no successful response
    assert "gen_ai.server.time_per_output_token" not in points
    assert not any("error.type" in a for a in points["gen_ai.client.token.usage"])
    by_id = {dict(s.attributes or {})["llmslo.request_id"]: s for s in spans.get_finished_spans() if s.name == "chat m"}
    assert dict(by_id["r-deadline"].attributes or {})["error.type"] == "deadline"
    assert "error.type" not in dict(by_id["r-cancel"].attributes or {})


def test_a_tracing_shared_by_telemetries_with_other_slo_thresholds_raises_naming_the_fix() -> None:
    tracing = RequestTracing(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
    Telemetry(tracing=tracing)
    Telemetry(tracing=tracing)  # the same thresholds: the same instruments serve both
    registry = CollectorRegistry()
    with pytest.raises(ConfigurationError, match="its own RequestTracing"):
        Telemetry(registry=registry, policies=[SloPolicy(ttft_s=0.3)], tracing=tracing)
    assert list(registry.collect()) == []  # the refused telemetry left nothing registered
    Telemetry(registry=registry, policies=[SloPolicy(ttft_s=0.3)])  # so the registry takes a telemetry again


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"provider_name": ""}, "RequestTracing.provider_name"),
    ({"server_address": ""}, "RequestTracing.server_address"),
    ({"server_address": "h", "server_port": 0}, "RequestTracing.server_port"),
    ({"server_address": "h", "server_port": "80"}, "RequestTracing.server_port"),
    ({"server_port": 80}, "RequestTracing.server_port"),
    ({"itl_gaps": "yes"}, "RequestTracing.itl_gaps"),
])
def test_tracing_configuration_errors_raise_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field.replace(".", r"\.")):
        RequestTracing(**kwargs)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
@pytest.mark.parametrize("collector", ["closed_port", "silent"])
def test_a_dead_collector_never_reaches_the_server_and_shutdown_ends_within_seconds(protocol: str,
                                                                                   collector: str) -> None:
    """``closed_port``: nothing listens (connections refused). ``silent``: a socket accepts connections and
    never answers (the case that blocks for the SDK's default timeouts)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if collector == "closed_port":
        listener.close()
    else:
        listener.listen(64)
    try:
        export = OtlpExport(protocol=protocol, endpoint=f"http://127.0.0.1:{port}", timeout_s=0.5,
                            span_delay_s=0.05)
        tel = Telemetry(tracing=RequestTracing(tracer_provider=export.tracer_provider,
                                               meter_provider=export.meter_provider))
        for _ in range(20):
            _serve(tel)
        assert tel.guard.errors == {}
        t0 = time.monotonic()
        export.shutdown()
        elapsed = time.monotonic() - t0
    finally:
        listener.close()
    print(f"{protocol} {collector}: shutdown {elapsed:.2f} s")
    assert elapsed < 10, f"shutdown took {elapsed:.1f} s with the collector down"  # a sanity bound only


def _in_memory(**kwargs: Any) -> tuple[Telemetry, RequestTracing, InMemorySpanExporter, InMemoryMetricReader]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    tracing = RequestTracing(tracer_provider=provider, meter_provider=MeterProvider(metric_readers=[reader]),
                             **kwargs)
    return Telemetry(tracing=tracing), tracing, spans, reader


@pytest.mark.parametrize("itl_gaps", [False, True])
def test_the_request_span_carries_the_summarys_stream_figures_and_its_itl_gaps_only_when_asked(
        itl_gaps: bool) -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    summaries: list[dict[str, Any]] = []
    tel = Telemetry(tracing=RequestTracing(tracer_provider=provider, metrics=False, itl_gaps=itl_gaps),
                    sink=summaries.append, record_itl=True)
    t = tel.start("r1", model="m")
    t.schedule()
    for _ in range(4):
        t.commit()
    t.send(4)
    t.finish("stop")
    (summary,) = summaries
    (span,) = [s for s in spans.get_finished_spans() if s.name == "chat m"]
    attrs = dict(span.attributes or {})
    assert attrs["llmslo.last_token_s"] == summary["last_token_s"]
    assert attrs["llmslo.stream_paused_s"] == summary["stream_paused_s"] == 0.0
    assert attrs["llmslo.stream_max_queued"] == summary["stream_max_queued"] == 0
    assert len(summary["itl_s"]) == 3  # the telemetry records the gaps for its summaries either way
    if itl_gaps:
        assert list(attrs["llmslo.itl_s"]) == summary["itl_s"]
    else:
        assert "llmslo.itl_s" not in attrs  # a list per request only when asked: spans stay small


def test_prompt_and_output_text_are_never_recorded_unless_a_redaction_hook_is_given() -> None:
    tel, tracing, spans, _ = _in_memory()
    t = tel.start("r1", model="m")
    tracing.record_input(t, "my secret prompt")
    tracing.record_output(t, "the secret answer")
    t.finish("stop")
    assert all("secret" not in str(dict(s.attributes or {})) for s in spans.get_finished_spans())


def test_recorded_text_is_what_the_redaction_hook_returns_and_a_failing_hook_is_contained() -> None:
    def redact(kind: str, text: str) -> str | None:
        if kind == "output":
            raise RuntimeError("hook bug")
        return text.replace("4111-1111", "[card]")

    tel, tracing, spans, _ = _in_memory(redact_content=redact)
    t = tel.start("r1", model="m")
    tracing.record_input(t, "pay with 4111-1111")
    tracing.record_output(t, "done")
    t.finish("stop")
    (span,) = [s for s in spans.get_finished_spans() if s.name == "chat m"]
    attrs = dict(span.attributes or {})
    assert "[card]" in str(attrs["gen_ai.input.messages"]) and "4111" not in str(attrs)
    assert "gen_ai.output.messages" not in attrs
    assert tel.guard.errors == {"tracing.output": 1}


def test_phase_spans_are_children_of_the_request_span_inside_its_time_and_exemplars_carry_the_trace_id() -> None:
    tel, _, spans, reader = _in_memory()
    t = tel.start("r1", model="m", prompt_tokens=2)
    t.admit()
    t.schedule()
    t.commit()
    t.commit()
    t.finish("length")
    finished = {s.name: s for s in spans.get_finished_spans()}
    root = finished["chat m"]
    for name in ("llmslo.queue", "llmslo.prefill", "llmslo.decode"):
        child = finished[name]
        assert child.parent is not None and child.parent.span_id == root.context.span_id
        assert root.start_time is not None and root.end_time is not None
        assert child.start_time is not None and child.end_time is not None
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time
    assert t.trace_id() == format(root.context.trace_id, "032x")
    text, _ = render_metrics(tel.registry, "application/openmetrics-text;version=1.0.0")
    assert f'trace_id="{t.trace_id()}"' in text.decode()
    data = reader.get_metrics_data()
    assert data is not None
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert names == GENAI_METRICS


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"protocol": "http/json"}, "OtlpExport.protocol"),
    ({"timeout_s": 30}, "OtlpExport.timeout_s"),
    ({"endpoint": "127.0.0.1:4317"}, "OtlpExport.endpoint"),
    ({"span_delay_s": 0}, "OtlpExport.span_delay_s"),
])
def test_otlp_configuration_errors_raise_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field.replace(".", r"\.")):
        OtlpExport(**kwargs)


def test_a_bad_protocol_variable_raises_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ConfigurationError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        OtlpExport()


def test_importing_and_using_the_telemetry_without_tracing_loads_no_opentelemetry() -> None:
    code = (
        "import sys\n"
        "import llmslo.telemetry as t\n"
        "tel = t.Telemetry()\n"
        "r = tel.start('r', model='m'); r.commit(); r.finish('stop')\n"
        "t.render_metrics(tel.registry, '')\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('opentelemetry', 'grpc'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "", f"loaded: {out.stdout.strip()}"
