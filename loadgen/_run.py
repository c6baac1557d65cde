"""The open-loop run: send every arrival of a schedule at its time, measure each attempt, write its summary.

The dispatcher sleeps until each arrival's time and sends it (a task per attempt), whatever the attempts
before it are doing: a slow server makes replies late, never sends. Only ``max_concurrency`` holds a send
back (it waits for a slot); how late each send was against its schedule is measured and reported.

Before each send the client's circuit breaker (:class:`llmslo.controls.CircuitBreaker`, one per target URL)
is asked: while it refuses (tripped by failures, or honouring a ``Retry-After`` that a 429/503 carried) the
arrival is not sent and is recorded as rejected with ``circuit_open`` (``client_e2e_s`` null).

Every attempt, sent or refused, gives one summary row (:func:`~llmslo.loadgen.attempt_row`), validated by
:func:`llmslo.telemetry.validate_summary` and handed to the sink (any ``row -> None`` callable:
:class:`llmslo.telemetry.SummarySink` over a writer), and, with an attempts log, one JSON line. The run
counts why attempts failed (:meth:`~llmslo.loadgen.Attempt.cause`) and where each reply's tokens came from
(the server's ``usage``, or the content chunks counted).

Streams ask for their usage (``stream_options: {"include_usage": true}``) until the server refuses the field:
a 400 or 422 answer to a request that carried it, whose body names ``stream_options``. From then on no request
of the run carries it (those already answered keep their outcome), and the run says so.

Stopping (:meth:`LoadRun.request_stop`, wired to SIGINT and SIGTERM by :func:`run_load`): no arrival is
sent after it; attempts in flight get ``stop_wait_s`` seconds to end, then the client hangs them up
(``client_cancel``); a second stop hangs them up at once. Every attempt still yields its row.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from llmslo.controls import DEFAULT_FAILURE_KINDS, BreakerEvent, CircuitBreaker
from llmslo.loadgen._attempt import (
    ERROR_TYPES,
    NS,
    Attempt,
    HangUps,
    Identity,
    Request,
    attempt_log_entry,
    attempt_row,
    send_attempt,
)
from llmslo.loadgen._behaviour import DEFAULT_SLOW_RCVBUF_BYTES, Behaviours
from llmslo.loadgen._schedule import Arrival, Schedule, SpecError
from llmslo.loadgen._target import (
    DEFAULT_REQUEST_ID_HEADER,
    PromptBook,
    RequestIds,
    RequestShape,
    Target,
    parse_request_id_header,
)
from llmslo.telemetry import validate_summary

Row = Mapping[str, object]
Sink = Callable[[Row], None]

LATE_THRESHOLD_S = 0.010
"""A send this much later than its schedule (seconds) counts as late."""
CLIENT_FAILURE_KINDS: frozenset[str] = DEFAULT_FAILURE_KINDS | frozenset(ERROR_TYPES)
"""What the client breaker counts as failures: 5xx, timeouts, and the client's own error classes."""
CONNECT_TIMEOUT_S = 10.0
"""Seconds to wait for a connection before the attempt fails ``connect_error``."""
KEEPALIVE_EXPIRY_S = 2.0
"""Idle pooled connections are dropped after this many seconds: below common server keep-alive timeouts
(uvicorn's 5 s), so the client never reuses a connection the server is closing."""
TOP_CAUSES = 5
"""How many causes of failure a summary lists per finish reason (the rest are counted together)."""
JSON_CAUSES = 20
"""How many of them ``RunResult.to_dict`` lists per finish reason."""


@dataclass(frozen=True)
class LoadConfig:
    """How to drive one target.

    ``target``: where requests go; ``model``: the ``model`` field; ``stream``: ask for SSE streams;
    ``ignore_eos``: send vLLM's ``ignore_eos`` (replies of exactly ``max_tokens`` where honoured);
    ``api_key``: sent as ``Authorization: Bearer``; ``tenant_class``: sent as ``X-Tenant-Class`` (and the
    rows' ``tenant_class``, ``default`` without it); ``version``: the rows' ``version`` label;
    ``max_concurrency``: attempts in flight at most (None: unbounded); ``behaviours``: slow readers,
    cancels, timeout; ``honour_retry_after``: hold sends until a 429/503's ``Retry-After`` has passed;
    ``breaker``: let failures trip the client breaker (Retry-After is honoured either way);
    ``slow_rcvbuf_bytes``: ``SO_RCVBUF`` of slow readers' sockets (bytes; None: the kernel's
    autotuning); ``stop_wait_s``: how long a stop waits
    for attempts in flight (seconds); ``seed``: seeds prompts and behaviours; ``request_id``: the kind of
    request ids (``uuid4``, random; ``uuid7``, time-ordered); ``request_id_header``: the header that carries
    them (None: no header is sent, the rows still have their ids); ``stream_options``: ask streams for their
    usage (``stream_options: {"include_usage": true}``) until the server refuses the field; ``keep_alive``: keep
    connections for later requests (False: a new connection for every request, closed at the stream's
    ``[DONE]``, as a client without a connection pool does).
    """

    target: Target
    model: str
    stream: bool = True
    ignore_eos: bool = True
    api_key: str | None = None
    tenant_class: str | None = None
    version: str = "client"
    max_concurrency: int | None = None
    behaviours: Behaviours = field(default_factory=Behaviours)
    honour_retry_after: bool = True
    breaker: bool = True
    slow_rcvbuf_bytes: int | None = DEFAULT_SLOW_RCVBUF_BYTES
    stop_wait_s: float = 10.0
    seed: int = 0
    request_id: str = "uuid4"
    request_id_header: str | None = DEFAULT_REQUEST_ID_HEADER
    stream_options: bool = True
    keep_alive: bool = True

    def __post_init__(self) -> None:
        if not self.model:
            raise SpecError("--model", self.model, "the served model's name, e.g. --model tiny-llm", "is empty:")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise SpecError("--max-concurrency", self.max_concurrency, "a whole number >= 1", "must be >= 1, got")
        if self.slow_rcvbuf_bytes is not None and self.slow_rcvbuf_bytes < 1:
            raise SpecError("--slow-rcvbuf", self.slow_rcvbuf_bytes, "bytes >= 1, e.g. 65536", "must be >= 1, got")
        if not (math.isfinite(self.stop_wait_s) and self.stop_wait_s >= 0):
            raise SpecError("--stop-wait", self.stop_wait_s, "a duration >= 0, e.g. 10s", "must be >= 0, got")
        if not self.version:
            raise SpecError("--version", self.version, "a label such as client or run-42", "is empty:")
        if self.tenant_class is not None and not self.tenant_class:
            raise SpecError("--tenant-class", self.tenant_class, "a class name such as interactive", "is empty:")
        RequestIds(self.request_id)  # raises for an unknown kind
        if self.request_id_header is not None and parse_request_id_header(self.request_id_header) is None:
            raise SpecError("--request-id-header", self.request_id_header, "a header name, or None for none",
                            "is not a header name:")

    def shape(self) -> RequestShape:
        return RequestShape(self.model, self.target.endpoint, self.stream, self.ignore_eos, self.api_key,
                            self.tenant_class, self.request_id_header)

    def identity(self) -> Identity:
        return Identity(self.model, self.version, self.tenant_class or "default")

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the API key is never included, only whether one was given)."""
        return {
            "url": self.target.url, "endpoint": self.target.endpoint, "model": self.model, "stream": self.stream,
            "ignore_eos": self.ignore_eos, "api_key": self.api_key is not None, "tenant_class": self.tenant_class,
            "version": self.version, "max_concurrency": self.max_concurrency,
            "behaviours": self.behaviours.to_dict(), "honour_retry_after": self.honour_retry_after,
            "breaker": self.breaker, "slow_rcvbuf_bytes": self.slow_rcvbuf_bytes, "stop_wait_s": self.stop_wait_s,
            "seed": self.seed, "request_id": self.request_id, "request_id_header": self.request_id_header,
            "stream_options": self.stream_options, "keep_alive": self.keep_alive,
        }


@dataclass(frozen=True)
class Lateness:
    """How late the sends were against their schedule, seconds: ``late`` of ``sent`` by more than
    :data:`LATE_THRESHOLD_S`; median, p99 and max over every send (None without sends)."""

    sent: int
    late: int
    median_s: float | None
    p99_s: float | None
    max_s: float | None

    @classmethod
    def of(cls, values: list[float]) -> Lateness:
        if not values:
            return cls(0, 0, None, None, None)
        xs = sorted(values)
        return cls(len(xs), sum(1 for x in xs if x > LATE_THRESHOLD_S), _q(xs, 0.5), _q(xs, 0.99), xs[-1])

    def to_dict(self) -> dict[str, object]:
        return {"sent": self.sent, "late": self.late, "late_threshold_s": LATE_THRESHOLD_S,
                "median_s": self.median_s, "p99_s": self.p99_s, "max_s": self.max_s}


def _q(xs: list[float], p: float) -> float:
    h = (len(xs) - 1) * p
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


@dataclass(frozen=True)
class Progress:
    """Counts so far: arrivals ``scheduled`` in all, ``sent``, ``refused`` by the client breaker, attempts
    ``done`` (refusals included), ``in_flight``, and ``failed`` (done with a finish other than stop/length)."""

    scheduled: int
    sent: int
    refused: int
    done: int
    in_flight: int
    failed: int


@dataclass(frozen=True)
class Cause:
    """``count`` attempts that finished ``finish_reason`` for the same ``cause`` (:meth:`Attempt.cause`)."""

    finish_reason: str
    cause: str
    count: int

    def to_dict(self) -> dict[str, object]:
        return {"finish_reason": self.finish_reason, "cause": self.cause, "count": self.count}


def top_causes(causes: Sequence[Cause], limit: int = TOP_CAUSES) -> dict[str, list[tuple[str, int]]]:
    """Per finish reason, its ``limit`` most frequent causes as ``(cause, count)``, most frequent first, and
    the rest together as ``("N other causes", count)``."""
    out: dict[str, list[tuple[str, int]]] = {}
    for reason in sorted({c.finish_reason for c in causes}):
        mine = sorted((c for c in causes if c.finish_reason == reason), key=lambda c: (-c.count, c.cause))
        out[reason] = [(c.cause, c.count) for c in mine[:limit]]
        rest = mine[limit:]
        if rest:
            out[reason].append((f"{len(rest):,} other cause(s)", sum(c.count for c in rest)))
    return out


@dataclass(frozen=True)
class TokenSources:
    """Where the rows' token counts came from. ``replies``: attempts the server answered 200; of them,
    ``from_usage`` whose ``generated_tokens`` is the server's ``usage.completion_tokens`` and
    ``counted_chunks`` whose is the content chunks counted (no usage; one token per chunk unless a chunk said
    otherwise); the rest had neither content nor usage. ``prompt_from_usage``: replies whose ``prompt_tokens``
    is the server's ``usage.prompt_tokens`` (the others: the words sent)."""

    replies: int = 0
    from_usage: int = 0
    counted_chunks: int = 0
    prompt_from_usage: int = 0

    def describe(self) -> str:
        """One line, e.g. ``tokens: from usage (120 of 120 replies)``."""
        n = self.replies
        if n == 0:
            return "tokens: none counted (no reply: no attempt was answered 200)"
        if self.from_usage == n:
            head = f"tokens: from usage ({n:,} of {n:,} replies)"
        elif self.from_usage == 0 and self.counted_chunks:
            head = (f"tokens: counted content chunks (no usage in {self.counted_chunks:,} of {n:,} replies; "
                    "one token per chunk)")
        else:
            head = (f"tokens: from usage in {self.from_usage:,} of {n:,} replies, counted content chunks in "
                    f"{self.counted_chunks:,} (no usage; one token per chunk)")
        none = n - self.from_usage - self.counted_chunks
        if none and self.from_usage != n:
            head += f", none in {none:,} (no content, no usage)"
        prompt = ("prompt tokens from usage" if self.prompt_from_usage == n else
                  "prompt tokens: the words sent (no usage)" if self.prompt_from_usage == 0 else
                  f"prompt tokens from usage in {self.prompt_from_usage:,}, else the words sent")
        return f"{head}; {prompt}"

    def to_dict(self) -> dict[str, object]:
        return {"replies": self.replies, "from_usage": self.from_usage, "counted_chunks": self.counted_chunks,
                "prompt_from_usage": self.prompt_from_usage, "summary": self.describe()}


@dataclass(frozen=True)
class StreamOptionsRefusal:
    """The server refused ``stream_options``: the answer to attempt ``index`` (its ``request_id``) had
    ``status`` and a body naming the field (``body``: its first bytes, as received); ``refused`` attempts that
    carried the field were answered so before it was dropped."""

    index: int
    request_id: str
    status: int
    body: str
    refused: int

    def to_dict(self) -> dict[str, object]:
        return {"index": self.index, "request_id": self.request_id, "status": self.status, "body": self.body,
                "refused": self.refused}


@dataclass
class RunResult:
    """What a run produced: every valid summary ``row``, and figures about the run itself.

    ``duration_s``: from the schedule's start to the end of the last attempt (seconds, client monotonic
    clock); ``started_unix_s``: the schedule's start, wall clock. ``scheduled`` arrivals, of which ``sent``,
    ``refused`` (client breaker) and ``unsent`` (a stop came first). ``stopped_by``: the signal or reason that
    stopped the run (None: it ran to the end); ``hung_up_at_stop``: attempts the stop hung up.
    ``tokens``: where the rows' token counts came from; ``stream_options``: whether streams asked for their
    usage (``sent``, ``dropped`` after the server refused it, ``off``); ``stream_options_refusal``: the refusal
    that dropped it; ``causes``: why attempts did not finish stop / length, counted;
    ``unknown_finish``: replies whose finish reason was not one the client knows (recorded as ``stop``);
    ``invalid_rows``: rows that failed validation (a bug; not written); ``sink_errors``: rows the sink
    raised on; ``finish``: attempts by finish reason.
    """

    rows: list[dict[str, Any]]
    started_unix_s: float
    duration_s: float
    scheduled: int
    sent: int
    refused: int
    unsent: int
    lateness: Lateness
    stopped_by: str | None
    hung_up_at_stop: int
    tokens: TokenSources
    stream_options: str
    stream_options_refusal: StreamOptionsRefusal | None
    causes: list[Cause]
    unknown_finish: int
    malformed_events: int
    invalid_rows: int
    sink_errors: int
    finish: dict[str, int]
    breaker_events: list[BreakerEvent]

    def top_causes(self, limit: int = TOP_CAUSES) -> dict[str, list[tuple[str, int]]]:
        """Per finish reason other than stop / length, its most frequent causes (:func:`top_causes`)."""
        return top_causes(self.causes, limit)

    def notes(self) -> list[str]:
        """Sentences a person should read beside the figures."""
        out = []
        if self.stopped_by is not None:
            out.append(f"stopped by {self.stopped_by}: {self.unsent:,} scheduled arrival(s) were never sent; "
                       f"{self.hung_up_at_stop:,} attempt(s) in flight were hung up (client_cancel, unless their "
                       "last token had arrived)")
        refusal = self.stream_options_refusal
        if refusal is not None:
            out.append(f"the server refused stream_options (HTTP {refusal.status} naming it, answering attempt "
                       f"{refusal.index}): later requests were sent without it, so their replies carry usage "
                       f"only if the server sends it unasked; {refusal.refused:,} attempt(s) carrying it were "
                       "refused (recorded as they ended)")
        if self.unknown_finish:
            out.append(f"{self.unknown_finish:,} repl(ies) ended with a finish reason the client does not know: "
                       "recorded as stop (the attempts log keeps the server's word)")
        if self.malformed_events:
            out.append(f"{self.malformed_events:,} event(s) were not JSON objects and were skipped")
        if self.refused:
            out.append(f"{self.refused:,} arrival(s) were not sent: the client breaker refused them "
                       "(rejected / circuit_open, honouring Retry-After or tripped by failures)")
        if self.lateness.late:
            out.append(f"{self.lateness.late:,} of {self.lateness.sent:,} send(s) were more than "
                       f"{LATE_THRESHOLD_S * 1e3:g} ms late against the schedule (max {self.lateness.max_s:.3f} s)")
        if self.invalid_rows:
            out.append(f"{self.invalid_rows:,} summary row(s) failed validation and were not written "
                       "(see the attempts log)")
        if self.sink_errors:
            out.append(f"{self.sink_errors:,} summary row(s) could not be handed to the sink")
        return out

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (without the rows)."""
        return {
            "started_unix_s": self.started_unix_s, "duration_s": self.duration_s, "scheduled": self.scheduled,
            "sent": self.sent, "refused": self.refused, "unsent": self.unsent, "lateness": self.lateness.to_dict(),
            "stopped_by": self.stopped_by, "hung_up_at_stop": self.hung_up_at_stop,
            "tokens": self.tokens.to_dict(), "stream_options": self.stream_options,
            "stream_options_refusal": (None if self.stream_options_refusal is None
                                       else self.stream_options_refusal.to_dict()),
            "causes": {reason: [{"cause": c, "count": n} for c, n in listed]
                       for reason, listed in self.top_causes(JSON_CAUSES).items()},
            "unknown_finish": self.unknown_finish, "malformed_events": self.malformed_events,
            "invalid_rows": self.invalid_rows, "sink_errors": self.sink_errors, "finish": dict(self.finish),
            "breaker_events": [e.to_dict() for e in self.breaker_events], "notes": self.notes(),
        }


def make_breaker(config: LoadConfig) -> CircuitBreaker:
    """The client breaker of ``config``'s target (named by its URL)."""
    if config.breaker:
        return CircuitBreaker(config.target.url, failure_kinds=CLIENT_FAILURE_KINDS)
    return CircuitBreaker(config.target.url, consecutive_failures=sys.maxsize, error_rate=None,
                          failure_kinds=CLIENT_FAILURE_KINDS)


class LoadRun:
    """One run of ``schedule`` against ``config``'s target; :meth:`run` (a coroutine) drives it.

    ``sink`` receives each valid row; ``attempts_log`` (a text file) one JSON line per attempt;
    ``on_progress`` a :class:`Progress` after each send and each finished attempt; ``breaker`` replaces the
    default client breaker (tests).
    """

    def __init__(self, schedule: Schedule, config: LoadConfig, *, sink: Sink | None = None,
                 attempts_log: TextIO | None = None, on_progress: Callable[[Progress], None] | None = None,
                 breaker: CircuitBreaker | None = None) -> None:
        self.schedule = schedule
        self.config = config
        self.sink = sink
        self.attempts_log = attempts_log
        self.on_progress = on_progress
        self.breaker = breaker if breaker is not None else make_breaker(config)
        self._ids = RequestIds(config.request_id)
        self.hangups = HangUps()
        self.rows: list[dict[str, Any]] = []
        self.stopped_by: str | None = None
        self._stop: asyncio.Future[None] | None = None
        self._shape = config.shape()
        self._identity = config.identity()
        self._prompts = PromptBook(config.seed)
        self._late: list[float] = []
        self._finish: Counter[str] = Counter()
        self._counts = Counter[str]()
        self._causes: Counter[tuple[str, str]] = Counter()
        self._end_ns = 0
        self._stream_options = config.stream and config.stream_options
        self._refusal: StreamOptionsRefusal | None = None
        self._refused_options = 0

    # ---- control -----------------------------------------------------------------------------------

    def request_stop(self, why: str = "stop") -> None:
        """Stop sending; attempts in flight get ``stop_wait_s`` to end. A second call hangs them up now."""
        if self.stopped_by is None:
            self.stopped_by = why
            if self._stop is not None and not self._stop.done():
                self._stop.set_result(None)
        else:
            self.hangups.hang_up_all("stop")

    @property
    def stopping(self) -> bool:
        return self.stopped_by is not None

    # ---- the run -----------------------------------------------------------------------------------

    async def run(self) -> RunResult:
        """Send the schedule; return when every attempt has ended."""
        loop = asyncio.get_running_loop()
        self._stop = loop.create_future()
        if self.stopped_by is not None:
            self._stop.set_result(None)
        tasks: set[asyncio.Task[None]] = set()
        sem = asyncio.Semaphore(self.config.max_concurrency) if self.config.max_concurrency else None
        async with self._client(slow=False) as fast, self._client(slow=True) as slow:
            start_ns = time.monotonic_ns()
            started_unix_s = time.time()
            self._end_ns = start_ns
            dispatched = 0
            for arrival in self.schedule:
                due = start_ns + round(arrival.offset_s * NS)
                if not await self._sleep_until(due):
                    break
                if sem is not None and not await self._acquire(sem):
                    break
                dispatched += 1
                a = self._attempt(arrival, due)
                client = slow if a.plan.slow_tokens_per_s is not None else fast
                task = asyncio.create_task(self._send(client, a, sem))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await self._wait_for(tasks)
        return RunResult(
            rows=self.rows, started_unix_s=started_unix_s, duration_s=max(0, self._end_ns - start_ns) / NS,
            scheduled=len(self.schedule), sent=self._counts["sent"], refused=self._counts["refused"],
            unsent=len(self.schedule) - dispatched, lateness=Lateness.of(self._late), stopped_by=self.stopped_by,
            hung_up_at_stop=self.hangups.hung_up,
            tokens=TokenSources(self._counts["replies"], self._counts["tokens_usage"], self._counts["tokens_chunks"],
                                self._counts["prompt_usage"]),
            stream_options=self._stream_options_state(), stream_options_refusal=self._final_refusal(),
            causes=[Cause(f, c, n) for (f, c), n in sorted(self._causes.items())],
            unknown_finish=self._counts["unknown_finish"], malformed_events=self._counts["malformed"],
            invalid_rows=self._counts["invalid"], sink_errors=self._counts["sink_errors"],
            finish=dict(sorted(self._finish.items())), breaker_events=self.breaker.events())

    def _stream_options_state(self) -> str:
        if not (self.config.stream and self.config.stream_options):
            return "off"
        return "sent" if self._stream_options else "dropped"

    def _final_refusal(self) -> StreamOptionsRefusal | None:
        r = self._refusal
        return None if r is None else StreamOptionsRefusal(r.index, r.request_id, r.status, r.body,
                                                           self._refused_options)

    async def _wait_for(self, tasks: set[asyncio.Task[None]]) -> None:
        """Wait for the attempts in flight; after a stop, for ``stop_wait_s`` at most, then hang them up."""
        stop = self._stop
        assert stop is not None
        while tasks and not self.stopping:
            await asyncio.wait({*tasks, stop}, return_when=asyncio.FIRST_COMPLETED)
        if tasks:
            _, pending = await asyncio.wait(set(tasks), timeout=self.config.stop_wait_s)
            if pending:
                self.hangups.hang_up_all("stop")
        while tasks:
            await asyncio.wait(set(tasks))

    def _client(self, *, slow: bool) -> httpx.AsyncClient:
        rcvbuf = self.config.slow_rcvbuf_bytes if slow else None
        options = None if rcvbuf is None else [(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)]
        kept = (self.config.max_concurrency or 1000) if self.config.keep_alive else 0
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=kept, keepalive_expiry=KEEPALIVE_EXPIRY_S)
        transport = httpx.AsyncHTTPTransport(limits=limits, socket_options=options, trust_env=False)
        timeout = httpx.Timeout(connect=CONNECT_TIMEOUT_S, read=None, write=None, pool=None)
        return httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False)

    async def _sleep_until(self, due_ns: int) -> bool:
        """Wait until ``due_ns`` (monotonic); False when a stop came first."""
        stop = self._stop
        assert stop is not None
        while True:
            if stop.done():
                return False
            wait = (due_ns - time.monotonic_ns()) / NS
            if wait <= 0:
                return True
            await asyncio.wait((stop,), timeout=wait)

    async def _acquire(self, sem: asyncio.Semaphore) -> bool:
        """Take a concurrency slot; False (holding none) when a stop came first."""
        stop = self._stop
        assert stop is not None
        if not sem.locked():
            await sem.acquire()
            return True
        slot = asyncio.ensure_future(sem.acquire())
        await asyncio.wait((slot, stop), return_when=asyncio.FIRST_COMPLETED)
        if slot.done():
            return True
        slot.cancel()
        try:
            await slot
        except asyncio.CancelledError:
            return False
        sem.release()  # it was granted as it was cancelled
        return False

    def _attempt(self, arrival: Arrival, due_ns: int) -> Attempt:
        plan = self.config.behaviours.plan(arrival.index)
        return Attempt(self._ids.next(), arrival.index, arrival.offset_s, arrival.prompt_tokens,
                       arrival.output_tokens, plan, scheduled_ns=due_ns)

    def _refused(self, a: Attempt) -> None:
        a.breaker_refused = True
        a.sent_unix_s = time.time()
        a.end_ns = time.monotonic_ns()
        a.classify()
        self._counts["refused"] += 1
        self._finish_attempt(a)

    async def _send(self, client: httpx.AsyncClient, a: Attempt, sem: asyncio.Semaphore | None) -> None:
        # The breaker decides at the moment of sending (no await between its answer and the send), so a
        # Retry-After that arrived after the schedule handed this attempt over still holds it back.
        if not self.breaker.allow().admitted:
            self._refused(a)
            if sem is not None:
                sem.release()
            return
        a.asked_usage = self._stream_options
        body = self._shape.body(self._prompts.prompt(a.index, a.prompt_words), a.max_tokens,
                                stream_options=a.asked_usage)
        request = Request(self.config.target.url, body, self._shape.headers(a.request_id), self.config.stream,
                          self.config.request_id_header, self.config.keep_alive)
        self._counts["sent"] += 1
        self._progress()
        try:
            await send_attempt(client, request, a, self.hangups, on_headers=self._on_headers)
            if a.sent_ns is not None:
                self._late.append(max(0, a.sent_ns - a.scheduled_ns) / NS)
            self._check_stream_options(a)
            self._record_outcome(a)
        finally:
            if sem is not None:
                sem.release()
            self._finish_attempt(a)

    def _check_stream_options(self, a: Attempt) -> None:
        """Drop ``stream_options`` for the rest of the run when ``a`` carried it and the server refused it: a
        400 or 422 whose body names the field."""
        if not a.refused_stream_options:
            return
        self._refused_options += 1
        if self._refusal is None:
            self._refusal = StreamOptionsRefusal(a.index, a.request_id, a.status or 0, a.error_body or "", 0)
            self._stream_options = False

    def _on_headers(self, a: Attempt) -> None:
        """Honour a refusal's ``Retry-After`` the moment its headers arrive (before its body is read)."""
        if self.config.honour_retry_after and a.status in (429, 503) and a.retry_after is not None:
            self.breaker.honour_retry_after(a.retry_after)

    def _record_outcome(self, a: Attempt) -> None:
        """Report the attempt's outcome to the breaker (a deliberate hang-up before an answer says nothing)."""
        b = self.breaker
        if a.status is not None and a.status != 200:
            b.record_status(a.status)
            return
        f = a.finish_reason
        if f in ("stop", "length", "server_draining"):
            b.record_success()
        elif f == "deadline":
            b.record_failure("timeout")
        elif f == "client_cancel":
            if a.hangup_cause == "timeout":
                b.record_failure("timeout")
            elif a.status == 200:
                b.record_success()
        elif f == "error":
            b.record_failure(a.error_type or "read_error")

    def _finish_attempt(self, a: Attempt) -> None:
        self._end_ns = max(self._end_ns, a.end_ns or 0)
        row = attempt_row(a, self._identity)
        problems = validate_summary(row)
        entry = attempt_log_entry(a)
        self._finish[a.finish_reason] += 1
        self._counts["done"] += 1
        if a.finish_reason not in ("stop", "length"):
            self._counts["failed"] += 1
        if a.unknown_finish:
            self._counts["unknown_finish"] += 1
        if a.malformed_events:
            self._counts["malformed"] += a.malformed_events
        cause = a.cause()
        if cause is not None:
            self._causes[a.finish_reason, cause] += 1
        if a.replied:
            self._counts["replies"] += 1
            source = a.token_source
            if source is not None:
                self._counts["tokens_usage" if source == "usage" else "tokens_chunks"] += 1
            if a.usage_prompt_tokens is not None:
                self._counts["prompt_usage"] += 1
        if problems:
            self._counts["invalid"] += 1
            entry["invalid"] = [f"{p.rule}: {p.message}" for p in problems]
        else:
            self.rows.append(row)
            if self.sink is not None:
                try:
                    self.sink(row)
                except Exception:
                    self._counts["sink_errors"] += 1
        if self.attempts_log is not None:
            self.attempts_log.write(json.dumps(entry, separators=(",", ":")) + "\n")
        self._progress()

    def _progress(self) -> None:
        if self.on_progress is None:
            return
        c = self._counts
        self.on_progress(Progress(len(self.schedule), c["sent"], c["refused"], c["done"],
                                  c["sent"] + c["refused"] - c["done"], c["failed"]))


async def run_load(schedule: Schedule, config: LoadConfig, *, sink: Sink | None = None,
                   attempts_log: TextIO | None = None, on_progress: Callable[[Progress], None] | None = None,
                   handle_signals: bool = False, breaker: CircuitBreaker | None = None) -> RunResult:
    """Run ``schedule`` against ``config``'s target (see :class:`LoadRun`). With ``handle_signals``, SIGINT
    and SIGTERM stop the run (the first: stop sending and wait ``stop_wait_s``; the second: hang up now)."""
    run = LoadRun(schedule, config, sink=sink, attempts_log=attempts_log, on_progress=on_progress,
                  breaker=breaker)
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if handle_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, run.request_stop, sig.name)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - not the main thread
                pass
    try:
        return await run.run()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
