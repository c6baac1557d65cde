"""The reference server as a plain ASGI app: the OpenAI routes, ``/metrics``, ``/health``, ``/ready``.

Each generation request gets a tracker at arrival and exactly one terminal state, whichever signal comes
first: the response completed (``stop`` / ``length``, committed once the last event was handed to the
transport), the client hung up (``client_cancel``), the request timer or the stream's slow-consumer policy
(``deadline``), the drain (``server_draining``), a refusal (``rejected`` with its reason), an engine error or
a malformed request (``error``). The controls come in the order ``docs/controls.md`` gives: the drain, the
rate limiter, the circuit breaker, the admission queue (with the load shedder at its door).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from llmslo.controls import (
    AdmissionQueue,
    CircuitBreaker,
    Decision,
    DrainConfig,
    DrainController,
    LoadShedder,
    RateLimit,
    RateLimiter,
    drain_terminal_event,
    queue_shed_levels,
)
from llmslo.server._config import ServerConfig
from llmslo.server._engine import ENGINE_ERROR, Engine, EngineTracker, Sequence, SimulatedEngine, Token
from llmslo.server._plain import PlainQueue, PlainTracker
from llmslo.server._wire import (
    CHAT,
    COMPLETIONS,
    DONE,
    MAX_BODY_BYTES,
    Chunks,
    GenerationRequest,
    WireError,
    completion_body,
    error_body,
    error_event,
    parse_request,
)
from llmslo.telemetry import RequestTracker, SendQueue, StreamPolicy, Telemetry, metrics_app, valid_request_id

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Scope = MutableMapping[str, Any]

log = logging.getLogger("llmslo.server")

DRAINING_RETRY_AFTER_S = 1.0
"""The ``Retry-After`` of a 503 ``draining`` (seconds): this instance will not come back; retry elsewhere now."""

ROUTES = {"/v1/completions": COMPLETIONS, "/v1/chat/completions": CHAT}


class Tracker(EngineTracker, Protocol):
    """What the request path uses of a tracker (:class:`RequestTracker`, or the no-telemetry
    :class:`PlainTracker`)."""

    prompt_tokens: int

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def error_type(self) -> str | None: ...

    def send(self, n: int = 1) -> None: ...

    def admit(self) -> None: ...


class Stream(Protocol):
    """A request's token stream as the request path reads it (:class:`SendQueue` or :class:`PlainQueue`)."""

    def __len__(self) -> int: ...

    def put(self, chunk: Token, tokens: int = 1) -> None: ...

    def close(self) -> None: ...

    async def wait_credit(self) -> None: ...

    async def get(self) -> Token | None: ...


class _Woken(SendQueue[Token]):
    """A :class:`SendQueue` that also counts the chunks put (``unread``), notes its close (``ended``) and sets
    an event, ``woken``, at each of them.

    ``SendQueue.get`` on an empty queue waits with the slow-consumer policy's timeout (``asyncio.wait_for``: a
    timer and a task per token, about half of the stream's CPU cost per token measured here). The reader waits
    on ``woken`` instead and calls ``get`` once a chunk is there, so that ``get`` returns at once; the count
    and the flag are plain attributes because they are read once per token. The policy still ends a request
    whose client reads nothing for ``--stream-idle`` while its stream is full (the engine's wait for credit
    enforces it); a request that waits for the engine ends at ``--request-timeout``.
    """

    def __init__(self, tracker: RequestTracker, policy: StreamPolicy) -> None:
        super().__init__(tracker, policy)
        self.woken = asyncio.Event()
        self.unread = 0
        """Chunks put and not yet taken by the reader."""
        self.ended = False

    def put(self, chunk: Token, tokens: int = 1) -> None:
        SendQueue.put(self, chunk, tokens)  # not super(): this runs once per token
        self.unread += 1
        self.woken.set()

    def close(self) -> None:
        SendQueue.close(self)
        self.ended = True
        self.woken.set()


class _Request:
    """One generation request in the app: its tracker, what it asked, how its stream ended."""

    __slots__ = ("deadline_fired", "request", "response_id", "rid", "sent", "seq", "started", "tracker")

    def __init__(self, rid: str, tracker: Tracker) -> None:
        self.rid = rid
        self.tracker = tracker
        self.request: GenerationRequest | None = None
        self.response_id = ""
        self.seq: Sequence | None = None
        self.sent = 0
        """Tokens handed to the transport."""
        self.started = False
        """Whether the response's status line was sent."""
        self.deadline_fired = False


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _read_body(receive: Receive) -> bytes | None:
    """The request body; ``None`` when the client hung up first. Raises :class:`WireError` (413) beyond
    :data:`MAX_BODY_BYTES`."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise WireError(f"body: larger than {MAX_BODY_BYTES} bytes", status=413)
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


class ServerApp:
    """The ASGI app of ``llmslo serve`` (see the module docstring).

    ``telemetry`` is required unless ``config.telemetry`` is False (the no-telemetry mode: no metrics, no
    summaries, no controls). ``engine`` defaults to a :class:`SimulatedEngine` of ``config``. The engine's
    step loop starts with the first request (or the ASGI lifespan startup); :meth:`close` stops it.

    Example (in-process, as the tests run it)::

        app = ServerApp(ServerConfig(speed=100.0), Telemetry(version="sim-1"))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
            r = await client.post("/v1/completions", json={"model": "llmslo-sim", "prompt": "hi"})
        await app.close()
    """

    def __init__(self, config: ServerConfig, telemetry: Telemetry | None = None, *,
                 engine: Engine | None = None) -> None:
        if config.telemetry and telemetry is None:
            raise ValueError("ServerApp: telemetry is required unless config.telemetry is False")
        self.config = config
        self.telemetry = telemetry if config.telemetry else None
        self.engine: Engine = engine if engine is not None else SimulatedEngine(config.engine_config())
        self.created = int(time.time())
        self._engine_task: asyncio.Task[None] | None = None
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = False
        self._drain_reasons: dict[int, str] = {}
        self._policy = StreamPolicy(capacity=config.stream_capacity, idle_s=config.stream_idle_s,
                                    max_duration_s=None)
        self._classes = frozenset(config.tenant_classes)
        tel = self.telemetry
        self.drain: DrainController | None = None
        self.breaker: CircuitBreaker | None = None
        self.limiter: RateLimiter | None = None
        self.queue: AdmissionQueue | None = None
        self.shedder: LoadShedder | None = None
        self._metrics: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None
        if tel is not None:
            self._build_controls(tel)
            self._metrics = metrics_app(tel.registry)

    # ---- controls ----------------------------------------------------------------------------------------

    def _build_controls(self, tel: Telemetry) -> None:
        cfg = self.config
        self.drain = DrainController(tel, DrainConfig(
            wait_budget_s=cfg.drain_budget_s, unregister_settle_s=cfg.drain_settle_s,
            idle_threshold_s=cfg.drain_idle_s, max_inflight_s=cfg.drain_max_inflight_s, on_budget=cfg.on_budget,
            poll_interval_s=cfg.drain_poll_s), on_close=self._drain_closed)
        if cfg.breaker:
            self.breaker = CircuitBreaker("engine", consecutive_failures=cfg.breaker_failures,
                                          error_rate=cfg.breaker_error_rate, window_s=cfg.breaker_window_s,
                                          open_s=cfg.breaker_open_s, telemetry=tel)
        if cfg.rate_limit is not None or cfg.token_rate_limit is not None:
            requests = None if cfg.rate_limit is None else RateLimit(
                cfg.rate_limit, cfg.rate_burst if cfg.rate_burst is not None else max(1.0, cfg.rate_limit))
            tokens = None if cfg.token_rate_limit is None else RateLimit(
                cfg.token_rate_limit,
                cfg.token_burst if cfg.token_burst is not None else 60.0 * cfg.token_rate_limit)
            self.limiter = RateLimiter(requests=requests, tokens=tokens, telemetry=tel)
        classes = cfg.tenant_classes
        if cfg.shed_queue_fraction is not None or cfg.shed_ttft_s is not None:
            fraction = cfg.shed_queue_fraction
            self.shedder = LoadShedder(
                classes=classes, queue_levels=None if fraction is None else queue_shed_levels(classes, fraction),
                latency_levels_s=_latency_levels(classes, cfg.shed_ttft_s))
        self.queue = AdmissionQueue(cfg.model, capacity=cfg.max_queue, concurrency=cfg.concurrency,
                                    queue_timeout_s=cfg.queue_timeout_s, classes=classes, shedder=self.shedder,
                                    telemetry=tel)

    def _drain_closed(self, tracker: RequestTracker, reason: str) -> None:
        self._drain_reasons[id(tracker)] = reason

    @property
    def ready(self) -> bool:
        """Readiness: False from the drain's start (or while stopping)."""
        return not self._stopping and (self.drain is None or self.drain.ready)

    @property
    def active(self) -> int:
        """Generation requests being handled now."""
        return self._active

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine's step loop (needs a running event loop; a no-op once started)."""
        if self._engine_task is None:
            self._engine_task = asyncio.get_running_loop().create_task(self.engine.run(), name="llmslo-engine")

    async def close(self) -> None:
        """Stop the engine's step loop."""
        self._stopping = True
        self.engine.close()
        if self._engine_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._engine_task

    def terminate_all(self) -> int:
        """End every request in flight ``server_draining`` now (their streams get the drain's budget error
        event); how many this ended. The no-telemetry mode keeps no list of them: 0."""
        if self.telemetry is None:
            return 0
        ended = 0
        for t in self.telemetry.in_flight():
            self._drain_reasons[id(t)] = "budget_exhausted"
            ended += t.finish("server_draining")
        return ended

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no generation request is being handled (at most ``timeout_s``); whether none is."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout=timeout_s)
        return self._active == 0

    # ---- ASGI --------------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        self.start()
        path, method = scope.get("path", ""), scope.get("method", "GET")
        header = _header(scope, b"x-request-id")
        rid = header if valid_request_id(header) else uuid.uuid4().hex
        kind = ROUTES.get(path)
        if kind is not None:
            if method != "POST":
                await _respond(send, 405, rid, error_body(f"{path}: use POST", "invalid_request_error", 405))
                return
            await self._generate(kind, scope, receive, send, rid)
        elif path == "/metrics" and self._metrics is not None:
            await self._metrics(scope, receive, _with_request_id(send, rid))
        elif path == "/health":
            await _respond(send, 200, rid, b'{"status": "ok"}')
        elif path == "/ready":
            ready = self.ready
            await _respond(send, 200 if ready else 503, rid,
                           json.dumps({"ready": ready, "draining": not ready}).encode())
        elif path == "/v1/models":
            await _respond(send, 200, rid, json.dumps({"object": "list", "data": [{
                "id": self.config.model, "object": "model", "created": self.created, "owned_by": "llmslo"}]}).encode())
        else:
            await _respond(send, 404, rid, error_body(f"no route {path}", "not_found", 404))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ---- generation --------------------------------------------------------------------------------------

    def _tracker(self, rid: str, scope: Scope) -> Tracker:
        tenant = _header(scope, b"x-tenant-class")
        tenant = tenant if tenant in self._classes else "default"
        if self.telemetry is None:
            return PlainTracker(rid, self.config.model, tenant)
        return self.telemetry.start(rid, model=self.config.model, tenant_class=tenant)

    async def _generate(self, kind: str, scope: Scope, receive: Receive, send: Send, rid: str) -> None:
        t = self._tracker(rid, scope)
        r = _Request(rid, t)
        self._active += 1
        self._idle.clear()
        watcher: asyncio.Task[None] | None = None
        try:
            body = await _read_body(receive)
            if body is None:
                t.finish("client_cancel")
                return
            watcher = asyncio.get_running_loop().create_task(_watch_disconnect(receive, t))
            await self._serve(kind, scope, body, r, send, watcher)
        except WireError as exc:
            t.finish("error", error_type=exc.type)
            await _respond(send, exc.status, rid, exc.body())
        except OSError:  # a send failed: the client is gone
            t.finish("client_cancel")
        except asyncio.CancelledError:  # the server cancelled the handler (shutting down)
            t.finish("server_draining" if self._stopping or not self.ready else "error", error_type="cancelled")
            raise
        except Exception as exc:
            log.exception("request %s failed", rid)
            t.finish("error", error_type=type(exc).__name__)
            if not r.started:
                with contextlib.suppress(OSError):
                    await _respond(send, 500, rid, error_body("internal error", "internal_error", 500))
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            if not t.done:  # a path that forgot its terminal state must not leave the request in flight
                t.finish("error", error_type="unfinished")
            self._drain_reasons.pop(id(t), None)
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def _serve(self, kind: str, scope: Scope, body: bytes, r: _Request, send: Send,
                     watcher: asyncio.Task[None]) -> None:
        t = r.tracker
        req = r.request = parse_request(kind, body, self.config.model)
        t.prompt_tokens = req.prompt_tokens
        problem = self.engine.check(req.prompt_tokens, req.max_tokens)
        if problem is not None:
            raise WireError(f"max_tokens: {problem}", param="max_tokens")
        self._token_cost_fits(req)
        if self.config.request_timeout_s is not None:
            timer = asyncio.get_running_loop().call_later(self.config.request_timeout_s, self._deadline, r)
            t.add_resource(timer.cancel, "request_timer")
        refusal = await self._admit(r, scope)
        if refusal is not None:
            if t.finish_reason != "client_cancel":
                # a queue timeout: admitted, waited, finished deadline; the body says so (429 + Retry-After kept)
                await _refuse(send, r.rid, refusal, "deadline" if t.finish_reason == "deadline" else None)
            return
        if t.done:  # ended while it waited for admission (its timer, the drain; a client cancel)
            await self._respond_ended(send, r, watcher)
            return
        stream: Stream
        if req.stream and self.telemetry is not None and isinstance(t, RequestTracker):
            stream = _Woken(t, self._policy)
        else:
            stream = PlainQueue(t, self.config.stream_capacity if req.stream else None)
        t.add_resource(stream.close, "stream")
        r.response_id = ("chatcmpl-" if kind == CHAT else "cmpl-") + r.rid
        r.seq = self.engine.submit(t, req.prompt_tokens, req.max_tokens, ignore_eos=req.ignore_eos, stream=stream,
                                   pause_at=self.config.stream_capacity if req.stream else None)
        if req.stream:
            await self._stream(send, r, stream, watcher)
        else:
            await self._complete(send, r, stream, watcher)

    def _token_cost_fits(self, req: GenerationRequest) -> None:
        """A token cost above the token limit's burst could never be admitted: a 400, not a 429 forever."""
        tokens = self.limiter.tokens if self.limiter is not None else None
        if tokens is not None and req.prompt_tokens + req.max_tokens > tokens.capacity:
            raise WireError(f"max_tokens: prompt tokens ({req.prompt_tokens}) + max_tokens ({req.max_tokens}) exceed "
                            f"the token rate limit's burst ({tokens.capacity:g} tokens): ask for fewer tokens",
                            param="max_tokens")

    def _deadline(self, r: _Request) -> None:
        """The request timer fired: end the request ``deadline`` (a no-op once it ended)."""
        if r.tracker.finish("deadline"):
            r.deadline_fired = True

    async def _admit(self, r: _Request, scope: Scope) -> Decision | None:
        """Run the controls; the refusal, or None when admitted (or ended while waiting)."""
        t = r.tracker
        req = r.request
        assert req is not None
        if not isinstance(t, RequestTracker):  # the no-telemetry mode: no controls
            t.admit()
            return None
        assert self.drain is not None and self.queue is not None
        decision = self.drain.allow(t)
        if not decision.admitted:
            return Decision.refuse("draining", DRAINING_RETRY_AFTER_S, decision.detail)
        if self.limiter is not None:
            key = _header(scope, b"authorization") or (scope.get("client") or ("unknown",))[0]
            reserved = req.prompt_tokens + req.max_tokens
            decision = self.limiter.check(key, prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens, tracker=t)
            if not decision.admitted:
                return decision
            if self.limiter.tokens is not None:
                limiter = self.limiter
                t.add_resource(lambda: limiter.reconcile(key, reserved, req.prompt_tokens + t.generated_tokens),
                               "rate_limit_tokens")
        if self.breaker is not None:
            decision = self.breaker.allow(t)
            if not decision.admitted:
                return decision
            t.add_resource(lambda: self._breaker_outcome(r), "breaker_outcome")
        if self.shedder is not None:
            t.add_resource(lambda: self._observe_ttft(t), "shed_latency")
        decision = await self.queue.acquire(t)
        if decision.admitted or t.finish_reason in ("client_cancel", "server_draining") or r.deadline_fired:
            return None
        return decision

    def _breaker_outcome(self, r: _Request) -> None:
        """At the terminal state: an engine error is a failure of the engine; a request the engine served (or
        was serving) otherwise is a success; one that never reached it reports nothing."""
        breaker, t = self.breaker, r.tracker
        if breaker is None or r.seq is None:
            return
        if t.finish_reason == "error" and t.error_type == ENGINE_ERROR:
            breaker.record_failure("5xx")
        else:
            breaker.record_success()

    def _observe_ttft(self, t: RequestTracker) -> None:
        """Feed the load shedder the TTFT of a request that got a first token (seconds)."""
        if self.shedder is None:
            return
        timeline = t.timeline_ns()
        first = timeline["first_token"]
        if first is not None:
            self.shedder.observe_latency((first - t.arrival_ns) / 1e9)

    # ---- responses -----------------------------------------------------------------------------------------

    async def _stream(self, send: Send, r: _Request, stream: Stream, watcher: asyncio.Task[None]) -> None:
        t, req = r.tracker, r.request
        assert req is not None
        chunks = Chunks(req.kind, r.response_id, int(time.time()), req.model)
        r.started = True
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
            (b"x-request-id", r.rid.encode())]})
        finish: str | None = None
        woken = stream if isinstance(stream, _Woken) else None
        while True:
            if woken is not None:  # wait for a chunk here: the queue's get then returns at once
                while not woken.unread and not woken.ended:
                    woken.woken.clear()
                    await woken.woken.wait()
                woken.unread -= 1
            item = await stream.get()
            if item is None or t.done:
                break
            text, finish = item
            await send({"type": "http.response.body", "body": chunks.token(text, finish, r.sent == 0),
                        "more_body": True})
            r.sent += 1
            if finish is not None:  # the last token
                break
        tail: list[bytes] = []
        if not t.done and finish is not None:  # every token sent: complete the response, then the request
            if req.include_usage:
                tail.append(chunks.usage(req.prompt_tokens, r.sent))
            tail.append(DONE)
            await _stop_watching(watcher)
            await send({"type": "http.response.body", "body": b"".join(tail), "more_body": False})
            t.finish(finish)
            return
        if t.finish_reason == "client_cancel":
            return  # nobody to tell
        reason = self._stream_ended_reason(r)
        if "error" in reason:
            tail.append(error_event(reason["error"]))  # type: ignore[arg-type]
        else:
            tail.append(chunks.early_finish("server_draining", {k: v for k, v in reason.items()
                                                                 if k != "finish_reason"}))
            if req.include_usage:
                tail.append(chunks.usage(req.prompt_tokens, r.sent))
        tail.append(DONE)
        await _stop_watching(watcher)
        await send({"type": "http.response.body", "body": b"".join(tail), "more_body": False})

    def _stream_ended_reason(self, r: _Request) -> dict[str, object]:
        """The last event of a stream that ended early: the drain's early finish, or an error event."""
        t = r.tracker
        if t.finish_reason == "server_draining":
            return drain_terminal_event(self._drain_reasons.get(id(t), "idle"))
        if t.finish_reason == "deadline":
            code = "request_timeout" if r.deadline_fired else "stream_idle"
            why = ("the request ran past the server's --request-timeout" if r.deadline_fired
                   else "the client read nothing for the server's --stream-idle")
            return {"error": {"type": "deadline", "code": code, "message": why}}
        if t.finish_reason == "error" and t.error_type == ENGINE_ERROR:
            return {"error": {"type": ENGINE_ERROR, "code": 500, "message": "the engine failed while generating"}}
        return {"error": {"type": "error", "code": 500, "message": f"the request ended: {t.finish_reason}"}}

    async def _complete(self, send: Send, r: _Request, stream: Stream, watcher: asyncio.Task[None]) -> None:
        t, req = r.tracker, r.request
        assert req is not None
        texts: list[str] = []
        finish: str | None = None
        while True:
            item = await stream.get()
            if item is None or t.done:
                break
            texts.append(item[0])
            finish = item[1]
            if finish is not None:
                break
        if not t.done and finish is not None:
            body = completion_body(req.kind, r.response_id, int(time.time()), req.model, "".join(texts), finish,
                                   req.prompt_tokens, len(texts))
            await _stop_watching(watcher)
            r.started = True
            await _respond(send, 200, r.rid, body)
            t.send(len(texts))
            r.sent = len(texts)
            t.finish(finish)
            return
        await self._respond_ended(send, r, watcher, "".join(texts), len(texts))

    async def _respond_ended(self, send: Send, r: _Request, watcher: asyncio.Task[None], text: str = "",
                             tokens: int = 0) -> None:
        """Answer a non-streamed request (or one that never started) that ended before completing."""
        t, req = r.tracker, r.request
        if t.finish_reason == "client_cancel" or req is None:
            return
        reason = self._stream_ended_reason(r)
        await _stop_watching(watcher)
        r.started = True
        if "error" not in reason:  # the drain closed it early: the partial answer, marked retryable
            body = completion_body(req.kind, r.response_id or f"cmpl-{r.rid}", int(time.time()), req.model, text,
                                   "server_draining", req.prompt_tokens, tokens, extra={
                                       k: v for k, v in reason.items() if k != "finish_reason"})
            await _respond(send, 200, r.rid, body)
            return
        error: dict[str, object] = reason["error"]  # type: ignore[assignment]
        status = {"deadline": 504, "server_draining": 503}.get(str(error["type"]), 500)
        await _respond(send, status, r.rid, json.dumps({"error": {**error, "code": error.get("code", status)}})
                       .encode())


# ---- helpers ---------------------------------------------------------------------------------------------


def _latency_levels(classes: tuple[str, ...], lowest_s: float | None) -> dict[str, float] | None:
    """TTFT levels per class: ``lowest_s`` for the lowest class, twice that for the next one up, and so on."""
    if lowest_s is None:
        return None
    n = len(classes)
    return {c: lowest_s * 2 ** (n - 1 - i) for i, c in enumerate(classes)}


async def _watch_disconnect(receive: Receive, t: Tracker) -> None:
    """Finish the request ``client_cancel`` when the server reports that the client hung up."""
    while (await receive())["type"] != "http.disconnect":
        pass
    t.finish("client_cancel")


async def _stop_watching(watcher: asyncio.Task[None]) -> None:
    """Stop the disconnect watcher before completing a response (the server then reports a disconnect)."""
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher


def _with_request_id(send: Send, rid: str) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
        await send(message)
    return wrapped


async def _respond(send: Send, status: int, rid: str, body: bytes,
                   headers: list[tuple[str, str]] | None = None) -> None:
    """A complete JSON response with ``X-Request-Id``."""
    out = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
           (b"x-request-id", rid.encode())]
    out += [(k.encode(), v.encode()) for k, v in headers or () if k != "content-type"]
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send: Send, rid: str, decision: Decision, error_type: str | None = None) -> None:
    """The answer to a refusal: its status, ``Retry-After`` when known, the OpenAI-style error body whose
    ``type`` is the reject reason, or ``error_type`` (``deadline``: a request that timed out in the queue)."""
    status = decision.http_status
    extra: dict[str, object] = {}
    if decision.retry_after_s is not None and math.isfinite(decision.retry_after_s):
        extra["retry_after_s"] = decision.retry_after_s
    body = error_body(decision.detail or str(decision.reason), error_type or str(decision.reason), status, **extra)
    await _respond(send, status, rid, body, decision.headers())
