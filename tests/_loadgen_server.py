"""A small OpenAI-compatible ASGI server for the load generator's tests and benchmark (not llmslo.server).

Run it under a real uvicorn: ``python -m uvicorn llmslo.tests._loadgen_server:app --port 0``. What it answers
is chosen by a path prefix, so one process serves every case: ``/m/<k=v,k=v,...>/v1/completions`` (also
``/v1/chat/completions`` and ``/v1/models`` under the same prefix; no prefix: defaults). Keys:

- ``status=N`` answer that status instead of a reply, with ``type=T`` as the body's ``error.type`` (none
  without it; ``body_hex=HEX``: that body, byte for byte, instead) and ``retry_after=V`` as a ``Retry-After``
  header; ``reject_first=N`` does it only for the
  first N requests counted under ``key=K`` (the rest get the reply).
- ``tokens=N`` output tokens (default: the body's ``max_tokens``); ``k=N`` tokens per chunk; ``tps=X`` tokens
  per second; ``headers_delay=S`` seconds before the status line; ``pad=N`` bytes of padding per chunk;
  ``stamp=1`` each chunk carries ``t_ns``, the server's ``time.monotonic_ns()`` at send.
- ``usage=0`` no usage chunk even when asked (a whole reply: no ``usage``); ``per_chunk_usage=1`` every chunk
  carries cumulative usage.
- ``finish=R`` the last chunk's finish reason (default ``length``; ``none``: no finish reason);
  ``done=0`` no ``[DONE]``; ``drain_after=N`` after N tokens a ``server_draining`` finish with
  ``drain_reason``; ``error_after=N,error_type=T`` after N tokens an error event of type T;
  ``truncate_after=N`` the body ends cleanly after N tokens (no finish, no ``[DONE]``);
  ``reset_after=N`` the connection is dropped mid-body after N tokens.
- ``malformed=1`` a non-JSON event first; ``crlf=1`` CRLF line ends and a comment line per event.
- ``uuid_ids=1`` as llama-cpp-python's server (starlette-context's request-id plugin, validating): a request
  whose ``X-Request-Id`` is not a UUID gets 400 with an empty body, on every path.
- ``refuse_stream_options=N`` a request whose body has ``stream_options`` gets status N (400 or 422) with an
  error body naming the field (422: pydantic's shape; 400: ``error.message``).
- ``id_header=NAME`` the request id comes from header NAME (default ``X-Request-Id``) and is echoed in it.

``GET /stats/<request_id>`` returns what the server recorded of that request: the headers and body it got,
the first and last send times (monotonic ns), every send time, the tokens sent and whether the client
disconnected. Every response echoes ``X-Request-Id``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MODEL = "test-model"
MAX_RECORDS = 20_000

_records: OrderedDict[str, dict[str, Any]] = OrderedDict()
_counters: dict[str, int] = {}


def _mode(path: str) -> tuple[dict[str, str], str]:
    """The mode of a path prefix ``/m/<k=v,...>`` and the rest of the path."""
    if not path.startswith("/m/"):
        return {}, path
    spec, _, rest = path[3:].partition("/")
    mode: dict[str, str] = {}
    for item in unquote(spec).split(","):
        key, _, value = item.partition("=")
        if key:
            mode[key] = value
    return mode, "/" + rest


def _is_uuid(text: str) -> bool:
    import uuid

    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _record(rid: str) -> dict[str, Any]:
    rec = _records.get(rid)
    if rec is None:
        rec = {"send_ns": [], "first_send_ns": None, "last_send_ns": None, "tokens": 0, "disconnected": False,
               "finished": False}
        _records[rid] = rec
        while len(_records) > MAX_RECORDS:
            _records.popitem(last=False)
    return rec


async def _json(send: Send, status: int, obj: object, headers: list[tuple[bytes, bytes]]) -> None:
    body = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *headers]})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(parts)


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """The ASGI application."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    mode, path = _mode(scope["path"])
    headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
    id_header = mode.get("id_header", "x-request-id").lower()
    rid = headers.get(id_header, "none")
    echo = [(id_header.encode(), rid.encode())]
    if mode.get("uuid_ids") == "1" and "x-request-id" in headers and not _is_uuid(headers["x-request-id"]):
        await send({"type": "http.response.start", "status": 400, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/v1/models":
        await _json(send, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]}, echo)
        return
    if path.startswith("/stats/"):
        await _json(send, 200, _records.get(path[7:], {}), echo)
        return
    if path == "/health":
        await _json(send, 200, {"ok": True}, echo)
        return
    if path not in ("/v1/completions", "/v1/chat/completions"):
        await _json(send, 404, {"error": {"type": "not_found", "message": path}}, echo)
        return
    raw = await _read_body(receive)
    try:
        body = json.loads(raw)
    except ValueError:
        await _json(send, 400, {"error": {"type": "invalid_request", "message": "body is not JSON"}}, echo)
        return
    rec = _record(rid)
    rec["headers"] = headers
    rec["body"] = body
    refuse = mode.get("refuse_stream_options")
    if refuse and isinstance(body, dict) and "stream_options" in body:
        rec["finished"] = True
        if refuse == "422":
            await _json(send, 422, {"detail": [{"type": "extra_forbidden", "loc": ["body", "stream_options"],
                                                "msg": "Extra inputs are not permitted"}]}, echo)
        else:
            await _json(send, int(refuse), {"error": {"message": "Unknown field: stream_options",
                                                      "type": "invalid_request_error", "code": int(refuse)}}, echo)
        return
    if "headers_delay" in mode:
        await asyncio.sleep(float(mode["headers_delay"]))
    if await _refuse(mode, send, echo):
        return
    chat = path.endswith("/chat/completions")
    if not body.get("stream"):
        await _reply(mode, body, chat, send, echo, rec)
        return
    await _stream(mode, body, chat, receive, send, echo, rec)


async def _refuse(mode: dict[str, str], send: Send, echo: list[tuple[bytes, bytes]]) -> bool:
    """Answer the mode's refusal status, if it asks for one now; True when it did."""
    if "status" not in mode:
        return False
    if "reject_first" in mode:
        key = mode.get("key", "")
        seen = _counters.get(key, 0)
        _counters[key] = seen + 1
        if seen >= int(mode["reject_first"]):
            return False
    status = int(mode["status"])
    extra = list(echo)
    if "retry_after" in mode:
        extra.append((b"retry-after", mode["retry_after"].encode()))
    if "body_hex" in mode:
        await send({"type": "http.response.start", "status": status, "headers": extra})
        await send({"type": "http.response.body", "body": bytes.fromhex(mode["body_hex"])})
        return True
    err: dict[str, object] = {"message": f"refused with {status}", "code": status}
    if "type" in mode:
        err["type"] = mode["type"]
    await _json(send, status, {"error": err}, extra)
    return True


def _usage(body: dict[str, Any], tokens: int) -> dict[str, int]:
    prompt = body.get("prompt")
    if prompt is None:
        prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
    words = len(str(prompt).split())
    return {"prompt_tokens": words, "completion_tokens": tokens, "total_tokens": words + tokens}


async def _reply(mode: dict[str, str], body: dict[str, Any], chat: bool, send: Send,
                 echo: list[tuple[bytes, bytes]], rec: dict[str, Any]) -> None:
    tokens = int(mode.get("tokens", body.get("max_tokens", 16)))
    text = "tok " * tokens
    finish = mode.get("finish", "length")
    choice: dict[str, Any] = {"index": 0, "finish_reason": None if finish == "none" else finish}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    rec["tokens"] = tokens
    rec["finished"] = True
    reply: dict[str, Any] = {"id": "cmpl-test", "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": MODEL, "choices": [choice]}
    if mode.get("usage") != "0":
        reply["usage"] = _usage(body, tokens)
    await _json(send, 200, reply, echo)


async def _stream(mode: dict[str, str], body: dict[str, Any], chat: bool, receive: Receive, send: Send,
                  echo: list[tuple[bytes, bytes]], rec: dict[str, Any]) -> None:
    gone = asyncio.Event()

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                rec["disconnected"] = not rec["finished"]
                gone.set()
                return

    watcher = asyncio.create_task(watch())
    try:
        await _stream_body(mode, body, chat, send, echo, rec, gone)
    except OSError:
        rec["disconnected"] = True
    finally:
        watcher.cancel()


async def _stream_body(mode: dict[str, str], body: dict[str, Any], chat: bool, send: Send,
                       echo: list[tuple[bytes, bytes]], rec: dict[str, Any], gone: asyncio.Event) -> None:
    tokens = int(mode.get("tokens", body.get("max_tokens", 16)))
    per_chunk = max(1, int(mode.get("k", "1")))
    tps = float(mode["tps"]) if "tps" in mode else None
    pad = "x" * int(mode.get("pad", "0"))
    stamp = mode.get("stamp") == "1"
    crlf = mode.get("crlf") == "1"
    usage_asked = bool((body.get("stream_options") or {}).get("include_usage")) and mode.get("usage") != "0"
    continuous = mode.get("per_chunk_usage") == "1"
    finish = mode.get("finish", "length")
    stops = {name: int(mode[name]) for name in ("drain_after", "error_after", "truncate_after", "reset_after")
             if name in mode}
    end = "\r\n" if crlf else "\n"

    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), *echo]})

    async def event(obj: object) -> None:
        if gone.is_set():
            raise OSError("client disconnected")
        data = obj if isinstance(obj, str) else json.dumps(obj)
        text = (f": keep-alive{end}" if crlf else "") + f"data: {data}{end}{end}"
        now = time.monotonic_ns()
        if rec["first_send_ns"] is None:
            rec["first_send_ns"] = now
        rec["send_ns"].append(now)
        await send({"type": "http.response.body", "body": text.encode(), "more_body": True})
        rec["last_send_ns"] = time.monotonic_ns()

    def chunk(n: int, sent: int, reason: str | None) -> dict[str, Any]:
        piece = "tok " * n
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
        if chat:
            choice["delta"] = {"content": piece} | ({"role": "assistant"} if sent == 0 else {})
        else:
            choice["text"] = piece
        obj: dict[str, Any] = {"id": "cmpl-test", "object": "chat.completion.chunk" if chat else "text_completion",
                               "created": int(time.time()), "model": MODEL, "choices": [choice]}
        if continuous:
            obj["usage"] = _usage(body, sent + n)
        if stamp:
            obj["t_ns"] = time.monotonic_ns()
        if pad:
            obj["pad"] = pad
        return obj

    if mode.get("malformed") == "1":
        await event("this is not json")
    started = time.monotonic()
    sent = 0
    while sent < tokens:
        for name, after in stops.items():
            if sent >= after:
                await _stop_early(name, mode, body, event, send, usage_asked, sent, rec)
                return
        n = min(per_chunk, tokens - sent)
        last = sent + n >= tokens
        reason = None if not last or finish == "none" else finish
        if tps is not None:
            due = started + (sent + n - 1) / tps
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        await event(chunk(n, sent, reason))
        sent += n
        rec["tokens"] = sent
    if usage_asked:
        await event({"id": "cmpl-test", "object": "text_completion", "model": MODEL, "choices": [],
                     "usage": _usage(body, sent)})
    if mode.get("done", "1") == "1":
        await event("[DONE]")
    rec["finished"] = True
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _stop_early(name: str, mode: dict[str, str], body: dict[str, Any], event: Callable[[object], Awaitable[None]],
                      send: Send, usage_asked: bool, sent: int, rec: dict[str, Any]) -> None:
    if name == "reset_after":
        raise RuntimeError("the test server drops this connection mid-body")  # uvicorn aborts the connection
    if name == "drain_after":
        await event({"id": "cmpl-test", "object": "text_completion", "model": MODEL, "drain_reason": "idle",
                     "retryable": True, "choices": [{"index": 0, "text": "", "finish_reason": "server_draining"}]})
        if usage_asked:
            await event({"id": "cmpl-test", "choices": [], "usage": _usage(body, sent)})
        await event("[DONE]")
    elif name == "error_after":
        await event({"error": {"type": mode.get("error_type", "error"), "code": 500, "message": "stopped"}})
        await event("[DONE]")
    rec["finished"] = True
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class ServerProcess:
    """This module's app under ``python -m uvicorn`` on 127.0.0.1, in its own process. The listening socket is
    made here (a port the OS picks) and handed to uvicorn (``--fd``); ``sndbuf`` sets its ``SO_SNDBUF``, which
    the connections it accepts inherit (bytes; None: the kernel's autotuning). ``cpus`` pins the server to those
    CPUs. Its log is kept in memory. Stop it with :meth:`stop` (or ``with``)."""

    def __init__(self, *, cpus: set[int] | None = None, sndbuf: int | None = None, timeout_s: float = 60.0) -> None:
        import os
        import subprocess
        import sys
        import threading

        from llmslo.tests._listener import tcp_listener

        self.log: list[str] = []
        listener = tcp_listener(sndbuf)
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
                [sys.executable, "-m", "uvicorn", "llmslo.tests._loadgen_server:app", "--fd", str(listener.fileno()),
                 "--lifespan", "off", "--no-access-log"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, pass_fds=[listener.fileno()],
                preexec_fn=prepare)
        finally:
            listener.close()  # the child holds its own copy
        started = threading.Event()

        def read_log() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)
                if "Uvicorn running" in line:
                    started.set()
            started.set()

        self._reader = threading.Thread(target=read_log, daemon=True)
        self._reader.start()
        if not started.wait(timeout=timeout_s) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("uvicorn did not start:\n" + "".join(self.log))

    def url(self, **mode: object) -> str:
        """The base URL of a mode (``url(status=429, retry_after=1)``); no mode: the plain server."""
        base = f"http://127.0.0.1:{self.port}"
        if not mode:
            return base
        return base + "/m/" + ",".join(f"{k}={v}" for k, v in mode.items())

    def stats(self, request_id: str) -> dict[str, Any]:
        """What the server recorded of ``request_id``."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats/{request_id}", timeout=10) as r:
            data: dict[str, Any] = json.loads(r.read())
        return data

    def wait_for(self, request_id: str, key: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """The server's record of ``request_id`` once ``key`` is true in it (or when ``timeout_s`` ran out)."""
        import time

        end = time.monotonic() + timeout_s
        while True:
            seen = self.stats(request_id)
            if seen.get(key) or time.monotonic() > end:
                return seen
            time.sleep(0.02)

    def stop(self) -> None:
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self._reader.join(timeout=5)
            self.proc.stderr.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
