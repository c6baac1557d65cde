"""The dashboard JSON type-checked against Grafana's own published types (``@grafana/schema``, the Prometheus
query model of ``@grafana/grafana-foundation-sdk``) with ``tsc --strict``.

Needs ``npm ci --prefix tests/tools/grafana_schema``: skipped with the reason when it has not run, failed under
``CI=true`` (``.ci/setup`` runs it)."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from llmslo.engines import ENGINES
from llmslo.tests._dashboards import engine_generated, generated
from llmslo.tests._tools import need

TOOL = Path(__file__).parent / "tools" / "grafana_schema"


def _load_wrap() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llmslo_grafana_schema_wrap", TOOL / "wrap.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wrap = _load_wrap()


def _parsed() -> dict[str, dict[str, Any]]:
    return {name: json.loads(d.text()) for name, d in generated().items()}


@pytest.mark.integration
def test_every_generated_dashboard_type_checks_against_grafanas_published_types(tmp_path: Path) -> None:
    need(wrap.missing())
    files = wrap.wrap(_parsed(), tmp_path)
    assert len(files) == 4
    result = wrap.check(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    source = files[0].read_text()
    assert "satisfies PanelOf<heatmap.Options, heatmap.FieldConfig>" in source  # panels checked by plugin
    assert "satisfies Json<Dashboard>" in source


@pytest.mark.integration
def test_every_engine_dashboard_type_checks_against_grafanas_published_types(tmp_path: Path) -> None:
    """The dashboards of each inference engine's own series (``dashboards generate --engine``), with the
    spec's model where the example spec leaves the engine an objective and without a spec."""
    need(wrap.missing())
    files = {name: json.loads(d.text()) for name, d in engine_generated().items()}
    assert len(files) == 4 * len(ENGINES) - 4  # with and without a spec; llama.cpp and TGI have no chat objective
    wrap.wrap(files, tmp_path)
    result = wrap.check(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _first(data: dict[str, Any], kind: str) -> dict[str, Any]:
    panel: dict[str, Any] = next(p for p in data["panels"] if p["type"] == kind)
    return panel


MUTATIONS = {
    "a number written as a string": (lambda d: _first(d, "timeseries")["gridPos"].update(w="12"),
                                     "Type 'string' is not assignable to type 'number'"),
    "a value outside an enumeration": (lambda d: _first(d, "timeseries")["options"]["legend"].update(
        placement="middle"), "'\"middle\"' is not assignable to type 'LegendPlacement'"),
    "a misspelt query field": (lambda d: _first(d, "heatmap")["targets"][0].update(exemplr=True),
                               "'\"exemplr\"' does not exist in type 'PromQuery'"),
    "a required panel option missing": (lambda d: _first(d, "heatmap")["options"].pop("yAxis"),
                                        "Property 'yAxis' is missing"),
    "a variable refresh Grafana does not know": (lambda d: d["templating"]["list"][1].update(refresh=7),
                                                 "Type '7' is not assignable to type 'VariableRefresh"),
    "a query format the data source does not know": (lambda d: _first(d, "heatmap")["targets"][0].update(
        format="heat"), "Type '\"heat\"' is not assignable"),
}


@pytest.mark.integration
def test_tsc_rejects_wrong_types_misspelt_fields_and_missing_options(tmp_path: Path) -> None:
    need(wrap.missing())
    base = json.loads(generated()["llmslo-chat-serving.json"].text())
    broken = {}
    for i, (what, (mutate, _)) in enumerate(MUTATIONS.items()):
        dashboard = copy.deepcopy(base)
        mutate(dashboard)
        broken[f"broken{i}.json"] = dashboard
        assert dashboard != base, what
    wrap.wrap(broken, tmp_path)
    result = wrap.check(tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    for i, (what, (_, message)) in enumerate(MUTATIONS.items()):
        errors = [line for line in output.splitlines() if re.search(rf"\bbroken{i}\.ts\(", line)]
        assert errors, f"{what}: tsc found nothing\n{output}"
        assert any(message in line for line in errors), f"{what}: expected {message!r} in\n" + "\n".join(errors)


def test_a_panel_type_without_a_wired_schema_is_refused_before_tsc(tmp_path: Path) -> None:
    dashboard = json.loads(generated()["llmslo-serving.json"].text())
    dashboard["panels"].append({"type": "piechart", "title": "shares", "id": 99})
    with pytest.raises(ValueError, match=r"'shares'.*'piechart'.*PANEL_TYPES"):
        wrap.wrap({"x.json": dashboard}, tmp_path)


def test_the_npm_packages_are_pinned_to_exact_versions_in_the_lockfile() -> None:
    package = json.loads((TOOL / "package.json").read_text())
    lock = json.loads((TOOL / "package-lock.json").read_text())
    wanted = package["devDependencies"]
    assert set(wanted) == {"@grafana/schema", "@grafana/grafana-foundation-sdk", "typescript"}
    for name, version in wanted.items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"{name} {version!r} is not an exact version"
        assert lock["packages"][f"node_modules/{name}"]["version"] == version, name
    assert lock["packages"][""]["devDependencies"] == wanted
    used = {m for d in _parsed().values() for p in d["panels"] for m in [p["type"]] if m != "row"}
    assert used <= set(wrap.PANEL_TYPES), used - set(wrap.PANEL_TYPES)
