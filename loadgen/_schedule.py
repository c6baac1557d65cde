"""Open-loop arrival schedules: when each request is sent and how long its prompt and its reply are.

A :class:`Schedule` is a plain list of :class:`Arrival` (offset from the start of the run in seconds, prompt
words, output tokens), made once before the run, so a slow server never moves an arrival (open loop: a
late reply does not delay the next send; only ``--max-concurrency`` can, and the lateness is measured).

Two sources:

- :func:`synthetic_schedule`: a renewal process at ``rate_per_s`` with Poisson (exponential gaps) or gamma
  gaps of a chosen coefficient of variation (``cv``: 1 is Poisson, above 1 burstier, below 1 smoother),
  seeded; lengths drawn from :class:`LengthSpec` (``N`` or ``MIN-MAX``, uniform).
- :func:`trace_schedule`: the offsets and lengths of a production trace (as
  ``llmslo.analysis.workload.read_trace`` reads them), replayed as recorded.

Both go through one :class:`RateProfile`: a ramp (the rate rises linearly from 0 to the full rate over
``ramp_s``) and bursts (:class:`Burst`: the rate times ``factor`` from ``start_s`` for ``duration_s``, on the
clock of the run). The profile is applied by time change: an arrival process of unit multiplier at
"operational" time ``u`` is sent at the real time ``t`` where the integral of the multiplier from 0 to ``t``
equals ``u``. Inside a burst of factor 3 every gap is therefore divided by 3, for a trace as for a Poisson
process (whose gaps there are again exponential, at three times the rate), and a gamma process keeps its
coefficient of variation.

Bad specifications raise :class:`SpecError` naming the flag and showing the accepted form. Standard
library only.
"""

from __future__ import annotations

import bisect
import math
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from llmslo.telemetry import LlmsloError, parse_duration

ARRIVAL_KINDS: tuple[str, ...] = ("poisson", "gamma")
"""The synthetic arrival processes :func:`synthetic_schedule` makes."""

LENGTH_FORM = "N or MIN-MAX, whole tokens >= 1 (e.g. 128 or 64-512)"
BURST_FORM = "FACTORx@START+LENGTH, e.g. 3x@60s+30s (the rate times 3 from 60 s for 30 s)"
DURATION_FORM = "a number and a unit, e.g. 250ms, 30s, 2m, 1h30m"
RATE_FORM = "requests per second > 0, e.g. 5 or 0.5"
CV_FORM = "a coefficient of variation > 0, e.g. 2 (bursty) or 0.5 (smooth); 1 is Poisson"
COUNT_FORM = "a whole number >= 1, e.g. 1000"


class SpecError(LlmsloError, ValueError):
    """A schedule or behaviour specification cannot be read. ``flag`` names the option, ``value`` is the text
    given, ``accepted`` the form the option takes; nothing was built."""

    def __init__(self, flag: str, value: object, accepted: str, why: str = "cannot read") -> None:
        self.flag = flag
        self.value = value
        self.accepted = accepted
        super().__init__(f"{flag}: {why} {value!r}; accepted form: {accepted}")


def parse_seconds(flag: str, text: str, *, zero: bool = False) -> float:
    """Seconds from a duration text (``250ms``, ``30s``, ``2m``); ``zero`` also accepts ``0`` and ``0s``.
    Raises :class:`SpecError` naming ``flag``."""
    if zero and text.strip() in ("0", "0s", "0ms"):
        return 0.0
    try:
        return parse_duration(text)
    except ValueError:
        raise SpecError(flag, text, DURATION_FORM + (" (or 0)" if zero else "")) from None


def parse_rate(flag: str, value: float) -> float:
    """A rate in requests per second (> 0, finite); :class:`SpecError` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise SpecError(flag, value, RATE_FORM, "must be a positive finite rate, got")
    return float(value)


def parse_count(flag: str, value: int) -> int:
    """A count >= 1; :class:`SpecError` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(flag, value, COUNT_FORM, "must be at least 1, got")
    return value


@dataclass(frozen=True, slots=True)
class LengthSpec:
    """A token length: ``low`` when ``low == high``, else uniform on ``low..high`` (inclusive), tokens."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not (1 <= self.low <= self.high):
            raise SpecError("length", f"{self.low}-{self.high}", LENGTH_FORM, "must satisfy 1 <= MIN <= MAX, got")

    @classmethod
    def parse(cls, flag: str, text: str) -> LengthSpec:
        """``N`` or ``MIN-MAX`` (whole tokens >= 1); :class:`SpecError` naming ``flag`` otherwise."""
        found = re.fullmatch(r"\s*(\d{1,9})\s*(?:-\s*(\d{1,9})\s*)?", text)
        if found is None:
            raise SpecError(flag, text, LENGTH_FORM)
        low = int(found.group(1))
        high = int(found.group(2)) if found.group(2) is not None else low
        if not 1 <= low <= high:
            raise SpecError(flag, text, LENGTH_FORM, "must satisfy 1 <= MIN <= MAX, got")
        return cls(low, high)

    def draw(self, rng: random.Random) -> int:
        """One length, tokens."""
        return self.low if self.low == self.high else rng.randint(self.low, self.high)

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


@dataclass(frozen=True, slots=True)
class Burst:
    """The rate times ``factor`` (> 0; below 1 a lull) from ``start_s`` for ``duration_s`` seconds of the run."""

    factor: float
    start_s: float
    duration_s: float

    def __post_init__(self) -> None:
        ok = (math.isfinite(self.factor) and self.factor > 0 and math.isfinite(self.start_s) and self.start_s >= 0
              and math.isfinite(self.duration_s) and self.duration_s > 0)
        if not ok:
            raise SpecError("--burst", f"{self.factor:g}x@{self.start_s:g}s+{self.duration_s:g}s", BURST_FORM,
                            "needs FACTOR > 0, START >= 0 and LENGTH > 0, got")

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    @classmethod
    def parse(cls, text: str, flag: str = "--burst") -> Burst:
        """``FACTORx@START+LENGTH`` (``3x@60s+30s``); :class:`SpecError` naming ``flag`` otherwise."""
        found = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*x\s*@([^+]+)\+(.+)", text)
        if found is None:
            raise SpecError(flag, text, BURST_FORM)
        factor = float(found.group(1))
        if not (math.isfinite(factor) and factor > 0):
            raise SpecError(flag, text, BURST_FORM, "needs a FACTOR > 0, got")
        try:
            start = parse_seconds(flag, found.group(2), zero=True)
            length = parse_seconds(flag, found.group(3))
        except SpecError:
            raise SpecError(flag, text, BURST_FORM, "cannot read START or LENGTH in") from None
        return cls(factor, start, length)

    def __str__(self) -> str:
        return f"{self.factor:g}x@{self.start_s:g}s+{self.duration_s:g}s"


@dataclass(frozen=True)
class _Segment:
    """``[start_s, next start)`` where the multiplier is ``factor`` (times ``t / ramp_s`` when ``ramped``);
    ``u0`` is the operational time at ``start_s``."""

    start_s: float
    u0: float
    factor: float
    ramped: bool


@dataclass(frozen=True)
class RateProfile:
    """How the rate varies over the run: an optional linear ramp from 0 over ``ramp_s`` seconds, and bursts.

    :meth:`multiplier` is the factor on the base rate at a time of the run (seconds); :meth:`warp` maps the
    operational time of a unit-multiplier process to the time of the run (the inverse of the multiplier's
    integral). Overlapping bursts multiply.
    """

    ramp_s: float | None = None
    bursts: tuple[Burst, ...] = ()
    _segments: tuple[_Segment, ...] = field(init=False, repr=False, compare=False)
    _starts_u: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.ramp_s is not None and not (math.isfinite(self.ramp_s) and self.ramp_s > 0):
            raise SpecError("--ramp", self.ramp_s, DURATION_FORM, "must be a duration > 0, got")
        cuts = {0.0}
        if self.ramp_s is not None:
            cuts.add(self.ramp_s)
        for b in self.bursts:
            cuts.update((b.start_s, b.end_s))
        points = sorted(cuts)
        segments: list[_Segment] = []
        u = 0.0
        for i, start in enumerate(points):
            factor = math.prod(b.factor for b in self.bursts if b.start_s <= start < b.end_s)
            ramped = self.ramp_s is not None and start < self.ramp_s
            segments.append(_Segment(start, u, factor, ramped))
            if i + 1 < len(points):
                u += self._integral(segments[-1], points[i + 1])
        object.__setattr__(self, "_segments", tuple(segments))
        object.__setattr__(self, "_starts_u", tuple(s.u0 for s in segments))

    def _integral(self, seg: _Segment, end_s: float) -> float:
        """The multiplier's integral over ``[seg.start_s, end_s]`` (inside the segment), seconds."""
        if seg.ramped:
            assert self.ramp_s is not None
            return seg.factor * (end_s * end_s - seg.start_s * seg.start_s) / (2.0 * self.ramp_s)
        return seg.factor * (end_s - seg.start_s)

    @property
    def is_flat(self) -> bool:
        """True when the profile changes nothing (no ramp, no burst)."""
        return self.ramp_s is None and not self.bursts

    def multiplier(self, t_s: float) -> float:
        """The factor on the base rate at ``t_s`` seconds of the run."""
        ramp = 1.0 if self.ramp_s is None or t_s >= self.ramp_s else max(0.0, t_s) / self.ramp_s
        return ramp * math.prod(b.factor for b in self.bursts if b.start_s <= t_s < b.end_s)

    def warp(self, u: float) -> float:
        """The time of the run (seconds) at which operational time ``u`` (seconds, >= 0) is reached."""
        if self.is_flat:
            return u
        i = bisect.bisect_right(self._starts_u, u) - 1
        seg = self._segments[max(i, 0)]
        left = u - seg.u0
        if seg.ramped:
            assert self.ramp_s is not None
            return math.sqrt(seg.start_s * seg.start_s + 2.0 * self.ramp_s * left / seg.factor)
        return seg.start_s + left / seg.factor

    def describe(self) -> str:
        """The profile in words (``flat`` when it changes nothing)."""
        parts = []
        if self.ramp_s is not None:
            parts.append(f"ramp 0 -> full rate over {self.ramp_s:g} s")
        parts += [f"burst x{b.factor:g} from {b.start_s:g} s for {b.duration_s:g} s" for b in self.bursts]
        return ", ".join(parts) or "flat"


@dataclass(frozen=True, slots=True)
class Arrival:
    """One scheduled request: its position ``index`` (from 0), ``offset_s`` (seconds after the start of the
    run), ``prompt_tokens`` (words of the prompt) and ``output_tokens`` (its ``max_tokens``)."""

    index: int
    offset_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Schedule:
    """An open-loop schedule: ``arrivals`` in send order (offsets non-decreasing), where it came from
    (``source``, in words) and ``notes`` (what was adjusted, e.g. lengths raised to 1)."""

    arrivals: tuple[Arrival, ...]
    source: str
    notes: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.arrivals)

    def __iter__(self) -> Iterator[Arrival]:
        return iter(self.arrivals)

    @property
    def span_s(self) -> float:
        """Offset of the last arrival, seconds (0 for an empty schedule)."""
        return self.arrivals[-1].offset_s if self.arrivals else 0.0

    def to_dict(self) -> dict[str, object]:
        """JSON-ready summary (not the arrivals themselves)."""
        n = len(self.arrivals)
        return {"source": self.source, "arrivals": n, "span_s": self.span_s,
                "mean_rate_per_s": (n - 1) / self.span_s if n > 1 and self.span_s > 0 else None,
                "notes": list(self.notes)}


def check_limits(duration_s: float | None, max_requests: int | None) -> None:
    """Raise :class:`SpecError` unless ``duration_s`` (seconds) is None or > 0 and ``max_requests`` None or
    >= 1: the ends a schedule takes."""
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise SpecError("--duration", duration_s, DURATION_FORM, "must be a duration > 0, got")
    if max_requests is not None:
        parse_count("--max-requests", max_requests)


def synthetic_schedule(*, rate_per_s: float, arrivals: str = "poisson", cv: float = 1.0,
                       prompt: LengthSpec = LengthSpec(128, 128), output: LengthSpec = LengthSpec(128, 128),
                       duration_s: float | None = None, max_requests: int | None = None,
                       profile: RateProfile = RateProfile(), seed: int = 0) -> Schedule:
    """A seeded Poisson or gamma arrival schedule at ``rate_per_s`` (requests per second, before the profile).

    The first arrival comes one gap after the start (a stationary process observed from time 0). Gamma gaps
    have shape ``1 / cv**2`` and mean ``1 / rate_per_s``, so their coefficient of variation is ``cv``; unlike
    ``vllm bench serve`` the gaps are not rescaled to a fixed total. Arrivals stop at ``duration_s`` seconds
    of the run or after ``max_requests`` (at least one must be given). Arrival times and lengths come from
    separate seeded streams: changing a length spec does not move an arrival.

    Raises :class:`SpecError` for a bad rate, kind, coefficient of variation or limit.
    """
    rate = parse_rate("--rate", rate_per_s)
    if arrivals not in ARRIVAL_KINDS:
        raise SpecError("--arrivals", arrivals, " or ".join(ARRIVAL_KINDS), "unknown kind")
    if isinstance(cv, bool) or not isinstance(cv, (int, float)) or not (math.isfinite(cv) and cv > 0):
        raise SpecError("--burstiness", cv, CV_FORM, "must be > 0, got")
    if arrivals == "poisson" and cv != 1:
        raise SpecError("--burstiness", cv, "--arrivals gamma --burstiness CV (a Poisson process has CV 1)",
                        "applies to gamma arrivals only, got")
    check_limits(duration_s, max_requests)
    if duration_s is None and max_requests is None:
        raise SpecError("--duration", None, "--duration 60s or --max-requests 1000 (or both)",
                        "a synthetic schedule needs an end: got neither, i.e.")
    gaps = random.Random(f"{seed}:arrivals")
    lengths = random.Random(f"{seed}:lengths")
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    out: list[Arrival] = []
    u = 0.0
    while max_requests is None or len(out) < max_requests:
        u += gaps.expovariate(rate) if arrivals == "poisson" else gaps.gammavariate(shape, scale)
        t = profile.warp(u)
        if duration_s is not None and t > duration_s:
            break
        out.append(Arrival(len(out), t, prompt.draw(lengths), output.draw(lengths)))
    kind = "Poisson" if arrivals == "poisson" else f"gamma (CV {cv:g})"
    source = f"{kind} arrivals at {rate:g} req/s, seed {seed}, {profile.describe()}"
    return Schedule(tuple(out), source)


def trace_schedule(offsets_s: Sequence[float], prompt_tokens: Sequence[int], output_tokens: Sequence[int], *,
                   source: str, profile: RateProfile = RateProfile(), duration_s: float | None = None,
                   max_requests: int | None = None, prompt: LengthSpec | None = None,
                   output: LengthSpec | None = None, seed: int = 0, recorded_by: str = "the trace") -> Schedule:
    """Replay a trace: request ``i`` at ``profile.warp(offsets_s[i])`` seconds of the run.

    ``offsets_s`` are seconds after the trace's first arrival (non-decreasing, as ``read_trace`` returns
    them); lengths come from the trace unless ``prompt`` / ``output`` replace them. A recorded length of 0
    (BurstGPT marks failed requests so) is sent as 1 and counted in the notes: a server needs at least one
    output token to answer; the note names ``recorded_by`` (``the trace``, ``the schedule``). ``duration_s`` and
    ``max_requests`` cut the replay short.

    Raises :class:`SpecError` for a limit that is not positive, ``ValueError`` when the columns differ in
    length or an offset is negative, not finite or out of order.
    """
    check_limits(duration_s, max_requests)
    n = len(offsets_s)
    if len(prompt_tokens) != n or len(output_tokens) != n:
        raise ValueError(f"{source}: offsets, prompt and output lengths differ in length "
                         f"({n}, {len(prompt_tokens)}, {len(output_tokens)})")
    lengths = random.Random(f"{seed}:lengths")
    out: list[Arrival] = []
    raised = {"prompt": 0, "output": 0}
    previous = 0.0
    for i in range(n):
        offset = float(offsets_s[i])
        if not math.isfinite(offset) or offset < previous:
            raise ValueError(f"{source}: row {i}: offset_s {offset!r} is negative, not finite or before the "
                             "previous arrival (a schedule is in arrival order)")
        previous = offset
        t = profile.warp(offset)
        if (duration_s is not None and t > duration_s) or (max_requests is not None and len(out) >= max_requests):
            break
        p = prompt.draw(lengths) if prompt is not None else int(prompt_tokens[i])
        o = output.draw(lengths) if output is not None else int(output_tokens[i])
        if p < 1:
            raised["prompt"] += 1
        if o < 1:
            raised["output"] += 1
        out.append(Arrival(len(out), t, max(1, p), max(1, o)))
    notes = tuple(f"{recorded_by} records {v:,} {k} length(s) of 0 tokens: sent as 1 token"
                  for k, v in raised.items() if v)
    return Schedule(tuple(out), f"{source}, {profile.describe()}", notes)
