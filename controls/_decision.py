"""The answer every control gives a request: admitted, or refused with a reason and when to come back.

A refusal carries one of the closed set of reject reasons (:data:`llmslo.telemetry.REJECT_REASONS`:
``queue_full``, ``rate_limited``, ``circuit_open``, ``draining``), the HTTP status a server answers with, and
``retry_after_s`` (seconds), which becomes the ``Retry-After`` header (whole seconds, rounded up, at least 1).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llmslo.telemetry import REJECT_REASONS, ConfigurationError

Clock = Callable[[], float]
"""A monotonic clock in seconds (``time.monotonic`` unless a test injects one)."""

MONOTONIC: Clock = time.monotonic
"""The default clock of every control."""

HTTP_STATUS: dict[str, int] = {
    "queue_full": 429,
    "rate_limited": 429,
    "circuit_open": 503,
    "draining": 503,
}
"""The status a refusal is answered with: 429 when the client asks too much (queue full, over its rate),
503 when the server cannot serve anyone now (breaker open, draining)."""


class Rejectable(Protocol):
    """What a control needs from a request it refuses (a :class:`llmslo.telemetry.RequestTracker`): its
    ``model`` and ``reject(reason)``, which commits the terminal state ``rejected`` with that reason."""

    model: str

    def reject(self, reason: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """``admitted``, or refused with ``reason`` (a reject reason), ``retry_after_s`` (seconds, None when
    there is no useful estimate) and a one-line ``detail`` for logs and the response body."""

    admitted: bool
    reason: str | None = None
    retry_after_s: float | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        if self.admitted:
            if self.reason is not None:
                raise ConfigurationError(
                    f"Decision.reason: an admitted request has no reject reason, got {self.reason!r}")
        elif self.reason not in REJECT_REASONS:
            raise ConfigurationError(
                f"Decision.reason: must be one of {', '.join(REJECT_REASONS)}, got {self.reason!r}")
        if self.retry_after_s is not None and not (math.isfinite(self.retry_after_s) and self.retry_after_s >= 0):
            raise ConfigurationError(
                f"Decision.retry_after_s: must be a finite number >= 0 seconds, got {self.retry_after_s!r}")

    @classmethod
    def refuse(cls, reason: str, retry_after_s: float | None = None, detail: str = "") -> Decision:
        """A refusal for ``reason`` (one of the reject reasons)."""
        return cls(False, reason, retry_after_s, detail)

    @property
    def http_status(self) -> int:
        """200 when admitted, else the status of :data:`HTTP_STATUS` for the reason."""
        return 200 if self.admitted else HTTP_STATUS[self.reason or ""]

    @property
    def retry_after_header(self) -> str | None:
        """The ``Retry-After`` value: whole seconds, rounded up, at least 1; None when admitted or unknown."""
        if self.admitted or self.retry_after_s is None:
            return None
        return str(max(1, math.ceil(self.retry_after_s)))

    def headers(self) -> list[tuple[str, str]]:
        """Response headers of a refusal (``Retry-After`` when known, a JSON content type); none when admitted."""
        if self.admitted:
            return []
        out = [("content-type", "application/json")]
        if (value := self.retry_after_header) is not None:
            out.append(("retry-after", value))
        return out

    def body(self) -> bytes:
        """The JSON body of a refusal, OpenAI-style: ``{"error": {"type", "message", "retry_after_s"}}``."""
        return json.dumps({"error": {"type": self.reason, "message": self.detail or str(self.reason),
                                     "retry_after_s": self.retry_after_s}}).encode()


ADMIT = Decision(True)
"""The one admitted decision (decisions are immutable, so it is shared)."""
