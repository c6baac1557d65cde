"""Autoscaling simulated on an arrival schedule: engines, the gateway's queue with 429s, an HPA-like controller.

Everything runs on simulated time (seconds after the first arrival), in one discrete-event loop; nothing
reads a wall clock and the only random draw (the ``Retry-After`` jitter) comes from ``random.Random(seed)``,
so a run is a function of its inputs and its seed. The parts:

- **Engines** (replicas): each is the continuous-batching step model of :mod:`llmslo.server._engine`
  with a fitted :class:`~llmslo.server._profile.EngineProfile`: a step prefills the requests that join
  (their first token comes at the step's end) and decodes one token of every sequence already in the batch;
  it lasts ``profile.step_s(joining prompt tokens, decoded sequences)``. A request that generates ``n``
  tokens leaves the batch at the end of its ``n``-th step. The batch holds at most ``max_num_seqs``
  sequences (the :class:`~llmslo.server._engine.EngineConfig` field), which are the replica's slots.
  Not simulated: the KV cache (no preemption), chunked prefill, prefix caching.
- **The gateway's admission queue** in front of the ready replicas, as
  :class:`~llmslo.controls.AdmissionQueue` decides for one tenant class: a slot at once when nobody waits and
  a ready replica has a free slot (the least loaded replica gets it); else a wait in the queue (at most
  ``max_queue`` requests, at most ``queue_timeout_s`` each: past it the request ends ``deadline``); else, the
  queue full, a refusal, 429 with a ``Retry-After`` from a :class:`~llmslo.controls.RetryAfterEstimator`
  fed exactly as the queue feeds it (every change of depth, departures counted) and asked with the depth
  ahead.
- **The controller**, as Kubernetes' HorizontalPodAutoscaler computes: every ``sync_period_s`` a
  recommendation from one metric against its target (inside ``tolerance`` of the target: no change), the
  stabilisation windows (scale up to the lowest recommendation of the last ``scale_up_stabilization_s``,
  down to the highest of the last ``scale_down_stabilization_s``), clamped to ``[min_replicas,
  max_replicas]``. A new replica serves ``pod_start_delay_s`` after it is created and costs GPU time from
  its creation. Scaling down removes starting replicas first (newest first), then the ready replicas with
  the fewest requests in flight, which take no new request and finish what they hold.

Metrics (:data:`METRICS`): ``queue_length`` (requests waiting in the gateway's queue, target per replica),
``concurrency`` (requests in the system: waiting plus in the engines, target per replica),
``gpu_utilization`` (the share of the last sync period the ready replicas' engines spent in steps, target a
share in (0, 1]).

:func:`simulate` returns a :class:`Simulation`: each request's outcome, the replica changes, one sample a
second, and :meth:`Simulation.buckets` / :meth:`Simulation.totals` (goodput by the SLO policy of
``definitions.md``, GPU-seconds). Standard library only (PyYAML to read a policy file).
"""

from __future__ import annotations

import difflib
import heapq
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmslo.telemetry import DEFAULT_TPOT_S, DEFAULT_TTFT_S, ConfigurationError, LlmsloError, SloPolicy, tpot_s

if TYPE_CHECKING:  # the engines and the controls are imported when a simulation runs: importing this stays light
    from llmslo.controls import Decision, RetryAfterEstimator
    from llmslo.server._profile import EngineProfile

__all__ = [
    "METRICS",
    "Arrival",
    "AutoscalePolicy",
    "Bucket",
    "PolicyError",
    "ReplicaChange",
    "RequestOutcome",
    "Sample",
    "Simulation",
    "Totals",
    "load_policy",
    "parse_policy",
    "read_arrivals",
    "simulate",
]

METRICS: tuple[str, ...] = ("queue_length", "concurrency", "gpu_utilization")
"""The metrics a policy may target."""

DEFAULT_PROFILE = "llama2-70b/h100-80gb"
"""The engines' profile unless a policy names another (``llmslo serve``'s default, checked by the tests)."""

SAMPLE_S = 1.0
"""Seconds between two samples of the state (replicas, queue, requests in flight)."""

# Outcomes of a request.
COMPLETED, REJECTED, TIMED_OUT = "completed", "rejected", "timed_out"

# Event kinds, in the order they run at one instant: a step's end frees slots, a replica becomes ready, a
# waiter's queue timeout passes (as the queue sweeps before refusing), then arrivals, the controller, samples.
_STEP_END, _READY, _TIMEOUT, _ARRIVAL, _SYNC, _SAMPLE = range(6)


class PolicyError(LlmsloError, ValueError):
    """A policy file or mapping is invalid: ``source`` is the file, ``field`` the dotted field; nothing ran."""

    def __init__(self, source: str, field_name: str, message: str) -> None:
        self.source = source
        self.field = field_name
        super().__init__(f"{source}: field {field_name!r}: {message}")


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of a schedule: ``offset_s`` (seconds after the first arrival), its prompt and output
    lengths (tokens)."""

    offset_s: float
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class AutoscalePolicy:
    """An autoscaling policy and the serving setup it drives (every time in seconds).

    The controller: ``metric`` (one of :data:`METRICS`) and its ``target`` (per replica; a share for
    ``gpu_utilization``), ``tolerance`` (a share), ``sync_period_s``, ``scale_up_stabilization_s``,
    ``scale_down_stabilization_s``, ``min_replicas`` / ``max_replicas`` / ``initial_replicas``,
    ``pod_start_delay_s``. The engines: ``profile`` (a name of :data:`~llmslo.server._profile.PROFILES`) and
    ``max_num_seqs`` (slots per replica). The gateway: ``max_queue`` (requests) and ``queue_timeout_s``. The
    SLO: ``slo`` (TTFT and TPOT bounds of a good request).
    """

    name: str
    metric: str
    target: float
    tolerance: float = 0.1
    sync_period_s: float = 15.0
    scale_up_stabilization_s: float = 0.0
    scale_down_stabilization_s: float = 300.0
    min_replicas: int = 1
    max_replicas: int = 10
    initial_replicas: int = 1
    pod_start_delay_s: float = 45.0
    profile: str = DEFAULT_PROFILE
    max_num_seqs: int = 8
    max_queue: int = 16
    queue_timeout_s: float = 1.0
    slo: SloPolicy = field(default_factory=lambda: SloPolicy(ttft_s=DEFAULT_TTFT_S, tpot_s=DEFAULT_TPOT_S))

    @property
    def engine_profile(self) -> EngineProfile:
        """The fitted step-time profile of the replicas."""
        from llmslo.server._profile import PROFILES

        return PROFILES[self.profile]

    def to_dict(self) -> dict[str, Any]:
        """The policy as the fields of a policy file (JSON-ready)."""
        out = {k: v for k, v in asdict(self).items() if k != "slo"}
        out["slo"] = {"ttft_s": self.slo.ttft_s, "tpot_s": self.slo.tpot_s}
        return out


# ---- reading a policy --------------------------------------------------------------------------------------

_INT_FIELDS = ("min_replicas", "max_replicas", "initial_replicas", "max_num_seqs", "max_queue")
_SECONDS_FIELDS = ("sync_period_s", "scale_up_stabilization_s", "scale_down_stabilization_s",
                   "pod_start_delay_s", "queue_timeout_s")
_FIELDS = ("name", "metric", "target", "tolerance", *_SECONDS_FIELDS, *_INT_FIELDS, "profile", "slo")
_SLO_FIELDS = ("ttft_s", "tpot_s")


def _unknown(source: str, key: object, known: Sequence[str], prefix: str = "") -> PolicyError:
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f"did you mean {prefix}{close[0]}?" if close else f"the fields are {', '.join(known)}"
    return PolicyError(source, f"{prefix}{key}", f"unknown field; {hint}")


def _number(source: str, name: str, value: object, *, minimum: float, strict: bool) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= minimum if strict else value < minimum):  # type: ignore[operator]
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise PolicyError(source, name, f"must be a number {bound}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def _integer(source: str, name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PolicyError(source, name, f"must be a whole number >= 1, got {value!r}")
    return value


def parse_policy(data: object, source: str = "policy") -> AutoscalePolicy:
    """An :class:`AutoscalePolicy` from a mapping (a parsed policy file); ``source`` names it in errors.

    Raises :class:`PolicyError` naming the field and saying what it must be, e.g. ``hpa.yaml: field
    'target': must be a number > 0, got -1``. Required: ``name``, ``metric``, ``target``.
    """
    if not isinstance(data, Mapping):
        raise PolicyError(source, "(top level)", f"must be a mapping of fields, got {type(data).__name__}")
    for key in data:
        if key not in _FIELDS:
            raise _unknown(source, key, _FIELDS)
    for key in ("name", "metric", "target"):
        if key not in data:
            raise PolicyError(source, key, "is required")
    name = data["name"]
    if not isinstance(name, str) or not name.strip():
        raise PolicyError(source, "name", f"must be a non-empty text, got {name!r}")
    metric = data["metric"]
    if metric not in METRICS:
        raise PolicyError(source, "metric", f"must be one of {', '.join(METRICS)}, got {metric!r}")
    kw: dict[str, Any] = {"name": name.strip(), "metric": metric}
    kw["target"] = _number(source, "target", data["target"], minimum=0, strict=True)
    if metric == "gpu_utilization" and kw["target"] > 1:
        raise PolicyError(source, "target", f"a gpu_utilization target is a share in (0, 1], got {data['target']!r}")
    if "tolerance" in data:
        kw["tolerance"] = _number(source, "tolerance", data["tolerance"], minimum=0, strict=False)
        if kw["tolerance"] >= 1:
            raise PolicyError(source, "tolerance", f"must be a share in [0, 1), got {data['tolerance']!r}")
    for key in _SECONDS_FIELDS:
        if key in data:
            strict = key in ("sync_period_s", "queue_timeout_s")
            kw[key] = _number(source, key, data[key], minimum=0, strict=strict)
    for key in _INT_FIELDS:
        if key in data:
            kw[key] = _integer(source, key, data[key])
    from llmslo.server._engine import EngineConfig
    from llmslo.server._profile import PROFILES

    if "profile" in data:
        if data["profile"] not in PROFILES:
            raise PolicyError(source, "profile", f"unknown engine profile {data['profile']!r}; choose from "
                                                 f"{', '.join(PROFILES)}")
        kw["profile"] = data["profile"]
    if "slo" in data:
        kw["slo"] = _parse_slo(source, data["slo"])
    lo, hi = kw.get("min_replicas", 1), kw.get("max_replicas", 10)
    if hi < lo:
        raise PolicyError(source, "max_replicas", f"must be >= min_replicas ({lo}), got {hi}")
    initial = kw.setdefault("initial_replicas", lo)
    if not lo <= initial <= hi:
        raise PolicyError(source, "initial_replicas", f"must lie within [min_replicas, max_replicas] = [{lo}, {hi}], "
                                                      f"got {initial}")
    policy = AutoscalePolicy(**kw)
    try:  # the engine's own checks (slots)
        EngineConfig(policy.engine_profile, max_num_seqs=policy.max_num_seqs)
    except ConfigurationError as exc:
        raise PolicyError(source, "max_num_seqs", str(exc)) from None
    return policy


def _parse_slo(source: str, data: object) -> SloPolicy:
    if not isinstance(data, Mapping):
        raise PolicyError(source, "slo", f"must be a mapping with ttft_s and tpot_s, got {data!r}")
    for key in data:
        if key not in _SLO_FIELDS:
            raise _unknown(source, key, _SLO_FIELDS, "slo.")
    bounds = {k: _number(source, f"slo.{k}", data[k], minimum=0, strict=True) for k in _SLO_FIELDS if k in data}
    return SloPolicy(ttft_s=bounds.get("ttft_s", DEFAULT_TTFT_S), tpot_s=bounds.get("tpot_s", DEFAULT_TPOT_S))


def load_policy(path: str | Path) -> AutoscalePolicy:
    """Read a YAML policy file (see :func:`parse_policy`). Raises :class:`PolicyError` naming the file for a
    file that cannot be read or parsed, and the field for a bad value."""
    import yaml

    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(source, "(file)", f"cannot be read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(source, "(file)", f"is not valid YAML: {exc}") from None
    return parse_policy(data, source)


# ---- results -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What happened to one request (times in seconds after the first arrival; durations in seconds).

    ``outcome``: ``completed``, ``rejected`` (429 at the door, with ``retry_after_s``), ``timed_out`` (waited
    ``queue_timeout_s``, ended ``deadline``). ``queue_depth`` is the queue's depth the moment it arrived;
    ``replica_in_flight`` the requests its replica held once it joined, itself included (its ``slots`` at
    most). ``good`` is the SLO verdict.
    """

    index: int
    arrival_s: float
    outcome: str
    queue_depth: int
    retry_after_s: float | None = None
    retry_after_header: str | None = None
    replica: int | None = None
    replica_in_flight: int | None = None
    dispatched_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    good: bool = False


@dataclass(frozen=True, slots=True)
class ReplicaChange:
    """The replicas after a change at ``t_s``: ``desired`` (the controller's count), ``starting``, ``ready``
    (serving), ``draining`` (finishing their requests before they go)."""

    t_s: float
    desired: int
    starting: int
    ready: int
    draining: int
    why: str


@dataclass(frozen=True, slots=True)
class Sample:
    """The state at ``t_s``: replicas, the queue's depth, requests in the engines, slots of the ready ones."""

    t_s: float
    desired: int
    starting: int
    ready: int
    draining: int
    queue: int
    in_flight: int
    slots: int


@dataclass(frozen=True, slots=True)
class Bucket:
    """``[start_s, start_s + width_s)``, requests by arrival: ``admitted`` (not refused at the door: they
    served or waited), ``rejected`` (429 at the door, the queue full), ``timed_out`` (429 after
    ``queue_timeout_s`` in the queue), ``http_429_per_s`` (both, per second), ``good`` (by the SLO) and
    ``goodput_per_s``; from the samples, the most replicas desired and ready and the deepest queue; the
    GPU-seconds spent in the bucket."""

    start_s: float
    width_s: float
    arrivals: int
    admitted: int
    rejected: int
    timed_out: int
    http_429_per_s: float
    good: int
    goodput_per_s: float
    desired: int
    ready: int
    queue_max: int
    gpu_s: float


@dataclass(frozen=True, slots=True)
class Totals:
    """A run's totals: requests (by outcome), ``good`` and ``goodput_fraction`` (good / arrivals),
    ``goodput_per_s`` (good / ``duration_s``), ``gpu_s`` (replica-seconds, starting replicas included),
    ``good_per_gpu_s``, the TTFT of admitted requests (p50, p99, max; seconds), the most replicas ready."""

    policy: str
    duration_s: float
    arrivals: int
    admitted: int
    rejected: int
    timed_out: int
    good: int
    goodput_fraction: float
    goodput_per_s: float
    gpu_s: float
    good_per_gpu_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    ttft_max_s: float | None
    max_ready: int


@dataclass(frozen=True)
class Simulation:
    """One run: the policy, each request's outcome (arrival order), every replica change, the samples, the
    replicas' spans (``(created_s, gone_s)``) and ``end_s`` (the last arrival or terminal state)."""

    policy: AutoscalePolicy
    seed: int
    outcomes: tuple[RequestOutcome, ...]
    changes: tuple[ReplicaChange, ...]
    samples: tuple[Sample, ...]
    replica_spans: tuple[tuple[float, float], ...]
    end_s: float

    def gpu_seconds(self, start_s: float = 0.0, end_s: float | None = None) -> float:
        """Replica-seconds (starting, ready and draining replicas) within ``[start_s, end_s)``."""
        hi = self.end_s if end_s is None else end_s
        return sum(max(0.0, min(b, hi) - max(a, start_s)) for a, b in self.replica_spans)

    def buckets(self, width_s: float) -> list[Bucket]:
        """The run in buckets of ``width_s`` seconds (requests by arrival, replicas and queue by sample)."""
        if not (math.isfinite(width_s) and width_s > 0):
            raise ConfigurationError(f"Simulation.buckets: width_s must be a number of seconds > 0, got {width_s!r}")
        n = max(1, math.ceil(self.end_s / width_s))
        rows: list[dict[str, int]] = [dict.fromkeys(("arrivals", "admitted", "rejected", "timed_out", "good",
                                                     "desired", "ready", "queue_max"), 0) for _ in range(n)]
        for o in self.outcomes:
            row = rows[min(n - 1, int(o.arrival_s // width_s))]
            row["arrivals"] += 1
            row["admitted"] += o.outcome != REJECTED
            row["rejected"] += o.outcome == REJECTED
            row["timed_out"] += o.outcome == TIMED_OUT
            row["good"] += o.good
        for s in self.samples:
            row = rows[min(n - 1, int(s.t_s // width_s))]
            row["desired"] = max(row["desired"], s.desired)
            row["ready"] = max(row["ready"], s.ready)
            row["queue_max"] = max(row["queue_max"], s.queue)
        out = []
        for i, row in enumerate(rows):
            start = i * width_s
            span = min(width_s, self.end_s - start) if i == n - 1 and self.end_s > start else width_s
            out.append(Bucket(start, width_s, row["arrivals"], row["admitted"], row["rejected"], row["timed_out"],
                              (row["rejected"] + row["timed_out"]) / span, row["good"], row["good"] / span,
                              row["desired"], row["ready"], row["queue_max"],
                              self.gpu_seconds(start, start + width_s)))
        return out

    def totals(self) -> Totals:
        """The run's :class:`Totals`."""
        outs = self.outcomes
        good = sum(o.good for o in outs)
        ttfts = sorted(o.ttft_s for o in outs if o.ttft_s is not None)
        gpu = self.gpu_seconds()
        duration = max(self.end_s, 1e-9)
        return Totals(
            policy=self.policy.name, duration_s=self.end_s, arrivals=len(outs),
            admitted=sum(o.outcome != REJECTED for o in outs), rejected=sum(o.outcome == REJECTED for o in outs),
            timed_out=sum(o.outcome == TIMED_OUT for o in outs), good=good,
            goodput_fraction=good / len(outs) if outs else 0.0, goodput_per_s=good / duration, gpu_s=gpu,
            good_per_gpu_s=good / gpu if gpu > 0 else 0.0, ttft_p50_s=_quantile(ttfts, 0.5),
            ttft_p99_s=_quantile(ttfts, 0.99), ttft_max_s=ttfts[-1] if ttfts else None,
            max_ready=max((c.ready for c in self.changes), default=0))


def _quantile(ordered: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of sorted values (linear interpolation), None when empty."""
    if not ordered:
        return None
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# ---- the simulation ----------------------------------------------------------------------------------------

_STARTING, _READY_STATE, _DRAINING, _GONE = "starting", "ready", "draining", "gone"


def _refusal(retry_after_s: float, detail: str) -> Decision:
    """The gateway's refusal (a :class:`~llmslo.controls.Decision`: 429 ``queue_full`` with ``Retry-After``)."""
    from llmslo.controls import Decision

    return Decision.refuse("queue_full", retry_after_s, detail)


class _Request:
    __slots__ = ("arrival", "dispatched_s", "first_s", "index", "last_s", "outputs", "prompt", "replica",
                 "replica_in_flight", "waiting")

    def __init__(self, index: int, arrival: Arrival) -> None:
        self.index = index
        self.arrival = arrival.offset_s
        self.prompt = arrival.input_tokens
        self.outputs = max(1, arrival.output_tokens)  # the prefill's token: a reply has one at least
        self.waiting = False
        self.dispatched_s: float | None = None
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.replica: int | None = None
        self.replica_in_flight: int | None = None


class _Replica:
    """One engine: the step model of ``server/_engine.py`` on simulated time (see the module docstring)."""

    __slots__ = ("busy_s", "created_s", "gone_s", "id", "joining", "pending", "ready_s", "running", "state",
                 "step", "stepping")

    def __init__(self, rid: int, created_s: float, ready_s: float) -> None:
        self.id = rid
        self.created_s = created_s
        self.ready_s = ready_s
        self.gone_s: float | None = None
        self.state = _STARTING
        self.pending: list[_Request] = []  # sent here, joining at the next step
        self.joining: list[_Request] = []  # joining in the step now running
        self.running: list[tuple[int, int, _Request]] = []  # heap of (last step, index, request)
        self.step = 0
        self.stepping = False
        self.busy_s = 0.0

    @property
    def in_flight(self) -> int:
        """Requests this replica holds (sent, joining, in the batch)."""
        return len(self.pending) + len(self.joining) + len(self.running)


class _Run:
    """The event loop of one simulation (see :func:`simulate`)."""

    def __init__(self, policy: AutoscalePolicy, arrivals: Sequence[Arrival], seed: int) -> None:
        from llmslo.controls import RetryAfterEstimator

        self.p = policy
        self.profile = policy.engine_profile
        self.slots = policy.max_num_seqs
        self.arrivals = arrivals
        self.requests = [_Request(i, a) for i, a in enumerate(arrivals)]
        self.outcomes: list[RequestOutcome | None] = [None] * len(arrivals)
        self.depths = [0] * len(arrivals)  # the queue's depth when each request arrived
        self.events: list[tuple[float, int, int, object]] = []
        self.order = 0
        self.queue: deque[_Request] = deque()
        self.depth = 0
        self.retry_after: RetryAfterEstimator = RetryAfterEstimator(rng=random.Random(seed), clock=lambda: 0.0)
        self.replicas: list[_Replica] = []
        self.desired = policy.initial_replicas
        self.history: list[tuple[float, int]] = []  # (t, recommendation)
        self.changes: list[ReplicaChange] = []
        self.samples: list[Sample] = []
        self.last_sync = 0.0
        self.last_busy = 0.0
        self.open = len(arrivals)  # requests without a terminal state
        self.end_s = arrivals[-1].offset_s if arrivals else 0.0

    # ---- events ---------------------------------------------------------------------------------------

    def push(self, t: float, kind: int, item: object = None) -> None:
        self.order += 1
        heapq.heappush(self.events, (t, kind, self.order, item))

    def run(self) -> None:
        for _ in range(self.p.initial_replicas):
            self.add_replica(0.0, ready_now=True)
        self.log(0.0, "initial replicas")
        for r in self.requests:
            self.push(r.arrival, _ARRIVAL, r)
        self.push(self.p.sync_period_s, _SYNC)
        self.push(0.0, _SAMPLE)
        while self.events:
            t, kind, _, item = heapq.heappop(self.events)
            if kind == _STEP_END:
                assert isinstance(item, _Replica)
                self.step_end(t, item)
            elif kind == _READY:
                assert isinstance(item, _Replica)
                self.ready(t, item)
            elif kind == _TIMEOUT:
                assert isinstance(item, _Request)
                self.timeout(t, item)
            elif kind == _ARRIVAL:
                assert isinstance(item, _Request)
                self.arrive(t, item)
            elif self.open == 0 and t >= self.end_s:
                continue  # every request ended: the controller and the sampler stop
            elif kind == _SYNC:
                self.sync(t)
                self.push(t + self.p.sync_period_s, _SYNC)
            else:
                self.sample(t)
                self.push(t + SAMPLE_S, _SAMPLE)
        for rep in self.replicas:
            if rep.gone_s is None:
                rep.gone_s = self.end_s

    # ---- the gateway ----------------------------------------------------------------------------------

    def serving(self) -> list[_Replica]:
        return [r for r in self.replicas if r.state == _READY_STATE]

    def free_replica(self) -> _Replica | None:
        """The ready replica with the fewest requests in flight and a free slot (ties: the oldest)."""
        best: _Replica | None = None
        for rep in self.serving():
            if rep.in_flight < self.slots and (best is None or rep.in_flight < best.in_flight):
                best = rep
        return best

    def arrive(self, t: float, req: _Request) -> None:
        depth = self.depth
        self.depths[req.index] = depth
        rep = self.free_replica() if depth == 0 else None
        if rep is not None:
            self.send(t, req, rep)
        elif depth < self.p.max_queue:
            req.waiting = True
            self.queue.append(req)
            self.depth += 1
            self.retry_after.record(0, self.depth, t)
            self.push(t + self.p.queue_timeout_s, _TIMEOUT, req)
        else:  # the queue is full: 429, Retry-After from the drain rate and the depth ahead
            decision = _refusal(self.retry_after.estimate(depth, t), "queue full")
            self.finish(t, RequestOutcome(req.index, t, REJECTED, depth, decision.retry_after_s,
                                          decision.retry_after_header))

    def dispatch(self, t: float) -> None:
        """Give free slots to the waiters, oldest first."""
        granted = 0
        while self.depth:
            rep = self.free_replica()
            if rep is None:
                break
            req = self.queue.popleft()
            if not req.waiting:
                continue
            req.waiting = False
            self.depth -= 1
            granted += 1
            self.send(t, req, rep)
        while self.queue and not self.queue[0].waiting:
            self.queue.popleft()
        if granted:
            self.retry_after.record(granted, self.depth, t)

    def timeout(self, t: float, req: _Request) -> None:
        if not req.waiting:
            return
        req.waiting = False
        self.depth -= 1
        self.retry_after.record(1, self.depth, t)
        # as the AdmissionQueue answers a queue timeout: 429 queue_full (detail queue_timeout) + Retry-After
        decision = _refusal(self.retry_after.estimate(self.depth, t), "queue_timeout")
        self.finish(t, RequestOutcome(req.index, req.arrival, TIMED_OUT, self.depths[req.index],
                                      decision.retry_after_s, decision.retry_after_header))

    def send(self, t: float, req: _Request, rep: _Replica) -> None:
        rep.pending.append(req)
        req.replica = rep.id
        req.replica_in_flight = rep.in_flight
        req.dispatched_s = t
        if not rep.stepping:
            self.start_step(t, rep)

    # ---- the engines ----------------------------------------------------------------------------------

    def start_step(self, t: float, rep: _Replica) -> None:
        rep.joining, rep.pending = rep.pending, []
        prefill = sum(r.prompt for r in rep.joining)
        rep.stepping = True
        self.push(t + self.profile.step_s(prefill, len(rep.running)), _STEP_END, rep)

    def step_end(self, t: float, rep: _Replica) -> None:
        rep.step += 1
        k = rep.step
        rep.busy_s += self.profile.step_s(sum(r.prompt for r in rep.joining), len(rep.running))
        for req in rep.joining:
            req.first_s = t
            heapq.heappush(rep.running, (k + req.outputs - 1, req.index, req))
        rep.joining = []
        while rep.running and rep.running[0][0] <= k:
            req = heapq.heappop(rep.running)[2]
            req.last_s = t
            self.complete(t, req)
        rep.stepping = False
        self.dispatch(t)  # may start this replica's next step (a request sent to it)
        if rep.stepping:
            return
        if rep.pending or rep.running:
            self.start_step(t, rep)
        elif rep.state == _DRAINING:
            self.retire(t, rep, "drained")

    def complete(self, t: float, req: _Request) -> None:
        assert req.first_s is not None and req.last_s is not None
        ttft = req.first_s - req.arrival
        tpot = tpot_s(ttft, req.last_s - req.arrival, req.outputs)
        e2e = req.last_s - req.arrival
        good = self.p.slo.verdict("length", ttft, tpot, req.outputs, e2e)
        self.finish(t, RequestOutcome(req.index, req.arrival, COMPLETED, self.depths[req.index], None, None,
                                      req.replica, req.replica_in_flight, req.dispatched_s, ttft, tpot, e2e, good))

    def finish(self, t: float, outcome: RequestOutcome) -> None:
        self.outcomes[outcome.index] = outcome
        self.open -= 1
        self.end_s = max(self.end_s, t)

    # ---- the replicas ---------------------------------------------------------------------------------

    def add_replica(self, t: float, *, ready_now: bool = False) -> None:
        rep = _Replica(len(self.replicas), t, t if ready_now else t + self.p.pod_start_delay_s)
        self.replicas.append(rep)
        if ready_now:
            rep.state = _READY_STATE
        else:
            self.push(rep.ready_s, _READY, rep)

    def ready(self, t: float, rep: _Replica) -> None:
        if rep.state != _STARTING:
            return
        rep.state = _READY_STATE
        self.log(t, f"replica {rep.id} ready")
        self.dispatch(t)

    def retire(self, t: float, rep: _Replica, why: str) -> None:
        rep.state = _GONE
        rep.gone_s = t
        self.log(t, f"replica {rep.id} {why}")

    def count(self, state: str) -> int:
        return sum(1 for r in self.replicas if r.state == state)

    def log(self, t: float, why: str) -> None:
        self.changes.append(ReplicaChange(t, self.desired, self.count(_STARTING), self.count(_READY_STATE),
                                          self.count(_DRAINING), why))

    # ---- the controller -------------------------------------------------------------------------------

    def metric(self, t: float) -> float:
        """The policy's metric now (per replica for the counts: divided later)."""
        metric = self.p.metric
        if metric == "queue_length":
            return float(self.depth)
        if metric == "concurrency":
            return float(self.depth + sum(r.in_flight for r in self.replicas if r.state != _GONE))
        busy = sum(r.busy_s for r in self.replicas)
        window = sum(max(0.0, min(t, r.gone_s if r.gone_s is not None else t) - max(self.last_sync, r.ready_s))
                     for r in self.replicas if r.state != _STARTING)
        share = (busy - self.last_busy) / window if window > 0 else 0.0
        self.last_busy = busy
        return min(1.0, share)

    def recommend(self, t: float) -> int:
        """The controller's recommendation before the stabilisation windows (Kubernetes' formula)."""
        current = self.count(_STARTING) + self.count(_READY_STATE)
        value = self.metric(t)
        target, tol = self.p.target, self.p.tolerance
        if self.p.metric == "gpu_utilization":
            ready = self.count(_READY_STATE)
            if ready == 0:
                return current
            ratio = value / target
            if abs(ratio - 1.0) <= tol:
                return current
            rec = math.ceil(ready * ratio)
            return current if rec < current and self.count(_STARTING) else rec
        ratio = value / (target * max(current, 1))
        return current if abs(ratio - 1.0) <= tol else math.ceil(value / target)

    def sync(self, t: float) -> None:
        rec = self.recommend(t)
        self.last_sync = t
        self.history.append((t, rec))
        up = min(r for s, r in self.history if s > t - self.p.scale_up_stabilization_s or s == t)
        down = max(r for s, r in self.history if s > t - self.p.scale_down_stabilization_s or s == t)
        keep = max(self.p.scale_up_stabilization_s, self.p.scale_down_stabilization_s)
        self.history = [(s, r) for s, r in self.history if s > t - keep or s == t]
        current = self.count(_STARTING) + self.count(_READY_STATE)
        desired = current
        if desired < up:
            desired = up
        if desired > down:
            desired = down
        desired = min(self.p.max_replicas, max(self.p.min_replicas, desired))
        self.desired = desired
        if desired > current:
            for _ in range(desired - current):
                self.add_replica(t)
            self.log(t, f"scale up {current} -> {desired}")
        elif desired < current:
            self.scale_down(t, current - desired)
            self.log(t, f"scale down {current} -> {desired}")

    def scale_down(self, t: float, n: int) -> None:
        """Remove ``n`` replicas: starting ones first (newest first), then the least loaded ready ones."""
        starting = [r for r in self.replicas if r.state == _STARTING][::-1]
        ready = sorted(self.serving(), key=lambda r: (r.in_flight, -r.id))
        for rep in (starting + ready)[:n]:
            if rep.state == _STARTING or rep.in_flight == 0:
                rep.state = _GONE
                rep.gone_s = t
            else:
                rep.state = _DRAINING

    def sample(self, t: float) -> None:
        self.samples.append(Sample(t, self.desired, self.count(_STARTING), self.count(_READY_STATE),
                                   self.count(_DRAINING), self.depth,
                                   sum(r.in_flight for r in self.replicas if r.state != _GONE),
                                   self.slots * self.count(_READY_STATE)))


def simulate(policy: AutoscalePolicy, arrivals: Iterable[Arrival], *, seed: int = 0) -> Simulation:
    """Replay ``arrivals`` (in arrival order; offsets in seconds) through the gateway, the engines and the
    controller of ``policy`` (see the module docstring). Deterministic for a seed. Raises
    :class:`ConfigurationError` for arrivals out of order or with negative offsets or lengths."""
    rows = list(arrivals)
    last = 0.0
    for i, a in enumerate(rows):
        if not (math.isfinite(a.offset_s) and a.offset_s >= last):
            raise ConfigurationError(f"arrival {i}: offset_s {a.offset_s!r} is negative, not finite or earlier than "
                                     "the one before: sort the schedule by arrival")
        if a.input_tokens < 0 or a.output_tokens < 0:
            raise ConfigurationError(f"arrival {i}: token counts must be >= 0, got {a.input_tokens}, {a.output_tokens}")
        last = a.offset_s
    run = _Run(policy, rows, seed)
    run.run()
    outcomes = tuple(o for o in run.outcomes if o is not None)
    assert len(outcomes) == len(rows), "every request reaches a terminal state"
    spans = tuple((r.created_s, r.gone_s if r.gone_s is not None else run.end_s) for r in run.replicas)
    return Simulation(policy, seed, outcomes, tuple(run.changes), tuple(run.samples), spans, run.end_s)


def read_arrivals(kind: str, path: str | Path, *, start_s: float = 0.0,
                  end_s: float | None = None) -> list[Arrival]:
    """The arrivals of a trace (``kind``: one of :data:`~llmslo.analysis.workload.TRACE_KINDS` or ``auto``)
    within ``[start_s, end_s)`` seconds after its first arrival, their offsets counted from ``start_s``.

    Reads through :func:`llmslo.analysis.workload.read_trace` (the ``analysis`` extra), whose
    :class:`~llmslo.analysis.workload.TraceFormatError` names the file, the line and the field.
    """
    from llmslo.analysis.workload import read_trace

    schedule, _ = read_trace(kind, path)
    offsets = schedule["offset_s"].to_list()
    inputs = schedule["input_tokens"].to_list()
    outputs = schedule["output_tokens"].to_list()
    hi = math.inf if end_s is None else end_s
    return [Arrival(t - start_s, i, o) for t, i, o in zip(offsets, inputs, outputs, strict=True) if start_s <= t < hi]
