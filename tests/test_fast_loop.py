"""The fast loop (``pytest --fast``, ``.ci/check --fast``) stays honest: every test it leaves out is listed in
``tests/conftest.py`` with the reason, every listed name is a real test, and a test that starts a process fails in
the fast loop with its name and the fix instead of slowing it down."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from llmslo.tests.conftest import FAST_LEAVES_OUT, SLOW, refuse_processes, slow_reason

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _test_functions(module: Path) -> set[str]:
    """Names of the test functions a module defines (at the top, in classes, or assigned as ``test_...``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            names.add(node.name)
    return names


def test_every_listed_slow_test_names_a_module_and_a_test_that_exist() -> None:
    stale: list[str] = []
    defined: dict[str, set[str]] = {}
    for key in SLOW:
        module, _, function = key.partition("::")
        path = TESTS / module
        if not (module.startswith("test_") and module.endswith(".py") and path.is_file()):
            stale.append(f"{key}: no module tests/{module}")
        elif function and function not in defined.setdefault(module, _test_functions(path)):
            stale.append(f"{key}: tests/{module} has no test {function}")
    assert not stale, "tests/conftest.py SLOW names tests that do not exist:\n" + "\n".join(stale)


def test_every_listed_slow_test_says_why() -> None:
    assert all(reason.strip() for reason in SLOW.values())


def test_a_listed_function_and_a_listed_module_have_a_reason_and_others_none() -> None:
    function_key = next(k for k in SLOW if "::" in k)
    module, _, function = function_key.partition("::")
    assert slow_reason(module, function) == SLOW[function_key]
    assert slow_reason(module, "test_not_listed_anywhere") is None
    whole = next(k for k in SLOW if "::" not in k)
    assert slow_reason(whole, "test_not_listed_anywhere") == SLOW[whole]
    assert slow_reason("test_not_a_module.py", function) is None


def test_the_listed_tests_collected_in_this_run_are_marked_slow(request: pytest.FixtureRequest) -> None:
    """In the full suite every listed test carries ``slow``; in the fast loop none of them was kept."""
    listed = [item for item in request.session.items
              if slow_reason(item.path.name, getattr(item, "originalname", item.name)) is not None]
    assert all(item.get_closest_marker("slow") for item in listed)
    if request.config.getoption("--fast"):
        assert not listed
        assert not any(item.get_closest_marker(m) for item in request.session.items for m in FAST_LEAVES_OUT)


def test_a_process_started_in_the_fast_loop_fails_the_test_naming_it_and_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse_processes("tests/test_x.py::test_y"))
    with pytest.raises(pytest.fail.Exception) as failed:
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    assert str(failed.value) == (
        f"tests/test_x.py::test_y starts a process ({sys.executable}), and the fast loop (pytest --fast) starts "
        "none: add the test to SLOW in tests/conftest.py with the reason")


def test_the_fast_command_is_the_checks_with_fast_tests_and_the_readme_shows_it() -> None:
    check = (ROOT / ".ci" / "check").read_text(encoding="utf-8")
    assert 'pytest -p no:cacheprovider "$@"' in check and "`.ci/check --fast`" in check
    assert "for the developer loop: `.ci/check --fast`" in (ROOT / "README.md").read_text(encoding="utf-8")
