"""Kubernetes manifests for an inference service behind ``llmslo gateway``, built so that a pod drains right.

Pure functions over plain data: no file, no process, no network. :func:`generate_manifests` takes
:class:`Monitoring` (the SLO spec's scrape job and its rule groups, as ``llmslo.rules`` generates them for
the engine), a :class:`K8sOptions` and a :class:`DrainPlan`, and returns :class:`Manifest` objects (a file
name and one Kubernetes object as a dict); :func:`render_manifests` writes them as one multi-document YAML.

What is generated and why each number is what it is (``docs/kubernetes.md`` says it at length):

* **Deployment** (``sidecar``): the gateway container in front of the engine in the same pod. The engine is a
  native sidecar (an init container with ``restartPolicy: Always``, Kubernetes >= 1.29): Kubernetes then
  stops it only after the gateway has exited, so the engine keeps serving while the gateway drains. In
  ``pool`` mode the gateway is its own Deployment in front of the engine pods' Service.
* **Drain**: the gateway's ``preStop`` sleeps ``unregister_settle_s`` (the pod is being removed from the
  Service's endpoints; it still serves what reaches it), then drains its engine backend through the admin
  API (``llmslo gateway drain``) with ``wait_budget_s``. ``terminationGracePeriodSeconds`` =
  ``ceil(unregister_settle_s + wait_budget_s + exit_margin_s)``; ``wait_budget_s > caller_timeout_s`` is
  refused (the callers give up before the drain does; the rule is :func:`llmslo.analysis.rollout.budget_verdict`).
* **Rolling update**: ``maxSurge = batch_size, maxUnavailable = 0`` (or with ``surge=False``: ``0`` and
  ``batch_size``); a PodDisruptionBudget with ``maxUnavailable = batch_size``. The versions overlap at most
  ``ceil(max_replicas / batch_size) * pod_ready_s + unregister_settle_s + wait_budget_s`` seconds, which must
  not exceed ``max_overlap_window_s`` (:func:`llmslo.analysis.rollout.overlap_verdict`).
* **HPA** (autoscaling/v2) on the gateway's queue, ``llmslo_queued_requests``, through the Prometheus adapter
  (a Pods metric in ``sidecar`` mode, an External metric in ``pool`` mode), with the adapter's rule in a
  ConfigMap: the target is ``scale_up_fraction`` of the queue capacity with a scale-up tolerance of 0, and a
  scale-down tolerance of ``1 - scale_down_fraction / scale_up_fraction``, so the HPA adds pods above half
  the capacity and removes them below a fifth; the stabilisation windows (60 s up, 300 s down) make each
  condition hold for that long first.
* **Monitoring**: a Prometheus scrape configuration (in a ConfigMap), optionally a ServiceMonitor, and a
  PrometheusRule holding the rule groups :mod:`llmslo.rules` generates for the spec and engine.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import yaml

from llmslo import __version__
from llmslo.telemetry import METRICS_BY_KEY, ConfigurationError

__all__ = [
    "DEFAULT_GATEWAY_IMAGE",
    "ENGINE_CONTAINERS",
    "GATEWAY_MODES",
    "QUEUED_SERIES",
    "DrainPlan",
    "EngineContainer",
    "HpaPlan",
    "K8sOptions",
    "Manifest",
    "Monitoring",
    "RollingPlan",
    "generate_manifests",
    "hpa_plan",
    "render_manifest",
    "render_manifests",
    "rolling_plan",
]

GatewayMode = Literal["sidecar", "pool"]
GATEWAY_MODES: tuple[str, ...] = ("sidecar", "pool")
"""``sidecar``: one gateway beside each engine, in its pod; ``pool``: a gateway Deployment in front of the
engine pods' Service."""

DEFAULT_GATEWAY_IMAGE = f"llmslo:{__version__}"
"""The gateway's image when none is given: an image with this llmslo installed (``docs/kubernetes.md`` shows a
two-line Dockerfile); llmslo publishes none."""

QUEUED_SERIES = METRICS_BY_KEY["queued"].name
"""The gateway's queue length (``llmslo_queued_requests``, requests waiting): the HPA's metric."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")
_GPU = "nvidia.com/gpu"
_MODEL = "{model}"
_PORT = "{port}"


@dataclass(frozen=True)
class EngineContainer:
    """How an engine's container starts: ``image`` (a tag of the version its profile was read from),
    ``command`` and ``args`` (``{model}`` and ``{port}`` filled in), ``port`` (TCP), ``metrics_path`` (its
    Prometheus text), ``health_path`` (200 once the model is loaded), ``served_name_flag`` (the flag naming the
    model as clients ask for it; empty when the engine has none), ``gpus`` (``nvidia.com/gpu`` per pod),
    ``slots`` (the sequences it runs at once with these ``args``, when they set it; None: the engine's own
    default, not written here)."""

    image: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    port: int
    metrics_path: str = "/metrics"
    health_path: str = "/health"
    served_name_flag: str = ""
    gpus: int = 1
    slots: int | None = None


ENGINE_CONTAINERS: Mapping[str, EngineContainer] = {
    "vllm": EngineContainer(
        "vllm/vllm-openai:v0.12.0", ("vllm", "serve"), (_MODEL, "--host", "0.0.0.0", "--port", _PORT), 8000,
        served_name_flag="--served-model-name"),
    "sglang": EngineContainer(
        "lmsysorg/sglang:v0.5.0", ("python3", "-m", "sglang.launch_server"),
        ("--model-path", _MODEL, "--host", "0.0.0.0", "--port", _PORT, "--enable-metrics"), 30000,
        served_name_flag="--served-model-name"),
    "tgi": EngineContainer(
        "ghcr.io/huggingface/text-generation-inference:3.3.7", ("text-generation-launcher",),
        ("--model-id", _MODEL, "--hostname", "0.0.0.0", "--port", _PORT), 8000),
    "llamacpp": EngineContainer(
        "ghcr.io/ggml-org/llama.cpp:server-b11434", ("/app/llama-server",),
        ("--model", _MODEL, "--host", "0.0.0.0", "--port", _PORT, "--metrics", "--parallel", "4"), 8000,
        served_name_flag="--alias", gpus=0, slots=4),
    "trtllm": EngineContainer(
        "nvcr.io/nvidia/tensorrt-llm/release:1.1.0", ("trtllm-serve",),
        (_MODEL, "--host", "0.0.0.0", "--port", _PORT), 8000, metrics_path="/prometheus/metrics"),
}
"""Each engine of :data:`llmslo.engines.ENGINES`: its container's defaults (the engine profiles hold metric
names only). Every field can be replaced from the command line."""


@dataclass(frozen=True)
class DrainPlan:
    """The drain of one pod, under the names of the rollout definitions (seconds unless said otherwise).

    ``caller_timeout_s``: the callers' timeout; ``wait_budget_s``: the longest wait for the requests in flight
    (at most ``caller_timeout_s``); ``idle_threshold_s``: a stream idle this long during the drain is closed
    (``None``: never); ``poll_interval_s``: how often Kubernetes polls the gateway's ``/ready`` (the readiness
    probe's period, whole seconds, at least 1); ``unregister_settle_s``: the wait after the pod leaves the
    Service's endpoints, for every proxy to see it; ``max_overlap_window_s``: the longest both versions may
    serve during an update (``None``: unbounded); ``terminate_on_budget``: end what is still running at the
    budget (Kubernetes ends a deleted pod at its grace period whatever happens: ``False`` is refused);
    ``batch_size``: pods replaced at once; ``exit_margin_s``: time left for the processes to exit after the
    drain; ``pod_ready_s``: from a new pod's creation to ready (image pull, model load).
    """

    caller_timeout_s: float = 600.0
    wait_budget_s: float = 120.0
    idle_threshold_s: float | None = 30.0
    poll_interval_s: float = 1.0
    unregister_settle_s: float = 5.0
    max_overlap_window_s: float | None = 1800.0
    terminate_on_budget: bool = True
    batch_size: int = 1
    exit_margin_s: float = 15.0
    pod_ready_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("caller_timeout_s", "wait_budget_s", "poll_interval_s", "exit_margin_s", "pod_ready_s"):
            _positive(name, getattr(self, name))
        _positive("unregister_settle_s", self.unregister_settle_s, zero=True)
        if self.idle_threshold_s is not None:
            _positive("idle_threshold_s", self.idle_threshold_s)
        if self.max_overlap_window_s is not None:
            _positive("max_overlap_window_s", self.max_overlap_window_s)
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigurationError(f"batch_size: must be a whole number >= 1 (pods replaced at once), "
                                     f"got {self.batch_size!r}")
        from llmslo.analysis.rollout import budget_verdict  # the drain's rules: standard library only

        budget = budget_verdict(self.wait_budget_s, self.caller_timeout_s)
        if not budget.holds:
            raise ConfigurationError(f"{budget.message}; {budget.fix} (llmslo drain advise recommends one from the "
                                     "stored request durations)")
        if not self.terminate_on_budget:
            raise ConfigurationError(
                "terminate_on_budget: false cannot hold for a pod Kubernetes deletes (it ends the pod at "
                "terminationGracePeriodSeconds whatever the drain does, and a deleted pod never returns to the "
                "Service); use terminate_on_budget: true, or llmslo gateway drain --on-budget return_to_pool "
                "outside Kubernetes")

    @property
    def grace_period_s(self) -> int:
        """``terminationGracePeriodSeconds``: ``ceil(unregister_settle_s + wait_budget_s + exit_margin_s)``."""
        return math.ceil(self.unregister_settle_s + self.wait_budget_s + self.exit_margin_s)

    @property
    def readiness_period_s(self) -> int:
        """The readiness probe's period: ``poll_interval_s`` rounded up to whole seconds, at least 1."""
        return max(1, math.ceil(self.poll_interval_s))

    def to_dict(self) -> dict[str, object]:
        """The plan's numbers and the grace period derived from them (JSON-ready)."""
        return {"caller_timeout_s": self.caller_timeout_s, "wait_budget_s": self.wait_budget_s,
                "idle_threshold_s": self.idle_threshold_s, "poll_interval_s": self.poll_interval_s,
                "unregister_settle_s": self.unregister_settle_s, "max_overlap_window_s": self.max_overlap_window_s,
                "terminate_on_budget": self.terminate_on_budget, "batch_size": self.batch_size,
                "exit_margin_s": self.exit_margin_s, "pod_ready_s": self.pod_ready_s,
                "termination_grace_period_s": self.grace_period_s}


@dataclass(frozen=True)
class K8sOptions:
    """What the manifests run: ``name`` (a DNS label: the objects' names), ``engine`` (a key of
    :data:`ENGINE_CONTAINERS`), ``gateway`` (:data:`GATEWAY_MODES`), ``model`` (the weights the engine
    loads: a Hugging Face id or a path in the image), the images, ports and replicas. ``None`` for an engine
    field takes :data:`ENGINE_CONTAINERS`' value. ``queue_capacity``: the gateway's ``--max-queue`` (requests
    waiting per model). ``scale_up_fraction`` / ``scale_down_fraction``: of the queue capacity (HPA).
    ``namespace``: ``None`` leaves it to ``kubectl -n``, except where a reference needs it."""

    name: str
    engine: str
    model: str
    gateway: GatewayMode = "sidecar"
    namespace: str | None = None
    engine_image: str | None = None
    engine_port: int | None = None
    engine_args: tuple[str, ...] | None = None
    gpus: int | None = None
    gateway_image: str = DEFAULT_GATEWAY_IMAGE
    gateway_port: int = 8080
    admin_port: int = 8081
    gateway_replicas: int = 2
    version: str | None = None
    min_replicas: int = 2
    max_replicas: int = 4
    surge: bool = True
    queue_capacity: int = 256
    scale_up_fraction: float = 0.5
    scale_down_fraction: float = 0.2
    scale_up_window_s: int = 60
    scale_down_window_s: int = 300
    service_monitor: bool = False
    extra_labels: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not _DNS_LABEL.fullmatch(self.name):
            raise ConfigurationError(
                f"name: {self.name!r} is not a DNS label of at most 40 characters (a-z, 0-9, '-', starting and "
                f"ending with a letter or digit); pass --name, e.g. --name chat")
        if self.namespace is not None and not _DNS_LABEL.fullmatch(self.namespace):
            raise ConfigurationError(f"namespace: {self.namespace!r} is not a DNS label (a-z, 0-9, '-')")
        if self.engine not in ENGINE_CONTAINERS:
            raise ConfigurationError(f"engine: unknown engine {self.engine!r}; known engines: "
                                     f"{', '.join(ENGINE_CONTAINERS)}")
        if self.gateway not in GATEWAY_MODES:
            raise ConfigurationError(f"gateway: {self.gateway!r} is neither sidecar nor pool")
        if not self.model.strip():
            raise ConfigurationError("model: give the weights the engine loads (a Hugging Face id or a path)")
        ports = {"gateway_port": self.gateway_port, "admin_port": self.admin_port, "engine_port": self.port}
        for key, port in ports.items():
            if not 1 <= port <= 65535:
                raise ConfigurationError(f"{key}: must be a TCP port 1-65535, got {port}")
        if len(set(ports.values())) < len(ports):
            raise ConfigurationError(
                f"ports: the gateway ({self.gateway_port}), its admin API ({self.admin_port}) and the engine "
                f"({self.port}) share the pod's network: give each its own port")
        for key in ("min_replicas", "gateway_replicas", "queue_capacity"):
            if getattr(self, key) < 1:
                raise ConfigurationError(f"{key}: must be a whole number >= 1, got {getattr(self, key)}")
        if self.max_replicas < self.min_replicas:
            raise ConfigurationError(f"max_replicas ({self.max_replicas}) is below min_replicas "
                                     f"({self.min_replicas}); raise max_replicas to at least {self.min_replicas}")
        if not 0 < self.scale_down_fraction < self.scale_up_fraction <= 1:
            raise ConfigurationError(
                f"scale_down_fraction ({self.scale_down_fraction:g}) and scale_up_fraction "
                f"({self.scale_up_fraction:g}): need 0 < down < up <= 1 (of the queue capacity), e.g. 0.2 and 0.5")
        if self.scale_up_window_s < 0 or self.scale_down_window_s < 0 or self.scale_down_window_s > 3600:
            raise ConfigurationError("scale_up_window_s and scale_down_window_s: seconds from 0 to 3600")

    @property
    def container(self) -> EngineContainer:
        """The engine's container defaults."""
        return ENGINE_CONTAINERS[self.engine]

    @property
    def port(self) -> int:
        """The engine's TCP port."""
        return self.engine_port if self.engine_port is not None else self.container.port

    @property
    def image(self) -> str:
        """The engine's image."""
        return self.engine_image or self.container.image

    @property
    def app_version(self) -> str:
        """The version the gateway writes into its summaries: ``version``, else the engine image's tag."""
        if self.version:
            return self.version
        tail = self.image.rsplit("/", 1)[-1]
        return tail.split(":", 1)[1] if ":" in tail else "latest"


def _positive(name: str, value: object, *, zero: bool = False) -> float:
    """``value`` as seconds > 0 (>= 0 with ``zero``), finite; else :class:`ConfigurationError` naming ``name``."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value < 0 if zero else value <= 0):  # type: ignore[operator]
        bound = ">= 0" if zero else "> 0"
        raise ConfigurationError(f"{name}: must be a finite number of seconds {bound}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RollingPlan:
    """The Deployment's RollingUpdate and the PodDisruptionBudget, from the batch size.

    ``max_surge`` / ``max_unavailable``: pods; ``steps``: batches an update of ``max_replicas`` pods takes;
    ``overlap_bound_s``: the longest both versions serve (seconds) = ``steps * pod_ready_s +
    unregister_settle_s + wait_budget_s``; ``pdb_max_unavailable``: pods a voluntary disruption (a node
    drain) may take at once."""

    max_surge: int
    max_unavailable: int
    steps: int
    overlap_bound_s: float
    pdb_max_unavailable: int

    def to_dict(self) -> dict[str, object]:
        return {"max_surge": self.max_surge, "max_unavailable": self.max_unavailable, "steps": self.steps,
                "overlap_bound_s": self.overlap_bound_s, "pdb_max_unavailable": self.pdb_max_unavailable}


def _overlap_s(plan: DrainPlan, replicas: int, batch: int) -> float:
    """The overlap bound (seconds) of an update of ``replicas`` pods in batches of ``batch``."""
    return math.ceil(replicas / batch) * plan.pod_ready_s + plan.unregister_settle_s + plan.wait_budget_s


def rolling_plan(plan: DrainPlan, *, min_replicas: int, max_replicas: int, surge: bool = True) -> RollingPlan:
    """The rolling update of ``plan.batch_size`` pods at a time, checked against the overlap window.

    With ``surge`` a batch of new pods starts before the old ones leave (capacity never drops; needs room for
    ``batch_size`` more pods); without, ``batch_size`` old pods leave first (capacity drops by that much, so
    it must stay below ``min_replicas``). Raises :class:`ConfigurationError` naming both numbers and the fix.
    """
    b = plan.batch_size
    if b > max_replicas:
        raise ConfigurationError(f"batch_size ({b}) exceeds max_replicas ({max_replicas}): lower --batch-size "
                                 f"to at most {max_replicas}")
    if not surge and b >= min_replicas:
        raise ConfigurationError(
            f"batch_size ({b}) without surge takes every one of min_replicas ({min_replicas}) pods down at once: "
            f"lower --batch-size to at most {min_replicas - 1}, raise --min-replicas, or allow the surge")
    from llmslo.analysis.rollout import overlap_verdict, part  # the drain's rules: standard library only

    overlap = _overlap_s(plan, max_replicas, b)
    window = plan.max_overlap_window_s
    if window is not None:
        fits = [k for k in range(b + 1, max_replicas + 1) if _overlap_s(plan, max_replicas, k) <= window]
        fix = (f"raise --batch-size to {fits[0]}" if fits
               else "no batch size fits: shorten pod_ready_s or wait_budget_s")
        steps = math.ceil(max_replicas / b)
        verdict = overlap_verdict(
            [(f"ceil({max_replicas} / {b}) batches x pod_ready_s {plan.pod_ready_s:g} s", steps * plan.pod_ready_s),
             part("unregister_settle_s", plan.unregister_settle_s), part("wait_budget_s", plan.wait_budget_s)],
            window, fix=f"{fix}, or raise --max-overlap-window to {math.ceil(overlap)}")
        if not verdict.holds:
            raise ConfigurationError(f"{verdict.message}; {verdict.fix}")
    return RollingPlan(max_surge=b if surge else 0, max_unavailable=0 if surge else b,
                       steps=math.ceil(max_replicas / b), overlap_bound_s=overlap, pdb_max_unavailable=b)


@dataclass(frozen=True)
class HpaPlan:
    """The HPA's numbers: ``metric`` (the series), ``kind`` (``Pods`` or ``External``), ``target`` (requests:
    per pod for ``Pods``, the total over the gateways for ``External``), the tolerances (fractions of the
    target), the stabilisation windows (seconds), and the thresholds as queue lengths per gateway (requests):
    scale up above ``scale_up_above``, down below ``scale_down_below``."""

    metric: str
    kind: Literal["Pods", "External"]
    target: float
    scale_up_tolerance: float
    scale_down_tolerance: float
    scale_up_window_s: int
    scale_down_window_s: int
    scale_up_above: float
    scale_down_below: float
    scale_down_pods: int
    scale_down_period_s: int

    def to_dict(self) -> dict[str, object]:
        return {"metric": self.metric, "kind": self.kind, "target": self.target,
                "scale_up_tolerance": self.scale_up_tolerance, "scale_down_tolerance": self.scale_down_tolerance,
                "scale_up_window_s": self.scale_up_window_s, "scale_down_window_s": self.scale_down_window_s,
                "scale_up_above": self.scale_up_above, "scale_down_below": self.scale_down_below,
                "scale_down_pods": self.scale_down_pods, "scale_down_period_s": self.scale_down_period_s}


def hpa_plan(options: K8sOptions, plan: DrainPlan) -> HpaPlan:
    """The HPA on the gateway's queue length.

    The HPA wants ``ceil(replicas * value / target)`` pods and acts only when ``value / target`` leaves
    ``[1 - down_tolerance, 1 + up_tolerance]``. With ``target = scale_up_fraction * capacity``, an up
    tolerance of 0 and a down tolerance of ``1 - scale_down_fraction / scale_up_fraction`` it scales up above
    ``scale_up_fraction`` of the capacity and down below ``scale_down_fraction`` of it. The stabilisation
    windows make each hold that long (up: the lowest wish of the last 60 s; down: the highest of 300 s).
    Scale-down removes at most ``batch_size`` pods per grace period, so at most one batch drains at a time.
    """
    per_gateway = options.scale_up_fraction * options.queue_capacity
    pool = options.gateway == "pool"
    return HpaPlan(
        metric=QUEUED_SERIES, kind="External" if pool else "Pods",
        target=per_gateway * (options.gateway_replicas if pool else 1),
        scale_up_tolerance=0.0,
        scale_down_tolerance=round(1.0 - options.scale_down_fraction / options.scale_up_fraction, 6),
        scale_up_window_s=options.scale_up_window_s, scale_down_window_s=options.scale_down_window_s,
        scale_up_above=per_gateway, scale_down_below=options.scale_down_fraction * options.queue_capacity,
        scale_down_pods=plan.batch_size, scale_down_period_s=min(1800, plan.grace_period_s))


@dataclass(frozen=True)
class Monitoring:
    """What the monitoring objects hold, from the SLO spec: ``job`` (the Prometheus job its rules select),
    ``interval_s`` (the scrape interval, seconds), ``rule_groups`` (Prometheus rule groups as plain data, the
    ``groups`` of a rule file) and ``served_model`` (the model name clients ask for, the spec's selector
    ``model``; ``None`` when it names none)."""

    job: str
    interval_s: int
    rule_groups: tuple[Mapping[str, object], ...]
    served_model: str | None = None


@dataclass(frozen=True)
class Manifest:
    """One Kubernetes object: ``file`` (its file name), ``body`` (the object as plain data)."""

    file: str
    body: dict[str, object]

    @property
    def kind(self) -> str:
        return str(self.body["kind"])

    @property
    def name(self) -> str:
        meta = self.body["metadata"]
        assert isinstance(meta, dict)
        return str(meta["name"])


def _quantity(value: float) -> str:
    """A Kubernetes quantity for ``value``: a whole number as is, else in thousandths (``12.5`` -> ``12500m``)."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def _seconds_arg(value: float) -> str:
    """A duration option of llmslo (``120s``, ``0.5s``)."""
    return f"{value:g}s"


class _Builder:
    """Builds the objects of one service; each method returns one object's body."""

    def __init__(self, options: K8sOptions, plan: DrainPlan, rolling: RollingPlan, hpa: HpaPlan,
                 monitoring: Monitoring) -> None:
        self.o = options
        self.p = plan
        self.r = rolling
        self.h = hpa
        self.mon = monitoring
        self.gw_name = options.name if options.gateway == "sidecar" else f"{options.name}-gateway"
        self.engine_name = options.name if options.gateway == "sidecar" else f"{options.name}-engine"

    # ---- shared pieces --------------------------------------------------------------------------------------

    def labels(self, component: str, name: str) -> dict[str, str]:
        return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": self.o.name,
                "app.kubernetes.io/component": component, "app.kubernetes.io/managed-by": "llmslo",
                **dict(self.o.extra_labels)}

    def meta(self, name: str, component: str, **extra: object) -> dict[str, object]:
        meta: dict[str, object] = {"name": name, "labels": self.labels(component, name)}
        if self.o.namespace is not None:
            meta["namespace"] = self.o.namespace
        meta.update(extra)
        return meta

    @staticmethod
    def selector(name: str) -> dict[str, object]:
        return {"matchLabels": {"app.kubernetes.io/name": name}}

    def backend_url(self) -> str:
        """The gateway's ``--backend``. In ``sidecar`` mode, with the engine's default arguments, it carries the
        sequences the engine runs at once where those arguments set it (``slots``: the start of the gateway's
        concurrency limit); in ``pool`` mode the backend is a Service over a varying number of pods: no slots."""
        sidecar = self.o.gateway == "sidecar"
        host = "127.0.0.1" if sidecar else self.engine_name
        slots = self.o.container.slots if sidecar and self.o.engine_args is None else None
        return f"engine=http://{host}:{self.o.port}@{self.o.app_version}" + (f",slots={slots}" if slots else "")

    def engine_read(self) -> list[str]:
        """``--engine-metrics ENGINE`` in ``sidecar`` mode, where the engine's Prometheus text is at ``/metrics``:
        the gateway reads its own engine's queue and KV usage (its concurrency limit stops growing while the
        engine queues). Not in ``pool`` mode, where each read would reach another pod behind the Service, nor for
        an engine whose exposition is elsewhere (trtllm-serve's ``/prometheus/metrics``)."""
        if self.o.gateway != "sidecar" or self.o.container.metrics_path != "/metrics":
            return []
        return ["--engine-metrics", self.o.engine]

    def prestop_command(self) -> list[str]:
        """Sleep the settle (the pod leaves the endpoints, still serving), then drain the engine backend."""
        drain = (f"llmslo gateway drain engine --admin http://127.0.0.1:{self.o.admin_port} "
                 f"--budget {_seconds_arg(self.p.wait_budget_s)} --on-budget terminate")
        return ["sh", "-c", f"sleep {self.p.unregister_settle_s:g} && exec {drain}"]

    def gateway_container(self) -> dict[str, object]:
        p = self.p
        args = ["gateway", "--backend", self.backend_url(), *self.engine_read(), "--host", "0.0.0.0",
                "--port", str(self.o.gateway_port), "--admin-port", str(self.o.admin_port),
                "--max-queue", str(self.o.queue_capacity),
                "--request-timeout", _seconds_arg(p.caller_timeout_s),
                "--drain-settle", "0s", "--drain-budget", _seconds_arg(p.wait_budget_s),
                "--drain-idle", _seconds_arg(p.idle_threshold_s) if p.idle_threshold_s is not None else "off",
                "--on-budget", "terminate"]
        return {
            "name": "gateway", "image": self.o.gateway_image, "command": ["llmslo"], "args": args,
            "ports": [{"name": "http", "containerPort": self.o.gateway_port, "protocol": "TCP"}],
            "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": p.readiness_period_s,
                               "failureThreshold": 1, "successThreshold": 1, "timeoutSeconds": 1},
            "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                              "failureThreshold": 3, "timeoutSeconds": 2},
            "lifecycle": {"preStop": {"exec": {"command": self.prestop_command()}}},
            "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        }

    def engine_container(self, *, sidecar: bool) -> dict[str, object]:
        c = self.o.container
        args = list(self.o.engine_args) if self.o.engine_args is not None else [
            a.replace(_MODEL, self.o.model).replace(_PORT, str(self.o.port)) for a in c.args]
        served = self.mon.served_model
        if self.o.engine_args is None and served and c.served_name_flag:
            args += [c.served_name_flag, served]
        gpus = self.o.gpus if self.o.gpus is not None else c.gpus
        period = 5
        container: dict[str, object] = {
            "name": "engine", "image": self.o.image, "command": list(c.command), "args": args,
            "ports": [{"name": "engine", "containerPort": self.o.port, "protocol": "TCP"}],
            "startupProbe": {"httpGet": {"path": c.health_path, "port": "engine"}, "periodSeconds": period,
                             "failureThreshold": max(1, math.ceil(2 * self.p.pod_ready_s / period))},
            "livenessProbe": {"httpGet": {"path": c.health_path, "port": "engine"}, "periodSeconds": 10,
                              "failureThreshold": 6, "timeoutSeconds": 5},
        }
        if gpus > 0:
            container["resources"] = {"limits": {_GPU: str(gpus)}}
        if sidecar:
            container["restartPolicy"] = "Always"  # a native sidecar: stopped after the gateway has exited
        else:
            # pool mode: the gateways reach this pod through its Service; keep serving while the endpoint
            # removal propagates and the requests in flight finish, then take SIGTERM
            container["lifecycle"] = {"preStop": {"sleep": {"seconds": math.ceil(
                self.p.unregister_settle_s + self.p.wait_budget_s)}}}
        return container

    def deployment(self, name: str, component: str, pod_spec: dict[str, object],
                   replicas: int | None) -> dict[str, object]:
        """A Deployment; the engine pods roll by the batch, the gateways of ``pool`` mode one at a time with
        a surge (``replicas``: ``None`` leaves the count to the HPA)."""
        surge, unavailable = (self.r.max_surge, self.r.max_unavailable) if component != "gateway" else (1, 0)
        strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}
        spec: dict[str, object] = {
            "selector": self.selector(name), "strategy": strategy,
            "template": {"metadata": {"labels": self.labels(component, name)}, "spec": pod_spec}}
        if replicas is not None:
            spec = {"replicas": replicas, **spec}
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": self.meta(name, component), "spec": spec}

    def service(self, name: str, component: str, target: str, port: int) -> dict[str, object]:
        return {"apiVersion": "v1", "kind": "Service", "metadata": self.meta(name, component),
                "spec": {"selector": {"app.kubernetes.io/name": name}, "type": "ClusterIP",
                         "ports": [{"name": "http", "port": port, "targetPort": target, "protocol": "TCP"}]}}

    def pdb(self, name: str, component: str, max_unavailable: int) -> dict[str, object]:
        return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": self.meta(name, component),
                "spec": {"maxUnavailable": max_unavailable, "selector": self.selector(name)}}

    # ---- the objects ----------------------------------------------------------------------------------------

    def serving(self) -> list[Manifest]:
        """Deployments, Services and PodDisruptionBudgets of the mode."""
        o, p = self.o, self.p
        if o.gateway == "sidecar":
            pod = {"terminationGracePeriodSeconds": p.grace_period_s,
                   "initContainers": [self.engine_container(sidecar=True)],
                   "containers": [self.gateway_container()]}
            return [Manifest(f"deployment-{o.name}.yaml", self.deployment(o.name, "server", pod, None)),
                    Manifest(f"service-{o.name}.yaml", self.service(o.name, "server", "http", 80)),
                    Manifest(f"poddisruptionbudget-{o.name}.yaml",
                             self.pdb(o.name, "server", self.r.pdb_max_unavailable))]
        engine_pod = {"terminationGracePeriodSeconds": p.grace_period_s,
                      "containers": [self.engine_container(sidecar=False)]}
        gateway_pod = {"terminationGracePeriodSeconds": p.grace_period_s, "containers": [self.gateway_container()]}
        gw, en = self.gw_name, self.engine_name
        return [Manifest(f"deployment-{en}.yaml", self.deployment(en, "engine", engine_pod, None)),
                Manifest(f"service-{en}.yaml", self.service(en, "engine", "engine", o.port)),
                Manifest(f"poddisruptionbudget-{en}.yaml", self.pdb(en, "engine", self.r.pdb_max_unavailable)),
                Manifest(f"deployment-{gw}.yaml", self.deployment(gw, "gateway", gateway_pod, o.gateway_replicas)),
                Manifest(f"service-{gw}.yaml", self.service(gw, "gateway", "http", 80)),
                Manifest(f"poddisruptionbudget-{gw}.yaml", self.pdb(gw, "gateway", 1))]

    def hpa(self) -> Manifest:
        h = self.h
        metric: dict[str, object]
        if h.kind == "Pods":
            metric = {"type": "Pods", "pods": {"metric": {"name": h.metric},
                                               "target": {"type": "AverageValue", "averageValue": _quantity(h.target)}}}
        else:
            metric = {"type": "External", "external": {
                "metric": {"name": h.metric, "selector": {"matchLabels": {"app": self.gw_name}}},
                "target": {"type": "Value", "value": _quantity(h.target)}}}
        behavior = {
            "scaleUp": {"stabilizationWindowSeconds": h.scale_up_window_s,
                        "tolerance": _quantity(h.scale_up_tolerance)},
            "scaleDown": {"stabilizationWindowSeconds": h.scale_down_window_s,
                          "tolerance": _quantity(h.scale_down_tolerance),
                          "policies": [{"type": "Pods", "value": h.scale_down_pods,
                                        "periodSeconds": h.scale_down_period_s}]}}
        body: dict[str, object] = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                "metadata": self.meta(self.engine_name, "autoscaler"),
                "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": self.engine_name},
                         "minReplicas": self.o.min_replicas, "maxReplicas": self.o.max_replicas,
                         "metrics": [metric], "behavior": behavior}}
        return Manifest(f"horizontalpodautoscaler-{self.engine_name}.yaml", body)

    def adapter_rules(self) -> Manifest:
        """The prometheus-adapter configuration serving the HPA's metric (``rules:`` or ``externalRules:``)."""
        queued = QUEUED_SERIES
        if self.h.kind == "Pods":
            config: dict[str, object] = {"rules": [{
                "seriesQuery": f'{queued}{{namespace!="",pod!=""}}',
                "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
                "name": {"matches": f"^{queued}$", "as": queued},
                "metricsQuery": f"sum by (<<.GroupBy>>) ({queued}{{<<.LabelMatchers>>}})"}]}
        else:
            config = {"externalRules": [{
                "seriesQuery": f'{queued}{{namespace!="",app!=""}}',
                "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
                "name": {"matches": f"^{queued}$", "as": queued},
                "metricsQuery": f"sum by (<<.GroupBy>>) ({queued}{{<<.LabelMatchers>>}})"}]}
        name = f"{self.o.name}-prometheus-adapter-rules"
        body: dict[str, object] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": self.meta(name, "monitoring"),
                "data": {"config.yaml": _dump(config)}}
        return Manifest(f"configmap-{name}.yaml", body)

    def scrape_config(self) -> dict[str, object]:
        """A Prometheus scrape configuration (``scrape_configs`` entry) for the gateway and engine containers."""
        sd: dict[str, object] = {"role": "pod"}
        if self.o.namespace is not None:
            sd["namespaces"] = {"names": [self.o.namespace]}
        return {
            "job_name": self.mon.job,
            "scrape_interval": f"{self.mon.interval_s}s",
            "kubernetes_sd_configs": [sd],
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_part_of"],
                 "regex": re.escape(self.o.name), "action": "keep"},
                {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "http|engine",
                 "action": "keep"},
                {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "engine",
                 "target_label": "__metrics_path__", "replacement": self.o.container.metrics_path},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
                {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], "target_label": "app"},
            ]}

    def scrape_configmap(self) -> Manifest:
        name = f"{self.o.name}-prometheus-scrape"
        body: dict[str, object] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": self.meta(name, "monitoring"),
                "data": {"scrape-configs.yaml": _dump({"scrape_configs": [self.scrape_config()]})}}
        return Manifest(f"configmap-{name}.yaml", body)

    def service_monitor(self) -> list[Manifest]:
        """A headless Service publishing both containers' metrics ports, and the ServiceMonitor reading it."""
        o = self.o
        name = f"{o.name}-metrics"
        ports = [{"name": "gateway-metrics", "port": o.gateway_port, "targetPort": o.gateway_port, "protocol": "TCP"}]
        if o.gateway == "sidecar":
            ports.append({"name": "engine-metrics", "port": o.port, "targetPort": o.port, "protocol": "TCP"})
        service: dict[str, object] = {"apiVersion": "v1", "kind": "Service",
                   "metadata": self.meta(name, "monitoring") | {"labels": {
                       **self.labels("monitoring", name), "llmslo.dev/job": self.mon.job}},
                   "spec": {"clusterIP": "None", "selector": {"app.kubernetes.io/part-of": o.name,
                                                              "app.kubernetes.io/name": self.gw_name},
                            "ports": ports}}
        endpoints = [{"port": "gateway-metrics", "path": "/metrics",
                      "interval": f"{self.mon.interval_s}s"}]
        if o.gateway == "sidecar":
            endpoints.append({"port": "engine-metrics", "path": o.container.metrics_path,
                              "interval": f"{self.mon.interval_s}s"})
        monitor: dict[str, object] = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                   "metadata": self.meta(name, "monitoring"),
                   "spec": {"jobLabel": "llmslo.dev/job", "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                            "endpoints": endpoints}}
        out = [Manifest(f"service-{name}.yaml", service), Manifest(f"servicemonitor-{name}.yaml", monitor)]
        if o.gateway == "pool":  # the engine pods' own metrics, through a second headless Service
            en = f"{o.name}-engine-metrics"
            out += [
                Manifest(f"service-{en}.yaml", {
                    "apiVersion": "v1", "kind": "Service",
                    "metadata": self.meta(en, "monitoring") | {"labels": {
                        **self.labels("monitoring", en), "llmslo.dev/job": self.mon.job}},
                    "spec": {"clusterIP": "None", "selector": {"app.kubernetes.io/name": self.engine_name},
                             "ports": [{"name": "engine-metrics", "port": o.port, "targetPort": o.port,
                                        "protocol": "TCP"}]}}),
                Manifest(f"servicemonitor-{en}.yaml", {
                    "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                    "metadata": self.meta(en, "monitoring"),
                    "spec": {"jobLabel": "llmslo.dev/job",
                             "selector": {"matchLabels": {"app.kubernetes.io/name": en}},
                             "endpoints": [{"port": "engine-metrics", "path": o.container.metrics_path,
                                            "interval": f"{self.mon.interval_s}s"}]}})]
        return out

    def prometheus_rule(self) -> Manifest:
        name = f"{self.o.name}-slo-rules"
        groups = [dict(g) for g in self.mon.rule_groups]
        body: dict[str, object] = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
                "metadata": self.meta(name, "monitoring"), "spec": {"groups": groups}}
        return Manifest(f"prometheusrule-{name}.yaml", body)


def generate_manifests(monitoring: Monitoring, options: K8sOptions, plan: DrainPlan) -> list[Manifest]:
    """Every manifest of the service: Deployment(s), Service(s), PodDisruptionBudget(s), the HPA, the adapter's
    rules, the scrape configuration, the ServiceMonitor(s) when asked, and the PrometheusRule.

    ``monitoring``: the spec's scrape job and rule groups (over the engine's own series). Raises
    :class:`ConfigurationError` (the field, the numbers, the fix) when the numbers do not fit together.
    """
    rolling = rolling_plan(plan, min_replicas=options.min_replicas, max_replicas=options.max_replicas,
                           surge=options.surge)
    builder = _Builder(options, plan, rolling, hpa_plan(options, plan), monitoring)
    out = [*builder.serving(), builder.hpa(), builder.adapter_rules(), builder.scrape_configmap()]
    if options.service_monitor:
        out += builder.service_monitor()
    out.append(builder.prometheus_rule())
    files = [m.file for m in out]
    assert len(set(files)) == len(files), files
    return out


def _dump(data: object) -> str:
    """Block-style YAML, keys in insertion order, long lines kept whole."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100_000)


def render_manifest(manifest: Manifest) -> str:
    """One manifest as a YAML document."""
    return _dump(manifest.body)


def render_manifests(manifests: Sequence[Manifest]) -> str:
    """Every manifest in one multi-document YAML text (``kubectl apply -f -`` reads it)."""
    return "".join(f"---\n{render_manifest(m)}" for m in manifests)
