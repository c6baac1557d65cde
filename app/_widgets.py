"""Pieces every page shows the same way: its header, the policy beside goodput, notes, errors, tables, charts.

Text that carries data goes through ``st.text`` / ``st.code`` (shown as written) or, in the elements that
render Markdown, through :func:`~llmslo.app._show.markdown_literal`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl
import streamlit as st

from llmslo.analysis import GoodputPolicy
from llmslo.app._charts import Figure
from llmslo.app._context import Context
from llmslo.app._show import literal, markdown_literal, utc, window_text
from llmslo.app._source import snapshot_note

__all__ = ["chart", "header", "notes", "policy_block", "problem", "seconds_columns", "selection_text", "table"]


def selection_text(ctx: Context, shown: int | None) -> str:
    """``Rows: 17 of 45 stored; model in {a, b}; arrivals from ... to ... UTC`` (``shown``: the rows selected,
    when the page knows them)."""
    s = ctx.selection
    if s.everything:
        parts = [f"Rows: all {ctx.contents.requests:,} stored"]
    elif shown is None:
        parts = [f"Rows: a selection of the {ctx.contents.requests:,} stored"]
    else:
        parts = [f"Rows: {shown:,} of {ctx.contents.requests:,} stored"]
    for column, values in s.labels().items():
        if values is not None:
            parts.append(f"{column} in {{{', '.join(literal(v) for v in values)}}}")
    if s.from_unix_s is not None or s.to_unix_s is not None:
        parts.append(f"arrivals from {utc(s.from_unix_s)} to {utc(s.to_unix_s)} UTC (end excluded)")
    return "; ".join(parts)


def header(ctx: Context, title: str, purpose: str) -> None:
    """The page's title and purpose (fixed text), and the snapshot note while one is read."""
    st.title(title)
    st.caption(purpose)
    if ctx.opened.snapshot is not None:
        st.warning(markdown_literal(snapshot_note(ctx.opened.snapshot)))


def policy_block(policy: GoodputPolicy) -> None:
    """The goodput rule, printed beside every goodput figure (it follows the sidebar)."""
    st.caption(f"Goodput policy ({markdown_literal(window_text(policy.window_s))}): the rule every goodput "
               "figure on this page is judged by")
    st.code(policy.rule_text(), language=None, wrap_lines=True)


def notes(lines: Iterable[str], *, title: str | None = None) -> None:
    """Caveats and notes, each as plain text (they may name files and labels)."""
    items = [literal(x) for x in lines]
    if not items:
        return
    if title:
        st.caption(title)
    st.text("\n".join(f"- {x}" for x in items))


def problem(message: str) -> None:
    """An error for a person, shown literally (never a traceback)."""
    st.error(markdown_literal(message))


def table(frame: pl.DataFrame, *, config: Mapping[str, Any] | None = None) -> None:
    """A dataframe with its raw values (the formats only change how they read)."""
    st.dataframe(frame, hide_index=True, column_config=dict(config or {}))


def chart(figure: Figure) -> None:
    """An Altair chart across the page's width."""
    st.altair_chart(figure, width="stretch")


def seconds_columns(frame: pl.DataFrame) -> dict[str, Any]:
    """Column formats: p-values in exponent form, Unix times with milliseconds, durations (``*_s``) with four
    significant digits, fractions as percentages."""
    out: dict[str, Any] = {}
    for name in frame.columns:
        if name.startswith("p_") or name.endswith("_p"):  # p-values: tiny numbers in exponent form
            out[name] = st.column_config.NumberColumn(name, format="%.2e")
        elif name.endswith("_unix_s"):
            out[name] = st.column_config.NumberColumn(name, format="%.3f")
        elif name.endswith("_s"):
            out[name] = st.column_config.NumberColumn(name, format="%.4g")
        elif name.endswith(("_fraction", "within_slo")):
            out[name] = st.column_config.NumberColumn(name, format="percent")
    return out
