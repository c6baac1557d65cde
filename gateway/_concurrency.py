"""The concurrency limit of one backend, adapted to its latency per unit of work; and a whole-request baseline.

A gateway sends at most ``limit`` requests at once to a backend (:meth:`AdaptiveLimit.try_acquire` before
sending, :meth:`AdaptiveLimit.release` when the request ends) and reports each finished request's figures
(:meth:`AdaptiveLimit.observe`). The limit follows two costs, never whole-request time:

- **prefill cost**: the backend's time to first token per prompt token, ``ttft_s / max(prompt_tokens, 1)``
  (seconds per token), from every request that got a first token. Here ``ttft_s`` is the backend's: from the
  request's write to the backend to its first content chunk, not the summary's ``ttft_s`` (from the arrival,
  the gateway's queue included), so the gateway's own queue never reads as a slower backend;
- **decode cost**: the median (nearest rank) of the request's inter-chunk gaps (seconds), from every request
  with at least one gap. The median, not a tail: an engine that prefills in its decode steps (llama.cpp,
  ``llmslo serve``, vLLM's chunked prefill) stretches the step after each arrival, so the share of long gaps
  follows the arrival rate, not the backend's cost per token. Measured on ``llmslo serve --speed 5`` at
  20 req/s with 5 of its 16 sequences busy, the p90 gap was 15 ms against 6.7 ms with 2 in flight (a step
  that prefills is about 2.3x a decode step there, and about one step in six carried one); a limit on it held
  5 requests and queued the rest 2 s, where the engine alone answered in 23 ms. The median is the plain
  decode step; it rises when the backend is slower per token.

**Tokens in flight.** Each request may also carry its weight in tokens (the gateway gives its prompt tokens and
the tokens it is expected to generate: :class:`OutputEstimate`), and the limit bounds the tokens in flight as well
as the requests. The token limit has no value until a window within tolerance had tokens in flight. During the
slow start it rises to :data:`TOKEN_HEADROOM` times the most tokens in flight of any window within tolerance whose
engine was not full (below): the load the backend is known to serve, with the same headroom as the slow start's
doubling. After the slow start (the first window over tolerance), a window within tolerance in which
the tokens reached :data:`TOKEN_BINDING` of the limit raises it by :data:`TOKEN_STEP` of itself: the token limit
probes upward as the request limit does, a step at a time, rather than jumping back to twice the last good load.
A window over tolerance in which the tokens in flight reached :data:`TOKEN_BINDING` of it cuts it as the request
limit is cut. So when the
requests turn heavier (longer prompts, longer answers) on a backend bound by its KV cache, the requests
admitted are held at once to about the tokens that were served well, where a limit in requests alone would let
the same count of heavier requests through and wait for the latency to rise before cutting it, one window at a
time (``bench/bench_gateway_tokens.py`` runs both).

**The engine's own queue.** Where the gateway reads the engine's metrics (``--engine``), each finished request
also brings the requests waiting in the engine's queue at the last read. A window in which most of them found
requests waiting raises neither limit (``engine_full_windows`` counts those). The latency signals miss that
queue: its waits fall on a minority of the requests under the window's median, and a long prompt's TTFT per
prompt token dilutes them (measured in ``bench/bench_gateway_tokens.py``: with long prompts on a backend bound
by its KV cache, the limit held about 1.5 times the requests the cache holds). A queue seen now and then is the
engine's next step, not a full engine: hence most of the window. Such a window does not cut either limit: the
waiting an engine reports also counts the requests that arrived since its last step, and a cut on it (tried in
the same benchmark) wore the limits down where the engine was not full.

Whole-request time of a token stream is mostly its output length: a long answer looks like a slow backend.
:class:`WholeRttGradientLimit` models Envoy's gradient controller on whole-request time, for comparison
(``bench/bench_gateway_concurrency.py`` runs both against the same simulated backend).

Standard library only (plus llmslo's error type). Neither class is thread-safe: one event loop owns each.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence

from llmslo.telemetry import ConfigurationError

PREFILL = "ttft_per_prompt_token_s"
"""The prefill cost signal: time to first token per prompt token (seconds per token)."""

DECODE = "gap_median_s"
"""The decode cost signal: the median of one stream's inter-chunk gaps (seconds)."""

SIGNALS: tuple[str, ...] = (PREFILL, DECODE)

RESOLUTION_S = 1e-6
"""Costs below this (seconds) count as this: a zero baseline would make every later sample infinitely slow."""

MAX_S = 86_400.0
"""Figures above this (seconds: a day) are dropped as bad: a unit mistake, not a latency."""

REBASE_CUT = 2.0 / 3.0
"""A re-measure compares the costs at two concurrencies: the later at most this fraction of the earlier."""

PLATEAU = 0.9
"""The cost "did not respond" to that cut when its gradient is within this factor of the earlier one (either
way: a cost that rose while the load fell says the backend is changing; it is measured again)."""


TOKEN_HEADROOM = 2.0
"""During the slow start the token limit is at least this many times the most tokens in flight of a window within
tolerance."""

TOKEN_BINDING = 0.9
"""A window over tolerance cuts the token limit, and one within tolerance after the slow start raises it, when its
most tokens in flight reached this fraction of it."""

TOKEN_STEP = 0.1
"""After the slow start, a window within tolerance that the token limit bound raises it by this fraction."""

ESTIMATE_EVERY = 32
"""An :class:`OutputEstimate` recomputes its quantile once every this many replies."""


def _cost(value: object) -> float | None:
    """``value`` as a cost in ``0..MAX_S`` seconds, or None for anything else (negative, NaN, inf, above
    :data:`MAX_S`, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    x = float(value)
    if not 0 <= x <= MAX_S:     # NaN fails every comparison
        return None
    return x


def _nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 < q <= 1) of non-empty sorted values by nearest rank: the ``ceil(q n)``-th."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def _int_field(owner: str, name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigurationError(f"{owner}.{name}: must be an integer >= {low}, got {value!r}")
    return value


def _number_field(owner: str, name: str, value: object, low: float, high: float, what: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not low < value <= high):
        raise ConfigurationError(f"{owner}.{name}: must be {what}, got {value!r}")
    return float(value)


def _limits(owner: str, initial: object, min_limit: object, max_limit: object) -> tuple[int, int, int]:
    """``(initial, min_limit, max_limit)`` checked: integers, ``1 <= min_limit <= initial <= max_limit``."""
    low = _int_field(owner, "min_limit", min_limit, 1)
    high = _int_field(owner, "max_limit", max_limit, low)
    start = _int_field(owner, "initial", initial, low)
    if start > high:
        raise ConfigurationError(f"{owner}.initial: must be between min_limit ({low}) and max_limit ({high}), "
                                 f"got {start}")
    return start, low, high


def _clock_field(owner: str, clock: object) -> Callable[[], float]:
    if not callable(clock):
        raise ConfigurationError(f"{owner}.clock: must be a callable returning monotonic seconds, got {clock!r}")
    return clock


class _Slots:
    """Requests in flight against a limit: the acquire/release half both controllers share."""

    def __init__(self, min_limit: int, max_limit: int, limit: float) -> None:
        self.min_limit = min_limit
        self.max_limit = max_limit
        self._limit = float(limit)   # the controller's value, kept in min..max by each update; limit is its floor
        self._in_flight = 0
        self.unmatched_releases = 0  # release() calls with nothing in flight (ignored)

    @property
    def limit(self) -> int:
        """The current limit (requests), ``min_limit..max_limit`` (the controller's value is kept clamped)."""
        return int(self._limit)

    @property
    def in_flight(self) -> int:
        """Requests acquired and not yet released."""
        return self._in_flight

    def try_acquire(self) -> bool:
        """True, counting one more request in flight, when fewer than ``limit`` are in flight; else False."""
        if self._in_flight >= self.limit:
            return False
        self._in_flight += 1
        self._acquired()
        return True

    def release(self) -> None:
        """One request ended (whatever its outcome). More releases than acquires are counted, never below 0."""
        if self._in_flight == 0:
            self.unmatched_releases += 1
            return
        self._in_flight -= 1

    def _acquired(self) -> None:
        """Hook: a request was just admitted (``in_flight`` already counts it)."""

    def _clamp(self, value: float) -> float:
        return min(float(self.max_limit), max(float(self.min_limit), value))


class _Signal:
    """One cost signal: this window's samples, its baseline and its last window median (seconds)."""

    __slots__ = ("baseline_s", "baseline_set_s", "best_s", "last_ratio", "last_sample_s", "name", "samples")

    def __init__(self, name: str) -> None:
        self.name = name
        self.samples: list[float] = []
        self.baseline_s: float | None = None
        self.baseline_set_s: float | None = None   # clock time the baseline was last set (seconds)
        self.best_s: float | None = None           # the lowest window median ever seen
        self.last_sample_s: float | None = None
        self.last_ratio: float | None = None

    def lower(self, sample: float, tolerance: float, now: float) -> None:
        """A window median ``sample`` (seconds): below the baseline it lowers it at once; to the best ever
        seen when ``sample`` is within ``tolerance`` of that best or more than ``tolerance`` times below the
        baseline (the backend recovered from a slow spell: a sample taken under our load would otherwise
        become its baseline; if the best is out of reach now, a re-measure lifts it again)."""
        best = self.best_s = sample if self.best_s is None else min(self.best_s, sample)
        if self.baseline_s is None or sample < self.baseline_s:
            recovered = sample <= tolerance * best or (self.baseline_s is not None
                                                        and sample * tolerance < self.baseline_s)
            self.baseline_s = best if recovered else sample
            self.baseline_set_s = now


class AdaptiveLimit(_Slots):
    """The concurrency limit of one backend, following latency per unit of work (thread-unsafe: one event loop).

    Each finished request gives up to two samples (:data:`PREFILL`, seconds per prompt token, and
    :data:`DECODE`, seconds; see the module docstring). Every ``window`` requests that gave a sample, the
    limit is updated once:

    1. each signal with at least ``max(1, window // 4)`` samples in this window takes their **median** as
       its sample (a signal with fewer gives no verdict this window);
    2. its **baseline** is the lowest window median seen (the first window sets it; a lower median lowers
       it at once: the backend is at least that fast; a median back within ``tolerance`` of the best ever
       seen, or more than ``tolerance`` times below the baseline, restores that best, so a backend that
       recovers from a slow spell gets its old baseline back rather than one measured under our load);
       its ratio is ``sample / baseline`` (both floored at :data:`RESOLUTION_S`);
    3. the **gradient** is the largest ratio. At or below ``tolerance`` the limit grows by ``sqrt(limit)``
       (headroom) while the gradient is in the lower half of ``1..tolerance``, by 1 in the upper half (less
       overshoot near the edge), and only when the window's peak in flight reached half the limit (an idle
       backend proves nothing about more load). Until the first window over ``tolerance`` (**slow start**) it
       doubles instead: a fresh backend's baseline is measured at ``initial``, then the limit finds the knee in
       a few windows rather than holding a queue while it adds a square root per window (measured with
       ``initial`` 2 on ``llmslo serve --speed 5`` at 20 req/s, the median TTFT by second of arrival was back
       to 22 ms from 6 s after the start, against 8 s adding square roots). The first window over ``tolerance``
       halves it (the window before was within tolerance at that half or less), then the cut below applies.
       Above it the limit moves ``smoothing`` of the way toward
       ``limit * tolerance / gradient`` (a multiplicative cut, smoothed because a finished request reports
       the load of its whole lifetime, not of now), never below ``min_limit``.

    **Re-measuring a baseline.** A baseline only rises on evidence that the backend itself became slower,
    not that our load made it slow. While the gradient is over tolerance, costs are measured at falling
    levels of load: once a cut has brought the requests in flight down to the limit, the samples of
    requests that *started* after that moment (start = now - TTFT - the sum of its gaps) are collected
    apart (they saw only that load; the window's own samples lag by a request's lifetime) until there are
    ``max(1, window // 4)``: their gradient, with the most requests in flight meanwhile, is one level. The
    next level is measured once the limit, and in flight, are down to :data:`REBASE_CUT` of that most (or
    ``min_limit``). When a level's gradient is still above ``tolerance`` and within a factor :data:`PLATEAU`
    of the level before, the cost did not respond to the cut: each signal over tolerance takes that level's
    median as its baseline, and the limit grows again from there. When it fell (the cut helped) or rose (the
    backend is still changing), that level becomes the one the next is compared with, and cutting goes on. So a
    backend 3x slower per token at any load gets a new baseline (and, its knee where it was, its limit
    back), while a backend that lost capacity (slow at the load it had, fast at a lower one) keeps its
    baseline and a lower limit.

    **Tokens in flight.** :meth:`try_acquire` may take a request's weight in tokens; the token limit (None until
    a window within tolerance carried tokens) then bounds their sum as well (see the module docstring). A
    caller that gives no tokens gets a limit in requests alone.

    Requests without a first token give no prefill sample; requests without gaps no decode sample. A
    backend that answers nothing gives no samples at all: a circuit breaker, not this limit, handles it.

    Parameters: ``initial``, ``min_limit``, ``max_limit`` (requests); ``tolerance`` (> 1: how many times
    its baseline a cost may be before the limit shrinks); ``window`` (requests per update); ``smoothing``
    (0 < s <= 1: the fraction of a cut taken per window); ``clock`` (monotonic seconds: request starts,
    the admin view). Raises :class:`ConfigurationError` naming the field for a bad value.

    Example::

        limit = AdaptiveLimit(initial=8, max_limit=128)
        weight = prompt_tokens + max_tokens
        if not limit.try_acquire(weight):
            return refuse(503)
        try:
            reply = await send(backend, request)
        finally:
            limit.release(weight)
        limit.observe(ttft_s=reply.ttft_s, prompt_tokens=reply.prompt_tokens, gaps_s=reply.gaps_s)
    """

    def __init__(self, *, initial: int = 8, min_limit: int = 1, max_limit: int = 256,
                 tolerance: float = 1.5, window: int = 20, smoothing: float = 0.2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        owner = "AdaptiveLimit"
        start, low, high = _limits(owner, initial, min_limit, max_limit)
        self.tolerance = _number_field(owner, "tolerance", tolerance, 1.0, math.inf, "a finite number > 1")
        self.window = _int_field(owner, "window", window, 1)
        self.smoothing = _number_field(owner, "smoothing", smoothing, 0.0, 1.0, "a fraction in (0, 1]")
        self._clock = _clock_field(owner, clock)
        super().__init__(low, high, start)
        self._signals = {name: _Signal(name) for name in SIGNALS}
        self._window_requests = 0     # requests that gave a sample in this window
        self._peak_in_flight = 0      # the most in flight during this window
        self._overloaded = False      # the gradient went over tolerance and has not come back yet
        self.slow_start = True        # no window over tolerance yet: the limit doubles (see the class docstring)
        self._ref: tuple[int, float] | None = None  # overload: (peak in flight, gradient) of the last level
        self._cut_at: float | None = None      # overload: when in flight came down to the cut (clock seconds)
        self._level_peak = 0                   # overload: the most in flight since then
        self._after_cut: dict[str, list[float]] = {name: [] for name in SIGNALS}
        self.gradient: float | None = None    # the last window's gradient (None before any verdict)
        self.updates = 0              # windows that produced a verdict
        self.rebases = 0              # baselines re-measured upward
        self.ignored_values = 0       # bad figures dropped by observe()
        self.last_update_s: float | None = None
        self._tokens = 0              # tokens in flight: the weights acquired and not yet released
        self._peak_tokens = 0         # the most tokens in flight during this window
        self._token_limit: float | None = None  # None: no window within tolerance carried tokens yet
        self._engine_reads = 0        # this window's requests that came with the engine's queue ...
        self._engine_waits = 0        # ... and of them, those that found requests waiting in it
        self.engine_full_windows = 0  # windows within tolerance that did not grow for that reason
        self.over_limit = 0           # requests counted by acquire_over (sent without room)

    @property
    def token_limit(self) -> int | None:
        """The most tokens in flight at once (see the module docstring), None while it has no value."""
        return None if self._token_limit is None else int(self._token_limit)

    @property
    def tokens_in_flight(self) -> int:
        """The tokens of the requests acquired and not yet released (their weights)."""
        return self._tokens

    def has_room(self, tokens: int = 0) -> bool:
        """Whether :meth:`try_acquire` would take a request of ``tokens`` tokens now: fewer than ``limit``
        requests in flight and, once the token limit has a value, its tokens fit under it (a request alone, with
        no tokens in flight, always fits: the heaviest request is never held back for good)."""
        if self._in_flight >= self.limit:
            return False
        cap = self._token_limit
        return cap is None or self._tokens == 0 or self._tokens + tokens <= cap

    def try_acquire(self, tokens: int = 0) -> bool:
        """True, counting one more request and its ``tokens`` (its weight, >= 0) in flight, when
        :meth:`has_room` for it; else False."""
        if not self.has_room(tokens):
            return False
        self._count(tokens)
        return True

    def acquire_over(self, tokens: int = 0) -> None:
        """Count a request sent although :meth:`has_room` said no (a gateway whose queue admits more than its
        backends' limits, ``--concurrency``, or whose backends each lack room for a request's tokens, sends it to
        the least loaded): in flight and in tokens as :meth:`try_acquire` counts, so the windows see what the
        backend really ran; :meth:`release` it the same way. Counted in ``over_limit``."""
        self.over_limit += 1
        self._count(tokens)

    def _count(self, tokens: int) -> None:
        if tokens > 0:
            self._tokens += tokens
            if self._tokens > self._peak_tokens:
                self._peak_tokens = self._tokens
        self._in_flight += 1
        self._acquired()

    def _acquired(self) -> None:
        if self._in_flight > self._peak_in_flight:
            self._peak_in_flight = self._in_flight
        if self._cut_at is not None and self._in_flight > self._level_peak:
            self._level_peak = self._in_flight

    def release(self, tokens: int = 0) -> None:
        """One request ended (whatever its outcome), with the ``tokens`` it was acquired with. More releases than
        acquires are counted, never below 0."""
        if self._in_flight:
            self._tokens = max(0, self._tokens - max(0, tokens))
        super().release()
        self._note_cut()

    # ---- samples ---------------------------------------------------------------------------------------

    def observe(self, *, ttft_s: float | None, prompt_tokens: int, gaps_s: Sequence[float],
                engine_waiting: float | None = None) -> None:
        """One finished request's figures: ``ttft_s`` (seconds from its write to the backend to its first content
        chunk; None when no first token came),
        ``prompt_tokens`` (its prompt length), ``gaps_s`` (its inter-chunk gaps, seconds); ``engine_waiting``:
        the requests waiting in the engine's own queue as last read from its metrics (None: not read). A window in
        which most of the requests that came with it found requests waiting raises neither limit (the engine is
        full, whatever the latency says; see the module docstring).

        Bad values (negative, NaN, inf, above :data:`MAX_S`, not a number) are dropped and counted in
        ``ignored_values``; this never raises. May update the limit (once every ``window`` requests that
        gave a sample)."""
        if isinstance(engine_waiting, (int, float)) and not isinstance(engine_waiting, bool) \
                and 0 <= engine_waiting < math.inf:
            self._engine_reads += 1
            self._engine_waits += engine_waiting > 0
        samples: dict[str, float] = {}
        lifetime_s = 0.0
        if ttft_s is not None:
            prefill = self._prefill_cost(ttft_s, prompt_tokens)
            if prefill is None:
                self.ignored_values += 1
            else:
                samples[PREFILL] = prefill
                lifetime_s = float(ttft_s)
        good, total_s = self._good_gaps(gaps_s)
        if good:
            lifetime_s += total_s
            samples[DECODE] = _nearest_rank(good, 0.5)
        if not samples:
            return
        after_cut = self._cut_at is not None and self._clock() - lifetime_s >= self._cut_at
        for name, value in samples.items():
            self._signals[name].samples.append(value)
            if after_cut:
                self._after_cut[name].append(value)
        self._window_requests += 1
        if self._window_requests >= self.window:
            self._update()

    @staticmethod
    def _prefill_cost(ttft_s: object, prompt_tokens: object) -> float | None:
        """Seconds per prompt token, or None when either figure is bad."""
        ttft = _cost(ttft_s)
        if ttft is None or isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 0:
            return None
        return ttft / max(prompt_tokens, 1)

    def _good_gaps(self, gaps_s: object) -> tuple[list[float], float]:
        """The finite gaps >= 0 (seconds), sorted, and their sum; the others are counted in ``ignored_values`` and
        dropped. A list of floats all within range (what the gateway passes: one per chunk of a reply) is checked on
        its sorted copy by C-level passes, not value by value: the whole sample of a 200-chunk reply takes 7 us, not
        31."""
        if gaps_s is None:
            return [], 0.0
        if type(gaps_s) is list and gaps_s and set(map(type, gaps_s)) == {float}:
            ordered = sorted(gaps_s)
            total = sum(ordered)  # NaN when one is NaN, and then the order says nothing
            if total == total and ordered[0] >= 0.0 and ordered[-1] <= MAX_S:
                return ordered, total
        try:
            raw = list(gaps_s)  # type: ignore[call-overload]
        except TypeError:
            self.ignored_values += 1
            return [], 0.0
        good = sorted(g for g in (_cost(v) for v in raw) if g is not None)
        self.ignored_values += len(raw) - len(good)
        return good, math.fsum(good)

    # ---- the update ------------------------------------------------------------------------------------

    def _update(self) -> None:
        """One window's verdict: window medians, baselines, the gradient, then the limit."""
        now = self._clock()
        need = max(1, self.window // 4)
        ratios: dict[str, float] = {}
        for sig in self._signals.values():
            if len(sig.samples) >= need:
                sample = max(RESOLUTION_S, statistics.median(sig.samples))
                sig.last_sample_s = sample
                sig.lower(sample, self.tolerance, now)
                assert sig.baseline_s is not None
                sig.last_ratio = ratios[sig.name] = sample / sig.baseline_s
            sig.samples.clear()
        peak, peak_tokens = self._peak_in_flight, self._peak_tokens
        full = 2 * self._engine_waits > self._engine_reads    # the engine's queue held requests most of the window
        self._engine_reads = self._engine_waits = 0
        self._window_requests = 0
        self._peak_in_flight = self._in_flight
        self._peak_tokens = self._tokens
        if not ratios:
            return
        self.updates += 1
        self.last_update_s = now
        gradient = self.gradient = max(ratios.values())
        self._update_tokens(gradient, peak_tokens, raise_ok=not full)
        if gradient <= self.tolerance:
            self._end_overload()
            if full:
                self.engine_full_windows += 1
            elif peak * 2 >= self.limit:
                near = gradient > (1.0 + self.tolerance) / 2.0
                step = self._limit if self.slow_start else 1.0 if near else math.sqrt(self._limit)
                self._limit = self._clamp(self._limit + step)
            return
        if self.slow_start:     # the window before was within tolerance at half this limit (or less)
            self.slow_start = False
            self._limit = self._clamp(self._limit / 2.0)
        self._overloaded = True
        if self._judge_cut(now):
            return
        target = self._limit * self.tolerance / gradient
        self._limit = self._clamp(self._limit + self.smoothing * (target - self._limit))
        self._note_cut()

    def _update_tokens(self, gradient: float, peak_tokens: int, *, raise_ok: bool) -> None:
        """The token limit's move for a window with ``gradient`` and at most ``peak_tokens`` in flight. Within
        tolerance (and only if ``raise_ok``: the engine's queue was not full) it rises: during the slow start to
        :data:`TOKEN_HEADROOM` times that peak, after it by :data:`TOKEN_STEP` when the peak reached
        :data:`TOKEN_BINDING` of it. Over tolerance, when the peak reached :data:`TOKEN_BINDING` of the limit,
        it is cut as the request limit is (``smoothing`` of the way toward ``limit * tolerance / gradient``)."""
        cap = self._token_limit
        if gradient <= self.tolerance:
            if peak_tokens <= 0 or not raise_ok:
                return
            if cap is None or self.slow_start:
                self._token_limit = max(cap or 0.0, TOKEN_HEADROOM * peak_tokens)
            elif peak_tokens >= TOKEN_BINDING * cap:
                self._token_limit = cap * (1.0 + TOKEN_STEP)
        elif cap is not None and peak_tokens >= TOKEN_BINDING * cap:
            self._token_limit = max(1.0, cap + self.smoothing * (cap * self.tolerance / gradient - cap))

    def _note_cut(self) -> None:
        """In an overload, stamp the moment the requests in flight came down to the next level measured: the
        limit after the first cut, then a limit of :data:`REBASE_CUT` of the most in flight while the last
        level was measured (or ``min_limit``)."""
        if not self._overloaded or self._cut_at is not None:
            return
        level = math.inf if self._ref is None else REBASE_CUT * self._ref[0]
        cut = self.limit <= self.min_limit or self._limit <= level
        if cut and self._in_flight <= self.limit:
            self._cut_at, self._level_peak = self._clock(), self._in_flight

    def _judge_cut(self, now: float) -> bool:
        """With enough samples from requests that started after the cut: re-measure (True) when their
        costs did not respond to it (against the level measured before), else make this level the
        reference for the next cut (False)."""
        if self._cut_at is None:
            return False
        need = max(1, self.window // 4)
        later: dict[str, float] = {}
        for name, values in self._after_cut.items():
            baseline = self._signals[name].baseline_s
            if len(values) >= need and baseline is not None:
                later[name] = max(RESOLUTION_S, statistics.median(values))
        if not later:
            return False
        ratios = {name: value / (self._signals[name].baseline_s or RESOLUTION_S) for name, value in later.items()}
        gradient = max(ratios.values())
        steady = self._ref is not None and PLATEAU * self._ref[1] <= gradient <= self._ref[1] / PLATEAU
        if steady and gradient > self.tolerance:
            for name, ratio in ratios.items():
                if ratio > self.tolerance:
                    sig = self._signals[name]
                    sig.baseline_s, sig.baseline_set_s, sig.last_ratio = later[name], now, 1.0
            self.rebases += 1
            self._end_overload()
            return True
        self._ref = (self._level_peak, gradient)
        self._cut_at = None
        for values in self._after_cut.values():
            values.clear()
        return False

    def _end_overload(self) -> None:
        self._overloaded = False
        self._ref = None
        self._cut_at = None
        for values in self._after_cut.values():
            values.clear()

    # ---- reading ---------------------------------------------------------------------------------------

    @property
    def baselines(self) -> dict[str, float | None]:
        """Each signal's baseline (seconds per prompt token, seconds), None before its first window."""
        return {name: sig.baseline_s for name, sig in self._signals.items()}

    def to_dict(self) -> dict[str, object]:
        """JSON-ready state for the admin API: limit, in flight, and per signal (keyed by :data:`PREFILL` and
        :data:`DECODE`) its baseline, best, when the baseline was set (clock seconds), last window median
        and its ratio to the baseline; None where there is none yet."""
        return {
            "controller": "per_unit_of_work",
            "limit": self.limit,
            "in_flight": self._in_flight,
            "token_limit": self.token_limit,
            "tokens_in_flight": self._tokens,
            "min_limit": self.min_limit,
            "max_limit": self.max_limit,
            "tolerance": self.tolerance,
            "window": self.window,
            "gradient": self.gradient,
            "overloaded": self._overloaded,
            "slow_start": self.slow_start,
            "baselines": self.baselines,
            "best": {name: sig.best_s for name, sig in self._signals.items()},
            "baseline_set_s": {name: sig.baseline_set_s for name, sig in self._signals.items()},
            "last_sample": {name: sig.last_sample_s for name, sig in self._signals.items()},
            "last_ratio": {name: sig.last_ratio for name, sig in self._signals.items()},
            "updates": self.updates,
            "rebases": self.rebases,
            "engine_full_windows": self.engine_full_windows,
            "over_limit": self.over_limit,
            "ignored_values": self.ignored_values,
            "unmatched_releases": self.unmatched_releases,
            "last_update_s": self.last_update_s,
        }


class OutputEstimate:
    """The tokens a request will generate, for its weight in tokens in flight (thread-unsafe: one event loop).

    A request's ``max_tokens`` is only a bound: many clients send 4,096 and get 200, and an engine takes KV cache
    for the tokens it generates, not for the ones allowed. So once ``min_samples`` complete replies were seen, a
    request is expected to generate ``min(max_tokens, q)``, where ``q`` is the ``quantile`` (nearest rank) of the
    completion tokens of the last ``window`` complete replies (recomputed every :data:`ESTIMATE_EVERY` replies);
    before that, ``max_tokens``. Counts that are not whole numbers >= 0 are ignored.
    """

    def __init__(self, *, window: int = 512, quantile: float = 0.9, min_samples: int = 20) -> None:
        self.window = _int_field("OutputEstimate", "window", window, 1)
        self.quantile = _number_field("OutputEstimate", "quantile", quantile, 0.0, 1.0, "a fraction in (0, 1]")
        self.min_samples = _int_field("OutputEstimate", "min_samples", min_samples, 1)
        self._recent: deque[int] = deque(maxlen=self.window)
        self._since = 0
        self._sorted: list[int] = []   # the recent replies' counts, sorted when the estimate was last computed
        self.estimate: int | None = None
        """The quantile of the recent replies' completion tokens; None before ``min_samples`` replies."""

    def observe(self, completion_tokens: int) -> None:
        """One complete reply's completion tokens."""
        if isinstance(completion_tokens, bool) or not isinstance(completion_tokens, int) or completion_tokens < 0:
            return
        self._recent.append(completion_tokens)
        self._since += 1
        if len(self._recent) >= self.min_samples and (self.estimate is None or self._since >= ESTIMATE_EVERY):
            self._since = 0
            self._sorted = sorted(self._recent)
            self.estimate = int(_nearest_rank(self._sorted, self.quantile))

    def expected(self, max_tokens: int, quantile: float | None = None) -> int:
        """The tokens a request allowed ``max_tokens`` is expected to generate: at most ``max_tokens``, the
        estimate's quantile or ``quantile`` (0 < q <= 1) of the recent replies once there is an estimate."""
        if self.estimate is None:
            return max_tokens
        q = self.estimate if quantile is None else int(_nearest_rank(self._sorted, quantile))
        return min(max_tokens, q)


class WholeRttGradientLimit(_Slots):
    """Envoy-style gradient limit on whole-request time (for comparison only; same acquire/release/limit API).

    A model of the documented gradient controller of Envoy's adaptive concurrency filter, on whole-request
    round-trip time (seconds):

    - **minRTT**: measured with the limit pinned to ``min_limit`` until ``min_rtt_requests`` requests that
      started after the measurement began have finished; their ``percentile`` is minRTT. Re-measured every
      ``min_rtt_interval_s`` seconds, and after 5 consecutive updates that left the limit at ``min_limit``;
      the limit from before the measurement is restored after it. The first measurement begins at
      construction. With ``pin_min_rtt=False`` (Envoy's ``min_concurrency_limit`` set apart) the limit is
      not pinned: minRTT comes from live traffic, and the limit holds still while it is measured.
    - **sampleRTT**: the ``percentile`` of the round-trip times finished in an update interval of
      ``update_interval_s`` seconds (an interval without one changes nothing).
    - ``gradient = (minRTT * (1 + buffer)) / sampleRTT`` clamped to ``[0.5, 2]``;
      ``limit = gradient * limit + sqrt(limit)`` (the headroom), clamped to ``min_limit..max_limit``.

    Defaults are Envoy's (min concurrency 3, buffer 25 %, p50, 100 ms, 60 s, 50 requests) except the limit
    bounds, which match :class:`AdaptiveLimit`. Raises :class:`ConfigurationError` naming the field.
    """

    def __init__(self, *, initial: int = 8, min_limit: int = 3, max_limit: int = 256, buffer: float = 0.25,
                 percentile: float = 0.5, update_interval_s: float = 0.1, min_rtt_interval_s: float = 60.0,
                 min_rtt_requests: int = 50, pin_min_rtt: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        owner = "WholeRttGradientLimit"
        start, low, high = _limits(owner, initial, min_limit, max_limit)
        self.buffer = _number_field(owner, "buffer", buffer, -1.0, math.inf, "a finite fraction > -1")
        self.percentile = _number_field(owner, "percentile", percentile, 0.0, 1.0, "a fraction in (0, 1]")
        self.update_interval_s = _number_field(owner, "update_interval_s", update_interval_s, 0.0, math.inf,
                                               "a finite number of seconds > 0")
        self.min_rtt_interval_s = _number_field(owner, "min_rtt_interval_s", min_rtt_interval_s, 0.0, math.inf,
                                                "a finite number of seconds > 0")
        self.min_rtt_requests = _int_field(owner, "min_rtt_requests", min_rtt_requests, 1)
        if not isinstance(pin_min_rtt, bool):
            raise ConfigurationError(f"{owner}.pin_min_rtt: must be true or false, got {pin_min_rtt!r}")
        self.pin_min_rtt = pin_min_rtt
        self._clock = _clock_field(owner, clock)
        super().__init__(low, high, start)
        now = self._clock()
        self.min_rtt_s: float | None = None
        self.sample_rtt_s: float | None = None
        self.gradient: float | None = None
        self.ignored_values = 0
        self.measurements = 0             # minRTT measurements completed
        self._samples: list[float] = []
        self._interval_start = now
        self._at_min_updates = 0
        self._next_measure_s = math.inf
        self._measuring_since: float | None = None
        self._restore_limit = float(start)
        self._start_measuring(now)

    @property
    def measuring(self) -> bool:
        """True while minRTT is being measured (the limit pinned to ``min_limit`` unless ``pin_min_rtt`` is
        false)."""
        return self._measuring_since is not None

    def try_acquire(self) -> bool:
        """As :meth:`AdaptiveLimit.try_acquire`; a due minRTT measurement starts first."""
        self._maybe_measure(self._clock())
        return super().try_acquire()

    def observe_rtt(self, rtt_s: float) -> None:
        """One finished request's whole round-trip time (seconds). Bad values are counted and dropped."""
        rtt = _cost(rtt_s)
        if rtt is None:
            self.ignored_values += 1
            return
        now = self._clock()
        if self._measuring_since is not None:
            if rtt <= now - self._measuring_since:   # started after the measurement began
                self._samples.append(rtt)
                if len(self._samples) >= self.min_rtt_requests:
                    self._finish_measuring(now)
            return
        self._samples.append(rtt)
        if now - self._interval_start >= self.update_interval_s:
            self._update(now)
        self._maybe_measure(now)

    def _update(self, now: float) -> None:
        assert self.min_rtt_s is not None
        self._samples.sort()
        sample = self.sample_rtt_s = max(RESOLUTION_S, _nearest_rank(self._samples, self.percentile))
        self._samples.clear()
        self._interval_start = now
        gradient = self.gradient = min(2.0, max(0.5, self.min_rtt_s * (1.0 + self.buffer) / sample))
        self._limit = self._clamp(gradient * self._limit + math.sqrt(self._limit))
        self._at_min_updates = self._at_min_updates + 1 if self.limit <= self.min_limit else 0

    def _maybe_measure(self, now: float) -> None:
        if self._measuring_since is None and (now >= self._next_measure_s or self._at_min_updates >= 5):
            self._start_measuring(now)

    def _start_measuring(self, now: float) -> None:
        self._restore_limit = self._limit
        if self.pin_min_rtt:
            self._limit = float(self.min_limit)
        self._measuring_since = now
        self._samples.clear()
        self._at_min_updates = 0

    def _finish_measuring(self, now: float) -> None:
        self._samples.sort()
        self.min_rtt_s = max(RESOLUTION_S, _nearest_rank(self._samples, self.percentile))
        self._samples.clear()
        self._measuring_since = None
        self._limit = self._restore_limit
        self._interval_start = now
        self._next_measure_s = now + self.min_rtt_interval_s
        self.measurements += 1

    def to_dict(self) -> dict[str, object]:
        """JSON-ready state: limit, in flight, minRTT, the last sampleRTT and gradient (seconds)."""
        return {
            "controller": "whole_rtt_gradient",
            "limit": self.limit,
            "in_flight": self._in_flight,
            "min_limit": self.min_limit,
            "max_limit": self.max_limit,
            "measuring_min_rtt": self.measuring,
            "min_rtt_s": self.min_rtt_s,
            "sample_rtt_s": self.sample_rtt_s,
            "gradient": self.gradient,
            "measurements": self.measurements,
            "ignored_values": self.ignored_values,
            "unmatched_releases": self.unmatched_releases,
        }
