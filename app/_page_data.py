"""Data: what the store holds, and what was imported into it with the caveats of each import."""

from __future__ import annotations

from typing import Any

import polars as pl
import streamlit as st

from llmslo.analysis.importers import recorded_imports
from llmslo.analysis.report import RowSelection, StoreContents
from llmslo.app import _compute as compute
from llmslo.app._context import Context, current
from llmslo.app._show import literal, utc
from llmslo.app._widgets import header, notes, problem, table
from llmslo.telemetry import LlmsloError

__all__ = ["imports_frame", "labels_frame", "render", "tables_frame"]

PURPOSE = "What the store holds, before any filter, and where imported rows came from and what they lack."


def tables_frame(contents: StoreContents) -> pl.DataFrame:
    """Every table of the store and its rows."""
    return pl.DataFrame({"table": [literal(t.table) for t in contents.tables],
                         "rows": [t.rows for t in contents.tables]}, schema={"table": pl.String, "rows": pl.Int64})


def labels_frame(contents: StoreContents) -> pl.DataFrame:
    """Every value of model, version and tenant class with its requests, most frequent first."""
    rows = [{"column": column, "value": literal(c.value), "requests": c.requests}
            for column, counts in contents.labels.items() for c in counts]
    return pl.DataFrame(rows, schema={"column": pl.String, "value": pl.String, "requests": pl.Int64}, orient="row")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return "; ".join(literal(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{literal(k)}={literal(v)}" for k, v in value.items())
    return literal(value)


def imports_frame(records: list[dict[str, Any]]) -> pl.DataFrame:
    """One row per imported file: its source, tool, rows, whether it carried arrival times, the run
    duration it recorded (seconds) and what the import converted and could not (its caveats)."""
    rows = [{"source": _text(r.get("source")), "tool": _text(r.get("tool")), "kind": _text(r.get("kind")),
             "rows_read": r.get("rows_read"), "rows_imported": r.get("rows_imported"),
             "rows_inserted": r.get("rows_inserted"), "arrivals_available": r.get("arrivals_available"),
             "arrival_note": _text(r.get("arrival_note")), "run_duration_s": r.get("run_duration_s"),
             "run_duration_note": _text(r.get("run_duration_note")), "conversions": _text(r.get("conversions")),
             "missing_fields": _text(r.get("missing_fields")), "finish_reasons": _text(r.get("finish_reasons")),
             "imported": utc(r.get("imported_unix_s"))} for r in records]
    return pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()


def render(ctx: Context) -> None:
    """Draw the page."""
    header(ctx, "Data", PURPOSE)
    c = ctx.contents
    st.text(f"Store: {literal(ctx.opened.db)}\n"
            f"Request summaries: {c.requests:,}, of which {c.with_arrival:,} carry arrival times "
            f"({c.without_arrival:,} from imports without them)\n"
            f"Arrivals: {utc(c.arrival_from_unix_s)} to {utc(c.arrival_to_unix_s)} UTC\n"
            f"Schema version: {literal(ctx.opened.store.meta('schema_version'))}")
    left, right = st.columns(2)
    with left:
        st.caption("Tables")
        table(tables_frame(c))
    with right:
        st.caption("Label values")
        table(labels_frame(c))
    st.subheader("Imports")
    try:
        report = compute.report(ctx.opened.store.con, ctx.opened.token, RowSelection(), ctx.windowless_policy)
        records = recorded_imports(ctx.opened.store)
    except LlmsloError as exc:
        problem(str(exc))
        return
    notes(report.caveats, title="Caveats of the imported rows")
    if not records:
        st.text("Nothing was imported with llmslo import: the rows came from ingest or a server's sink.")
        return
    table(imports_frame(records))


if __name__ == "__main__":
    render(current())
