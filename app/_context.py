"""What every page works from: the open store, what it holds, the rows selected and the goodput policy.

The sidebar (:func:`sidebar`) turns the person's filters and thresholds into a
:class:`~llmslo.analysis.report.RowSelection` and a :class:`~llmslo.analysis.GoodputPolicy`; the main
script puts them, with the open store, in a :class:`Context` that the page of this run reads through
:func:`current` (one per script run, so two browser tabs never share one).
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime as dt
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import streamlit as st

from llmslo.analysis import DEFAULT_TPOT_S, DEFAULT_TTFT_S, GoodputPolicy, format_duration, parse_duration
from llmslo.analysis.report import LABEL_COLUMNS, RowSelection, StoreContents
from llmslo.app._show import auto_window_s, literal, utc
from llmslo.app._source import Opened, discard_snapshot
from llmslo.telemetry import FINISH_REASONS, LlmsloError

__all__ = ["Context", "InputProblem", "current", "sidebar", "using"]

OFF = "off"
_CURRENT: contextvars.ContextVar[Context] = contextvars.ContextVar("llmslo_app_context")
_LABEL_NAMES = {"model": "Model", "version": "Version", "tenant_class": "Tenant class"}


class InputProblem(Exception):
    """A sidebar field holds a value that cannot be used; the message names the field and the fix."""


@dataclass(frozen=True)
class Context:
    """The open store (``opened``), what it holds (``contents``), the rows selected in the sidebar
    (``selection``) and the goodput ``policy`` (with its window, seconds) set there."""

    opened: Opened
    contents: StoreContents
    selection: RowSelection
    policy: GoodputPolicy

    @property
    def timed_selection(self) -> RowSelection:
        """The selection without the rows that carry no arrival time (from imports without them), for figures
        by window or over time: those rows fit no window (the report would place them by the placeholder
        arrival their import gave them)."""
        if self.contents.without_arrival == 0:
            return self.selection
        return dataclasses.replace(self.selection, placeable_only=True)

    @property
    def windowless_policy(self) -> GoodputPolicy:
        """The policy without its window: for figures over the whole selection."""
        return dataclasses.replace(self.policy, window_s=None)


@contextmanager
def using(ctx: Context) -> Iterator[Context]:
    """Make ``ctx`` the context of the page run inside the block."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def current() -> Context:
    """The context of this run (set by the main script before it runs the page)."""
    return _CURRENT.get()


def _threshold(field: str, text: str) -> float | None:
    if text.strip().lower() == OFF:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise InputProblem(f"{field}: {exc}; write {OFF} to switch this SLO off") from None


def _time_range(contents: StoreContents) -> tuple[float | None, float | None]:
    """The arrival range chosen on the slider (Unix seconds); (None, None) for the whole range."""
    lo, hi = contents.arrival_from_unix_s, contents.arrival_to_unix_s
    if lo is None or hi is None:
        st.sidebar.text("Arrival time: none stored (rows imported\nwithout arrival times fit no time range)")
        return None, None
    if hi - lo < 1.0:
        st.sidebar.text(f"Arrivals: {utc(lo)} to {utc(hi)} UTC")
        return None, None
    step = max(1.0, 10 ** math.floor(math.log10((hi - lo) / 100)))
    first = math.floor(lo / step) * step
    last = (math.floor(hi / step) + 1) * step  # past the last arrival: the range [first, last) holds them all
    edges = (_naive(first), _naive(last))
    shown = "HH:mm:ss" if last - first <= 86_400 else "MM-DD HH:mm"  # short labels: the sidebar is narrow
    chosen = st.sidebar.slider(f"Arrival time (UTC, from {utc(first)[:10]})", min_value=edges[0],
                               max_value=edges[1], value=edges, step=dt.timedelta(seconds=step), format=shown,
                               key="time_range",
                               help="Requests that arrived in [from, to). The whole range selects every row.")
    start, end = chosen
    if (start, end) == edges:
        return None, None
    return _unix(start), _unix(end)


def _naive(unix_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).replace(tzinfo=None)


def _unix(when: dt.datetime) -> float:
    return when.replace(tzinfo=dt.UTC).timestamp()


def _selection(contents: StoreContents) -> RowSelection:
    start, end = _time_range(contents)
    chosen: dict[str, tuple[str, ...] | None] = {}
    for column in LABEL_COLUMNS:
        options = [c.value for c in contents.labels.get(column, ())]
        picked = st.sidebar.multiselect(_LABEL_NAMES[column], options, default=[], format_func=literal,
                                        key=f"filter_{column}", placeholder="every value")
        chosen[column] = tuple(picked) if picked else None
    if start is not None and end is not None and not start < end:
        raise InputProblem("Arrival time: the range is empty; move the handles apart")
    return RowSelection(models=chosen["model"], versions=chosen["version"], tenant_classes=chosen["tenant_class"],
                        from_unix_s=start, to_unix_s=end)


def _policy(contents: StoreContents) -> GoodputPolicy:
    st.sidebar.subheader("Goodput policy")
    ttft = st.sidebar.text_input("TTFT SLO", format_duration(DEFAULT_TTFT_S), key="slo_ttft",
                                 help="Inclusive bound on time to first token, e.g. 500ms, 2s; off to ignore.")
    tpot = st.sidebar.text_input("TPOT SLO", format_duration(DEFAULT_TPOT_S), key="slo_tpot",
                                 help="Inclusive bound on time per output token, e.g. 100ms; off to ignore.")
    e2e = st.sidebar.text_input("End-to-end SLO", OFF, key="slo_e2e",
                                help="Inclusive bound on end-to-end latency, e.g. 30s; off to ignore.")
    success = st.sidebar.multiselect("Finish reasons that can be good", list(FINISH_REASONS),
                                     default=["length", "stop"], key="slo_success")
    one_token_fails = st.sidebar.checkbox("One-token replies fail the TPOT condition", value=False,
                                          key="slo_one_token_fails")
    default_window = format_duration(auto_window_s(contents.arrival_from_unix_s, contents.arrival_to_unix_s))
    window = st.sidebar.text_input("Window", default_window, key="window",
                                   help="Time windows aligned to multiples of this length in Unix time; a "
                                   "request belongs to the window of its arrival.")
    problems: list[str] = []
    values: dict[str, float | None] = {}
    for field, key, text in (("TTFT SLO", "ttft_s", ttft), ("TPOT SLO", "tpot_s", tpot),
                             ("End-to-end SLO", "e2e_s", e2e)):
        try:
            values[key] = _threshold(field, text)
        except InputProblem as exc:
            problems.append(str(exc))
    try:
        window_s: float | None = parse_duration(window)
    except ValueError as exc:
        problems.append(f"Window: {exc}")
        window_s = None
    if not success:
        problems.append("Finish reasons that can be good: choose at least one (e.g. stop and length)")
    if problems:
        raise InputProblem("; ".join(problems))
    try:
        return GoodputPolicy(success=frozenset(success), ttft_s=values["ttft_s"], tpot_s=values["tpot_s"],
                             e2e_s=values["e2e_s"], one_token_passes_tpot=not one_token_fails, window_s=window_s)
    except LlmsloError as exc:
        raise InputProblem(f"Goodput policy: {exc}") from None


def sidebar(opened: Opened, contents: StoreContents) -> Context:
    """Draw the sidebar (store, snapshot, filters, thresholds) and return the context it sets.

    Raises :class:`InputProblem` naming the field when one holds a value that cannot be used.
    """
    st.sidebar.text(f"Store: {literal(opened.db)}")
    if opened.snapshot is not None:
        st.sidebar.button("Take a new snapshot", key="new_snapshot", on_click=discard_snapshot,
                          args=(st.session_state,), help="Copy the store again to see rows written since.")
    st.sidebar.subheader("Filters")
    selection = _selection(contents)
    policy = _policy(contents)
    return Context(opened, contents, selection, policy)
