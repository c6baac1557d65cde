"""Load shedding and staged degradation: lowest priority first, degrade before refusing.

A :class:`LoadShedder` reads up to three signals, each against a level per tenant class:

- ``queue``: the admission queue's depth as a fraction of its capacity (``0..1``);
- ``latency``: the p99 (nearest rank) of the recent latencies the server reports (seconds; a window of at
  most ``latency_window`` samples, none older than ``latency_max_age_s``, trusted from
  ``latency_min_samples``). Samples age out so that a spike cannot shed forever: shed requests report no
  latency, so without ageing the window would never recover;
- ``gpu``: a utilisation reading (``0..1``) from a callable, read at most every ``refresh_s`` seconds;
  ``None``, a value outside ``0..1`` or a failing reader means "no reading" (the signal is ignored).

For a class, the **pressure** of a signal is ``value / level``; the request's pressure is the largest one.
At pressure ``>= 1`` the request is shed (rejected ``queue_full``; ``count_shed`` names the signal); below
that, every degradation stage ``(action, at)`` with ``pressure >= at`` applies (e.g. ``("cap_max_tokens",
0.8)``: from 80 % of the shed level on, cap ``max_tokens``). Stages come in order: degrade first, reject
beyond.

Levels must not decrease with priority (the level of ``interactive`` is at least that of ``batch`` for
every signal; a class without a level is never shed by that signal): checked at construction, this makes
"interactive is never shed while batch is admitted under the same signal" hold by construction.

An unknown tenant class is treated as the lowest class (the last one), never an error.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from llmslo.controls._decision import MONOTONIC, Clock
from llmslo.telemetry import ConfigurationError, Telemetry

GpuReader = Callable[[], float | None]
"""A GPU utilisation reading: a fraction ``0..1``, or ``None`` when there is none."""


def validate_classes(owner: str, classes: Sequence[str]) -> tuple[str, ...]:
    """The priority classes, highest first: a non-empty tuple of distinct non-empty strings."""
    if isinstance(classes, str) or not isinstance(classes, Sequence) or not classes:
        raise ConfigurationError(
            f"{owner}.classes: must be a non-empty sequence of class names, highest priority first, "
            f"got {classes!r}")
    out = tuple(classes)
    for c in out:
        if not isinstance(c, str) or not c:
            raise ConfigurationError(f"{owner}.classes: each class must be a non-empty string, got {c!r}")
    if len(set(out)) != len(out):
        raise ConfigurationError(f"{owner}.classes: class names must be distinct, got {list(out)}")
    return out


def resolve_class(classes: tuple[str, ...], tenant_class: object) -> tuple[str, int]:
    """``(name, rank)`` of ``tenant_class`` (rank 0 = highest priority); an unknown class is the lowest."""
    if isinstance(tenant_class, str):
        try:
            return tenant_class, classes.index(tenant_class)
        except ValueError:
            pass
    return classes[-1], len(classes) - 1


def queue_shed_levels(classes: Sequence[str], lowest: float) -> dict[str, float]:
    """The ``queue_levels`` of a :class:`LoadShedder` over ``classes`` (highest priority first): the queue fill
    fraction ``lowest`` for the last class, rising evenly to 1.0 (full) for the first. A class alone is shed
    at ``lowest``."""
    n = len(classes)
    if n == 1:
        return {classes[0]: lowest}
    return {c: lowest + (1.0 - lowest) * (n - 1 - i) / (n - 1) for i, c in enumerate(classes)}


@dataclass(frozen=True, slots=True)
class ShedVerdict:
    """What the shedder says about one request: ``shed`` (with the ``signal`` that decided), or the
    degradation ``actions`` to apply (empty: admit as is). ``pressure``: the largest signal / level ratio."""

    shed: bool
    signal: str | None = None
    actions: tuple[str, ...] = ()
    pressure: float = 0.0


_KEEP = ShedVerdict(False)


class LoadShedder:
    """Sheds the lowest priority first by queue length, recent p99 latency or GPU utilisation, and degrades
    requests (server-defined actions) before shedding them. See the module docstring for the rules.

    Parameters (keyword-only):

    - ``classes``: the tenant classes, highest priority first (default ``("interactive", "batch")``).
    - ``queue_levels``: per class, the queue fill fraction (``0 < level <= 1``) at which it is shed.
    - ``latency_levels_s``: per class, the recent p99 latency (seconds, > 0) at which it is shed.
    - ``gpu_levels``: per class, the GPU utilisation (``0 < level <= 1``) at which it is shed; needs ``gpu``.
    - ``gpu``: the utilisation reader (:data:`GpuReader`).
    - ``degrade``: the stages ``(action, at)``, ``0 < at < 1`` increasing: fraction of the shed level from
      which the action applies.
    - ``latency_window`` (samples), ``latency_max_age_s``, ``latency_min_samples``, ``refresh_s`` (seconds
      between p99 recomputations and GPU readings).
    - ``telemetry``: where :meth:`report_shed` / :meth:`report_degraded` count (an :class:`AdmissionQueue`
      counts through its own telemetry).
    - ``clock``: monotonic seconds.

    Raises :class:`ConfigurationError` naming the field for a bad value, e.g. a higher-priority class with a
    lower level than a lower-priority one.

    Example::

        shedder = LoadShedder(queue_levels={"interactive": 0.95, "batch": 0.5},
                              latency_levels_s={"interactive": 8.0, "batch": 4.0},
                              degrade=[("cap_max_tokens", 0.8)])
        shedder.observe_latency(ttft_s)               # per finished request
        verdict = shedder.assess("batch", queue_fraction=queue.depth / queue.capacity)
    """

    def __init__(self, *, classes: Sequence[str] = ("interactive", "batch"),
                 queue_levels: Mapping[str, float] | None = None,
                 latency_levels_s: Mapping[str, float] | None = None,
                 gpu_levels: Mapping[str, float] | None = None,
                 gpu: GpuReader | None = None,
                 degrade: Sequence[tuple[str, float]] = (),
                 latency_window: int = 1000, latency_max_age_s: float = 60.0, latency_min_samples: int = 20,
                 refresh_s: float = 1.0, telemetry: Telemetry | None = None,
                 clock: Clock = MONOTONIC) -> None:
        owner = "LoadShedder"
        self.classes = validate_classes(owner, classes)
        self._levels: dict[str, tuple[float, ...]] = {}
        for signal, field, levels, upper in (("queue", "queue_levels", queue_levels, 1.0),
                                             ("latency", "latency_levels_s", latency_levels_s, math.inf),
                                             ("gpu", "gpu_levels", gpu_levels, 1.0)):
            if levels is not None:
                self._levels[signal] = self._validate_levels(f"{owner}.{field}", levels, upper)
        if "gpu" in self._levels and gpu is None:
            raise ConfigurationError(f"{owner}.gpu: gpu_levels are set but no gpu reader is given")
        if gpu is not None and not callable(gpu):
            raise ConfigurationError(f"{owner}.gpu: must be a callable returning 0..1 or None")
        self.stages = self._validate_stages(f"{owner}.degrade", degrade)
        self._keep_when_empty = set(self._levels) <= {"queue"} and all(at > 0 for _, at in self.stages)
        """Only the queue is read and no stage acts at zero pressure: an empty queue keeps every request."""
        if not isinstance(latency_window, int) or isinstance(latency_window, bool) or latency_window < 1:
            raise ConfigurationError(f"{owner}.latency_window: must be an integer >= 1, got {latency_window!r}")
        if (not isinstance(latency_min_samples, int) or isinstance(latency_min_samples, bool)
                or not 1 <= latency_min_samples <= latency_window):
            raise ConfigurationError(
                f"{owner}.latency_min_samples: must be an integer in [1, latency_window], got "
                f"{latency_min_samples!r}")
        for field, value in (("latency_max_age_s", latency_max_age_s), ("refresh_s", refresh_s)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigurationError(f"{owner}.{field}: must be a finite number > 0 seconds, got {value!r}")
        self.telemetry = telemetry
        self._gpu = gpu
        self._clock = clock
        self._max_age_s = float(latency_max_age_s)
        self._min_samples = latency_min_samples
        self._refresh_s = float(refresh_s)
        self._lock = threading.Lock()
        self._latencies: deque[tuple[float, float]] = deque(maxlen=latency_window)  # (time s, latency s)
        self._p99: float | None = None
        self._p99_at: float | None = None
        self._gpu_value: float | None = None
        self._gpu_at: float | None = None

    def _validate_levels(self, field: str, levels: Mapping[str, float], upper: float) -> tuple[float, ...]:
        if not isinstance(levels, Mapping):
            raise ConfigurationError(f"{field}: must be a mapping of class name to level, got {levels!r}")
        for name in levels:
            if name not in self.classes:
                raise ConfigurationError(
                    f"{field}: unknown class {name!r}; the classes are {', '.join(self.classes)}")
        out = []
        for name in self.classes:
            v = levels.get(name, math.inf)
            if v != math.inf and not (isinstance(v, int | float) and not isinstance(v, bool)
                                      and math.isfinite(v) and 0 < v <= upper):
                bound = f"in (0, {upper:g}]" if math.isfinite(upper) else "> 0"
                raise ConfigurationError(f"{field}[{name!r}]: must be a finite number {bound}, got {v!r}")
            out.append(float(v))
        for hi, lo, hi_v, lo_v in zip(self.classes, self.classes[1:], out, out[1:], strict=False):
            if hi_v < lo_v:
                raise ConfigurationError(
                    f"{field}[{hi!r}]: a higher-priority class must not be shed before a lower one: "
                    f"{hi!r} at {hi_v:g} is below {lo!r} at {lo_v:g}")
        return tuple(out)

    @staticmethod
    def _validate_stages(field: str, stages: Sequence[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
        out: list[tuple[str, float]] = []
        for stage in stages:
            if not (isinstance(stage, tuple) and len(stage) == 2 and isinstance(stage[0], str) and stage[0]):
                raise ConfigurationError(f"{field}: each stage must be (action name, fraction), got {stage!r}")
            action, at = stage
            if not (isinstance(at, int | float) and not isinstance(at, bool) and 0 < at < 1):
                raise ConfigurationError(f"{field}[{action!r}]: the fraction must be in (0, 1), got {at!r}")
            if out and at < out[-1][1]:
                raise ConfigurationError(f"{field}[{action!r}]: stages must be in increasing order of fraction")
            if any(a == action for a, _ in out):
                raise ConfigurationError(f"{field}[{action!r}]: action names must be distinct")
            out.append((action, float(at)))
        return tuple(out)

    # ---- signals -----------------------------------------------------------------------------------------

    def observe_latency(self, seconds: float) -> None:
        """A recent request latency (seconds, e.g. its TTFT); NaN, negative or non-numbers are ignored."""
        if isinstance(seconds, int | float) and math.isfinite(seconds) and seconds >= 0:
            now = self._clock()
            self._lock.acquire()
            try:
                self._latencies.append((now, float(seconds)))
            finally:
                self._lock.release()

    def p99_s(self) -> float | None:
        """The p99 (nearest rank) of the recent latencies (seconds), recomputed at most every ``refresh_s``;
        ``None`` with fewer than ``latency_min_samples`` recent samples."""
        now = self._clock()
        self._lock.acquire()
        try:
            if self._p99_at is None or now - self._p99_at >= self._refresh_s or now < self._p99_at:
                window = self._latencies
                while window and now - window[0][0] > self._max_age_s:
                    window.popleft()
                if len(window) < self._min_samples:
                    self._p99 = None
                else:
                    ordered = sorted(v for _, v in window)
                    self._p99 = ordered[math.ceil(0.99 * len(ordered)) - 1]
                self._p99_at = now
            return self._p99
        finally:
            self._lock.release()

    def gpu_utilisation(self) -> float | None:
        """The GPU reading (``0..1``), read at most every ``refresh_s``; ``None`` when there is none or the
        reader failed (counted as an internal error when telemetry is set)."""
        if self._gpu is None:
            return None
        now = self._clock()
        at = self._gpu_at
        if at is not None and 0 <= now - at < self._refresh_s:
            return self._gpu_value
        value: float | None
        try:
            raw = self._gpu()
            value = float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None
        except Exception as exc:
            value = None
            if self.telemetry is not None:
                self.telemetry.guard.error("shedder.gpu", exc)
        if value is not None and not (math.isfinite(value) and 0 <= value <= 1):
            value = None
        self._gpu_value, self._gpu_at = value, now
        return value

    # ---- decisions ---------------------------------------------------------------------------------------

    def assess(self, tenant_class: str, queue_fraction: float = 0.0) -> ShedVerdict:
        """Shed, degrade or keep a request of ``tenant_class`` (unknown: the lowest class) given the queue's
        fill ``queue_fraction`` (depth / capacity). Reads the signals; reports nothing. Never raises."""
        levels = self._levels
        if not levels or (queue_fraction == 0 and self._keep_when_empty):
            return _KEEP
        _, rank = resolve_class(self.classes, tenant_class)
        values: list[tuple[str, float | None]] = []
        if "queue" in levels:
            q = queue_fraction if isinstance(queue_fraction, int | float) and math.isfinite(queue_fraction) else 0.0
            values.append(("queue", max(0.0, float(q))))
        if "latency" in levels:
            values.append(("latency", self.p99_s()))
        if "gpu" in levels:
            values.append(("gpu", self.gpu_utilisation()))
        return self.verdict(rank, values)

    def verdict(self, rank: int, values: Sequence[tuple[str, float | None]]) -> ShedVerdict:
        """The verdict for the class of ``rank`` given signal readings ``(signal, value or None)``: pure."""
        pressure, signal = 0.0, None
        for name, value in values:
            level = self._levels.get(name)
            if value is None or level is None:
                continue
            p = value / level[rank]
            if p > pressure:
                pressure, signal = p, name
        if pressure >= 1.0:
            return ShedVerdict(True, signal, (), pressure)
        actions = tuple(a for a, at in self.stages if pressure >= at)
        return ShedVerdict(False, signal, actions, pressure) if actions else _KEEP

    def report_shed(self, model: str, signal: str, tenant_class: str) -> None:
        """Count a request shed by ``signal`` (``llmslo_shed_requests_total``); never raises."""
        tel = self.telemetry
        if tel is not None:
            tel.count_shed(model, signal, resolve_class(self.classes, tenant_class)[0])

    def report_degraded(self, model: str, action: str) -> None:
        """Count a request degraded by ``action`` (``llmslo_degraded_requests_total``); never raises."""
        tel = self.telemetry
        if tel is not None:
            tel.count_degraded(model, action)
