"""A rolling update, live: two ``llmslo serve`` versions under load, v1 drained, the update measured.

Two runs of :func:`llmslo.ops.run_live_rollout`, each about a minute: one where v2's engine
is 25 % slower per step (``rollout compare`` must find it: a regression of v2 on a latency), and the null
run with identical engines still named v1 and v2 (its verdict must be ``lossless``). Every test reads the
runs' files: the store ``llmslo ingest`` filled from both servers' JSONL, the loads' attempts logs, v1's
drain record, and the JSON of ``llmslo rollout compare`` and ``llmslo rollout show``. Loopback only; every
process is stopped by its pid.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from llmslo.cli._live_rollout import print_live_rollout
from llmslo.ops import LiveRolloutPlan, LiveRolloutRun, LiveRunError, run_live_rollout

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LATENCIES = ("ttft_s", "e2e_s")


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> LiveRolloutRun:
    plan = LiveRolloutPlan()
    assert plan.v2_speed < plan.v1_speed
    return run_live_rollout(tmp_path_factory.mktemp("slow-v2"), plan)


@pytest.fixture(scope="module")
def null(tmp_path_factory: pytest.TempPathFactory) -> LiveRolloutRun:
    plan = LiveRolloutPlan()
    return run_live_rollout(tmp_path_factory.mktemp("null"), dataclasses.replace(plan, v2_speed=plan.v1_speed))


@pytest.fixture(scope="module", params=["slow", "null"])
def run(request: pytest.FixtureRequest) -> LiveRolloutRun:
    result: LiveRolloutRun = request.getfixturevalue(request.param)
    return result


def _summaries(run: LiveRolloutRun) -> dict[str, dict[str, Any]]:
    con = duckdb.connect(str(run.store), read_only=True)
    try:
        cursor = con.execute("SELECT * FROM request_summaries")
        names = [c[0] for c in cursor.description]
        rows = cursor.fetchall()
    finally:
        con.close()
    return {r[0]: dict(zip(names, r, strict=True)) for r in rows}


def _attempts(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _cli_json(*args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "llmslo.cli", *args], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _outcome(run: LiveRolloutRun, version: str, side: str) -> dict[str, Any]:
    assert run.comparison is not None
    (found,) = [o for o in run.comparison["outcomes"] if o["version"] == version and o["side"] == side]
    return found


def test_every_process_ended_as_planned(run: LiveRolloutRun) -> None:
    # the servers drain and exit 0; the long reply's load ends on its own; the loads were stopped by SIGTERM
    logs = {name: (run.folder / f"{name.replace(' ', '-')}.log") for name in run.exit_codes}
    expected = {"serve v1": 0, "serve v2": 0, "long stream": 0, "load v1": 143, "load v2": 143}
    assert run.exit_codes == expected, {n: logs[n].read_text()[-1500:] for n in run.exit_codes
                                        if run.exit_codes[n] != expected.get(n)}


def test_nothing_lost_each_servers_summaries_are_exactly_its_loads_sent_attempts(run: LiveRolloutRun) -> None:
    stored = _summaries(run)
    for version in ("v1", "v2"):
        attempts = _attempts(run.attempts_logs[version])
        if version == "v1":
            attempts += _attempts(run.long_attempts_log)
        sent = {a["request_id"]: a for a in attempts if not a["breaker_refused"]}
        mine = {i: r for i, r in stored.items() if r["version"] == version}
        assert set(mine) == set(sent), (version, sorted(set(mine) - set(sent))[:5], sorted(set(sent) - set(mine))[:5])
        differ = [(i, a["finish_reason"], a["reject_reason"], mine[i]["finish_reason"], mine[i]["reject_reason"])
                  for i, a in sent.items()
                  if (a["finish_reason"], a["reject_reason"]) != (mine[i]["finish_reason"], mine[i]["reject_reason"])]
        assert not differ, f"{version}: {len(differ)} attempts the client and the server ended apart: {differ[:5]}"
        assert len(mine) >= 200, (version, len(mine))


def test_the_drain_record_is_stored_as_the_server_wrote_it_with_the_update_window(run: LiveRolloutRun) -> None:
    shown = _cli_json("rollout", "show", run.plan.update_id, "--db", str(run.store), "--json")
    written = json.loads(run.drain_record.read_text())
    assert written["update_id"] == shown["update_id"] == run.plan.update_id
    assert shown["drain"] == written["drain"]
    assert shown["versions"]["from"] == "v1" and shown["versions"]["to"] == "v2"
    assert shown["overlap"] == {"from_unix_s": run.v2_serving_unix_s, "to_unix_s": run.v1_exited_unix_s}
    assert (shown["started_unix_s"], shown["ended_unix_s"]) == (run.v2_started_unix_s, run.update_ended_unix_s)
    assert shown["drain"]["decision"] == "terminate" and shown["drain"]["closed_by_reason"]["budget_exhausted"] >= 1


def test_the_baselines_are_v1_before_the_update_and_v2_after_it(run: LiveRolloutRun) -> None:
    assert run.v2_started_unix_s is not None and run.update_ended_unix_s is not None
    stored = _summaries(run).values()
    v1_before = [r for r in stored if r["version"] == "v1" and r["arrival_unix_s"] < run.v2_started_unix_s]
    v2_after = [r for r in stored if r["version"] == "v2" and r["arrival_unix_s"] > run.update_ended_unix_s]
    assert _outcome(run, "v1", "baseline")["attempted"] == len(v1_before) >= 100
    assert _outcome(run, "v2", "baseline")["attempted"] == len(v2_after) >= 100
    assert _outcome(run, "v1", "window")["attempted"] >= 100 and _outcome(run, "v2", "window")["attempted"] >= 100


def test_drain_ended_requests_are_process_figures_of_v1_only_not_outcomes(run: LiveRolloutRun) -> None:
    assert run.comparison is not None
    process = run.comparison["process"]
    (long,) = _attempts(run.long_attempts_log)
    stored = _summaries(run)
    assert stored[long["request_id"]]["finish_reason"] == "server_draining"
    cut, refused = process["terminated_by_version"], process["drain_rejected_by_version"]
    assert cut["v1"] >= 1 and refused["v1"] >= 1, process
    assert cut.get("v2", 0) == 0 and refused.get("v2", 0) == 0, process
    window = _outcome(run, "v1", "window")
    assert window["drain_ended"] == cut["v1"] + refused["v1"]
    assert window["outcome_population"] == window["attempted"] - window["drain_ended"]
    lo, hi = run.comparison["window"]["from_unix_s"], run.comparison["window"]["to_unix_s"]
    in_window = [r for r in stored.values() if r["version"] == "v1" and lo <= r["arrival_unix_s"] <= hi]
    assert window["attempted"] == len(in_window)
    # the refusals while draining are not rejected outcomes
    assert window["rejected"] == sum(r["finish_reason"] == "rejected" and r["reject_reason"] != "draining"
                                     for r in in_window)
    assert window["drain_ended"] == sum(r["finish_reason"] == "server_draining" or r["reject_reason"] == "draining"
                                        for r in in_window)


def test_the_slower_v2_is_a_latency_regression_of_v2_between_the_versions(slow: LiveRolloutRun) -> None:
    assert slow.comparison is not None
    assert slow.comparison["verdict"] == "regression", slow.comparison["reasons"]
    found = [r for r in slow.comparison["regressions"] if r["kind"] == "between_versions"]
    assert found and all(r["version"] == "v2" and r["reference"] == "v1 window" for r in found), found
    latency = [r for r in found if r["metric"] in LATENCIES]
    assert latency, found
    assert all(r["difference"] > 0 and r["relative_change"] >= 0.05 for r in latency), latency
    assert not [r for r in slow.comparison["regressions"] if r["version"] == "v1"], slow.comparison["regressions"]


def test_identical_versions_are_lossless(null: LiveRolloutRun) -> None:
    assert null.comparison is not None
    tested = [c for c in null.comparison["comparisons"] if c["p_value"] is not None]
    assert null.comparison["verdict"] == "lossless", (null.comparison["reasons"], [
        (c["metric"], c["reference"], c["candidate"], c["p_value"], c["effect"]) for c in tested])
    assert null.comparison["regressions"] == []
    between = [c for c in tested if c["kind"] == "between_versions" and c["metric"] in LATENCIES]
    assert len(between) == len(LATENCIES), "both latencies were tested between the versions"


def test_the_printed_run_shows_requests_by_version_the_drain_and_the_regressions(slow: LiveRolloutRun) -> None:
    from rich.console import Console

    console = Console(record=True, width=240, color_system=None)
    print_live_rollout(slow, console)
    text = console.export_text()
    assert slow.comparison is not None
    for version in ("v1", "v2"):
        sent = slow.loads[version]["run"]["sent"]
        row = next(line for line in text.splitlines() if line.startswith(f"│ {version} "))
        assert f"{sent:,}" in row, (row, sent)
    assert "verdict: regression" in text
    for r in slow.comparison["regressions"]:
        assert any(r["version"] in line and r["metric"] in line and r["reference"] in line
                   for line in text.splitlines()), (r, text)
    assert "cut by reason: budget_exhausted" in text and "process figures (kept out of the outcome rates)" in text


def test_a_folder_holding_an_earlier_run_is_refused_naming_the_file_and_left_as_it_was(tmp_path: Path) -> None:
    earlier = tmp_path / "update-record.json"
    earlier.write_text("{}")
    with pytest.raises(LiveRunError, match=r"already holds a run \(update-record\.json\)"):
        run_live_rollout(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["update-record.json"]
    assert earlier.read_text() == "{}"
