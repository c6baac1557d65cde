"""Wait-budget advice and the drain-configuration check (llmslo.analysis.rollout, ``llmslo drain``)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from scipy.stats import norm
from typer.testing import CliRunner

from llmslo.analysis.rollout import (
    DRAIN_RULES,
    RolloutInputError,
    advise_wait_budget,
    check_drain_config,
    evaluate_drain_config,
    record_update,
)
from llmslo.analysis.rollout._advice import DRAIN_DEFAULTS
from llmslo.analysis.store import Store
from llmslo.cli._app import app
from llmslo.controls import DrainConfig

runner = CliRunner()

# The document's worked example: p95 duration 42 s, p99 110 s, caller timeout 300 s.
P95_S, P99_S, CALLER_TIMEOUT_S = 42.0, 110.0, 300.0
SIGMA = (math.log(P99_S) - math.log(P95_S)) / (norm.ppf(0.99) - norm.ppf(0.95))
MU = math.log(P95_S) - SIGMA * norm.ppf(0.95)
N = 20_000


def true_termination(budget_s: float) -> float:
    """Share of the fitted lognormal's durations above ``budget_s`` (the exact 1 − coverage)."""
    return float(norm.sf((math.log(budget_s) - MU) / SIGMA))


def lognormal_grid(n: int = N) -> np.ndarray:
    """Durations (s) at the mid-point quantiles of the lognormal with p95 42 s and p99 110 s."""
    return np.exp(MU + SIGMA * norm.ppf((np.arange(n) + 0.5) / n))


def store_rows(path: Path, e2e: Sequence[float], *, finish: Sequence[str] | None = None,
               streamed: Sequence[bool] | None = None, itl: Sequence[list[float]] | None = None) -> Path:
    """A store at ``path`` holding one admitted request per duration (seconds)."""
    n = len(e2e)
    e2e_s = np.asarray(e2e, dtype=float)
    data: dict[str, Any] = {
        "request_id": [f"r{i}" for i in range(n)], "model": "m", "version": "v1", "tenant_class": "interactive",
        "arrival_unix_s": 1_700_000_000.0 + np.arange(n) * 0.01,
        "finish_reason": list(finish) if finish is not None else ["stop"] * n,
        "ttft_s": np.minimum(0.1, e2e_s), "last_token_s": e2e_s, "e2e_s": e2e_s,
        "prompt_tokens": 10, "generated_tokens": 10, "sent_tokens": 10,
        "stream_max_queued": [4 if s else 0 for s in streamed] if streamed is not None else 0,
    }
    if itl is not None:
        data["itl_s"] = list(itl)
    with Store.open(path) as store:
        report = store.ingest_frame(pl.DataFrame(data))
        assert report.rows_inserted == n, report.errors
    return path


@pytest.fixture(scope="module")
def worked_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return store_rows(tmp_path_factory.mktemp("worked") / "s.duckdb", lognormal_grid())


@pytest.fixture
def con(worked_example: Path) -> Iterator[Any]:
    with Store.open(worked_example, read_only=True) as store:
        yield store.con


# ---- the advice ------------------------------------------------------------------------------------------


def test_worked_example_a_120s_budget_covers_about_99_percent_of_requests(con: Any) -> None:
    p95 = advise_wait_budget(con, caller_timeout_s=CALLER_TIMEOUT_S, quantile=0.95)
    assert p95.overall.quantile_s == pytest.approx(P95_S, rel=0.005)
    advice = advise_wait_budget(con, caller_timeout_s=CALLER_TIMEOUT_S)
    assert advice.overall.quantile_s == pytest.approx(P99_S, rel=0.005)
    assert advice.recommended_budget_s == math.ceil(advice.overall.quantile_s or 0)
    assert not advice.cap_binds
    assert advice.termination_rate == pytest.approx(0.01, abs=0.0005)

    at_120 = advise_wait_budget(con, caller_timeout_s=CALLER_TIMEOUT_S, budget_s=120, batches=4, settle_s=5)
    assert at_120.budget_s == 120
    assert at_120.coverage == pytest.approx(0.99, abs=0.005)  # "covers ~99 %"
    assert at_120.termination_rate == pytest.approx(true_termination(120), abs=0.0005)
    assert at_120.update_window_s == 4 * (5 + 120)


def test_the_caller_timeout_caps_the_budget_and_says_so(con: Any) -> None:
    capped = advise_wait_budget(con, caller_timeout_s=60)
    assert capped.recommended_budget_s == 60
    assert capped.cap_binds
    assert any("caller timeout (60 s) caps the budget" in n for n in capped.notes)
    assert capped.termination_rate == pytest.approx(true_termination(60), abs=0.0005)
    free = advise_wait_budget(con, caller_timeout_s=CALLER_TIMEOUT_S)
    assert not free.cap_binds and not any("caps" in n for n in free.notes)
    assert capped.termination_rate > free.termination_rate


def cut_store(path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """Lognormal durations where 60 % of the requests had an independent deadline uniform in [0, 150] s: the
    long ones were cut (deadline, server_draining or client_cancel) at that time."""
    rng = np.random.default_rng(7)
    duration = np.exp(MU + SIGMA * rng.standard_normal(N))
    limit = np.where(rng.random(N) < 0.6, rng.uniform(0, 150, N), np.inf)
    cut = duration > limit
    reasons = np.array(["deadline", "server_draining", "client_cancel"])[rng.integers(0, 3, N)]
    finish = np.where(cut, reasons, "stop")
    return store_rows(path, np.minimum(duration, limit), finish=list(finish)), duration, cut


def test_censoring_aware_termination_counts_the_requests_that_were_cut(tmp_path: Path) -> None:
    path, duration, cut = cut_store(tmp_path / "cut.duckdb")
    long = duration > 120
    assert np.mean(cut[long]) > 0.5  # most of the requests longer than the budget were cut
    with Store.open(path, read_only=True) as store:
        advice = advise_wait_budget(store.con, caller_timeout_s=CALLER_TIMEOUT_S, budget_s=120)
    assert advice.overall.censored == int(cut.sum())
    # Kaplan-Meier recovers the true share of requests longer than the budget ...
    assert advice.termination_rate == pytest.approx(float(np.mean(long)), abs=0.002)
    # ... while the completed requests alone make the budget look far safer than it is.
    assert advice.completed_only_termination_rate is not None
    assert advice.completed_only_termination_rate < 0.6 * advice.termination_rate
    assert advice.overall.quantile_s is not None and advice.overall.completed_only_quantile_s is not None
    assert advice.overall.completed_only_quantile_s < advice.overall.quantile_s


def test_a_quantile_the_cut_requests_leave_unbounded_gives_the_caller_timeout(tmp_path: Path) -> None:
    e2e = [1.0] * 90 + [20.0] * 10  # the 10 longest were all cut at 20 s: the p99 is at least 20 s
    path = store_rows(tmp_path / "s.duckdb", e2e, finish=["stop"] * 90 + ["deadline"] * 10)
    with Store.open(path, read_only=True) as store:
        advice = advise_wait_budget(store.con, caller_timeout_s=CALLER_TIMEOUT_S)
    assert advice.overall.quantile_s is None
    assert advice.overall.quantile_at_least_s == 20.0
    assert advice.recommended_budget_s == CALLER_TIMEOUT_S and advice.cap_binds
    assert any("unbounded (at least 20 s)" in n for n in advice.notes)


def test_streaming_and_non_streaming_durations_are_advised_apart(tmp_path: Path) -> None:
    streamed = [i % 2 == 0 for i in range(2000)]
    e2e = [10.0 + (i % 100) if s else 1.0 + (i % 100) / 100 for i, s in enumerate(streamed)]
    path = store_rows(tmp_path / "s.duckdb", e2e, streamed=streamed)
    with Store.open(path, read_only=True) as store:
        advice = advise_wait_budget(store.con, caller_timeout_s=CALLER_TIMEOUT_S)
    kinds = {k.kind: k for k in advice.by_kind}
    assert set(kinds) == {"streaming", "non_streaming"}
    assert kinds["streaming"].admitted == kinds["non_streaming"].admitted == 1000
    for kind, marked in (("streaming", True), ("non_streaming", False)):
        own = np.array([t for t, s in zip(e2e, streamed, strict=True) if s == marked])
        assert kinds[kind].quantile_s == np.quantile(own, 0.99, method="inverted_cdf")
        assert kinds[kind].budget_s == math.ceil(kinds[kind].quantile_s or 0)
    assert kinds["non_streaming"].budget_s < 3 < kinds["streaming"].budget_s
    assert advice.recommended_budget_s == kinds["streaming"].budget_s  # one budget covers both kinds
    assert kinds["non_streaming"].termination_rate == 0.0
    assert not any("cannot tell" in n for n in advice.notes)


def test_a_store_without_the_stream_marker_gives_one_distribution_and_says_so(con: Any) -> None:
    advice = advise_wait_budget(con, caller_timeout_s=CALLER_TIMEOUT_S)
    assert advice.by_kind == ()
    assert any("cannot tell streaming from non-streaming" in n for n in advice.notes)


def drain_section(budget_s: float, settle_s: float, in_flight: int, terminated: int) -> dict[str, Any]:
    """A drain section as ``DrainRecord.to_dict()`` gives it (every key)."""
    return {"from_version": "v1", "to_version": "v2", "batch": 1, "batches": 1, "started_unix_s": 1_700_000_000.0,
            "wait_budget_s": budget_s, "unregister_settle_s": settle_s, "actual_drain_s": budget_s,
            "in_flight_at_start": in_flight,
            "closed_by_reason": {"idle": 0, "max_inflight": 0, "budget_exhausted": terminated},
            "ended_by_reason": {"stop": in_flight - terminated}, "terminated": terminated, "timed_out": 0,
            "requeued": 0, "requeue_failed": 0, "remaining": 0, "decision": "terminate"}


def test_stored_updates_give_the_settle_and_the_observed_budget_curve(tmp_path: Path) -> None:
    path = store_rows(tmp_path / "s.duckdb", lognormal_grid(2000))
    record_update(path, {"update_id": "u-late", "drain": {**drain_section(60, 7, 40, 4),
                                                          "started_unix_s": 1_700_000_500.0}})
    hand_written = {k: v for k, v in drain_section(120, 3, 50, 1).items() if k not in ("timed_out", "requeued")}
    record_update(path, {"update_id": "u-early", "drain": hand_written})  # no impact section: the drain's counts
    with Store.open(path, read_only=True) as store:
        advice = advise_wait_budget(store.con, caller_timeout_s=CALLER_TIMEOUT_S, batches=2)
        given = advise_wait_budget(store.con, caller_timeout_s=CALLER_TIMEOUT_S, settle_s=0)
    assert advice.settle_s == 7 and "latest stored update" in advice.settle_source
    assert advice.update_window_s == 2 * (7 + advice.budget_s)
    assert [(o.update_id, o.wait_budget_s, o.termination_rate) for o in advice.observed] == [
        ("u-late", 60, 4 / 40), ("u-early", 120, 1 / 50)]
    assert given.settle_s == 0 and given.settle_source == "given"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"quantile": 1.5}, "quantile"),
    ({"quantile": 0.0}, "quantile"),
    ({"batches": 0}, "batches"),
    ({"batches": 1.5}, "batches"),
    ({"caller_timeout_s": -1.0}, "caller_timeout_s"),
    ({"caller_timeout_s": math.nan}, "caller_timeout_s"),
    ({"settle_s": -1.0}, "settle_s"),
    ({"from_unix_s": 2.0, "to_unix_s": 1.0}, "from_unix_s"),
])
def test_bad_advice_arguments_are_refused_naming_the_argument(con: Any, kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"caller_timeout_s": CALLER_TIMEOUT_S, **kwargs}
    with pytest.raises(RolloutInputError, match=f"^{field}: "):
        advise_wait_budget(con, **args)


def test_advice_over_an_empty_window_says_there_is_nothing_to_base_it_on(con: Any) -> None:
    with pytest.raises(RolloutInputError, match="no admitted request is stored in the window"):
        advise_wait_budget(con, caller_timeout_s=CALLER_TIMEOUT_S, from_unix_s=0.0, to_unix_s=1.0)


# ---- the configuration check -----------------------------------------------------------------------------


def test_the_config_keys_are_drain_configs_fields_with_its_defaults() -> None:
    fields = {f.name: f for f in dataclasses.fields(DrainConfig)}
    assert set(DRAIN_DEFAULTS) == set(fields)
    default = DrainConfig()
    for name, value in DRAIN_DEFAULTS.items():
        expected = getattr(default, name)
        assert (sorted(value) if name == "requeue_tenant_classes" else value) == \
            (sorted(expected) if name == "requeue_tenant_classes" else expected), name  # type: ignore[arg-type]


def by_rule(config: dict[str, Any], con: Any = None) -> dict[str, Any]:
    return {c.rule: c for c in evaluate_drain_config(config, con=con)}


def test_a_budget_above_the_caller_timeout_is_named_with_the_fix() -> None:
    (bad,) = check_drain_config({"wait_budget_s": 400, "caller_timeout_s": 300})
    assert bad.rule == "budget_within_caller_timeout"
    assert bad.values == {"wait_budget_s": 400.0, "caller_timeout_s": 300.0}
    assert "400 s exceeds caller_timeout_s 300 s" in bad.message and bad.fix == "lower wait_budget_s to at most 300"
    assert by_rule({"wait_budget_s": 300, "caller_timeout_s": 300})["budget_within_caller_timeout"].status == "pass"
    assert by_rule({})["budget_within_caller_timeout"].status == "skipped"


def test_the_idle_threshold_must_exceed_the_stored_p999_gap(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    gaps = [list(rng.exponential(0.05, 50)) + ([12.0] if i % 10 == 0 else []) for i in range(400)]
    path = store_rows(tmp_path / "s.duckdb", [5.0] * 400, itl=gaps)
    p999 = float(np.quantile(np.concatenate(gaps), 0.999, method="inverted_cdf"))
    assert p999 == 12.0
    with Store.open(path, read_only=True) as store:
        bad = by_rule({"idle_threshold_s": 10}, store.con)["idle_above_gap_p999"]
        ok = by_rule({"idle_threshold_s": 30}, store.con)["idle_above_gap_p999"]
    assert bad.status == "fail" and bad.values["gap_p999_s"] == p999 and bad.fix == "raise idle_threshold_s above 12"
    assert "stored itl_s gaps" in bad.message
    assert ok.status == "pass"


def test_the_idle_rule_falls_back_to_normal_gap_and_skips_without_either(con: Any) -> None:
    assert by_rule({"idle_threshold_s": 30}, con)["idle_above_gap_p999"].status == "skipped"  # no itl_s stored
    assert by_rule({"idle_threshold_s": 30})["idle_above_gap_p999"].status == "skipped"
    assert by_rule({"idle_threshold_s": None})["idle_above_gap_p999"].status == "skipped"
    fallback = by_rule({"idle_threshold_s": 30, "normal_gap_s": 30})["idle_above_gap_p999"]
    assert fallback.status == "fail" and "normal_gap_s" in fallback.message


def test_the_overlap_window_must_cover_the_update_window() -> None:
    config = {"wait_budget_s": 120, "unregister_settle_s": 5, "batches": 4}
    bad = by_rule({**config, "overlap_window_s": 499})["overlap_covers_update_window"]
    assert bad.status == "fail" and bad.values["update_window_s"] == 500
    assert bad.fix == "raise overlap_window_s to at least 500, or lower wait_budget_s or batches"
    assert by_rule({**config, "overlap_window_s": 500})["overlap_covers_update_window"].status == "pass"
    assert by_rule(config)["overlap_covers_update_window"].status == "skipped"


def test_every_violated_rule_is_listed() -> None:
    config = {"wait_budget_s": 400, "caller_timeout_s": 300, "idle_threshold_s": 1, "normal_gap_s": 2,
              "overlap_window_s": 10, "termination_grace_period_s": 60}
    assert [c.rule for c in check_drain_config(config)] == list(DRAIN_RULES)


def test_the_grace_period_must_cover_the_settle_the_budget_and_the_exit() -> None:
    config = {"wait_budget_s": 120, "unregister_settle_s": 5, "exit_margin_s": 15}

    def by_rule(c: dict[str, Any]) -> Any:
        return {x.rule: x for x in evaluate_drain_config(c)}["grace_covers_drain"]

    assert by_rule(config).status == "skipped"
    short = by_rule({**config, "termination_grace_period_s": 139})
    assert short.status == "fail" and short.fix == "raise termination_grace_period_s to at least 140, or lower " \
        "wait_budget_s"
    assert "unregister_settle_s 5 s + wait_budget_s 120 s + exit_margin_s 15 s = 140 s" in short.message
    assert by_rule({**config, "termination_grace_period_s": 140}).status == "pass"


@pytest.mark.parametrize(("config", "message"), [
    ({"wait_budget": 120}, "^wait_budget: unknown key"),
    ({"wait_budget_s": "2m"}, "^wait_budget_s: must be a finite number"),
    ({"wait_budget_s": 0}, "^wait_budget_s: must be a number > 0"),
    ({"batches": 0}, "^batches: must be a whole number"),
    ({"on_budget": "kill"}, "^on_budget: must be one of terminate, return_to_pool"),
    ({"requeue_tenant_classes": "batch"}, "^requeue_tenant_classes: must be a list"),
    ({"overlap_window_s": True}, "^overlap_window_s: must be a finite number"),
])
def test_a_bad_config_value_is_refused_naming_the_key(config: dict[str, Any], message: str) -> None:
    with pytest.raises(RolloutInputError, match=message):
        check_drain_config(config)


# ---- the commands ------------------------------------------------------------------------------------------


def test_drain_advise_prints_the_budget_and_its_json(worked_example: Path) -> None:
    argv = ["drain", "advise", "--db", str(worked_example), "--caller-timeout", "5m", "--batches", "3",
            "--settle", "5s", "--budget", "120s"]
    result = runner.invoke(app, [*argv, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["caller_timeout_s"] == 300 and data["budget_s"] == 120 and data["update_window_s"] == 3 * 125
    assert data["coverage"] == pytest.approx(0.99, abs=0.005)
    text = runner.invoke(app, argv)
    assert text.exit_code == 0, text.output
    assert "recommended wait_budget_s: 110" in text.stdout and "update window: 375 s" in text.stdout


def test_drain_advise_from_to_keeps_the_requests_that_arrived_in_the_window(worked_example: Path) -> None:
    # Arrivals are 10 ms apart from 1_700_000_000: [+20 s, +40 s) holds 2,000 of the 20,000 requests.
    argv = ["drain", "advise", "--db", str(worked_example), "--caller-timeout", "5m", "--json"]
    whole = json.loads(runner.invoke(app, argv).stdout)
    result = runner.invoke(app, [*argv, "--from", "1700000020", "--to", "2023-11-14T22:14:00Z"])
    assert result.exit_code == 0, result.output
    part = json.loads(result.stdout)
    assert whole["overall"]["admitted"] == N
    assert part["overall"]["admitted"] == 2_000


@pytest.mark.parametrize(("extra", "option"), [
    (["--from", "yesterday"], "--from"), (["--from", "20", "--to", "10"], "--to"),
    (["--quantile", "1.5"], "--quantile"), (["--batches", "0"], "--batches"), (["--settle", "-5s"], "--settle"),
    (["--caller-timeout", "soon"], "--caller-timeout"),
])
def test_drain_advise_bad_options_exit_2_naming_the_option(tmp_path: Path, extra: list[str], option: str) -> None:
    result = runner.invoke(app, ["drain", "advise", "--db", str(tmp_path / "none.duckdb"),
                                 "--caller-timeout", "300s", *extra])
    assert result.exit_code == 2, result.output
    assert option in result.output
    assert list(tmp_path.iterdir()) == []


def test_drain_advise_on_a_missing_store_exits_1_and_creates_nothing(tmp_path: Path) -> None:
    result = runner.invoke(app, ["drain", "advise", "--db", str(tmp_path / "none.duckdb"), "--caller-timeout", "5m"])
    assert result.exit_code == 1 and "no store at" in result.output
    assert list(tmp_path.iterdir()) == []


def test_drain_check_lists_every_violation_and_exits_1(tmp_path: Path) -> None:
    config = tmp_path / "drain.yaml"
    config.write_text("wait_budget_s: 400\ncaller_timeout_s: 300\nidle_threshold_s: 1\nnormal_gap_s: 2\n"
                      "overlap_window_s: 10\nbatches: 2\ntermination_grace_period_s: 30\n", encoding="utf-8")
    result = runner.invoke(app, ["drain", "check", str(config)])
    assert result.exit_code == 1, result.output
    for rule in DRAIN_RULES:
        assert f"FAIL {rule}" in result.stdout
    as_json = runner.invoke(app, ["drain", "check", str(config), "--json"])
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout)["violations"] == list(DRAIN_RULES)


def test_drain_check_passes_a_good_config(tmp_path: Path) -> None:
    config = tmp_path / "drain.yaml"
    config.write_text("wait_budget_s: 120\ncaller_timeout_s: 300\nidle_threshold_s: 30\nnormal_gap_s: 2\n"
                      "overlap_window_s: 600\nbatches: 4\ntermination_grace_period_s: 140\n"
                      "exit_margin_s: 15\n", encoding="utf-8")
    result = runner.invoke(app, ["drain", "check", str(config), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] and [c["status"] for c in data["checks"]] == ["pass"] * 4


@pytest.mark.parametrize(("text", "message"), [
    (None, "cannot read"),
    ("wait_budget_s: [1, 2\n", "not valid YAML"),
    ("- 1\n- 2\n", "must be a mapping"),
    ("wait_budgett_s: 120\n", "wait_budgett_s: unknown key"),
])
def test_drain_check_bad_files_exit_1_naming_the_file(tmp_path: Path, text: str | None, message: str) -> None:
    config = tmp_path / "drain.yaml"
    if text is not None:
        config.write_text(text, encoding="utf-8")
    result = runner.invoke(app, ["drain", "check", str(config)])
    assert result.exit_code == 1, result.output
    assert message in result.output and "drain.yaml" in result.output
