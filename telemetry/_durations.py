"""Durations as people write them (``250ms``, ``2s``, ``1.5m``, ``1h30m``) to seconds, and back.

One parser for every place llmslo reads a duration: CLI options, SLO specs, report policies.
Standard library only.
"""

from __future__ import annotations

import math
import re

_UNITS_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(us|ms|s|m|h|d|w)")


def parse_duration(text: str) -> float:
    """Parse a duration into seconds: one or more ``<number><unit>`` parts, units ``us ms s m h d w``.

    >>> parse_duration("250ms"), parse_duration("2s"), parse_duration("1m"), parse_duration("1h30m")
    (0.25, 2.0, 60.0, 5400.0)

    Raises ``ValueError`` naming the text and the accepted forms when it is not a positive duration.
    """
    compact = text.strip().replace(" ", "")
    if not compact or _PART.sub("", compact) != "":
        raise ValueError(
            f"invalid duration {text!r}: write a number and a unit, e.g. 250ms, 2s, 1.5m, 1h30m "
            f"(units: {', '.join(_UNITS_S)})"
        )
    seconds = sum(float(n) * _UNITS_S[u] for n, u in _PART.findall(compact))
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {text!r}: too long to hold as a number of seconds")
    if seconds <= 0:
        raise ValueError(f"invalid duration {text!r}: must be greater than zero")
    return seconds


def format_duration(seconds: float) -> str:
    """Shortest readable form of a duration in seconds: ``0.25 -> '250ms'``, ``300 -> '5m'``."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 1e-3)):
        if seconds >= size and abs(seconds / size - round(seconds / size)) < 1e-9:
            return f"{round(seconds / size)}{unit}"
    if seconds >= 1:
        return f"{seconds:g}s"
    return f"{seconds * 1e3:g}ms"
