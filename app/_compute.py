"""Every figure of the app, computed through ``llmslo.analysis``'s public API over the selected rows.

Each function takes the open connection (not hashed: ``_con``), the source's ``token`` (which changes when
the file or snapshot read changes) and the arguments of the analysis call, and is cached on those, so that
moving a widget on one page does not recompute another page's figures. The rows are narrowed with
:func:`~llmslo.analysis.report.selected_rows` for the duration of the call; nothing here writes SQL.
"""

from __future__ import annotations

from typing import Any

import duckdb
import polars as pl
import streamlit as st

from llmslo.analysis import AnomalyConfig, AnomalyReport, GoodputPolicy, Report, ReportSpec, aligned_frame, build_report
from llmslo.analysis import detect_anomalies as _detect_anomalies
from llmslo.analysis.gpu import TimeOverlap, time_overlap
from llmslo.analysis.report import Ecdf, RowSelection, StoreContents, latency_ecdf, selected_rows, store_contents
from llmslo.analysis.rollout import UpdateRecord, VersionComparison, compare_versions, list_updates

__all__ = ["anomalies", "comparison", "contents", "ecdf", "gpu_frame", "gpu_overlap", "report", "updates"]



@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def contents(_con: duckdb.DuckDBPyConnection, token: tuple[Any, ...]) -> StoreContents:
    """What the store holds (every row, before any filter)."""
    return store_contents(_con)


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def report(_con: duckdb.DuckDBPyConnection, token: tuple[Any, ...], selection: RowSelection,
           policy: GoodputPolicy, by: tuple[str, ...] = ()) -> Report:
    """The report of the selected rows under ``policy`` (its window included), grouped by ``by``: the same
    figures as ``llmslo report --json`` with the same options."""
    with selected_rows(_con, selection):
        return build_report(_con, ReportSpec(policy, by=by))


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def ecdf(_con: duckdb.DuckDBPyConnection, token: tuple[Any, ...], selection: RowSelection, interval: str,
         by: tuple[str, ...] = (), points: int = 200) -> list[Ecdf]:
    """The empirical CDF of ``interval`` per group of the selected rows."""
    with selected_rows(_con, selection):
        return latency_ecdf(_con, interval, by=by, points=points)


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def anomalies(_con: duckdb.DuckDBPyConnection, token: tuple[Any, ...], selection: RowSelection,
              config: AnomalyConfig, metric: str, by: tuple[str, ...]) -> AnomalyReport:
    """The distribution-change scan of ``metric`` over the selected rows (``llmslo anomalies``)."""
    with selected_rows(_con, selection):
        return _detect_anomalies(_con, config, metrics=(metric,), by=by)


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def gpu_frame(_con: duckdb.DuckDBPyConnection, token: tuple[Any, ...], selection: RowSelection,
              bucket_s: float) -> pl.DataFrame:
    """GPU, engine and request series on one grid of ``bucket_s`` seconds (``llmslo gpu correlate``)."""
    with selected_rows(_con, selection):
        return aligned_frame(_con, bucket_s=bucket_s)


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def gpu_overlap(_con: duckdb.DuckDBPyConnection, token: tuple[Any, ...], selection: RowSelection) -> TimeOverlap:
    """When the GPU/engine samples and the selected requests were taken, and the time they share."""
    with selected_rows(_con, selection):
        return time_overlap(_con)


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def updates(_con: duckdb.DuckDBPyConnection, token: tuple[Any, ...]) -> list[UpdateRecord]:
    """Every stored update record, by start time."""
    return list_updates(_con)


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def comparison(_con: duckdb.DuckDBPyConnection, token: tuple[Any, ...], update_id: str,
               policy: GoodputPolicy) -> VersionComparison:
    """The version comparison of one stored update (``llmslo rollout compare --update ID``)."""
    return compare_versions(_con, update_id=update_id, policy=policy)
