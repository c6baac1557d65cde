"""The Prometheus runner of the live runs (llmslo.ops): rule files given by a relative path, or under a folder
whose name reads as a glob, are loaded, and the runner checks that Prometheus loaded every group and rule."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from llmslo.ops import PrometheusError, running_prometheus
from llmslo.tests._tools import require_tool

RULES = """groups:
  - name: one
    rules:
      - record: job:up:sum
        expr: sum(up)
"""


def test_relative_rule_files_are_loaded_from_any_working_directory(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``llmslo demo --live --out run`` passes relative paths: the rules must still load (Prometheus reads a
    relative rule file from its configuration's folder, where it is not)."""
    require_tool("prometheus", "Debian package `prometheus`")
    monkeypatch.chdir(tmp_path)
    Path("run").mkdir()
    Path("run/rules.yml").write_text(RULES)
    with running_prometheus(Path("run/prometheus"), ["127.0.0.1:9"], job="nothing",
                            rule_files=[Path("run/rules.yml")]) as prometheus:
        deadline = time.monotonic() + 15
        names: list[str] = []
        while time.monotonic() < deadline and not names:
            names = [r["name"] for g in prometheus.get("/api/v1/rules")["groups"] for r in g["rules"]]
            time.sleep(0.2)
    assert names == ["job:up:sum"]
    assert os.getcwd() == str(tmp_path)


def test_a_missing_rule_file_is_an_error_not_an_empty_rule_set(tmp_path: Path) -> None:
    with pytest.raises(PrometheusError, match=r"no such rule file: .*absent\.yml"), running_prometheus(
            tmp_path / "p", ["127.0.0.1:9"], job="nothing", rule_files=[tmp_path / "absent.yml"]):
        pass
    assert not (tmp_path / "p").exists(), "nothing written"


TWO_GROUPS = RULES + """  - name: two
    rules:
      - record: job:up:count
        expr: count(up)
      - alert: NothingUp
        expr: sum(up) == 0
"""


def test_rule_file_counts_reads_the_groups_and_rules_as_prometheus_does(tmp_path: Path) -> None:
    from llmslo.ops import rule_file_counts

    (tmp_path / "a.yml").write_text(TWO_GROUPS)
    (tmp_path / "empty.yml").write_text("")
    (tmp_path / "none.yml").write_text("groups:\n  - name: empty\n    rules: []\n")
    assert rule_file_counts([tmp_path / "a.yml"]) == (2, 3)
    assert rule_file_counts([tmp_path / "a.yml", tmp_path / "empty.yml", tmp_path / "none.yml"]) == (3, 3)
    (tmp_path / "bad.yml").write_text("groups: 3\n")
    with pytest.raises(PrometheusError, match=r"bad\.yml: not a Prometheus rule file"):
        rule_file_counts([tmp_path / "bad.yml"])


def test_a_folder_whose_name_is_a_glob_loads_its_rules_and_the_counts_are_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prometheus takes every rule file as a glob: ``run[1]/rules.yml`` matched nothing and loaded no rule,
    silently. The runner escapes the path, and reports the counts Prometheus loaded; a wrong expectation
    fails with both counts."""
    from llmslo.ops import RulesNotLoaded

    require_tool("prometheus", "Debian package `prometheus`")
    monkeypatch.chdir(tmp_path)
    Path("run[1]").mkdir()
    Path("run[1]/rules.yml").write_text(TWO_GROUPS)
    with running_prometheus(Path("run[1]/prometheus"), ["127.0.0.1:9"], job="nothing",
                            rule_files=[Path("run[1]/rules.yml")]) as prometheus:
        assert prometheus.rules_loaded == (2, 3)
        assert prometheus.rule_counts() == (2, 3)
        names = [r["name"] for g in prometheus.get("/api/v1/rules")["groups"] for r in g["rules"]]
        assert names == ["job:up:sum", "job:up:count", "NothingUp"]
        with pytest.raises(RulesNotLoaded, match=r"^Prometheus loaded 2 rule groups with 3 rules, but its rule files "
                                                 r"hold 3 groups with 4 rules \(its log: .*prometheus\.log\)$"):
            prometheus.wait_rules_loaded(3, 4, timeout_s=0.5)


def test_a_rule_file_prometheus_matched_nothing_for_fails_the_start_with_the_counts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check the live runs rely on before they say 'loaded': with the path handed over unescaped,
    Prometheus loads nothing and the runner says so instead of running without rules."""
    from llmslo.ops import RulesNotLoaded, _prometheus

    require_tool("prometheus", "Debian package `prometheus`")
    monkeypatch.setattr(_prometheus, "_glob_literal", str)
    monkeypatch.setattr(_prometheus, "RULES_TIMEOUT_S", 1.0)
    folder = tmp_path / "run[1]"
    folder.mkdir()
    (folder / "rules.yml").write_text(TWO_GROUPS)
    with pytest.raises(RulesNotLoaded, match=r"loaded 0 rule groups with 0 rules, but its rule files hold 2 groups "
                                             r"with 3 rules"), \
            running_prometheus(tmp_path / "p", ["127.0.0.1:9"], job="nothing", rule_files=[folder / "rules.yml"]):
        pass
