"""Durations: parse the spec's ``30s``/``5m``/``100ms`` forms, write Prometheus durations and readable times."""

from __future__ import annotations

import math

from llmslo.rules._errors import SpecError
from llmslo.telemetry import parse_duration

_PROM_UNITS: tuple[tuple[str, int], ...] = (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def parse_duration_s(value: object, path: str) -> float:
    """Seconds from a number of seconds or a duration text (``100ms``, ``2s``, ``1h30m``, ``30d``).

    Text goes through llmslo's one duration parser (:func:`llmslo.telemetry.parse_duration`). Raises
    :class:`SpecError` naming ``path`` when the value is neither, or not positive.
    """
    seconds: float
    if isinstance(value, bool):
        raise SpecError(path, f"expected a duration such as 30s or 5m, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise SpecError(path, str(exc)) from None
    else:
        raise SpecError(path, f"expected a duration such as 30s or 5m, got {value!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise SpecError(path, f"must be a positive duration, got {value!r}")
    return seconds


def parse_whole_seconds(value: object, path: str) -> int:
    """Like :func:`parse_duration_s`, but the duration must be a whole number of seconds (windows, intervals)."""
    seconds = parse_duration_s(value, path)
    if seconds != int(seconds):
        raise SpecError(path, f"must be a whole number of seconds, got {value!r}")
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
