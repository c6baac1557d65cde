"""OpenTelemetry for the request lifecycle: a span per request and per phase, GenAI metric instruments, OTLP export.

Needs the ``otlp`` extra (``pip install 'llmslo[otlp]'``). Nothing here imports OpenTelemetry until a
:class:`RequestTracing` or an :class:`OtlpExport` is constructed, so ``import llmslo.telemetry`` stays free of it.

Spans. Each request gets one span, named ``"{operation} {model}"`` as the GenAI conventions name inference
spans (``chat llama-3-8b``), started at the request's arrival under whatever span is current (the server's
HTTP span, say) and ended at its terminal state. At the end it carries the GenAI attributes
(``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.response.id``,
``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``,
``error.type`` on failure) and ours under ``llmslo.*`` (request id, finish, reject and error reasons, the
intervals in seconds, the four token counts, tenant and SLO class, version). Its phases become child spans
``llmslo.queue`` (arrival to scheduled), ``llmslo.prefill`` (scheduled to first token) and ``llmslo.decode``
(first to last token), created at the terminal state from the recorded timestamps: nothing is traced per
token. Prompt and output text are never recorded unless ``redact_content`` is given; then every text passes
that hook first, and only what it returns is recorded (``gen_ai.input.messages``,
``gen_ai.output.messages``).

Metrics. The GenAI instruments, with explicit bucket advisories (the llmslo defaults, seconds; the
convention's token buckets): ``gen_ai.server.time_to_first_token``, ``gen_ai.server.time_per_output_token``,
``gen_ai.server.request.duration`` and ``gen_ai.client.token.usage`` (``gen_ai.token.type`` ``input`` or
``output``), with the model resolved under the telemetry's label policy so the series stay bounded.

Export. :class:`OtlpExport` builds tracer and meter providers that export over OTLP/gRPC or OTLP/HTTP, read
from the arguments or the standard ``OTEL_*`` variables, with every exporter timeout at most 2 seconds: a
dead collector costs the request path nothing (spans are queued and exported by a background thread) and
delays :meth:`OtlpExport.shutdown` by a few seconds at most. Note that ``force_flush`` of the SDK reports
success even when an export failed.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from llmslo.telemetry._buckets import DEFAULT_BUCKETS_S
from llmslo.telemetry._errors import ConfigurationError

if TYPE_CHECKING:
    from llmslo.telemetry._lifecycle import RequestTracker

INSTALL_HINT = "pip install 'llmslo[otlp]'"

TOKEN_USAGE_BUCKETS: tuple[int, ...] = tuple(4**i for i in range(14))
"""Bucket advisory of ``gen_ai.client.token.usage`` (tokens): 1, 4, 16, ... 67,108,864, as the convention advises."""

MAX_EXPORT_TIMEOUT_S = 2.0
"""The longest an exporter waits for the collector per export, seconds."""

PROTOCOLS: tuple[str, ...] = ("grpc", "http/protobuf")

ContentRedactor = Callable[[str, str], "str | None"]
"""``redact(kind, text)`` with kind ``"input"`` or ``"output"``: the text to record, or ``None`` to record nothing."""


def _import_otel() -> tuple[Any, Any]:
    try:
        from opentelemetry import metrics, trace
    except ImportError as exc:
        raise ConfigurationError(f"OpenTelemetry is not installed ({exc.name} missing): {INSTALL_HINT}") from None
    return trace, metrics


class RequestTracing:
    """The lifecycle's tracer: OpenTelemetry spans and GenAI metrics per request (see the module docstring).

    Pass it as ``Telemetry(tracing=RequestTracing(...))``.

    - ``tracer_provider``, ``meter_provider``: where spans and measurements go (an :class:`OtlpExport`'s, an
      in-memory one in tests); ``None`` takes OpenTelemetry's global provider (a no-op unless configured).
    - ``operation``: ``gen_ai.operation.name`` (``chat``, ``text_completion``, ``embeddings``, ...).
    - ``phase_spans``: child spans for queue, prefill and decode (else span events at the same instants).
    - ``metrics``: record the GenAI metric instruments.
    - ``redact_content``: ``None`` (the default) never records prompt or output text; a hook enables
      :meth:`record_input` and :meth:`record_output`, which record only what the hook returns.

    Raises :class:`ConfigurationError` when OpenTelemetry is not installed (with the install hint) or an
    argument is invalid.

    Example::

        export = OtlpExport(protocol="grpc", endpoint="http://127.0.0.1:4317")
        tel = Telemetry(tracing=RequestTracing(tracer_provider=export.tracer_provider,
                                               meter_provider=export.meter_provider))
        ...
        export.shutdown()
    """

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None, operation: str = "chat",
                 phase_spans: bool = True, metrics: bool = True,
                 redact_content: ContentRedactor | None = None) -> None:
        if not isinstance(operation, str) or not operation:
            raise ConfigurationError("RequestTracing.operation: must be a non-empty string, e.g. 'chat'")
        if redact_content is not None and not callable(redact_content):
            raise ConfigurationError("RequestTracing.redact_content: must be callable(kind, text) or None")
        trace, otel_metrics = _import_otel()
        from opentelemetry.trace import Status, StatusCode, set_span_in_context

        self._trace = trace
        self._status = Status
        self._error_code = StatusCode.ERROR
        self._in_context = set_span_in_context
        self.operation = operation
        self.phase_spans = phase_spans
        self.redact_content = redact_content
        self._tracer = trace.get_tracer("llmslo.telemetry", tracer_provider=tracer_provider)
        self._metrics = metrics
        self._metric_attrs: dict[tuple[str, str | None], dict[str, str]] = {}
        if metrics:
            meter = otel_metrics.get_meter("llmslo.telemetry", meter_provider=meter_provider)
            self._ttft = meter.create_histogram(
                "gen_ai.server.time_to_first_token", unit="s",
                description="Time to generate the first token for successful responses (server, seconds).",
                explicit_bucket_boundaries_advisory=list(DEFAULT_BUCKETS_S["ttft_s"]))
            self._tpot = meter.create_histogram(
                "gen_ai.server.time_per_output_token", unit="s",
                description="Time per output token generated after the first (server, seconds).",
                explicit_bucket_boundaries_advisory=list(DEFAULT_BUCKETS_S["tpot_s"]))
            self._duration = meter.create_histogram(
                "gen_ai.server.request.duration", unit="s",
                description="Generative AI server request duration: arrival to terminal state, seconds.",
                explicit_bucket_boundaries_advisory=list(DEFAULT_BUCKETS_S["e2e_s"]))
            self._tokens = meter.create_histogram(
                "gen_ai.client.token.usage", unit="{token}",
                description="Input and output tokens used per request.",
                explicit_bucket_boundaries_advisory=[float(b) for b in TOKEN_USAGE_BUCKETS])

    # ---- the Tracing protocol of the lifecycle ---------------------------------------------------------

    def start_request(self, tracker: RequestTracker) -> object:
        """Start the request's span at its arrival (under the current span, if any)."""
        return self._tracer.start_span(
            f"{self.operation} {tracker.model}",
            start_time=_unix_ns(tracker, tracker.arrival_ns),
            attributes={"gen_ai.operation.name": self.operation, "gen_ai.request.model": tracker.model,
                        "llmslo.request_id": tracker.request_id},
        )

    def trace_id(self, span: object) -> str | None:
        """The span's trace id (32 hex digits) when it is sampled, else ``None``."""
        ctx = span.get_span_context()  # type: ignore[attr-defined]
        if not ctx.is_valid or not ctx.trace_flags.sampled:
            return None
        return format(ctx.trace_id, "032x")

    def end_request(self, span: object, tracker: RequestTracker, row: Mapping[str, object],
                    tpot: float | None) -> None:
        """Set the request's attributes, add its phases, end its span and record its metrics."""
        s: Any = span
        finish_ns = tracker.finish_ns if tracker.finish_ns is not None else tracker.arrival_ns
        reason = row.get("finish_reason")
        error_type = row.get("error_type") if reason == "error" else None
        if s.is_recording():
            attrs: dict[str, Any] = {
                "gen_ai.response.model": tracker.model,
                "gen_ai.response.id": tracker.request_id,
                "gen_ai.response.finish_reasons": [str(reason)],
                "gen_ai.usage.input_tokens": row.get("prompt_tokens") or 0,
                "gen_ai.usage.output_tokens": row.get("generated_tokens") or 0,
                "llmslo.finish_reason": str(reason),
                "llmslo.version": tracker.version,
                "llmslo.tenant_class": tracker.tenant_class,
                "llmslo.slo_class": tracker.slo_class,
                "llmslo.prompt_tokens": row.get("prompt_tokens") or 0,
                "llmslo.proposed_tokens": row.get("proposed_tokens") or 0,
                "llmslo.generated_tokens": row.get("generated_tokens") or 0,
                "llmslo.sent_tokens": row.get("sent_tokens") or 0,
            }
            for key in ("queue_s", "ttft_s", "e2e_s", "client_ttft_s"):
                value = row.get(key)
                if isinstance(value, (int, float)):
                    attrs[f"llmslo.{key}"] = float(value)
            if tpot is not None:
                attrs["llmslo.tpot_s"] = tpot
            if row.get("reject_reason"):
                attrs["llmslo.reject_reason"] = str(row["reject_reason"])
            if error_type:
                attrs["error.type"] = str(error_type)
                attrs["llmslo.error_type"] = str(error_type)
                s.set_status(self._status(self._error_code, str(error_type)))
            s.set_attributes(attrs)
            self._phases(s, tracker)
        s.end(end_time=_unix_ns(tracker, finish_ns))
        if self._metrics:
            self._record_metrics(tracker, row, tpot, str(error_type) if error_type else None)

    # ---- content (opt-in) ------------------------------------------------------------------------------

    def record_input(self, tracker: RequestTracker, text: str) -> None:
        """Record the prompt text on the request's span, only if ``redact_content`` is set and returns text."""
        self._content(tracker, "input", text)

    def record_output(self, tracker: RequestTracker, text: str) -> None:
        """Record the output text on the request's span, only if ``redact_content`` is set and returns text."""
        self._content(tracker, "output", text)

    def _content(self, tracker: RequestTracker, kind: str, text: str) -> None:
        hook = self.redact_content
        span: Any = tracker.span
        if hook is None or span is None:
            return
        try:
            kept = hook(kind, text)
            if kept is None or not span.is_recording():
                return
            role = "user" if kind == "input" else "assistant"
            messages = [{"role": role, "parts": [{"type": "text", "content": str(kept)}]}]
            span.set_attribute(f"gen_ai.{kind}.messages", json.dumps(messages))
        except Exception as exc:
            tracker.record_error(f"tracing.{kind}", exc)

    # ---- internals -------------------------------------------------------------------------------------

    def _phases(self, span: Any, tracker: RequestTracker) -> None:
        times = tracker.timeline_ns()
        marks = [("llmslo.queue", times["arrival"], times["scheduled"]),
                 ("llmslo.prefill", times["scheduled"], times["first_token"]),
                 ("llmslo.decode", times["first_token"], times["last_token"])]
        finish = times["finish"]
        if self.phase_spans:
            ctx = self._in_context(span)
            for name, start, end in marks:
                if start is None or end is None or end < start or (finish is not None and end > finish):
                    continue
                child = self._tracer.start_span(name, context=ctx, start_time=_unix_ns(tracker, start))
                child.end(end_time=_unix_ns(tracker, end))
        else:
            for name, start, end in marks:
                if start is not None and end is not None and end >= start:
                    span.add_event(f"{name}.end", timestamp=_unix_ns(tracker, end))

    def _record_metrics(self, tracker: RequestTracker, row: Mapping[str, object], tpot: float | None,
                        error_type: str | None) -> None:
        model = tracker.exposed_model
        key = (model, error_type)
        attrs = self._metric_attrs.get(key)
        if attrs is None:
            attrs = {"gen_ai.operation.name": self.operation, "gen_ai.request.model": model}
            if error_type is not None:
                attrs["error.type"] = error_type[:64]
            if len(self._metric_attrs) >= 1024:
                self._metric_attrs.clear()
            self._metric_attrs[key] = attrs
        ttft, e2e = row.get("ttft_s"), row.get("e2e_s")
        if isinstance(ttft, float) and math.isfinite(ttft):
            self._ttft.record(ttft, attrs)
        if tpot is not None and math.isfinite(tpot):
            self._tpot.record(tpot, attrs)
        if isinstance(e2e, float) and math.isfinite(e2e):
            self._duration.record(e2e, attrs)
        if row.get("finish_reason") != "rejected":
            for token_type, column in (("input", "prompt_tokens"), ("output", "generated_tokens")):
                n = row.get(column)
                if isinstance(n, int):
                    self._tokens.record(n, {**attrs, "gen_ai.token.type": token_type})


def _unix_ns(tracker: RequestTracker, monotonic_ns: int) -> int:
    """A monotonic timestamp of ``tracker`` as Unix nanoseconds (anchored at its arrival)."""
    return round(tracker.arrival_unix_s * 1e9) + (monotonic_ns - tracker.arrival_ns)


class OtlpExport:
    """Tracer and meter providers exporting over OTLP, configured by arguments or the standard ``OTEL_*`` variables.

    - ``protocol``: ``"grpc"`` or ``"http/protobuf"``; default ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` /
      ``..._METRICS_PROTOCOL``, then ``OTEL_EXPORTER_OTLP_PROTOCOL``, then ``http/protobuf``.
    - ``endpoint``: the collector's base URL (``http://host:4318`` for HTTP, ``http://host:4317`` for gRPC;
      ``http://`` means no TLS); the HTTP signal paths ``/v1/traces`` and ``/v1/metrics`` are appended.
      Default: the exporters read ``OTEL_EXPORTER_OTLP_ENDPOINT`` and the per-signal variables.
    - ``headers``: sent with every export (default: ``OTEL_EXPORTER_OTLP_HEADERS``).
    - ``timeout_s``: per-export timeout, seconds, in (0, 2]; retries stop at it.
    - ``service_name``: the resource's ``service.name`` (default ``OTEL_SERVICE_NAME``, and the resource
      reads ``OTEL_RESOURCE_ATTRIBUTES``).
    - ``traces``, ``metrics``: which signals to export; ``span_delay_s`` is the longest a span waits in the
      batch queue (seconds), ``metric_interval_s`` the metric export period (seconds);
      ``max_queued_spans`` bounds the span queue (spans beyond it are dropped by the SDK, counted there).

    Raises :class:`ConfigurationError` naming the field (or with the install hint when the extra is missing).
    """

    def __init__(self, *, protocol: str | None = None, endpoint: str | None = None,
                 headers: Mapping[str, str] | None = None, timeout_s: float = MAX_EXPORT_TIMEOUT_S,
                 service_name: str | None = None, traces: bool = True, metrics: bool = True,
                 span_delay_s: float = 1.0, metric_interval_s: float = 10.0,
                 max_queued_spans: int = 2048) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
                0 < timeout_s <= MAX_EXPORT_TIMEOUT_S):
            raise ConfigurationError(
                f"OtlpExport.timeout_s: must be in (0, {MAX_EXPORT_TIMEOUT_S:g}] seconds, got {timeout_s!r}")
        for name, value in (("span_delay_s", span_delay_s), ("metric_interval_s", metric_interval_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigurationError(f"OtlpExport.{name}: must be a positive number of seconds, got {value!r}")
        if isinstance(max_queued_spans, bool) or not isinstance(max_queued_spans, int) or max_queued_spans < 1:
            raise ConfigurationError(f"OtlpExport.max_queued_spans: must be an integer >= 1, got {max_queued_spans!r}")
        if endpoint is not None and (not isinstance(endpoint, str) or "://" not in endpoint):
            raise ConfigurationError(
                f"OtlpExport.endpoint: give a URL such as http://127.0.0.1:4318, got {endpoint!r}")
        self.traces_protocol = _protocol(protocol, "TRACES")
        self.metrics_protocol = _protocol(protocol, "METRICS")
        self.endpoint = endpoint
        self.timeout_s = float(timeout_s)
        _import_otel()
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource

        resource = Resource.create({SERVICE_NAME: service_name} if service_name else {})
        self.tracer_provider: Any = None
        self.meter_provider: Any = None
        if traces:
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            self.tracer_provider = TracerProvider(resource=resource)
            span_exporter = self._exporter("traces", headers)
            self.tracer_provider.add_span_processor(BatchSpanProcessor(
                span_exporter, max_queue_size=max_queued_spans, schedule_delay_millis=span_delay_s * 1000,
                max_export_batch_size=min(512, max_queued_spans), export_timeout_millis=self.timeout_s * 1000))
        if metrics:
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            reader = PeriodicExportingMetricReader(
                self._exporter("metrics", headers), export_interval_millis=metric_interval_s * 1000,
                export_timeout_millis=self.timeout_s * 1000)
            self.meter_provider = MeterProvider(resource=resource, metric_readers=[reader])

    def _exporter(self, signal: str, headers: Mapping[str, str] | None) -> Any:
        protocol = self.traces_protocol if signal == "traces" else self.metrics_protocol
        kwargs: dict[str, Any] = {"timeout": self.timeout_s}
        if headers is not None:
            kwargs["headers"] = dict(headers)
        try:
            if protocol == "grpc":
                if self.endpoint is not None:
                    kwargs["endpoint"] = self.endpoint
                    kwargs["insecure"] = self.endpoint.startswith("http://")
                if signal == "traces":
                    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
                    return OTLPSpanExporter(**kwargs)
                from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
                return OTLPMetricExporter(**kwargs)
            if self.endpoint is not None:
                kwargs["endpoint"] = f"{self.endpoint.rstrip('/')}/v1/{signal}"
            if signal == "traces":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans
                return HttpSpans(**kwargs)
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics
            return HttpMetrics(**kwargs)
        except ImportError as exc:
            raise ConfigurationError(
                f"OtlpExport: the OTLP {protocol} exporter is not installed ({exc.name} missing): {INSTALL_HINT}"
            ) from None

    def force_flush(self) -> None:
        """Export what is pending now (each export bounded by ``timeout_s``). Success is not reported: the
        SDK says True even when the collector never got the data."""
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush(round(self.timeout_s * 1000))
        if self.meter_provider is not None:
            self.meter_provider.force_flush(round(self.timeout_s * 1000))

    def shutdown(self) -> None:
        """Flush and stop both providers; with the collector down it returns within a few seconds."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown(timeout_millis=self.timeout_s * 1000)


def _protocol(protocol: str | None, signal: str) -> str:
    field = "OtlpExport.protocol"
    if protocol is None:
        for var in (f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
            if os.environ.get(var):
                protocol, field = os.environ[var].strip(), var
                break
        else:
            protocol = "http/protobuf"
    if protocol not in PROTOCOLS:
        raise ConfigurationError(f"{field}: {protocol!r} is not supported; choose from {', '.join(PROTOCOLS)}")
    return protocol
