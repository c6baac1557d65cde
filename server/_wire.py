"""The OpenAI-compatible wire format: request bodies in, JSON bodies and server-sent events out.

Requests (unknown fields are ignored): ``POST /v1/completions`` with ``model``, ``prompt`` (a string, a list
of token ids, or a list holding one of those), ``max_tokens`` (default 16), ``stream``,
``stream_options.include_usage``, ``ignore_eos``; ``POST /v1/chat/completions`` with ``messages`` (each
``content`` a string, a list of ``{"type": "text", "text": ...}`` parts, or null) and
``max_completion_tokens`` or ``max_tokens``. The simulated tokenizer counts the whitespace-separated words of
the prompt (chat: of every message's text); a prompt of token ids counts one token per id. A batch (a list of
several prompts) is refused: one request here is one prompt, with one summary, one TTFT and one finish reason.

A malformed body is a :class:`WireError` naming the field (400); a model the server does not serve, 404
``model_not_found``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeGuard

from llmslo.telemetry import LlmsloError

DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` when the request gives none (OpenAI's completions default)."""
MAX_BODY_BYTES = 4 * 1024 * 1024
"""The largest request body read (bytes); a longer one is answered 413."""
COMPLETIONS, CHAT = "completions", "chat"

DONE = b"data: [DONE]\n\n"


class WireError(LlmsloError):
    """A request the server refuses before generating: HTTP ``status``, OpenAI error ``type``, the ``param``
    (field path) at fault, and the message."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.param = param

    def body(self) -> bytes:
        """The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
        return error_body(str(self), self.type, self.status, param=self.param)


def error_body(message: str, type: str, code: int | str, **extra: object) -> bytes:
    """``{"error": {"message", "type", "code", ...extra}}`` as JSON bytes."""
    return json.dumps({"error": {"message": message, "type": type, "code": code, **extra}}).encode()


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A validated generation request (token counts from the simulated tokenizer)."""

    kind: str
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    ignore_eos: bool


def _kind(value: object) -> str:
    return "null" if value is None else {bool: "a boolean", int: "a number", float: "a number", str: "a string",
                                         list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _optional_bool(body: Mapping[str, object], field: str, path: str | None = None) -> bool:
    value = body.get(field)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise WireError(f"{path or field}: must be true or false, got {_kind(value)}", param=path or field)
    return value


def _max_tokens(body: Mapping[str, object], fields: tuple[str, ...]) -> int:
    for field in fields:
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WireError(f"{field}: must be an integer >= 1, got {_short(value)}", param=field)
        return value
    return DEFAULT_MAX_TOKENS


def _short(value: object) -> str:
    text = json.dumps(value) if isinstance(value, (int, float, str, bool)) or value is None else _kind(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _chat_words(messages: object) -> int:
    if not isinstance(messages, list) or not messages:
        raise WireError(f"messages: must be a non-empty list of messages, got {_kind(messages)}", param="messages")
    words = 0
    for i, message in enumerate(messages):
        path = f"messages[{i}]"
        if not isinstance(message, dict):
            raise WireError(f"{path}: must be an object with role and content, got {_kind(message)}", param=path)
        content = message.get("content")
        if content is None or isinstance(content, str):
            words += len(content.split()) if content else 0
            continue
        if not isinstance(content, list):
            raise WireError(f"{path}.content: must be a string, a list of parts or null, got {_kind(content)}",
                            param=f"{path}.content")
        for j, part in enumerate(content):
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(text, str):
                words += len(text.split())
            elif not isinstance(part, dict):
                raise WireError(f"{path}.content[{j}]: must be an object such as {{\"type\": \"text\", \"text\": "
                                f"...}}, got {_kind(part)}", param=f"{path}.content[{j}]")
    return words


def _is_id(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_ids(ids: list[object], path: str) -> int:
    """The tokens of a prompt given as token ids (integers >= 0): one per id."""
    for j, value in enumerate(ids):
        if not _is_id(value) or value < 0:
            raise WireError(f"{path}[{j}]: must be a token id (an integer >= 0), got {_short(value)}",
                            param=f"{path}[{j}]")
    return len(ids)


def _one_prompt(value: object, path: str) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return _token_ids(value, path)
    raise WireError(f"{path}: must be a string or a list of token ids, got {_kind(value)}", param=path)


def _prompt_tokens(prompt: object) -> int:
    """The tokens of a completions ``prompt``: a string (its words), a list of token ids (one per id), or a
    list holding one of those. A list of several prompts (OpenAI's batch) is refused, naming how many."""
    if isinstance(prompt, str):
        return len(prompt.split())
    if not isinstance(prompt, list) or not prompt:
        got = "an empty list" if isinstance(prompt, list) else _kind(prompt)
        raise WireError(f"prompt: must be a string, a list of token ids, or a list of one of those, got {got}",
                        param="prompt")
    if _is_id(prompt[0]):
        return _token_ids(prompt, "prompt")
    counts = [_one_prompt(value, f"prompt[{j}]") for j, value in enumerate(prompt)]
    if len(counts) > 1:
        raise WireError(f"prompt: a batch of {len(counts)} prompts is not served here: send one request per prompt "
                        "(each gets its own summary, TTFT and finish reason)", param="prompt")
    return counts[0]


def parse_request(kind: str, raw: bytes, served_model: str) -> GenerationRequest:
    """Validate a request body of endpoint ``kind`` (``completions`` or ``chat``) for ``served_model``.

    Raises :class:`WireError`: 400 naming the field, or 404 ``model_not_found``.
    """
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"body: not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise WireError(f"body: must be a JSON object, got {_kind(body)}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise WireError(f"model: required, a model name such as {served_model!r}, got {_short(model)}",
                        param="model")
    if model != served_model:
        raise WireError(f"model: {_short(model)} is not served here; this server serves {served_model!r}",
                        status=404, type="model_not_found", param="model")
    if kind == CHAT:
        prompt_tokens = _chat_words(body.get("messages"))
        max_tokens = _max_tokens(body, ("max_completion_tokens", "max_tokens"))
    else:
        prompt_tokens = _prompt_tokens(body.get("prompt"))
        max_tokens = _max_tokens(body, ("max_tokens",))
    stream = _optional_bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise WireError(f"stream_options: must be an object, got {_kind(options)}", param="stream_options")
    include_usage = _optional_bool(options or {}, "include_usage", "stream_options.include_usage")
    ignore_eos = _optional_bool(body, "ignore_eos")
    return GenerationRequest(kind, model, prompt_tokens, max_tokens, stream, include_usage, ignore_eos)


class Chunks:
    """The server-sent events of one streamed response (each ``data: <json>\\n\\n`` as bytes).

    The fixed part of a token event is encoded once per response; each token adds its text, JSON-escaped.
    """

    __slots__ = ("_after", "_base", "_before", "_first", "_kind", "_last_before")

    def __init__(self, kind: str, response_id: str, created: int, model: str) -> None:
        self._kind = kind
        obj = "chat.completion.chunk" if kind == CHAT else "text_completion"
        self._base: dict[str, object] = {"id": response_id, "object": obj, "created": created, "model": model}
        head = json.dumps(self._base)[:-1]  # without the closing brace
        if kind == CHAT:
            self._before = (f'data: {head}, "choices": [{{"index": 0, "delta": {{"content": ').encode()
            self._first = (f'data: {head}, "choices": [{{"index": 0, "delta": {{"role": "assistant", '
                           '"content": ').encode()
            self._after = b'}, "finish_reason": null}]}\n\n'
            self._last_before = b'}, "finish_reason": '
        else:
            self._before = self._first = (f'data: {head}, "choices": [{{"index": 0, "text": ').encode()
            self._after = b', "finish_reason": null}]}\n\n'
            self._last_before = b', "finish_reason": '

    def token(self, text: str, finish_reason: str | None, first: bool) -> bytes:
        """The event of one token (``finish_reason`` on the last one)."""
        head = self._first if first else self._before
        if finish_reason is None:
            return head + json.dumps(text).encode() + self._after
        return head + json.dumps(text).encode() + self._last_before + json.dumps(finish_reason).encode() + b"}]}\n\n"

    def _event(self, extra: Mapping[str, object]) -> bytes:
        return b"data: " + json.dumps({**self._base, **extra}).encode() + b"\n\n"

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The usage event: ``"choices": []`` and the token counts."""
        return self._event({"choices": [], "usage": usage(prompt_tokens, completion_tokens)})

    def early_finish(self, finish_reason: str, extra: Mapping[str, object]) -> bytes:
        """A last chunk with no text whose choice carries ``finish_reason`` (``server_draining``), with the
        top-level ``extra`` fields (``drain_reason``, ``retryable``)."""
        empty: dict[str, object] = {"delta": {}} if self._kind == CHAT else {"text": ""}
        return self._event({"choices": [{"index": 0, **empty, "finish_reason": finish_reason}], **extra})


def error_event(error: Mapping[str, object]) -> bytes:
    """An error event, ``data: {"error": {...}}``."""
    return b"data: " + json.dumps({"error": dict(error)}).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The OpenAI usage object (tokens)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(kind: str, response_id: str, created: int, model: str, text: str, finish_reason: str,
                    prompt_tokens: int, completion_tokens: int, extra: Mapping[str, object] | None = None) -> bytes:
    """The JSON body of a non-streamed response."""
    if kind == CHAT:
        choice: dict[str, object] = {"index": 0, "message": {"role": "assistant", "content": text},
                                     "finish_reason": finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        obj = "text_completion"
    return json.dumps({"id": response_id, "object": obj, "created": created, "model": model, "choices": [choice],
                       "usage": usage(prompt_tokens, completion_tokens), **(extra or {})}).encode()
