"""Latency: TTFT, TPOT, ITL, e2e and queue time as exact quantiles, SLO-aligned histograms and ECDFs."""

from __future__ import annotations

import dataclasses

import streamlit as st

from llmslo.analysis import GoodputPolicy, Report
from llmslo.app import _charts as charts
from llmslo.app import _compute as compute
from llmslo.app._context import Context, current
from llmslo.app._show import latency_frame, seconds
from llmslo.app._widgets import chart, header, problem, seconds_columns, selection_text, table
from llmslo.telemetry import LlmsloError

__all__ = ["INTERVALS", "render"]

PURPOSE = ("Every request for which an interval is defined counts in it, whatever its finish reason; quantiles "
           "are exact (linear interpolation), histogram buckets contain the SLO thresholds, and the dashed rule "
           "on each curve is the threshold set in the sidebar.")
# (interval, tab title) of the distributions shown. (No bare strings at the top level of a page script:
# Streamlit's "magic" would draw them.)
INTERVALS: tuple[tuple[str, str], ...] = (
    ("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "End-to-end"), ("queue_s", "Queue"))
_BY = {"nothing": (), "model": ("model",), "version": ("version",), "tenant class": ("tenant_class",)}


def _threshold(policy: GoodputPolicy, interval: str) -> float | None:
    return {"ttft_s": policy.ttft_s, "tpot_s": policy.tpot_s, "e2e_s": policy.e2e_s}.get(interval)


def _interval_tab(ctx: Context, report: Report, interval: str, by: tuple[str, ...]) -> None:
    total = sum(g.latency[interval].count for g in report.groups)
    if total == 0:
        st.text(f"No request in the selection has a value for {interval}: nothing to draw.")
        return
    threshold = _threshold(ctx.policy, interval)
    left, right = st.columns(2)
    with left:
        chart(charts.histogram(report, interval, threshold))
    with right:
        curves = compute.ecdf(ctx.opened.store.con, ctx.opened.token, ctx.selection, interval, by)
        chart(charts.ecdf(curves, interval, threshold))


def _client_vs_server(ctx: Context, report: Report, by: tuple[str, ...]) -> None:
    st.subheader("Client vs server TTFT")
    client = sum(g.latency["client_ttft_s"].count for g in report.groups)
    if client == 0:
        st.text("No row carries a client-side TTFT (client_ttft_s): a load generator records it on its own "
                "clock. Only the server's TTFT is shown above.")
        return
    frame = latency_frame(report, ("ttft_s", "client_ttft_s"))
    table(frame, config=seconds_columns(frame))
    curves = [dataclasses.replace(c, keys={**c.keys, "clock": clock})  # one curve per clock and group
              for interval, clock in (("ttft_s", "server"), ("client_ttft_s", "client"))
              for c in compute.ecdf(ctx.opened.store.con, ctx.opened.token, ctx.selection, interval, by)]
    chart(charts.ecdf(curves, "ttft_s vs client_ttft_s", ctx.policy.ttft_s))


def _key_figures(ctx: Context) -> None:
    """The medians and tails over the whole selection, whatever the grouping."""
    whole = compute.report(ctx.opened.store.con, ctx.opened.token, ctx.selection, ctx.windowless_policy)
    if not whole.groups:
        return
    (g,) = whole.groups
    cols = st.columns(5)
    for col, (label, interval, q) in zip(cols, (("TTFT p50", "ttft_s", "p50"), ("TTFT p99", "ttft_s", "p99"),
                                                ("TPOT p99", "tpot_s", "p99"), ("ITL p99", "itl_s", "p99"),
                                                ("End-to-end p99", "e2e_s", "p99")), strict=True):
        col.metric(label, seconds(g.latency[interval].quantile(q)))


def render(ctx: Context) -> None:
    """Draw the page."""
    header(ctx, "Latency", PURPOSE)
    choice = st.selectbox("Group by", list(_BY), key="latency_by")
    by = _BY[choice]
    try:
        report = compute.report(ctx.opened.store.con, ctx.opened.token, ctx.selection, ctx.windowless_policy, by)
        st.text(selection_text(ctx, report.totals.requests))
        if report.totals.requests == 0:
            st.info("No request summaries in the selection: nothing to show.")
            return
        _key_figures(ctx)
        frame = latency_frame(report, [name for name, _ in INTERVALS])
        st.subheader("Quantiles (seconds)")
        table(frame, config=seconds_columns(frame))
        st.caption("within_slo: the share of the interval's values at or under its SLO threshold (TTFT, TPOT, "
                   "end-to-end), read from the bucket that ends at the threshold.")
        tabs = st.tabs([title for _, title in INTERVALS])
        for tab, (interval, _) in zip(tabs, INTERVALS, strict=True):
            with tab:
                _interval_tab(ctx, report, interval, by)
        _client_vs_server(ctx, report, by)
    except LlmsloError as exc:
        problem(str(exc))


if __name__ == "__main__":
    render(current())
