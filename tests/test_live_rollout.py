"""A rolling update, live: ``llmslo rollout run`` through ``llmslo gateway`` under load, v1 to v2, measured.

Two runs of :func:`llmslo.ops.run_live_rollout`, each about a minute: one where v2's engine
is 25 % slower per step (``rollout compare`` must find it: a regression of v2 on a latency), and the null
run with identical engines still named v1 and v2 (its verdict must be ``lossless``). Every test reads the
runs' files: the store ``llmslo ingest`` filled from the gateway's JSONL, the load's attempts log, the update
record the rollout made, and the JSON of ``llmslo rollout compare`` and ``llmslo rollout show``. Loopback only;
every process is stopped by its pid.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from llmslo.cli._live_rollout import print_live_rollout
from llmslo.ops import LiveRolloutPlan, LiveRolloutRun, LiveRunError, pid_alive, run_live_rollout

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
    # the gateway drains and exits 0; the long reply's load ends on its own; the load was stopped by SIGTERM
    logs = {name: (run.folder / f"{name.replace(' ', '-')}.log") for name in run.exit_codes}
    expected = {"gateway": 0, "long stream": 0, "load": 143}
    assert run.exit_codes == expected, {n: logs[n].read_text()[-1500:] for n in run.exit_codes
                                        if run.exit_codes[n] != expected.get(n)}
    assert all(not pid_alive(pid) for b in run.rollout["batches"] for pid in b["new_pids"])


def test_nothing_lost_the_gateways_summaries_are_exactly_the_loads_sent_attempts(run: LiveRolloutRun) -> None:
    stored = _summaries(run)
    attempts = _attempts(run.attempts_log) + _attempts(run.long_attempts_log)
    sent = {a["request_id"]: a for a in attempts if not a["breaker_refused"]}
    assert set(stored) == set(sent), (sorted(set(stored) - set(sent))[:5], sorted(set(sent) - set(stored))[:5])
    differ = [(i, a["finish_reason"], a["reject_reason"], stored[i]["finish_reason"], stored[i]["reject_reason"])
              for i, a in sent.items()
              if (a["finish_reason"], a["reject_reason"]) != (stored[i]["finish_reason"], stored[i]["reject_reason"])]
    assert not differ, f"{len(differ)} attempts the client and the gateway ended apart: {differ[:5]}"
    for version in ("v1", "v2"):
        assert sum(r["version"] == version for r in stored.values()) >= 200, version


def test_the_rollouts_record_is_stored_with_its_three_numbers_and_the_update_window(run: LiveRolloutRun) -> None:
    shown = _cli_json("rollout", "show", run.record_id, "--db", str(run.store), "--json")
    (batch,) = run.rollout["batches"]
    (drained,) = batch["drained"]
    assert shown["versions"]["from"] == "v1" and shown["versions"]["to"] == "v2"
    assert shown["overlap"] == {"from_unix_s": run.v2_serving_unix_s, "to_unix_s": run.v1_stopped_unix_s}
    assert (shown["started_unix_s"], shown["ended_unix_s"]) == (run.v2_started_unix_s, run.v1_stopped_unix_s)
    assert shown["drain"]["decision"] == "terminate" and shown["drain"]["closed_by_reason"]["budget_exhausted"] >= 1
    assert shown["drain"]["actual_drain_s"] == drained["actual_drain_s"] >= run.plan.drain_budget_s
    assert shown["drain"]["terminated"] == drained["terminated"] >= 1
    assert shown["extra"]["removal_propagation_s"] == drained["propagation_s"] >= 0
    assert run.v2_serving_unix_s is not None and run.v1_drain_started_unix_s is not None
    assert run.v1_drain_started_unix_s - run.v2_serving_unix_s >= run.plan.overlap_s  # both served, then the drain


def test_the_baselines_are_v1_before_the_update_and_v2_after_it(run: LiveRolloutRun) -> None:
    assert run.v2_started_unix_s is not None and run.v1_stopped_unix_s is not None
    stored = _summaries(run).values()
    # a request that waited in the gateway's queue while v1 served alone may reach v2 once it joins: its
    # arrival places it, so outside the update it counts in v2's baseline
    outside = [r for r in stored if not run.v2_started_unix_s <= r["arrival_unix_s"] <= run.v1_stopped_unix_s]
    v1_before = [r for r in outside if r["version"] == "v1"]
    v2_outside = [r for r in outside if r["version"] == "v2"]
    assert all(r["arrival_unix_s"] < run.v2_started_unix_s for r in v1_before)
    assert _outcome(run, "v1", "baseline")["attempted"] == len(v1_before) >= 100
    assert _outcome(run, "v2", "baseline")["attempted"] == len(v2_outside) >= 100
    assert sum(r["arrival_unix_s"] > run.v1_stopped_unix_s for r in v2_outside) >= 100
    assert _outcome(run, "v1", "window")["attempted"] >= 100 and _outcome(run, "v2", "window")["attempted"] >= 100


def test_the_gateways_queue_holds_nobody_while_v1_serves_alone(run: LiveRolloutRun) -> None:
    # v1's engine has room for the load (16 sequences, about 5 busy at this rate), and the gateway knows its 16
    # slots (--backend ...,slots=16): its limit starts at 32, so nobody waits in the gateway's queue, from the
    # first request on. (Started at 2 (no slots), its slow start queued the first seconds' requests up to 1.4 s;
    # a limit on the p90 gap, which follows the arrival rate, held 5 and queued every request ~2 s.)
    assert run.v2_started_unix_s is not None
    waits = [r["queue_s"] for r in _summaries(run).values()
             if r["version"] == "v1" and r["arrival_unix_s"] < run.v2_started_unix_s]
    assert len(waits) >= 100 and None not in waits, waits  # each got a slot: none was refused
    assert statistics.median(waits) < 0.005 and max(waits) < 0.25, sorted(waits)[-20:]


def test_the_drain_cut_only_the_long_reply_and_refused_nothing_through_the_gateway(run: LiveRolloutRun) -> None:
    assert run.comparison is not None
    process = run.comparison["process"]
    (long,) = _attempts(run.long_attempts_log)
    stored = _summaries(run)
    assert stored[long["request_id"]]["finish_reason"] == "server_draining"
    assert stored[long["request_id"]]["version"] == "v1"
    (drained,) = run.rollout["batches"][0]["drained"]
    cut_rows = [r for r in stored.values() if r["finish_reason"] == "server_draining"]
    assert drained["terminated"] == len(cut_rows) >= 1 and {r["version"] for r in cut_rows} == {"v1"}
    cut, refused = process["terminated_by_version"], process["drain_rejected_by_version"]
    assert not any(refused.values()), process  # arrivals went to v2: none met the drain
    assert not [r for r in stored.values() if r["reject_reason"] == "draining"]
    # the window's process figures count the requests that arrived in it: the long reply arrived before
    lo, hi = run.comparison["window"]["from_unix_s"], run.comparison["window"]["to_unix_s"]
    in_window = [r for r in stored.values() if r["version"] == "v1" and lo <= r["arrival_unix_s"] <= hi]
    assert cut.get("v1", 0) == sum(r["finish_reason"] == "server_draining" for r in in_window)
    assert cut.get("v2", 0) == 0, process
    window = _outcome(run, "v1", "window")
    assert window["attempted"] == len(in_window)
    assert window["outcome_population"] == window["attempted"] - window["drain_ended"]


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
        finished = sum(r["version"] == version for r in _summaries(slow).values())
        row = next(line for line in text.splitlines() if line.startswith(f"│ {version} "))
        assert f"{finished:,}" in row, (row, finished)
    assert f"sent by the load: {slow.load['run']['sent']:,}, plus 1 long reply" in text
    assert "verdict: regression" in text
    for r in slow.comparison["regressions"]:
        assert any(r["version"] in line and r["metric"] in line and r["reference"] in line
                   for line in text.splitlines()), (r, text)
    assert "cut by reason: budget_exhausted" in text and "process figures (kept out of the outcome rates)" in text
    assert "removal propagated in" in text and "llmslo rollout run started v2" in text


def test_a_folder_holding_an_earlier_run_is_refused_naming_the_file_and_left_as_it_was(tmp_path: Path) -> None:
    earlier = tmp_path / "update-record.json"
    earlier.write_text("{}")
    with pytest.raises(LiveRunError, match=r"already holds a run \(update-record\.json\)"):
        run_live_rollout(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["update-record.json"]
    assert earlier.read_text() == "{}"
