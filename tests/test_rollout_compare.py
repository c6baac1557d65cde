"""Version comparison during an update's overlap window (``compare_versions``, ``llmslo rollout compare``).

Rules protected: the false-alarm target holds (50 null comparisons of identical versions split at random: at
most 2 ``regression`` verdicts at the default level, Holm over the family of tests) and a +20 % TTFT shift of
one version is found in at least 9 of 10 runs; a regression names the version, the metric and the tenant
class it concentrates in; requests the drain ended are process figures, never outcome regressions; the
baseline leaves out every stored update's window; an update's from → to pair is judged in that direction;
too little data gives ``insufficient_data`` with the minimum stated; bad input is refused naming the field;
the CLI prints a table per section with the policy, data literally, and one JSON object with ``--json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from llmslo.analysis.report import GoodputPolicy
from llmslo.analysis.rollout import (
    MISSING_TERMINAL_EVENTS,
    RolloutInputError,
    VersionComparison,
    compare_versions,
    record_update,
)
from llmslo.analysis.rollout import _compare as implementation
from llmslo.analysis.store import Store
from llmslo.cli._app import app
from llmslo.telemetry import ConfigurationError
from llmslo.tests._rollout_rows import T0, RolloutScenario, rollout_frame
from llmslo.tests._rows import ok_row

runner = CliRunner()


def _compare(seed: int, scenario: RolloutScenario | None = None, **kwargs: Any) -> VersionComparison:
    scenario = scenario or RolloutScenario()  # about 300 requests per version in the baseline, 600 in the window
    lo, hi = scenario.window
    with Store.open(":memory:") as store:
        store.ingest_frame(rollout_frame(seed, scenario))
        return compare_versions(store.con, from_unix_s=lo, to_unix_s=hi, **kwargs)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "s.duckdb"
    with Store.open(path) as store:
        store.ingest_frame(rollout_frame(7, RolloutScenario(drained_share=0.05, ttft_factor={"v2:batch": 1.5})))
    yield path


# ---- the proof -------------------------------------------------------------------------------------------


def test_null_comparisons_give_at_most_two_false_regressions_in_fifty() -> None:
    # 50 independent rollouts in one store: each its own versions and its own stretch of time, so that each
    # comparison sees only its own requests (in the window and in its versions' baselines)
    runs = [RolloutScenario(drained_share=0.05, versions=(f"a{k}", f"b{k}"), start_unix_s=T0 + k * 10_000.0)
            for k in range(50)]
    with Store.open(":memory:") as store:
        store.ingest_frame(pl.concat([rollout_frame(1000 + k, run) for k, run in enumerate(runs)]))
        results = [compare_versions(store.con, from_unix_s=run.window[0], to_unix_s=run.window[1]) for run in runs]
    assert all({o.version for o in r.outcomes} == set(run.versions) for r, run in zip(results, runs, strict=True))
    verdicts = [r.verdict for r in results]
    assert verdicts.count("regression") <= 2, [r.reasons for r in results if r.verdict == "regression"]
    assert verdicts.count("insufficient_data") == 0


def test_a_twenty_percent_ttft_shift_on_one_version_is_found_in_nine_of_ten_runs() -> None:
    scenario = RolloutScenario(ttft_factor={"v2": 1.2})
    found = 0
    for seed in range(2000, 2010):
        result = _compare(seed, scenario)
        found += any(r.version == "v2" and r.metric == "ttft_s" for r in result.regressions)
        assert all(r.version == "v2" for r in result.regressions), result.reasons
    assert found >= 9


# ---- what a verdict says ---------------------------------------------------------------------------------


def test_a_regression_names_version_metric_size_and_the_tenant_class_it_concentrates_in() -> None:
    result = _compare(5, RolloutScenario(ttft_factor={"v2:batch": 1.6}))
    assert result.verdict == "regression"
    (reg,) = [r for r in result.regressions if r.metric == "ttft_s"]
    assert (reg.version, reg.kind, reg.reference) == ("v2", "between_versions", "v1 window")
    assert reg.tenant_classes == ("batch",)
    assert reg.difference > 0 and reg.ci_low is not None and reg.ci_low > 0
    assert reg.relative_change is not None and reg.relative_change > 0.05
    assert reg.p_adjusted <= 0.01
    assert "v2: ttft_s median +" in reg.text() and "batch" in reg.text()


def test_a_shift_only_during_the_window_is_found_against_the_versions_own_baseline() -> None:
    result = _compare(11, RolloutScenario(ttft_factor={"v1": 1.4}, window_only=True))
    kinds = {(r.version, r.kind, r.metric) for r in result.regressions}
    assert ("v1", "version_vs_baseline", "ttft_s") in kinds
    assert all(r.version == "v1" for r in result.regressions)


def test_requests_the_drain_ended_are_process_figures_and_no_outcome_regression() -> None:
    result = _compare(3, RolloutScenario(drained_share=0.3))
    assert result.verdict == "lossless", result.reasons
    v1 = next(o for o in result.outcomes if (o.version, o.side) == ("v1", "window"))
    assert v1.drain_ended > 0 and v1.outcome_population == v1.attempted - v1.drain_ended
    assert result.process.terminated_by_version == {"v1": v1.drain_ended, "v2": 0}
    figures = v1.to_dict()
    assert figures["goodput_fraction_all"] < figures["goodput_fraction"] - 0.2  # definitions.md's denominator
    assert figures["missing_terminal_event_rate"] is None
    assert result.to_dict()["missing_terminal_events"] == {"measurable": False, "reason": MISSING_TERMINAL_EVENTS}


def test_too_few_requests_give_insufficient_data_with_the_minimum_stated() -> None:
    result = _compare(1, RolloutScenario(n_baseline=160, n_window=160))
    assert result.verdict == "insufficient_data"
    assert "at least 100 requests and latency samples per version and side" in result.reasons[0]
    skipped = [c for c in result.comparisons if c.skipped]
    assert skipped and all("needs at least 100 on each side" in (c.skipped or "") for c in skipped)


def test_one_version_in_the_window_cannot_be_judged() -> None:
    result = _compare(1, RolloutScenario(versions=("v1",)))
    assert result.verdict == "insufficient_data"
    assert any("1 version(s) served requests in the window (v1)" in r for r in result.reasons)


def test_family_is_every_metric_of_every_comparison_and_holm_adjusts_it() -> None:
    result = _compare(4)
    tested = [c for c in result.comparisons if c.p_value is not None]
    assert len(tested) == 3 * 6  # (v1, v2 against baselines, v1 against v2) x (4 rates + 2 latencies)
    assert result.to_dict()["tests_in_family"] == 18 and result.to_dict()["correction"] == "holm"
    smallest = min(tested, key=lambda c: c.p_value or 1.0)
    assert smallest.p_adjusted == pytest.approx(min(1.0, 18 * (smallest.p_value or 0.0)))
    assert implementation._holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_rate_interval_is_newcombes_hybrid_score_interval() -> None:
    # Newcombe (1998), Statistics in Medicine 17:873, table II example: 56/70 vs 48/80, method 10
    lo, hi = implementation._newcombe(48, 80, 56, 70)
    assert (round(lo, 4), round(hi, 4)) == (0.0524, 0.3339)


# ---- update records --------------------------------------------------------------------------------------


def _update(update_id: str, lo: float, hi: float, versions: tuple[str, str] = ("v1", "v2")) -> dict[str, Any]:
    return {
        "update_id": update_id, "versions": {"from": versions[0], "to": versions[1]},
        "started_unix_s": lo, "ended_unix_s": hi, "overlap": {"from_unix_s": lo, "to_unix_s": hi},
        "drain": {"wait_budget_s": 120.0, "actual_drain_s": 42.5, "unregister_settle_s": 5.0,
                  "terminated": 3, "closed_by_reason": {"idle": 1, "max_inflight": 0, "budget_exhausted": 2}},
    }


def _fast_rows(lo: float, n: int) -> pl.DataFrame:
    """``n`` very fast v1 requests from ``lo`` on (TTFT 50 ms): a baseline that held them would look better."""
    return pl.DataFrame([ok_row(i, request_id=f"fast-{i}", arrival_unix_s=lo + i * 0.5, ttft_s=0.05,
                                queue_s=0.01, last_token_s=1.05, e2e_s=1.06) for i in range(n)])


def test_update_window_is_compared_and_other_updates_windows_leave_the_baseline(tmp_path: Path) -> None:
    scenario = RolloutScenario()
    lo, hi = scenario.window
    path = tmp_path / "s.duckdb"
    with Store.open(path) as store:
        store.ingest_frame(rollout_frame(21, scenario))
        store.ingest_frame(_fast_rows(T0 + 600.0, 800))  # inside an earlier update's window
        record_update(store, _update("u-0", T0 + 590.0, T0 + 1000.0, ("v0", "v1")))
        record_update(store, _update("u-1", lo, hi))
        result = compare_versions(store.con, update_id="u-1")
        explicit = compare_versions(store.con, from_unix_s=lo, to_unix_s=hi)
    assert (result.window.from_unix_s, result.window.to_unix_s, result.window.update_id) == (lo, hi, "u-1")
    assert (T0 + 590.0, T0 + 1000.0) in result.window.excluded_from_baseline
    assert result.verdict == "lossless", result.reasons
    base = next(o for o in result.outcomes if (o.version, o.side) == ("v1", "baseline"))
    assert base.attempted < 800  # the fast rows are not in it
    assert explicit.window.excluded_from_baseline == result.window.excluded_from_baseline
    process = result.process.to_dict()["update"]
    assert process["wait_budget_s"] == 120.0 and process["actual_drain_s"] == 42.5
    assert process["unregister_settle_s"] == 5.0 and process["terminated"] == 3
    assert "update" not in {k for o in result.to_dict()["outcomes"] for k in o}


def test_an_update_is_judged_from_old_to_new_version_only(tmp_path: Path) -> None:
    scenario = RolloutScenario(ttft_factor={"v1": 1.4})  # the old version is the slow one
    lo, hi = scenario.window
    with Store.open(tmp_path / "s.duckdb") as store:
        store.ingest_frame(rollout_frame(8, scenario))
        record_update(store, _update("u-1", lo, hi))
        by_update = compare_versions(store.con, update_id="u-1")
        explicit = compare_versions(store.con, from_unix_s=lo, to_unix_s=hi)
    between = next(c for c in by_update.comparisons if c.kind == "between_versions" and c.metric == "ttft_s")
    assert (between.reference, between.candidate, between.direction) == ("v1 window", "v2 window", "better")
    assert by_update.verdict == "lossless"  # the new version is faster: an improvement
    assert [r.version for r in explicit.regressions if r.metric == "ttft_s"] == ["v1"]  # no known direction


def test_an_unknown_update_is_refused_naming_it_and_where_to_look(db: Path) -> None:
    with Store.open(db, read_only=True) as store, pytest.raises(RolloutInputError) as info:
        compare_versions(store.con, update_id="nope")
    assert "update_id: no update 'nope'" in str(info.value) and "llmslo rollout list" in str(info.value)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"from_unix_s": T0 + 10, "to_unix_s": T0}, "at or before it starts"),
    ({"from_unix_s": T0}, "both from_unix_s and to_unix_s"),
    ({"update_id": "u", "from_unix_s": T0, "to_unix_s": T0 + 1}, "not both"),
    ({"from_unix_s": math.nan, "to_unix_s": T0}, "compare_versions.from_unix_s"),
    ({"from_unix_s": T0, "to_unix_s": T0 + 1, "alpha": 1.5}, "compare_versions.alpha"),
    ({"from_unix_s": T0, "to_unix_s": T0 + 1, "min_side_count": 1}, "compare_versions.min_side_count"),
    ({"from_unix_s": T0, "to_unix_s": T0 + 1, "policy": "fast"}, "compare_versions.policy"),
])
def test_bad_arguments_are_refused_naming_the_field(db: Path, kwargs: dict[str, Any], message: str) -> None:
    with Store.open(db, read_only=True) as store, pytest.raises(ConfigurationError, match=message):
        compare_versions(store.con, **kwargs)


def test_the_policy_decides_goodput_and_is_carried_in_the_result() -> None:
    strict = _compare(2, policy=GoodputPolicy(ttft_s=0.3))
    loose = _compare(2)
    v1 = [o.to_dict()["goodput_fraction"] for o in (strict.outcomes[0], loose.outcomes[0])]
    assert v1[0] < v1[1]
    assert strict.to_dict()["policy"]["ttft_s"] == 0.3


# ---- the command -----------------------------------------------------------------------------------------


def _cli(*args: str) -> Any:
    return runner.invoke(app, ["rollout", "compare", *args])


def test_cli_prints_a_table_per_section_the_policy_and_the_verdict(db: Path) -> None:
    lo, hi = RolloutScenario().window
    result = _cli("--db", str(db), "--from", f"{lo}", "--to", f"{hi}", "--ttft", "1s")
    assert result.exit_code == 0, result.output
    out = result.output
    for section in ("Outcomes per version", "Comparisons", "Process figures", "missing terminal events:",
                    "policy: good = finish_reason in {length, stop} and ttft_s <= 1s", "verdict: regression"):
        assert section in out
    assert out.index("Outcomes per version") < out.index("Process figures")


def test_cli_json_equals_the_library_and_takes_iso_times(db: Path) -> None:
    lo, hi = RolloutScenario().window
    iso = [f"{_iso(t)}" for t in (lo, hi)]
    unix = _cli("--db", str(db), "--from", f"{lo}", "--to", f"{hi}", "--json")
    by_iso = _cli("--db", str(db), "--from", iso[0], "--to", iso[1], "--json")
    assert unix.exit_code == 0 and by_iso.exit_code == 0, by_iso.output
    data = json.loads(unix.output)
    assert data == json.loads(by_iso.output)
    with Store.open(db, read_only=True) as store:
        assert data == json.loads(json.dumps(compare_versions(store.con, from_unix_s=lo, to_unix_s=hi).to_dict()))
    assert data["verdict"] == "regression" and data["regressions"][0]["tenant_classes"] == ["batch"]
    assert set(data) >= {"window", "policy", "outcomes", "comparisons", "process", "verdict", "reasons"}


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, tz=UTC).isoformat()


@pytest.mark.parametrize(("args", "message"), [
    (["--update", "u", "--from", "1"], "not both"),
    (["--from", "1"], "give --update ID, or both --from T and --to T"),
    (["--from", "yesterday", "--to", "2"], "--from: 'yesterday' is neither Unix seconds nor an ISO 8601 time"),
    (["--from", "10", "--to", "5"], "--to (5) must be after --from (10)"),
    (["--from", "1", "--to", "2", "--ttft", "0"], "--ttft"),
    (["--from", "1", "--to", "2", "--alpha", "0"], "--alpha"),
])
def test_cli_bad_command_lines_exit_2_naming_the_option(db: Path, args: list[str], message: str) -> None:
    result = _cli("--db", str(db), *args)
    assert result.exit_code == 2 and message in result.output, result.output


def test_cli_missing_store_or_update_exits_1_and_writes_nothing(tmp_path: Path, db: Path) -> None:
    missing = tmp_path / "none.duckdb"
    result = _cli("--db", str(missing), "--from", "1", "--to", "2")
    assert result.exit_code == 1 and "no store at" in result.output and not missing.exists()
    result = _cli("--db", str(db), "--update", "nope")
    assert result.exit_code == 1 and "no update 'nope'" in result.output


def test_cli_shows_versions_literally(tmp_path: Path) -> None:
    scenario = RolloutScenario(versions=("[bold]v1\x1b[2J", "v2"))
    path = tmp_path / "s.duckdb"
    with Store.open(path) as store:
        store.ingest_frame(rollout_frame(3, scenario))
    lo, hi = scenario.window
    result = _cli("--db", str(path), "--from", f"{lo}", "--to", f"{hi}")
    assert result.exit_code == 0, result.output
    assert "[bold]v1\\x1b[2J" in result.output and "\x1b" not in result.output


def test_cli_defaults_are_the_librarys() -> None:
    import inspect

    from llmslo.analysis.rollout import DEFAULT_ALPHA, MIN_SIDE_COUNT
    from llmslo.cli._rollout_compare import compare_command

    params = inspect.signature(compare_command).parameters
    assert (params["alpha"].default, params["min_count"].default) == (DEFAULT_ALPHA, MIN_SIDE_COUNT)
