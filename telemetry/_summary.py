"""The request-summary contract: one row per request, the unit the server emits and the analysis reads.

This module is the single definition of that row. The DuckDB DDL, the Arrow/polars schema and the
vectorised validator in :mod:`llmslo.analysis` are derived from :data:`COLUMNS` and :data:`RULES`;
:func:`validate_summary` is the per-row form used inside servers. Standard library only.

Units: every ``*_s`` interval is in seconds measured on the server's monotonic clock from ``arrival``
(``client_*`` intervals on the client's clock); ``arrival_unix_s`` is wall-clock Unix seconds; token
counts are integers. See ``definitions.md`` for the meaning of every field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

SCHEMA_VERSION = 2
"""Version of the request-summary schema; a store records it, upgrades an older one it knows how to (version 1
lacks ``backend``: the column is added, null) and refuses any other."""

ColumnKind = Literal["str", "float", "int", "float_list"]


class FinishReason(StrEnum):
    """The closed set of terminal states of a request."""

    STOP = "stop"
    LENGTH = "length"
    CLIENT_CANCEL = "client_cancel"
    DEADLINE = "deadline"
    SERVER_DRAINING = "server_draining"
    REJECTED = "rejected"
    ERROR = "error"


class RejectReason(StrEnum):
    """Why admission control refused a request (only with ``finish_reason == "rejected"``)."""

    QUEUE_FULL = "queue_full"
    RATE_LIMITED = "rate_limited"
    CIRCUIT_OPEN = "circuit_open"
    DRAINING = "draining"


FINISH_REASONS: tuple[str, ...] = tuple(r.value for r in FinishReason)
REJECT_REASONS: tuple[str, ...] = tuple(r.value for r in RejectReason)

_Default = str | float | int | None


@dataclass(frozen=True)
class Column:
    """One column of the request summary.

    ``required`` columns must be present in every input; the others may be absent and then take
    ``default``. ``nullable`` says whether a present value may be null. ``allowed`` closes the set
    of values of a string column.
    """

    name: str
    kind: ColumnKind
    doc: str
    nullable: bool = False
    required: bool = True
    default: _Default = None
    allowed: tuple[str, ...] | None = None


def _opt(name: str, kind: ColumnKind, doc: str, default: _Default = None) -> Column:
    """An optional column: may be absent from the input (then ``default``); null only if no default."""
    return Column(name, kind, doc, nullable=default is None, required=False, default=default)


COLUMNS: tuple[Column, ...] = (
    Column("request_id", "str", "unique id of the request (never a metric label)"),
    Column("model", "str", "served model name"),
    Column("version", "str", "server or model version that served the request"),
    Column("tenant_class", "str", "tenant or priority class (e.g. interactive, batch)"),
    Column("arrival_unix_s", "float", "wall-clock arrival time, Unix seconds"),
    Column("finish_reason", "str", "terminal state", allowed=FINISH_REASONS),
    Column(
        "reject_reason", "str", "why it was rejected (only when rejected)",
        nullable=True, required=False, allowed=REJECT_REASONS,
    ),
    _opt("error_type", "str", "bounded error class (only when error)"),
    _opt("queue_s", "float", "scheduled - arrival, s; null if never scheduled"),
    _opt("ttft_s", "float", "first token committed - arrival, s; null if no token"),
    _opt("last_token_s", "float", "last token committed - arrival, s; null if no token"),
    Column("e2e_s", "float", "terminal state committed - arrival, s"),
    Column("prompt_tokens", "int", "input tokens"),
    _opt("proposed_tokens", "int", "draft tokens proposed by speculative decoding", default=0),
    Column("generated_tokens", "int", "output tokens the engine committed"),
    Column("sent_tokens", "int", "output tokens handed to the transport"),
    _opt("client_ttft_s", "float", "first chunk received - request sent, client clock, s"),
    _opt("client_e2e_s", "float", "last byte received - request sent, client clock, s"),
    _opt("stream_paused_s", "float", "seconds the producer waited for send credit", default=0.0),
    _opt("stream_max_queued", "int", "deepest per-request send queue, chunks", default=0),
    _opt("itl_s", "float_list", "token-weighted inter-token gaps, s (optional)"),
    _opt("backend", "str", "the backend (engine instance) a gateway routed the request to; null without one"),
)
"""Every column of the request summary, in storage order."""

COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)
COLUMNS_BY_NAME: Mapping[str, Column] = {c.name: c for c in COLUMNS}

INTERVAL_COLUMNS: tuple[str, ...] = tuple(
    c.name for c in COLUMNS if c.name.endswith("_s") and c.name != "arrival_unix_s"
)
"""Columns holding durations in seconds (must be finite and non-negative)."""

COUNT_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.kind == "int")
"""Columns holding counts (must be non-negative)."""

TOKEN_COUNT_COLUMNS: tuple[str, ...] = (
    "prompt_tokens", "proposed_tokens", "generated_tokens", "sent_tokens",
)


@dataclass(frozen=True)
class Violation:
    """One broken rule in one row: which column, which value, which rule, and why."""

    rule: str
    column: str
    value: object
    message: str


Row = Mapping[str, object]


@dataclass(frozen=True)
class Rule:
    """A cross-field rule of the contract, in two equivalent forms.

    ``sql`` is a boolean SQL expression over the column names that is TRUE for a violating row
    (NULL counts as no violation); ``check`` is the same predicate over a typed Python row. The
    test suite proves the two agree on generated rows.
    """

    name: str
    column: str
    message: str
    sql: str
    check: Callable[[Row], bool] = field(compare=False)


def _num(row: Row, name: str) -> float | None:
    value = row.get(name)
    return float(value) if isinstance(value, (int, float)) else None


def _gt(a: str, b: str) -> Callable[[Row], bool]:
    def check(row: Row) -> bool:
        x, y = _num(row, a), _num(row, b)
        return x is not None and y is not None and x > y

    return check


def _rejected_without_reason(row: Row) -> bool:
    return row.get("finish_reason") == "rejected" and row.get("reject_reason") is None


def _reason_without_rejection(row: Row) -> bool:
    return row.get("finish_reason") != "rejected" and row.get("reject_reason") is not None


def _ttft_without_token(row: Row) -> bool:
    return row.get("ttft_s") is not None and _num(row, "generated_tokens") == 0


def _token_without_ttft(row: Row) -> bool:
    generated = _num(row, "generated_tokens")
    return row.get("ttft_s") is None and generated is not None and generated > 0


def _ttft_last_token_mismatch(row: Row) -> bool:
    return (row.get("ttft_s") is None) != (row.get("last_token_s") is None)


def _itl_negative(row: Row) -> bool:
    gaps = row.get("itl_s")
    if not isinstance(gaps, Sequence):
        return False
    return any(isinstance(g, (int, float)) and not (math.isfinite(g) and g >= 0) for g in gaps)


RULES: tuple[Rule, ...] = (
    Rule("ttft_after_e2e", "ttft_s", "ttft_s must not exceed e2e_s",
         "ttft_s > e2e_s", _gt("ttft_s", "e2e_s")),
    Rule("last_token_after_e2e", "last_token_s", "last_token_s must not exceed e2e_s",
         "last_token_s > e2e_s", _gt("last_token_s", "e2e_s")),
    Rule("ttft_after_last_token", "ttft_s", "ttft_s must not exceed last_token_s",
         "ttft_s > last_token_s", _gt("ttft_s", "last_token_s")),
    Rule("queue_after_ttft", "queue_s",
         "queue_s must not exceed ttft_s (a request is scheduled before its first token)",
         "queue_s > ttft_s", _gt("queue_s", "ttft_s")),
    Rule("queue_after_e2e", "queue_s", "queue_s must not exceed e2e_s",
         "queue_s > e2e_s", _gt("queue_s", "e2e_s")),
    Rule("sent_exceeds_generated", "sent_tokens",
         "sent_tokens must not exceed generated_tokens",
         "sent_tokens > generated_tokens", _gt("sent_tokens", "generated_tokens")),
    Rule("ttft_without_token", "ttft_s",
         "ttft_s is set but generated_tokens is 0 (no token, no first-token time)",
         "ttft_s IS NOT NULL AND generated_tokens = 0", _ttft_without_token),
    Rule("token_without_ttft", "ttft_s",
         "generated_tokens > 0 but ttft_s is null (a committed token has a first-token time)",
         "ttft_s IS NULL AND generated_tokens > 0", _token_without_ttft),
    Rule("ttft_last_token_mismatch", "last_token_s",
         "ttft_s and last_token_s must be both set or both null",
         "(ttft_s IS NULL) <> (last_token_s IS NULL)", _ttft_last_token_mismatch),
    Rule("rejected_without_reason", "reject_reason",
         "finish_reason 'rejected' needs a reject_reason",
         "finish_reason = 'rejected' AND reject_reason IS NULL", _rejected_without_reason),
    Rule("reason_without_rejection", "reject_reason",
         "reject_reason is only allowed when finish_reason is 'rejected'",
         "finish_reason <> 'rejected' AND reject_reason IS NOT NULL", _reason_without_rejection),
    Rule("negative_itl", "itl_s", "every itl_s gap must be finite and >= 0",
         "len(list_filter(itl_s, lambda g: NOT (isfinite(g) AND g >= 0))) > 0", _itl_negative),
)
"""Cross-field rules; type, null, enum, range and uniqueness rules derive from :data:`COLUMNS`."""


def _type_ok(column: Column, value: object) -> bool:
    if column.kind == "str":
        return isinstance(value, str)
    if column.kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if column.kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, (list, tuple)) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    )


def validate_summary(row: Row) -> list[Violation]:
    """Check one summary row against the contract; return every violation (empty when valid).

    Column rules: ``missing`` (a required column is absent), ``unknown_column``, ``null`` (null in a
    non-nullable column), ``type``, ``empty`` (an empty required string), ``not_allowed`` (value
    outside a closed set), ``non_finite`` (NaN or infinity), ``negative``; then the cross-field
    :data:`RULES`. Uniqueness of ``request_id`` is a property of a batch and is checked by the store.

    Example::

        >>> validate_summary({"request_id": "r1"})[0].rule
        'missing'
    """
    out: list[Violation] = []
    for name in row:
        if name not in COLUMNS_BY_NAME:
            out.append(Violation("unknown_column", name, row[name], f"unknown column {name!r}"))
    typed: dict[str, object] = {}
    for col in COLUMNS:
        if col.name not in row:
            if col.required:
                out.append(Violation("missing", col.name, None, f"required column {col.name!r} is missing"))
            typed[col.name] = col.default
            continue
        value = row[col.name]
        if value is None:
            if not col.nullable:
                out.append(Violation("null", col.name, None, f"{col.name} must not be null"))
            typed[col.name] = None
            continue
        if not _type_ok(col, value):
            out.append(Violation("type", col.name, value, f"{col.name} must be of type {col.kind}"))
            typed[col.name] = None
            continue
        if col.kind == "str" and not col.nullable and value == "":
            out.append(Violation("empty", col.name, value, f"{col.name} must not be empty"))
        if col.allowed is not None and value not in col.allowed:
            out.append(Violation(
                "not_allowed", col.name, value,
                f"{col.name} must be one of {', '.join(col.allowed)}",
            ))
        if isinstance(value, float) and not math.isfinite(value):
            out.append(Violation("non_finite", col.name, value, f"{col.name} must be finite"))
            typed[col.name] = None
            continue
        if isinstance(value, (int, float)) and value < 0 and col.name != "arrival_unix_s":
            out.append(Violation("negative", col.name, value, f"{col.name} must be >= 0"))
        typed[col.name] = value
    for rule in RULES:
        if rule.check(typed):
            out.append(Violation(rule.name, rule.column, typed.get(rule.column), rule.message))
    return out


def tpot_s(ttft_s: float | None, last_token_s: float | None, generated_tokens: int) -> float | None:
    """Time per output token after the first, seconds: ``(last_token_s - ttft_s) / (N - 1)``.

    ``None`` when ``generated_tokens <= 1`` or a time is missing (never 0: see definitions.md).
    """
    if ttft_s is None or last_token_s is None or generated_tokens <= 1:
        return None
    return (last_token_s - ttft_s) / (generated_tokens - 1)


TPOT_SQL = (
    "CASE WHEN generated_tokens > 1 "
    "THEN (last_token_s - ttft_s) / (generated_tokens - 1) END"
)
"""The SQL form of :func:`tpot_s`, used by every query that reports TPOT."""

DECODE_SQL = "CASE WHEN generated_tokens > 1 THEN last_token_s - ttft_s END"
"""Decode time ``last_token_s - ttft_s`` in seconds, null when ``generated_tokens <= 1``."""
