"""The public surface (``__all__``) and the dependency direction of architecture.md."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["llmslo", "llmslo.telemetry", "llmslo.analysis", "llmslo.rules", "llmslo.dashboards",
            "llmslo.cli", "llmslo.app"]
HEAVY = ("polars", "duckdb", "scipy", "numpy", "typer", "streamlit", "pyarrow", "pandas", "rich")


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_complete_and_resolvable(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported), f"{name}.__all__ is not sorted"
    for item in exported:
        assert hasattr(module, item), f"{name}.__all__ names {item!r}, which does not exist"
    public = {
        k for k, v in vars(module).items()
        if not k.startswith("_") and not isinstance(v, types.ModuleType) and k != "annotations"
    }
    assert public <= set(exported), f"{name} exposes names missing from __all__: {public - set(exported)}"


def test_importing_telemetry_loads_no_heavy_dependency() -> None:
    code = (
        "import sys, llmslo.telemetry\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"llmslo.telemetry loaded: {out.stdout.strip()}"


def _imports(folder: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
    return found


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("telemetry", ("llmslo.analysis", "llmslo.rules", "llmslo.dashboards", "llmslo.cli", "llmslo.app",
                       *HEAVY)),
        ("analysis", ("llmslo.rules", "llmslo.dashboards", "llmslo.cli", "llmslo.app")),
        ("rules", ("llmslo.analysis", "llmslo.cli", "llmslo.app")),
        ("dashboards", ("llmslo.analysis", "llmslo.cli", "llmslo.app")),
        ("cli", ("llmslo.app",)),
        ("app", ("llmslo.cli",)),
    ],
)
def test_dependencies_point_the_documented_way(folder: str, forbidden: tuple[str, ...]) -> None:
    bad = {m for m in _imports(folder) if any(m == f or m.startswith(f + ".") for f in forbidden)}
    assert not bad, f"{folder}/ imports {sorted(bad)}"


def test_analysis_uses_only_the_contracts_of_telemetry() -> None:
    for module in _imports("analysis"):
        if module.startswith("llmslo.telemetry."):
            assert module.split(".")[2] in ("_summary", "_buckets", "_errors"), module


def test_no_python_file_at_the_root_but_the_package_init() -> None:
    assert sorted(p.name for p in ROOT.glob("*.py")) == ["__init__.py"]
