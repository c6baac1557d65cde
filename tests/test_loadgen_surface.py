"""``llmslo.loadgen``'s public surface and what importing it loads: a sorted, complete ``__all__``; no polars,
duckdb, numpy, scipy, pyarrow, typer or streamlit, and nothing of the analysis, the CLI or the server
(httpx itself imports rich when rich is installed, so rich is not checked here)."""

from __future__ import annotations

import subprocess
import sys
import types

import llmslo.loadgen as loadgen

FORBIDDEN = ("polars", "duckdb", "numpy", "scipy", "pyarrow", "pandas", "typer", "streamlit",
             "llmslo.analysis", "llmslo.cli", "llmslo.server", "llmslo.rules", "llmslo.dashboards", "llmslo.app")


def test_all_is_sorted_complete_and_resolvable() -> None:
    exported = list(loadgen.__all__)
    assert exported == sorted(exported)
    assert all(hasattr(loadgen, name) for name in exported)
    public = {k for k, v in vars(loadgen).items()
              if not k.startswith("_") and not isinstance(v, types.ModuleType) and k != "annotations"}
    assert public <= set(exported), public - set(exported)


def test_importing_the_load_generator_loads_no_analysis_stack_cli_or_server() -> None:
    code = f"import sys, llmslo.loadgen\nprint(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "", f"import llmslo.loadgen loaded {out.stdout.strip()}"


def test_the_request_id_pattern_is_defined_once_in_telemetry_not_again_here() -> None:
    import importlib
    import pkgutil
    import re

    from llmslo.telemetry._middleware import REQUEST_ID

    copies = [f"{info.name}.{name}" for info in pkgutil.iter_modules(loadgen.__path__, "llmslo.loadgen.")
              for name, value in vars(importlib.import_module(info.name)).items()
              if isinstance(value, re.Pattern) and value.pattern == REQUEST_ID.pattern]
    assert not copies, f"{copies} repeat llmslo.telemetry's request-id pattern: use llmslo.telemetry.valid_request_id"
