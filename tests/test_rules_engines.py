"""Rules over an inference engine's own series (``llmslo rules generate --engine``): what each engine can and
cannot alert on, the refusals (which entry, which engine, why, the way out), promtool's proof of every engine's
rules, and the installed command run from another folder with relative paths."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmslo.cli._help import INFERENCE_ENGINES
from llmslo.engines import ENGINES
from llmslo.rules import (
    EngineSupportError,
    SpecError,
    build_model,
    check_rules,
    generate_groups,
    load_spec,
    parse_spec,
    render,
    run_rule_tests,
)
from llmslo.tests._dashboards import promql_names
from llmslo.tests._engine_specs import engine_spec
from llmslo.tests._tools import require_tool

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CHAT, LIVE, LLAMACPP = EXAMPLES / "chat-slo.yaml", EXAMPLES / "live-slo.yaml", EXAMPLES / "llamacpp-slo.yaml"
LLMSLO = Path(sys.executable).with_name("llmslo")
"""The installed command (the virtual environment's console script)."""
FRONT = "put llmslo gateway in front of the engine"


def _model(path: Path, engine: str) -> Any:
    return build_model(load_spec(path, engine=True), engine)


def _spec(objectives: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"version": "llmslo/v1", "service": "svc", "scrape": {"job": "engine"}, "objectives": objectives,
            **extra}


def test_the_help_copy_of_the_engine_keys_is_the_profiles_own() -> None:
    assert tuple(ENGINES) == INFERENCE_ENGINES


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_goodput_is_refused_on_every_engine_with_the_reason_and_the_way_out(engine: str) -> None:
    spec = parse_spec(_spec([{"name": "goodput", "kind": "goodput", "objective": 99},
                             {"name": "waiting", "kind": "saturation", "metric": "waiting", "threshold": 8,
                              "objective": 99}]), engine=True)
    model = build_model(spec, engine)
    assert [s.name for s in model.slos] == ["waiting"]
    (refusal,) = [r for r in model.refused if r.path.startswith("objectives")]
    message = refusal.message()
    assert message.startswith(f"objectives[0] (goodput: goodput) on {ENGINES[engine].name}: ")
    assert "goodput policy" in refusal.reason and FRONT in refusal.fix and "llmslo's middleware inside" in refusal.fix


@pytest.mark.parametrize(("engine", "why"), [("tgi", "no time-to-first-token histogram"),
                                             ("llamacpp", "no latency histogram")])
def test_a_ttft_slo_on_an_engine_without_its_histogram_is_refused(engine: str, why: str) -> None:
    spec = parse_spec(_spec([{"name": "ttft", "kind": "latency", "metric": "ttft", "threshold": "1s",
                              "objective": 99}]), engine=True)
    with pytest.raises(EngineSupportError) as caught:
        build_model(spec, engine)
    text = str(caught.value)
    assert f"no objective of the spec can be computed from {ENGINES[engine].name}'s own series" in text
    assert f"objectives[0] (ttft: latency ttft <= 1s) on {ENGINES[engine].name}: {why}" in text
    assert "Way out: observe each request's stream instead" in text and "put llmslo gateway in front of" in text


def test_on_llamacpp_only_what_its_counters_and_gauges_allow_is_generated() -> None:
    spec = parse_spec(_spec([
        {"name": "ttft", "kind": "latency", "metric": "ttft", "threshold": "1s", "objective": 99},
        {"name": "errors", "kind": "availability", "objective": 99},
        {"name": "deferred", "kind": "saturation", "metric": "waiting", "threshold": 2, "objective": 99},
        {"name": "kv", "kind": "saturation", "metric": "kv_usage", "threshold": "90%", "objective": 99},
    ]), engine=True)
    model = build_model(spec, "llamacpp")
    assert [s.name for s in model.slos] == ["deferred"]
    refused = {r.path: r for r in model.refused}
    assert "no latency histogram" in refused["objectives[0]"].reason
    assert "no request counter" in refused["objectives[1]"].reason
    assert "KV-cache" in refused["objectives[3]"].reason
    exprs = [r.expr for g in generate_groups(model) for r in g.rules]
    assert exprs[0] == 'max(llamacpp:requests_deferred{job="engine"}) > bool 2'


def test_a_latency_threshold_must_be_one_of_the_engines_own_bounds() -> None:
    model = _model(CHAT, "vllm")
    (ttft,) = [r for r in model.refused if r.path == "objectives[1]"]
    assert "2s is not a bucket bound of vllm:time_to_first_token_seconds" in ttft.reason
    assert "nearest bounds: 1s and 2.5s" in ttft.reason and "2.5" in ttft.fix
    spec = parse_spec(_spec([{"name": "ttft", "kind": "latency", "metric": "ttft", "threshold": "2.5s",
                              "objective": 99}]), engine=True)
    assert [s.sli.threshold for s in build_model(spec, "vllm").slos if s.sli] == [2.5]
    with pytest.raises(SpecError, match=r"objectives\[0\]\.threshold: 2.5s is not a bucket bound of llmslo_ttft"):
        parse_spec(_spec([{"name": "ttft", "kind": "latency", "metric": "ttft", "threshold": "2.5s",
                           "objective": 99}]))  # without an engine, llmslo's own bounds


def test_selector_labels_are_mapped_to_the_engines_or_refused() -> None:
    objective = {"name": "tpot", "kind": "latency", "metric": "tpot", "threshold": "100ms", "objective": 99}
    vllm = build_model(parse_spec(_spec([objective], selector={"model": "chat"}), engine=True), "vllm")
    (slo,) = vllm.slos
    assert slo.sli is not None and ("model_name", "=", "chat") in slo.sli.matchers
    assert ("job", "=", "engine") in slo.sli.matchers
    scoped = {**objective, "selector": {"slo_class": "interactive"}}
    with pytest.raises(EngineSupportError, match="carries no slo_class label"):
        build_model(parse_spec(_spec([scoped]), engine=True), "vllm")
    saturation = {"name": "q", "kind": "saturation", "metric": "waiting", "threshold": 1, "objective": 99}
    tgi = build_model(parse_spec(_spec([saturation], selector={"model": "chat"}), engine=True), "tgi")
    (slo,) = tgi.slos
    assert slo.sli is not None and slo.sli.matchers == (("job", "=", "engine"),)
    assert "carries no model label" in slo.sli.notes[0]
    assert "carries no model label" in dict(generate_groups(tgi)[0].rules[-2].annotations)["definition"]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_engine_rules_read_only_the_engines_own_series(engine: str) -> None:
    model = build_model(parse_spec(engine_spec(engine, job="engine"), engine=True), engine)
    profile = ENGINES[engine]
    for group in generate_groups(model):
        for rule in group.rules:
            names, _ = promql_names(rule.expr)
            foreign = {n for n in names if not n.startswith("llmslo:") and n != "up" and profile.by_name(n) is None}
            assert not foreign, (rule.record or rule.alert, foreign)
            assert "llmslo_" not in re.sub(r"llmslo_(service|slo)=", "", rule.expr), rule.expr


def test_saturation_without_an_engine_reads_llmslos_own_gauges() -> None:
    objective = {"name": "q", "kind": "saturation", "metric": "waiting", "threshold": 8, "objective": 99}
    model = build_model(parse_spec(_spec([objective], selector={"model": "chat"})))
    rules = generate_groups(model)[0].rules
    assert rules[0].expr == 'max(llmslo_queued_requests{model="chat"}) > bool 8'
    assert rules[1].expr.startswith("avg_over_time(llmslo:slo_error:ratio_rate1m{")
    kv = {**objective, "metric": "kv_usage", "threshold": 0.9}
    with pytest.raises(SpecError, match=r"objectives\[0\]\.metric: llmslo's telemetry exports no kv_usage gauge"):
        build_model(parse_spec(_spec([kv])))
    with pytest.raises(SpecError, match=r"objectives\[0\]\.threshold: must be a whole number of requests"):
        parse_spec(_spec([{**objective, "threshold": 1.5}]))


def test_an_unknown_engine_names_the_known_ones() -> None:
    with pytest.raises(SpecError, match="unknown engine 'vllm2': known engines are"):
        build_model(parse_spec(_spec([{"name": "a", "kind": "availability", "objective": 99}])), "vllm2")


@pytest.mark.parametrize(("path", "engine", "kept"), [
    (CHAT, "vllm", ["tpot"]), (CHAT, "sglang", ["ttft"]), (CHAT, "trtllm", ["tpot"]),
    (LIVE, "sglang", ["ttft"]), (LLAMACPP, "llamacpp", ["deferred"])])
def test_the_example_specs_give_what_each_engine_supports(path: Path, engine: str, kept: list[str]) -> None:
    model = _model(path, engine)
    assert [s.name for s in model.slos] == kept
    assert [a.kind for a in model.operational] == ["scrape_target_missing"]
    rules = render(model, "rules.yml", with_tests=False).rules
    assert f"# Over {ENGINES[engine].name}'s own series" in rules
    assert all(f"# Not generated: {r.message()}" in rules for r in model.refused)


@pytest.mark.parametrize(("path", "engine"), [(CHAT, "tgi"), (CHAT, "llamacpp"), (LIVE, "vllm"), (LIVE, "tgi"),
                                              (LIVE, "llamacpp"), (LIVE, "trtllm")])
def test_an_example_spec_the_engine_cannot_serve_at_all_is_refused_entry_by_entry(path: Path, engine: str) -> None:
    with pytest.raises(EngineSupportError) as caught:
        _model(path, engine)
    objectives = load_spec(path).objectives
    for i, objective in enumerate(objectives):
        assert f"refused objectives[{i}] ({objective.name}: " in str(caught.value)


@pytest.mark.integration
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_promtool_proves_every_engines_rules(engine: str, tmp_path: Path) -> None:
    """``promtool check rules`` and ``promtool test rules`` on the rules of everything the engine supports
    (trtllm-serve included: no exposition of it is at hand, so promtool is its only proof)."""
    require_tool("promtool", "Debian package `prometheus`")
    model = build_model(parse_spec(engine_spec(engine, job="engine"), engine=True), engine)
    assert len(model.slos) >= 2
    out = render(model, "rules.yml", "rules_test.yml", f"{engine}.yaml")
    (tmp_path / "rules.yml").write_text(out.rules)
    tests = []
    for name, text in out.tests:
        (tmp_path / name).write_text(text)
        tests.append(tmp_path / name)
    checked = check_rules([tmp_path / "rules.yml"])
    assert checked.ok, checked.output
    for result in run_rule_tests(tests, parallel=False):
        assert result.ok, result.output
    names = [t["name"] for p in tests for t in _yaml(p)["tests"]]
    for slo in model.slos:  # every SLO in a burn-rate group and in an absent-data group
        assert any("total outage" in n and slo.name in n for n in names), slo.name
        assert any("absent-data alerts" in n and slo.name in n for n in names), slo.name


def _yaml(path: Path) -> Any:
    from llmslo.rules import load_yaml

    return load_yaml(path.read_text(), str(path))


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LLMSLO), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "examples").mkdir()
    for spec in (CHAT, LIVE, LLAMACPP):
        shutil.copy(spec, tmp_path / "examples" / spec.name)
    return tmp_path


@pytest.mark.integration
def test_the_installed_command_refuses_tgi_for_the_chat_spec_saying_why_first(workdir: Path) -> None:
    out = _run(workdir, "rules", "generate", "examples/chat-slo.yaml", "--engine", "tgi", "-o", "rules/tgi.yml")
    assert out.returncode == 1, out
    lines = out.stderr.splitlines()
    assert lines[0] == ("error: examples/chat-slo.yaml: no objective of the spec can be computed from Text "
                        "Generation Inference's own series:")
    assert lines[1].startswith("  refused objectives[0] (goodput: goodput) on Text Generation Inference: ")
    assert lines[2] == ("  refused objectives[1] (ttft: latency ttft <= 2s) on Text Generation Inference: no "
                        "time-to-first-token histogram at all. Way out: observe each request's stream instead: put "
                        "llmslo gateway in front of TGI (docs/gateway.md), or use the clients' own summaries "
                        "(llmslo load); TGI is no Python server, so llmslo's middleware cannot go inside it")
    assert "0.1s is not a bucket bound of tgi_request_mean_time_per_token_duration" in lines[3]
    assert not (workdir / "rules").exists() and out.stdout == ""


@pytest.mark.integration
def test_the_installed_command_writes_vllm_rules_printing_each_refusal_first(workdir: Path) -> None:
    require_tool("promtool", "Debian package `prometheus`")
    out = _run(workdir, "rules", "generate", "examples/chat-slo.yaml", "--engine", "vllm", "-o", "out/rules.yml",
               "--tests", "out/rules_test.yml")
    assert out.returncode == 0, out.stderr
    first = out.stderr.splitlines()[0]
    assert first.startswith("refused: objectives[0] (goodput: goodput) on vLLM: goodput counts the requests")
    assert "refused: objectives[1] (ttft: latency ttft <= 2s) on vLLM: 2s is not a bucket bound" in out.stderr
    assert "not generated: operational.breaker_open (breaker_open) on vLLM:" in out.stderr
    assert out.stdout.startswith("wrote out/rules.yml: 16 rules in 2 groups")
    rules = (workdir / "out" / "rules.yml").read_text()
    assert "vllm:request_time_per_output_token_seconds_bucket" in rules and "llmslo_tpot" not in rules
    tests = sorted(str(p.relative_to(workdir)) for p in (workdir / "out").glob("rules_test*.yml"))
    check = _run(workdir, "rules", "check", "out/rules.yml", *tests)
    assert check.returncode == 0, check.stdout + check.stderr
    as_json = json.loads(_run(workdir, "rules", "generate", "examples/chat-slo.yaml", "--engine", "vllm", "-o",
                              "out/again.yml", "--json").stdout)
    assert as_json["engine"] == "vllm" and as_json["refused"][0]["path"] == "objectives[0]"
    assert (workdir / "out" / "again.yml").read_text() == rules


@pytest.mark.integration
def test_the_installed_command_refuses_an_unknown_engine_and_explains_with_one(workdir: Path) -> None:
    out = _run(workdir, "rules", "generate", "examples/chat-slo.yaml", "--engine", "ollama", "-o", "r.yml")
    assert out.returncode == 2 and "unknown engine 'ollama'; known engines: vllm, sglang, tgi, llamacpp, trtllm" in (
        out.stderr)
    explained = _run(workdir, "rules", "explain", "examples/llamacpp-slo.yaml", "--engine", "llamacpp", "--json")
    assert explained.returncode == 0, explained.stderr
    data = json.loads(explained.stdout)
    assert [row["slo"] for row in data["burn"]] == ["deferred"]
    assert data["burn"][0]["objective"] == "95% of rule evaluations good over 1h"
