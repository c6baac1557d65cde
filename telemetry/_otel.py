"""OpenTelemetry for the request lifecycle: a span per request and per phase, GenAI metric instruments, OTLP export.

Needs the ``otlp`` extra (``pip install 'llmslo[otlp]'``). Nothing here imports OpenTelemetry until a
:class:`RequestTracing` or an :class:`OtlpExport` is constructed, so ``import llmslo.telemetry`` stays free of it.

Spans. Each request gets one span, named ``"{operation} {model}"`` as the GenAI conventions name inference
spans (``chat llama-3-8b``), started at the request's arrival under whatever span is current (the server's
HTTP span, say) and ended at its terminal state. Its kind is ``INTERNAL``, which the conventions allow for
a model served by the process that records it. It carries the GenAI attributes (``gen_ai.operation.name``,
``gen_ai.provider.name``, ``gen_ai.request.model``, ``server.address`` and ``server.port`` when configured,
from its start; at its end ``gen_ai.response.model``, ``gen_ai.response.id``,
``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``,
``error.type`` and an error status when the request ended in an error, see below) and ours under
``llmslo.*`` (request id, finish, reject and error reasons, the intervals in seconds, the four token counts,
tenant and SLO class, version, the stream's backpressure: ``llmslo.stream_paused_s`` and
``llmslo.stream_max_queued``, the backend a gateway chose, ``llmslo.backend``, and with ``itl_gaps=True`` the ITL
gaps as a list of doubles, ``llmslo.itl_s``, when the telemetry records them): every column of the request's
summary but the client's ``client_e2e_s``.
Its phases become child spans ``llmslo.queue`` (arrival to scheduled), ``llmslo.prefill`` (scheduled to first
token) and ``llmslo.decode`` (first to last token), created at the terminal state from the recorded
timestamps: nothing is traced per token. Prompt and output text are never recorded unless ``redact_content``
is given; then every text passes that hook first, and only what it returns is recorded
(``gen_ai.input.messages``, ``gen_ai.output.messages``).

Metrics. The GenAI model-server instruments and the token usage, each with the attributes its convention
defines: every one carries ``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model`` and
``gen_ai.response.model`` (the model as the telemetry's label policy exposes it, so the series stay
bounded) and ``server.address`` / ``server.port`` when configured.

- ``gen_ai.server.time_to_first_token`` and ``gen_ai.server.time_per_output_token`` (seconds): successful
  responses only (finish reason ``stop`` or ``length``, see :data:`SUCCESSFUL_FINISH_REASONS`); TPOT only
  for replies of more than one token.
- ``gen_ai.server.request.duration`` (seconds, arrival to terminal state): every request, with
  ``error.type`` when it ended in an error (see :data:`ERROR_FINISH_REASONS`): the request's ``error_type``
  for ``error``, its reject reason (``queue_full``, ``rate_limited``, ``circuit_open``, ``draining``) for
  ``rejected``, and ``deadline`` or ``server_draining`` for a stream the server ended. A client's cancel
  is not an error of the server. The only metric that carries ``error.type``.
- ``gen_ai.client.token.usage`` (``gen_ai.token.type`` ``input`` or ``output``): every request that was not
  rejected.

Bucket advisories are the convention's explicit bucket boundaries with every SLO threshold of the
telemetry's policies merged in (TTFT thresholds into TTFT, TPOT into TPOT, e2e into the request duration):
the one deviation from the convention, so that a bucket count answers "within the SLO" exactly, as
definitions.md requires of every histogram (see :func:`merged_bounds` and docs/conventions.md).

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
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llmslo.telemetry._errors import ConfigurationError

if TYPE_CHECKING:
    from llmslo.telemetry._lifecycle import RequestTracker, Telemetry

INSTALL_HINT = "pip install 'llmslo[otlp]'"

DEFAULT_PROVIDER_NAME = "llmslo"
"""Default ``gen_ai.provider.name``. The convention asks for the provider as the instrumentation best knows it
and treats the value as the discriminator of the provider-specific attributes that come with it: a
self-hosted server instrumented by llmslo sends llmslo's (``llmslo.*``), and no well-known value fits it.
A server that stands for a known provider passes ``provider_name`` (``openai``, ``aws.bedrock``, ...)."""

SUCCESSFUL_FINISH_REASONS: frozenset[str] = frozenset({"stop", "length"})
"""Finish reasons of a successful response: the ones TTFT and TPOT are recorded for, as the convention
defines those two metrics."""

ERROR_FINISH_REASONS: frozenset[str] = frozenset({"error", "rejected", "deadline", "server_draining"})
"""Finish reasons of a request that ended in an error of the server (``error.type`` on the request duration
and the span): it failed, was refused, or its stream was ended by the server. ``client_cancel`` is not one."""

GENAI_TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""Explicit bucket boundaries the convention advises for ``gen_ai.server.time_to_first_token``, seconds."""
GENAI_TPOT_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
"""Explicit bucket boundaries the convention advises for ``gen_ai.server.time_per_output_token``, seconds."""
GENAI_DURATION_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
"""Explicit bucket boundaries the convention advises for ``gen_ai.server.request.duration``, seconds."""
TOKEN_USAGE_BUCKETS: tuple[int, ...] = tuple(4**i for i in range(14))
"""Bucket advisory of ``gen_ai.client.token.usage`` (tokens): 1, 4, 16, ... 67,108,864, as the convention advises."""

_CONVENTION_BOUNDS: dict[str, tuple[float, ...]] = {
    "ttft": GENAI_TTFT_BUCKETS_S, "tpot": GENAI_TPOT_BUCKETS_S, "duration": GENAI_DURATION_BUCKETS_S}
_THRESHOLDS_OF: dict[str, str] = {"ttft": "ttft_s", "tpot": "tpot_s", "duration": "e2e_s"}
"""Which SLO threshold (a :meth:`SloPolicy.thresholds` key) each latency instrument's bounds take in."""

MAX_EXPORT_TIMEOUT_S = 2.0
"""The longest an exporter waits for the collector per export, seconds."""

PROTOCOLS: tuple[str, ...] = ("grpc", "http/protobuf")

ContentRedactor = Callable[[str, str], "str | None"]
"""``redact(kind, text)`` with kind ``"input"`` or ``"output"``: the text to record, or ``None`` to record nothing."""


def merged_bounds(convention: Sequence[float], thresholds: Iterable[float]) -> tuple[float, ...]:
    """The ``convention``'s bucket bounds with each of ``thresholds`` (seconds) added, sorted; a threshold
    already a bound (within 1e-12 s) adds nothing."""
    bounds = [float(b) for b in convention]
    for t in thresholds:
        if not any(math.isclose(t, b, rel_tol=0, abs_tol=1e-12) for b in bounds):
            bounds.append(float(t))
    return tuple(sorted(bounds))


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
    - ``provider_name``: ``gen_ai.provider.name`` on every span and metric (default
      :data:`DEFAULT_PROVIDER_NAME`, ``llmslo``).
    - ``server_address``, ``server_port``: ``server.address`` and ``server.port`` on every span and metric,
      the address clients reach this server at (host name or IP, and TCP port 1-65535); left out when
      ``None``. A port needs the address.
    - ``phase_spans``: child spans for queue, prefill and decode (else span events at the same instants).
    - ``itl_gaps``: also put the request's ITL gaps on its span (``llmslo.itl_s``, a list of doubles) when the
      telemetry records them (``Telemetry(record_itl=True)``), so that summaries built from spans (the OTLP
      route into ClickHouse) hold them too. Off by default: OTLP encodes each gap in 11 bytes (a double and
      its framing), and some tracing backends truncate or drop large attributes.
    - ``metrics``: record the GenAI metric instruments. They are created when a :class:`Telemetry` takes
      this tracing, their bucket advisories merged with that telemetry's SLO thresholds (module docstring).
    - ``redact_content``: ``None`` (the default) never records prompt or output text; a hook enables
      :meth:`record_input` and :meth:`record_output`, which record only what the hook returns.

    Raises :class:`ConfigurationError` when OpenTelemetry is not installed (with the install hint) or an
    argument is invalid.

    Example::

        export = OtlpExport(protocol="grpc", endpoint="http://127.0.0.1:4317")
        tel = Telemetry(tracing=RequestTracing(tracer_provider=export.tracer_provider,
                                               meter_provider=export.meter_provider,
                                               server_address="llm.example.com", server_port=443))
        ...
        export.shutdown()
    """

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None, operation: str = "chat",
                 provider_name: str = DEFAULT_PROVIDER_NAME, server_address: str | None = None,
                 server_port: int | None = None, phase_spans: bool = True, metrics: bool = True,
                 redact_content: ContentRedactor | None = None, itl_gaps: bool = False) -> None:
        if not isinstance(operation, str) or not operation:
            raise ConfigurationError("RequestTracing.operation: must be a non-empty string, e.g. 'chat'")
        if not isinstance(provider_name, str) or not provider_name:
            raise ConfigurationError(
                f"RequestTracing.provider_name: must be a non-empty string, e.g. 'llmslo', got {provider_name!r}")
        if server_address is not None and (not isinstance(server_address, str) or not server_address):
            raise ConfigurationError(
                f"RequestTracing.server_address: give a host name or IP address, or None; got {server_address!r}")
        if server_port is not None:
            if isinstance(server_port, bool) or not isinstance(server_port, int) or not 1 <= server_port <= 65535:
                raise ConfigurationError(
                    f"RequestTracing.server_port: must be an integer in 1..65535 or None, got {server_port!r}")
            if server_address is None:
                raise ConfigurationError("RequestTracing.server_port: given without server_address; give both")
        if redact_content is not None and not callable(redact_content):
            raise ConfigurationError("RequestTracing.redact_content: must be callable(kind, text) or None")
        if not isinstance(itl_gaps, bool):
            raise ConfigurationError(f"RequestTracing.itl_gaps: must be True or False, got {itl_gaps!r}")
        trace, otel_metrics = _import_otel()
        from opentelemetry.trace import Status, StatusCode, set_span_in_context

        self._trace = trace
        self._status = Status
        self._error_code = StatusCode.ERROR
        self._in_context = set_span_in_context
        self.operation = operation
        self.provider_name = provider_name
        self.server_address = server_address
        self.server_port = server_port
        self.phase_spans = phase_spans
        self.itl_gaps = itl_gaps
        self.redact_content = redact_content
        self._tracer = trace.get_tracer("llmslo.telemetry", tracer_provider=tracer_provider)
        self._metrics = metrics
        self._meter: Any = (otel_metrics.get_meter("llmslo.telemetry", meter_provider=meter_provider)
                            if metrics else None)
        self._instrument_lock = threading.Lock()
        self._bounds: dict[str, tuple[float, ...]] | None = None
        self._base_attrs: dict[str, str | int] = {"gen_ai.operation.name": operation,
                                                  "gen_ai.provider.name": provider_name}
        if server_address is not None:
            self._base_attrs["server.address"] = server_address
            if server_port is not None:
                self._base_attrs["server.port"] = server_port
        # per (exposed model, error type): the attributes of TTFT/TPOT, of the duration, of the token usage
        self._metric_attrs: dict[tuple[str, str | None], tuple[dict[str, str | int], dict[str, str | int],
                                                               dict[str, dict[str, str | int]]]] = {}

    def attach(self, telemetry: Telemetry) -> None:
        """Called by :class:`Telemetry` when it takes this tracing: create the metric instruments, their bucket
        advisories merged with the telemetry's SLO thresholds. A second telemetry whose thresholds are all
        bounds already shares the instruments; one with another threshold raises :class:`ConfigurationError`
        (an instrument's bounds are fixed when it is created)."""
        if not self._metrics:
            return
        thresholds = [p.thresholds() for p in telemetry.policies.values()]
        wanted = {key: merged_bounds(_CONVENTION_BOUNDS[key], [t[field] for t in thresholds if field in t])
                  for key, field in _THRESHOLDS_OF.items()}
        with self._instrument_lock:
            if self._bounds is None:
                self._create_instruments(wanted)
                return
            for key, bounds in wanted.items():
                if merged_bounds(self._bounds[key], bounds) != self._bounds[key]:
                    raise ConfigurationError(
                        f"Telemetry.tracing: this RequestTracing already serves a Telemetry whose SLO thresholds "
                        f"lack {', '.join(f'{b:g}' for b in bounds if b not in self._bounds[key])} s ({key}); "
                        "give each Telemetry its own RequestTracing")

    def _create_instruments(self, bounds: dict[str, tuple[float, ...]]) -> None:
        """Create the four instruments with these latency bounds (seconds); the caller holds the lock."""
        meter = self._meter
        self._ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token", unit="s",
            description="Time to generate the first token for successful responses (server, seconds).",
            explicit_bucket_boundaries_advisory=list(bounds["ttft"]))
        self._tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token", unit="s",
            description="Time per output token generated after the first token for successful responses "
                        "(server, seconds).",
            explicit_bucket_boundaries_advisory=list(bounds["tpot"]))
        self._duration = meter.create_histogram(
            "gen_ai.server.request.duration", unit="s",
            description="Generative AI server request duration: arrival to terminal state, seconds.",
            explicit_bucket_boundaries_advisory=list(bounds["duration"]))
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Input and output tokens used per request.",
            explicit_bucket_boundaries_advisory=[float(b) for b in TOKEN_USAGE_BUCKETS])
        self._bounds = bounds

    # ---- the Tracing protocol of the lifecycle ---------------------------------------------------------

    def start_request(self, tracker: RequestTracker) -> object:
        """Start the request's span at its arrival (under the current span, if any)."""
        return self._tracer.start_span(
            f"{self.operation} {tracker.model}",
            start_time=_unix_ns(tracker, tracker.arrival_ns),
            attributes={**self._base_attrs, "gen_ai.request.model": tracker.model,
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
        error_type = _error_type(row)
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
            for key in ("queue_s", "ttft_s", "last_token_s", "e2e_s", "client_ttft_s", "stream_paused_s"):
                value = row.get(key)
                if isinstance(value, (int, float)):
                    attrs[f"llmslo.{key}"] = float(value)
            if tpot is not None:
                attrs["llmslo.tpot_s"] = tpot
            queued = row.get("stream_max_queued")
            attrs["llmslo.stream_max_queued"] = queued if isinstance(queued, int) else 0
            gaps = row.get("itl_s")
            if self.itl_gaps and isinstance(gaps, (list, tuple)) and gaps:  # recorded only with record_itl
                attrs["llmslo.itl_s"] = [float(g) for g in gaps]
            if row.get("reject_reason"):
                attrs["llmslo.reject_reason"] = str(row["reject_reason"])
            if row.get("backend"):
                attrs["llmslo.backend"] = str(row["backend"])
            if error_type is not None:
                attrs["error.type"] = error_type
                if reason == "error":
                    attrs["llmslo.error_type"] = error_type
                s.set_status(self._status(self._error_code, error_type))
            s.set_attributes(attrs)
            self._phases(s, tracker)
        s.end(end_time=_unix_ns(tracker, finish_ns))
        if self._metrics:
            self._record_metrics(tracker, row, tpot, error_type)

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
        if self._bounds is None:  # used without a Telemetry taking it: the convention's bounds alone
            with self._instrument_lock:
                if self._bounds is None:
                    self._create_instruments(dict(_CONVENTION_BOUNDS))
        model = tracker.exposed_model
        key = (model, error_type)
        cached = self._metric_attrs.get(key)
        if cached is None:
            common = {**self._base_attrs, "gen_ai.request.model": model, "gen_ai.response.model": model}
            duration = common if error_type is None else {**common, "error.type": error_type}
            tokens = {t: {**common, "gen_ai.token.type": t} for t in ("input", "output")}
            if len(self._metric_attrs) >= 1024:
                self._metric_attrs.clear()
            cached = self._metric_attrs[key] = (common, duration, tokens)
        common, duration, tokens = cached
        reason = row.get("finish_reason")
        if reason in SUCCESSFUL_FINISH_REASONS:
            ttft = row.get("ttft_s")
            if isinstance(ttft, float) and math.isfinite(ttft):
                self._ttft.record(ttft, common)
            if tpot is not None and math.isfinite(tpot):
                self._tpot.record(tpot, common)
        e2e = row.get("e2e_s")
        if isinstance(e2e, float) and math.isfinite(e2e):
            self._duration.record(e2e, duration)
        if reason != "rejected":
            for token_type, column in (("input", "prompt_tokens"), ("output", "generated_tokens")):
                n = row.get(column)
                if isinstance(n, int):
                    self._tokens.record(n, tokens[token_type])


def _error_type(row: Mapping[str, object]) -> str | None:
    """The ``error.type`` of a finished request (see :data:`ERROR_FINISH_REASONS`), at most 64 characters, or
    ``None`` when it did not end in an error."""
    reason = row.get("finish_reason")
    if reason not in ERROR_FINISH_REASONS:
        return None
    if reason == "error":
        value = row.get("error_type")
    elif reason == "rejected":
        value = row.get("reject_reason")
    else:
        value = reason
    return str(value)[:64] if value else "_OTHER"


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
