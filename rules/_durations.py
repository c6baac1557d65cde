"""Durations: parse the spec's ``30s``/``5m``/``100ms`` forms, write Prometheus durations and readable times."""

from __future__ import annotations

import math

from llmslo.rules._errors import SpecError, short_repr
from llmslo.telemetry import parse_duration

_PROM_UNITS: tuple[tuple[str, int], ...] = (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))

MAX_PROMETHEUS_DURATION_S = (2**63 - 1) // 10**9
"""The longest duration Prometheus reads, in whole seconds: 9,223,372,036 s = 106751d23h47m16s (about 292 years).

Prometheus holds a duration (a range ``[5m]``, a rule's ``for``, a group's ``interval``, a promtool test's
``eval_time``) as a Go ``time.Duration``, a signed 64-bit count of nanoseconds, and its parser
(``model.ParseDuration`` in prometheus/common) refuses anything longer with "duration out of range".
"""


def parse_duration_s(value: object, path: str) -> float:
    """Seconds from a number of seconds or a duration text (``100ms``, ``2s``, ``1h30m``, ``30d``).

    Text goes through llmslo's one duration parser (:func:`llmslo.telemetry.parse_duration`). Raises
    :class:`SpecError` naming ``path`` when the value is neither, not positive, or longer than Prometheus
    accepts (:data:`MAX_PROMETHEUS_DURATION_S`).
    """
    seconds: float
    if isinstance(value, bool):
        raise SpecError(path, f"expected a duration such as 30s or 5m, got {short_repr(value)}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise SpecError(path, str(exc)) from None
    else:
        raise SpecError(path, f"expected a duration such as 30s or 5m, got {short_repr(value)}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise SpecError(path, f"must be a positive duration, got {short_repr(value)}")
    if seconds > MAX_PROMETHEUS_DURATION_S:
        raise SpecError(path, f"{short_repr(value)} is longer than Prometheus accepts: a duration may be at most "
                              f"{prometheus_duration(MAX_PROMETHEUS_DURATION_S)} (2^63-1 nanoseconds, about 292 "
                              "years)")
    return seconds


def parse_whole_seconds(value: object, path: str) -> int:
    """Like :func:`parse_duration_s`, but the duration must be a whole number of seconds (windows, intervals)."""
    seconds = parse_duration_s(value, path)
    if seconds != int(seconds):
        raise SpecError(path, f"must be a whole number of seconds, got {short_repr(value)}")
    return int(seconds)


def prometheus_duration(seconds: int) -> str:
    """A Prometheus duration for a whole number of seconds: ``300`` -> ``5m``, ``5400`` -> ``1h30m``."""
    if seconds <= 0:
        raise ValueError(f"a Prometheus duration must be positive, got {seconds} s")
    parts: list[str] = []
    rest = seconds
    for unit, size in _PROM_UNITS:
        if unit == "w" and rest % size:
            continue  # 10d reads better than 1w3d
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts)


def human_duration(seconds: float) -> str:
    """A short readable duration: ``518.4`` -> ``8m38s``, ``43.2`` -> ``43s``, ``4.32`` -> ``4.3s``."""
    if seconds < 10:
        return f"{seconds:.1f}s".replace(".0s", "s")
    whole = round(seconds)
    parts: list[str] = []
    for unit, size in _PROM_UNITS[1:]:
        if whole >= size or (unit == "s" and not parts):
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(p for p in parts if not p.startswith("0") or len(parts) == 1)
