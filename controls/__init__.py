"""``llmslo.controls``: what a server imports to protect itself, each decision reported through telemetry.

Standard library and :mod:`llmslo.telemetry` only; importable by any asyncio or threaded server.

- :class:`Decision`: admitted, or refused with a reject reason, an HTTP status and ``Retry-After``.
- :class:`AdmissionQueue`: bounded priority queue before a concurrency limit (``queue_full`` + 429), with a
  :class:`RetryAfterEstimator` (drain rate, depth ahead) and an optional :class:`LoadShedder` (queue,
  latency or GPU signal, lowest class first, degradation stages before shedding).
"""

from llmslo.controls._decision import ADMIT, HTTP_STATUS, MONOTONIC, Clock, Decision

# ---- admission queue, Retry-After, shedding and degradation (controls/_admission.py, _retry_after.py,
#      _shedding.py) ------------------------------------------------------------------------------------
# isort: split
from llmslo.controls._admission import AdmissionQueue, DegradeHook
from llmslo.controls._retry_after import RetryAfterEstimator
from llmslo.controls._shedding import GpuReader, LoadShedder, ShedVerdict, queue_shed_levels

# ---- rate limits (controls/_ratelimit.py, _redis.py) --------------------------------------------------
# isort: split
from llmslo.controls._ratelimit import (
    BucketStore,
    BucketTake,
    LocalBuckets,
    RateLimit,
    RateLimiter,
    RateLimitReporter,
    StoreAnswer,
    TokenBucket,
)
from llmslo.controls._redis import RedisBuckets, RedisScripting, redis_client

# ---- circuit breaker and drain (controls/_breaker.py, _drain.py) --------------------------------------
# isort: split
from llmslo.controls._breaker import (
    DEFAULT_FAILURE_KINDS,
    RETRY_AFTER_MAX_S,
    BreakerEvent,
    BreakerTelemetry,
    CircuitBreaker,
    classify_exception,
    classify_status,
)
from llmslo.controls._drain import (
    DRAIN_DECISIONS,
    DRAIN_PHASES,
    ON_BUDGET,
    DrainConfig,
    DrainController,
    DrainRecord,
    DrainTelemetry,
    drain_terminal_event,
)

__all__ = [
    "ADMIT",
    "AdmissionQueue",
    "BreakerEvent",
    "BreakerTelemetry",
    "BucketStore",
    "BucketTake",
    "CircuitBreaker",
    "Clock",
    "DEFAULT_FAILURE_KINDS",
    "DRAIN_DECISIONS",
    "DRAIN_PHASES",
    "Decision",
    "DegradeHook",
    "DrainConfig",
    "DrainController",
    "DrainRecord",
    "DrainTelemetry",
    "GpuReader",
    "HTTP_STATUS",
    "LoadShedder",
    "LocalBuckets",
    "MONOTONIC",
    "ON_BUDGET",
    "RETRY_AFTER_MAX_S",
    "RateLimit",
    "RateLimitReporter",
    "RateLimiter",
    "RedisBuckets",
    "RedisScripting",
    "RetryAfterEstimator",
    "ShedVerdict",
    "StoreAnswer",
    "TokenBucket",
    "classify_exception",
    "classify_status",
    "drain_terminal_event",
    "queue_shed_levels",
    "redis_client",
]
