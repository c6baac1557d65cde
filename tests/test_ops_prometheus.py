"""The Prometheus runner of the live runs (llmslo.ops): rule files given by a relative path are loaded."""

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
