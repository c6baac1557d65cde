"""``llmslo check``: send one request and find it in the server's own llmslo metrics (``llmslo.loadgen._check``)."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Annotated

import typer

from llmslo.cli._common import EXIT_INPUT, EXIT_USAGE, ApiKeyOption, ModelOption, ServerUrl, shown
from llmslo.cli._common import duration as _duration
from llmslo.cli._common import fail as _fail

if TYPE_CHECKING:
    from llmslo.engines import EngineProfile
    from llmslo.loadgen import CheckResult, MetricsRead

__all__ = ["check_command"]

_VERDICT_LINES = {
    "recorded": "recorded: the server's llmslo metrics carry this request's id",
    "counted": "counted: the server's request counter rose, but this request's id is not among its exemplars",
    "not_recorded": "NOT recorded: the server has llmslo metrics, but this request left no trace in them",
    "no_metrics": "NOT recorded: the server has no llmslo metrics where looked",
    "request_failed": "the request failed: nothing to look for",
}


PYTHON_ENGINES = frozenset({"vllm", "sglang", "trtllm"})
"""Engines whose API server is a Python (ASGI) app, which takes the middleware."""


def engine_of(reads: tuple[MetricsRead, ...]) -> tuple[MetricsRead, EngineProfile, int] | None:
    """The read whose metric families are most an engine's own (by the engine profiles), that engine, and how many
    of its series it had; None when no read had any."""
    from llmslo.engines import all_profiles

    best: tuple[MetricsRead, EngineProfile, int] | None = None
    for read in reads:
        for profile in all_profiles():
            n = sum(1 for name in read.others
                    if profile.by_name(name) is not None or profile.by_name(name + "_total") is not None)
            if n and (best is None or n > best[2]):
                best = (read, profile, n)
    return best


def engine_advice(r: CheckResult, found: tuple[MetricsRead, EngineProfile, int] | None) -> str | None:
    """For a server with no llmslo series whose /metrics is an engine's own (``found``, from :func:`engine_of`):
    what that means and what to do."""
    if found is None or r.verdict != "no_metrics":
        return None
    read, profile, n = found
    text = (f"{read.url} is {profile.name}'s own ({n} of its series): an engine's series count requests and "
            f"keep no record of each. Put llmslo gateway in front (llmslo gateway --backend {r.url}, then llmslo "
            "check the gateway's URL)")
    if profile.key in PYTHON_ENGINES:
        text += ", or install the middleware inside it (docs/middleware.md)"
    return text


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _lines(r: CheckResult) -> list[str]:
    q = r.request
    out = [f"server    {shown(r.url)} ({r.endpoint}, model {shown(r.model)})"]
    if q.completed:
        usage = ("no usage" if q.completion_tokens is None else
                 f"usage {q.prompt_tokens if q.prompt_tokens is not None else '?'} prompt + {q.completion_tokens} "
                 "completion tokens")
        chunks = f"{q.content_chunks} content chunk{'' if q.content_chunks == 1 else 's'}"
        out.append(f"request   id {q.request_id}: HTTP {q.status}, {chunks}, finish {q.finish_reason}, {usage}; "
                   f"client TTFT {_ms(q.client_ttft_s)}, e2e {_ms(q.e2e_s)}")
    else:
        out.append(f"request   id {q.request_id}: {q.finish_reason}: {shown(q.cause or '')}")
    echoed = q.echoed_request_id
    if q.status is not None:
        out.append("          " + ("the response echoes the id" if echoed == q.request_id else
                                   "the response carries no request id" if echoed is None else
                                   f"the response carries another request id: {shown(echoed)}"))
    reads = [("before", read) for read in r.looked] + ([("after ", r.after)] if r.after is not None else [])
    for when, read in reads:
        if read.has_llmslo:
            out.append(f"metrics   {when} {shown(read.url)}: {read.llmslo_families} llmslo metric families, "
                       f"llmslo_requests_total {read.requests_total:g}"
                       + ("" if read.openmetrics else " (plain text: no exemplars)"))
        else:
            out.append(f"metrics   {when} {shown(read.url)}: {shown(read.error or 'no llmslo series')}")
    if r.after is not None and r.after.exemplars:
        ttft = r.server_ttft_s
        parts = [f"{name} {_ms(value)}" for name, value in sorted(r.after.exemplars.items())
                 if name.endswith("_seconds")]
        out.append("exemplars " + (", ".join(parts) if parts else ", ".join(sorted(r.after.exemplars))))
        if ttft is not None and q.client_ttft_s is not None:
            relation = "<=" if ttft <= q.client_ttft_s else ">"
            out.append(f"          server TTFT {_ms(ttft)} {relation} client TTFT {_ms(q.client_ttft_s)}"
                       + ("" if ttft <= q.client_ttft_s else
                          ": the server timed a later first token than the first content chunk the client read"))
    if r.sent > 1:
        replaced = f"the first {r.sent - 1}" if r.verdict == "recorded" else "every one"
        out.append(f"          {r.sent} requests sent: other requests replaced the exemplars of {replaced}")
    out.append(f"verdict   {_VERDICT_LINES[r.verdict]}")
    advice = engine_advice(r, engine_of(r.looked)) or r.advice
    if advice:
        out.append(f"          {shown(advice)}")
    return out


def check_command(
    url: ServerUrl,
    model: ModelOption = None,
    endpoint: Annotated[str | None, typer.Option("--endpoint", help="completions or chat (default: from the URL, "
                                                 "else chat).")] = None,
    metrics: Annotated[str | None, typer.Option(
        "--metrics", help="The URL of the server's llmslo metrics (default: URL's /llmslo/metrics, where the "
        "middleware serves them, then /metrics, the gateway's and llmslo serve's); e.g. the middleware's "
        "LLMSLO_METRICS_PORT server: http://127.0.0.1:9464/metrics.", metavar="URL")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="max_tokens of the request.")] = 16,
    request_id_header: Annotated[str, typer.Option(
        "--request-id-header", help="The header that carries the request's id (the middleware's "
        "LLMSLO_REQUEST_ID_HEADER).", metavar="NAME")] = "X-Request-Id",
    api_key: ApiKeyOption = None,
    timeout: Annotated[str, typer.Option("--timeout", help="The longest wait for each answer.")] = "30s",
    tries: Annotated[int, typer.Option(
        "--tries", help="On a busy server another request may replace this one's exemplars before the metrics are "
        "read again: send up to this many requests, each with its own id, until one is found.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")] = False,
) -> None:
    """Send one request and find it in the server's own llmslo metrics: does the server record requests?

    Run it after installing the middleware in a Python server (vLLM's --middleware, add_middleware in SGLang,
    llama-cpp-python or any Starlette app), or against llmslo gateway or llmslo serve. It reads the server's
    llmslo metrics, sends one streamed request with a fresh X-Request-Id, reads them again and looks for that
    id among the exemplars (OpenMetrics): the exemplar of llmslo_ttft_seconds is the TTFT the server measured
    for this request, shown beside the client's.

    Start with: llmslo check http://127.0.0.1:8000

    Exit status: 0 recorded (or counted: the counter rose but a busy server replaced the exemplars of every
    request sent, see --tries); 1 not recorded, no llmslo metrics, the request failed, or the server cannot be
    reached; 2 the command line is wrong.
    """
    from llmslo.loadgen import ENDPOINTS, SpecError, Target, Unreachable, check_server, parse_request_id_header

    named = url.strip().rstrip("/").endswith(tuple(ENDPOINTS.values()))
    try:
        target = Target.parse(url, endpoint if endpoint is not None or named else "chat")
        header = parse_request_id_header(request_id_header)
    except SpecError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    if header is None:
        raise _fail("--request-id-header: the check needs a header to carry the request's id, got 'off'",
                    EXIT_USAGE)
    if max_tokens < 1:
        raise _fail(f"--max-tokens: must be at least 1, got {max_tokens}", EXIT_USAGE)
    if tries < 1:
        raise _fail(f"--tries: must be at least 1, got {tries}", EXIT_USAGE)
    if metrics is not None and not metrics.startswith(("http://", "https://")):
        raise _fail(f"--metrics: an http(s) URL, e.g. http://127.0.0.1:9464/metrics, got {metrics!r}", EXIT_USAGE)
    timeout_s = _duration("timeout", timeout)
    try:
        result = asyncio.run(check_server(target, model=model, metrics_url=metrics, max_tokens=max_tokens,
                                          request_id_header=header, api_key=api_key, timeout_s=timeout_s,
                                          tries=tries))
    except Unreachable as exc:
        raise _fail(f"{exc}; nothing was sent") from None
    except LookupError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        data = result.to_dict()
        found = engine_of(result.looked)
        data["engine"] = None if found is None else {"key": found[1].key, "name": found[1].name, "series": found[2],
                                                     "url": found[0].url}
        data["advice"] = engine_advice(result, found) or result.advice
        typer.echo(json.dumps(data, indent=2))
    else:
        for line in _lines(result):
            typer.echo(line)
    if not result.passed:
        raise typer.Exit(EXIT_INPUT)
