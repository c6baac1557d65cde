"""An ASGI middleware that observes the OpenAI-compatible routes of any Python LLM server.

It sits between the ASGI server (uvicorn, hypercorn) and the app (vLLM, SGLang, llama-cpp-python, any
FastAPI or Starlette app), reads what the app hands to the server and records each request through
:class:`Telemetry`, as a server instrumented by hand would: one tracker per request, its terminal state, one
summary row to the sink, the metrics of the name catalogue with ``request_id`` exemplars. Standard library
and prometheus-client only; no web framework is imported.

What it measures (server clock: ``time.monotonic_ns`` in the server process):

- **arrival**: the middleware is called with the request (before the app reads its body);
- **TTFT**: the first content chunk the app hands to the ASGI server (a chunk whose first choice carries
  text, as :mod:`llmslo.telemetry._openai_stream` defines it); the server writes it to the socket after, so
  this TTFT is at most the client's;
- **token commits**: one per content chunk, at the moment the app hands it over, of the tokens ``usage``
  says it carries where a chunk carries cumulative ``usage`` (vLLM's ``continuous_usage_stats``), else one;
  tokens the final ``usage`` counts beyond the chunks are committed with the ``usage`` chunk; a non-streamed
  reply is one commit of ``usage.completion_tokens`` when the reply is handed over;
- **prompt tokens** from ``usage``; the **finish reason** from the reply (:func:`classify_finish`); an error
  event (``{"error": {...}}``) ends the request ``server_draining``, ``deadline`` or ``error``/``stream_error``;
  a stream that completes with neither is ``error``/``truncated``;
- **client disconnect**: an ``http.disconnect`` the app receives before the response completed, or a send
  that fails, is ``client_cancel`` (the middleware sees what the app receives: Starlette, FastAPI, vLLM and
  SGLang listen for it while streaming);
- **refusals and errors**: a status >= 400 is ``rejected`` (429 and 503 whose body's ``error.type`` is one of
  llmslo's reject reasons take it; any other 429 is ``rate_limited``; ``Retry-After`` is observed), a body
  whose ``error.type`` is ``deadline`` is ``deadline``, any other status is ``error`` with ``http_<status>``;
  an exception raised by the app is ``error`` with the exception's class name.

The request id is the incoming ``X-Request-Id`` (the header name is configurable) when it is 1 to 128
characters of ``A-Z a-z 0-9 . _ : -``, else a new UUID4; the app sees the id in that header (added when the
request had none), and the response carries it as ``X-Request-Id``.

It never breaks the app: any exception inside the middleware is counted on
``llmslo_internal_errors_total`` (the telemetry's guard) and the request goes on untouched, its summary then
ending ``error``/``middleware_error``. Routes it does not observe pass through with one dictionary lookup.
Memory per request is bounded: an error body is kept up to ``MAX_ERROR_BODY_BYTES``, a non-streamed
reply up to ``MAX_REPLY_BYTES`` (``_reply_observer.py``), a streamed event up to the parser's limit.

Configuration comes from the arguments, else from ``LLMSLO_*`` environment variables (:data:`ENVIRONMENT`),
else the defaults: ``vllm serve --middleware llmslo.telemetry.LlmsloMiddleware`` adds the class with no
arguments. Without a ``telemetry`` argument a process-wide one is made on first use
(:func:`default_telemetry`) from the environment: its summaries go to ``LLMSLO_SUMMARY_PATH`` (JSONL,
flushed when the app's lifespan shuts down, else at exit), its metrics to ``LLMSLO_METRICS_PORT`` and/or the
app's ``LLMSLO_METRICS_PATH`` (default ``/llmslo/metrics``). ``docs/middleware.md`` shows the installation
into each engine.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import re
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeGuard

from llmslo.telemetry._durations import parse_duration
from llmslo.telemetry._errors import ConfigurationError
from llmslo.telemetry._exposition import MetricsServer, metrics_app
from llmslo.telemetry._lifecycle import RequestTracker, Telemetry
from llmslo.telemetry._policy import DEFAULT_TPOT_S, DEFAULT_TTFT_S, SloPolicy
from llmslo.telemetry._reply_observer import ReplyObserver
from llmslo.telemetry._sink import JsonlWriter, SummarySink

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOGGER = logging.getLogger("llmslo.telemetry")

DEFAULT_ROUTES: tuple[str, ...] = ("/v1/completions", "/v1/chat/completions")
"""The routes observed unless configured otherwise (POST only)."""
DEFAULT_METRICS_PATH = "/llmslo/metrics"
"""Where the middleware serves the process-wide telemetry's metrics in the app, unless configured otherwise."""
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""The incoming request ids taken as they are, here, by ``llmslo serve`` and by the gateway (see
:func:`valid_request_id`; each replaces any other by a new id)."""
MAX_TENANT_CHARS = 64
"""The longest tenant class taken from the tenant header (the rest is cut)."""
_HEADER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

ENVIRONMENT: dict[str, str] = {
    "LLMSLO_MODEL": "the model label of every request (default: unknown)",
    "LLMSLO_VERSION": "the server or model version in every summary (default: unknown)",
    "LLMSLO_ROUTES": "comma-separated paths to observe (default: /v1/completions,/v1/chat/completions)",
    "LLMSLO_REQUEST_ID_HEADER": "the request-id header read, added and echoed (default: x-request-id)",
    "LLMSLO_TENANT_HEADER": "a header whose value is the request's tenant class (default: none: 'default')",
    "LLMSLO_METRICS_PATH": "where the app answers with the metrics (default: /llmslo/metrics with the "
                           "process-wide telemetry; 'off' for none)",
    "LLMSLO_METRICS_PORT": "a stand-alone /metrics server on this port (default: none)",
    "LLMSLO_METRICS_HOST": "the address of that server (default: 127.0.0.1)",
    "LLMSLO_METRICS_REGISTRY": "'own' (default) or 'global': prometheus-client's default registry, so an "
                               "app's own /metrics shows llmslo's series too",
    "LLMSLO_SUMMARY_PATH": "a folder for the request summaries as rotated JSONL files (default: none kept)",
    "LLMSLO_SLO_TTFT": "the TTFT objective of the goodput counters, e.g. 2s, 500ms, or 'off' (default: 2s)",
    "LLMSLO_SLO_TPOT": "the TPOT objective of the goodput counters, e.g. 100ms, or 'off' (default: 100ms)",
}
"""Every environment variable the middleware reads, and what it sets."""


def valid_request_id(value: str | None) -> TypeGuard[str]:
    """Whether ``value`` is a request id to take as it is: 1 to 128 characters of ``A-Z a-z 0-9 . _ : -``
    (:data:`REQUEST_ID`). None, the header being absent, is not."""
    return value is not None and REQUEST_ID.fullmatch(value) is not None


@dataclass(frozen=True)
class MiddlewareConfig:
    """The middleware's settings; :meth:`from_env` reads them from the ``LLMSLO_*`` variables.

    ``version`` ``None`` means the telemetry's (the process-wide one's is ``unknown``); ``metrics_path``
    ``None`` means the default (``/llmslo/metrics`` with the process-wide telemetry, none with
    one passed in); ``""`` means none. Raises :class:`ConfigurationError` naming the field for a bad value.
    """

    model: str = "unknown"
    version: str | None = None
    routes: tuple[str, ...] = DEFAULT_ROUTES
    request_id_header: str = "x-request-id"
    tenant_header: str | None = None
    metrics_path: str | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_registry: str = "own"
    summary_path: str | None = None
    slo_ttft_s: float | None = DEFAULT_TTFT_S
    slo_tpot_s: float | None = DEFAULT_TPOT_S

    def __post_init__(self) -> None:
        for name in ("model", "version", "metrics_host"):
            value = getattr(self, name)
            if value is None and name == "version":
                continue
            if not isinstance(value, str) or not value:
                raise ConfigurationError(f"MiddlewareConfig.{name}: must be a non-empty string, got {value!r}")
        if isinstance(self.routes, str) or not self.routes or not all(
                isinstance(r, str) and r.startswith("/") for r in self.routes):
            raise ConfigurationError(f"MiddlewareConfig.routes: paths starting with '/', got {self.routes!r}")
        object.__setattr__(self, "routes", tuple(self.routes))
        for name in ("request_id_header", "tenant_header"):
            value = getattr(self, name)
            if value is None and name == "tenant_header":
                continue
            if not isinstance(value, str) or not _HEADER_NAME.fullmatch(value):
                raise ConfigurationError(f"MiddlewareConfig.{name}: a header name (letters, digits, '-', '_'), "
                                         f"got {value!r}")
            object.__setattr__(self, name, value.lower())
        path = self.metrics_path
        if path is not None and path != "" and (not isinstance(path, str) or not path.startswith("/")):
            raise ConfigurationError(f"MiddlewareConfig.metrics_path: a path starting with '/' (or '' for none), "
                                     f"got {path!r}")
        port = self.metrics_port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
            raise ConfigurationError(f"MiddlewareConfig.metrics_port: a port number 0..65535, got {port!r}")
        if self.metrics_registry not in ("own", "global"):
            raise ConfigurationError(f"MiddlewareConfig.metrics_registry: 'own' or 'global', got "
                                     f"{self.metrics_registry!r}")
        if self.summary_path is not None and (not isinstance(self.summary_path, str) or not self.summary_path):
            raise ConfigurationError(f"MiddlewareConfig.summary_path: a folder, got {self.summary_path!r}")
        SloPolicy(ttft_s=self.slo_ttft_s, tpot_s=self.slo_tpot_s)  # raises for a bad objective

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> tuple[MiddlewareConfig, list[str]]:
        """The configuration the ``LLMSLO_*`` variables of ``environ`` (default ``os.environ``) give, and a
        message for each variable whose value was refused (its default is used instead)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        problems: list[str] = []
        for var, (name, parse) in _ENV_FIELDS.items():
            raw = env.get(var)
            if raw is None or raw.strip() == "":
                continue
            try:
                value = parse(raw.strip())
                cls(**{name: value})  # checks this one field alone
            except (ValueError, ConfigurationError) as exc:
                problems.append(f"{var}={raw!r} ignored: {exc}")
                continue
            values[name] = value
        return cls(**values), problems


def _off_or_duration(text: str) -> float | None:
    return None if text.lower() in ("off", "none") else parse_duration(text)


def _port(text: str) -> int:
    return int(text)


def _routes(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _metrics_path(text: str) -> str:
    return "" if text.lower() in ("off", "none") else text


def _text(text: str) -> str:
    return text


_ENV_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "LLMSLO_MODEL": ("model", _text),
    "LLMSLO_VERSION": ("version", _text),
    "LLMSLO_ROUTES": ("routes", _routes),
    "LLMSLO_REQUEST_ID_HEADER": ("request_id_header", _text),
    "LLMSLO_TENANT_HEADER": ("tenant_header", _text),
    "LLMSLO_METRICS_PATH": ("metrics_path", _metrics_path),
    "LLMSLO_METRICS_PORT": ("metrics_port", _port),
    "LLMSLO_METRICS_HOST": ("metrics_host", _text),
    "LLMSLO_METRICS_REGISTRY": ("metrics_registry", str.lower),
    "LLMSLO_SUMMARY_PATH": ("summary_path", _text),
    "LLMSLO_SLO_TTFT": ("slo_ttft_s", _off_or_duration),
    "LLMSLO_SLO_TPOT": ("slo_tpot_s", _off_or_duration),
}
assert set(_ENV_FIELDS) == set(ENVIRONMENT) and {f for f, _ in _ENV_FIELDS.values()} == {
    f.name for f in fields(MiddlewareConfig)}


# ---- the process-wide telemetry ----------------------------------------------------------------------------


@dataclass
class _Default:
    telemetry: Telemetry
    config: MiddlewareConfig
    sink: SummarySink | None
    server: MetricsServer | None
    closed: bool = False


_DEFAULT: _Default | None = None
_DEFAULT_LOCK = threading.Lock()
SINK_CLOSE_S = 5.0
"""At exit, the longest wait for the process-wide telemetry's last summaries (seconds)."""


def default_telemetry() -> Telemetry:
    """The process-wide telemetry of the middleware, made on first use from the ``LLMSLO_*`` environment.

    Its summaries go to ``LLMSLO_SUMMARY_PATH`` (rotated JSONL files; flushed at exit), its metrics to a
    stand-alone server on ``LLMSLO_METRICS_PORT`` when set (a port in use, as with several worker processes
    on one port, is logged and counted, never raised) and, through the middleware, to the app's
    ``LLMSLO_METRICS_PATH``. A refused variable is logged, counted on ``llmslo_internal_errors_total`` and
    replaced by its default.
    """
    return _default().telemetry


def _default() -> _Default:
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = _make_default()
        return _DEFAULT


def _make_default() -> _Default:
    config, problems = MiddlewareConfig.from_env()
    registry = None
    if config.metrics_registry == "global":
        from prometheus_client import REGISTRY
        registry = REGISTRY
    sink = None
    if config.summary_path is not None:
        sink = SummarySink(JsonlWriter(config.summary_path))
    tel = Telemetry(registry=registry, policies=[SloPolicy(ttft_s=config.slo_ttft_s, tpot_s=config.slo_tpot_s)],
                    version=config.version or "unknown", sink=sink)
    for problem in problems:
        tel.guard.error("middleware.environment", ConfigurationError(problem))
    server = None
    if config.metrics_port is not None:
        try:
            server = MetricsServer(tel.registry, port=config.metrics_port, host=config.metrics_host)
            LOGGER.info("llmslo: metrics on %s", server.url)
        except OSError as exc:
            tel.guard.error("middleware.metrics_port", OSError(
                f"LLMSLO_METRICS_PORT={config.metrics_port}: {exc} (several worker processes? use "
                "LLMSLO_METRICS_PATH, served by each)"))
    default = _Default(tel, config, sink, server)
    atexit.register(_close_default, default)
    return default


def _close_default(default: _Default) -> None:
    """Flush and close the process-wide telemetry's sink and stop its metrics server (once)."""
    with _DEFAULT_LOCK:
        if default.closed:
            return
        default.closed = True
    if default.sink is not None:
        default.sink.close(timeout_s=SINK_CLOSE_S)
    if default.server is not None:
        default.server.stop()


def _lifespan_send(send: Send) -> Send:
    """``send`` of the app's lifespan: once the app has shut down, the process-wide telemetry's sink is flushed
    and closed (uvicorn then re-raises SIGTERM, so no exit handler would run)."""

    async def wrapped(message: Message) -> None:
        if message.get("type") in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            default = _DEFAULT
            if default is not None:
                try:
                    await asyncio.to_thread(_close_default, default)
                except Exception as exc:
                    default.telemetry.guard.error("middleware.shutdown", exc)
        await send(message)

    return wrapped


def _reset_default() -> None:
    """Close and forget the process-wide telemetry (tests)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        default, _DEFAULT = _DEFAULT, None
    if default is not None:
        atexit.unregister(_close_default)
        _close_default(default)
        if default.config.metrics_registry == "global":
            default.telemetry.registry.unregister(default.telemetry.metrics)


# ---- the middleware ------------------------------------------------------------------------------------------


class LlmsloMiddleware:
    """ASGI middleware recording each request to an OpenAI-compatible route (see the module docstring).

    Every keyword is optional; one left out comes from its ``LLMSLO_*`` variable, else its default:

    - ``telemetry``: the :class:`Telemetry` to record into (default: :func:`default_telemetry`);
    - ``model``: the model label (``LLMSLO_MODEL``); ``version``: the version in each summary
      (``LLMSLO_VERSION``; default: the telemetry's);
    - ``routes``: the paths observed, POST only (``LLMSLO_ROUTES``);
    - ``request_id_header`` (``LLMSLO_REQUEST_ID_HEADER``), ``tenant_header`` (``LLMSLO_TENANT_HEADER``);
    - ``metrics_path``: where the middleware answers with the telemetry's metrics (``LLMSLO_METRICS_PATH``;
      ``""`` for none; default ``/llmslo/metrics`` with the process-wide telemetry, none otherwise).

    Raises :class:`ConfigurationError` for a bad argument (a bad variable is logged and counted instead).

    Example (FastAPI or Starlette)::

        app.add_middleware(LlmsloMiddleware, telemetry=tel, model="llama-3-8b")
    """

    def __init__(self, app: ASGIApp, *, telemetry: Telemetry | None = None, model: str | None = None,
                 version: str | None = None, routes: Sequence[str] | None = None,
                 request_id_header: str | None = None, tenant_header: str | None = None,
                 metrics_path: str | None = None) -> None:
        self.app = app
        env, problems = MiddlewareConfig.from_env()
        given = {k: v for k, v in (("model", model), ("version", version), ("routes", routes),
                                   ("request_id_header", request_id_header), ("tenant_header", tenant_header),
                                   ("metrics_path", metrics_path)) if v is not None}
        base = {f.name: getattr(env, f.name) for f in fields(MiddlewareConfig)}
        config = MiddlewareConfig(**{**base, **given})
        own = self._own = telemetry is None
        self.telemetry = telemetry if telemetry is not None else default_telemetry()
        if not own:
            for problem in problems:
                self.telemetry.guard.error("middleware.environment", ConfigurationError(problem))
        self.config = config
        self.model = config.model
        self.version = config.version  # None: the telemetry's
        self.routes = frozenset(config.routes)
        self._rid_name = config.request_id_header.encode("latin-1")
        self._tenant_name = config.tenant_header.encode("latin-1") if config.tenant_header else None
        path = config.metrics_path
        if path is None:
            path = DEFAULT_METRICS_PATH if own else ""
        self.metrics_path: str | None = path or None
        self._metrics = metrics_app(self.telemetry.registry) if self.metrics_path else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan" and self._own:
                send = _lifespan_send(send)
            await self.app(scope, receive, send)
            return
        path = scope.get("path")
        if path not in self.routes:
            if path == self.metrics_path and self._metrics is not None:
                await self._metrics(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        if scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        ex: _Exchange | None = None
        try:
            ex, scope = self._begin(scope, receive, send)
        except Exception as exc:
            self.telemetry.guard.error("middleware.start", exc)
        if ex is None:
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, ex.receive, ex.send)
        except BaseException as exc:
            ex.raised(exc)
            raise
        ex.returned()

    def _begin(self, scope: Scope, receive: Receive, send: Send) -> tuple[_Exchange, Scope]:
        """A tracker for a request arriving now, and the scope the app gets (the request id added when the
        request had none)."""
        found: str | None = None
        tenant = "default"
        name, tenant_name = self._rid_name, self._tenant_name
        headers = scope.get("headers") or ()
        for key, value in headers:
            if key == name:
                found = bytes(value).decode("latin-1")
            elif key == tenant_name:
                tenant = bytes(value).decode("latin-1")[:MAX_TENANT_CHARS]
        present = found is not None
        rid = found if valid_request_id(found) else str(uuid.uuid4())
        t = self.telemetry.start(rid, model=self.model, version=self.version, tenant_class=tenant)
        try:
            t.admit()
            encoded = rid.encode("latin-1")
            if not present:
                scope = {**scope, "headers": [*headers, (name, encoded)]}
            return _Exchange(self, t, encoded, receive, send), scope
        except BaseException:
            t.finish("error", error_type="middleware_error")  # never left in flight
            raise


class _Exchange:
    """One observed request: wraps the app's ``receive`` and ``send``, feeds the tracker through a
    :class:`ReplyObserver`."""

    __slots__ = ("_count_sent", "_plain", "_receive", "_send", "completed", "disconnected", "ending", "mw", "obs",
                 "off", "rid", "send_failed", "started", "t")

    def __init__(self, mw: LlmsloMiddleware, t: RequestTracker, rid: bytes, receive: Receive, send: Send) -> None:
        self.mw = mw
        self.t = t
        self.rid = rid
        self._receive = receive
        self._send = send
        self._count_sent = t.send
        self.obs = ReplyObserver(t, mw.telemetry.observe_retry_after)
        self._plain = self.obs.plain
        self.started = self.completed = self.ending = False
        self.disconnected = self.send_failed = self.off = False

    # ---- what the app receives -------------------------------------------------------------------------

    async def receive(self) -> Message:
        message = await self._receive()
        if not self.completed and not self.off:
            try:
                if message["type"] == "http.disconnect":
                    self.disconnected = True
                    if not self.t.done:
                        self.t.finish("client_cancel")
            except Exception as exc:
                self._broken("middleware.receive", exc)
        return message

    # ---- what the app sends ----------------------------------------------------------------------------

    async def send(self, message: Message) -> None:
        if message.get("more_body") and self._plain(message.get("body")):
            # the same chunk as the stream's plain content chunk but for its text: one token, committed by that
            # call (nothing to read)
            try:
                await self._send(message)
            except BaseException:
                self.send_failed = True
                raise
            self._count_sent(1)
            return
        if self.off:
            await self._send(message)
            return
        k = 0
        try:
            kind = message["type"]
            if kind == "http.response.body":
                k = self._body(message)
            elif kind == "http.response.start":
                message = self._start(message)
        except Exception as exc:
            self._broken("middleware.send", exc)
        try:
            await self._send(message)
        except BaseException:
            self.send_failed = True
            raise
        if k:
            self._count_sent(k)
        if self.ending and not self.off:
            self.completed = True
            try:
                self.obs.complete()
            except Exception as exc:
                self._broken("middleware.complete", exc)

    def _start(self, message: Message) -> Message:
        self.started = True
        name = self.mw._rid_name
        headers: list[tuple[bytes, bytes]] = []
        content_type = b""
        retry_after: bytes | None = None
        for key, value in message.get("headers") or ():
            low = bytes(key).lower()
            if low == name:
                continue  # replaced by the middleware's id below
            if low == b"content-type":
                content_type = bytes(value)
            elif low == b"retry-after":
                retry_after = bytes(value)
            headers.append((key, value))
        headers.append((name, self.rid))
        self.obs.start(int(message.get("status", 200)), content_type, retry_after)
        return {**message, "headers": headers}

    def _body(self, message: Message) -> int:
        """Read one body message before it is handed over; the tokens it carries (committed now)."""
        body = message.get("body", b"")
        if type(body) is not bytes:
            body = bytes(body)  # a memoryview or bytearray
        if not message.get("more_body", False):
            self.ending = True
        return self.obs.body(body, self.ending)

    # ---- the terminal state ------------------------------------------------------------------------------

    def raised(self, exc: BaseException) -> None:
        """The app raised ``exc``: the request ends ``client_cancel`` when its client had gone, else
        ``error`` with the exception's class name. Never raises."""
        try:
            t = self.t
            if t.done:
                return
            if self.off:
                t.finish("error", error_type="middleware_error")
            elif self.send_failed or self.disconnected:
                t.finish("client_cancel")
            elif isinstance(exc, asyncio.CancelledError):
                t.finish("error", error_type="cancelled")
            else:
                t.finish("error", error_type=type(exc).__name__)
        except Exception as inner:
            self.mw.telemetry.guard.error("middleware.raised", inner)

    def returned(self) -> None:
        """The app returned: a request not yet ended had no complete response. Never raises."""
        try:
            t = self.t
            if t.done:
                return
            if self.off:
                t.finish("error", error_type="middleware_error")
            elif self.disconnected or self.send_failed:
                t.finish("client_cancel")
            else:
                t.finish("error", error_type="truncated" if self.started else "no_response")
        except Exception as exc:
            self.mw.telemetry.guard.error("middleware.returned", exc)

    def _broken(self, site: str, exc: BaseException) -> None:
        """An exception inside the middleware: count it and stop observing this request (it passes through)."""
        self.off = True
        self.obs.forget()
        self.mw.telemetry.guard.error(site, exc)
