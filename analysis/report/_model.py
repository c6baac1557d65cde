"""The typed report: dataclasses whose ``to_dict()`` is the JSON of ``llmslo report --json``.

Every figure follows ``definitions.md``: times in seconds, rates per second of the rate basis, fractions
in [0, 1], quantiles exact (linear interpolation) unless named censoring-aware (Kaplan–Meier). A figure
that cannot be computed is ``None`` (JSON ``null``), never 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from llmslo.analysis.report._policy import GoodputPolicy

if TYPE_CHECKING:
    from llmslo.analysis.report._sql import QuantileMethod

__all__ = [
    "Accounting",
    "Bucket",
    "CensoringAwareTtft",
    "Distribution",
    "QuantileComparison",
    "Group",
    "GroupRateBasis",
    "RateBasis",
    "Report",
    "SuccessOnlyTtft",
    "SurvivorBias",
    "Tokens",
    "Totals",
    "Verdict",
]

Verdict = Literal["consistent", "optimistic", "insufficient_data"]
"""Survivor-bias verdict of a group (see ``docs/conventions.md``, "Survivor bias")."""
RateKind = Literal["window", "span", "run_duration", "none"]
"""What a group's per-second rates divide by: its window (the part before the horizon), the span of the
rows with arrival times, the run durations recorded by the imports its rows came from, or nothing (the
rates are null and the note says why)."""


@dataclass(frozen=True)
class Bucket:
    """Cumulative count of observations ``<= le`` seconds (``le`` is ``"+Inf"`` for the last bucket)."""

    le: float | Literal["+Inf"]
    count: int

    def to_dict(self) -> dict[str, Any]:
        return {"le": self.le, "count": self.count}


@dataclass(frozen=True)
class Distribution:
    """An interval's distribution over a group: count, mean, exact quantiles, max (seconds), buckets.

    ``quantiles`` maps a label (``p50``, ``p90``, ``p95``, ``p99``) to seconds, ``None`` with no data.
    """

    count: int
    mean: float | None
    quantiles: Mapping[str, float | None]
    max: float | None
    buckets: tuple[Bucket, ...]

    def quantile(self, label: str) -> float | None:
        """The quantile named ``label`` (``p99``), seconds."""
        return self.quantiles[label]

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, **self.quantiles, "max": self.max,
                "buckets": [b.to_dict() for b in self.buckets]}


@dataclass(frozen=True)
class Accounting:
    """``attempted = rejected + admitted``; ``admitted`` = the other finish reasons + ``in_flight``.

    ``ended`` counts settled requests per finish reason other than ``rejected``; ``unbalanced`` says why
    the totals do not add up (a finish reason outside the closed set) and is empty when they do.
    """

    attempted: int
    rejected: int
    admitted: int
    in_flight: int
    ended: Mapping[str, int]
    unbalanced: tuple[str, ...]

    @property
    def balanced(self) -> bool:
        return not self.unbalanced

    def to_dict(self) -> dict[str, Any]:
        return {"attempted": self.attempted, "rejected": self.rejected, "admitted": self.admitted,
                "in_flight": self.in_flight, **self.ended, "balanced": self.balanced,
                "unbalanced": list(self.unbalanced)}


@dataclass(frozen=True)
class SuccessOnlyTtft:
    """TTFT quantiles (seconds) over successful requests with a first token: what most tools report."""

    count: int
    quantiles: Mapping[str, float | None]

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, **self.quantiles}


@dataclass(frozen=True)
class CensoringAwareTtft:
    """Kaplan–Meier TTFT quantiles (seconds) over admitted requests; one that ended without a first
    token after ``e2e_s`` is censored there. A quantile the censoring leaves unbounded is ``None``; it is
    then at least ``at_least_s`` (the largest censored time)."""

    count: int
    events: int
    censored: int
    quantiles: Mapping[str, float | None]
    at_least_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "events": self.events, "censored": self.censored, **self.quantiles,
                "at_least_s": self.at_least_s}


@dataclass(frozen=True)
class QuantileComparison:
    """The survivor check of one TTFT quantile (docs/definitions.md, "Survivor bias").

    ``allowed`` is ``1 - q``: the share of admitted requests that may wait longer than the q-quantile;
    ``share`` the Kaplan–Meier share that waited longer than the success-only quantile, ``band`` its
    sampling band (Greenwood), both fractions, None when not ``judged`` (too few requests: ``reason`` says
    how many it needs). ``optimistic``: the share exceeds ``allowed`` beyond the band and the censoring-aware
    quantile exceeds the success-only one beyond the tolerance."""

    label: str
    allowed: float
    share: float | None
    band: float | None
    judged: bool
    optimistic: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"allowed": self.allowed, "share_beyond": self.share, "band": self.band, "judged": self.judged,
                "optimistic": self.optimistic, "reason": self.reason}


@dataclass
class SurvivorBias:
    """Does success-only latency flatter this group? The accounting, both TTFT estimates, the verdict."""

    accounting: Accounting
    shed_cancel_fraction: float | None
    ttft_success_only: SuccessOnlyTtft
    ttft_censoring_aware: CensoringAwareTtft
    verdict: Verdict
    reasons: list[str]
    comparisons: Mapping[str, QuantileComparison] = field(default_factory=dict)
    """The tail quantiles compared, by label (none when nothing is censored: the estimates then agree)."""

    def to_dict(self) -> dict[str, Any]:
        return {"accounting": self.accounting.to_dict(), "shed_cancel_fraction": self.shed_cancel_fraction,
                "ttft_success_only": self.ttft_success_only.to_dict(),
                "ttft_censoring_aware": self.ttft_censoring_aware.to_dict(),
                "comparisons": {k: c.to_dict() for k, c in self.comparisons.items()},
                "verdict": self.verdict, "reasons": list(self.reasons)}


@dataclass(frozen=True)
class Tokens:
    """The four token counts summed over the group, backpressure waste, and each count per second of
    the rate basis (``None`` without one)."""

    prompt_tokens: int
    proposed_tokens: int
    generated_tokens: int
    sent_tokens: int
    backpressure_waste_tokens: int
    prompt_tokens_per_s: float | None
    proposed_tokens_per_s: float | None
    generated_tokens_per_s: float | None
    sent_tokens_per_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens, "proposed_tokens": self.proposed_tokens,
            "generated_tokens": self.generated_tokens, "sent_tokens": self.sent_tokens,
            "backpressure_waste_tokens": self.backpressure_waste_tokens,
            "prompt_tokens_per_s": self.prompt_tokens_per_s, "proposed_tokens_per_s": self.proposed_tokens_per_s,
            "generated_tokens_per_s": self.generated_tokens_per_s, "sent_tokens_per_s": self.sent_tokens_per_s,
        }


@dataclass(frozen=True)
class GroupRateBasis:
    """What one group's per-second rates divide by: ``seconds`` of the ``kind`` (None when the rates are
    null), with a ``note`` saying why whenever it is not the window or the span of the data.

    ``reason`` is the note without the names of the ``files`` it concerns (default: the note itself): groups
    that share a reason are said once in the report's :attr:`RateBasis.exceptions`.
    """

    kind: RateKind
    seconds: float | None
    note: str | None = None
    reason: str | None = None
    files: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "seconds": self.seconds, "note": self.note}


@dataclass
class Group:
    """One group of the report (its ``keys``: column values and, with windows, the window start).

    ``goodput_fraction`` = good / settled (attempted − in flight); ``request_goodput_per_s`` and
    ``token_goodput_per_s`` divide by the group's ``rate_basis`` (null without one); ``latency`` maps each
    interval of :data:`~llmslo.analysis.report.LATENCY_INTERVALS` to its :class:`Distribution`.
    """

    keys: Mapping[str, Any]
    attempted: int
    good: int
    in_flight: int
    goodput_fraction: float | None
    request_goodput_per_s: float | None
    token_goodput_per_s: float | None
    one_token_replies: int
    good_one_token_replies: int
    finish_reasons: Mapping[str, int]
    latency: Mapping[str, Distribution]
    tokens: Tokens
    survivor_bias: SurvivorBias
    rate_basis: GroupRateBasis

    def to_dict(self) -> dict[str, Any]:
        return {
            "keys": dict(self.keys), "attempted": self.attempted, "good": self.good, "in_flight": self.in_flight,
            "goodput_fraction": self.goodput_fraction, "request_goodput_per_s": self.request_goodput_per_s,
            "token_goodput_per_s": self.token_goodput_per_s, "one_token_replies": self.one_token_replies,
            "good_one_token_replies": self.good_one_token_replies, "finish_reasons": dict(self.finish_reasons),
            "latency": {k: d.to_dict() for k, d in self.latency.items()}, "tokens": self.tokens.to_dict(),
            "survivor_bias": self.survivor_bias.to_dict(), "rate_basis": self.rate_basis.to_dict(),
        }


@dataclass(frozen=True)
class RateBasis:
    """What per-second rates of rows with arrival times divide by: the window length, or the data's span
    (first arrival to last finish, or to the horizon) when there is no window. ``seconds`` is ``None``
    when there is no usable span. ``exceptions`` name the groups whose rates divide by something else or
    are null, and why (each group's own :class:`GroupRateBasis` says which)."""

    kind: Literal["window", "span"]
    seconds: float | None
    from_unix_s: float | None = None
    to_unix_s: float | None = None
    note: str | None = None
    exceptions: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "window":
            return {"kind": self.kind, "seconds": self.seconds, "exceptions": list(self.exceptions)}
        return {"kind": self.kind, "seconds": self.seconds, "from_unix_s": self.from_unix_s,
                "to_unix_s": self.to_unix_s, "note": self.note, "exceptions": list(self.exceptions)}


@dataclass(frozen=True)
class Totals:
    """Across groups: stored requests, attempted, good, in flight, and good / settled."""

    requests: int
    attempted: int
    good: int
    in_flight: int
    goodput_fraction: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "attempted": self.attempted, "good": self.good,
                "in_flight": self.in_flight, "goodput_fraction": self.goodput_fraction}


@dataclass(frozen=True)
class Clock:
    """Whose clock the report's rows were measured on, read from the rows themselves: ``client_rows`` carry a
    figure of a client's clock and their ``ttft_s`` is that client's (``client_ttft_s`` repeats it) with no
    ``queue_s`` (``llmslo load``'s rows, rows imported from benchmark files); ``server_rows`` have a ``queue_s``,
    or a ``ttft_s`` apart from any ``client_ttft_s``; the other rows of ``rows`` tell nothing (a refusal with no
    time of either kind). ``kind``: ``client``, ``server``, ``mixed`` (both), or ``unknown`` (neither)."""

    rows: int
    client_rows: int
    server_rows: int

    @property
    def kind(self) -> str:
        if self.client_rows and self.server_rows:
            return "mixed"
        if self.client_rows:
            return "client"
        return "server" if self.server_rows else "unknown"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rows": self.rows, "client_rows": self.client_rows,
                "server_rows": self.server_rows}


@dataclass(frozen=True)
class Report:
    """The whole report: the policy it was judged under, its horizon (``until_unix_s``, Unix seconds:
    requests that finished after it are in flight; None: when the data was taken), its grouping and rate
    basis, the definitions of its figures (worded for the clock the rows were measured on: ``clock``),
    caveats about the data, totals and groups (in group-key order). ``quantiles`` names the definition of its
    quantiles, ``linear`` (the default) or ``nearest-rank``; ``definitions["quantiles"]`` words it."""

    schema_version: int
    caveats: tuple[str, ...]
    policy: GoodputPolicy
    group_by: tuple[str, ...]
    rate_basis: RateBasis
    definitions: Mapping[str, str]
    totals: Totals
    groups: tuple[Group, ...]
    until_unix_s: float | None = None
    clock: Clock | None = None
    quantiles: QuantileMethod = "linear"

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (``llmslo report --json``)."""
        return {
            "schema_version": self.schema_version,
            "caveats": list(self.caveats),
            "policy": self.policy.to_dict(),
            "until_unix_s": self.until_unix_s,
            "group_by": list(self.group_by),
            "rate_basis": self.rate_basis.to_dict(),
            "clock": None if self.clock is None else self.clock.to_dict(),
            "quantiles": self.quantiles,
            "definitions": dict(self.definitions),
            "totals": self.totals.to_dict(),
            "groups": [g.to_dict() for g in self.groups],
        }
