"""Rate limits: token buckets per key, by requests and by token cost.

A :class:`TokenBucket` holds up to ``capacity`` units and refills at ``rate_per_s`` units per second; a take
of ``cost`` units succeeds when the bucket holds them, else it says how long until it will (seconds). Over
any interval ``[0, t]`` a bucket that starts full admits at most ``rate_per_s × t + capacity`` units.

A :class:`RateLimiter` keeps buckets per key (tenant class, API key): one for requests (cost 1 each) and
one for tokens (cost = prompt tokens + requested ``max_tokens`` up front, reconciled with the actual count
when the request ends). The key set is bounded: at most ``max_keys`` keys own a bucket, every other key
(and any key that is not text or is longer than ``max_key_chars``) shares one overflow bucket with the same
limits, so no client can grow the table or multiply its rate by inventing keys. A key's entry is dropped
only when its buckets are full again (idle long enough to refill), which changes no later decision.

The buckets live in-process by default; a :class:`llmslo.controls.RedisBuckets` store shares them between
replicas.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from llmslo.controls._decision import ADMIT, MONOTONIC, Clock, Decision, Rejectable
from llmslo.telemetry import ConfigurationError

OVERFLOW_SLOT = "overflow"
"""The slot shared by every key without a bucket of its own (own keys' slots are ``"k:" + key``)."""

DIMENSIONS = ("requests", "tokens")
"""The names of a limiter's buckets, in the order a store receives them."""


class BucketTake(NamedTuple):
    """The answer of :meth:`TokenBucket.take`.

    ``allowed``; ``wait_s``: seconds until the bucket holds the cost (0.0 when allowed, None when it never
    will: the cost exceeds the capacity or is not a number >= 0); ``detail``: why it was refused ("" when
    allowed).
    """

    allowed: bool
    wait_s: float | None
    detail: str = ""


_TAKEN = BucketTake(True, 0.0)
"""The one answer of an allowed take (immutable, so shared)."""


def _positive(value: object, field: str, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{field}: must be a finite number > 0 {unit}, got {value!r}")
    return float(value)


_HUGE = 10**300


def _count(value: object) -> float | None:
    """``value`` as a cost (a number >= 0; infinite only for a huge integer), or None when it is not one."""
    if isinstance(value, float):  # NaN fails the comparison
        return value if 0.0 <= value < math.inf else None
    if isinstance(value, int) and not isinstance(value, bool):  # an exact count: beyond floats, infinite
        return None if value < 0 else (float(value) if value <= _HUGE else math.inf)
    return None


class TokenBucket:
    """A token bucket: ``capacity`` units (the burst), refilled at ``rate_per_s`` units per second.

    It starts full. ``clock`` gives monotonic seconds; a clock that steps back refills nothing. Thread-safe.

    Example::

        bucket = TokenBucket(rate_per_s=10.0, capacity=20.0)
        allowed, wait_s, detail = bucket.take(5)

    Raises :class:`ConfigurationError` naming the field when ``rate_per_s`` or ``capacity`` is not a finite
    number > 0.
    """

    def __init__(self, rate_per_s: float, capacity: float, clock: Clock = MONOTONIC) -> None:
        self.rate_per_s = _positive(rate_per_s, "TokenBucket.rate_per_s", "units per second")
        self.capacity = _positive(capacity, "TokenBucket.capacity", "units")
        self._clock = clock
        self._tokens = self.capacity
        self._last = clock()
        self._lock = threading.Lock()

    @property
    def tokens(self) -> float:
        """Units the bucket holds now (negative while it pays back a reconciled overrun)."""
        with self._lock:
            self._refill(self._clock())
            return self._tokens

    def take(self, cost: float = 1.0) -> BucketTake:
        """Take ``cost`` units now if the bucket holds them; else say how long until it will.

        A cost above the capacity (or not a number >= 0) is refused with ``wait_s`` None and a detail that
        says so: waiting would never help.
        """
        amount = _count(cost)
        if amount is None:
            return BucketTake(False, None, f"cost must be a finite number >= 0, got {cost!r}")
        if amount > self.capacity:
            return BucketTake(False, None, f"cost {amount:g} exceeds the bucket's capacity {self.capacity:g}: "
                                           "it can never be admitted")
        with self._lock:  # the refill and the shortfall inlined: this runs once per request
            now = self._clock()
            if now > self._last:
                self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate_per_s)
                self._last = now
            if self._tokens >= amount:
                self._tokens -= amount
                return _TAKEN
            wait_s = (amount - self._tokens) / self.rate_per_s
        return BucketTake(False, wait_s, f"the bucket holds less than the cost {amount:g}")

    def give_back(self, amount: float) -> float:
        """Return ``amount`` units (negative: charge them), bounded to ``[-capacity, capacity]`` held.

        Returns the units actually applied. A non-finite amount changes nothing and returns 0.0.
        """
        if isinstance(amount, bool) or not isinstance(amount, int | float) or not math.isfinite(amount):
            return 0.0
        with self._lock:
            self._refill(self._clock())
            return self._adjust(float(amount))

    # ---- with the lock held ----------------------------------------------------------------------------

    def _refill(self, now: float) -> None:
        if now > self._last:
            self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate_per_s)
            self._last = now

    def _adjust(self, amount: float) -> float:
        before = self._tokens
        self._tokens = max(-self.capacity, min(self.capacity, before + amount))
        return self._tokens - before


@dataclass(frozen=True, slots=True)
class RateLimit:
    """One bucket's limit: ``rate_per_s`` units per second sustained, bursts up to ``capacity`` units.

    Example: 100,000 tokens per minute per client is ``RateLimit.per_minute(100_000)`` (rate 1666.7/s,
    capacity 100,000). Raises :class:`ConfigurationError` naming the field for a value that is not a finite
    number > 0.
    """

    rate_per_s: float
    capacity: float

    def __post_init__(self) -> None:
        _positive(self.rate_per_s, "RateLimit.rate_per_s", "units per second")
        _positive(self.capacity, "RateLimit.capacity", "units")

    @classmethod
    def per_minute(cls, amount: float, burst: float | None = None) -> RateLimit:
        """``amount`` units per minute, bursting up to ``burst`` units (``amount`` when None)."""
        _positive(amount, "RateLimit.per_minute.amount", "units per minute")
        return cls(amount / 60.0, amount if burst is None else burst)

    @classmethod
    def per_second(cls, amount: float, burst: float | None = None) -> RateLimit:
        """``amount`` units per second, bursting up to ``burst`` units (``amount`` when None)."""
        _positive(amount, "RateLimit.per_second.amount", "units per second")
        return cls(amount, amount if burst is None else burst)

    @property
    def refill_s(self) -> float:
        """Seconds to refill from the lowest level a bucket can hold (``-capacity``) to full."""
        return 2.0 * self.capacity / self.rate_per_s


class StoreAnswer(NamedTuple):
    """A store's answer to one decision: ``allowed``; ``wait_s`` (seconds until every bucket holds its
    cost; None when unknown); ``blocking``: the index of a bucket that refused (-1 when allowed);
    ``store_error``: the store could not be reached and its fail mode decided."""

    allowed: bool
    wait_s: float | None
    blocking: int = -1
    store_error: bool = False


_ALLOWED = StoreAnswer(True, 0.0)


class BucketStore(Protocol):
    """Where a limiter's buckets live: in-process (:class:`LocalBuckets`) or shared (``RedisBuckets``).

    A slot is a key's name (``"k:" + key``, or :data:`OVERFLOW_SLOT`); it holds one bucket per limit.
    """

    fail_mode: str
    """``open`` or ``closed``: what a decision is when the store cannot be reached (reported with errors)."""

    def take(self, slot: str, limits: Sequence[RateLimit], costs: Sequence[float]) -> StoreAnswer:
        """Take ``costs[i]`` from bucket ``i`` of ``slot``, all or none, atomically. Never raises."""
        ...

    def adjust(self, slot: str, limits: Sequence[RateLimit], index: int, amount: float) -> float | None:
        """Return ``amount`` units to bucket ``index`` (of ``limits``) of ``slot`` (negative: charge them),
        bounded to ``[-capacity, capacity]``; the units applied, or None when the store could not be
        reached. Never raises."""
        ...

    def forget(self, slot: str) -> None:
        """The limiter no longer tracks ``slot`` (its buckets are full again)."""
        ...


class LocalBuckets:
    """The in-process store: a bucket per limit per slot, behind one lock. ``clock``: monotonic seconds."""

    fail_mode = "open"  # never unreachable

    def __init__(self, clock: Clock = MONOTONIC) -> None:
        self._clock = clock
        self._slots: dict[str, list[TokenBucket]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._slots)

    def take(self, slot: str, limits: Sequence[RateLimit], costs: Sequence[float]) -> StoreAnswer:
        """Take ``costs[i]`` from bucket ``i`` of ``slot`` if every bucket holds its cost."""
        with self._lock:  # the refill and shortfall of TokenBucket, inlined: this runs on every decision
            buckets = self._slots.get(slot) or self._buckets(slot, limits)
            now = self._clock()
            wait_s, blocking = 0.0, -1
            for i, bucket in enumerate(buckets):
                tokens = bucket._tokens
                if now > bucket._last:
                    tokens += (now - bucket._last) * bucket.rate_per_s
                    bucket._tokens = tokens = tokens if tokens < bucket.capacity else bucket.capacity
                    bucket._last = now
                cost = costs[i]
                if tokens < cost and (cost - tokens) / bucket.rate_per_s > wait_s:
                    wait_s, blocking = (cost - tokens) / bucket.rate_per_s, i
            if blocking >= 0:
                return StoreAnswer(False, wait_s, blocking)
            for i, bucket in enumerate(buckets):
                bucket._tokens -= costs[i]
            return _ALLOWED

    def adjust(self, slot: str, limits: Sequence[RateLimit], index: int, amount: float) -> float | None:
        """Return ``amount`` units to bucket ``index`` of ``slot`` (see :class:`BucketStore`)."""
        with self._lock:
            bucket = self._buckets(slot, limits)[index]
            bucket._refill(self._clock())
            return bucket._adjust(amount)

    def forget(self, slot: str) -> None:
        """Drop ``slot``'s buckets (they are full: a new slot would start the same)."""
        with self._lock:
            self._slots.pop(slot, None)

    def _buckets(self, slot: str, limits: Sequence[RateLimit]) -> list[TokenBucket]:
        buckets = self._slots.get(slot)
        if buckets is None:
            buckets = self._slots[slot] = [TokenBucket(lim.rate_per_s, lim.capacity, self._clock) for lim in limits]
        return buckets


_ONE_REQUEST = (1.0,)


class RateLimitReporter(Protocol):
    """What a limiter reports through (a :class:`llmslo.telemetry.Telemetry`)."""

    def observe_retry_after(self, model: str, reject_reason: str, seconds: float) -> None: ...

    def count_rate_limit_store_error(self, fail_mode: str) -> None: ...


class RateLimiter:
    """Token buckets per key, by requests and by token cost, all taken or none in one decision.

    Parameters (keyword-only):

    - ``requests``: the per-key request limit (each request costs 1), or None.
    - ``tokens``: the per-key token limit (a request costs prompt tokens + requested ``max_tokens`` up
      front; :meth:`reconcile` settles the actual count), or None. At least one limit is required.
    - ``max_keys``: keys that own buckets (others share the overflow bucket); ``max_key_chars``: the longest
      key that may own one.
    - ``store``: where the buckets live (in-process :class:`LocalBuckets` when None; a ``RedisBuckets``
      shares them between replicas).
    - ``telemetry``: reports each refusal's ``Retry-After`` and each store error (None: report nothing).
    - ``clock``: monotonic seconds, for the in-process buckets and the key table.

    Example (100 requests and 100,000 tokens per minute per API key)::

        limiter = RateLimiter(requests=RateLimit.per_minute(100), tokens=RateLimit.per_minute(100_000),
                              telemetry=tel)
        decision = limiter.check(api_key, prompt_tokens=812, max_tokens=1024, tracker=t)
        if not decision.admitted:
            return respond(decision.http_status, decision.headers(), decision.body())
        ...  # serve; at the terminal state:
        limiter.reconcile(api_key, reserved=812 + 1024, actual=812 + t.generated_tokens)

    Raises :class:`ConfigurationError` naming the field for an invalid configuration. :meth:`check` and
    :meth:`reconcile` never raise for anything a client sends.
    """

    def __init__(self, *, requests: RateLimit | None = None, tokens: RateLimit | None = None,
                 max_keys: int = 10_000, max_key_chars: int = 256, store: BucketStore | None = None,
                 telemetry: RateLimitReporter | None = None, clock: Clock = MONOTONIC) -> None:
        for field, limit in (("requests", requests), ("tokens", tokens)):
            if limit is not None and not isinstance(limit, RateLimit):
                raise ConfigurationError(f"RateLimiter.{field}: must be a RateLimit or None, got {limit!r}")
        if requests is None and tokens is None:
            raise ConfigurationError("RateLimiter.requests: give a requests limit, a tokens limit or both")
        for field, value in (("max_keys", max_keys), ("max_key_chars", max_key_chars)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"RateLimiter.{field}: must be an integer >= 1, got {value!r}")
        if requests is not None and requests.capacity < 1:
            raise ConfigurationError(f"RateLimiter.requests: capacity must be >= 1 request (each costs 1), "
                                     f"got {requests.capacity:g}")
        self.requests = requests
        self.tokens = tokens
        self.limits: tuple[RateLimit, ...] = tuple(lim for lim in (requests, tokens) if lim is not None)
        self._token_index = len(self.limits) - 1 if tokens is not None else -1
        self._names = tuple(name for name, lim in zip(DIMENSIONS, (requests, tokens), strict=True)
                            if lim is not None)
        self.max_keys = max_keys
        self.max_key_chars = max_key_chars
        self.store: BucketStore = store if store is not None else LocalBuckets(clock)
        self.telemetry = telemetry
        self._clock = clock
        self._horizon_s = max(lim.refill_s for lim in self.limits)
        self._keys: OrderedDict[str, float] = OrderedDict()  # slot -> last use (seconds), least recent first
        self._lock = threading.Lock()

    # ---- decisions ------------------------------------------------------------------------------------

    def check(self, key: object, *, prompt_tokens: object = 0, max_tokens: object = 0,
              tracker: Rejectable | None = None, model: str | None = None) -> Decision:
        """Admit the request of ``key`` if its buckets hold the cost, taking it; else refuse ``rate_limited``.

        ``prompt_tokens`` + ``max_tokens`` is the token cost. A refusal rejects ``tracker`` (when given) and
        reports its ``retry_after_s`` for ``model`` (the tracker's model when None). ``retry_after_s`` is
        the time until every bucket holds its cost (seconds), None when the cost can never fit.
        """
        costs = self._costs(prompt_tokens, max_tokens)
        if isinstance(costs, Decision):
            return self._refused(costs, tracker, model)
        answer = self.store.take(self._slot(key), self.limits, costs)
        if answer.store_error:
            self._store_error()
        if answer.allowed:
            return ADMIT
        if answer.store_error:
            detail = "the rate-limit store is unavailable (failing closed)"
        else:
            limit = self.limits[answer.blocking]
            detail = (f"over the {self._names[answer.blocking]} limit ({limit.rate_per_s:g}/s, "
                      f"burst {limit.capacity:g})")
        return self._refused(Decision.refuse("rate_limited", answer.wait_s, detail), tracker, model)

    def reconcile(self, key: object, reserved: object, actual: object) -> float:
        """Settle a request's token cost at its terminal state: ``reserved`` tokens were taken up front,
        ``actual`` (prompt + generated) were used.

        Returns the tokens given back to the key's bucket: ``reserved - actual`` as applied (negative when
        the request used more than it reserved and the excess was charged; bounded so that a bucket holds
        at least ``-capacity``). 0.0 when there is no tokens limit, a count is not a finite number >= 0, or the
        store cannot be reached (not counted as a store error, which counts decisions; the next decisions
        then use the fail mode and are counted). Never raises.
        """
        if self._token_index < 0 or self.tokens is None:
            return 0.0
        reserved_n, actual_n = _count(reserved), _count(actual)
        if reserved_n is None or actual_n is None:
            return 0.0
        difference = reserved_n - actual_n
        if difference == 0 or not math.isfinite(difference):
            return 0.0
        applied = self.store.adjust(self._slot(key), self.limits, self._token_index, difference)
        return 0.0 if applied is None else applied

    def __len__(self) -> int:
        """Keys that own buckets now (at most ``max_keys``)."""
        return len(self._keys)

    # ---- helpers --------------------------------------------------------------------------------------

    def _costs(self, prompt_tokens: object, max_tokens: object) -> tuple[float, ...] | Decision:
        """The cost for each bucket (1 request; prompt + max tokens, whole), or the refusal of a cost that is
        not a number or can never fit."""
        tokens = self.tokens
        if tokens is None:
            return _ONE_REQUEST
        prompt, limit = _count(prompt_tokens), _count(max_tokens)
        if prompt is None or limit is None:
            field, value = ("prompt_tokens", prompt_tokens) if prompt is None else ("max_tokens", max_tokens)
            return Decision.refuse("rate_limited", None, f"{field} must be a number >= 0, got {value!r}")
        cost = prompt + limit
        if cost > tokens.capacity:
            return Decision.refuse("rate_limited", None, f"tokens cost {cost:g} exceeds the limit's capacity "
                                   f"{tokens.capacity:g}: it can never be admitted; ask for fewer tokens")
        cost = float(math.ceil(cost))
        return (1.0, cost) if self.requests is not None else (cost,)

    def _slot(self, key: object) -> str:
        """The slot of ``key``: its own (taking a free entry, or one whose buckets are full again), else the
        overflow slot."""
        if not isinstance(key, str) or not key or len(key) > self.max_key_chars:
            return OVERFLOW_SLOT
        slot = "k:" + key
        now = self._clock()
        with self._lock:  # the store never takes this lock, so forgetting under it cannot deadlock
            keys = self._keys
            if slot in keys:
                keys.move_to_end(slot)
            elif len(keys) >= self.max_keys:
                oldest, last = next(iter(keys.items()))
                if now - last < self._horizon_s:
                    return OVERFLOW_SLOT
                del keys[oldest]
                self.store.forget(oldest)
            keys[slot] = now
        return slot

    def _refused(self, decision: Decision, tracker: Rejectable | None, model: str | None) -> Decision:
        if tracker is not None:
            tracker.reject("rate_limited")
        if self.telemetry is not None and decision.retry_after_s is not None:
            name = model if model is not None else (tracker.model if tracker is not None else "unknown")
            self.telemetry.observe_retry_after(name, "rate_limited", decision.retry_after_s)
        return decision

    def _store_error(self) -> None:
        if self.telemetry is not None:
            self.telemetry.count_rate_limit_store_error(self.store.fail_mode)
