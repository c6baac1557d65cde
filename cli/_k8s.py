"""``llmslo k8s generate``: Kubernetes manifests for an engine behind the gateway, with the drain's numbers derived.

The manifests come from :func:`llmslo.ops._k8s.generate_manifests`; this module reads the options and the
SLO spec, and writes the files all or nothing (into a temporary folder beside ``--out``, then moved).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmslo.cli._common import EXIT_INPUT, EXIT_USAGE, print_refusals, refusals_json, shown, spec_model
from llmslo.cli._common import console as _console
from llmslo.cli._common import duration as _duration
from llmslo.cli._common import err as _err
from llmslo.cli._common import fail as _fail
from llmslo.cli._help import INFERENCE_ENGINES
from llmslo.telemetry import ConfigurationError

if TYPE_CHECKING:
    from llmslo.ops import DrainPlan, HpaPlan, K8sOptions, Manifest, Monitoring, RollingPlan
    from llmslo.rules import Model

__all__ = ["k8s_app"]

k8s_app = typer.Typer(
    name="k8s",
    help=(
        "Kubernetes manifests behind llmslo gateway that drain right. For an inference engine: the "
        "Deployment(s) and Services, readiness on the gateway's /ready, a preStop hook that drains through the "
        "gateway's admin API, terminationGracePeriodSeconds = settle + wait budget + exit margin, a "
        "PodDisruptionBudget and a rolling update by the batch size, an HPA on the gateway's queue through the "
        "Prometheus adapter (with the adapter's rule), the scrape configuration and a PrometheusRule.\n\n"
        "Start with: llmslo k8s generate --spec examples/chat-slo.yaml --engine vllm --model "
        "Qwen/Qwen2.5-0.5B-Instruct --out k8s/\n\n"
        "docs/kubernetes.md says why each number is what it is, and how to apply and check the files."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

OFF = "off"


def _seconds(option: str, text: str, *, zero: bool = False, off: bool = False) -> float | None:
    """Seconds from a duration option (``120s``, ``2m``); ``0`` with ``zero``, ``off`` (None) with ``off``.
    A bad value exits 2 naming the option."""
    value = text.strip()
    if off and value == OFF:
        return None
    if zero and value in ("0", "0s"):
        return 0.0
    return _duration(option, value)


def _required(option: str, text: str, *, zero: bool = False) -> float:
    value = _seconds(option, text, zero=zero)
    assert value is not None
    return value


def _fraction(option: str, value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise _fail(f"--{option}: a fraction of the queue capacity in (0, 1], got {value:g}", EXIT_USAGE)
    return value


def _write(out: Path, files: list[tuple[str, str]]) -> None:
    """Write ``files`` (name, text) into folder ``out``: all into a temporary folder beside it first, then
    moved in, so that an error leaves nothing half-written. Exits 1 naming the path on an OS error."""
    if out.exists() and not out.is_dir():
        raise _fail(f"--out: {out} exists and is not a folder; give a folder (or - for standard output)",
                    EXIT_INPUT)
    parent = out.parent
    tmp: Path | None = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
        mask = os.umask(0)
        os.umask(mask)
        tmp.chmod(0o777 & ~mask)  # mkdtemp makes it 0700; the folder it becomes is an ordinary one
        for name, text in files:
            (tmp / name).write_text(text, encoding="utf-8")
        if not out.exists():
            tmp.rename(out)
            tmp = None
            return
        for name, _ in files:
            os.replace(tmp / name, out / name)
    except OSError as exc:
        raise _fail(f"cannot write {out}: {exc.strerror or exc}", EXIT_INPUT) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _explain(plan: DrainPlan, rolling: RollingPlan, hpa: HpaPlan, options: K8sOptions) -> list[str]:
    """The derived numbers, one line each, with the inputs they come from."""
    p = plan
    window = (f" <= max_overlap_window_s {p.max_overlap_window_s:g} s" if p.max_overlap_window_s is not None
              else " (max_overlap_window_s off)")
    where = "per pod" if hpa.kind == "Pods" else f"over {options.gateway_replicas} gateways"
    return [
        f"drain: terminationGracePeriodSeconds {p.grace_period_s} = ceil(unregister_settle_s "
        f"{p.unregister_settle_s:g} + wait_budget_s {p.wait_budget_s:g} + exit margin {p.exit_margin_s:g}); "
        f"wait_budget_s {p.wait_budget_s:g} <= caller_timeout_s {p.caller_timeout_s:g}",
        f"rolling update: maxSurge {rolling.max_surge}, maxUnavailable {rolling.max_unavailable} (batch size "
        f"{p.batch_size}); PodDisruptionBudget maxUnavailable {rolling.pdb_max_unavailable}; versions overlap at "
        f"most {rolling.overlap_bound_s:g} s = {rolling.steps} batches x pod_ready_s {p.pod_ready_s:g} + "
        f"{p.unregister_settle_s:g} + {p.wait_budget_s:g}{window}",
        f"hpa: {hpa.metric} ({hpa.kind} metric), target {hpa.target:g} {where}; scale up above "
        f"{hpa.scale_up_above:g} queued per gateway for {hpa.scale_up_window_s} s, down below "
        f"{hpa.scale_down_below:g} for {hpa.scale_down_window_s} s (queue capacity {options.queue_capacity}); "
        f"at most {hpa.scale_down_pods} pod(s) removed per {hpa.scale_down_period_s} s",
    ]


@k8s_app.command()
def generate(
    spec: Annotated[Path, typer.Option(
        "--spec", help="SLO spec (YAML, version: llmslo/v1): its rules go into the PrometheusRule, its scrape job "
        "and interval into the scrape configuration.", show_default=False)],
    engine: Annotated[str, typer.Option(
        "--engine", help=f"The inference engine: {', '.join(INFERENCE_ENGINES)}.", show_default=False)],
    model: Annotated[str, typer.Option(
        "--model", help="The weights the engine loads: a Hugging Face id, or a path inside the image (a GGUF "
        "file for llamacpp).", show_default=False)],
    gateway: Annotated[str, typer.Option(
        "--gateway", help="sidecar: a gateway in each engine pod; pool: a gateway Deployment in front of the "
        "engine pods' Service.")] = "sidecar",
    out: Annotated[str, typer.Option(
        "--out", help="Folder to write one YAML file per manifest into (created; files of the same name "
        "replaced); - writes one multi-document YAML to standard output.")] = "-",
    name: Annotated[str | None, typer.Option(
        "--name", help="Name of the objects (a DNS label; default: the spec's service).", show_default=False)]
        = None,
    namespace: Annotated[str | None, typer.Option(
        "--namespace", help="Namespace written into the objects (default: none, kubectl -n decides).",
        show_default=False)] = None,
    engine_image: Annotated[str | None, typer.Option(
        "--engine-image", help="The engine's image (default: the engine's release its profile was read from, "
        "e.g. vllm/vllm-openai:v0.12.0; docs/kubernetes.md lists them).", show_default=False)] = None,
    engine_port: Annotated[int | None, typer.Option(
        "--engine-port", help="The engine's port (default: per engine, 30000 for sglang, else 8000).",
        show_default=False)] = None,
    engine_arg: Annotated[list[str] | None, typer.Option(
        "--engine-arg", help="An argument of the engine, repeated in order; replaces the default arguments "
        "(model, host, port, metrics and served-name flags).", show_default=False)] = None,
    gpus: Annotated[int | None, typer.Option(
        "--gpus", help="nvidia.com/gpu per engine pod (default: 1, 0 for llamacpp).", show_default=False)] = None,
    gateway_image: Annotated[str | None, typer.Option(
        "--gateway-image", help="The gateway's image: llmslo installed (default: llmslo:VERSION, which you "
        "build; docs/kubernetes.md).", show_default=False)] = None,
    gateway_port: Annotated[int, typer.Option("--gateway-port", help="The gateway's port.")] = 8080,
    admin_port: Annotated[int, typer.Option(
        "--admin-port", help="The gateway's admin API port (127.0.0.1 in the pod; the preStop hook uses it).")]
        = 8081,
    gateway_replicas: Annotated[int, typer.Option(
        "--gateway-replicas", help="Gateway pods in pool mode.")] = 2,
    version: Annotated[str | None, typer.Option(
        "--version", help="The version written into the request summaries (default: the engine image's tag).",
        show_default=False)] = None,
    min_replicas: Annotated[int, typer.Option("--min-replicas", help="The HPA's fewest engine pods.")] = 2,
    max_replicas: Annotated[int, typer.Option("--max-replicas", help="The HPA's most engine pods.")] = 4,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", help="Pods replaced at once in an update (maxSurge) and taken at once by a node drain "
        "(the PodDisruptionBudget).")] = 1,
    no_surge: Annotated[bool, typer.Option(
        "--no-surge", help="No spare room for new pods: replace old ones first (maxSurge 0, maxUnavailable = "
        "batch size).")] = False,
    queue_capacity: Annotated[int, typer.Option(
        "--queue-capacity", help="The gateway's --max-queue: requests waiting per model (the HPA's capacity).")]
        = 256,
    scale_up_at: Annotated[float, typer.Option(
        "--scale-up-at", help="Scale up when the average queue is above this fraction of the capacity.")] = 0.5,
    scale_down_at: Annotated[float, typer.Option(
        "--scale-down-at", help="Scale down when it is below this fraction.")] = 0.2,
    scale_up_window: Annotated[str, typer.Option(
        "--scale-up-window", help="How long the queue must stay high before a scale-up.")] = "1m",
    scale_down_window: Annotated[str, typer.Option(
        "--scale-down-window", help="How long it must stay low before a scale-down.")] = "5m",
    caller_timeout: Annotated[str, typer.Option(
        "--caller-timeout", help="caller_timeout_s: the callers' timeout (also the gateway's --request-timeout).")]
        = "10m",
    wait_budget: Annotated[str, typer.Option(
        "--wait-budget", help="wait_budget_s: the longest wait for requests in flight (at most the caller "
        "timeout; llmslo drain advise recommends one).")] = "120s",
    idle_threshold: Annotated[str, typer.Option(
        "--idle-threshold", help="idle_threshold_s: close a stream idle this long during the drain; 'off' never.")]
        = "30s",
    poll_interval: Annotated[str, typer.Option(
        "--poll-interval", help="poll_interval_s: the readiness probe's period on /ready (whole seconds).")] = "1s",
    settle: Annotated[str, typer.Option(
        "--settle", help="unregister_settle_s: after the pod leaves the Service, wait this long (still serving) "
        "for every proxy to see it.")] = "5s",
    max_overlap_window: Annotated[str, typer.Option(
        "--max-overlap-window", help="max_overlap_window_s: the longest both versions may serve during an "
        "update; 'off' no bound.")] = "30m",
    no_terminate_on_budget: Annotated[bool, typer.Option(
        "--no-terminate-on-budget",
        help="terminate_on_budget: false. Refused: a deleted pod cannot go back to the pool, so at the budget "
        "the drain ends what still runs (terminate_on_budget: true, the default).")] = False,
    exit_margin: Annotated[str, typer.Option(
        "--exit-margin", help="Time left for the processes to exit after the drain.")] = "15s",
    pod_ready: Annotated[str, typer.Option(
        "--pod-ready", help="pod_ready_s: a new pod's time to ready (image pull, model load); bounds the "
        "overlap and the startup probe.")] = "5m",
    rules_on: Annotated[str, typer.Option(
        "--rules-on", help="gateway: the PrometheusRule reads llmslo's own series, which the gateway in front of "
        "every engine serves (every objective of the spec computable); engine: it reads the engine's own series "
        "(llmslo rules generate --engine; objectives the engine cannot support are refused).")] = "gateway",
    service_monitor: Annotated[bool, typer.Option(
        "--service-monitor", help="Also write ServiceMonitors (Prometheus Operator) and the headless Services "
        "they read.")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print one JSON object: the files, the derived numbers, the refused spec entries "
        "(needs --out DIR).")] = False,
) -> None:
    """Write the manifests of ENGINE behind the gateway for the SLO spec: validated offline, drained right.

    Every number that must fit with another is checked first (wait budget <= caller timeout, the overlap of
    versions against --max-overlap-window, the batch size against the replicas), and a misfit exits 2 naming
    both numbers and the fix; nothing is written then. The files are written into a temporary folder beside
    --out and moved in, so an error leaves none half-written. Prints 'wrote N manifests to DIR', the files,
    and how each derived number came about. Check them with kubectl apply --dry-run=server -f DIR.
    """
    from llmslo.ops import (
        DEFAULT_GATEWAY_IMAGE,
        GATEWAY_MODES,
        DrainPlan,
        K8sOptions,
        generate_manifests,
        hpa_plan,
        render_manifest,
        render_manifests,
        rolling_plan,
    )

    if gateway not in GATEWAY_MODES:
        raise _fail(f"--gateway: sidecar or pool, got {gateway!r}", EXIT_USAGE)
    if engine not in INFERENCE_ENGINES:
        raise _fail(f"--engine: unknown engine {engine!r}; known engines: {', '.join(INFERENCE_ENGINES)}",
                    EXIT_USAGE)
    if as_json and out == "-":
        raise _fail("--json prints the report on standard output: give --out DIR for the manifests", EXIT_USAGE)
    overlap = _seconds("max-overlap-window", max_overlap_window, off=True)
    try:
        plan = DrainPlan(
            caller_timeout_s=_required("caller-timeout", caller_timeout),
            wait_budget_s=_required("wait-budget", wait_budget),
            idle_threshold_s=_seconds("idle-threshold", idle_threshold, off=True),
            poll_interval_s=_required("poll-interval", poll_interval),
            unregister_settle_s=_required("settle", settle, zero=True),
            max_overlap_window_s=overlap, terminate_on_budget=not no_terminate_on_budget, batch_size=batch_size,
            exit_margin_s=_required("exit-margin", exit_margin), pod_ready_s=_required("pod-ready", pod_ready))
    except ConfigurationError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    if rules_on not in ("gateway", "engine"):
        raise _fail(f"--rules-on: choose gateway or engine, got {rules_on!r}", EXIT_USAGE)
    rules = spec_model(spec, engine if rules_on == "engine" else None)
    try:
        options = K8sOptions(
            name=name or rules.spec.service, engine=engine, model=model, gateway=gateway,  # type: ignore[arg-type]
            namespace=namespace, engine_image=engine_image, engine_port=engine_port,
            engine_args=tuple(engine_arg) if engine_arg else None, gpus=gpus,
            gateway_image=gateway_image or DEFAULT_GATEWAY_IMAGE, gateway_port=gateway_port, admin_port=admin_port,
            gateway_replicas=gateway_replicas, version=version, min_replicas=min_replicas,
            max_replicas=max_replicas, surge=not no_surge, queue_capacity=queue_capacity,
            scale_up_fraction=_fraction("scale-up-at", scale_up_at),
            scale_down_fraction=_fraction("scale-down-at", scale_down_at),
            scale_up_window_s=round(_required("scale-up-window", scale_up_window, zero=True)),
            scale_down_window_s=round(_required("scale-down-window", scale_down_window, zero=True)),
            service_monitor=service_monitor)
        manifests = generate_manifests(_monitoring(rules), options, plan)
        rolling = rolling_plan(plan, min_replicas=min_replicas, max_replicas=max_replicas, surge=not no_surge)
    except ConfigurationError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    hpa = hpa_plan(options, plan)
    print_refusals(rules)
    lines = _explain(plan, rolling, hpa, options)
    if out == "-":
        sys.stdout.write(render_manifests(manifests))
        for line in lines:
            _err().print(shown(line), highlight=False, soft_wrap=True)
        return
    folder = Path(out)
    _write(folder, [(m.file, render_manifest(m)) for m in manifests])
    if as_json:
        print(json.dumps({"out": str(folder), "manifests": [_entry(m, folder) for m in manifests],
                          "drain": plan.to_dict(), "rolling_update": rolling.to_dict(), "hpa": hpa.to_dict(),
                          "engine": engine, "gateway": gateway, "refused": refusals_json(rules)}, indent=2))
        return
    console = _console()
    console.print(shown(f"wrote {len(manifests)} manifests to {folder}"), highlight=False, soft_wrap=True)
    for m in manifests:
        console.print(shown(f"  {folder / m.file}: {m.kind} {m.name}"), highlight=False, soft_wrap=True)
    for line in lines:
        console.print(shown(line), highlight=False, soft_wrap=True)
    console.print(shown(f"check them: kubectl apply --dry-run=server -f {folder}"), highlight=False, soft_wrap=True)


def _monitoring(rules: Model) -> Monitoring:
    """The spec's scrape job and interval, its rule groups over the engine, and the model clients ask for."""
    from llmslo.ops import Monitoring
    from llmslo.rules import generate_groups

    spec = rules.spec
    return Monitoring(job=spec.job, interval_s=spec.scrape_interval_s,
                      rule_groups=tuple(g.as_dict() for g in generate_groups(rules)),
                      served_model=dict(spec.selector).get("model"))


def _entry(manifest: Manifest, folder: Path) -> dict[str, str]:
    return {"file": str(folder / manifest.file), "kind": manifest.kind, "name": manifest.name}
