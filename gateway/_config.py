"""What a gateway is configured with: its backends (a pool file or ``--backend`` URLs) and its controls.

Every value is checked when the configuration is built; a bad one raises :class:`ConfigurationError` naming
the field (and, in a pool file, the backend's position and the fix). Times are seconds; sizes bytes.

A pool file (YAML)::

    backends:
      - id: llama-a            # 1 to 32 of A-Z a-z 0-9 . _ -   (default: b1, b2, ... by position)
        url: http://127.0.0.1:8001
        version: b4000         # the summaries' version for requests it serves (default: unknown)
        slots: 4               # parallel sequences it runs (its weight in routing; default 1)
        models: [smollm2]      # models it serves (default: any)
        engine: llamacpp       # read its own queue and KV usage from its /metrics to route (default: not read)
        metrics_path: /metrics # where that engine answers its Prometheus exposition (default /metrics)
    drain:                     # optional: the drain rules, instead of the --drain-* flags (see DRAIN_KEYS)
      budget_s: 30             # the longest wait for the requests in flight
      settle_s: 1              # the wait after leaving the pool (0 allowed)
      idle_s: 10               # close a stream idle this long ("off": never)
      max_inflight_s: 300      # close a stream in flight this long since its arrival ("off": never)
      on_budget: terminate     # or return_to_pool
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from llmslo.engines import EngineProfile, all_profiles
from llmslo.telemetry import ConfigurationError

BACKEND_ID = re.compile(r"[A-Za-z0-9._-]{1,32}")
"""What a backend id may be (it is a metric label value and a path segment of the admin API)."""
MAX_BACKENDS = 16
"""The most backends one gateway routes to (each is a breaker label value: bounded)."""
ENGINE_PROFILES: Mapping[str, EngineProfile] = MappingProxyType({p.key: p for p in all_profiles()})
"""The engines whose ``/metrics`` a backend's ``engine`` may name, by key: their profiles say which series to
read."""
ENGINE_CHOICES: tuple[str, ...] = tuple(sorted(ENGINE_PROFILES))
METRICS_PATH = re.compile(r"/[A-Za-z0-9._~/-]{0,255}")
"""What a backend's ``metrics_path`` may be: an absolute path, no query."""


@dataclass(frozen=True)
class BackendSpec:
    """One backend: an engine's OpenAI-compatible HTTP server."""

    id: str
    url: str
    version: str = "unknown"
    slots: int = 1
    models: tuple[str, ...] = ()
    engine: str | None = None
    """The engine it runs (one of :data:`ENGINE_CHOICES`): the gateway reads that engine's queue and KV usage
    from its ``/metrics`` to route (None: it does not)."""
    metrics_path: str = "/metrics"
    """Where the engine answers its Prometheus exposition (read only when :attr:`engine` is set)."""
    host: str = field(init=False, default="", compare=False, repr=False)
    """The host of :attr:`url` (read from it once: every request connects to it)."""
    port: int = field(init=False, default=0, compare=False, repr=False)
    """The port of :attr:`url`."""

    def __post_init__(self) -> None:
        where = f"backend {self.id!r}"
        if not isinstance(self.id, str) or not BACKEND_ID.fullmatch(self.id):
            raise ConfigurationError(f"backend id: {self.id!r} is not 1 to 32 of A-Z a-z 0-9 . _ -; rename it")
        host, port = _host_port(self.url, where)
        object.__setattr__(self, "url", f"http://{host}:{port}")
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "port", port)
        if not isinstance(self.version, str) or not self.version or len(self.version) > 64:
            raise ConfigurationError(f"{where}: version must be 1 to 64 characters, got {self.version!r}")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or not 1 <= self.slots <= 4096:
            raise ConfigurationError(f"{where}: slots must be an integer from 1 to 4096, got {self.slots!r}")
        models = self.models
        if isinstance(models, str) or not all(isinstance(m, str) and m for m in models):
            raise ConfigurationError(f"{where}: models must be a list of model names, got {models!r}")
        object.__setattr__(self, "models", tuple(models))
        if self.engine is not None and self.engine not in ENGINE_CHOICES:
            raise ConfigurationError(f"{where}: engine {self.engine!r} is not known; use one of "
                                     f"{', '.join(ENGINE_CHOICES)}, or leave engine out to route without it")
        if not isinstance(self.metrics_path, str) or not METRICS_PATH.fullmatch(self.metrics_path):
            raise ConfigurationError(f"{where}: metrics_path must be a path like /metrics (no host, no query), "
                                     f"got {self.metrics_path!r}")

    def serves(self, model: str) -> bool:
        """Whether this backend serves ``model`` (a backend with no list serves any)."""
        return not self.models or model in self.models


def _host_port(url: object, where: str) -> tuple[str, int]:
    if not isinstance(url, str):
        raise ConfigurationError(f"{where}: url must be text like http://127.0.0.1:8000, got {url!r}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ConfigurationError(
            f"{where}: url {url!r} must be http://HOST:PORT (plain HTTP, no path); the gateway adds /v1/...")
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise ConfigurationError(f"{where}: url {url!r} has a bad port") from exc
    return parts.hostname, port


@dataclass(frozen=True)
class BudgetConfig:
    """Per API key (or per tenant class where no key is sent): ``tokens_per_min`` reserved at admission as
    prompt + ``max_tokens`` (or see ``reserve_quantile``) and settled from ``usage``; ``requests_per_s``. None:
    that limit is off."""

    tokens_per_min: float | None = None
    token_burst: float | None = None
    requests_per_s: float | None = None
    request_burst: float | None = None
    redis_url: str | None = None
    """Share the buckets between gateway replicas through this Redis (one round trip per decision)."""
    redis_fail_mode: str = "open"
    """While Redis is unreachable: ``open`` admits, ``closed`` refuses."""
    max_keys: int = 10_000
    """API keys that own buckets; beyond, keys share one overflow bucket (memory stays bounded)."""
    reserve_quantile: float | None = None
    """None: reserve prompt + ``max_tokens``, so parallel requests can never overshoot the budget. A fraction
    ``q`` in (0, 1]: once 20 replies of the model completed, reserve prompt + the smaller of ``max_tokens`` and the
    ``q`` quantile of the completion tokens of its last 512 complete replies. Less is held back from the budget
    while requests run, but parallel requests may overshoot it by what they generate beyond their reservation
    (settled from ``usage``: a top-up)."""

    def __post_init__(self) -> None:
        q = self.reserve_quantile
        if q is not None and (isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= 1):
            raise ConfigurationError(f"reserve_quantile: must be a fraction in (0, 1], e.g. --reserve-quantile 0.9; "
                                     f"got {q!r}")

    @property
    def enabled(self) -> bool:
        return self.tokens_per_min is not None or self.requests_per_s is not None


@dataclass(frozen=True)
class GatewayConfig:
    """The whole gateway (see the field comments; seconds, bytes, counts)."""

    backends: tuple[BackendSpec, ...]
    host: str = "127.0.0.1"
    port: int = 8080
    admin_port: int = 8081
    models: tuple[str, ...] = ()
    """Models served (/v1/models; other models get 404). Empty: the backends' lists; none listed: any."""
    max_body_bytes: int = 4 * 1024 * 1024
    default_max_tokens: int = 256
    """The output tokens reserved for a request that sets no ``max_tokens``."""
    concurrency: int | None = None
    """Requests forwarded at once, all backends together (default: twice the ready backends' slots)."""
    queue_capacity: int = 256
    queue_timeout_s: float = 30.0
    degrade_max_tokens: int | None = None
    """Under load (the queue at half its class's shed level), cap a request's ``max_tokens`` to this before
    refusing anyone (None: no degradation)."""
    tenant_classes: tuple[str, ...] = ("interactive", "default", "batch")
    """Priority order, most important first: shedding refuses the last first."""
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    retries: int = 1
    """Other backends tried for a request that has sent its client nothing yet."""
    breaker_failures: int = 5
    breaker_open_s: float = 5.0
    ttft_bound_s: float | None = None
    """A first token later than this counts as a failure of the backend's stream health (None: off)."""
    stall_s: float = 30.0
    """No chunk for this long mid-stream: the stream is ended ``error`` and counts as a backend failure (checked
    every second, or every quarter of it when that is shorter)."""
    request_timeout_s: float | None = 600.0
    """A request still in flight this long after its admission is ended ``deadline`` (None: off); checked every
    second, or every quarter of it when that is shorter, so it ends at most that much later."""
    read_timeout_s: float = 30.0
    """A request's head and body must arrive within this long of its first bytes, else it is answered 408 and its
    connection closed (one sweep every second, or every quarter of the shorter timeout when that is less: each
    timeout ends up to two sweeps late)."""
    idle_timeout_s: float | None = 600.0
    """A client's connection with no request on it for this long is closed (None: never); swept as above."""
    health_interval_s: float = 2.0
    engine_interval_s: float = 1.0
    """How often the ``/metrics`` of a backend with an ``engine`` is read; figures older than three of these are
    ignored in routing."""
    drain_settle_s: float = 1.0
    drain_budget_s: float = 30.0
    drain_idle_s: float | None = 10.0
    drain_max_inflight_s: float | None = None
    """During a drain, close a stream in flight this long since its arrival, however active (None: never)."""
    on_budget: str = "terminate"
    drain_record: Path | None = None
    """Where the gateway's own drain (SIGTERM, ``POST /admin/drain``) is written as the update record ``llmslo
    rollout record`` takes (None: not written); needs :attr:`next_version`."""
    next_version: str | None = None
    """The version replacing this gateway: its own drain record's ``to_version``."""
    update_id: str | None = None
    """Its own drain record's ``update_id`` (None: ``VERSION-to-NEXT-STARTED``)."""

    def __post_init__(self) -> None:
        backends = tuple(self.backends)
        if not backends:
            raise ConfigurationError("backends: give at least one (--backend URL or --pool FILE)")
        if len(backends) > MAX_BACKENDS:
            raise ConfigurationError(f"backends: {len(backends)} is more than {MAX_BACKENDS}; run more gateways")
        seen: set[str] = set()
        for b in backends:
            if b.id in seen:
                raise ConfigurationError(f"backend id {b.id!r} appears twice; ids must be unique")
            seen.add(b.id)
        object.__setattr__(self, "backends", backends)
        for name in ("port", "admin_port"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
                raise ConfigurationError(f"{name}: must be a TCP port 0..65535, got {value!r}")
        for name in ("max_body_bytes", "default_max_tokens", "queue_capacity", "breaker_failures"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name}: must be an integer >= 1, got {value!r}")
        for name in ("concurrency", "degrade_max_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigurationError(f"{name}: must be an integer >= 1 or off, got {value!r}")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigurationError(f"retries: must be an integer >= 0, got {self.retries!r}")
        for name in ("queue_timeout_s", "breaker_open_s", "stall_s", "health_interval_s", "drain_budget_s",
                     "engine_interval_s", "read_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0:
                raise ConfigurationError(f"{name}: must be a number of seconds > 0, got {value!r}")
        for name in ("ttft_bound_s", "request_timeout_s", "drain_idle_s", "drain_max_inflight_s", "idle_timeout_s"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int | float) or not value > 0):
                raise ConfigurationError(f"{name}: must be a number of seconds > 0 or off, got {value!r}")
        if not isinstance(self.drain_settle_s, int | float) or self.drain_settle_s < 0:
            raise ConfigurationError(f"drain_settle_s: must be seconds >= 0, got {self.drain_settle_s!r}")
        if self.on_budget not in ("terminate", "return_to_pool"):
            raise ConfigurationError(f"on_budget: terminate or return_to_pool, got {self.on_budget!r}")
        if not self.tenant_classes or "default" not in self.tenant_classes:
            raise ConfigurationError(f"tenant_classes: must include 'default', got {self.tenant_classes!r}")
        for name in ("next_version", "update_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip() or len(value) > 128):
                raise ConfigurationError(f"{name}: must be a name of 1 to 128 characters, got {value!r}")
        if self.drain_record is not None:
            if self.next_version is None:
                raise ConfigurationError("--drain-record: needs --next-version, the version that replaces this "
                                         "gateway (an update record names both; its from_version is --version)")
            if Path(self.drain_record).is_dir():
                raise ConfigurationError(f"--drain-record: {self.drain_record} is a folder; give a file, e.g. "
                                         f"{Path(self.drain_record) / 'drain.json'}")

    def served_models(self) -> tuple[str, ...]:
        """The models the gateway answers for (empty: any)."""
        if self.models:
            return self.models
        if any(not b.models for b in self.backends):
            return ()
        return tuple(sorted({m for b in self.backends for m in b.models}))

    def total_slots(self) -> int:
        return sum(b.slots for b in self.backends)


_BACKEND_OPTION = re.compile(r",([A-Za-z_][A-Za-z0-9_-]*)=")
"""An option of a ``--backend`` value (``,NAME=``); a comma without a name and ``=`` belongs to the version."""


def backend_from_arg(text: str, position: int, engine: str | None = None) -> BackendSpec:
    """A ``--backend`` value, ``[ID=]URL[@VERSION][,slots=N]``; ``position`` (1-based) names it ``b<position>`` by
    default; ``slots`` (default 1) is the sequences it runs in parallel, as in a pool file (its weight in routing,
    and its concurrency limit starts at twice it); ``engine`` (``--engine-metrics``) is the engine it runs, whose
    ``/metrics`` the gateway reads to route. Raises :class:`ConfigurationError` with the fix."""
    for option in _BACKEND_OPTION.finditer(text):
        if option.group(1) != "slots":
            hint = ("; the engine a backend runs is --engine-metrics ENGINE (or engine: in a pool file)"
                    if option.group(1) == "engine" else "")
            segment = text[option.start() + 1:].split(",", 1)[0]
            raise ConfigurationError(f"{text!r}: {segment!r} is not a backend option: write "
                                     f"[ID=]URL[@VERSION][,slots=N], e.g. a=http://127.0.0.1:8001@v1,slots=4{hint}")
    slots = 1
    head, comma, tail = text.rpartition(",slots=")
    if comma:
        if not tail.isascii() or not tail.isdigit():
            raise ConfigurationError(f"{text!r}: slots={tail!r} is not a whole number; write e.g. "
                                     "a=http://127.0.0.1:8001@v1,slots=4")
        text, slots = head, int(tail)
    ident, sep, rest = text.partition("=")
    if not sep or "://" in ident:
        ident, rest = f"b{position}", text
    url, at, version = rest.partition("@")
    return BackendSpec(id=ident, url=url, version=version if at else "unknown", slots=slots, engine=engine)


POOL_KEYS = ("id", "url", "version", "slots", "models", "engine", "metrics_path")
"""The keys of a backend in a pool file (and of ``POST /admin/backends``), in the order the docs give them."""


def backend_from_mapping(item: Mapping[str, Any], default_id: str) -> BackendSpec:
    """A backend as a pool file or ``POST /admin/backends`` gives it (keys :data:`POOL_KEYS`; ``url`` required,
    ``id`` defaulting to ``default_id``). Raises :class:`ConfigurationError` naming the key."""
    unknown = set(item) - set(POOL_KEYS)
    if unknown:
        raise ConfigurationError(f"unknown key(s) {', '.join(sorted(map(str, unknown)))}; known: "
                                 f"{', '.join(POOL_KEYS)}")
    if "url" not in item:
        raise ConfigurationError("url is missing (http://HOST:PORT)")
    engine = item.get("engine")
    return BackendSpec(id=str(item.get("id", default_id)), url=item["url"], version=str(item.get("version", "unknown")),
                       slots=item.get("slots", 1), models=tuple(item.get("models") or ()),
                       engine=None if engine is None else str(engine),
                       metrics_path=item.get("metrics_path", "/metrics"))


DRAIN_KEYS = ("budget_s", "settle_s", "idle_s", "max_inflight_s", "on_budget")
"""The drain rules a pool file's ``drain:`` and the body of ``POST /admin/backends/ID/drain`` may set."""
DRAIN_FIELDS: Mapping[str, str] = MappingProxyType({
    "budget_s": "drain_budget_s", "settle_s": "drain_settle_s", "idle_s": "drain_idle_s",
    "max_inflight_s": "drain_max_inflight_s", "on_budget": "on_budget"})
"""Each drain rule's field of :class:`GatewayConfig`."""
DRAIN_FLAGS: Mapping[str, str] = MappingProxyType({
    "budget_s": "--drain-budget", "settle_s": "--drain-settle", "idle_s": "--drain-idle",
    "max_inflight_s": "--drain-max-inflight", "on_budget": "--on-budget"})
"""Each drain rule's flag of ``llmslo gateway``."""
_DRAIN_EXAMPLES = {"budget_s": "30", "settle_s": "1", "idle_s": "10", "max_inflight_s": "300"}
_OFF_RULES = ("idle_s", "max_inflight_s")
"""The rules that ``"off"`` switches off (a stream is then never closed for that reason)."""


def drain_rules(item: Mapping[str, Any]) -> dict[str, float | str | None]:
    """The drain rules of a pool file's ``drain:`` or an admin drain's body (keys :data:`DRAIN_KEYS`; one given
    null is left out; ``"off"``, or YAML's ``off``, switches ``idle_s`` or ``max_inflight_s`` off: None). Raises
    :class:`ConfigurationError` naming the key, the value and the fix."""
    unknown = set(item) - set(DRAIN_KEYS)
    if unknown:
        raise ConfigurationError(f"unknown field(s) {', '.join(sorted(map(str, unknown)))}; known: "
                                 f"{', '.join(DRAIN_KEYS)}")
    out: dict[str, float | str | None] = {}
    for key in DRAIN_KEYS:
        value = item.get(key)
        if value is None:
            continue
        if key == "on_budget":
            if value not in ("terminate", "return_to_pool"):
                raise ConfigurationError(f"on_budget: must be terminate or return_to_pool, got {value!r}")
            out[key] = value
            continue
        if key in _OFF_RULES and (value == "off" or value is False):  # YAML 1.1 reads a bare off as false
            out[key] = None
            continue
        zero = key == "settle_s"
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or not (value >= 0 if zero else value > 0):
            off = ', or "off" for never' if key in _OFF_RULES else ""
            raise ConfigurationError(f"{key}: must be a number of seconds {'>= 0' if zero else '> 0'}{off}, got "
                                     f"{value!r}; e.g. {key}: {_DRAIN_EXAMPLES[key]}")
        out[key] = float(value)
    return out


@dataclass(frozen=True)
class PoolFile:
    """What a pool file holds: its backends and its drain rules (by :class:`GatewayConfig` field, only those it
    sets)."""

    backends: tuple[BackendSpec, ...]
    drain: Mapping[str, float | str | None] = field(default_factory=dict)


def load_pool(path: str | Path) -> PoolFile:
    """A pool file (YAML; see the module docstring): its backends and its ``drain:`` rules. Raises
    :class:`ConfigurationError` naming the backend's position or the rule, the field and the fix."""
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"{path}: cannot read the pool file ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{path}: not YAML ({exc})") from exc
    if not isinstance(data, Mapping) or not isinstance(data.get("backends"), Sequence) \
            or isinstance(data.get("backends"), str):
        raise ConfigurationError(f"{path}: expected a mapping with a 'backends' list (see `llmslo gateway --help`)")
    unknown = set(data) - {"backends", "drain"}
    if unknown:
        raise ConfigurationError(f"{path}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; only 'backends' "
                                 "and 'drain'")
    drain = data.get("drain")
    if drain is not None and not isinstance(drain, Mapping):
        raise ConfigurationError(f"{path}: drain: expected a mapping of drain rules ({', '.join(DRAIN_KEYS)}), "
                                 f"got {drain!r}")
    try:
        rules = drain_rules(drain or {})
    except ConfigurationError as exc:
        raise ConfigurationError(f"{path}: drain: {exc}") from exc
    out: list[BackendSpec] = []
    first: dict[str, int] = {}  # id -> the number of the backend that has it
    for i, item in enumerate(data["backends"], start=1):
        if not isinstance(item, Mapping):
            raise ConfigurationError(f"{path}: backend {i}: expected a mapping with url (and id, version, ...)")
        try:
            spec = backend_from_mapping(item, f"b{i}")
        except ConfigurationError as exc:
            raise ConfigurationError(f"{path}: backend {i}: {exc}") from exc
        if spec.id in first:
            raise ConfigurationError(f"{path}: backend {i}: id {spec.id!r} is backend {first[spec.id]}'s too; "
                                     "ids must be unique")
        first[spec.id] = i
        out.append(spec)
    return PoolFile(tuple(out), {DRAIN_FIELDS[k]: v for k, v in rules.items()})
