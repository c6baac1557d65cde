"""The gateway's request path: read, admit, route, forward the stream, settle, record.

Each generation request (``POST /v1/completions`` or ``/v1/chat/completions``) gets a tracker when its body has
been read and exactly one terminal state. In order:

1. **Read**: a body that is not a JSON object is 400, a model the gateway does not serve 404 (a model name with
   control characters, or longer than 256 characters, is 400: nothing an engine would choke on is forwarded).
   ``prompt`` may be text, a list of texts or token ids: it is forwarded as sent.
2. **Admit**: the gateway's own drain (503 ``draining``), the budgets of the API key (``Authorization``; else the
   tenant class): one request and ``prompt + max_tokens`` tokens reserved (``max_tokens`` or, with
   ``reserve_quantile``, less once the model's replies say so; 429 ``rate_limited``), then the
   admission queue (429 ``queue_full``, its ``Retry-After`` from the measured drain rate; shedding lowest class
   first), whose slots are the routable backends' limits: their sum in requests and, once every one has a token
   limit, in tokens (each request weighs its prompt tokens and the tokens it is expected to generate:
   ``max_tokens``, or less once the model's recent replies say so, :class:`OutputEstimate`).
3. **Route**: a backend by :meth:`Pool.pick`, one with room for the request's requests and tokens first; none
   routable is 503 ``circuit_open``.
4. **Forward**: the body as sent (``stream_options.include_usage`` added to a stream that did not ask for it, and
   the usage-only event it brings withheld from that client); the engine's bytes are passed on as they arrive,
   from the backend connection's own callback (no task woken per read), each read one chunk to the client (in
   parts of at most :data:`PASS_BYTES`), never re-serialised; a client that reads too slowly pauses the reading
   of the backend. A backend that cannot be reached or answers
   5xx before anything reached the client is tried on another backend (``retries``).
5. **End**: the reply's finish reason (the :class:`ReplyObserver`), or the client leaving (``client_cancel``: the
   backend request is cancelled at once by closing its connection), or the gateway ending it with a last event
   that says why: ``server_draining`` (a drain closed it), ``deadline`` (the request timeout), ``error`` (the
   backend died or stalled mid-stream).
6. **Settle**: the tokens reserved are settled against ``usage`` (prompt + completion tokens; a cancelled stream
   is charged the tokens the engine had sent), refunding or topping up.

The summary's ``version`` is the chosen backend's version; the backend's breaker hears one outcome per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from llmslo.controls import (
    AdmissionQueue,
    Decision,
    DrainController,
    LoadShedder,
    RateLimit,
    RateLimiter,
    drain_terminal_event,
    queue_shed_levels,
)
from llmslo.gateway._concurrency import OutputEstimate
from llmslo.gateway._config import GatewayConfig
from llmslo.gateway._http import (
    HOP_BY_HOP,
    ChunkedDecoder,
    Request,
    Responder,
    UpstreamConnection,
    UpstreamError,
    UpstreamResponse,
    error_body,
    send_request,
)
from llmslo.gateway._metrics import PoolCollector
from llmslo.gateway._pool import Backend, Pool
from llmslo.telemetry import RequestTracker, Telemetry, valid_request_id
from llmslo.telemetry._exposition import render_metrics
from llmslo.telemetry._openai_stream import MAX_EVENT_BYTES, SseParser, events_end, json_value, raw_events
from llmslo.telemetry._reply_observer import SSE, ReplyObserver

log = logging.getLogger("llmslo.gateway")

GENERATE_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})
MODEL_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,256}")
"""What a model name may be: 1 to 256 characters, no control characters."""
MAX_ERROR_BYTES = 64 * 1024
"""The most bytes of a backend's error response read before it is retried elsewhere."""
DRAINING_RETRY_AFTER_S = 1.0
MAX_GAPS = 4096
"""The most inter-chunk gaps of one stream kept for its backend's concurrency limit."""
_JSON = (b"content-type", b"application/json")

CHECK_TICK_S = 1.0
"""How often, at most, the requests in flight are checked for their deadline (the request timeout) and their
streams for a stall (seconds): each ends at most this late, or a quarter of its time when that is shorter."""


def _estimate_prompt_tokens(body: dict[str, object]) -> int:
    """A prompt's tokens before the engine counts them: token ids as given, text at 4 characters a token (at least
    1), a chat message's text plus 4 tokens for its role and framing. The reservation is settled against ``usage``
    later, so an estimate is enough; nothing is serialised to make it."""
    prompt = body.get("prompt")
    if prompt is None:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return 1
        chars = 0
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                chars += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        return max(1, math.ceil(chars / 4) + 4 * len(messages))
    if isinstance(prompt, list):
        if prompt and all(isinstance(x, int) for x in prompt):
            return len(prompt)
        if prompt and all(isinstance(x, list) for x in prompt):
            return sum(len(x) for x in prompt)
        return max(1, math.ceil(sum(len(x) for x in prompt if isinstance(x, str)) / 4))
    return max(1, math.ceil(len(prompt) / 4)) if isinstance(prompt, str) else 1


MAX_MODELS = 64
"""The models with a queue and an output estimate of their own; requests for any other share those of ``other``."""


_T = TypeVar("_T")


def _per_model(table: dict[str, _T], model: str, make: Callable[[str], _T]) -> _T:
    """``table[model]``, made by ``make(model)`` when missing; once ``table`` holds :data:`MAX_MODELS`, a model not
    in it gets ``table["other"]`` (made once): the state per model stays bounded whatever names clients send."""
    found = table.get(model)
    if found is None:
        if len(table) >= MAX_MODELS:
            model = "other"
            found = table.get(model)
        if found is None:
            found = table[model] = make(model)
    return found


class BadRequest(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


@dataclass(slots=True)
class _Parsed:
    model: str
    stream: bool
    max_tokens: int
    prompt_tokens: int
    body: bytes
    injected_usage: bool
    obj: dict[str, object]
    """The body as parsed (re-serialised only when the gateway changes it)."""
    weight: int = 0
    """Its tokens in flight: prompt tokens and the tokens it is expected to generate (:meth:`weigh`)."""

    def weigh(self, outputs: OutputEstimate) -> None:
        """Set :attr:`weight` from the prompt and the output ``outputs`` (its model's) expects for ``max_tokens``."""
        self.weight = self.prompt_tokens + outputs.expected(self.max_tokens)

    def cap_max_tokens(self, cap: int) -> bool:
        """Lower ``max_tokens`` to ``cap`` (degradation under load); whether it changed anything."""
        if self.max_tokens <= cap:
            return False
        self.max_tokens = cap
        key = "max_completion_tokens" if "max_completion_tokens" in self.obj and "max_tokens" not in self.obj \
            else "max_tokens"
        self.obj[key] = cap
        self.body = json.dumps(self.obj).encode()
        return True


class _Exchange:
    """One request forwarded to one backend: what ends it from outside (the client, the drain, timers)."""

    __slots__ = ("conn", "deadline", "ended_by", "finish_sent", "first_ns", "gaps", "last_io", "obs", "sent_ns",
                 "slow_ttft", "t", "watched")

    def __init__(self, t: RequestTracker) -> None:
        self.t = t
        self.conn: UpstreamConnection | None = None
        self.obs: ReplyObserver | None = None
        self.finish_sent = False
        """The event carrying the reply's finish reason (or error) was handed to the client's transport."""
        self.sent_ns = 0
        """When the request was written to the backend (monotonic ns)."""
        self.first_ns = 0
        """When its first content chunk arrived (0: none yet)."""
        self.slow_ttft = False
        """Its first token came later than the TTFT bound (counted against the backend then: its end counts no
        success, which would clear that failure from the breaker's run of failures)."""
        self.gaps: list[float] = []
        """The gaps between its content chunks' arrivals, seconds (at most :data:`MAX_GAPS`)."""
        self.watched = False
        """Whether its body is being passed on: :meth:`GatewayApp._check` ends it ``stall`` when no chunk came for
        the stall time."""
        self.ended_by: str | None = None
        """Why the gateway ended it: client_cancel, drain:<reason>, deadline, stall."""
        self.last_io = 0.0
        """When its backend last sent a chunk (monotonic seconds; set when its body begins): the stall check's."""
        self.deadline = math.inf
        """When the gateway's request timeout ends it (monotonic seconds; inf: never): :meth:`GatewayApp._check`."""

    def cut(self, why: str) -> None:
        """End it from outside: note why and close the backend connection (the backend cancels)."""
        if self.ended_by is None:
            self.ended_by = why
        if self.conn is not None:
            self.conn.abort()


class GatewayApp:
    """The request path of one gateway (see the module docstring); :meth:`handle` is the front server's handler."""

    def __init__(self, config: GatewayConfig, tel: Telemetry, pool: Pool | None = None) -> None:
        self.config = config
        self.tel = tel
        self.pool = pool if pool is not None else Pool(config, tel, on_change=lambda b, what: self.rebalance())
        self.exchanges: dict[int, _Exchange] = {}
        self.models = config.served_models()
        self.created = int(time.time())
        self.drain = DrainController(tel, self.pool.drain_config(), on_close=self._drain_closed)
        self.limiter: RateLimiter | None = None
        budget = config.budget
        if budget.enabled:
            requests = None if budget.requests_per_s is None else RateLimit(
                budget.requests_per_s, budget.request_burst or max(1.0, budget.requests_per_s))
            tokens = None if budget.tokens_per_min is None else RateLimit(
                budget.tokens_per_min / 60.0, budget.token_burst or budget.tokens_per_min)
            store = None
            if budget.redis_url is not None:
                from llmslo.controls import RedisBuckets, redis_client
                store = RedisBuckets(redis_client(budget.redis_url), fail_mode=budget.redis_fail_mode)
            self.limiter = RateLimiter(requests=requests, tokens=tokens, store=store, max_keys=budget.max_keys,
                                       telemetry=tel)
        classes = config.tenant_classes
        concurrency = config.concurrency or self.pool.concurrency()
        stages = [("cap_max_tokens", DEGRADE_AT)] if config.degrade_max_tokens is not None else []
        lowest = SHED_LOWEST if len(classes) > 1 else 1.0  # one class alone is shed only when the queue is full
        self.shedder = LoadShedder(classes=classes, queue_levels=queue_shed_levels(classes, lowest), degrade=stages)
        self.queues: dict[str, AdmissionQueue] = {}
        self.outputs: dict[str, OutputEstimate] = {}
        """Per model, the completion tokens of its recent complete replies."""
        self._concurrency = concurrency
        self._token_capacity = None if config.concurrency else self.pool.token_capacity()
        self.stopping = False
        self._check_handle: asyncio.TimerHandle | None = None
        timeout_s = config.request_timeout_s
        self._check_tick_s = min(CHECK_TICK_S, config.stall_s / 4.0, math.inf if timeout_s is None else timeout_s / 4.0)
        tel.registry.register(PoolCollector(self.pool))

    # ---- state ---------------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return not self.stopping and self.drain.ready and any(b.routable() for b in self.pool.backends.values())

    def queue_for(self, model: str) -> AdmissionQueue:
        """The admission queue of ``model`` (at most :data:`MAX_MODELS`, then one for all others)."""
        q = self.queues.get(model)     # the common case first: no closure made per request
        if q is not None:
            return q
        return _per_model(self.queues, model, lambda name: AdmissionQueue(
            name, capacity=self.config.queue_capacity, concurrency=self._concurrency,
            token_capacity=self._token_capacity, queue_timeout_s=self.config.queue_timeout_s,
            classes=self.config.tenant_classes, shedder=self.shedder, telemetry=self.tel))

    def output_estimate(self, model: str) -> OutputEstimate:
        """The completion tokens expected of a request for ``model`` (at most :data:`MAX_MODELS`, then one for all
        others)."""
        est = self.outputs.get(model)
        if est is not None:
            return est
        return _per_model(self.outputs, model, lambda _: OutputEstimate())

    def rebalance(self) -> None:
        """Without a fixed ``concurrency``, the queues' slots follow the routable backends' limits, in requests
        and in tokens."""
        if self.config.concurrency is None:
            total = self.pool.concurrency()
            if total != self._concurrency:
                self._concurrency = total
                for q in self.queues.values():
                    q.set_concurrency(total)
            tokens = self.pool.token_capacity()
            if tokens != self._token_capacity:
                self._token_capacity = tokens
                for q in self.queues.values():
                    q.set_token_capacity(tokens)

    def _drain_closed(self, t: RequestTracker, reason: str) -> None:
        ex = self.exchanges.get(id(t))
        if ex is not None:
            ex.cut(f"drain:{reason}")

    # ---- the front server's handler --------------------------------------------------------------------------

    async def handle(self, req: Request, res: Responder) -> None:
        rid_header = req.header(b"x-request-id")
        rid = rid_header.decode("latin-1") if rid_header is not None else None
        if not valid_request_id(rid):
            rid = str(uuid.uuid4())
        path = req.path
        if path in GENERATE_ROUTES:
            if req.method != "POST":
                res.send(405, [_JSON, (b"x-request-id", rid.encode())],
                         error_body(f"{path}: use POST", "invalid_request_error", 405))
                return
            await self._generate(req, res, rid)
        elif path == "/v1/models":
            data = [{"id": m, "object": "model", "created": self.created, "owned_by": "llmslo-gateway"}
                    for m in self.models or self.pool.listed_models()]
            res.send(200, [_JSON], json.dumps({"object": "list", "data": data}).encode())
        elif path == "/metrics":
            accept = (req.header(b"accept") or b"").decode("latin-1")
            body, content_type = render_metrics(self.tel.registry, accept)
            res.send(200, [(b"content-type", content_type.encode())], body)
        elif path == "/health":
            res.send(200, [_JSON], b'{"status": "ok"}')
        elif path == "/ready":
            ready = self.ready
            state = {"ready": ready, "draining": not self.drain.ready, "routable_slots": self.pool.routable_slots()}
            res.send(200 if ready else 503, [_JSON], json.dumps(state).encode())
        else:
            res.send(404, [_JSON, (b"x-request-id", rid.encode())],
                     error_body(f"no route {path[:200]}", "not_found", 404))

    # ---- generation ----------------------------------------------------------------------------------------

    def _parse(self, req: Request) -> _Parsed:
        try:
            body = json_value(req.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(400, f"body: not JSON ({exc})") from exc
        if not isinstance(body, dict):
            raise BadRequest(400, "body: expected a JSON object with model and prompt or messages")
        model = body.get("model")
        if not isinstance(model, str) or not MODEL_NAME.fullmatch(model):
            raise BadRequest(400, "model: expected a model name of 1 to 256 characters without control characters")
        if self.models and model not in self.models:
            raise BadRequest(404, f"model: {model!r} is not served here; see /v1/models", "model_not_found")
        if req.path == "/v1/chat/completions" and not isinstance(body.get("messages"), list):
            raise BadRequest(400, "messages: expected a list of messages")
        if req.path == "/v1/completions" and not isinstance(body.get("prompt"), str | list):
            raise BadRequest(400, "prompt: expected text, a list of texts or a list of token ids")
        stream = body.get("stream") is True
        raw = body.get("max_tokens", body.get("max_completion_tokens"))
        if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int) or raw < 1):
            raise BadRequest(400, f"max_tokens: expected an integer >= 1, got {raw!r}")
        max_tokens = raw if raw is not None else self.config.default_max_tokens
        injected = False
        out = req.body
        if stream:
            options = body.get("stream_options")
            if not (isinstance(options, dict) and options.get("include_usage") is True):
                body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
                injected = True
                out = json.dumps(body).encode()
        return _Parsed(model, stream, max_tokens, _estimate_prompt_tokens(body), out, injected, body)

    async def _generate(self, req: Request, res: Responder, rid: str) -> None:
        tenant_raw = req.header(b"x-tenant-class")
        tenant = tenant_raw.decode("latin-1") if tenant_raw is not None else "default"
        if tenant not in self.config.tenant_classes:
            tenant = "default"
        try:
            p = self._parse(req)
        except BadRequest as exc:
            t = self.tel.start(rid, model="unknown", tenant_class=tenant)
            t.finish("error", error_type="bad_request" if exc.status == 400 else "model_not_found")
            res.send(exc.status, [_JSON, (b"x-request-id", rid.encode())],
                     error_body(exc.message, exc.kind, exc.status))
            return
        t = self.tel.start(rid, model=p.model, tenant_class=tenant, prompt_tokens=p.prompt_tokens)
        try:
            await self._serve(req, res, rid, t, p)
        except Exception as exc:  # a bug: never leave the request in flight, never answer nothing
            log.exception("request %s failed", rid)
            t.finish("error", error_type=type(exc).__name__)
            if not res.started:
                res.send(500, [_JSON], error_body("internal error", "internal_error", 500))
            else:
                res.abort()
        finally:
            if not t.done:
                t.finish("error", error_type="unfinished")

    def _refuse(self, res: Responder, rid: str, decision: Decision) -> None:
        headers = [(b"x-request-id", rid.encode())]
        headers.extend((k.encode(), v.encode()) for k, v in decision.headers())  # its content type among them
        res.send(decision.http_status, headers, decision.body())

    async def _serve(self, req: Request, res: Responder, rid: str, t: RequestTracker, p: _Parsed) -> None:
        decision = self.drain.allow(t)
        if not decision.admitted or self.stopping:
            if not t.done:
                t.reject("draining")
            self._refuse(res, rid, Decision.refuse("draining", DRAINING_RETRY_AFTER_S, "the gateway is draining"))
            return
        outputs = self.output_estimate(p.model)
        limiter = self.limiter
        if limiter is not None:
            key = _budget_key(req, t.tenant_class)
            quantile = self.config.budget.reserve_quantile
            output = p.max_tokens if quantile is None else outputs.expected(p.max_tokens, quantile)
            reserved = p.prompt_tokens + output
            decision = limiter.check(key, prompt_tokens=p.prompt_tokens, max_tokens=output, tracker=t,
                                     model=p.model)
            if not decision.admitted:
                self._refuse(res, rid, decision)
                return
            if limiter.tokens is not None:
                t.add_resource(lambda: limiter.reconcile(key, reserved, t.prompt_tokens + t.generated_tokens),
                               "token_budget")
        ex = _Exchange(t)
        res.on_close = lambda: self._client_left(ex)
        p.weigh(outputs)
        decision = await self.queue_for(p.model).acquire(t, degrade=lambda action: self._degrade(p, action),
                                                         tokens=p.weight)
        if not decision.admitted:
            if t.finish_reason == "client_cancel":
                return
            self._refuse(res, rid, decision)
            return
        if t.done:  # ended while it waited (the client left, the drain)
            if not res.closed and not res.started:
                self._refuse(res, rid, Decision.refuse("draining", DRAINING_RETRY_AFTER_S, "ended while queued"))
            return
        timeout_s = self.config.request_timeout_s
        if timeout_s is not None:
            ex.deadline = time.monotonic() + timeout_s
        if self._check_handle is None:
            self._check_later()
        self.exchanges[id(t)] = ex
        try:
            await self._route(req, res, rid, t, p, ex)
            if not res.started and not res.closed:
                self._answer_ended(res, rid, t)
        finally:
            self.exchanges.pop(id(t), None)

    def _check_later(self) -> None:
        """Run :meth:`_check` in a tick: :data:`CHECK_TICK_S`, or a quarter of the request timeout or of the stall
        time when that is shorter. One timer for every request in flight: a timer per request (set at its start,
        cancelled at its end) cost 2-3 us of each start on uvloop."""
        self._check_handle = asyncio.get_running_loop().call_later(self._check_tick_s, self._check)

    def _check(self) -> None:
        """End every request past its deadline (``deadline``) and every stream without a chunk for the stall time
        (``stall``); again in a tick while any request is in flight."""
        self._check_handle = None
        now = time.monotonic()
        stall = self.config.stall_s
        for ex in list(self.exchanges.values()):
            if ex.ended_by is not None:
                continue  # already ended from outside: its handler is finishing it
            if ex.deadline <= now:
                ex.cut("deadline")
            elif ex.watched and now - ex.last_io >= stall:
                ex.watched = False
                ex.cut("stall")
        if self.exchanges and not self.stopping:
            self._check_later()

    def stop_checks(self) -> None:
        """Stop the deadline and stall checks (the gateway is closing)."""
        if self._check_handle is not None:
            self._check_handle.cancel()
            self._check_handle = None

    def _degrade(self, p: _Parsed, action: str) -> bool:
        """The queue's degradation stage ``action`` for request ``p``: ``cap_max_tokens`` lowers its
        ``max_tokens`` to ``--degrade-max-tokens`` (its reservation is settled against usage as any other), and its
        weight on the backend with it (the queue keeps the weight it was given)."""
        cap = self.config.degrade_max_tokens
        if action != "cap_max_tokens" or cap is None or not p.cap_max_tokens(cap):
            return False
        p.weigh(self.output_estimate(p.model))
        return True

    def _answer_ended(self, res: Responder, rid: str, t: RequestTracker) -> None:
        """A request that ended before a backend answered it (a drain, its timeout): say why."""
        headers = [_JSON, (b"x-request-id", rid.encode())]
        if t.finish_reason == "deadline":
            res.send(504, headers, error_body("the gateway's request timeout ran out before a backend answered",
                                              "deadline", 504))
        elif t.finish_reason == "server_draining":
            self._refuse(res, rid, Decision.refuse("draining", DRAINING_RETRY_AFTER_S, "ended by a drain"))
        else:
            res.send(502, headers, error_body(f"ended before a backend answered ({t.finish_reason})",
                                              "backend_error", 502))

    def _client_left(self, ex: _Exchange) -> None:
        """The client hung up: cancel the backend request. A client that leaves once the reply's finish was
        handed to it (it read ``[DONE]`` and closed) got the whole reply: that reply's own end is recorded."""
        ex.cut("client_cancel")
        if ex.finish_sent and ex.obs is not None:
            ex.obs.complete()
        elif not ex.t.done:
            ex.t.finish("client_cancel")

    async def _route(self, req: Request, res: Responder, rid: str, t: RequestTracker, p: _Parsed,
                     ex: _Exchange) -> None:
        tried: set[str] = set()
        last_error = "no backend is routable"
        attempts = 1 + self.config.retries
        for attempt in range(attempts):
            if t.done or ex.ended_by is not None:
                break
            backend = self.pool.pick(p.model, frozenset(tried), p.weight)
            if backend is None:
                break
            tried.add(backend.id)
            outcome = await self._forward(backend, req, res, rid, t, p, ex, tried if attempt + 1 < attempts else None)
            if outcome is None:
                return
            last_error = outcome
        if t.done or ex.ended_by == "client_cancel":
            if not t.done:
                t.finish("client_cancel")
            return
        if ex.ended_by == "deadline":
            t.finish("deadline")
            res.send(504, [_JSON, (b"x-request-id", rid.encode())],
                     error_body("the gateway's request timeout ran out before a backend answered", "deadline", 504))
            return
        t.reject("circuit_open")
        self._refuse(res, rid, Decision.refuse("circuit_open", self.pool.retry_after_s(p.model), last_error))

    async def _forward(self, b: Backend, req: Request, res: Responder, rid: str, t: RequestTracker,
                       p: _Parsed, ex: _Exchange, tried: set[str] | None) -> str | None:
        """Forward to ``b``. None: the request ended (whatever way); text: nothing reached the client and the
        backend failed (why), so another may be tried. A 5xx is passed on unless another attempt is left
        (``tried``: the backends tried so far; None on the last attempt) and a backend besides those is routable."""
        t.route(b.id, b.spec.version)
        b.outstanding += 1
        b.served += 1
        b.last_routed_unix_s = time.time()
        b.requests[id(t)] = t
        if not b.limit.try_acquire(p.weight):
            b.limit.acquire_over(p.weight)
        ex.sent_ns = ex.first_ns = 0
        ex.gaps = []
        try:
            return await self._exchange(b, req, res, rid, t, p, ex, tried)
        finally:
            b.outstanding -= 1
            b.requests.pop(id(t), None)
            b.limit.release(p.weight)
            if ex.first_ns:
                figures = None if b.engine is None else b.engine.fresh()
                updates = b.limit.updates
                b.limit.observe(ttft_s=(ex.first_ns - ex.sent_ns) / 1e9, prompt_tokens=t.prompt_tokens,
                                gaps_s=ex.gaps, engine_waiting=None if figures is None else figures.waiting)
                if b.limit.updates != updates:  # a window's verdict: the limits may have moved
                    self.rebalance()

    async def _open(self, b: Backend, req: Request, rid: str, p: _Parsed,
                    ex: _Exchange) -> tuple[UpstreamConnection, UpstreamResponse]:
        headers = req.header_lines(_not_forwarded(req.connection_options)) + b"x-request-id: %s\r\n" % rid.encode()
        host = f"{b.spec.host}:{b.spec.port}"
        for attempt in range(2):  # a kept-alive connection the backend closed meanwhile: once more, fresh
            conn, reused = await b.upstream.acquire()
            ex.conn = conn
            try:
                return conn, await send_request(conn, req.method, req.target, host, headers, p.body)
            except UpstreamError:
                conn.abort()
                if not reused or attempt or ex.ended_by is not None:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _exchange(self, b: Backend, req: Request, res: Responder, rid: str, t: RequestTracker,
                        p: _Parsed, ex: _Exchange, tried: set[str] | None) -> str | None:
        breaker = b.breaker
        ex.sent_ns = time.monotonic_ns()
        try:
            conn, resp = await self._open(b, req, rid, p, ex)
        except UpstreamError as exc:
            if ex.ended_by is not None:
                return None
            breaker.record_failure("connect")
            return f"backend {b.id}: {exc}"
        if resp.status >= 500 and tried is not None and self.pool.has_other(p.model, frozenset(tried)):
            body = await _read_small(conn, resp)
            conn.abort()
            breaker.record_failure("5xx")
            return f"backend {b.id} answered {resp.status}: {body[:200].decode('utf-8', 'replace')}"
        obs = ex.obs = ReplyObserver(t, self.tel.observe_retry_after)
        obs.start(resp.status, resp.header(b"content-type") or b"", resp.header(b"retry-after"))
        drop = _not_forwarded(resp.connection_options)
        headers = [(k, v) for k, v in resp.headers if k not in drop]
        headers.append((b"x-request-id", rid.encode()))
        headers.append((b"x-llmslo-backend", b.id.encode()))
        # a body the gateway passes on unchanged keeps its announced length; any other the gateway frames itself
        # (chunked; to an HTTP/1.0 client, ended by the close), and can end with a last event of its own
        length = None if _withholds_usage(p, obs) else resp.length
        res.start(resp.status, headers, length)
        outcome = await self._pass(b, conn, resp, res, t, p, ex, obs, length is None)
        if outcome == "complete" and resp.keep_alive and ex.ended_by is None:
            ex.conn = None  # kept alive for the next request: nothing may close it on this one's behalf
            b.upstream.release(conn)
        else:
            conn.abort()
        return None

    async def _pass(self, b: Backend, conn: UpstreamConnection, resp: UpstreamResponse, res: Responder,
                    t: RequestTracker, p: _Parsed, ex: _Exchange, obs: ReplyObserver, framed: bool) -> str:
        """Pass the body on; the request's end: ``complete``, or why it did not (``framed``: the gateway frames
        the client's body itself, see :meth:`_end`).

        Each read of the backend is passed on from the connection's own callback (:class:`PumpReader`), as it
        arrives: no task is woken per read. This coroutine waits for the end, and while the client reads too
        slowly it stops reading the backend until the client has caught up."""
        loop = asyncio.get_running_loop()
        transport = cast(asyncio.Transport, conn.writer.transport)
        pump = _Pump(self, b, resp, res, t, p, ex, obs, transport.pause_reading)
        reader = conn.reader
        ex.last_io = time.monotonic()
        ex.watched = True
        try:
            reader.attach(pump.feed, pump.end)
            while not pump.ended:
                if not pump.paused:
                    pump.wake = loop.create_future()
                    await pump.wake
                    continue
                await res.writable()  # the client caught up (or left): the rest of the last read, then read on
                pump.paused = False
                held, pump.held = pump.held, b""
                if held:
                    pump.feed(held)
                if not pump.paused and not transport.is_closing():
                    transport.resume_reading()  # also when the held part ended the body: the connection may be kept
        finally:
            reader.detach()
            ex.watched = False
        if pump.failed is not None:
            raise pump.failed
        complete = pump.complete
        # what the stripper still holds is never a complete event (it passes each on once complete) but the start
        # of one: at a complete body's end it goes on as it came (a reader drops it); at an end the gateway makes,
        # it is dropped, for the gateway's last event follows and would be read as part of it
        if pump.strip is not None and complete:
            await res.write_chunk(pump.strip.flush())
        return self._end(b, res, t, ex, obs, complete, framed)

    def _end(self, b: Backend, res: Responder, t: RequestTracker, ex: _Exchange, obs: ReplyObserver,
             complete: bool, framed: bool) -> str:
        """The request's end (see :meth:`_pass`). A stream the gateway ends, or the backend broke, ends with a last
        event that says why wherever the gateway frames the client's body itself (``framed``): chunked, or, to an
        HTTP/1.0 client, ended by the close (the event, then a clean close: an HTTP/1.0 body has no other end, and
        the event says the reply is not whole). A body passed on with the backend's ``Content-Length`` cannot take
        a byte more: it is cut (the client sees fewer bytes than announced)."""
        why = ex.ended_by
        breaker = b.breaker
        if why == "client_cancel" or res.closed:
            if not t.done:
                t.finish("client_cancel")
            if t.generated_tokens and not ex.slow_ttft:
                breaker.record_success()
            return "client_cancel"
        if complete and why is None:
            if not res.complete:
                res.end()
            obs.complete()
            # a 5xx, or an error inside a stream that began well; a 4xx is the request's fault (a model not
            # served, a bad field), passed on without counting against the backend
            failed = obs.status >= 500 or (obs.status < 400 and t.finish_reason == "error")
            if failed:
                breaker.record_failure("stream" if obs.status < 500 else "5xx")
            else:
                if not ex.slow_ttft:
                    breaker.record_success()
                if t.finish_reason in ("stop", "length"):
                    self.output_estimate(t.model).observe(t.generated_tokens)
            return "complete"
        # the gateway ends the stream, or the backend broke it: a last event that says why, then the end
        if why is not None and why.startswith("drain:"):
            event = drain_terminal_event(why.split(":", 1)[1])
            if not t.done:
                t.finish("server_draining")
        elif why == "deadline":
            event = {"error": {"type": "deadline", "code": "gateway_timeout", "retryable": True,
                               "message": "the gateway's request timeout ran out"}}
            t.finish("deadline")
        else:
            kind = "stall" if why == "stall" else "stream"
            breaker.record_failure(kind)
            message = (f"backend {b.id} sent nothing for {self.config.stall_s:g} s" if why == "stall"
                       else f"backend {b.id} closed the stream before its end")
            event = {"error": {"type": "error", "code": f"backend_{'stalled' if why == 'stall' else 'failed'}",
                               "retryable": True, "message": message}}
            t.finish("error", error_type="backend_stalled" if why == "stall" else "backend_failed")
        if obs.kind == SSE and framed and not res.closed:
            res.end(b"data: " + json.dumps(event).encode() + b"\n\n")
        else:
            res.abort()
        return why or "broken"

    def _check_ttft(self, b: Backend, t: RequestTracker) -> bool:
        """Whether the first token, arriving now, came later than the TTFT bound (then one failure of the
        backend)."""
        bound = self.config.ttft_bound_s
        if bound is not None and (self.tel.clock_ns() - t.arrival_ns) / 1e9 > bound:
            b.breaker.record_failure("slow_ttft")
            return True
        return False


PASS_BYTES = 64 * 1024
"""The most bytes of a backend's read passed on before the client's buffer is looked at again."""


class _Pump:
    """One response body passed on from the backend connection's callback (see :meth:`GatewayApp._pass`):
    :meth:`feed` with each read, :meth:`end` at the connection's end. ``wake`` is set when the body ended or the
    client reads too slowly (``paused``: the backend's reading was paused)."""

    __slots__ = ("app", "b", "complete", "decoder", "ended", "ex", "failed", "first", "held", "last_ns", "left",
                 "obs", "paused", "res", "send_count", "strip", "t", "transport_pause", "until_eof", "wake")

    def __init__(self, app: GatewayApp, b: Backend, resp: UpstreamResponse, res: Responder, t: RequestTracker,
                 p: _Parsed, ex: _Exchange, obs: ReplyObserver, pause_reading: Callable[[], None]) -> None:
        self.app, self.b, self.res, self.t, self.ex, self.obs = app, b, res, t, ex, obs
        self.decoder = ChunkedDecoder() if resp.chunked else None
        self.left = resp.length
        self.until_eof = self.decoder is None and self.left is None
        self.strip = _UsageStripper() if _withholds_usage(p, obs) else None
        self.send_count = t.send
        self.first = True
        self.last_ns = 0
        self.complete = self.ended = self.paused = False
        self.held = b""
        """The rest of a read not passed on while the client reads too slowly (at most one read)."""
        self.failed: BaseException | None = None
        self.transport_pause = pause_reading
        self.wake: asyncio.Future[None] | None = None

    def _wake(self) -> None:
        wake = self.wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def end(self, exc: BaseException | None) -> None:
        """The backend's connection ended (``exc``: its error). A body framed by the close is complete when it
        closed cleanly, and, for an event stream, once it said how the reply ended (a finish reason or an error):
        the close alone cannot tell a stream that ended from a backend that died in the middle of it."""
        if not self.ended:
            self.ended = True
            obs = self.obs
            self.complete = (self.until_eof and exc is None and self.ex.ended_by is None
                             and (obs.kind != SSE or obs.finish is not None or obs.error is not None))
            self._wake()

    def feed(self, data: bytes) -> None:
        """One read of the backend's body: decode, observe, pass on. Never raises (a failure ends the body)."""
        if self.ended or not data:
            return
        try:
            while data:  # in parts of at most PASS_BYTES, so that a slow client holds at most one part more
                part, data = data[:PASS_BYTES], data[PASS_BYTES:]
                self._feed(part)
                if self.ended:
                    return
                if self.paused and data:
                    self.held = data
                    return
        except UpstreamError:
            self.ended = True  # bad framing: not complete
            self._wake()
        except Exception as exc:  # a bug: end this request rather than the connection's callback
            self.failed = exc
            self.ended = True
            self._wake()

    def _feed(self, data: bytes) -> None:
        ex = self.ex
        ex.last_io = time.monotonic()
        decoder = self.decoder
        if decoder is not None:
            payload = decoder.feed(data)
            done = decoder.done
        else:
            payload = data
            left = self.left
            if left is not None:
                if len(data) > left:
                    payload = data[:left]  # bytes past the announced length are not this body's
                left = self.left = left - len(payload)
            done = left is not None and left <= 0
        if payload:
            obs = self.obs
            k = 1 if obs.plain(payload) else obs.body(payload, done)
            if k:
                now = time.monotonic_ns()
                if self.first:
                    self.first = False
                    ex.first_ns = now
                    ex.slow_ttft = self.app._check_ttft(self.b, self.t)
                elif len(ex.gaps) < MAX_GAPS:
                    ex.gaps.append((now - self.last_ns) / 1e9)
                self.last_ns = now
            slow = self.res.put_chunk(payload if self.strip is None else self.strip.feed(payload))
            if k:
                self.send_count(k)
            if obs.finish is not None or obs.error is not None:
                ex.finish_sent = True
            if slow and not done and not self.paused:
                self.paused = True
                self.transport_pause()
                self._wake()
        if done:
            self.complete = self.ended = True
            self._wake()


def _withholds_usage(p: _Parsed, obs: ReplyObserver) -> bool:
    """Whether the reply's body is changed on its way: the usage event the gateway asked for on the client's behalf
    (a stream that did not ask) is withheld from it."""
    return p.injected_usage and obs.kind == SSE


class _UsageStripper:
    """Withholds the usage-only event (``choices: []`` with ``usage``) the gateway asked for on a client's behalf.

    Events are framed as the project's one SSE reader frames them (:mod:`llmslo.telemetry._openai_stream`): an
    event ends at a blank line, a line ending in ``\\n``, ``\\r\\n`` or ``\\r``, split anywhere between two reads.
    Each complete event is passed on at once, its bytes as they came; a partial one is held until it completes. An
    event that grows past the reader's :data:`MAX_EVENT_BYTES` is not an event stream a server should send: from
    then on everything is passed on as it comes (the reader gives up on it too).

    The common read, ``\\n``-framed events that end with the read, without ``"usage"`` in them, costs one ``rfind``
    and one ``find`` (no copy); the reads of a stream with CR line ends a regular expression's search besides."""

    __slots__ = ("_held", "_skip_lf", "_through")

    def __init__(self) -> None:
        self._held = b""
        """The bytes of an event not complete yet."""
        self._skip_lf = False
        """A LF that begins the next read is withheld: the second byte of the CR LF that ended the event withheld
        last, at the end of a read."""
        self._through = False
        """Passing everything on as it comes (an event grew past :data:`MAX_EVENT_BYTES`)."""

    def feed(self, data: bytes) -> bytes:
        """The bytes to pass on for ``data``, one read of the body."""
        if self._through:
            return data
        if self._skip_lf:
            self._skip_lf = False
            if data.startswith(b"\n"):
                data = data[1:]
        held = self._held
        # a blank line that ends in this read begins at most 3 bytes before it (CR LF CR LF): only the read and
        # those are searched, so that an event held over many reads is not searched again each time
        start = max(0, len(held) - 3)
        buf = held + data if held else data
        end = buf.rfind(b"\n\n", start) + 2
        # no LF LF blank line, or a CR after the last one: a blank line may end with a CR (CR LF, or CR alone);
        # one that ends in a read without CR holds LF LF
        if end == 1 or (end < len(buf) and buf.find(b"\r", end) >= 0):
            end = events_end(buf, start) if end > 1 or data.find(b"\r") >= 0 else -1
            if end < 0:
                if len(buf) > MAX_EVENT_BYTES:
                    self._held, self._through = b"", True
                    return buf
                self._held = buf
                return b""
        if end == len(buf):
            self._held = b""
            head = buf
        else:
            head, self._held = buf[:end], buf[end:]
        if head.find(b'"usage"') < 0:
            return head
        out, cut_cr = _without_usage_only(head)
        self._skip_lf = cut_cr and head is buf  # the read ended with the CR of the event withheld: a LF may follow
        return out

    def flush(self) -> bytes:
        """At the body's end: the bytes still held (the start of an event the body never completed), as they came;
        an SSE reader drops them."""
        held, self._held = self._held, b""
        return held


def _without_usage_only(head: bytes) -> tuple[bytes, bool]:
    """``head`` (whole events) without its usage-only events (the line ends before such an event, the end of the
    event before or a blank line of no event, are kept), and whether ``head`` ends with such an event's CR."""
    out = []
    cut_cr = False
    events, rest = raw_events(head)
    for event in events:
        cut_cr = event.find(b'"usage"') >= 0 and _usage_only(event)
        if cut_cr:
            lead = len(event) - len(event.lstrip(b"\r\n"))
            if lead:
                out.append(event[:lead])
            cut_cr = event.endswith(b"\r")
        else:
            out.append(event)
    if rest:
        out.append(rest)
        cut_cr = False
    return b"".join(out), cut_cr


def _usage_only(event: bytes) -> bool:
    """Whether ``event`` (one whole event, its blank line included) is a usage-only event: one ``data`` payload, a
    JSON object (read as the SSE reader reads it) with ``choices: []`` and a ``usage`` object."""
    payloads = SseParser().feed(event)
    if len(payloads) != 1:
        return False
    try:
        obj = json_value(payloads[0])
    except ValueError:
        return False
    return isinstance(obj, dict) and obj.get("choices") == [] and isinstance(obj.get("usage"), dict)


async def _read_small(conn: UpstreamConnection, resp: UpstreamResponse) -> bytes:
    """At most :data:`MAX_ERROR_BYTES` of an error response's body (for the log and the retry's reason)."""
    try:
        if resp.length is not None:
            return await asyncio.wait_for(conn.reader.readexactly(min(resp.length, MAX_ERROR_BYTES)), 2.0)
        return await asyncio.wait_for(conn.reader.read(MAX_ERROR_BYTES), 2.0)
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return b""


_NOT_FORWARDED = HOP_BY_HOP | {b"x-request-id"}
"""The headers of a request or a response never passed on as they came (the gateway writes its own
``x-request-id``)."""


def _not_forwarded(connection_options: frozenset[bytes]) -> frozenset[bytes]:
    """The headers of a request or a response not passed on: :data:`_NOT_FORWARDED` and those its ``Connection``
    header names (``connection_options``)."""
    return _NOT_FORWARDED | connection_options if connection_options else _NOT_FORWARDED


def _budget_key(req: Request, tenant_class: str) -> str:
    auth = req.header(b"authorization")
    if auth:
        return auth.decode("latin-1")
    return f"tenant:{tenant_class}"


DEGRADE_AT = 0.5
"""With ``degrade_max_tokens``, requests are capped from this fraction of their class's shed level on."""
SHED_LOWEST = 0.5
"""The queue's fill at which the lowest of two or more tenant classes is shed; the levels rise evenly to 1.0
for the highest (:func:`queue_shed_levels`)."""
