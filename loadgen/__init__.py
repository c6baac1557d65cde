"""``llmslo.loadgen``: the open-loop load generator for any OpenAI-compatible endpoint (extra ``serve``).

- Schedules (:mod:`._schedule`): :func:`synthetic_schedule` (seeded Poisson or gamma arrivals at a rate),
  :func:`trace_schedule` (a production trace's arrivals and lengths), a :class:`RateProfile` of ramp and
  :class:`Burst` es; lengths as :class:`LengthSpec`.
- Client behaviours (:mod:`._behaviour`): :class:`SlowReader`, :class:`Cancel`, a timeout, chosen per request
  by seed (:class:`Behaviours`).
- The run (:mod:`._run`): :func:`run_load` sends a schedule open loop against a :class:`Target` and returns a
  :class:`RunResult` with one summary row per attempt (client-measured: :func:`attempt_row`), each handed
  to a sink as it ends; a client :class:`~llmslo.controls.CircuitBreaker` honours ``Retry-After``.
- One request found again in the server's own llmslo metrics (:mod:`._check`): :func:`check_server` says
  whether a server records its requests through llmslo (the middleware, the gateway, ``llmslo serve``).
- The figures of ``vllm bench serve`` under llmslo's definitions (:mod:`._stats`): :func:`bench_figures`,
  :func:`render_table`, :class:`Goodput`.

Loads the standard library, httpx, :mod:`llmslo.controls` and the telemetry contracts; never polars, duckdb,
numpy, scipy or typer.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("httpx") is None:  # pragma: no cover - exercised only without the extra
    raise ModuleNotFoundError("llmslo.loadgen needs the 'serve' extra (httpx is missing): "
                              "pip install 'llmslo[serve]'", name="httpx")

from llmslo.loadgen._attempt import (
    ERROR_TYPES,
    Attempt,
    Identity,
    attempt_log_entry,
    attempt_row,
    token_weighted_gaps,
)
from llmslo.loadgen._behaviour import Behaviours, Cancel, RequestPlan, SlowReader
from llmslo.loadgen._check import VERDICTS, CheckResult, MetricsRead, RequestSeen, check_server
from llmslo.loadgen._run import (
    CLIENT_FAILURE_KINDS,
    LATE_THRESHOLD_S,
    Cause,
    Lateness,
    LoadConfig,
    LoadRun,
    Progress,
    RunResult,
    StreamOptionsRefusal,
    TokenSources,
    make_breaker,
    run_load,
    top_causes,
)
from llmslo.loadgen._schedule import (
    ARRIVAL_KINDS,
    Arrival,
    Burst,
    LengthSpec,
    RateProfile,
    Schedule,
    SpecError,
    check_limits,
    parse_seconds,
    synthetic_schedule,
    trace_schedule,
)
from llmslo.loadgen._stats import DEFINITIONS, BenchFigures, Dist, Goodput, bench_figures, render_table
from llmslo.loadgen._target import (
    DEFAULT_REQUEST_ID_HEADER,
    ENDPOINTS,
    REQUEST_ID_KINDS,
    PromptBook,
    RequestIds,
    RequestShape,
    Target,
    Unreachable,
    parse_request_id_header,
    probe,
)
from llmslo.telemetry._openai_stream import SseParser

__all__ = [
    "ARRIVAL_KINDS",
    "Arrival",
    "Attempt",
    "Behaviours",
    "BenchFigures",
    "Burst",
    "CLIENT_FAILURE_KINDS",
    "Cancel",
    "Cause",
    "CheckResult",
    "DEFAULT_REQUEST_ID_HEADER",
    "DEFINITIONS",
    "Dist",
    "ENDPOINTS",
    "ERROR_TYPES",
    "Goodput",
    "Identity",
    "LATE_THRESHOLD_S",
    "Lateness",
    "LengthSpec",
    "LoadConfig",
    "LoadRun",
    "MetricsRead",
    "Progress",
    "PromptBook",
    "REQUEST_ID_KINDS",
    "RateProfile",
    "RequestIds",
    "RequestPlan",
    "RequestSeen",
    "RequestShape",
    "RunResult",
    "Schedule",
    "SlowReader",
    "SpecError",
    "SseParser",
    "StreamOptionsRefusal",
    "Target",
    "TokenSources",
    "Unreachable",
    "VERDICTS",
    "attempt_log_entry",
    "attempt_row",
    "bench_figures",
    "check_limits",
    "check_server",
    "make_breaker",
    "parse_request_id_header",
    "parse_seconds",
    "probe",
    "render_table",
    "run_load",
    "synthetic_schedule",
    "token_weighted_gaps",
    "top_causes",
    "trace_schedule",
]
