"""GPU: samples over time beside latency, and the correlations and lead/lag between them."""

from __future__ import annotations

import dataclasses
from typing import Any

import polars as pl
import streamlit as st

from llmslo.analysis import correlate, lagged_correlation, parse_duration
from llmslo.analysis.gpu import GPU_SIGNALS, REQUEST_TARGETS
from llmslo.app import _charts as charts
from llmslo.app import _compute as compute
from llmslo.app._context import Context, current
from llmslo.app._show import literal
from llmslo.app._widgets import chart, header, problem, selection_text, table
from llmslo.telemetry import LlmsloError

__all__ = ["correlation_frame", "render"]

PURPOSE = ("GPU and engine samples and the selected requests on one grid of time buckets: means per bucket "
           "(request latency by arrival), then Pearson and Spearman over the buckets and the lag at which each "
           "signal best matches each target. Correlation over time is not causation, and both series are "
           "autocorrelated: the p-values are optimistic.")
TITLES = {"util_gpu_pct": "GPU utilisation (%)", "util_mem_pct": "memory utilisation (%)",
          "memory_used_bytes": "memory used (bytes)", "power_w": "power (W)", "temperature_c": "temperature (°C)",
          "sm_clock_mhz": "SM clock (MHz)", "throttled": "throttled (0/1)", "ttft_s": "mean TTFT (s)",
          "tpot_s": "mean TPOT (s)", "queue_s": "mean queue (s)", "in_flight": "in flight (requests)",
          "generated_tokens_per_s": "generated tokens / s", "arrivals_per_s": "arrivals / s"}


def correlation_frame(frame: pl.DataFrame, max_lag_s: float) -> pl.DataFrame:
    """Every signal–target pair with a coefficient (as ``llmslo gpu correlate``): n, Pearson, Spearman (with
    p-values) and the best lag (seconds; > 0: the signal moves first) with its r, strongest first."""
    rows: list[dict[str, Any]] = []
    for c in correlate(frame):
        if c.pearson is None:
            continue
        lag = lagged_correlation(frame, c.signal, c.target, max_lag_s=max_lag_s)
        rows.append({"signal": literal(c.signal), "target": literal(c.target), "n": c.n, "pearson": c.pearson,
                     "pearson_p": c.pearson_p, "spearman": c.spearman, "spearman_p": c.spearman_p,
                     "best_lag_s": None if lag is None else lag.best_lag_s,
                     "r_at_lag": None if lag is None else lag.r_at_best,
                     "moves_first": None if lag is None else literal(lag.leader)})
    schema = {"signal": pl.String, "target": pl.String, "n": pl.Int64, "pearson": pl.Float64, "pearson_p": pl.Float64,
              "spearman": pl.Float64, "spearman_p": pl.Float64, "best_lag_s": pl.Float64, "r_at_lag": pl.Float64,
              "moves_first": pl.String}
    out = pl.DataFrame(rows, schema=schema, orient="row")
    return out.sort(pl.col("pearson").abs(), descending=True) if out.height else out


def _present(frame: pl.DataFrame, names: list[str]) -> list[str]:
    return [c for c in names if c in frame.columns and frame[c].drop_nulls().len() > 0]


def render(ctx: Context) -> None:
    """Draw the page."""
    header(ctx, "GPU", PURPOSE)
    cols = st.columns(2)
    bucket = cols[0].text_input("Time bucket", "1s", key="gpu_bucket")
    max_lag = cols[1].text_input("Largest lead/lag searched", "30s", key="gpu_max_lag")
    try:
        bucket_s, lag_s = parse_duration(bucket), parse_duration(max_lag)
    except ValueError as exc:
        problem(f"GPU options: {exc}")
        return
    selection = dataclasses.replace(ctx.selection, placeable_only=True)  # only rows placed in time align
    st.text(selection_text(ctx, None) + "; rows without arrival times cannot be placed on the time grid")
    try:
        overlap = compute.gpu_overlap(ctx.opened.store.con, ctx.opened.token, selection)
        if overlap.both and overlap.overlap is None:
            problem("The GPU and engine samples and the selected requests do not overlap in time: there is nothing "
                    "to correlate (a file with relative times imported with --start 0 sits in 1970; import it with "
                    "the run's start).")
            return
        frame = compute.gpu_frame(ctx.opened.store.con, ctx.opened.token, selection, bucket_s)
    except LlmsloError as exc:
        problem(str(exc))
        return
    if ctx.selection.from_unix_s is not None:
        frame = frame.filter(pl.col("t") >= ctx.selection.from_unix_s)
    if ctx.selection.to_unix_s is not None:
        frame = frame.filter(pl.col("t") < ctx.selection.to_unix_s)
    columns = [c for c in frame.columns if c != "t"]
    signals = _present(frame, [c for c in columns if c not in REQUEST_TARGETS])
    if not signals:
        st.info("No GPU or engine samples are stored: record them while the server runs with `llmslo gpu sample "
                "--db STORE`, or import them with `llmslo gpu import KIND FILE --db STORE`.")
        return
    targets = _present(frame, [c for c in columns if c in REQUEST_TARGETS])
    if not targets:
        st.text("No selected request can be placed beside the samples: only the samples are shown.")
    gpu_first = [c for c in signals if c in GPU_SIGNALS] + [c for c in signals if c not in GPU_SIGNALS]
    chart(charts.gpu_series(frame, [*gpu_first, *targets], TITLES))
    shared = overlap.restrict(frame)  # samples and requests are correlated over the time they share only
    st.subheader(f"Correlations over {shared.height:,} buckets of {bucket}")
    if overlap.overlap is not None:
        st.text(f"Over the {overlap.overlap_s:,.0f} s that the samples and the selected requests share.")
    corr = correlation_frame(shared, lag_s)
    if corr.height:
        table(corr)
    else:
        st.text("No signal and target share 10 buckets with variation in both: record for longer or choose a "
                "smaller bucket.")


if __name__ == "__main__":
    render(current())
