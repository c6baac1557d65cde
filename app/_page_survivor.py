"""Survivor bias: success-only against censoring-aware (Kaplan–Meier) TTFT per window, and the shed fraction."""

from __future__ import annotations

import streamlit as st

from llmslo.app import _charts as charts
from llmslo.app import _compute as compute
from llmslo.app._context import Context, current
from llmslo.app._show import fraction, survivor_frame
from llmslo.app._widgets import chart, header, policy_block, problem, seconds_columns, selection_text, table
from llmslo.telemetry import LlmsloError

__all__ = ["render"]

PURPOSE = ("A request that ended without a first token after waiting w seconds has a TTFT of at least w: the "
           "censoring-aware estimate counts it so, the success-only one drops it. Both are nearest-rank "
           "quantiles, so a window with nothing censored is consistent. A window is optimistic when the "
           "success-only quantile is better by more than the tolerance and by more than sampling explains "
           "(Greenwood's band; p90 needs 50 admitted requests, p99 500), when a large share of its requests was "
           "shed or cancelled, or when that share clearly rose while the success-only tail improved.")


def _whole(ctx: Context) -> None:
    whole = compute.report(ctx.opened.store.con, ctx.opened.token, ctx.selection, ctx.windowless_policy)
    st.text(selection_text(ctx, whole.totals.requests))
    if whole.totals.requests == 0:
        st.info("No request summaries in the selection: nothing to show.")
        return
    st.info("The stored rows carry no arrival times: the check cannot be made per window (nor the trend of the "
            "shed fraction between windows); below is the whole selection.")
    frame = survivor_frame(whole)
    table(frame, config=seconds_columns(frame))


def _by_window(ctx: Context) -> None:
    windowed = compute.report(ctx.opened.store.con, ctx.opened.token, ctx.timed_selection, ctx.policy)
    st.text(selection_text(ctx, windowed.totals.requests))
    if windowed.totals.requests == 0:
        st.info("No request summaries in the selection: nothing to show.")
        return
    frame = survivor_frame(windowed)
    optimistic = int((frame["verdict"] == "optimistic").sum())
    cols = st.columns(2)
    cols[0].metric("Windows judged optimistic", f"{optimistic} of {frame.height}")
    shed: list[float] = frame["shed_cancel_fraction"].drop_nulls().to_list()
    cols[1].metric("Highest shed / cancel fraction", fraction(max(shed, default=None)))
    chart(charts.survivor(frame, "p99"))
    chart(charts.survivor(frame, "p90"))
    chart(charts.shed(frame))
    st.subheader("Per window (seconds)")
    table(frame, config=seconds_columns(frame))


def render(ctx: Context) -> None:
    """Draw the page."""
    header(ctx, "Survivor bias", PURPOSE)
    policy_block(ctx.policy)
    try:
        if ctx.contents.with_arrival == 0:
            _whole(ctx)
        else:
            _by_window(ctx)
    except LlmsloError as exc:
        problem(str(exc))


if __name__ == "__main__":
    render(current())
