"""``llmslo app``: the Streamlit app over a store, served on 127.0.0.1.

The command imports neither Streamlit nor the app (``cli`` and ``app`` never import each other): it finds
the app's entry script beside this package and runs ``python -m streamlit run <entry> -- --db STORE`` in a
child process, which it waits for.
"""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from llmslo.cli._common import EXIT_INPUT, EXIT_USAGE, err, fail, shown

__all__ = ["ADDRESS", "DEFAULT_PORT", "ENTRY_SCRIPT", "app_command", "streamlit_argv"]

ADDRESS = "127.0.0.1"
"""The only address the app listens on: this machine."""
DEFAULT_PORT = 8501
ENTRY_SCRIPT = Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py"
"""The app's entry script (``llmslo/app/streamlit_app.py`` in an installed package, ``app/`` in a checkout)."""


def streamlit_argv(db: Path, port: int, *, python: str = sys.executable) -> list[str]:
    """The command line that serves the app over ``db`` on 127.0.0.1:``port``: headless (no browser is
    opened), no usage statistics sent, no file watcher, no developer menu, the store after ``--``."""
    return [python, "-m", "streamlit", "run", str(ENTRY_SCRIPT),
            "--server.address", ADDRESS, "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none", "--client.toolbarMode", "viewer",
            "--runner.magicEnabled", "false",
            "--", "--db", str(db)]


def app_command(
    db: Annotated[Path, typer.Option("--db", help="DuckDB store file to explore (opened read-only).",
                                     show_default=False)],
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1 to serve the app on.")] = DEFAULT_PORT,
) -> None:
    """Explore a store in the browser: a Streamlit app on http://127.0.0.1:PORT (Ctrl-C stops it).

    Pages: Overview (goodput by window under the printed policy, attempted vs good, finish reasons, the
    survivor-bias verdict per window), Latency (TTFT, TPOT, ITL, end-to-end and queue time: quantiles,
    SLO-aligned histograms and ECDFs with the thresholds drawn, by model, version or tenant class; client
    vs server TTFT), Survivor bias (success-only vs censoring-aware TTFT per window, shed fraction),
    Anomalies (the distribution-change scan), GPU (samples beside latency, correlations and lags),
    Rollouts (update records and the version comparison), Data (what is stored, imports and their caveats).

    The sidebar filters by time range, model, version and tenant class and sets the SLO thresholds and the
    window; every figure is the one `llmslo report` (or `anomalies`, `gpu correlate`, `rollout compare`)
    gives for the same rows and options, and the goodput policy is printed beside it. The store is only
    read; while a server holds it open for writing, the app reads a copy and says when it was taken.

    Needs the `app` extra: pip install 'llmslo[app]'.

    Examples: llmslo app --db summaries.duckdb; llmslo app --db demo.duckdb --port 8600
    """
    if not 1 <= port <= 65535:
        raise fail(f"--port: must be between 1 and 65535, got {port}", EXIT_USAGE)
    if importlib.util.find_spec("streamlit") is None:
        raise fail("llmslo app needs the 'app' extra (streamlit is missing): pip install 'llmslo[app]'", EXIT_INPUT)
    if not db.is_file():
        raise fail(f"no store at {db}: create one with `llmslo ingest FILES --db {db}` "
                   "(or `llmslo demo`)", EXIT_INPUT)
    err().print(f"llmslo app: http://{ADDRESS}:{port} (reading {shown(db)}; Ctrl-C stops it)", highlight=False)
    code = _serve(streamlit_argv(db, port))  # the path as given: the server runs in this working directory
    if code != 0:
        raise typer.Exit(code)


def _serve(argv: list[str]) -> int:
    """Run the server and wait for it; a SIGTERM to this process is passed on to it, Ctrl-C reaches it
    anyway (same process group), and it is never left running when this process ends."""
    child = subprocess.Popen(argv)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:  # the child got the same interrupt: let it finish
                continue
    finally:
        signal.signal(signal.SIGTERM, previous)
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
