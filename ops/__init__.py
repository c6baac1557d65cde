"""Running the processes of live runs: real engines (llama.cpp's ``llama-server``), stopped by their process id.

Shared by the demos, the tests and (later) ``llmslo rollout run``; every address is on 127.0.0.1 and every
wait is bounded. Standard library only (PyYAML, to count the rules of a rule file).

* :func:`running_llama_server` starts llama.cpp's ``llama-server`` on a free port with a GGUF model, waits
  for ``/health``, and stops it by its process id on the way out;
* :func:`locate_engine` (:func:`find_llama_server`, :func:`find_model`) says where the binary and the model
  are (the cache that ``.ci/build-llama-server`` fills, or ``LLMSLO_LLAMA_SERVER`` / ``LLMSLO_MODEL``), and
  :class:`EngineNotFound` how to get them;
* :func:`running_prometheus` runs Debian's Prometheus scraping given targets with given rule files, and
  yields once it reports every group and rule of them loaded (:class:`RulesNotLoaded`, with both counts, when
  not: a rule file path it matches nothing for loads nothing, silently); :class:`Prometheus` queries it;
* :func:`free_port` and :func:`stop_process` are the two process primitives every live run uses;
  :func:`pid_listening_on` finds the process behind a port, :func:`pid_alive` whether it still runs;
* :class:`RolloutRunner` runs a rolling update of a pool behind ``llmslo gateway`` (``llmslo rollout run``).
* :func:`generate_manifests` builds the Kubernetes manifests of ``llmslo k8s generate`` (pure, no I/O).
"""

from __future__ import annotations

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
)

__all__ = [
    "DEFAULT_GATEWAY_IMAGE",
    "DrainParams",
    "DrainPlan",
    "ENGINE_CONTAINERS",
    "EngineContainer",
    "EngineNotFound",
    "GATEWAY_MODES",
    "HpaPlan",
    "K8sOptions",
    "LLAMA_SERVER_VERSION",
    "LlamaServer",
    "MODEL_FILE",
    "Manifest",
    "Monitoring",
    "Prometheus",
    "PrometheusError",
    "QUEUED_SERIES",
    "RollingPlan",
    "RolloutError",
    "RolloutPlan",
    "RolloutResult",
    "RolloutRunner",
    "RulesNotLoaded",
    "VersionSpec",
    "engine_cache",
    "find_llama_server",
    "find_model",
    "free_port",
    "generate_manifests",
    "hpa_plan",
    "load_plan",
    "locate_engine",
    "pid_alive",
    "pid_listening_on",
    "plan_from_dict",
    "render_manifest",
    "render_manifests",
    "rolling_plan",
    "rule_file_counts",
    "running_llama_server",
    "running_prometheus",
    "stop_process",
]
