"""``llmslo k8s generate`` through processes: promtool on the PrometheusRule's groups and the scrape
configuration, and the installed command run from a plain working directory with relative paths."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from llmslo.engines import ENGINES
from llmslo.rules import check_rules, find_promtool
from llmslo.tests._tools import first_line

pytestmark = pytest.mark.slow  # every test starts a process: promtool, or the installed llmslo command

LLMSLO = Path(sys.executable).parent / "llmslo"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def spec_for(engine: str) -> Path:
    return EXAMPLES / ("llamacpp-slo.yaml" if engine in ("llamacpp", "tgi") else "chat-slo.yaml")


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LLMSLO), "k8s", "generate", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, check=False)


def documents(folder: Path) -> dict[str, dict[str, object]]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(folder.glob("*.yaml"))}


def needs_promtool() -> None:
    if find_promtool() is None:
        pytest.skip("promtool not installed: apt-get install prometheus")


def test_the_installed_command_writes_the_manifests_from_a_plain_folder(tmp_path: Path) -> None:
    shutil.copy(spec_for("vllm"), tmp_path / "slo.yaml")
    done = run(tmp_path, "--spec", "slo.yaml", "--engine", "vllm", "--gateway", "pool", "--model", "org/model",
               "--service-monitor", "--out", "k8s")
    assert done.returncode == 0, done.stderr
    written = documents(tmp_path / "k8s")
    assert done.stdout.splitlines()[0] == f"wrote {len(written)} manifests to k8s"
    assert len(written) == 14
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    for name, body in written.items():
        if body["kind"] not in ("PrometheusRule", "ServiceMonitor"):
            kubernetes_validate.validate(body, "1.37.0", strict=True)
        assert name.startswith(str(body["kind"]).lower() + "-")
    assert "terminationGracePeriodSeconds 140 = ceil(unregister_settle_s 5 + wait_budget_s 120 + exit margin 15)" \
        in done.stdout
    # again into the same folder: the files are replaced, nothing else appears
    again = run(tmp_path, "--spec", "slo.yaml", "--engine", "vllm", "--gateway", "pool", "--model", "org/model",
                "--service-monitor", "--out", "k8s", "--wait-budget", "60s")
    assert again.returncode == 0, again.stderr
    after = documents(tmp_path / "k8s")
    assert after.keys() == written.keys()
    deployment = after["deployment-chat-engine.yaml"]
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 80  # type: ignore[index]


def test_standard_output_is_one_multi_document_file(tmp_path: Path) -> None:
    shutil.copy(spec_for("llamacpp"), tmp_path / "slo.yaml")
    done = run(tmp_path, "--spec", "slo.yaml", "--engine", "llamacpp", "--model", "/models/m.gguf")
    assert done.returncode == 0, done.stderr
    docs = list(yaml.safe_load_all(done.stdout))
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler",
                                         "ConfigMap", "ConfigMap", "PrometheusRule"]
    assert "terminationGracePeriodSeconds" in done.stderr  # the explanation goes beside, not into the YAML
    assert list(tmp_path.iterdir()) == [tmp_path / "slo.yaml"]


def test_a_refusal_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    shutil.copy(spec_for("vllm"), tmp_path / "slo.yaml")
    done = run(tmp_path, "--spec", "slo.yaml", "--engine", "vllm", "--model", "m", "--caller-timeout", "60s",
               "--wait-budget", "2m", "--out", "k8s")
    assert done.returncode == 2
    assert "wait_budget_s 120 s exceeds caller_timeout_s 60 s" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slo.yaml"]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_the_prometheus_rule_groups_pass_promtool(engine: str, tmp_path: Path) -> None:
    needs_promtool()
    shutil.copy(spec_for(engine), tmp_path / "slo.yaml")
    done = run(tmp_path, "--spec", "slo.yaml", "--engine", engine, "--model", "m", "--out", "k8s")
    assert done.returncode == 0, done.stderr
    (rule,) = [d for d in documents(tmp_path / "k8s").values() if d["kind"] == "PrometheusRule"]
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))  # type: ignore[index]
    result = check_rules([rules])
    assert result.ok, result.output


@pytest.mark.parametrize("gateway", ["sidecar", "pool"])
def test_the_scrape_configuration_passes_promtool(gateway: str, tmp_path: Path) -> None:
    needs_promtool()
    shutil.copy(spec_for("trtllm"), tmp_path / "slo.yaml")
    done = run(tmp_path, "--spec", "slo.yaml", "--engine", "trtllm", "--gateway", gateway, "--model", "m",
               "--namespace", "inference", "--out", "k8s")
    assert done.returncode == 0, done.stderr
    scrape = documents(tmp_path / "k8s")["configmap-chat-prometheus-scrape.yaml"]
    text = scrape["data"]["scrape-configs.yaml"]  # type: ignore[index]
    (job,) = yaml.safe_load(text)["scrape_configs"]
    # Debian's promtool is built without Kubernetes discovery: check the rest with a static target instead
    sd = job.pop("kubernetes_sd_configs")
    assert sd == [{"role": "pod", "namespaces": {"names": ["inference"]}}]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [job | {"static_configs": [{"targets": ["127.0.0.1:9"]}]}]}))
    assert job["job_name"] == "chat"  # the spec's scrape job: the rules select it
    assert {"target_label": "__metrics_path__", "replacement": "/prometheus/metrics"}.items() <= \
        job["relabel_configs"][2].items()
    checked = subprocess.run([str(find_promtool()), "check", "config", str(config)], capture_output=True,
                             text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(("engine", "gateway"), [("llamacpp", "sidecar"), ("vllm", "sidecar"), ("vllm", "pool"),
                                                 ("trtllm", "sidecar")])
def test_the_gateway_starts_with_the_arguments_the_manifests_give_it(engine: str, gateway: str,
                                                                     tmp_path: Path) -> None:
    """The gateway container's arguments, as written, are accepted by the installed gateway (only its address
    and ports changed, to 127.0.0.1 and free ports): it prints its ready line, and exits 0 on SIGTERM."""
    shutil.copy(spec_for(engine), tmp_path / "slo.yaml")
    done = run(tmp_path, "--spec", "slo.yaml", "--engine", engine, "--gateway", gateway, "--model", "org/model",
               "--out", "k8s")
    assert done.returncode == 0, done.stderr
    (deployment,) = [d for d in documents(tmp_path / "k8s").values()
                     if d["kind"] == "Deployment" and any(c["name"] == "gateway"
                                                          for c in d["spec"]["template"]["spec"]["containers"])]
    (gw,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "gateway"]
    args = list(gw["args"])
    for flag, value in (("--host", "127.0.0.1"), ("--port", "0"), ("--admin-port", "0")):
        args[args.index(flag) + 1] = value
    proc = subprocess.Popen([str(LLMSLO), *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        line = first_line(proc.stdout, 60)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)  # waits, and closes the pipes
    assert line.startswith("gateway on http://127.0.0.1:"), (line, err)
    assert proc.returncode == 0, err

