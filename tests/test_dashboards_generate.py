"""The generated dashboards: golden files, byte determinism, names only from the catalogue, template variables,
exemplars, layout, and the spec's objectives."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

from llmslo.dashboards import (
    PROMETHEUS_SERIES,
    Dashboard,
    build_dashboards,
    panel_queries,
    serving_dashboard,
    slo_dashboard,
    strip_nulls,
    variable_queries,
)
from llmslo.rules import build_model, parse_spec
from llmslo.telemetry import METRICS_BY_KEY, SLO_LABELS
from llmslo.tests._dashboards import (
    GOLDEN,
    LABEL_VALUES,
    PROMQL_FUNCTIONS,
    allowed_series,
    generated,
    promql_names,
)

NAMES = sorted(generated())


def test_generated_dashboards_match_the_golden_files(update_golden: bool) -> None:
    files = {name: d.text() for name, d in generated().items()}
    if update_golden:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for old in GOLDEN.glob("*.json"):
            old.unlink()
        for name, text in files.items():
            (GOLDEN / name).write_text(text, encoding="utf-8")
    stale = {p.name for p in GOLDEN.glob("*.json")} - set(files)
    assert not stale, f"golden files no longer generated: {sorted(stale)}; rerun with --update-golden"
    for name, text in files.items():
        path = GOLDEN / name
        assert path.exists(), f"{name} missing; run pytest --update-golden and review the diff"
        assert text == path.read_text(encoding="utf-8"), f"{name} differs; run pytest --update-golden, review the diff"


def test_the_json_is_byte_deterministic_across_processes_and_hash_seeds() -> None:
    code = ("from llmslo.dashboards import build_dashboards\n"
            "from llmslo.tests._dashboards import example_model\n"
            "import sys\n"
            "sys.stdout.write(''.join(d.text() for d in (*build_dashboards(example_model()), *build_dashboards())))\n")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}).stdout for seed in ("1", "2")}
    assert runs == {"".join(d.text() for d in generated().values())}


@pytest.mark.parametrize("name", NAMES)
def test_the_text_has_sorted_keys_no_null_but_the_base_thresholds_and_a_trailing_newline(name: str) -> None:
    text = generated()[name].text()
    assert text.endswith("}\n") and not text.endswith("\n\n")
    data = json.loads(text)
    again = json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert again == text  # sorted keys, two-space indent: parsing and writing again changes nothing
    nulls = [path for path, value in _walk(data) if value is None]
    assert nulls and all(re.fullmatch(r".*\.thresholds\.steps\[0\]\.value", p) for p in nulls), nulls


def _walk(value: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in _walk(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [item for i, v in enumerate(value) for item in _walk(v, f"{path}[{i}]")]
    return [(path, value)]


def test_strip_nulls_drops_none_everywhere() -> None:
    assert strip_nulls({"a": None, "b": [1, None, {"c": None, "d": 0}], "e": False}) == {"b": [1, {"d": 0}], "e": False}


@pytest.mark.parametrize("name", NAMES)
def test_every_series_read_is_in_the_catalogue_the_spec_rules_or_prometheus_own(name: str) -> None:
    dashboard = generated()[name]
    allowed = allowed_series(dashboard)
    exprs = [q.expr for q in panel_queries(dashboard.data)]
    for variable in variable_queries(dashboard.data):
        match = LABEL_VALUES.match(variable.query)
        assert match, f"variable {variable.name}: {variable.query!r} is not label_values(series, label)"
        exprs.append(match.group("series"))
    unknown, functions = {}, set()
    for expr in exprs:
        series, used = promql_names(expr)
        functions |= used
        unknown.update({s: expr for s in series - allowed})
    assert not unknown, f"series outside the catalogue and the generated rules: {unknown}"
    assert functions <= PROMQL_FUNCTIONS, f"not PromQL functions: {functions - PROMQL_FUNCTIONS}"
    assert set(PROMETHEUS_SERIES) == {"ALERTS", "up"}


@pytest.mark.parametrize("name", NAMES)
def test_every_llmslo_name_anywhere_in_the_json_is_a_series_or_an_slo_label(name: str) -> None:
    dashboard = generated()[name]
    named = set(re.findall(r"\bllmslo[_:][A-Za-z0-9_:]*", dashboard.text()))
    assert named, name
    unknown = named - allowed_series(dashboard) - set(SLO_LABELS)
    assert not unknown, f"names in titles, descriptions or queries that llmslo does not expose: {sorted(unknown)}"


def test_the_name_check_catches_a_misspelt_or_invented_series_and_function() -> None:
    dashboard = generated()["llmslo-chat-serving.json"]
    allowed = allowed_series(dashboard)
    expr = panel_queries(dashboard.data)[0].expr
    assert promql_names(expr)[0] <= allowed
    typo = expr.replace("llmslo_requests_total", "llmslo_request_total")
    assert promql_names(typo)[0] - allowed == {"llmslo_request_total"}
    invented = f"{expr} / llmslo_tokens_total"
    assert promql_names(invented)[0] - allowed == {"llmslo_tokens_total"}
    assert promql_names(expr.replace("rate(", "rat("))[1] - PROMQL_FUNCTIONS == {"rat"}
    # label names in matchers and groupings, strings and ranges are not read as series
    assert promql_names('sum by (llmslo_slo) (rate(up{job="$job",x=~"a|b"}[$__rate_interval])) > 1e-9') == (
        {"up"}, {"sum", "rate"})


def data_of(name: str) -> dict[str, Any]:
    """The dashboard as Grafana reads it (parsed from the written text)."""
    parsed: dict[str, Any] = json.loads(generated()[name].text())
    return parsed


def _targets(data: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(p, t) for p in data["panels"] for t in p.get("targets", ())]


@pytest.mark.parametrize("name", NAMES)
def test_every_query_reads_the_datasource_variable_and_rates_use_the_rate_interval(name: str) -> None:
    data = data_of(name)
    source = {"type": "prometheus", "uid": "${datasource}"}
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["job"]["type"] == "query" and variables["job"]["datasource"] == source
    for panel, target in _targets(data):
        assert panel["datasource"] == source and target["datasource"] == source, panel["title"]
        for window in re.findall(r"\b(?:rate|increase)\([^\[]*\[([^\]]*)\]", target["expr"]):
            assert window == "$__rate_interval", (panel["title"], target["expr"])


@pytest.mark.parametrize("name", ["llmslo-serving.json", "llmslo-chat-serving.json"])
def test_every_scraped_series_of_the_serving_dashboard_is_filtered_by_job(name: str) -> None:
    for panel, target in _targets(data_of(name)):
        selectors = re.findall(r"\b(llmslo_\w+)(\{[^}]*\})?", target["expr"])
        assert selectors, target["expr"]
        for metric, matchers in selectors:
            assert 'job="$job"' in matchers, (panel["title"], metric, target["expr"])
            carries_model = "model" in METRICS_BY_KEY[_key(metric)].labels
            assert ('model=~"$model"' in matchers) == carries_model, (panel["title"], metric)


def _key(series: str) -> str:
    from llmslo.telemetry import METRICS

    return next(m.key for m in METRICS if series in (m.name, *((m.bucket, m.count, m.sum)
                                                               if m.type == "histogram" else ())))


@pytest.mark.parametrize("name", NAMES)
def test_every_panel_reading_histogram_buckets_asks_for_exemplars(name: str) -> None:
    data = data_of(name)
    bucket_panels = [p for p in data["panels"] if any("_bucket" in t["expr"] for t in p.get("targets", ()))]
    if "serving" in name:
        titles = {p["title"] for p in bucket_panels}
        for latency in ("TTFT", "TPOT", "ITL", "End-to-end"):
            assert {t for t in titles if t.startswith(latency)} and all(
                any(t["exemplar"] for t in p["targets"]) for p in bucket_panels if p["title"].startswith(latency))
        heatmaps = [p for p in bucket_panels if p["type"] == "heatmap"]
        assert len(heatmaps) == 4 and all(p["targets"][0]["format"] == "heatmap" for p in heatmaps)
    for panel in bucket_panels:
        assert any(t["exemplar"] for t in panel["targets"]), panel["title"]


@pytest.mark.parametrize("name", NAMES)
def test_panels_have_unique_ids_and_fill_the_grid_without_overlap(name: str) -> None:
    panels = data_of(name)["panels"]
    assert [p["id"] for p in panels] == list(range(1, len(panels) + 1))
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"{p['title']} overlaps another panel"
        cells |= area


def test_the_spec_preselects_its_job_and_model_and_draws_its_latency_thresholds() -> None:
    serving = data_of("llmslo-chat-serving.json")
    variables = {v["name"]: v for v in serving["templating"]["list"]}
    assert variables["job"]["current"]["value"] == "chat"
    assert variables["model"]["current"]["value"] == ["chat"]
    steps = {p["title"]: [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"]]
             for p in serving["panels"] if p["title"].endswith("p99")}
    assert steps["TTFT: p50, p90, p99"] == [None, 2.0]
    assert steps["TPOT: p50, p90, p99"] == [None, 0.1]
    assert steps["ITL (token-weighted): p50, p90, p99"] == [None]
    plain = {v["name"]: v for v in data_of("llmslo-serving.json")["templating"]["list"]}
    assert "current" not in plain["job"] and plain["model"]["current"]["value"] == ["$__all"]


def test_the_slo_dashboard_has_a_row_per_objective_with_its_windows_and_burn_rates() -> None:
    data = data_of("llmslo-chat-slo.json")
    rows = [p["title"] for p in data["panels"] if p["type"] == "row"]
    assert rows == ["Overview", "goodput: 99% over 30d", "ttft: 99% over 30d", "tpot: 99% over 30d"]
    burn = next(p for p in data["panels"] if p["title"] == "Burn rate by window")
    assert [t["legendFormat"] for t in burn["targets"]] == ["5m", "30m", "1h", "2h", "6h", "1d", "3d"]
    steps = burn["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [(s["value"], s["color"]) for s in steps] == [
        (None, "green"), (1.0, "orange"), (3.0, "orange"), (6.0, "red"), (14.4, "red")]
    sli = next(p for p in data["panels"] if p["title"] == "Good events over 30d")
    assert sli["fieldConfig"]["defaults"]["thresholds"]["steps"][1] == {"color": "green", "value": 0.99}
    plain = data_of("llmslo-slo.json")
    assert [p.get("repeat") for p in plain["panels"] if p["type"] == "row"] == [None, "slo"]


def test_a_spec_with_its_own_windows_gets_exactly_the_rules_it_generates() -> None:
    spec = {"version": "llmslo/v1", "service": "completions", "period": "7d", "scrape": {"interval": "15s"},
            "burn_alerts": [{"severity": "page", "burn_rate": 10, "long_window": "90m", "short_window": "5m"}],
            "objectives": [{"name": "e2e", "kind": "latency", "metric": "e2e", "threshold": "30s",
                            "objective": 99.5}]}
    model = build_model(parse_spec(spec))
    slo = slo_dashboard(model)
    exprs = " ".join(q.expr for q in panel_queries(slo.data))
    windows = set(re.findall(r"llmslo:slo_error:ratio_rate(\w+)", exprs))
    assert windows == {"5m", "1h30m", "1w"}  # 7d as Prometheus durations (and the rule names) write it
    from llmslo.tests._dashboards import recorded_names

    used = set(re.findall(r"llmslo:[a-z_]+:[a-z_0-9]+", exprs))
    assert used <= recorded_names(model), used - recorded_names(model)
    serving = json.loads(serving_dashboard(model).text())
    e2e = next(p for p in serving["panels"] if p["title"] == "End-to-end latency: p50, p90, p99")
    assert [s["value"] for s in e2e["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [None, 30.0]


def test_uids_fit_grafana_and_name_the_files() -> None:
    for d in generated().values():
        assert 8 <= len(d.uid) <= 40 and re.fullmatch(r"[A-Za-z0-9_-]+", d.uid)
        assert d.file_name == f"{d.uid}.json" and d.data["uid"] == d.uid and d.data["title"] == d.title
    model = build_model(parse_spec({"version": "llmslo/v1", "service": "a" * 60,
                                    "objectives": [{"name": "x", "kind": "availability", "objective": 99}]}))
    serving, slo = build_dashboards(model)
    assert len(serving.uid) <= 40 and len(slo.uid) <= 40 and serving.uid != slo.uid
    assert serving.data["title"] == f"llmslo serving: {'a' * 60}"


def test_dashboards_link_to_each_other_by_tag() -> None:
    for d in generated().values():
        (link,) = d.data["links"]
        assert link["type"] == "dashboards" and set(link["tags"]) <= set(d.data["tags"]), d.file_name
        assert link["includeVars"] and link["keepTime"]


def test_a_dashboard_object_renders_its_own_data() -> None:
    d = generated()["llmslo-serving.json"]
    assert isinstance(d, Dashboard) and d.kind == "serving" and json.loads(d.text())["uid"] == "llmslo-serving"


def test_generating_loads_no_telemetry_runtime_and_importing_needs_no_yaml() -> None:
    code = ("import sys\n"
            "import llmslo.dashboards\n"
            "light = [m for m in ('yaml', 'llmslo.rules', 'prometheus_client') if m in sys.modules]\n"
            "from llmslo.tests._dashboards import example_model\n"
            "llmslo.dashboards.build_dashboards(example_model()), llmslo.dashboards.build_dashboards()\n"
            "print(light, 'prometheus_client' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "False"], out.stdout + out.stderr
