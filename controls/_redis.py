"""Token buckets shared between replicas through Redis: one atomic Lua script per decision.

Each bucket is a Redis hash ``{tokens, ts}`` (units held; the time of that level, seconds). One ``EVALSHA``
per decision refills every bucket of the slot, checks that each holds its cost and takes them all or none,
so two replicas never admit the same units. A bucket expires once it would be full again, which is the
state a missing bucket starts in, so the store keeps only the buckets of recently active keys.

The time is Redis's own (``TIME`` inside the script) unless a clock is given. Each replica's monotonic clock
counts from its own boot and wall clocks drift apart, so a bucket refilled by one replica's clock and spent
by another's would gain or lose units; the server's clock is the one clock every replica sees. A given
clock must be shared by every replica (wall time on synchronised hosts); tests inject one to drive time.

The Redis client is injected: any object with redis-py's ``eval``/``evalsha``/``script_load``. This module
never imports ``redis`` (only :func:`redis_client` does, when called). A call to Redis that fails (server
gone, timeout) is decided by ``fail_mode`` (``open`` admits, ``closed`` refuses) and counted, and the store
is not asked again for ``retry_after_s`` seconds, so a dead Redis costs one timeout per interval, not one
per request.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from llmslo.controls._decision import MONOTONIC, Clock
from llmslo.controls._ratelimit import RateLimit, StoreAnswer
from llmslo.telemetry import RATE_LIMIT_FAIL_MODES, ConfigurationError

_NOW = """
local now
if ARGV[1] == '' then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
else
  now = tonumber(ARGV[1])
end
local function load(key, rate, cap)
  local h = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens, ts = tonumber(h[1]), tonumber(h[2])
  if tokens == nil or ts == nil then return cap, now end
  if now > ts then return math.min(cap, tokens + (now - ts) * rate), now end
  return tokens, ts
end
local function store(key, tokens, ts, rate, cap)
  redis.call('HSET', key, 'tokens', string.format('%.17g', tokens), 'ts', string.format('%.17g', ts))
  local ms = math.min(1e12, math.ceil((cap - tokens) / rate * 1000) + 1000)
  redis.call('PEXPIRE', key, string.format('%d', ms))
end
"""

TAKE_SCRIPT = _NOW + """
-- KEYS: one hash per bucket. ARGV: now ('' = Redis TIME), then rate_per_s, capacity, cost per bucket.
local state = {}
local wait, blocking = 0, 0
for i = 1, #KEYS do
  local rate, cap, cost = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  local tokens, ts = load(KEYS[i], rate, cap)
  state[i] = {tokens, ts, rate, cap, cost}
  if tokens < cost and (cost - tokens) / rate > wait then
    wait, blocking = (cost - tokens) / rate, i
  end
end
if blocking > 0 then return {0, string.format('%.17g', wait), blocking} end
for i = 1, #KEYS do
  local s = state[i]
  store(KEYS[i], s[1] - s[5], s[2], s[3], s[4])
end
return {1, '0', 0}
"""
"""Refill each bucket, then take every cost or none; returns ``{allowed, wait_s, blocking (1-based)}``."""

ADJUST_SCRIPT = _NOW + """
-- KEYS[1]: the bucket. ARGV: now ('' = Redis TIME), rate_per_s, capacity, units to give back (< 0 charges).
local rate, cap, amount = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tokens, ts = load(KEYS[1], rate, cap)
local after = math.max(-cap, math.min(cap, tokens + amount))
store(KEYS[1], after, ts, rate, cap)
return string.format('%.17g', after - tokens)
"""
"""Give units back to (or charge) one bucket, bounded to ``[-capacity, capacity]``; returns those applied."""


class RedisScripting(Protocol):
    """The part of a redis-py client the store uses."""

    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any: ...

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any: ...

    def script_load(self, script: str) -> Any: ...


def redis_client(url: str = "redis://127.0.0.1:6379/0", *, timeout_s: float = 0.05) -> RedisScripting:
    """A redis-py client for :class:`RedisBuckets`: connect and read timeouts of ``timeout_s`` seconds and no
    retries, so one call waits at most about ``2 × timeout_s``. Needs the ``redis`` package (imported here
    only); raises :class:`ConfigurationError` naming the field when it is missing or ``timeout_s`` is bad.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s <= 10:
        raise ConfigurationError(f"redis_client.timeout_s: must be a number of seconds in (0, 10], got {timeout_s!r}")
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError as exc:
        raise ConfigurationError("redis_client: the redis package is missing; pip install 'redis>=5'") from exc
    client: RedisScripting = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                                  retry=Retry(NoBackoff(), 0), retry_on_timeout=False)
    return client


def client_wait_bound_s(client: object) -> float | None:
    """The longest one call of a redis-py ``client`` can wait (seconds, backoff sleeps aside): (retries + 1) ×
    (connect timeout + read timeout); ``math.inf`` when a timeout is unset; None for an object whose
    settings cannot be read (not a redis-py client)."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return None
    read, connect = kwargs.get("socket_timeout"), kwargs.get("socket_connect_timeout")
    retry = kwargs.get("retry")
    get_retries = getattr(retry, "get_retries", None)
    retries = get_retries() if callable(get_retries) else 0
    if not isinstance(retries, int) or retries < 0:
        return math.inf
    total = 0.0
    for value in (read, connect):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            return math.inf
        total += value
    return (retries + 1) * total


class RedisBuckets:
    """The shared store of a :class:`llmslo.controls.RateLimiter`: its buckets in Redis.

    Parameters:

    - ``client``: a redis-py client (or any object with ``eval``/``evalsha``/``script_load``), made with
      bounded timeouts, e.g. :func:`redis_client`.
    - ``fail_mode`` (keyword-only, required): ``open`` (admit while Redis is unreachable) or ``closed``
      (refuse ``rate_limited``).
    - ``prefix``: the Redis key prefix; a slot's buckets are ``{prefix}{<sha256 of the slot>}:<i>`` (the
      hash keeps keys short and API keys out of Redis; the braces keep a slot's buckets in one Redis Cluster
      hash slot).
    - ``retry_after_s``: after a failed call, seconds during which decisions use the fail mode without
      asking Redis (also the ``Retry-After`` of a fail-closed refusal).
    - ``max_call_s``: the longest a redis-py client's settings may let one call wait (seconds).
    - ``server_clock``: a clock every replica shares (seconds) instead of Redis ``TIME``; None (default)
      uses Redis ``TIME``.
    - ``clock``: monotonic seconds, for the ``retry_after_s`` interval.

    Raises :class:`ConfigurationError` naming the field for an invalid configuration, including a redis-py
    client whose timeouts are unset or let a call wait longer than ``max_call_s``.
    """

    def __init__(self, client: RedisScripting, *, fail_mode: str, prefix: str = "llmslo:rl:",
                 retry_after_s: float = 1.0, max_call_s: float = 0.5, server_clock: Clock | None = None,
                 clock: Clock = MONOTONIC) -> None:
        for method in ("eval", "evalsha", "script_load"):
            if not callable(getattr(client, method, None)):
                raise ConfigurationError(f"RedisBuckets.client: needs a callable {method}() (a redis-py client)")
        if fail_mode not in RATE_LIMIT_FAIL_MODES:
            raise ConfigurationError(f"RedisBuckets.fail_mode: must be one of {', '.join(RATE_LIMIT_FAIL_MODES)}, "
                                     f"got {fail_mode!r}")
        if not isinstance(prefix, str) or not prefix or len(prefix) > 64:
            raise ConfigurationError(f"RedisBuckets.prefix: must be text of 1 to 64 characters, got {prefix!r}")
        for field, value in (("retry_after_s", retry_after_s), ("max_call_s", max_call_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ConfigurationError(f"RedisBuckets.{field}: must be a finite number > 0 seconds, "
                                         f"got {value!r}")
        bound = client_wait_bound_s(client)
        if bound is not None and bound > max_call_s:
            raise ConfigurationError(
                f"RedisBuckets.client: one call may wait {bound:g} s (unset timeouts or retries), above "
                f"max_call_s={max_call_s:g}; use redis_client(url, timeout_s=0.05), or redis.Redis(..., "
                "socket_timeout=0.05, socket_connect_timeout=0.05, retry=Retry(NoBackoff(), 0))")
        self.client = client
        self.fail_mode = fail_mode
        self.prefix = prefix
        self.retry_after_s = float(retry_after_s)
        self.server_clock = server_clock
        self._clock = clock
        self._shas = {script: hashlib.sha1(script.encode()).hexdigest() for script in (TAKE_SCRIPT, ADJUST_SCRIPT)}
        self._down_until = -math.inf  # monotonic seconds before which Redis is not asked again
        self._lock = threading.Lock()

    def load_scripts(self) -> None:
        """Load both scripts into Redis now (optional: a missing script is sent with the first decision).
        Raises what the client raises, since this runs at start-up, not on a request."""
        for script, sha in self._shas.items():
            loaded = self.client.script_load(script)
            if _text(loaded) != sha:
                raise ConfigurationError(f"RedisBuckets.client: script_load returned {loaded!r}, expected {sha}")

    def keys(self, slot: str, n: int) -> list[str]:
        """The Redis keys of ``slot``'s ``n`` buckets."""
        tag = hashlib.sha256(slot.encode()).hexdigest()[:32]
        return [f"{self.prefix}{{{tag}}}:{i}" for i in range(n)]

    # ---- the store ------------------------------------------------------------------------------------

    def take(self, slot: str, limits: Sequence[RateLimit], costs: Sequence[float]) -> StoreAnswer:
        """One atomic script: take every cost of ``slot`` or none (see :class:`BucketStore`)."""
        args: list[str] = []
        for limit, cost in zip(limits, costs, strict=True):
            args += [repr(limit.rate_per_s), repr(limit.capacity), repr(float(cost))]
        reply = self._run(TAKE_SCRIPT, self.keys(slot, len(limits)), args)
        if reply is None:
            return self._failed()
        answer = _take_answer(reply, len(limits))
        if answer is None:  # a reply this script never gives: the store is broken
            self._mark_down()
            return self._failed()
        return answer

    def adjust(self, slot: str, limits: Sequence[RateLimit], index: int, amount: float) -> float | None:
        """One atomic script: give ``amount`` units back to bucket ``index`` of ``slot``."""
        limit = limits[index]
        key = self.keys(slot, len(limits))[index]
        reply = self._run(ADJUST_SCRIPT, [key], [repr(limit.rate_per_s), repr(limit.capacity),
                                                 repr(float(amount))])
        try:
            if reply is not None:
                return float(_text(reply))
        except (TypeError, ValueError):
            self._mark_down()
        return None

    def forget(self, slot: str) -> None:
        """Nothing to do: a Redis bucket expires by itself once it is full again."""

    # ---- helpers --------------------------------------------------------------------------------------

    def _run(self, script: str, keys: list[str], args: list[str]) -> Any:
        """The script's reply (``args`` follow the time argument), or None when Redis failed or is in its
        ``retry_after_s`` interval."""
        if self._clock() < self._down_until:
            return None
        sha = self._shas[script]
        try:
            args = ["" if self.server_clock is None else repr(float(self.server_clock())), *args]
            try:
                return self.client.evalsha(sha, len(keys), *keys, *args)
            except Exception as exc:
                if not _no_script(exc):
                    raise
                return self.client.eval(script, len(keys), *keys, *args)
        except Exception:  # any client failure (connection, timeout, server error) is the fail mode's case
            self._mark_down()
            return None

    def _mark_down(self) -> None:
        with self._lock:
            self._down_until = max(self._down_until, self._clock() + self.retry_after_s)

    def _failed(self) -> StoreAnswer:
        """The fail mode's answer (the interval was set by the failure, and is not extended here)."""
        if self.fail_mode == "open":
            return StoreAnswer(True, 0.0, store_error=True)
        return StoreAnswer(False, max(0.0, self._down_until - self._clock()), store_error=True)


def _take_answer(reply: Any, n: int) -> StoreAnswer | None:
    """The take script's reply ``[allowed, wait_s, blocking (1-based)]`` as an answer; None when malformed."""
    try:
        allowed, wait, blocking = reply
        wait_s, index = float(_text(wait)), int(blocking)
        if int(allowed) == 1:
            return StoreAnswer(True, 0.0)
    except (TypeError, ValueError):
        return None
    if 1 <= index <= n and math.isfinite(wait_s) and wait_s >= 0:
        return StoreAnswer(False, wait_s, index - 1)
    return None


def _no_script(exc: Exception) -> bool:
    """Whether ``exc`` says Redis does not have the script (redis-py's ``NoScriptError``, or the raw
    ``NOSCRIPT`` reply of another client): then the script itself is sent."""
    return type(exc).__name__ == "NoScriptError" or str(exc).startswith(("NOSCRIPT", "No matching script"))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
