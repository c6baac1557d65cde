"""A small OpenAI-compatible server around a transformers causal LM on a GPU, for the GPU run (``bench/gpu_run.sh``).

The GPU machine has torch and transformers but no vLLM and no network, so this is the engine there: a plain ASGI
app (no framework) that streams ``/v1/completions`` and ``/v1/chat/completions`` as SSE, with ``usage`` at the end
when ``stream_options.include_usage`` asks for it, and lists one model at ``/v1/models``. ``LlmsloMiddleware`` wraps
it exactly as it wraps vLLM (``--middleware``): no argument, configured by the ``LLMSLO_*`` environment.

The model (``--model-size``): a Llama architecture built on the GPU with random weights in bfloat16 (no weights
can be fetched there). Its words are meaningless; its arithmetic, memory traffic and timing are a real
transformer's: prefill over the prompt, then one forward pass per token with a KV cache. A prompt's tokens are
its UTF-8 bytes (ids 3..258); a generated id is shown as a short word. End of sequence is switched off, so every
reply runs to ``max_tokens`` unless the client hangs up, which stops the generation at the next token.

Concurrency: ``--slots`` generations run at once (each its own decode loop in a worker thread; no batching
across requests); more wait in the executor's queue, which is the server's queue time.

``--model-size cpu-stub`` needs no torch: a stand-in that emits one id every ``--stub-token-s`` seconds, so the
HTTP, SSE and middleware path can be tested on a machine without a GPU (it says so in ``/v1/models``).

Run: ``LLMSLO_SUMMARY_PATH=summaries python -m uvicorn --factory llmslo.bench.gpu_engine:app ...`` (the factory
reads ``GPU_ENGINE_*`` variables), or ``python -m llmslo.bench.gpu_engine serve --port 8000``;
``python -m llmslo.bench.gpu_engine calibrate URL`` times it (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

LOGGER = logging.getLogger("llmslo.bench.gpu_engine")
BYTE_OFFSET = 3
"""A prompt byte ``b`` is token id ``b + BYTE_OFFSET`` (ids 0..2 are left for special tokens)."""
MAX_PROMPT_TOKENS = 16384
"""The longest prompt taken, tokens (bytes); longer ones are refused with 400."""
SIZES: dict[str, dict[str, int]] = {
    # hidden, intermediate, layers, heads, kv heads: about 1.1 B and 0.16 B parameters with a 32,000-word vocabulary
    "1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
           "num_key_value_heads": 4},
    "160m": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
             "num_key_value_heads": 4},
}
VOCAB = 32000


class TokenSource(Protocol):
    """Generates token ids for a prompt: calls ``emit(id)`` once per token, stops early when ``stop`` is set."""

    name: str

    def generate(self, prompt_ids: list[int], max_tokens: int, emit: Callable[[int], None],
                 stop: threading.Event) -> None: ...


class StubSource:
    """No model: one id every ``token_s`` seconds after ``prefill_s`` (a stand-in for tests without a GPU)."""

    def __init__(self, token_s: float = 0.005, prefill_s: float = 0.01) -> None:
        self.name = "cpu-stub (no model: a stand-in for tests)"
        self.token_s = token_s
        self.prefill_s = prefill_s

    def generate(self, prompt_ids: list[int], max_tokens: int, emit: Callable[[int], None],
                 stop: threading.Event) -> None:
        if stop.wait(self.prefill_s):
            return
        for i in range(max_tokens):
            emit((sum(prompt_ids) + i) % VOCAB)
            if stop.wait(self.token_s):
                return


class TorchSource:
    """A random-weight Llama in bfloat16 on the GPU: greedy decoding that never ends early (no end of sequence)."""

    def __init__(self, size: str, device: str = "cuda") -> None:
        import torch  # type: ignore[import-not-found]
        from transformers import LlamaConfig, LlamaForCausalLM  # type: ignore[import-not-found]

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=20480, **SIZES[size])
        with torch.device(device):
            model = LlamaForCausalLM(config).to(torch.bfloat16)
        model.eval()
        self.model = model
        self.device = device
        self.torch = torch
        params = sum(p.numel() for p in model.parameters())
        self.name = f"llama-random-{size} ({params / 1e9:.2f} B parameters, bfloat16, {device})"

    def generate(self, prompt_ids: list[int], max_tokens: int, emit: Callable[[int], None],
                 stop: threading.Event) -> None:
        """Prefill, then one forward pass per token over the request's own KV cache (greedy). A decode loop of
        plain forward calls, rather than ``generate``, keeps the worker threads from sharing any state but
        the weights."""
        torch = self.torch
        with torch.inference_mode():
            ids = torch.tensor([prompt_ids], device=self.device)
            out = self.model(input_ids=ids, use_cache=True)
            for _ in range(max_tokens):
                token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
                emit(int(token.item()))  # waits for the GPU: the token exists now
                if stop.is_set():
                    return
                out = self.model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)


def word(token_id: int) -> str:
    """A generated id shown as a short lower-case word (random weights make no language)."""
    letters = []
    n = token_id
    while True:
        n, r = divmod(n, 26)
        letters.append(chr(97 + r))
        if n == 0:
            return " " + "".join(letters)


def tokenize(text: str) -> list[int]:
    return [b + BYTE_OFFSET for b in text.encode("utf-8")]


@dataclass
class Job:
    """One generation: ids flow from the worker thread to the request's coroutine through ``queue``."""

    queue: asyncio.Queue[int | None]
    stop: threading.Event
    error: BaseException | None = None


class EngineApp:
    """The ASGI app: routes, SSE framing, and the worker pool that runs ``source.generate``."""

    def __init__(self, source: TokenSource, model: str, slots: int) -> None:
        self.source = source
        self.model = model
        self.executor = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="generate")

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    self.executor.shutdown(wait=False, cancel_futures=True)
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path in ("/health", "/ready"):
            await _json(send, 200, {"status": "ok"})
        elif method == "GET" and path == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [
                {"id": self.model, "object": "model", "owned_by": "llmslo-bench", "description": self.source.name}]})
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            await self._complete(path.endswith("chat/completions"), receive, send)
        else:
            await _json(send, 404, {"error": {"message": f"no route {method} {path}", "type": "not_found"}})

    async def _complete(self, chat: bool, receive: Receive, send: Send) -> None:
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            req = json.loads(body)
            prompt = _prompt_text(req, chat)
            asked = req.get("max_completion_tokens", req.get("max_tokens"))
            max_tokens = 16 if asked is None else int(asked)
        except (ValueError, TypeError, KeyError) as exc:
            await _json(send, 400, {"error": {"message": f"bad request: {exc}", "type": "invalid_request_error"}})
            return
        prompt_ids = tokenize(prompt)
        if not prompt_ids or len(prompt_ids) > MAX_PROMPT_TOKENS or not 1 <= max_tokens <= 8192:
            await _json(send, 400, {"error": {"message": f"prompt must be 1..{MAX_PROMPT_TOKENS} tokens and "
                                              "max_tokens 1..8192", "type": "invalid_request_error"}})
            return
        loop = asyncio.get_running_loop()
        job = Job(asyncio.Queue(), threading.Event())

        def emit(token: int) -> None:
            loop.call_soon_threadsafe(job.queue.put_nowait, token)

        def run() -> None:
            try:
                if not job.stop.is_set():
                    self.source.generate(prompt_ids, max_tokens, emit, job.stop)
            except Exception as exc:  # reported to the client as an error (500, or an error event mid-stream)
                LOGGER.exception("generation failed")
                job.error = exc
            finally:
                loop.call_soon_threadsafe(job.queue.put_nowait, None)

        self.executor.submit(run)
        watcher = asyncio.ensure_future(_wait_disconnect(receive, job.stop))
        try:
            stream = bool(req.get("stream"))
            usage_wanted = bool((req.get("stream_options") or {}).get("include_usage"))
            await self._reply(chat, stream, usage_wanted, len(prompt_ids), max_tokens, job, send)
        except OSError:
            pass  # the client went away mid-send
        finally:
            job.stop.set()
            watcher.cancel()

    async def _reply(self, chat: bool, stream: bool, usage_wanted: bool, prompt_tokens: int, max_tokens: int,
                     job: Job, send: Send) -> None:
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        generated: list[str] = []
        if stream:
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        while (token := await job.queue.get()) is not None:
            if job.stop.is_set():
                continue
            piece = word(token)
            generated.append(piece)
            if stream:
                delta = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                await _event(send, {"id": rid, "object": kind + (".chunk" if chat else ""), "created": created,
                                    "model": self.model, "choices": [{**delta, "finish_reason": None}]})
        if job.stop.is_set():
            return  # the client hung up: nothing more to send
        if job.error is not None:
            error = {"error": {"message": f"{type(job.error).__name__}: {job.error}", "type": "server_error"}}
            if not stream:
                await _json(send, 500, error)
                return
            await _event(send, error)
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
            return
        finish = "length" if len(generated) >= max_tokens else "stop"
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(generated),
                 "total_tokens": prompt_tokens + len(generated)}
        if not stream:
            text = "".join(generated)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                      else {"index": 0, "text": text})
            await _json(send, 200, {"id": rid, "object": kind, "created": created, "model": self.model,
                                    "choices": [{**choice, "finish_reason": finish}], "usage": usage})
            return
        last = {"index": 0, "delta": {}} if chat else {"index": 0, "text": ""}
        await _event(send, {"id": rid, "object": kind + (".chunk" if chat else ""), "created": created,
                            "model": self.model, "choices": [{**last, "finish_reason": finish}]})
        if usage_wanted:
            await _event(send, {"id": rid, "object": kind + (".chunk" if chat else ""), "created": created,
                                "model": self.model, "choices": [], "usage": usage})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def _prompt_text(req: dict[str, Any], chat: bool) -> str:
    if chat:
        return "\n".join(str(m["content"]) for m in req["messages"])
    prompt = req["prompt"]
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


async def _wait_disconnect(receive: Receive, stop: threading.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    stop.set()


async def _event(send: Send, payload: dict[str, Any]) -> None:
    data = b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def app() -> Any:
    """The factory for ``uvicorn --factory``: the engine, wrapped by ``LlmsloMiddleware`` unless
    ``GPU_ENGINE_MIDDLEWARE=off``. Reads ``GPU_ENGINE_SIZE`` (1b, 160m, cpu-stub), ``GPU_ENGINE_SLOTS``,
    ``GPU_ENGINE_MODEL`` (the model name served) and ``GPU_ENGINE_STUB_TOKEN_S``."""
    from llmslo.telemetry import LlmsloMiddleware

    size = os.environ.get("GPU_ENGINE_SIZE", "1b")
    source: TokenSource = (StubSource(float(os.environ.get("GPU_ENGINE_STUB_TOKEN_S", "0.005")))
                           if size == "cpu-stub" else TorchSource(size))
    engine = EngineApp(source, os.environ.get("GPU_ENGINE_MODEL", f"llama-random-{size}"),
                       int(os.environ.get("GPU_ENGINE_SLOTS", "8")))
    if os.environ.get("GPU_ENGINE_MIDDLEWARE", "on") == "off":
        return engine
    return LlmsloMiddleware(engine)


def calibrate(url: str, slots: int, max_tokens: int, prompt_bytes: int) -> dict[str, float]:
    """Warm the engine up (one short request), then time ``slots`` streams of ``max_tokens`` tokens at once.

    Returns the aggregate decode rate (tokens/s over the wall time of the batch), one stream's rate alone, and
    the seconds each took. The requests carry ``X-Tenant-Class: calibration`` so that the summaries keep them apart.
    """
    import httpx

    headers = {"X-Tenant-Class": "calibration"}
    body = {"prompt": "x" * prompt_bytes, "max_tokens": max_tokens, "stream": False}

    def one(client: httpx.Client) -> int:
        r = client.post(f"{url}/v1/completions", json=body, headers=headers, timeout=300)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    with httpx.Client() as client:
        client.post(f"{url}/v1/completions", json={**body, "max_tokens": 8}, headers=headers,
                    timeout=300).raise_for_status()
        t0 = time.monotonic()
        alone = one(client)
        alone_s = time.monotonic() - t0
    with ThreadPoolExecutor(slots) as pool:
        clients = [httpx.Client() for _ in range(slots)]
        t0 = time.monotonic()
        total = sum(pool.map(one, clients))
        batch_s = time.monotonic() - t0
        for c in clients:
            c.close()
    return {"slots": slots, "max_tokens": max_tokens, "prompt_bytes": prompt_bytes,
            "one_stream_tokens_per_s": alone / alone_s, "one_stream_s": alone_s,
            "aggregate_tokens_per_s": total / batch_s, "batch_s": batch_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="Serve the engine with the middleware on 127.0.0.1.")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--model-size", choices=[*SIZES, "cpu-stub"], default="1b")
    serve.add_argument("--slots", type=int, default=8, help="Generations at once (worker threads).")
    cal = sub.add_parser("calibrate", help="Time one stream, then --slots at once; print JSON.")
    cal.add_argument("url")
    cal.add_argument("--slots", type=int, default=8)
    cal.add_argument("--max-tokens", type=int, default=128)
    cal.add_argument("--prompt-bytes", type=int, default=1000)
    args = parser.parse_args()
    if args.command == "calibrate":
        print(json.dumps(calibrate(args.url.rstrip("/"), args.slots, args.max_tokens, args.prompt_bytes)))
        return
    os.environ.setdefault("GPU_ENGINE_SIZE", args.model_size)
    os.environ.setdefault("GPU_ENGINE_SLOTS", str(args.slots))
    import uvicorn

    uvicorn.run("llmslo.bench.gpu_engine:app", factory=True, host="127.0.0.1", port=args.port,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
