"""The app's main script: the store argument, the navigation, the sidebar, then the chosen page.

Run by ``llmslo app --db STORE`` as ``streamlit run <app>/streamlit_app.py -- --db STORE``. Each run opens
the store read-only (or the session's snapshot of it, while a server writes it), draws the sidebar and
runs the page inside one ``with`` block, so the file is closed again when the page is drawn.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import streamlit as st

from llmslo.app import _compute as compute
from llmslo.app._context import InputProblem, sidebar, using
from llmslo.app._source import SourceError, open_source
from llmslo.app._widgets import problem
from llmslo.telemetry import LlmsloError

__all__ = ["FOOTER", "PAGES", "USAGE", "main", "store_argument"]

HERE = Path(__file__).resolve().parent
PAGES: tuple[tuple[str, str, str], ...] = (
    ("Overview", "_page_overview.py", "overview"),
    ("Latency", "_page_latency.py", "latency"),
    ("Survivor bias", "_page_survivor.py", "survivor-bias"),
    ("Anomalies", "_page_anomalies.py", "anomalies"),
    ("GPU", "_page_gpu.py", "gpu"),
    ("Rollouts", "_page_rollouts.py", "rollouts"),
    ("Data", "_page_data.py", "data"),
)
"""(title, script, URL path) of every page, in the order of the navigation."""
FOOTER = ("Every figure on this page comes from llmslo.analysis over the rows selected in the sidebar (the "
          "same as the llmslo command with the same options); the store is read, never written.")
"""The last element of every page drawn in full."""
USAGE = "start the app with a store: llmslo app --db STORE.duckdb (the store is read, never written)"


def store_argument(argv: Sequence[str]) -> Path | None:
    """The ``--db`` path among the script's arguments (what follows ``--`` on Streamlit's command line);
    None when it is missing."""
    parser = argparse.ArgumentParser(prog="llmslo app", add_help=False, exit_on_error=False)
    parser.add_argument("--db", type=Path)
    try:
        known, _ = parser.parse_known_args(list(argv))
    except argparse.ArgumentError:
        return None
    db: Path | None = known.db
    return db


def main(argv: Sequence[str] | None = None) -> None:
    """Draw one run of the app (Streamlit calls the script again on every interaction)."""
    st.set_page_config(page_title="llmslo", layout="wide")
    nav = st.navigation([st.Page(HERE / script, title=title, url_path=path, default=i == 0)
                         for i, (title, script, path) in enumerate(PAGES)])
    db = store_argument(sys.argv[1:] if argv is None else argv)
    if db is None:
        problem(USAGE)
        return
    try:
        with open_source(db, st.session_state) as opened:
            contents = compute.contents(opened.store.con, opened.token)
            try:
                ctx = sidebar(opened, contents)
            except InputProblem as exc:
                problem(f"{exc}. Nothing is shown until the sidebar holds values that can be used.")
                return
            with using(ctx):
                nav.run()
            st.caption(FOOTER)
    except SourceError as exc:
        problem(str(exc))
    except LlmsloError as exc:  # what the analysis refuses (a stored arrival it cannot place, ...)
        problem(str(exc))
