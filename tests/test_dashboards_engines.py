"""Dashboards of an inference engine's own series (``llmslo dashboards generate --engine``): names only from the
engine's profile (or the spec's recording rules, ``ALERTS``, ``up``), only the panels the engine can fill, the
spec's thresholds drawn, and the installed command run from another folder with relative paths. Grafana's types:
``tests/test_dashboards_schema.py``; a real Prometheus: ``tests/test_engines_prometheus.py``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmslo.dashboards import build_dashboards, panel_queries, variable_queries
from llmslo.engines import ENGINES
from llmslo.rules import build_model, load_spec, parse_spec
from llmslo.tests._dashboards import (
    DEFAULT_SPEC,
    EXAMPLE,
    LABEL_VALUES,
    PROMQL_FUNCTIONS,
    engine_generated,
    promql_names,
    recorded_names,
)

ROOT = Path(__file__).resolve().parents[1]
LLMSLO = Path(sys.executable).with_name("llmslo")


def _engine_of(file_name: str) -> str:
    (key,) = [k for k in ENGINES if f"-{k}-" in f"-{file_name}"]
    return key


@pytest.mark.parametrize("name", sorted(engine_generated()))
def test_every_name_an_engine_dashboard_reads_is_the_engines_own(name: str) -> None:
    dashboard = engine_generated()[name]
    profile = ENGINES[_engine_of(name)]
    allowed = {"ALERTS", "up"}
    if "-chat-" in name:
        allowed |= recorded_names(build_model(load_spec(EXAMPLE, engine=True), profile.key))
    else:
        allowed |= recorded_names(build_model(parse_spec(DEFAULT_SPEC)))
    exprs = [q.expr for q in panel_queries(dashboard.data)]
    for variable in variable_queries(dashboard.data):
        match = LABEL_VALUES.match(variable.query)
        assert match is not None, variable.query
        exprs.append(match["series"])
    for expr in exprs:
        series, functions = promql_names(expr)
        foreign = {s for s in series if s not in allowed and profile.by_name(s) is None}
        assert not foreign, (expr, foreign)
        assert functions <= PROMQL_FUNCTIONS, functions - PROMQL_FUNCTIONS
        assert "llmslo_" not in expr.replace("llmslo_service", "").replace("llmslo_slo", ""), expr
    assert not any(q.exemplar for q in panel_queries(dashboard.data))  # engines attach no exemplars


def test_only_the_panels_the_engine_can_fill() -> None:
    llamacpp = {q.panel for q in panel_queries(engine_generated()["llmslo-llamacpp-serving.json"].data)}
    assert llamacpp == {"Tokens per second (throughput)", "Requests running and waiting"}
    vllm = {q.panel for q in panel_queries(engine_generated()["llmslo-vllm-serving.json"].data)}
    assert {"TTFT: distribution", "ITL: p50, p90, p99", "KV-cache usage", "Requests per second"} <= vllm
    tgi = {q.panel for q in panel_queries(engine_generated()["llmslo-tgi-serving.json"].data)}
    assert not any(p.startswith(("TTFT", "ITL")) for p in tgi) and "KV-cache usage" not in tgi
    n_tokens_max = ENGINES["llamacpp"].by_name("llamacpp:n_tokens_max")
    assert n_tokens_max is not None and n_tokens_max.high_water
    for dashboard in engine_generated().values():
        assert not any("n_tokens_max" in q.expr for q in panel_queries(dashboard.data))  # a high-water mark


def test_the_spec_presets_job_and_model_and_draws_its_thresholds() -> None:
    data = engine_generated()["llmslo-chat-vllm-serving.json"].data
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["job"]["current"]["value"] == "chat"
    assert variables["model"]["current"]["value"] == ["chat"]
    assert variables["model"]["query"] == 'label_values(vllm:num_requests_running{job="$job"}, model_name)'
    (tpot,) = [p for p in data["panels"] if p.get("title") == "TPOT: p50, p90, p99"]
    assert [s["value"] for s in tpot["fieldConfig"]["defaults"]["thresholds"]["steps"]][1:] == [0.1]
    assert tpot["targets"][0]["expr"] == (
        'histogram_quantile(0.5, sum by (le) (rate(vllm:request_time_per_output_token_seconds_bucket'
        '{job="$job",model_name=~"$model"}[$__rate_interval])))')
    slo = engine_generated()["llmslo-chat-vllm-slo.json"]
    assert slo.title == "llmslo SLOs: chat (vLLM)"
    assert [p["title"] for p in slo.data["panels"] if p["type"] == "row"] == ["Overview", "tpot: 99% over 30d"]
    tgi = {v["name"] for v in engine_generated()["llmslo-tgi-serving.json"].data["templating"]["list"]}
    assert tgi == {"datasource", "job"}  # no model label on TGI's series


def test_llmslos_own_dashboards_are_unchanged_by_the_engine_path() -> None:
    serving, slo = build_dashboards(build_model(load_spec(EXAMPLE)))
    assert (serving.file_name, slo.file_name) == ("llmslo-chat-serving.json", "llmslo-chat-slo.json")
    assert "vllm" not in serving.text() + slo.text()


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LLMSLO), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_the_installed_command_writes_an_engines_dashboards(tmp_path: Path) -> None:
    (tmp_path / "examples").mkdir()
    for name in ("chat-slo.yaml", "llamacpp-slo.yaml"):
        shutil.copy(ROOT / "examples" / name, tmp_path / "examples" / name)
    out = _run(tmp_path, "dashboards", "generate", "examples/chat-slo.yaml", "--engine", "sglang", "-o", "dash")
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines()[0].startswith("refused: objectives[0] (goodput: goodput) on SGLang: ")
    assert out.stdout.splitlines()[0].startswith(
        "wrote dash/llmslo-chat-sglang-serving.json: llmslo SGLang: chat (")
    assert sorted(p.name for p in (tmp_path / "dash").iterdir()) == [
        "llmslo-chat-sglang-serving.json", "llmslo-chat-sglang-slo.json"]
    refused = _run(tmp_path, "dashboards", "generate", "examples/chat-slo.yaml", "--engine", "llamacpp", "-o", "d2")
    assert refused.returncode == 1 and refused.stderr.startswith(
        "error: examples/chat-slo.yaml: no objective of the spec can be computed from llama.cpp llama-server's own "
        "series:")
    assert not (tmp_path / "d2").exists()
    bare = _run(tmp_path, "dashboards", "generate", "--engine", "llamacpp", "-o", "d3", "--json")
    assert bare.returncode == 0, bare.stderr
    files = json.loads(bare.stdout)["files"]
    assert [f["path"] for f in files] == ["d3/llmslo-llamacpp-serving.json", "d3/llmslo-llamacpp-slo.json"]
    both = _run(tmp_path, "dashboards", "generate", "examples/chat-slo.yaml", "--spec", "examples/chat-slo.yaml",
                "--engine", "vllm", "-o", "d4")
    assert both.returncode == 2 and "give the spec once" in both.stderr
