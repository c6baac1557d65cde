"""A small OpenAI-compatible Starlette app for the middleware's tests and benchmark, and a uvicorn runner.

``make_app()`` answers ``POST /v1/completions`` and ``/v1/chat/completions`` (streamed with Starlette's
``StreamingResponse``, or one JSON reply) shaped as vLLM shapes them (a role chunk first in chat, compact
JSON, a last chunk with the finish reason, a ``usage`` chunk when ``stream_options.include_usage``), and
``GET /other`` (a route the middleware does not observe). The query string chooses the case:

- ``tokens=N`` output tokens (default: the body's ``max_tokens``, else 8); ``k=N`` tokens per chunk;
  ``tps=X`` tokens per second; ``first_delay=S`` seconds between the role chunk and the first token;
  ``finish=R`` the finish reason (default ``length``); ``per_chunk_usage=1`` cumulative usage on every chunk;
  ``spaced=1`` JSON with spaces after ``:`` and ``,`` (as ``json.dumps`` writes it) and CRLF line ends;
  ``text=T`` each token's text (default ``tok``);
- ``status=N`` answer that status with ``type=T`` as the body's ``error.type`` (none without it),
  ``retry_after=V`` as ``Retry-After``, ``empty=1`` an empty body;
- ``raise=1`` raise before answering; ``raise_after=N`` raise after N tokens of a stream;
- ``error_after=N`` after N tokens an error event whose type is ``error_type`` (default ``error``).

Every response carries ``x-app-request-id``: the ``X-Request-Id`` the app saw (``none`` without one).

Module-level ``app`` is ``make_app()`` with :class:`LlmsloMiddleware` added with no arguments (as ``vllm
serve --middleware`` adds it) when ``LLMSLO_TEST_MIDDLEWARE=1``: configured by the ``LLMSLO_*`` variables.
:class:`Uvicorn` runs any ``module:attribute`` app under ``python -m uvicorn`` on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "test-model"


def _dumps(obj: object, spaced: bool) -> str:
    return json.dumps(obj) if spaced else json.dumps(obj, separators=(",", ":"))


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _generate(request: Request) -> Response:
    q = request.query_params
    rid = request.headers.get("x-request-id", "none")
    echo = {"x-app-request-id": rid}
    if q.get("raise") == "1":
        await request.body()  # read first: a socket closed with an unread body resets, and may lose the 500
        raise RuntimeError("the app failed")
    if "status" in q:
        status = int(q["status"])
        headers = dict(echo)
        if "retry_after" in q:
            headers["retry-after"] = q["retry_after"]
        if q.get("empty") == "1":
            return Response(b"", status_code=status, headers=headers)
        err: dict[str, object] = {"message": f"refused with {status}", "code": status}
        if "type" in q:
            err["type"] = q["type"]
        return JSONResponse({"error": err}, status_code=status, headers=headers)
    body = await request.json()
    chat = request.url.path.endswith("/chat/completions")
    tokens = int(q.get("tokens", body.get("max_tokens", 8)))
    prompt = len(str(body.get("prompt", body.get("messages", ""))).split())
    finish = q.get("finish", "length")
    text = q.get("text", "tok")
    if not body.get("stream"):
        choice: dict[str, object] = {"index": 0, "finish_reason": finish}
        if chat:
            choice["message"] = {"role": "assistant", "content": text * tokens}
        else:
            choice["text"] = text * tokens
        return JSONResponse({"id": "cmpl-1", "object": "chat.completion" if chat else "text_completion",
                             "created": 1, "model": MODEL, "choices": [choice],
                             "usage": _usage(prompt, tokens)}, headers=echo)
    usage_asked = bool((body.get("stream_options") or {}).get("include_usage"))
    return StreamingResponse(_events(q, chat, prompt, tokens, finish, text, usage_asked),
                             media_type="text/event-stream", headers=echo)


async def _events(q: Mapping[str, str], chat: bool, prompt: int, tokens: int, finish: str, text: str,
                  usage_asked: bool) -> AsyncIterator[bytes]:
    spaced = q.get("spaced") == "1"
    end = "\r\n\r\n" if spaced else "\n\n"
    k = max(1, int(q.get("k", "1")))
    tps = float(q["tps"]) if "tps" in q else None
    continuous = q.get("per_chunk_usage") == "1"
    raise_after = int(q["raise_after"]) if "raise_after" in q else None
    error_after = int(q["error_after"]) if "error_after" in q else None
    head = {"id": "chatcmpl-1" if chat else "cmpl-1", "object": "chat.completion.chunk" if chat else
            "text_completion", "created": int(time.time()), "model": MODEL}

    def event(obj: object) -> bytes:
        return f"data: {obj if isinstance(obj, str) else _dumps(obj, spaced)}{end}".encode()

    def chunk(piece: str, reason: str | None, sent: int, role: bool = False) -> bytes:
        choice: dict[str, object] = {"index": 0}
        if chat:
            choice["delta"] = {"role": "assistant", "content": piece} if role else {"content": piece}
        else:
            choice["text"] = piece
        choice["logprobs"] = None
        choice["finish_reason"] = reason
        obj: dict[str, object] = {**head, "choices": [choice]}
        if continuous:
            obj["usage"] = _usage(prompt, sent)
        return event(obj)

    if chat:
        yield chunk("", None, 0, role=True)
    if "first_delay" in q:
        await asyncio.sleep(float(q["first_delay"]))
    started = time.monotonic()
    sent = 0
    while sent < tokens:
        if raise_after is not None and sent >= raise_after:
            raise RuntimeError("the app failed mid-stream")
        if error_after is not None and sent >= error_after:
            yield event({"error": {"type": q.get("error_type", "error"), "code": 500, "message": "stopped"}})
            yield event("[DONE]")
            return
        n = min(k, tokens - sent)
        if tps is not None:
            wait = started + (sent + n - 1) / tps - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        sent += n
        yield chunk(text * n, finish if sent >= tokens else None, sent)
    if usage_asked:
        yield event({**head, "choices": [], "usage": _usage(prompt, sent)})
    yield event("[DONE]")


async def _other(request: Request) -> Response:
    return JSONResponse({"ok": True, "x-request-id": request.headers.get("x-request-id")})


def make_app() -> Starlette:
    """The app without any middleware (add it with ``app.add_middleware``)."""
    return Starlette(routes=[
        Route("/v1/completions", _generate, methods=["POST"]),
        Route("/v1/chat/completions", _generate, methods=["POST"]),
        Route("/other", _other, methods=["GET", "POST"]),
    ])


app = make_app()
if os.environ.get("LLMSLO_TEST_MIDDLEWARE") == "1":
    from llmslo.telemetry import LlmsloMiddleware

    app.add_middleware(LlmsloMiddleware)


def reference_app() -> Any:
    """llmslo's own reference server (``llmslo serve``'s ASGI app) with its telemetry and controls off
    (``--no-telemetry``) and the middleware around it, configured by the ``LLMSLO_*`` variables; its engine
    runs ``LLMSLO_TEST_SPEED`` times faster than the fitted profile (default 10). Each POST the ASGI server
    hands over is logged as ``llmslo-test-seen <X-Request-Id>`` on stderr. A uvicorn factory."""
    from llmslo.server import ServerApp, ServerConfig
    from llmslo.telemetry import LlmsloMiddleware

    speed = float(os.environ.get("LLMSLO_TEST_SPEED", "10"))
    observed = LlmsloMiddleware(ServerApp(ServerConfig(telemetry=False, speed=speed)))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":  # the requests the server got: on its log
            rid = dict(scope["headers"]).get(b"x-request-id", b"-").decode("latin-1")
            print(f"llmslo-test-seen {rid}", file=sys.stderr, flush=True)
        await observed(scope, receive, send)

    return app


# ---- running an app under uvicorn -----------------------------------------------------------------------


class Uvicorn:
    """``python -m uvicorn APP`` on 127.0.0.1 (a port the OS picks, handed over with ``--fd``), its log kept in
    memory; ``env`` adds to the environment; ``factory``: APP is a function making the app; ``cpus`` pins it.
    Stop it with :meth:`stop` (SIGTERM: uvicorn shuts down and the process exits normally) or ``with``."""

    def __init__(self, target: str, *, env: Mapping[str, str] | None = None, lifespan: str = "auto",
                 factory: bool = False, cpus: set[int] | None = None, timeout_s: float = 60.0) -> None:
        from llmslo.tests._listener import tcp_listener

        self.log: list[str] = []
        listener = tcp_listener()
        self.port: int = listener.getsockname()[1]

        def prepare() -> None:  # in the child, before uvicorn starts
            try:  # Linux: the server gets SIGTERM if the process that started it dies first
                import ctypes
                import signal

                ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
            except (OSError, AttributeError):
                pass
            if cpus is not None:
                os.sched_setaffinity(0, cpus)

        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", target, "--fd", str(listener.fileno()), "--lifespan", lifespan,
                 "--no-access-log", "--timeout-graceful-shutdown", "5", *(["--factory"] if factory else [])],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, pass_fds=[listener.fileno()],
                preexec_fn=prepare, env={**os.environ, **(env or {})})
        finally:
            listener.close()
        started = threading.Event()

        def read_log() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)
                if "Uvicorn running" in line or "Application startup complete" in line:
                    started.set()
            started.set()

        self._reader = threading.Thread(target=read_log, daemon=True)
        self._reader.start()
        if not started.wait(timeout=timeout_s) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("uvicorn did not start:\n" + "".join(self.log))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL after 15 s); its exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self._reader.join(timeout=5)
            self.proc.stderr.close()
        return self.proc.returncode

    def __enter__(self) -> Uvicorn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 a moment ago."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def read_jsonl(folder: Any) -> list[dict[str, Any]]:
    """Every summary row of the JSONL files in ``folder``."""
    from pathlib import Path

    return [json.loads(line) for path in sorted(Path(folder).glob("*.jsonl"))
            for line in path.read_text().splitlines() if line]
