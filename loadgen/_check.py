"""One request, sent and then found in the server's own llmslo metrics: does this server record requests?

A server records its requests through llmslo when the ASGI middleware sits inside it (vLLM's ``--middleware``,
``add_middleware`` in SGLang, llama-cpp-python or any Starlette app), when ``llmslo gateway`` is in front of it,
or when it is ``llmslo serve``. :func:`check_server` proves it for one server, from the outside, the way its
operator would after installing: it reads the server's llmslo metrics, sends one streamed request with a fresh
request id (read as ``llmslo load`` reads every request: :func:`send_attempt`), reads the metrics again, and
looks for that id among the exemplars (OpenMetrics). The exemplar of ``llmslo_ttft_seconds`` carries the TTFT the
server measured for this very request, shown beside the client's.

Where the metrics are: ``METRICS_PATHS`` on the server's own address, the first that answers with llmslo series
(the middleware serves them at ``/llmslo/metrics`` by default, the gateway and ``llmslo serve`` at ``/metrics``),
or a URL given (the middleware's ``LLMSLO_METRICS_PORT`` server, the gateway's own port).

A bucket's exemplar is the last request that landed in it, so on a busy server another request may have replaced
this one's before the second read. Then another request is sent, up to ``tries`` in all, each with its own id,
until one is found; where none is, the verdict rests on the requests counter, which rose (``counted``), and says
so. Verdicts, best first: ``recorded`` (the id is an exemplar), ``counted`` (not found, but the counter rose),
``not_recorded`` (llmslo series, but this request left no trace: a route the middleware does not observe),
``no_metrics`` (no llmslo series where looked), ``request_failed`` (the request itself did not complete).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

import httpx

from llmslo.loadgen._attempt import Attempt, HangUps, Request, send_attempt
from llmslo.loadgen._target import RequestShape, Target, probe

METRICS_PATHS: tuple[str, ...] = ("/llmslo/metrics", "/metrics")
"""Where the server's llmslo metrics are looked for, in order, when no URL is given."""
OPENMETRICS_ACCEPT = "application/openmetrics-text; version=1.0.0, text/plain; version=0.0.4; q=0.5"
"""The ``Accept`` of a metrics read: OpenMetrics carries the exemplars."""
REQUESTS_TOTAL = "llmslo_requests_total"
"""The counter of requests that reached their terminal state (one sample per label set)."""
VERDICTS: tuple[str, ...] = ("recorded", "counted", "not_recorded", "no_metrics", "request_failed")
"""Every verdict, best first; the first two pass."""
PROMPT = "Say hello in five words."
AFTER_READS_S: tuple[float, ...] = (0.0, 0.1, 0.5)
"""The waits before each read after the request (seconds), until one shows it: a server may commit the request's
terminal state a moment after its last byte left."""
MAX_OTHER_FAMILIES = 1000
"""The most names of other metric families a read keeps."""


@dataclass(frozen=True)
class MetricsRead:
    """One read of a metrics URL. ``status`` None: no answer (``error`` says why)."""

    url: str
    status: int | None = None
    llmslo_families: int = 0
    """Metric families whose name starts with ``llmslo_``."""
    requests_total: float = 0.0
    """``llmslo_requests_total``, summed over its label sets."""
    exemplars: dict[str, float] = field(default_factory=dict)
    """Per family, the value of an exemplar whose ``request_id`` is the one looked for."""
    openmetrics: bool = False
    """The server answered in OpenMetrics (which carries exemplars)."""
    error: str | None = None
    others: tuple[str, ...] = ()
    """The names of the other metric families, sorted (at most :data:`MAX_OTHER_FAMILIES`): an engine's own
    series tell which engine answered."""

    @property
    def has_llmslo(self) -> bool:
        return self.status == 200 and self.llmslo_families > 0


@dataclass(frozen=True)
class RequestSeen:
    """The request as the client saw it (``llmslo load``'s classification)."""

    request_id: str
    status: int | None
    finish_reason: str
    cause: str | None
    """Why it did not complete (``HTTP 404 (...)``, ``connect_error: ...``); None when it did."""
    content_chunks: int
    prompt_tokens: int | None
    completion_tokens: int | None
    client_ttft_s: float | None
    e2e_s: float | None
    echoed_request_id: str | None
    """The request-id header of the response (None: absent)."""

    @property
    def completed(self) -> bool:
        return self.cause is None


@dataclass(frozen=True)
class CheckResult:
    """What :func:`check_server` found; ``verdict`` is one of :data:`VERDICTS`, ``advice`` what to do about it."""

    url: str
    endpoint: str
    model: str
    request: RequestSeen
    looked: tuple[MetricsRead, ...]
    """The reads of the metrics URLs before the request, in order, up to the first with llmslo series."""
    before: MetricsRead | None
    """The read with llmslo series before the (last) request (None: none had any)."""
    after: MetricsRead | None
    """The same URL read after the request (None: not read, no llmslo series before it)."""
    verdict: str
    advice: str | None
    sent: int = 1
    """Requests sent: more than one where a busy server's other requests replaced the exemplars of those before
    (``request`` is the last)."""

    @property
    def passed(self) -> bool:
        return self.verdict in ("recorded", "counted")

    @property
    def server_ttft_s(self) -> float | None:
        return None if self.after is None else self.after.exemplars.get("llmslo_ttft_seconds")

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["passed"] = self.passed
        out["server_ttft_s"] = self.server_ttft_s
        return out


def parse_metrics(text: str, request_id: str | None,
                  openmetrics: bool) -> tuple[int, float, dict[str, float], tuple[str, ...]]:
    """``(llmslo families, llmslo_requests_total summed, {family: exemplar value}, other family names)`` of an
    exposition, the exemplars those whose ``request_id`` label is ``request_id``. Raises ``ValueError`` for an
    unreadable text."""
    from prometheus_client.metrics_core import Metric
    from prometheus_client.openmetrics import parser as openmetrics_parser
    from prometheus_client.parser import text_string_to_metric_families as plain_families

    parse: Callable[[str], Iterable[Metric]] = (
        openmetrics_parser.text_string_to_metric_families if openmetrics else plain_families)
    families = 0
    total = 0.0
    found: dict[str, float] = {}
    others: set[str] = set()
    for family in parse(text):
        if not family.name.startswith("llmslo_"):
            if len(others) < MAX_OTHER_FAMILIES:
                others.add(family.name)
            continue
        families += 1
        for sample in family.samples:
            if sample.name == REQUESTS_TOTAL:
                total += sample.value
            ex = sample.exemplar
            if ex is not None and request_id is not None and ex.labels.get("request_id") == request_id:
                name = family.name if family.type != "counter" else f"{family.name}_total"
                found.setdefault(name, ex.value)
    return families, total, found, tuple(sorted(others))


async def read_metrics(client: httpx.AsyncClient, url: str, request_id: str | None = None) -> MetricsRead:
    """Read ``url`` (OpenMetrics when the server offers it). Never raises: a failure is in ``error``."""
    try:
        response = await client.get(url, headers={"accept": OPENMETRICS_ACCEPT})
    except httpx.HTTPError as exc:
        return MetricsRead(url, error=f"{type(exc).__name__}: {exc}")
    if response.status_code != 200:
        return MetricsRead(url, response.status_code, error=f"HTTP {response.status_code}")
    openmetrics = response.headers.get("content-type", "").startswith("application/openmetrics-text")
    try:
        families, total, found, others = parse_metrics(response.text, request_id, openmetrics)
    except ValueError as exc:
        return MetricsRead(url, 200, openmetrics=openmetrics, error=f"not a metrics exposition: {exc}")
    return MetricsRead(url, 200, families, total, found, openmetrics, others=others)


async def _read_after(client: httpx.AsyncClient, before: MetricsRead, request_id: str) -> MetricsRead:
    """``before``'s URL read again, up to :data:`AFTER_READS_S` times, until it shows the request."""
    after = before
    for wait_s in AFTER_READS_S:
        await asyncio.sleep(wait_s)
        after = await read_metrics(client, before.url, request_id)
        if after.exemplars or (after.requests_total > before.requests_total and not after.openmetrics):
            break  # (a counter that rose shows no more: on a busy server other requests move it before this one)
    return after


def _seen(a: Attempt) -> RequestSeen:
    ttft = None if not a.chunk_ns or a.sent_ns is None else (a.chunk_ns[0] - a.sent_ns) / 1e9
    end = a.last_received_ns
    e2e = None if end is None or a.sent_ns is None else (end - a.sent_ns) / 1e9
    return RequestSeen(a.request_id, a.status, a.finish_reason, a.cause(), len(a.chunk_ns),
                       a.usage_prompt_tokens, a.usage_completion_tokens, ttft, e2e, a.server_request_id)


def _verdict(seen: RequestSeen, before: MetricsRead | None, after: MetricsRead | None,
             looked: Sequence[MetricsRead], endpoint_path: str) -> tuple[str, str | None]:
    if not seen.completed:
        return "request_failed", (f"the request did not complete ({seen.cause or seen.finish_reason}): check the "
                                  "URL, --model and --endpoint first")
    if before is None or after is None or not after.has_llmslo:  # (gone between the two reads: the same advice)
        urls = ", ".join(read.url for read in looked)
        return "no_metrics", (f"no llmslo series at {urls}: the server does not record requests through llmslo. "
                              "Install the middleware (vllm serve ... --middleware llmslo.telemetry.LlmsloMiddleware; "
                              "app.add_middleware(LlmsloMiddleware)), or put llmslo gateway in front; if the metrics "
                              "are served elsewhere (LLMSLO_METRICS_PORT, LLMSLO_METRICS_PATH), give --metrics URL")
    if after.exemplars:
        return "recorded", None
    if after.requests_total > before.requests_total:
        rose = after.requests_total - before.requests_total
        why = ("the server answers without exemplars (not OpenMetrics)" if not after.openmetrics else
               "another request replaced this one's exemplars")
        return "counted", (f"{REQUESTS_TOTAL} rose by {rose:g}, but this request's id is not among the exemplars "
                           f"({why})")
    return "not_recorded", (f"{REQUESTS_TOTAL} did not move: this request was not recorded. The middleware observes "
                            f"the routes of LLMSLO_ROUTES only (default /v1/completions,/v1/chat/completions; this "
                            f"request went to {endpoint_path}); a server behind the gateway is recorded at the "
                            "gateway's address")


async def check_server(target: Target, *, model: str | None = None, metrics_url: str | None = None,
                       max_tokens: int = 16, request_id_header: str = "x-request-id", api_key: str | None = None,
                       timeout_s: float = 30.0, tries: int = 3,
                       transport: httpx.AsyncBaseTransport | None = None) -> CheckResult:
    """Send a streamed request to ``target`` between two reads of its llmslo metrics (see the module docstring);
    again, up to ``tries`` requests in all, while the counter rose but another request's exemplars replaced the
    last one's. ``model``: None asks the server (the first of ``/v1/models``). ``transport``: httpx's (tests).
    Raises :class:`Unreachable` when the server cannot be reached, ``LookupError`` when it lists no model and none
    is given, ``ValueError`` for ``tries`` below 1."""
    if tries < 1:
        raise ValueError(f"tries: at least 1, got {tries}")
    if model is None:
        models = await probe(target, api_key=api_key, timeout_s=timeout_s)
        if not models:
            raise LookupError(f"{target.models_url} lists no model: give the model with --model")
        model = models[0]
    urls = (metrics_url,) if metrics_url is not None else tuple(target.base + p for p in METRICS_PATHS)
    auth = {} if api_key is None else {"authorization": f"Bearer {api_key}"}
    endpoint_path = target.url[len(target.base):]
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False, headers=auth, transport=transport) as client:
        looked: list[MetricsRead] = []
        for url in urls:
            looked.append(await read_metrics(client, url))
            if looked[-1].has_llmslo:
                break
        before = looked[-1] if looked[-1].has_llmslo else None
        shape = RequestShape(model, target.endpoint, stream=True, ignore_eos=False, api_key=api_key,
                             request_id_header=request_id_header)
        sent = 0
        while True:
            sent += 1
            request_id = str(uuid.uuid4())
            seen = await _send(client, target, shape, request_id, max_tokens)
            after = None if before is None else await _read_after(client, before, request_id)
            verdict, advice = _verdict(seen, before, after, looked, endpoint_path)
            if verdict != "counted" or after is None or not after.openmetrics or sent == tries:
                break  # (without exemplars, another request cannot do better)
            before = after
    return CheckResult(target.base, target.endpoint, model, seen, tuple(looked), before, after, verdict, advice,
                       sent)


async def _send(client: httpx.AsyncClient, target: Target, shape: RequestShape, request_id: str,
                max_tokens: int) -> RequestSeen:
    """One streamed request with ``request_id``, read as ``llmslo load`` reads every request."""
    request = Request(target.url, shape.body(PROMPT, max_tokens), shape.headers(request_id), True,
                      shape.request_id_header)
    attempt = Attempt(request_id=request_id, index=0, scheduled_offset_s=0.0, prompt_words=len(PROMPT.split()),
                      max_tokens=max_tokens)
    attempt.asked_usage = True
    attempt.scheduled_ns = time.monotonic_ns()
    await send_attempt(client, request, attempt, HangUps())
    return _seen(attempt)
