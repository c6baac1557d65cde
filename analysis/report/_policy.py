"""The goodput eligibility rule, fixed before looking at the data and printed with every result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmslo.telemetry import DEFAULT_TPOT_S, DEFAULT_TTFT_S, TPOT_SQL, SloPolicy, format_duration

__all__ = ["DEFAULT_TPOT_S", "DEFAULT_TTFT_S", "GoodputPolicy"]


@dataclass(frozen=True)
class GoodputPolicy(SloPolicy):
    """Which requests count as good (definitions.md, "SLO attainment and goodput"), for reports.

    The rule is the server's :class:`~llmslo.telemetry.SloPolicy` (same fields, defaults, validation and
    Python verdict): a request is good when its finish reason is in ``success`` and every configured
    threshold holds, inclusive: ``ttft_s <= ttft_s``, ``tpot_s <= tpot_s`` (a reply of at most one token
    has no TPOT and passes only if ``one_token_passes_tpot``), ``e2e_s <= e2e_s``. Thresholds are seconds;
    ``None`` disables one. This class adds ``window_s`` (seconds), which splits time into windows aligned
    to multiples of their length in Unix time (``None``: one window spanning the data), and the rule's
    SQL and text forms.

    Raises :class:`~llmslo.telemetry.ConfigurationError` naming the field for an invalid value.

    Example::

        GoodputPolicy(ttft_s=2.0, tpot_s=0.1)
    """

    window_s: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_seconds("window_s")

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
            + "; attempted = every arrival in the window (rejected, cancelled, timed out and failed included),"
            " judged by its final outcome however long it ran; only requests in flight at the report's horizon"
            " (--until; none for stored summaries without it) are excluded from good and from the denominator"
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
