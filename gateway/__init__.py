"""``llmslo.gateway``: an OpenAI-compatible reverse proxy in front of any engine pool.

Admission before anything reaches an engine (the gateway's drain, token and request budgets per API key
reserved and settled, a bounded priority queue with shedding and a measured ``Retry-After``), routing over ready
backends (power of two choices on outstanding requests per slot, or on the engines' own queues read from their
``/metrics`` through the engine profiles), a breaker per backend on stream health, retries
only for requests that sent their client nothing, streams passed on byte for byte with a last event whenever the
gateway ends one itself, a drain per backend in the order of the definitions, and one request summary per
request. ``docs/gateway.md`` is the tour.

- :class:`GatewayConfig`, :class:`BackendSpec`, :class:`BudgetConfig`, :func:`load_pool` (a :class:`PoolFile`),
  :func:`backend_from_arg`, :data:`ENGINE_CHOICES`, :data:`DRAIN_FIELDS` and :data:`DRAIN_FLAGS` (the drain
  rules' fields and flags): the configuration;
- :class:`Gateway`: one running gateway (front server, admin API, health checks); :func:`serve` runs one until
  SIGTERM;
- :class:`GatewayApp`: the request path; :class:`Pool`, :class:`Backend`: the backends; :class:`PoolCollector`:
  their series (``llmslo_backend_*``) at each scrape.
"""

from llmslo.gateway._config import (
    DRAIN_FIELDS,
    DRAIN_FLAGS,
    ENGINE_CHOICES,
    BackendSpec,
    BudgetConfig,
    GatewayConfig,
    PoolFile,
    backend_from_arg,
    load_pool,
)
from llmslo.gateway._loop import LOOP_CHOICES, event_loop_factory, loop_name
from llmslo.gateway._metrics import PoolCollector
from llmslo.gateway._pool import Backend, Pool
from llmslo.gateway._proxy import GatewayApp
from llmslo.gateway._run import Gateway, GatewayResult, serve

__all__ = [
    "Backend",
    "BackendSpec",
    "BudgetConfig",
    "DRAIN_FIELDS",
    "DRAIN_FLAGS",
    "ENGINE_CHOICES",
    "Gateway",
    "GatewayApp",
    "GatewayConfig",
    "GatewayResult",
    "LOOP_CHOICES",
    "Pool",
    "PoolCollector",
    "PoolFile",
    "backend_from_arg",
    "event_loop_factory",
    "load_pool",
    "loop_name",
    "serve",
]
