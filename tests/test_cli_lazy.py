"""The lazy ``llmslo`` command group: one static table of commands, each module imported when it runs.

The table (``llmslo.cli._app.COMMANDS``) must say what the real commands say (names, one-line helps, every
command), ``llmslo --help`` must print what typer prints for the real commands, and showing it must import
no command module; ``llmslo demo --live`` refuses the options only the simulated demo reads.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import typer
import typer.main
from typer.testing import CliRunner

import llmslo.cli
from llmslo.cli import _app, _report
from llmslo.cli._app import COMMANDS, LazyGroup, app
from llmslo.cli._common import EXIT_USAGE

runner = CliRunner()

COMMAND_MODULES = sorted({entry.target.partition(":")[0] for entry in COMMANDS})
HEAVY_PACKAGES = ("llmslo.analysis", "llmslo.server", "llmslo.loadgen", "llmslo.rules", "llmslo.dashboards",
                  "llmslo.app", "llmslo.controls", "duckdb", "polars", "pyarrow", "scipy", "numpy", "rich")


def _target(target: str) -> object:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _eager_app() -> typer.Typer:
    """The ``llmslo`` app registered the plain typer way (every command imported and built at start)."""
    eager = typer.Typer(name="llmslo", help=app.info.help, epilog=app.info.epilog, no_args_is_help=True,
                        add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    eager.callback()(_app._main)
    for entry in COMMANDS:
        target = _target(entry.target)
        if isinstance(target, typer.Typer):
            eager.add_typer(target, name=entry.name)
        else:
            assert callable(target), entry
            eager.command(entry.name)(target)
    return eager


def _imported(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """``python -X importtime -m llmslo.cli ARGV`` as a fresh process, and the modules it imported."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "llmslo.cli", *argv], capture_output=True,
                         text=True, timeout=120)
    modules = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "llmslo.cli._app" in modules, out.stderr[-2000:]  # the import log was read
    return out, modules


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in HEAVY_PACKAGES))


# --- the table cannot drift from the real commands ---------------------------------------------------------


def test_the_table_gives_each_real_command_its_own_name_and_one_line_help() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, LazyGroup)
    assert list(group.commands) == [entry.name for entry in COMMANDS]
    for entry in COMMANDS:
        real = group.commands[entry.name]  # imported and built for real
        assert real.name == entry.name
        assert real.get_short_help_str(10**6) == entry.help, f"update the help of {entry.name!r} in COMMANDS"


def test_the_table_is_the_only_registration() -> None:
    assert app.registered_commands == [] and app.registered_groups == []
    names = [entry.name for entry in COMMANDS]
    assert len(set(names)) == len(names)


def _registered(root: typer.Typer) -> tuple[set[int], set[int]]:
    """The ids of the Typer apps and of the command functions reachable from ``root`` and the table."""
    apps: set[int] = set()
    functions: set[int] = set()

    def walk(sub: typer.Typer) -> None:
        apps.add(id(sub))
        functions.update(id(info.callback) for info in sub.registered_commands)
        for group in sub.registered_groups:
            assert group.typer_instance is not None
            walk(group.typer_instance)

    walk(root)
    for entry in COMMANDS:
        target = _target(entry.target)
        if isinstance(target, typer.Typer):
            walk(target)
        else:
            functions.add(id(target))
    return apps, functions


def test_every_command_defined_in_the_cli_package_is_in_the_table() -> None:
    """Every module-level ``typer.Typer`` and ``*_command`` function of ``llmslo.cli`` is reachable from it."""
    apps, functions = _registered(app)
    unlisted: list[str] = []
    for info in pkgutil.iter_modules(llmslo.cli.__path__, "llmslo.cli."):
        if info.name == "llmslo.cli.__main__":
            continue  # runs the command line
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            is_app = isinstance(value, typer.Typer) and id(value) not in apps
            is_command = (isinstance(value, types.FunctionType) and value.__module__ == module.__name__
                          and name.endswith("_command") and id(value) not in functions)
            if is_app or is_command:
                unlisted.append(f"{info.name}:{name}")
    assert not unlisted, f"commands not in llmslo.cli._app.COMMANDS (nor in a sub-group): {unlisted}"


# --- the help is what typer prints for the real commands ---------------------------------------------------


@pytest.mark.parametrize("width", [60, 80, 200])
def test_the_top_level_help_is_the_one_of_the_real_commands(width: int) -> None:
    lazy = runner.invoke(app, ["--help"], terminal_width=width)
    eager = runner.invoke(_eager_app(), ["--help"], terminal_width=width)
    assert lazy.exit_code == eager.exit_code == 0, lazy.output
    assert lazy.output == eager.output
    assert all(entry.name in lazy.output for entry in COMMANDS)


@pytest.mark.parametrize("name", [entry.name for entry in COMMANDS])
def test_each_command_help_is_the_one_of_the_real_command(name: str) -> None:
    lazy = runner.invoke(app, [name, "--help"], terminal_width=100)
    eager = runner.invoke(_eager_app(), [name, "--help"], terminal_width=100)
    assert lazy.exit_code == eager.exit_code == 0, lazy.output
    assert lazy.output == eager.output


@pytest.mark.parametrize("argv", [["nosuch"], ["repor"], ["rules", "nosuch"]])
def test_an_unknown_command_exits_2_naming_it(argv: list[str]) -> None:
    lazy = runner.invoke(app, argv)
    assert lazy.exit_code == EXIT_USAGE
    assert f"No such command '{argv[-1]}'" in lazy.output
    assert lazy.output == runner.invoke(_eager_app(), argv).output  # the suggestion too ("Did you mean")


def test_a_command_registered_on_a_lazy_group_is_refused() -> None:
    class Group(LazyGroup):
        table = COMMANDS[:1]

    other = typer.Typer(cls=Group, callback=lambda: None)  # a group, with a command registered on it
    other.command("extra")(lambda: None)
    with pytest.raises(TypeError, match="list them in its table"):
        typer.main.get_command(other)
    group = typer.main.get_command(typer.Typer(cls=Group, callback=lambda: None))
    assert isinstance(group, LazyGroup)
    with pytest.raises(TypeError, match="COMMANDS"):
        group.add_command(group.commands[COMMANDS[0].name], "again")


# --- nothing imported that the command line does not run ---------------------------------------------------


@pytest.mark.parametrize("argv", [["--help"], ["--version"], []])
def test_the_top_level_help_imports_no_command_module(argv: list[str]) -> None:
    out, modules = _imported(argv)
    assert out.returncode == (EXIT_USAGE if not argv else 0), out.stderr[-2000:]
    assert ("Usage:" if argv != ["--version"] else "llmslo ") in out.stdout + out.stderr
    assert sorted(modules & set(COMMAND_MODULES)) == [], "import the command modules only when they run"
    assert _heavy(modules) == []


@pytest.mark.parametrize("entry", COMMANDS, ids=lambda e: e.name)
def test_a_command_help_imports_its_module_and_no_other_command(entry: _app.CommandEntry) -> None:
    """``llmslo NAME --help`` imports NAME's module and nothing that module does not import itself."""
    module = entry.target.partition(":")[0]
    code = ("import json, sys\nbefore = set(sys.modules)\n"
            f"import {module}\nown = set(sys.modules)\n"
            f"sys.argv = ['llmslo', {entry.name!r}, '--help']\nfrom llmslo.cli import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n"
            "print(json.dumps(sorted(set(sys.modules) - own)), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Usage:" in out.stdout, out.stderr[-2000:]
    run_imported = set(json.loads(out.stderr.splitlines()[-1]))
    assert sorted(run_imported & set(COMMAND_MODULES)) == []
    assert _heavy(run_imported) == [], "the command's --help imported more than its own module does"


# --- demo --live refuses the simulated demo's options ------------------------------------------------------

SIMULATION_ARGS = {"db": ["--db", "llmslo-demo.duckdb"], "trace": ["--trace", "t.csv"], "seed": ["--seed", "3"],
                   "ttft": ["--ttft", "2s"], "tpot": ["--tpot", "100ms"], "by": ["--by", "model"],
                   "window": ["--window", "5m"]}


@pytest.fixture
def live_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path | None, bool]]:
    """The live runs ``llmslo demo --live`` started (none is: each is recorded instead)."""
    runs: list[tuple[Path | None, bool]] = []
    monkeypatch.setattr(_report, "_demo_live", lambda out, as_json: runs.append((out, as_json)))
    return runs


def test_every_demo_option_but_the_live_ones_is_refused_with_live() -> None:
    """A new option of ``llmslo demo`` must be read by the live run or be refused with ``--live``."""
    demo_options = set(inspect.signature(_report.demo).parameters) - {"ctx"}
    runs = {"live", "rollout", "engine", "same_speed", "out", "as_json"}
    assert demo_options - runs == set(_report.SIMULATION_ONLY) == set(SIMULATION_ARGS)


@pytest.mark.parametrize("name", sorted(SIMULATION_ARGS))
def test_demo_live_refuses_each_simulation_option(name: str, live_runs: list[object], tmp_path: Path) -> None:
    option = SIMULATION_ARGS[name][0]
    result = runner.invoke(app, ["demo", "--live", "--out", str(tmp_path / "run"), *SIMULATION_ARGS[name]])
    assert result.exit_code == EXIT_USAGE, result.output
    message = " ".join(result.output.split())
    assert message.startswith(f"error: {option} does not go with --live: "), message
    assert _report.SIMULATION_ONLY[name][1] in message  # and why
    assert live_runs == [] and list(tmp_path.iterdir()) == []  # refused before anything started


def test_demo_live_names_every_simulation_option_given(live_runs: list[object]) -> None:
    result = runner.invoke(app, ["demo", "--trace", "t.csv", "--live", "--window", "1m", "--seed", "1"])
    assert result.exit_code == EXIT_USAGE and live_runs == []
    refused = [line.split(" does not go")[0].removeprefix("error: ") for line in result.output.splitlines()
               if " does not go with --live" in line]
    assert refused == ["--trace", "--seed", "--window"], result.output


def test_demo_live_without_simulation_options_runs(live_runs: list[tuple[Path | None, bool]],
                                                   tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--live", "--out", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    assert live_runs == [(tmp_path / "run", True)]


# --- demo --rollout: the same refusals, and its own options ------------------------------------------------


@pytest.fixture
def rollout_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path | None, bool, bool]]:
    """The rolling updates ``llmslo demo --rollout`` started (none is: each is recorded instead)."""
    runs: list[tuple[Path | None, bool, bool]] = []
    monkeypatch.setattr(_report, "_demo_rollout", lambda out, same, as_json: runs.append((out, same, as_json)))
    return runs


@pytest.mark.parametrize("name", sorted(SIMULATION_ARGS))
def test_demo_rollout_refuses_each_simulation_option(name: str, rollout_runs: list[object], tmp_path: Path) -> None:
    option = SIMULATION_ARGS[name][0]
    result = runner.invoke(app, ["demo", "--rollout", "--out", str(tmp_path / "run"), *SIMULATION_ARGS[name]])
    assert result.exit_code == EXIT_USAGE, result.output
    assert " ".join(result.output.split()).startswith(f"error: {option} does not go with --rollout: ")
    assert rollout_runs == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, says", [(["--live", "--rollout"], "choose one"),
                                        (["--same-speed"], "--same-speed goes with --rollout"),
                                        (["--live", "--same-speed"], "--same-speed goes with --rollout")])
def test_demo_rollout_options_that_do_not_go_together_are_refused(args: list[str], says: str,
                                                                 rollout_runs: list[object],
                                                                 live_runs: list[object]) -> None:
    result = runner.invoke(app, ["demo", *args])
    assert result.exit_code == EXIT_USAGE and says in " ".join(result.output.split()), result.output
    assert rollout_runs == [] and live_runs == []


@pytest.mark.parametrize("same", [False, True])
def test_demo_rollout_runs_with_its_options(same: bool, rollout_runs: list[tuple[Path | None, bool, bool]],
                                            tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--rollout", "--out", str(tmp_path / "run"), "--json",
                                 *(["--same-speed"] if same else [])])
    assert result.exit_code == 0, result.output
    assert rollout_runs == [(tmp_path / "run", same, True)]
