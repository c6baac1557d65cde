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
    ttft_s: float | None = 2.0
    tpot_s: float | None = 0.1
    e2e_s: float | None = None
    one_token_passes_tpot: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "success", frozenset(self.success))
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError("SloPolicy.name: must be a non-empty string")
        unknown = sorted(self.success - set(FINISH_REASONS))
        if unknown:
            raise ConfigurationError(
                f"SloPolicy.success: unknown finish reason(s) {', '.join(unknown)}; "
                f"choose from {', '.join(FINISH_REASONS)}"
            )
        if not self.success:
            raise ConfigurationError("SloPolicy.success: needs at least one finish reason")
        for fname in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, fname)
            if value is not None and not (
                isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
            ):
                raise ConfigurationError(
                    f"SloPolicy.{fname}: must be a positive number of seconds or None, got {value!r}"
                )

    def is_good(self, row: Mapping[str, object]) -> bool:
        """The verdict for one request-summary row (see the class docstring)."""
        if row.get("finish_reason") not in self.success:
            return False
        if self.ttft_s is not None:
            ttft = row.get("ttft_s")
            if not isinstance(ttft, (int, float)) or ttft > self.ttft_s:
                return False
        if self.tpot_s is not None:
            generated = row.get("generated_tokens")
            n = generated if isinstance(generated, int) else 0
            if n > 1:
                ttft, last = row.get("ttft_s"), row.get("last_token_s")
                tpot = tpot_s(
                    float(ttft) if isinstance(ttft, (int, float)) else None,
                    float(last) if isinstance(last, (int, float)) else None,
                    n,
                )
                if tpot is None or tpot > self.tpot_s:
                    return False
            elif not self.one_token_passes_tpot:
                return False
        if self.e2e_s is not None:
            e2e = row.get("e2e_s")
            if not isinstance(e2e, (int, float)) or e2e > self.e2e_s:
                return False
        return True

    def thresholds(self) -> dict[str, float]:
        """The configured thresholds by interval name (``ttft_s``, ``tpot_s``, ``e2e_s``), seconds."""
        out: dict[str, float] = {}
        for fname in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, fname)
            if value is not None:
                out[fname] = float(value)
        return out
