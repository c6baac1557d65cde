"""The public surface (``__all__``) and the dependency direction of architecture.md."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
import types
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["llmslo", "llmslo.telemetry", "llmslo.controls", "llmslo.analysis", "llmslo.rules",
            "llmslo.dashboards", "llmslo.cli", "llmslo.app", "llmslo.ops", "llmslo.gateway"]
HEAVY = ("polars", "duckdb", "scipy", "numpy", "typer", "streamlit", "pyarrow", "pandas", "rich")
TELEMETRY_RUNTIME = ("prometheus_client", *(f"llmslo.telemetry.{m}" for m in (
    "_lifecycle", "_metrics", "_sink", "_exposition", "_streams", "_otel", "_gpu", "_guard", "_labels")))
"""What ``llmslo.telemetry`` loads only on first use of a runtime name (servers need it; readers of the
contracts must not load it)."""
ANALYSIS_STACK = ("duckdb", "polars", "pyarrow", "scipy", "numpy")
"""What ``llmslo --help`` must not load (the ``analysis`` extra's heavy part)."""


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


@pytest.mark.parametrize(("name", "forbidden"), [
    ("llmslo.telemetry", HEAVY),
    ("llmslo.controls", (*HEAVY, "redis", "llmslo.analysis", "llmslo.rules", "llmslo.cli")),
    ("llmslo.ops", (*HEAVY, "prometheus_client", "httpx", "llmslo.analysis", "llmslo.cli")),
    ("llmslo.gateway", (*HEAVY, "httpx", "uvicorn", "yaml", "redis", "llmslo.analysis", "llmslo.cli",
                        "llmslo.server", "llmslo.loadgen")),
])
def test_importing_a_server_package_loads_no_heavy_dependency(name: str, forbidden: tuple[str, ...]) -> None:
    code = (
        f"import sys, {name}\n"
        f"print(','.join(m for m in {forbidden!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{name} loaded: {out.stdout.strip()}"


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
        ("controls", ("llmslo.analysis", "llmslo.rules", "llmslo.dashboards", "llmslo.cli", "llmslo.app",
                      "llmslo.server", "llmslo.loadgen", *HEAVY)),
        ("server", ("llmslo.analysis", "llmslo.rules", "llmslo.dashboards", "llmslo.cli", "llmslo.app",
                    "llmslo.loadgen", *HEAVY)),
        ("loadgen", ("llmslo.analysis", "llmslo.rules", "llmslo.dashboards", "llmslo.cli", "llmslo.app",
                     "llmslo.server", *HEAVY)),
        ("analysis", ("llmslo.rules", "llmslo.dashboards", "llmslo.cli", "llmslo.app")),
        ("rules", ("llmslo.analysis", "llmslo.cli", "llmslo.app")),
        ("dashboards", ("llmslo.analysis", "llmslo.cli", "llmslo.app")),
        ("cli", ("llmslo.app",)),
        ("app", ("llmslo.cli",)),
        ("gateway", ("llmslo.analysis", "llmslo.rules", "llmslo.dashboards", "llmslo.cli", "llmslo.app",
                     "llmslo.server", "llmslo.loadgen", "llmslo.ops", *HEAVY)),
        # orchestration runs the other packages' processes and simulations for the CLI, the demos and the
        # tests: it may use any package below the front ends (lazily: importing it stays light, checked above)
        ("ops", ("llmslo.cli", "llmslo.app")),
    ],
)
def test_dependencies_point_the_documented_way(folder: str, forbidden: tuple[str, ...]) -> None:
    bad = {m for m in _imports(folder) if any(m == f or m.startswith(f + ".") for f in forbidden)}
    assert not bad, f"{folder}/ imports {sorted(bad)}"


def test_no_python_file_at_the_root_but_the_package_init() -> None:
    assert sorted(p.name for p in ROOT.glob("*.py")) == ["__init__.py"]


_PROBE = """
import json, sys

class _FirstImport:  # notes, for each watched module, the lines of llmslo that led to its import
    chains = {}

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in WATCHED and name not in sys.modules:  # the last look-up before it loads is its import
            _FirstImport.chains.pop(name, None)
            frame, chain = sys._getframe(1), []
            while frame is not None:
                filename = frame.f_code.co_filename
                if filename.startswith(ROOT) and not filename.startswith(ROOT + ".venv/"):
                    chain.append(f"{filename[len(ROOT):]}:{frame.f_lineno}")
                frame = frame.f_back
            _FirstImport.chains[name] = " -> ".join(reversed(chain)) or "?"
        return None

    @staticmethod
    def report():
        loaded = [[m, c] for m, c in _FirstImport.chains.items() if m in sys.modules]
        loaded += [[m, "?"] for m in WATCHED if m in sys.modules and m not in _FirstImport.chains]
        print("LOADED=" + json.dumps(loaded))

sys.meta_path.insert(0, _FirstImport)
"""


def _loaded_after(code: str, watched: Iterable[str]) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Run ``code`` in a fresh interpreter: which of ``watched`` are in ``sys.modules`` afterwards ("" when none),
    with the lines of llmslo that imported the first of them."""
    probe = f"WATCHED, ROOT = {tuple(watched)!r}, {str(ROOT) + '/'!r}\n{_PROBE}\n{code}\n_FirstImport.report()\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    marks = [line for line in out.stdout.splitlines() if line.startswith("LOADED=")]
    assert out.returncode == 0 and marks, f"the probe failed (exit {out.returncode}):\n{out.stderr[-2000:]}"
    loaded: list[list[str]] = json.loads(marks[-1].removeprefix("LOADED="))
    if not loaded:
        return "", out
    (first, chain), names = loaded[0], [m for m, _ in loaded]
    return f"{', '.join(names)} ({first} first imported through {chain})", out


CONTRACT_USERS = ["llmslo.rules", "llmslo.dashboards", "llmslo.analysis",
                  *sorted(f"llmslo.analysis.{p.parent.name}" for p in (ROOT / "analysis").glob("*/__init__.py"))]


@pytest.mark.parametrize("name", CONTRACT_USERS)
def test_contract_users_load_no_telemetry_runtime(name: str) -> None:
    loaded, _ = _loaded_after(f"import {name}", TELEMETRY_RUNTIME)
    assert not loaded, f"import {name} loaded the telemetry runtime: {loaded}; use only its contracts"


def test_the_store_is_the_light_door_of_the_analysis() -> None:
    loaded, _ = _loaded_after("import llmslo.analysis.store", ("polars", "scipy"))
    assert not loaded, f"import llmslo.analysis.store loaded {loaded}; it may load duckdb and pyarrow only"


def _command_paths() -> list[tuple[str, ...]]:
    """Every command and sub-command of the ``llmslo`` app, read from its click group."""
    import typer

    from llmslo.cli._app import app

    paths: list[tuple[str, ...]] = []

    def walk(command: object, path: tuple[str, ...]) -> None:
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            paths.append((*path, name))
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return paths


START_UP = [("--help",), ("--version",), *((*path, "--help") for path in _command_paths())]


@pytest.mark.parametrize("argv", START_UP, ids=" ".join)
def test_help_and_version_load_no_analysis_stack(argv: tuple[str, ...]) -> None:
    code = (f"import sys\nsys.argv = ['llmslo', *{argv!r}]\nfrom llmslo.cli import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n")
    loaded, out = _loaded_after(code, ANALYSIS_STACK)
    assert ("Usage:" if argv[-1] == "--help" else "llmslo ") in out.stdout, out.stdout  # the command really ran
    assert not loaded, f"`llmslo {' '.join(argv)}` loaded {loaded}; import it inside the command that needs it"


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if node.level == 0:
        return node.module or ""
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split(".")[1:])


def _public_name_violations(folder: str) -> list[str]:
    """Imports of llmslo from ``folder`` that reach past a package's ``__all__`` (its own modules excepted)."""
    def own(module: str) -> bool:
        return module.split(".")[:2] == ["llmslo", folder]

    bad: list[str] = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT)
        package = ".".join(["llmslo", *rel.parent.parts])
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("llmslo.") and _private(alias.name) and not own(alias.name):
                        bad.append(f"{rel}:{node.lineno}: import {alias.name} (a private module)")
            elif isinstance(node, ast.ImportFrom):
                module = _absolute(node, package)
                if not (module == "llmslo" or module.startswith("llmslo.")) or own(module):
                    continue
                if _private(module):
                    bad.append(f"{rel}:{node.lineno}: from {module} import ... (a private module)")
                    continue
                target = importlib.import_module(module)
                exported = set(getattr(target, "__all__", ()))
                for alias in node.names:
                    submodule = f"{module}.{alias.name}"  # a public subpackage is public too
                    if alias.name in exported or (hasattr(target, "__path__") and not _private(submodule)
                                                  and importlib.util.find_spec(submodule) is not None):
                        continue
                    bad.append(f"{rel}:{node.lineno}: from {module} import {alias.name} (not in {module}.__all__)")
    return bad


@pytest.mark.parametrize("folder", ["cli", "app"])
def test_front_ends_import_only_public_names(folder: str) -> None:
    bad = _public_name_violations(folder)
    assert not bad, f"{folder}/ uses names that are not public:\n" + "\n".join(bad)


NOT_SHIPPED = {"bench", "build", "dist", "tests/fixtures"}
"""Folders that may hold an ``__init__.py`` but are no part of the wheel (benchmarks live apart)."""


def _package_folders() -> set[str]:
    found: set[str] = set()
    for folder, subfolders, files in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT)
        subfolders[:] = [d for d in subfolders if not (d.startswith((".", "__")) or d.endswith(".egg-info")
                                                       or d == "node_modules" or (rel / d).as_posix() in NOT_SHIPPED)]
        if "__init__.py" in files:
            found.add(".".join(["llmslo", *rel.parts]))
    return found


def test_the_wheel_lists_every_package() -> None:
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert len(listed) == len(set(listed)), f"pyproject.toml lists a package twice: {sorted(listed)}"
    folders = _package_folders()
    missing, extra = sorted(folders - set(listed)), sorted(set(listed) - folders)
    problems = [f"leaves out {missing} (folders with an __init__.py)"] if missing else []
    problems += [f"lists {extra} (no folder with an __init__.py)"] if extra else []
    assert not problems, "[tool.setuptools] packages of pyproject.toml " + " and ".join(problems)


def test_the_lazy_facades_export_exactly_the_names_they_can_load() -> None:
    """``llmslo.analysis`` and ``llmslo.telemetry`` keep a name table beside ``__all__``: the two must agree,
    and each name must be the object its home module defines."""
    analysis = importlib.import_module("llmslo.analysis")
    lazy = {**analysis._WHERE, **dict.fromkeys(analysis._FROM_TELEMETRY, "")}
    assert set(lazy) == set(analysis.__all__), set(lazy) ^ set(analysis.__all__)
    for name, sub in analysis._WHERE.items():
        assert getattr(analysis, name) is getattr(importlib.import_module(f"llmslo.analysis.{sub}"), name), name
    telemetry = importlib.import_module("llmslo.telemetry")
    missing = set(telemetry._RUNTIME) - set(telemetry.__all__)
    assert not missing, f"llmslo.telemetry loads {sorted(missing)} lazily but does not export them"
    for name, module in telemetry._RUNTIME.items():
        assert getattr(telemetry, name) is getattr(importlib.import_module(f"llmslo.telemetry.{module}"), name)
