"""The drain's rules have one home, ``llmslo.analysis.rollout``: ``llmslo drain check``, the Kubernetes manifests
(``DrainPlan``, ``rolling_plan``) and ``llmslo rollout run``'s plan check say the same rule in the same words, at
the same bound, and ``llmslo.ops`` checks a plan by them without loading the analysis stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmslo.analysis.rollout import (
    budget_verdict,
    evaluate_drain_config,
    grace_verdict,
    overlap_verdict,
    part,
    update_window_verdict,
    within,
)
from llmslo.ops import DrainPlan, plan_from_dict, rolling_plan
from llmslo.telemetry import ConfigurationError

BUDGET_SENTENCE = "wait_budget_s 400 s exceeds caller_timeout_s 300 s: the callers give up before the drain does"


def _plan(tmp_path: Path, **drain: Any) -> dict[str, Any]:
    command = [sys.executable, "-c", "pass", "{port}"]
    return {"gateway": "http://127.0.0.1:9", "from": {"version": "v1", "command": command},
            "to": {"version": "v2", "command": command}, "logs": str(tmp_path / "logs"),
            "drain": {"caller_timeout_s": 300, "wait_budget_s": 120, "unregister_settle_s": 5,
                      "max_overlap_window_s": 600, **drain}}


def _drain_check(config: dict[str, Any], rule: str) -> Any:
    return next(c for c in evaluate_drain_config(config) if c.rule == rule)


def test_the_budget_rule_reads_the_same_in_drain_check_kubernetes_and_rollout_run(tmp_path: Path) -> None:
    check = _drain_check({"wait_budget_s": 400, "caller_timeout_s": 300}, "budget_within_caller_timeout")
    assert (check.status, check.message, check.fix) == ("fail", BUDGET_SENTENCE, "lower wait_budget_s to at most 300")
    with pytest.raises(ConfigurationError) as caught:
        DrainPlan(caller_timeout_s=300, wait_budget_s=400)
    assert str(caught.value).startswith(f"{BUDGET_SENTENCE}; lower wait_budget_s to at most 300")
    problems = plan_from_dict(_plan(tmp_path, wait_budget_s=400)).problems()
    assert problems[0] == ("drain.wait_budget_s 400 s exceeds drain.caller_timeout_s 300 s: the callers give up "
                           "before the drain does; lower drain.wait_budget_s to at most 300")


@pytest.mark.parametrize(("budget", "holds"), [(300.0, True), (300.001, False), (1.0, True)])
def test_the_budget_bound_is_the_same_everywhere(tmp_path: Path, budget: float, holds: bool) -> None:
    assert budget_verdict(budget, 300).holds is holds
    status = _drain_check({"wait_budget_s": budget, "caller_timeout_s": 300}, "budget_within_caller_timeout").status
    assert status == ("pass" if holds else "fail")
    assert (not plan_from_dict(_plan(tmp_path, wait_budget_s=budget)).problems()) is holds
    try:
        DrainPlan(caller_timeout_s=300, wait_budget_s=budget)
        refused = False
    except ConfigurationError:
        refused = True
    assert refused is not holds


@pytest.mark.parametrize(("soak", "holds"), [(475.0, True), (476.0, False)])
def test_the_overlap_bound_of_a_rollout_plan(tmp_path: Path, soak: float, holds: bool) -> None:
    problems = plan_from_dict(_plan(tmp_path, soak_s=soak)).problems()  # soak + 5 + 120 against 600
    assert (not problems) is holds
    if not holds:
        assert problems == [f"drain.soak_s {soak:g} s + drain.unregister_settle_s 5 s + drain.wait_budget_s 120 s = "
                            f"{soak + 125:g} s exceeds drain.max_overlap_window_s 600 s: the versions could overlap "
                            "longer than allowed; raise drain.max_overlap_window_s, or lower drain.soak_s or "
                            "drain.wait_budget_s"]


@pytest.mark.parametrize(("window", "holds"), [(1325.0, True), (1324.0, False)])
def test_the_overlap_bound_of_the_kubernetes_update(window: float, holds: bool) -> None:
    plan = DrainPlan(pod_ready_s=300, unregister_settle_s=5, wait_budget_s=120, max_overlap_window_s=window)
    if holds:
        assert rolling_plan(plan, min_replicas=2, max_replicas=4).overlap_bound_s == 1325
        return
    with pytest.raises(ConfigurationError) as caught:
        rolling_plan(plan, min_replicas=2, max_replicas=4)
    assert str(caught.value) == ("ceil(4 / 1) batches x pod_ready_s 300 s + unregister_settle_s 5 s + wait_budget_s "
                                 "120 s = 1325 s exceeds max_overlap_window_s 1324 s: the versions could overlap "
                                 "longer than allowed; raise --batch-size to 2, or raise --max-overlap-window to 1325")


def test_drain_check_rules_of_one_shape_pass_at_the_bound_and_fail_past_it() -> None:
    assert update_window_verdict(4, 5, 120, 500).holds and not update_window_verdict(4, 5, 120, 499).holds
    assert grace_verdict(5, 120, 15, 140).holds and not grace_verdict(5, 120, 15, 139).holds
    grace = _drain_check({"unregister_settle_s": 5, "wait_budget_s": 120, "exit_margin_s": 15,
                          "termination_grace_period_s": 139}, "grace_covers_drain")
    assert grace.message == ("unregister_settle_s 5 s + wait_budget_s 120 s + exit_margin_s 15 s = 140 s exceeds "
                             "termination_grace_period_s 139 s: Kubernetes kills the pod before its drain and exit "
                             "end")
    assert grace.fix == "raise termination_grace_period_s to at least 140, or lower wait_budget_s"
    window = _drain_check({"unregister_settle_s": 5, "wait_budget_s": 120, "batches": 4, "overlap_window_s": 600},
                          "overlap_covers_update_window")
    assert window.status == "pass"
    assert window.message == ("update window 500 s = 4 batches x (unregister_settle_s 5 s + wait_budget_s 120 s) "
                              "<= overlap_window_s 600 s")


def test_the_shared_shape_shows_each_term_and_their_sum() -> None:
    one = within([part("a", 2)], "limit", 3, why="w", fix="f")
    assert (one.holds, one.message, one.fix) == (True, "a 2 s <= limit 3 s", None)
    two = overlap_verdict([part("a", 2), part("b", 1.5)], 3, fix="lower a")
    assert (two.holds, two.fix) == (False, "lower a")
    assert two.message == "a 2 s + b 1.5 s = 3.5 s exceeds max_overlap_window_s 3 s: the versions could overlap " \
                          "longer than allowed"


def test_checking_a_plan_in_ops_loads_no_analysis_stack(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from llmslo.ops import DrainPlan, plan_from_dict, rolling_plan\n"
        "rolling_plan(DrainPlan(), min_replicas=2, max_replicas=4)\n"
        f"assert plan_from_dict({_plan(tmp_path)!r}).problems() == []\n"
        "print(','.join(m for m in ('duckdb', 'numpy', 'scipy', 'polars', 'pyarrow') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
