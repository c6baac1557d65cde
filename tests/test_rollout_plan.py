"""The plan of ``llmslo rollout run``: refused before anything changes when it cannot run, and the records a run
writes are ones ``llmslo rollout record`` takes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmslo.analysis.rollout import record_updates
from llmslo.ops import RolloutError, RolloutRunner, plan_from_dict
from llmslo.ops._rollout_run import BackendDrained, BatchResult, RolloutResult, check_artifacts


def _plan(tmp_path: Path, **drain: Any) -> dict[str, Any]:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    command = [sys.executable, "-c", "pass", "{port}", "{model}"]
    return {"gateway": "http://127.0.0.1:9", "batch_size": 1, "logs": str(tmp_path / "logs"),
            "from": {"version": "v1", "command": command, "model": str(model)},
            "to": {"version": "v2", "command": command, "model": str(model),
                   "model_sha256": hashlib.sha256(b"weights").hexdigest()},
            "drain": {"caller_timeout_s": 30, "wait_budget_s": 10, "unregister_settle_s": 1,
                      "max_overlap_window_s": 60, **drain}}


def _refusal(plan: dict[str, Any]) -> str:
    with pytest.raises(RolloutError) as caught:
        RolloutRunner(plan_from_dict(plan)).run()
    return str(caught.value)


def test_a_budget_past_the_callers_timeout_is_refused_naming_both(tmp_path: Path) -> None:
    message = _refusal(_plan(tmp_path, wait_budget_s=45))
    assert "drain.wait_budget_s 45 s exceeds drain.caller_timeout_s 30 s: the callers give up before the drain " \
           "does; lower drain.wait_budget_s to at most 30" in message
    assert not (tmp_path / "logs").exists()  # nothing was started


def test_a_budget_the_overlap_bound_cannot_hold_is_refused(tmp_path: Path) -> None:
    message = _refusal(_plan(tmp_path, unregister_settle_s=5, max_overlap_window_s=12))
    assert "drain.soak_s 0 s + drain.unregister_settle_s 5 s + drain.wait_budget_s 10 s = 15 s exceeds " \
           "drain.max_overlap_window_s 12 s" in message


def test_missing_or_changed_artefacts_refuse_the_update_so_a_rollback_stays_possible(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    plan["from"]["command"] = ["no-such-engine-binary", "--port", "{port}"]
    assert "the old version v1: its program 'no-such-engine-binary' is not found" in _refusal(plan)
    plan = _plan(tmp_path)
    plan["to"]["model_sha256"] = "0" * 64
    assert f"has SHA-256 {hashlib.sha256(b'weights').hexdigest()}, not the {'0' * 64}" in _refusal(plan)
    plan = _plan(tmp_path)
    plan["from"]["model"] = str(tmp_path / "gone.gguf")
    assert "its model" in _refusal(plan) and "cannot be read" in _refusal(plan)


@pytest.mark.parametrize(("change", "expected"), [
    ({"drain": {"caller_timeout_s": 30, "wait_budget_s": 10, "wait_budget": 3}}, "drain: unknown key(s) wait_budget"),
    ({"drain": {"wait_budget_s": 10}}, "drain: caller_timeout_s missing"),
    ({"batch_size": 0}, "batch_size: expected an integer >= 1, got 0"),
    ({"to": {"version": "v2", "command": "llama-server --port {port}"}}, "to.command: expected a list of strings"),
    ({"drain": {"caller_timeout_s": 30, "wait_budget_s": 10, "terminate_on_budget": "yes"}},
     "drain.terminate_on_budget must be true or false"),
])
def test_a_bad_field_is_named(tmp_path: Path, change: dict[str, Any], expected: str) -> None:
    with pytest.raises(RolloutError) as caught:
        plan_from_dict({**_plan(tmp_path), **change}, "plan.yaml")
    assert expected in str(caught.value)


def test_the_records_of_a_run_are_taken_by_rollout_record(tmp_path: Path) -> None:
    plan = plan_from_dict(_plan(tmp_path))
    drain = {"from_version": "v1", "to_version": "", "batch": None, "batches": None, "started_unix_s": 1000.0,
             "wait_budget_s": 10.0, "unregister_settle_s": 1.0, "actual_drain_s": 2.5, "in_flight_at_start": 3,
             "closed_by_reason": {"idle": 0, "max_inflight": 0, "budget_exhausted": 1},
             "ended_by_reason": {"length": 2}, "terminated": 1, "timed_out": 0, "requeued": 0,
             "requeue_failed": 0, "remaining": 0, "decision": "terminate"}
    result = RolloutResult("u", "v1", "v2", False, {"v2": check_artifacts(plan.to_version, "the new")},
                           started_unix_s=999.0, ended_unix_s=1010.0, outcome="done")
    result.batches.append(BatchResult(1, 1, ["old0"], ["v2-1234"], [1234],
                                      [BackendDrained("old0", drain, 2.5, 1, 0.004, 4321)], 999.5, 1004.0, "done"))
    stored = record_updates(tmp_path / "s.duckdb", result.records(plan))
    (update,) = [s.update for s in stored]
    assert update.update_id == "u-b1-old0" and update.from_version == "v1" and update.to_version == "v2"
    record = update.to_dict()
    assert record["drain"]["batch"] == 1 and record["drain"]["terminated"] == 1
    assert record["extra"]["removal_propagation_s"] == 0.004
    assert record["versions"]["artifacts"]["weights"] == hashlib.sha256(b"weights").hexdigest()


def test_the_command_refuses_a_bad_plan_from_a_plain_folder(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(_plan(tmp_path, wait_budget_s=45)))
    done = subprocess.run([sys.executable, "-m", "llmslo.cli", "rollout", "run", "--plan", "plan.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "the plan cannot run: drain.wait_budget_s 45 s exceeds drain.caller_timeout_s 30 s" in done.stderr
    assert not (tmp_path / "logs").exists()


def test_a_soak_counts_in_the_overlap_bound(tmp_path: Path) -> None:
    message = _refusal(_plan(tmp_path, soak_s=50, unregister_settle_s=1, max_overlap_window_s=60))
    assert "drain.soak_s 50 s + drain.unregister_settle_s 1 s + drain.wait_budget_s 10 s = 61 s exceeds " \
           "drain.max_overlap_window_s 60 s" in message
    assert plan_from_dict(_plan(tmp_path, soak_s=5)).drain.soak_s == 5.0
