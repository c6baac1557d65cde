"""Small PromQL writers: selectors, numbers, and the ``le`` matcher that works on Prometheus 2.x and 3.x."""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal

Matcher = tuple[str, str, str]
"""(label, operator, value) with operator one of ``=``, ``!=``, ``=~``, ``!~``."""


def quote(value: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(metric: str, matchers: Iterable[Matcher] = ()) -> str:
    """``metric{a="x",b=~"y|z"}``, matchers sorted by label so the text is stable."""
    parts = [f"{label}{op}{quote(value)}" for label, op, value in sorted(matchers)]
    return f"{metric}{{{','.join(parts)}}}" if parts else metric


def equal(pairs: Iterable[tuple[str, str]]) -> list[Matcher]:
    """Equality matchers from label pairs."""
    return [(k, "=", v) for k, v in pairs]


def one_of(label: str, values: Iterable[str]) -> Matcher:
    """``label="a"`` for one value, ``label=~"a|b"`` for several (values are regex-escaped)."""
    items = sorted(set(values))
    if len(items) == 1:
        return (label, "=", items[0])
    return (label, "=~", "|".join(re.escape(v) for v in items))


def number(value: Decimal | float | int) -> str:
    """A number as PromQL reads it, without exponent or float noise: ``Decimal('0.1440')`` -> ``0.144``."""
    d = value if isinstance(value, Decimal) else Decimal(repr(value) if isinstance(value, float) else value)
    text = format(d.normalize(), "f")
    return text


def le_forms(bound_s: float) -> tuple[str, ...]:
    """Every way an ``le`` label may spell ``bound_s``: ``2.0`` (Python clients, Prometheus 2.x keeps it as
    exposed), ``2`` (Go clients, and the normalised form of newer Prometheus). Sorted, no duplicates."""
    return tuple(sorted({repr(float(bound_s)), number(float(bound_s))}))


def le_matcher(bound_s: float) -> Matcher:
    """A matcher selecting the bucket whose upper bound is ``bound_s`` whichever way ``le`` is spelled."""
    return ("le", "=~", "|".join(re.escape(form) for form in le_forms(bound_s)))
