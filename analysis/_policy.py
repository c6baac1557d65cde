"""The goodput eligibility rule, fixed before looking at the data and printed with every result."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from llmslo.telemetry import FINISH_REASONS, TPOT_SQL, ConfigurationError, format_duration

DEFAULT_SUCCESS: frozenset[str] = frozenset({"stop", "length"})
DEFAULT_TTFT_S = 2.0
"""Default report TTFT SLO, seconds (docs/conventions.md, "Goodput")."""
DEFAULT_TPOT_S = 0.1
"""Default report TPOT SLO, seconds (docs/conventions.md, "Goodput")."""


@dataclass(frozen=True)
class GoodputPolicy:
    """Which requests count as good (definitions.md, "SLO attainment and goodput").

    A request is good when its finish reason is in ``success`` and every configured threshold holds,
    inclusive: ``ttft_s <= ttft_s``, ``tpot_s <= tpot_s`` (a reply of at most one token has no TPOT
    and passes only if ``one_token_passes_tpot``), ``e2e_s <= e2e_s``. Thresholds are seconds;
    ``None`` disables one. ``window_s`` (seconds) splits time into windows aligned to multiples of
    their length in Unix time; ``None`` means one window spanning the data.

    Raises :class:`~llmslo.telemetry.ConfigurationError` naming the field for an invalid value.

    Example::

        GoodputPolicy(ttft_s=2.0, tpot_s=0.1)
    """

    name: str = "default"
    success: frozenset[str] = field(default=DEFAULT_SUCCESS)
    ttft_s: float | None = DEFAULT_TTFT_S
    tpot_s: float | None = DEFAULT_TPOT_S
    e2e_s: float | None = None
    one_token_passes_tpot: bool = True
    window_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "success", frozenset(self.success))
        unknown = sorted(self.success - set(FINISH_REASONS))
        if unknown:
            raise ConfigurationError(
                f"GoodputPolicy.success: unknown finish reason(s) {', '.join(unknown)}; "
                f"choose from {', '.join(FINISH_REASONS)}"
            )
        if not self.success:
            raise ConfigurationError("GoodputPolicy.success: needs at least one finish reason")
        for fname in ("ttft_s", "tpot_s", "e2e_s", "window_s"):
            value = getattr(self, fname)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigurationError(
                    f"GoodputPolicy.{fname}: must be a positive number of seconds or None, got {value!r}"
                )

    def good_sql(self) -> str:
        """SQL predicate over a summary row (TPOT derived) that is TRUE exactly for good requests."""
        reasons = ", ".join(f"'{r}'" for r in sorted(self.success))
        parts = [f"finish_reason IN ({reasons})"]
        if self.ttft_s is not None:
            parts.append(f"coalesce(ttft_s <= {self.ttft_s!r}, FALSE)")
        if self.tpot_s is not None:
            one = "TRUE" if self.one_token_passes_tpot else "FALSE"
            parts.append(
                f"(CASE WHEN generated_tokens > 1 THEN coalesce(({TPOT_SQL}) <= {self.tpot_s!r}, FALSE) "
                f"ELSE {one} END)"
            )
        if self.e2e_s is not None:
            parts.append(f"e2e_s <= {self.e2e_s!r}")
        return "(" + " AND ".join(parts) + ")"

    def rule_text(self) -> str:
        """The rule in words, printed beside every goodput figure."""
        parts = [f"finish_reason in {{{', '.join(sorted(self.success))}}}"]
        if self.ttft_s is not None:
            parts.append(f"ttft_s <= {format_duration(self.ttft_s)}")
        if self.tpot_s is not None:
            one = "pass" if self.one_token_passes_tpot else "fail"
            parts.append(f"tpot_s <= {format_duration(self.tpot_s)} (replies of <= 1 token {one})")
        if self.e2e_s is not None:
            parts.append(f"e2e_s <= {format_duration(self.e2e_s)}")
        return (
            "good = " + " and ".join(parts)
            + "; attempted = every arrival in the window (rejected, cancelled, timed out and failed included);"
            " requests in flight at the window end are excluded from good and from the denominator"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with the rule in words."""
        return {
            "name": self.name,
            "success": sorted(self.success),
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "e2e_s": self.e2e_s,
            "one_token_passes_tpot": self.one_token_passes_tpot,
            "window_s": self.window_s,
            "rule": self.rule_text(),
        }
