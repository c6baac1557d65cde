"""``llmslo k8s generate`` and :mod:`llmslo.ops._k8s`: the manifests against Kubernetes' published schemas, the
drain arithmetic, the rolling update from the batch size, the HPA's thresholds, and the refusals.

No process is started here (promtool and the installed command are in ``test_k8s_cli.py``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from llmslo.cli._app import app
from llmslo.engines import ENGINES
from llmslo.ops import (
    ENGINE_CONTAINERS,
    DrainPlan,
    K8sOptions,
    Manifest,
    Monitoring,
    generate_manifests,
    hpa_plan,
    render_manifests,
    rolling_plan,
)
from llmslo.rules import build_model, generate_groups, load_spec
from llmslo.telemetry import METRICS_BY_KEY, ConfigurationError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
K8S_VERSION = "1.37.0"
"""The newest Kubernetes whose schemas kubernetes-validate bundles (1.37)."""
CRD_KINDS = ("PrometheusRule", "ServiceMonitor")
"""Kinds of the Prometheus Operator: kubernetes-validate has no schema for them."""

runner = CliRunner()


def spec_for(engine: str) -> Path:
    """An example spec the engine can give objectives for (llama.cpp and TGI have no usable latency bound)."""
    return EXAMPLES / ("llamacpp-slo.yaml" if engine in ("llamacpp", "tgi") else "chat-slo.yaml")


QUEUED = METRICS_BY_KEY["queued"]


def rules_for(engine: str) -> Monitoring:
    """What ``llmslo k8s generate`` passes on: the example spec's job and its rule groups over ``engine``."""
    model = build_model(load_spec(spec_for(engine), engine=True), engine)
    return Monitoring(job=model.spec.job, interval_s=model.spec.scrape_interval_s,
                      rule_groups=tuple(g.as_dict() for g in generate_groups(model)),
                      served_model=dict(model.spec.selector).get("model"))


def manifests(engine: str = "vllm", gateway: str = "sidecar", plan: DrainPlan | None = None,
              **options: object) -> list[Manifest]:
    opts = K8sOptions(name="chat", engine=engine, model="org/model", gateway=gateway,  # type: ignore[arg-type]
                      **options)  # type: ignore[arg-type]
    return generate_manifests(rules_for(engine), opts, plan or DrainPlan())


def one(found: list[Manifest], kind: str, name: str | None = None) -> dict[str, object]:
    hits = [m.body for m in found if m.kind == kind and (name is None or m.name == name)]
    assert len(hits) == 1, [(m.kind, m.name) for m in found]
    return hits[0]


def pod_spec(deployment: dict[str, object]) -> dict[str, object]:
    return deployment["spec"]["template"]["spec"]  # type: ignore[index,no-any-return]


def container(pod: dict[str, object], name: str) -> dict[str, object]:
    every = [*pod.get("initContainers", []), *pod["containers"]]  # type: ignore[misc]
    (found,) = [c for c in every if c["name"] == name]
    return found  # type: ignore[no-any-return]


# --- the schemas -----------------------------------------------------------------------------------------------


def test_the_container_table_covers_every_engine() -> None:
    assert set(ENGINE_CONTAINERS) == set(ENGINES)


@pytest.mark.parametrize("gateway", ["sidecar", "pool"])
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_manifest_passes_kubernetes_schemas_strictly(engine: str, gateway: str) -> None:
    found = manifests(engine, gateway, service_monitor=True, namespace="inference")
    kinds = {m.kind for m in found}
    assert {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ConfigMap",
            "PrometheusRule", "ServiceMonitor"} <= kinds
    for m in found:
        # the file as written, read back: what kubectl would read
        body = yaml.safe_load(render_manifests([m]).removeprefix("---\n"))
        assert body == m.body
        if m.kind in CRD_KINDS:
            continue
        kubernetes_validate.validate(body, K8S_VERSION, strict=True)


def test_strict_validation_refuses_an_unknown_field() -> None:
    """The check above can fail: a misspelt field is an error under the strict schemas."""
    deployment = one(manifests(), "Deployment")
    container(pod_spec(deployment), "gateway")["readinesProbe"] = {"httpGet": {"path": "/ready", "port": "http"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


@pytest.mark.parametrize("gateway", ["sidecar", "pool"])
def test_the_crds_have_their_minimal_shape(gateway: str) -> None:
    found = manifests("vllm", gateway, service_monitor=True)
    rule = one(found, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    groups = rule["spec"]["groups"]  # type: ignore[index]
    assert groups and all(g["name"] and g["rules"] for g in groups)
    services = {m.name: m.body for m in found if m.kind == "Service"}
    monitors = [m.body for m in found if m.kind == "ServiceMonitor"]
    assert monitors
    for monitor in monitors:
        spec = monitor["spec"]
        (service,) = [s for s in services.values()
                      if spec["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]  # type: ignore
        ports = {p["name"] for p in service["spec"]["ports"]}  # type: ignore[index]
        assert {e["port"] for e in spec["endpoints"]} <= ports  # type: ignore[index]
        assert service["metadata"]["labels"][spec["jobLabel"]] == "chat"  # type: ignore[index]  # the spec's job


def test_the_prometheus_rule_holds_the_rules_of_the_spec_over_the_engine() -> None:
    rule = one(manifests("sglang"), "PrometheusRule")
    text = yaml.safe_dump(rule["spec"])
    assert "sglang:" in text
    model = build_model(load_spec(spec_for("sglang"), engine=True), "sglang")
    assert rule["spec"]["groups"] == [g.as_dict() for g in generate_groups(model)]  # type: ignore[index]


# --- the drain ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("settle", "budget", "margin"), [(5, 120, 15), (0, 30, 5), (2.5, 299.2, 10), (10, 600, 1)])
def test_grace_covers_settle_budget_and_margin(settle: float, budget: float, margin: float) -> None:
    plan = DrainPlan(caller_timeout_s=600, wait_budget_s=budget, unregister_settle_s=settle, exit_margin_s=margin,
                     max_overlap_window_s=None)
    for gateway in ("sidecar", "pool"):
        for m in manifests("vllm", gateway, plan):
            if m.kind != "Deployment":
                continue
            grace = pod_spec(m.body)["terminationGracePeriodSeconds"]
            assert isinstance(grace, int)
            assert settle + budget + margin <= grace < settle + budget + margin + 1


def test_the_gateway_prestop_sleeps_the_settle_then_drains_its_engine_with_the_budget() -> None:
    plan = DrainPlan(caller_timeout_s=300, wait_budget_s=90, unregister_settle_s=7, idle_threshold_s=20)
    gateway = container(pod_spec(one(manifests(plan=plan, admin_port=9091), "Deployment")), "gateway")
    command = gateway["lifecycle"]["preStop"]["exec"]["command"]  # type: ignore[index]
    assert command[:2] == ["sh", "-c"]
    assert command[2] == ("sleep 7 && exec llmslo gateway drain engine --admin http://127.0.0.1:9091 "
                          "--budget 90s --on-budget terminate")
    args = gateway["args"]
    assert isinstance(args, list)
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    assert flags["--drain-budget"] == "90s"
    assert flags["--drain-idle"] == "20s"
    assert flags["--request-timeout"] == "300s"  # the caller's timeout
    assert flags["--drain-settle"] == "0s"  # the settle is the preStop's sleep, not a second wait
    assert flags["--backend"].startswith("engine=http://127.0.0.1:8000@")
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"  # type: ignore[index]


@pytest.mark.parametrize("engine", sorted(ENGINE_CONTAINERS))
def test_a_sidecar_gateway_reads_its_own_engines_metrics_where_they_are_at_slash_metrics(engine: str) -> None:
    args = container(pod_spec(one(manifests(engine), "Deployment")), "gateway")["args"]
    assert isinstance(args, list)
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    if ENGINE_CONTAINERS[engine].metrics_path == "/metrics":
        assert flags["--engine-metrics"] == engine
    else:  # trtllm-serve: its Prometheus text is at /prometheus/metrics, which --engine-metrics does not read
        assert "--engine-metrics" not in flags
    slots = ENGINE_CONTAINERS[engine].slots  # llama-server's --parallel 4, from its default arguments
    if slots is None:
        assert ",slots=" not in flags["--backend"]
    else:
        assert flags["--backend"].endswith(f",slots={slots}")


def test_a_pool_gateway_reads_no_engine_metrics_and_custom_engine_args_give_no_slots() -> None:
    pool = container(pod_spec(one(manifests("llamacpp", "pool"), "Deployment", "chat-gateway")), "gateway")
    assert "--engine-metrics" not in pool["args"] and ",slots=" not in " ".join(pool["args"])  # type: ignore[arg-type]
    custom = manifests("llamacpp", engine_args=("--model", "/m.gguf", "--parallel", "8", "--metrics"))
    args = container(pod_spec(one(custom, "Deployment")), "gateway")["args"]
    assert ",slots=" not in " ".join(args) and "--engine-metrics" in args  # type: ignore[arg-type,operator]


def test_the_engine_is_a_native_sidecar_so_it_stops_after_the_gateway() -> None:
    pod = pod_spec(one(manifests(), "Deployment"))
    (engine,) = pod["initContainers"]  # type: ignore[misc]
    assert engine["name"] == "engine" and engine["restartPolicy"] == "Always"
    assert [c["name"] for c in pod["containers"]] == ["gateway"]  # type: ignore[attr-defined]


def test_pool_engine_pods_keep_serving_through_settle_and_budget() -> None:
    plan = DrainPlan(wait_budget_s=100, unregister_settle_s=4.5)
    found = manifests("vllm", "pool", plan)
    engine = container(pod_spec(one(found, "Deployment", "chat-engine")), "engine")
    assert engine["lifecycle"] == {"preStop": {"sleep": {"seconds": 105}}}
    gateway = container(pod_spec(one(found, "Deployment", "chat-gateway")), "gateway")
    assert "--backend" in gateway["args"]  # type: ignore[operator]
    assert "engine=http://chat-engine:8000@" in " ".join(gateway["args"])  # type: ignore[arg-type]


def test_a_budget_above_the_caller_timeout_is_refused_naming_both() -> None:
    with pytest.raises(ConfigurationError) as caught:
        DrainPlan(caller_timeout_s=300, wait_budget_s=400)
    message = str(caught.value)
    assert "wait_budget_s 400 s exceeds caller_timeout_s 300 s" in message
    assert "lower wait_budget_s to at most 300" in message
    DrainPlan(caller_timeout_s=300, wait_budget_s=300)  # equal is allowed


def test_the_cli_refuses_a_budget_above_the_caller_timeout_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "manifests"
    result = runner.invoke(app, ["k8s", "generate", "--spec", str(spec_for("vllm")), "--engine", "vllm",
                                 "--model", "m", "--caller-timeout", "5m", "--wait-budget", "6m",
                                 "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "wait_budget_s 360 s exceeds caller_timeout_s 300 s" in result.output
    assert list(tmp_path.iterdir()) == []


def test_terminate_on_budget_false_is_refused_with_the_way_out() -> None:
    with pytest.raises(ConfigurationError, match="terminate_on_budget: false"):
        DrainPlan(terminate_on_budget=False)


# --- the rolling update -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_surge_and_unavailable_follow_the_batch_size(batch: int) -> None:
    plan = DrainPlan(batch_size=batch, max_overlap_window_s=None)
    found = manifests(plan=plan, min_replicas=4, max_replicas=6)
    strategy = one(found, "Deployment")["spec"]["strategy"]  # type: ignore[index]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": batch, "maxUnavailable": 0}}
    assert one(found, "PodDisruptionBudget")["spec"]["maxUnavailable"] == batch  # type: ignore[index]
    no_surge = one(manifests(plan=plan, min_replicas=4, max_replicas=6, surge=False), "Deployment")
    assert no_surge["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": batch}  # type: ignore


def test_the_overlap_bound_is_checked_and_the_refusal_names_the_batch_that_fits() -> None:
    plan = DrainPlan(batch_size=1, pod_ready_s=300, unregister_settle_s=5, wait_budget_s=120,
                     max_overlap_window_s=1000)
    with pytest.raises(ConfigurationError) as caught:
        rolling_plan(plan, min_replicas=2, max_replicas=4)
    message = str(caught.value)
    assert "= 1325 s exceeds max_overlap_window_s 1000 s" in message
    assert "raise --batch-size to 2" in message  # ceil(4 / 2) * 300 + 125 = 725 <= 1000
    fitted = rolling_plan(DrainPlan(batch_size=2, pod_ready_s=300, unregister_settle_s=5, wait_budget_s=120,
                                    max_overlap_window_s=1000), min_replicas=2, max_replicas=4)
    assert (fitted.steps, fitted.overlap_bound_s, fitted.max_surge) == (2, 725, 2)


def test_a_batch_without_surge_must_leave_a_pod_serving() -> None:
    with pytest.raises(ConfigurationError, match=r"batch_size \(2\) without surge"):
        rolling_plan(DrainPlan(batch_size=2), min_replicas=2, max_replicas=4, surge=False)


# --- the HPA ------------------------------------------------------------------------------------------------------


def desired(replicas: int, value: float, target: float, up_tolerance: float, down_tolerance: float) -> int:
    """The HPA's wish for a metric value (Kubernetes' algorithm, per direction tolerance)."""
    ratio = value / target
    if 1 - down_tolerance <= ratio <= 1 + up_tolerance:
        return replicas
    return math.ceil(replicas * ratio)


def quantity(text: object) -> float:
    s = str(text)
    return float(s[:-1]) / 1000 if s.endswith("m") else float(s)


@pytest.mark.parametrize("capacity", [256, 100, 7])
def test_the_hpa_scales_up_above_half_the_capacity_and_down_below_a_fifth(capacity: int) -> None:
    hpa = one(manifests(queue_capacity=capacity), "HorizontalPodAutoscaler")["spec"]
    (metric,) = hpa["metrics"]  # type: ignore[index]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == QUEUED.name
    target = quantity(metric["pods"]["target"]["averageValue"])
    behavior = hpa["behavior"]  # type: ignore[index]
    up, down = quantity(behavior["scaleUp"]["tolerance"]), quantity(behavior["scaleDown"]["tolerance"])
    n = 4
    for queue, expect in [(capacity * 0.5 + 0.01, "up"), (capacity * 0.5, "stay"), (capacity * 0.2 + 0.01, "stay"),
                          (capacity * 0.2 - 0.01, "down")]:
        wish = desired(n, queue, target, up, down)
        assert {"up": wish > n, "stay": wish == n, "down": wish < n}[expect], (queue, wish)
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 60  # above half for 1 min
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300  # below a fifth for 5 min


def test_pool_mode_scales_the_engines_on_the_gateways_queue_as_an_external_metric() -> None:
    found = manifests("vllm", "pool", gateway_replicas=3, queue_capacity=100)
    hpa = one(found, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "chat-engine"  # type: ignore[index]
    (metric,) = hpa["metrics"]  # type: ignore[index]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["selector"] == {"matchLabels": {"app": "chat-gateway"}}
    assert quantity(metric["external"]["target"]["value"]) == 3 * 100 * 0.5  # half the capacity of every gateway
    adapter = yaml.safe_load(one(found, "ConfigMap", "chat-prometheus-adapter-rules")["data"]["config.yaml"])  # type: ignore
    (rule,) = adapter["externalRules"]
    assert rule["name"]["as"] == QUEUED.name and QUEUED.name in rule["metricsQuery"]


def test_the_adapter_rule_serves_the_hpa_metric_per_pod() -> None:
    found = manifests()
    adapter = yaml.safe_load(one(found, "ConfigMap", "chat-prometheus-adapter-rules")["data"]["config.yaml"])  # type: ignore
    (rule,) = adapter["rules"]
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert rule["name"]["as"] == QUEUED.name
    plan = hpa_plan(K8sOptions(name="chat", engine="vllm", model="m"), DrainPlan(batch_size=1))
    assert plan.scale_down_pods == 1 and plan.scale_down_period_s == DrainPlan().grace_period_s


# --- bad options ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "needle"), [
    ({"name": "Chat_1"}, "not a DNS label"),
    ({"engine_port": 8080}, "give each its own port"),
    ({"min_replicas": 5, "max_replicas": 3}, "raise max_replicas to at least 5"),
    ({"scale_up_fraction": 0.2, "scale_down_fraction": 0.5}, "need 0 < down < up <= 1"),
])
def test_bad_options_are_refused_naming_the_field(options: dict[str, object], needle: str) -> None:
    fields: dict[str, object] = {"name": "chat", "engine": "vllm", "model": "m"} | options
    with pytest.raises(ConfigurationError, match=needle):
        K8sOptions(**fields)  # type: ignore[arg-type]


def test_the_help_teaches() -> None:
    result = runner.invoke(app, ["k8s", "generate", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for option in ("--caller-timeout", "--wait-budget", "--settle", "--batch-size", "--max-overlap-window",
                   "--engine-image", "--gateway-image", "--out"):
        assert option in result.output


def test_the_rules_read_the_gateways_own_series_unless_asked_for_the_engines(tmp_path: Path) -> None:
    """The gateway in front of every engine serves llmslo's series, so every objective of the spec has a rule;
    over the engine's own series only those the engine supports do, the others refused with the reason."""


    groups = {}
    for rules_on in ("gateway", "engine"):
        out = tmp_path / rules_on
        result = runner.invoke(app, ["k8s", "generate", "--spec", str(spec_for("vllm")), "--engine", "vllm",
                                     "--model", "m", "--rules-on", rules_on, "--out", str(out)])
        assert result.exit_code == 0, result.output
        rule = yaml.safe_load((out / next(f for f in os.listdir(out) if f.startswith("prometheusrule"))).read_text())
        groups[rules_on] = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    own = {r.get("alert") for r in groups["gateway"]} - {None}
    engine = {r.get("alert") for r in groups["engine"]} - {None}
    assert engine < own
    assert any("llmslo_" in r["expr"] for r in groups["gateway"]) and not any("vllm:" in r["expr"]
                                                                              for r in groups["gateway"])
    assert any("vllm:" in r["expr"] for r in groups["engine"])
    bad = runner.invoke(app, ["k8s", "generate", "--spec", str(spec_for("vllm")), "--engine", "vllm", "--model",
                              "m", "--rules-on", "both", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--rules-on: choose gateway or engine, got 'both'" in bad.output
