"""Rollouts: the stored update records and the version comparison of one update."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl
import streamlit as st

from llmslo.analysis.rollout import UpdateRecord, VersionComparison
from llmslo.app import _compute as compute
from llmslo.app._context import Context, current
from llmslo.app._show import literal, utc
from llmslo.app._widgets import header, notes, policy_block, problem, seconds_columns, table
from llmslo.telemetry import LlmsloError

__all__ = ["comparisons_frame", "outcomes_frame", "render", "updates_frame"]

PURPOSE = ("Every rolling update is a record in the store (llmslo rollout record). An update's versions are "
           "compared during its overlap window, each against its own baseline outside every update window and "
           "against each other, with Holm's correction over all tests (docs/rollouts.md). The sidebar's "
           "filters do not apply here: a comparison takes every request of its window; its thresholds do.")


def updates_frame(updates: list[UpdateRecord]) -> pl.DataFrame:
    """One row per update record: versions, times (UTC and Unix seconds), the drain and impact figures."""
    rows = [{"update_id": literal(u.update_id), "from_version": literal(u.from_version),
             "to_version": literal(u.to_version), "started": utc(u.started_unix_s), "ended": utc(u.ended_unix_s),
             "started_unix_s": u.started_unix_s, "ended_unix_s": u.ended_unix_s,
             "overlap_from_unix_s": u.overlap_from_unix_s, "overlap_to_unix_s": u.overlap_to_unix_s,
             "batch": None if u.batch_index is None else f"{u.batch_index} of {u.batches or '?'}",
             "wait_budget_s": u.wait_budget_s, "actual_drain_s": u.actual_drain_s,
             "unregister_settle_s": u.unregister_settle_s, "in_flight_at_start": u.in_flight_at_start,
             "terminated": u.terminated, "timed_out": u.timed_out, "requeued": u.requeued,
             "rollback_triggered": u.rollback_triggered} for u in updates]
    schema = {"update_id": pl.String, "from_version": pl.String, "to_version": pl.String, "started": pl.String,
              "ended": pl.String, "started_unix_s": pl.Float64, "ended_unix_s": pl.Float64,
              "overlap_from_unix_s": pl.Float64, "overlap_to_unix_s": pl.Float64, "batch": pl.String,
              "wait_budget_s": pl.Float64, "actual_drain_s": pl.Float64, "unregister_settle_s": pl.Float64,
              "in_flight_at_start": pl.Int64, "terminated": pl.Int64, "timed_out": pl.Int64, "requeued": pl.Int64,
              "rollback_triggered": pl.Boolean}
    return pl.DataFrame(rows, schema=schema, orient="row")


def outcomes_frame(result: VersionComparison) -> pl.DataFrame:
    """One row per version and side (window, baseline): counts, rates and TTFT / e2e quantiles (seconds)."""
    rows: list[dict[str, Any]] = []
    for o in result.outcomes:
        d = o.to_dict()
        rows.append({"version": literal(o.version), "side": o.side, "attempted": o.attempted,
                     "drain_ended": o.drain_ended, "outcome_population": o.outcome_population, "errors": o.errors,
                     "timeouts": o.timeouts, "rejected": o.rejected, "good": o.good,
                     "error_rate": d["error_rate"], "timeout_rate": d["timeout_rate"],
                     "rejected_share": d["rejected_share"], "goodput_fraction": d["goodput_fraction"],
                     "ttft_p50_s": o.ttft.p50_s, "ttft_p99_s": o.ttft.p99_s, "e2e_p50_s": o.e2e.p50_s,
                     "e2e_p99_s": o.e2e.p99_s})
    return pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()


def comparisons_frame(result: VersionComparison) -> pl.DataFrame:
    """One row per test: metric, candidate against reference, estimates, difference with its 95 % interval,
    the Holm-adjusted p, the direction, and whether it is a regression (or why it was skipped)."""
    rows = [{"metric": c.metric, "kind": c.kind, "candidate": literal(c.candidate), "reference": literal(c.reference),
             "n_candidate": c.n_candidate, "n_reference": c.n_reference,
             "estimate_candidate": c.estimate_candidate, "estimate_reference": c.estimate_reference,
             "difference": c.difference, "ci95_low": c.ci_low, "ci95_high": c.ci_high, "test": c.test,
             "p_adjusted": c.p_adjusted, "direction": c.direction, "regression": c.finding is not None,
             "skipped": None if c.skipped is None else literal(c.skipped)} for c in result.comparisons]
    return pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{literal(k)} {v:,}" for k, v in counts.items()) or "none"


def _comparison(ctx: Context, updates: list[UpdateRecord]) -> None:
    ids = [u.update_id for u in updates]
    # first choice: the latest update whose record says when it was (one without times is not comparable)
    placed = [i for i, u in enumerate(updates) if u.window() is not None]
    chosen = st.selectbox("Compare the versions of update", ids, index=placed[-1] if placed else len(ids) - 1,
                          format_func=literal, key="rollout_update")
    policy_block(ctx.windowless_policy)
    result = compute.comparison(ctx.opened.store.con, ctx.opened.token, chosen, ctx.windowless_policy)
    st.subheader(f"Verdict: {result.verdict}")
    st.text(f"window {utc(result.window.from_unix_s)} to {utc(result.window.to_unix_s)} UTC, alpha "
            f"{result.alpha:g} (familywise, Holm)")
    notes([r.text() for r in result.regressions], title="Regressions (where, how big)")
    notes(result.reasons, title="Why")
    st.caption("Outcomes by version and side")
    outcomes = outcomes_frame(result)
    table(outcomes, config=seconds_columns(outcomes))
    st.caption("Tests")
    tests = comparisons_frame(result)
    table(tests)
    process = result.process
    notes([f"terminated by version: {_counts(process.terminated_by_version)}",
           f"drain-rejected by version: {_counts(process.drain_rejected_by_version)}", *process.notes],
          title="The update procedure (kept apart from the versions' outcomes)")
    notes(result.notes, title="Notes")


def render(ctx: Context) -> None:
    """Draw the page."""
    header(ctx, "Rollouts", PURPOSE)
    try:
        updates = compute.updates(ctx.opened.store.con, ctx.opened.token)
        if not updates:
            st.info("No update records are stored: record one with `llmslo rollout record update.json --db "
                    "STORE` (docs/rollouts.md), or compare any window with `llmslo rollout compare --from ... "
                    "--to ...`.")
            return
        frame = updates_frame(updates)
        table(frame, config=seconds_columns(frame))
        _comparison(ctx, updates)
    except LlmsloError as exc:
        problem(str(exc))


if __name__ == "__main__":
    render(current())
