"""The goodput verdict a server computes at a request's terminal state (standard library only).

The rule is the one of definitions.md ("SLO attainment and goodput") and of the analysis package's
``GoodputPolicy``: a request is good when its finish reason is in the success set and every configured
threshold holds, inclusive. Thresholds are seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmslo.telemetry._errors import ConfigurationError
from llmslo.telemetry._summary import FINISH_REASONS, tpot_s

DEFAULT_SUCCESS: frozenset[str] = frozenset({"stop", "length"})
DEFAULT_TTFT_S = 2.0
"""Default TTFT SLO, seconds (docs/conventions.md, "Goodput")."""
DEFAULT_TPOT_S = 0.1
"""Default TPOT SLO, seconds (docs/conventions.md, "Goodput")."""


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class SloPolicy:
    """Which requests count as good, fixed before any request is seen.

    ``ttft_s``, ``tpot_s`` and ``e2e_s`` are inclusive upper bounds in seconds (``None`` disables one).
    A reply of at most one token has no TPOT and passes the TPOT condition only if
    ``one_token_passes_tpot``. ``name`` is the ``slo_class`` label of the goodput counters.

    Raises :class:`ConfigurationError` naming the field for an invalid value.

    Example::

        SloPolicy(name="interactive", ttft_s=2.0, tpot_s=0.1)
    """

    name: str = "default"
    success: frozenset[str] = field(default=DEFAULT_SUCCESS)
    ttft_s: float | None = DEFAULT_TTFT_S
    tpot_s: float | None = DEFAULT_TPOT_S
    e2e_s: float | None = None
    one_token_passes_tpot: bool = True

    def __post_init__(self) -> None:
        cls = type(self).__name__  # errors name the class the user wrote (GoodputPolicy extends this one)
        object.__setattr__(self, "success", frozenset(self.success))
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(f"{cls}.name: must be a non-empty string")
        unknown = sorted(self.success - set(FINISH_REASONS))
        if unknown:
            raise ConfigurationError(
                f"{cls}.success: unknown finish reason(s) {', '.join(unknown)}; "
                f"choose from {', '.join(FINISH_REASONS)}"
            )
        if not self.success:
            raise ConfigurationError(f"{cls}.success: needs at least one finish reason")
        self._check_seconds("ttft_s", "tpot_s", "e2e_s")

    def _check_seconds(self, *fields: str) -> None:
        for fname in fields:
            value = getattr(self, fname)
            if value is not None and not (
                isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
            ):
                raise ConfigurationError(
                    f"{type(self).__name__}.{fname}: must be a positive number of seconds or None, got {value!r}"
                )

    def is_good(self, row: Mapping[str, object]) -> bool:
        """The verdict for one request-summary row (see the class docstring)."""
        ttft, last, e2e = (_seconds(row.get(k)) for k in ("ttft_s", "last_token_s", "e2e_s"))
        generated = row.get("generated_tokens")
        n = generated if isinstance(generated, int) else 0
        return self.verdict(row.get("finish_reason"), ttft, tpot_s(ttft, last, n), n, e2e)

    def verdict(self, finish_reason: object, ttft: float | None, tpot: float | None, generated_tokens: int,
                e2e: float | None) -> bool:
        """The verdict from a request's finish reason, TTFT, TPOT (``None`` for at most one token), generated
        tokens and e2e (seconds; ``None`` when undefined). :meth:`is_good` reads them from a summary row."""
        if finish_reason not in self.success:
            return False
        limit = self.ttft_s
        if limit is not None and (ttft is None or ttft > limit):
            return False
        limit = self.tpot_s
        if limit is not None:
            if generated_tokens > 1:
                if tpot is None or tpot > limit:
                    return False
            elif not self.one_token_passes_tpot:
                return False
        limit = self.e2e_s
        return limit is None or (e2e is not None and e2e <= limit)

    def thresholds(self) -> dict[str, float]:
        """The configured thresholds by interval name (``ttft_s``, ``tpot_s``, ``e2e_s``), seconds."""
        out: dict[str, float] = {}
        for fname in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, fname)
            if value is not None:
                out[fname] = float(value)
        return out
