"""The configuration of ``llmslo serve``: one field per command-line flag, validated at construction.

Every time is seconds; ``None`` switches a limit off where the field says so. A bad value raises
:class:`llmslo.telemetry.ConfigurationError` naming the flag (``--max-queue: must be an integer >= 1, got
0``) and changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

from llmslo.controls import ON_BUDGET
from llmslo.server._engine import EngineConfig
from llmslo.server._profile import DEFAULT_PROFILE, PROFILES
from llmslo.telemetry import ConfigurationError

_FLAG_NAMES = {"telemetry": "--no-telemetry", "breaker": "--no-breaker"}


def flag(field: str) -> str:
    """The command-line flag of a :class:`ServerConfig` field (``max_queue`` -> ``--max-queue``,
    ``queue_timeout_s`` -> ``--queue-timeout``)."""
    return _FLAG_NAMES.get(field) or "--" + field.removesuffix("_s").replace("_", "-")


def _bad(field: str, rule: str, value: object) -> ConfigurationError:
    return ConfigurationError(f"{flag(field)}: {rule}, got {value!r}")


@dataclass(frozen=True)
class ServerConfig:
    """What ``llmslo serve`` runs with (see ``docs/server.md`` for each flag)."""

    # listening and identity
    host: str = "127.0.0.1"
    port: int = 8000
    send_buffer: int = 4096
    """Bytes: the accepted sockets' ``SO_SNDBUF`` and the transport's write-buffer limit."""
    model: str = "llmslo-sim"
    version: str = "sim-1"
    tenant_classes: tuple[str, ...] = ("default",)
    """Tenant classes, highest priority first (``X-Tenant-Class``; others count as ``default``)."""
    # the engine
    profile: str = DEFAULT_PROFILE
    speed: float = 1.0
    max_num_seqs: int = 256
    kv_blocks: int = 16384
    block_size: int = 16
    mean_output_tokens: float = 128.0
    seed: int = 0
    error_rate: float = 0.0
    # streams and deadlines
    stream_capacity: int = 16
    stream_idle_s: float | None = 30.0
    request_timeout_s: float | None = 600.0
    # admission
    max_queue: int = 1000
    queue_timeout_s: float = 30.0
    max_concurrency: int | None = None
    """Requests holding an admission slot at once (None: ``max_num_seqs``)."""
    # rate limits (per key: the Authorization header, else the client address)
    rate_limit: float | None = None
    """Requests per second per key (None: off)."""
    rate_burst: float | None = None
    token_rate_limit: float | None = None
    """Tokens (prompt + max_tokens) per second per key (None: off)."""
    token_burst: float | None = None
    # the circuit breaker on engine errors
    breaker: bool = True
    breaker_failures: int = 5
    breaker_error_rate: float = 0.6
    breaker_window_s: float = 10.0
    breaker_open_s: float = 30.0
    # load shedding (off by default)
    shed_queue_fraction: float | None = None
    shed_ttft_s: float | None = None
    # the drain on SIGTERM
    drain_settle_s: float = 5.0
    exit_linger_s: float = 0.0
    """After the drain, keep answering (``/metrics`` too; requests get 503 ``draining``) this long before exiting,
    so a last scrape sees the final counts."""
    drain_budget_s: float = 120.0
    drain_idle_s: float | None = 30.0
    drain_max_inflight_s: float | None = 300.0
    on_budget: str = "terminate"
    drain_poll_s: float = 0.5
    drain_record: Path | None = None
    next_version: str | None = None
    update_id: str | None = None
    # telemetry
    slo_ttft_s: float | None = 2.0
    slo_tpot_s: float | None = 0.1
    telemetry: bool = True
    """False: the no-telemetry mode of the overhead benchmark (no telemetry, no controls)."""
    journal: Path | None = None
    """The folder of the write-ahead journal of requests (None: none kept). At start its requests left without
    a summary by a crash are recovered into the summary writer; see ``docs/server.md``."""

    def __post_init__(self) -> None:
        self._check_text()
        for name in ("port",):
            value = getattr(self, name)
            if not _integer(value) or not 0 <= value <= 65535:
                raise _bad(name, "must be a port number from 0 to 65535 (0: a free port)", value)
        for name in ("send_buffer", "max_num_seqs", "kv_blocks", "block_size", "stream_capacity", "max_queue",
                     "breaker_failures"):
            if not _integer(getattr(self, name)) or getattr(self, name) < 1:
                raise _bad(name, "must be an integer >= 1", getattr(self, name))
        if self.max_concurrency is not None and (not _integer(self.max_concurrency) or self.max_concurrency < 1):
            raise _bad("max_concurrency", "must be an integer >= 1", self.max_concurrency)
        if not _integer(self.seed):
            raise _bad("seed", "must be an integer", self.seed)
        for name in ("speed", "mean_output_tokens", "queue_timeout_s", "breaker_window_s", "breaker_open_s",
                     "drain_budget_s", "drain_poll_s"):
            if not _positive(getattr(self, name)):
                raise _bad(name, "must be a finite number > 0", getattr(self, name))
        for name in ("stream_idle_s", "request_timeout_s", "rate_limit", "rate_burst", "token_rate_limit",
                     "token_burst", "shed_ttft_s", "drain_idle_s", "drain_max_inflight_s", "slo_ttft_s",
                     "slo_tpot_s"):
            value = getattr(self, name)
            if value is not None and not _positive(value):
                raise _bad(name, "must be a finite number > 0 (or off)", value)
        for name in ("drain_settle_s", "exit_linger_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise _bad(name, "must be a finite number of seconds >= 0", value)
        if not (isinstance(self.error_rate, int | float) and 0 <= self.error_rate <= 1):
            raise _bad("error_rate", "must be a share from 0 to 1", self.error_rate)
        if not (isinstance(self.breaker_error_rate, int | float) and 0 < self.breaker_error_rate < 1):
            raise _bad("breaker_error_rate", "must be a share strictly between 0 and 1", self.breaker_error_rate)
        if self.shed_queue_fraction is not None and not (
                isinstance(self.shed_queue_fraction, int | float) and 0 < self.shed_queue_fraction <= 1):
            raise _bad("shed_queue_fraction", "must be a fraction of the queue in (0, 1]", self.shed_queue_fraction)
        if self.on_budget not in ON_BUDGET:
            raise _bad("on_budget", f"must be one of {', '.join(ON_BUDGET)}", self.on_budget)
        if self.rate_burst is not None and self.rate_limit is None:
            raise _bad("rate_burst", "needs --rate-limit", self.rate_burst)
        if self.token_burst is not None and self.token_rate_limit is None:
            raise _bad("token_burst", "needs --token-rate-limit", self.token_burst)
        if self.journal is not None and not self.telemetry:
            raise ConfigurationError("--journal: --no-telemetry keeps no summaries, so there is nothing to journal: "
                                     "leave out one of them")
        if self.drain_record is not None and not self.next_version:
            raise ConfigurationError("--drain-record: needs --next-version, the version that replaces this one "
                                     "(an update record names both)")
        self.engine_config()  # the engine's own checks

    def _check_text(self) -> None:
        for name in ("host", "model", "version"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise _bad(name, "must be a non-empty name", value)
        if self.profile not in PROFILES:
            raise _bad("profile", f"must be one of {', '.join(sorted(PROFILES))}", self.profile)
        classes = self.tenant_classes
        if not classes or len(set(classes)) != len(classes) or not all(
                isinstance(c, str) and c.strip() for c in classes):
            raise _bad("tenant_classes", "must be distinct non-empty class names, highest priority first", classes)
        for name in ("next_version", "update_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise _bad(name, "must be a non-empty name", value)

    @property
    def concurrency(self) -> int:
        """Admission slots: ``max_concurrency``, else ``max_num_seqs``."""
        return self.max_concurrency if self.max_concurrency is not None else self.max_num_seqs

    def engine_config(self) -> EngineConfig:
        """The simulated engine's configuration."""
        try:
            return EngineConfig(PROFILES[self.profile], max_num_seqs=self.max_num_seqs, kv_blocks=self.kv_blocks,
                                block_size=self.block_size, speed=float(self.speed),
                                mean_output_tokens=float(self.mean_output_tokens), seed=self.seed,
                                error_rate=float(self.error_rate))
        except ConfigurationError as exc:  # name the flag rather than the engine's field
            field = str(exc).split(":", 1)[0].removeprefix("EngineConfig.")
            raise ConfigurationError(f"{flag(field)}:{str(exc).split(':', 1)[1]}") from None


def config_fields() -> tuple[str, ...]:
    """The field names of :class:`ServerConfig` (each one flag of ``llmslo serve``)."""
    return tuple(f.name for f in fields(ServerConfig))


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
