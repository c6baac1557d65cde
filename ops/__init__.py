"""Running the processes of live runs: real engines (llama.cpp's ``llama-server``), stopped by their process id.

Shared by the demos, the tests and (later) ``llmslo rollout run``; every address is on 127.0.0.1 and every
wait is bounded. Standard library only (PyYAML, to count the rules of a rule file).

* :func:`running_llama_server` starts llama.cpp's ``llama-server`` on a free port with a GGUF model, waits
  for ``/health``, and stops it by its process id on the way out;
* :func:`locate_engine` (:func:`find_llama_server`, :func:`find_model`) says where the binary and the model
  are (the cache that ``.ci/build-llama-server`` fills, or ``LLMSLO_LLAMA_SERVER`` / ``LLMSLO_GGUF``), and
  :class:`EngineNotFound` how to get them;
* :func:`running_prometheus` runs Debian's Prometheus scraping given targets with given rule files, and
  yields once it reports every group and rule of them loaded (:class:`RulesNotLoaded`, with both counts, when
  not: a rule file path it matches nothing for loads nothing, silently); :class:`Prometheus` queries it;
* :func:`free_port` and :func:`stop_process` are the two process primitives every live run uses;
  :func:`pid_listening_on` finds the process behind a port, :func:`pid_alive` whether it still runs;
* :class:`RolloutRunner` runs a rolling update of a pool behind ``llmslo gateway`` (``llmslo rollout run``).
* :func:`run_live`, :func:`run_engine_live` and :func:`run_live_rollout` are the live runs of ``llmslo demo
  --live``, ``--engine llamacpp`` and ``--rollout`` (each into a folder of its own; :class:`LiveRunError` when a
  process does not start or end as it should); :func:`started`, :func:`run_llmslo`, :func:`wait_exits` and
  their kin run the ``llmslo`` commands of those runs.
* :func:`generate_manifests` builds the Kubernetes manifests of ``llmslo k8s generate`` (pure, no I/O).
* :func:`simulate` replays an arrival schedule through simulated engines, the gateway's queue and an HPA-like
  controller under an :class:`AutoscalePolicy` (``llmslo autoscale simulate``; pure, simulated time).
"""

from __future__ import annotations

from llmslo.ops._autoscale import (
    Arrival,
    AutoscalePolicy,
    PolicyError,
    Simulation,
    load_policy,
    read_arrivals,
    simulate,
)
from llmslo.ops._k8s import (
    DEFAULT_GATEWAY_IMAGE,
    ENGINE_CONTAINERS,
    GATEWAY_MODES,
    QUEUED_SERIES,
    DrainPlan,
    EngineContainer,
    HpaPlan,
    K8sOptions,
    Manifest,
    Monitoring,
    RollingPlan,
    generate_manifests,
    hpa_plan,
    render_manifest,
    render_manifests,
    rolling_plan,
)
from llmslo.ops._live import LIVE_SPEC, AlertSpan, LivePlan, LiveRun, PrometheusFacts, run_live
from llmslo.ops._live_engine import ENGINE_COUNTERS, ENGINE_SPEC, EnginePlan, EngineRun, read_counters, run_engine_live
from llmslo.ops._live_processes import (
    CLI_TIMEOUT_S,
    READY_TIMEOUT_S,
    LiveRunError,
    llmslo_command,
    load_started,
    long_stream,
    ready_port,
    run_llmslo,
    started,
    terminate,
    wait_exits,
)
from llmslo.ops._live_rollout import LiveRolloutPlan, LiveRolloutRun, run_live_rollout
from llmslo.ops._llamacpp import (
    LLAMA_SERVER_VERSION,
    MODEL_FILE,
    EngineNotFound,
    LlamaServer,
    engine_cache,
    find_llama_server,
    find_model,
    locate_engine,
    running_llama_server,
)
from llmslo.ops._process import free_port, pid_alive, pid_listening_on, stop_process
from llmslo.ops._prometheus import (
    Prometheus,
    PrometheusError,
    RulesNotLoaded,
    rule_file_counts,
    running_prometheus,
)
from llmslo.ops._rollout_run import (
    DrainParams,
    RolloutError,
    RolloutPlan,
    RolloutResult,
    RolloutRunner,
    VersionSpec,
    load_plan,
    plan_from_dict,
    stop_pid,
)

__all__ = [
    "AlertSpan",
    "Arrival",
    "AutoscalePolicy",
    "CLI_TIMEOUT_S",
    "DEFAULT_GATEWAY_IMAGE",
    "DrainParams",
    "DrainPlan",
    "ENGINE_CONTAINERS",
    "ENGINE_COUNTERS",
    "ENGINE_SPEC",
    "EngineContainer",
    "EngineNotFound",
    "EnginePlan",
    "EngineRun",
    "GATEWAY_MODES",
    "HpaPlan",
    "K8sOptions",
    "LIVE_SPEC",
    "LLAMA_SERVER_VERSION",
    "LivePlan",
    "LiveRolloutPlan",
    "LiveRolloutRun",
    "LiveRun",
    "LiveRunError",
    "LlamaServer",
    "MODEL_FILE",
    "Manifest",
    "Monitoring",
    "PolicyError",
    "Prometheus",
    "PrometheusError",
    "PrometheusFacts",
    "QUEUED_SERIES",
    "READY_TIMEOUT_S",
    "RollingPlan",
    "RolloutError",
    "RolloutPlan",
    "RolloutResult",
    "RolloutRunner",
    "RulesNotLoaded",
    "Simulation",
    "VersionSpec",
    "engine_cache",
    "find_llama_server",
    "find_model",
    "free_port",
    "generate_manifests",
    "hpa_plan",
    "llmslo_command",
    "load_plan",
    "load_policy",
    "load_started",
    "locate_engine",
    "long_stream",
    "pid_alive",
    "pid_listening_on",
    "plan_from_dict",
    "read_arrivals",
    "read_counters",
    "ready_port",
    "render_manifest",
    "render_manifests",
    "rolling_plan",
    "rule_file_counts",
    "run_engine_live",
    "run_live",
    "run_live_rollout",
    "run_llmslo",
    "running_llama_server",
    "running_prometheus",
    "simulate",
    "started",
    "stop_pid",
    "stop_process",
    "terminate",
    "wait_exits",
]
