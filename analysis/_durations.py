"""Human durations (``250ms``, ``2s``, ``1.5m``, ``1h``) to seconds and back."""

from __future__ import annotations

import re

_UNITS_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(us|ms|s|m|h|d)\s*$")


def parse_duration(text: str) -> float:
    """Parse a duration with a unit (``us ms s m h d``) into seconds.

    >>> parse_duration("250ms"), parse_duration("2s"), parse_duration("1m")
    (0.25, 2.0, 60.0)

    Raises ``ValueError`` naming the text and the accepted forms when it is not a positive duration.
    """
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(
            f"invalid duration {text!r}: write a number and a unit, e.g. 250ms, 2s, 1.5m, 1h "
            f"(units: {', '.join(_UNITS_S)})"
        )
    seconds = float(match.group(1)) * _UNITS_S[match.group(2)]
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
