"""The target: its URLs, the request bodies and headers sent to it, the prompts, and the reachability probe.

A target is any OpenAI-compatible server: ``llmslo serve``, vLLM, SGLang, TGI. The URL may be the server's
base (``http://host:8000``), its API root (``http://host:8000/v1``) or the endpoint itself
(``http://host:8000/v1/chat/completions``). Requests use only the common OpenAI fields, plus vLLM's
``ignore_eos`` (unless switched off) so a reply has exactly ``max_tokens`` tokens where the server honours it.

A prompt of ``N`` tokens is ``N`` whitespace-separated words (``llmslo serve`` counts words; a real server
tokenizes its own way, and its ``usage.prompt_tokens`` is what the summary records). Each request's prompt
starts with a word of its own, so no two prompts share a cached prefix by accident.

Every request has a UUID for its id (:class:`RequestIds`: version 4, random, by default; version 7,
time-ordered, on request), sent in one header (``X-Request-Id`` unless configured otherwise; none at all when
switched off). A UUID is an id every server takes: some refuse any other shape (llama-cpp-python's server
answers 400 with an empty body), and ``llmslo serve`` keeps any id of ``[A-Za-z0-9._:-]{1,128}``, so client and
server summaries share it.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

from llmslo import __version__
from llmslo.loadgen._schedule import SpecError
from llmslo.telemetry import LlmsloError

ENDPOINTS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
"""Endpoint kinds and their paths."""

URL_FORM = "http(s)://HOST[:PORT][/PREFIX], e.g. http://127.0.0.1:8000 (or .../v1, or .../v1/completions)"
REQUEST_ID_KINDS: tuple[str, ...] = ("uuid4", "uuid7")
"""The kinds of request ids: random UUIDs (version 4) or time-ordered ones (version 7, RFC 9562)."""
DEFAULT_REQUEST_ID_HEADER = "X-Request-Id"
"""The header that carries each request's id, unless configured otherwise."""
REQUEST_ID_HEADER_FORM = ("an HTTP header name such as X-Request-Id or X-Correlation-Id (letters, digits and "
                          "!#$%&'*+-.^_`|~), or off to send none")
_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}")
_OWN_HEADERS = frozenset({"content-type", "content-length", "accept", "accept-encoding", "user-agent", "host",
                          "authorization", "x-tenant-class", "connection", "transfer-encoding"})

USER_AGENT = f"llmslo-load/{__version__}"
"""The ``User-Agent`` of every request."""

_WORDS: tuple[str, ...] = (
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school",
    "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week",
    "company", "system", "program", "question", "work", "government", "number", "night", "point", "home",
    "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book",
    "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service", "friend", "father",
    "power", "hour", "game", "line", "end", "member", "law", "car", "city", "community", "name", "president",
    "team", "minute", "idea", "kid", "body", "information", "back", "parent", "face", "others", "level",
    "office", "door", "health", "person", "art", "war", "history", "party", "result", "change", "morning",
    "reason", "research", "girl", "guy", "moment", "air", "teacher", "force", "education",
)


def parse_request_id_header(text: str | None) -> str | None:
    """The header name of ``--request-id-header`` (None for ``off``: no header is sent). Raises
    :class:`SpecError` for a name HTTP does not allow, or one the client already sends for another purpose."""
    if text is None or text.strip().lower() == "off":
        return None
    name = text.strip()
    if not _TOKEN.fullmatch(name):
        raise SpecError("--request-id-header", text, REQUEST_ID_HEADER_FORM, "not a header name:")
    if name.lower() in _OWN_HEADERS:
        raise SpecError("--request-id-header", text, REQUEST_ID_HEADER_FORM, "the client sends this header "
                        "for its own purpose:")
    return name


class RequestIds:
    """Request ids of one run: ``next()`` gives a new UUID as text (36 characters, lower-case hex), so every id is
    one the servers take as it is (:func:`llmslo.telemetry.valid_request_id`, the one definition of a request id).

    ``uuid4``: 122 random bits (``uuid.uuid4``). ``uuid7``: RFC 9562's version 7, built here (Python 3.11 has
    none): the Unix time in milliseconds (48 bits, from ``time.time_ns``), then 12 bits of the sub-millisecond
    time (the RFC's method 3, "replace leftmost random bits with increased clock precision"), the variant, and
    62 random bits from ``os.urandom``. The 60 time bits never repeat or go back within a run (a clock that
    did not move, or moved back, gives the previous value plus one), so the ids of a run sort in the order they
    were made.
    """

    def __init__(self, kind: str = "uuid4") -> None:
        if kind not in REQUEST_ID_KINDS:
            raise SpecError("--request-id", kind, " or ".join(REQUEST_ID_KINDS), "unknown kind")
        self.kind = kind
        self._last = -1

    def next(self) -> str:
        if self.kind == "uuid4":
            return str(uuid.uuid4())
        return str(self.uuid7(time.time_ns()))

    def uuid7(self, now_ns: int) -> uuid.UUID:
        """A version-7 UUID for the Unix time ``now_ns`` (nanoseconds), after every one made before."""
        ms, sub_ns = divmod(now_ns, 1_000_000)
        stamp = (ms << 12) | (sub_ns * 4096 // 1_000_000)  # 48 bits of ms, 12 bits of the fraction
        if stamp <= self._last:
            stamp = self._last + 1
        self._last = stamp
        rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
        value = ((stamp >> 12) << 80) | (0x7 << 76) | ((stamp & 0xFFF) << 64) | (0b10 << 62) | rand_b
        return uuid.UUID(int=value & ((1 << 128) - 1))


class Unreachable(LlmsloError):
    """The target did not answer at all (no connection): nothing was sent."""


@dataclass(frozen=True)
class Target:
    """Where requests go: ``base`` (scheme, host, port and path prefix, no ``/v1``) and the endpoint kind."""

    base: str
    endpoint: str = "completions"

    @classmethod
    def parse(cls, url: str, endpoint: str | None = None) -> Target:
        """The target of ``url`` (see the module docstring). ``endpoint`` (``completions`` or ``chat``)
        overrides one implied by the URL; a contradiction, or a URL that is not http(s), raises
        :class:`SpecError`."""
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SpecError("URL", url, URL_FORM, "not an http(s) URL with a host:")
        if parts.query or parts.fragment:
            raise SpecError("URL", url, URL_FORM, "takes no query or fragment:")
        path = parts.path.rstrip("/")
        implied = None
        for kind, suffix in ENDPOINTS.items():
            if path.endswith(suffix):
                implied, path = kind, path[: -len(suffix)]
                break
        else:
            if path.endswith("/v1"):
                path = path[:-3]
        if endpoint is not None and endpoint not in ENDPOINTS:
            raise SpecError("--endpoint", endpoint, " or ".join(ENDPOINTS), "unknown endpoint")
        if endpoint is not None and implied is not None and endpoint != implied:
            raise SpecError("--endpoint", endpoint, f"{implied} (the URL names {ENDPOINTS[implied]})",
                            "contradicts the URL:")
        return cls(urlunsplit((parts.scheme, parts.netloc, path, "", "")), endpoint or implied or "completions")

    @property
    def url(self) -> str:
        """The endpoint's URL."""
        return self.base + ENDPOINTS[self.endpoint]

    @property
    def models_url(self) -> str:
        return self.base + "/v1/models"


class PromptBook:
    """Prompts of a given number of words, seeded: the first word is the request's own (``r<index>``), the rest
    a slice of a fixed random tape of common words."""

    TAPE_WORDS = 65_536

    def __init__(self, seed: int = 0) -> None:
        rng = random.Random(f"{seed}:prompt")
        self._tape = [rng.choice(_WORDS) for _ in range(self.TAPE_WORDS)]

    def prompt(self, index: int, words: int) -> str:
        """``words`` (>= 1) whitespace-separated words for request ``index``."""
        rest = words - 1
        tape = self._tape
        start = (index * 7919) % len(tape)
        picked: list[str] = [f"r{index}"]
        while rest > 0:
            take = min(rest, len(tape) - start)
            picked.extend(tape[start:start + take])
            rest -= take
            start = 0
        return " ".join(picked)


@dataclass(frozen=True)
class RequestShape:
    """What every request of a run carries: ``model``, streaming or not, ``ignore_eos``, the headers
    (``request_id_header``: the header carrying the request id; None: no id is sent)."""

    model: str
    endpoint: str = "completions"
    stream: bool = True
    ignore_eos: bool = True
    api_key: str | None = None
    tenant_class: str | None = None
    request_id_header: str | None = DEFAULT_REQUEST_ID_HEADER

    def body(self, prompt: str, max_tokens: int, *, stream_options: bool = True) -> bytes:
        """The JSON body of one request; a stream asks for its usage (``stream_options``) unless
        ``stream_options`` is false."""
        body: dict[str, object] = {"model": self.model, "max_tokens": max_tokens, "stream": self.stream}
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.stream and stream_options:
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True
        return json.dumps(body, separators=(",", ":")).encode()

    def headers(self, request_id: str) -> dict[str, str]:
        """The headers of one request (the id under ``request_id_header`` unless that is None;
        ``X-Tenant-Class`` and ``Authorization`` when configured)."""
        out = {
            "content-type": "application/json",
            "accept": "text/event-stream" if self.stream else "application/json",
            "accept-encoding": "identity",
            "user-agent": USER_AGENT,
        }
        if self.request_id_header is not None:
            out[self.request_id_header] = request_id
        if self.tenant_class is not None:
            out["x-tenant-class"] = self.tenant_class
        if self.api_key is not None:
            out["authorization"] = f"Bearer {self.api_key}"
        return out


def auth_headers(api_key: str | None) -> Mapping[str, str]:
    return {} if api_key is None else {"authorization": f"Bearer {api_key}"}


async def probe(target: Target, *, api_key: str | None = None, timeout_s: float = 10.0) -> list[str]:
    """Ask the target for its models (``GET /v1/models``): the model ids it lists (empty when it answers
    without a list, e.g. 404). Raises :class:`Unreachable` when no connection can be made."""
    try:
        async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:
            response = await client.get(target.models_url, headers=dict(auth_headers(api_key)))
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise Unreachable(f"cannot reach {target.base}: {type(exc).__name__}: {exc}") from None
    except httpx.HTTPError as exc:
        raise Unreachable(f"{target.base} did not answer GET {target.models_url}: {type(exc).__name__}: {exc}") \
            from None
    if response.status_code != 200:
        return []
    try:
        data = response.json().get("data")
    except (ValueError, AttributeError):
        return []
    if not isinstance(data, list):
        return []
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
