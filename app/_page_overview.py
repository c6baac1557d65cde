"""Overview: goodput by window under the printed policy, attempted vs good, finish reasons, survivor bias."""

from __future__ import annotations

import streamlit as st

from llmslo.app import _charts as charts
from llmslo.app import _compute as compute
from llmslo.app._context import Context, current
from llmslo.app._show import fraction, window_frame
from llmslo.app._widgets import chart, header, notes, policy_block, problem, seconds_columns, selection_text, table
from llmslo.telemetry import LlmsloError

__all__ = ["render"]

PURPOSE = ("Goodput counts every arrival (rejected, cancelled, timed out and failed ones included) and calls a "
           "request good only under the policy printed below; each window holds the requests that arrived in it.")


def _totals(ctx: Context) -> bool:
    """The totals over the selection, with the policy; False when there is nothing to show."""
    whole = compute.report(ctx.opened.store.con, ctx.opened.token, ctx.selection, ctx.windowless_policy)
    t = whole.totals
    st.text(selection_text(ctx, t.requests))
    cols = st.columns(4)
    cols[0].metric("Attempted", f"{t.attempted:,}")
    cols[1].metric("Good", f"{t.good:,}")
    cols[2].metric("In flight", f"{t.in_flight:,}")
    cols[3].metric("Goodput fraction (good / settled)", fraction(t.goodput_fraction))
    policy_block(ctx.policy)
    notes(whole.caveats, title="What the stored rows cannot support")
    if t.requests == 0:
        st.info("No request summaries in the selection: nothing to show. Load some with `llmslo ingest FILES "
                "--db STORE` or widen the filters.")
        return False
    return True


def _windows(ctx: Context) -> None:
    if ctx.contents.with_arrival == 0:
        st.info("The stored rows carry no arrival times (imported from files without them): they cannot be "
                "placed in windows, so goodput by window, its trend and the per-window survivor-bias verdict "
                "cannot be shown. The totals above cover the whole run.")
        return
    windowed = compute.report(ctx.opened.store.con, ctx.opened.token, ctx.timed_selection, ctx.policy)
    frame = window_frame(windowed)
    st.subheader("Goodput by window")
    chart(charts.goodput(frame))
    left, right = st.columns(2)
    with left:
        chart(charts.attempted_good(frame))
    with right:
        chart(charts.finish_reasons(frame))
    chart(charts.verdicts(frame))
    table(frame, config=seconds_columns(frame))
    notes(windowed.rate_basis.exceptions, title="Per-second rates that divide by something else, or are null")
    if ctx.contents.without_arrival:
        notes([f"{ctx.contents.without_arrival:,} stored row(s) come from imports without arrival times: they fit "
               "no window and are left out of the windows (the totals above include them)"])


def render(ctx: Context) -> None:
    """Draw the page."""
    header(ctx, "Overview", PURPOSE)
    try:
        if _totals(ctx):
            _windows(ctx)
    except LlmsloError as exc:
        problem(str(exc))


if __name__ == "__main__":
    render(current())
