"""``llmslo rules``: generate Prometheus rules from an SLO spec, check them with promtool, explain them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmslo.cli._common import console as _console
from llmslo.cli._common import fail as _fail

if TYPE_CHECKING:
    from llmslo.rules import Model

rules_app = typer.Typer(
    name="rules",
    help=(
        "Prometheus recording and alert rules from an SLO spec (YAML, version: llmslo/v1): multi-window "
        "multi-burn-rate alerts on goodput, TTFT/TPOT/e2e latency and errors, absent-data and operational "
        "alerts, with promtool tests proving when each alert fires and resets.\n\n"
        "Start with: llmslo rules explain examples/chat-slo.yaml"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _model(spec: Path) -> Model:
    from llmslo.rules import SpecError, build_model, load_spec

    try:
        return build_model(load_spec(spec))
    except SpecError as exc:
        raise _fail(f"{spec}: {exc}", 2) from None
    except OSError as exc:
        raise _fail(f"cannot read {spec}: {exc.strerror or exc}", 2) from None


SpecArgument = Annotated[Path, typer.Argument(help="SLO spec (YAML, version: llmslo/v1).", show_default=False)]


@rules_app.command()
def generate(
    spec: SpecArgument,
    output: Annotated[Path, typer.Option("-o", "--output", help="Rules file to write.", show_default=False)],
    tests: Annotated[Path | None, typer.Option(
        "--tests", help="promtool test file to write. Long windows are proven in sibling files evaluated less "
        "often (NAME.eval10m.yml, ...); run them all with llmslo rules check.")] = None,
) -> None:
    """Write the recording and alert rules of SPEC (and, with --tests, the promtool tests proving them).

    The output is byte-deterministic: the same spec and llmslo version give the same files.
    """
    from llmslo.rules import render

    model = _model(spec)
    tests_name = tests.name if tests is not None else "rules_test.yml"
    rule_file = os.path.relpath(output.resolve(), (tests or output).resolve().parent)
    out = render(model, rule_file, tests_name, spec.name)
    written = [output]
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(out.rules, encoding="utf-8")
        if tests is not None:
            tests.parent.mkdir(parents=True, exist_ok=True)
            for name, text in out.tests:
                path = tests.parent / name
                path.write_text(text, encoding="utf-8")
                written.append(path)
    except OSError as exc:
        raise _fail(f"cannot write: {exc}") from None
    console = _console()
    console.print(f"wrote {output}: {out.rule_count} rules in {out.group_count} groups", highlight=False)
    for path in written[1:]:
        console.print(f"wrote {path}", highlight=False)
    if tests is not None:
        console.print(f"check them: llmslo rules check {' '.join(str(p) for p in written)}", highlight=False)


def _kind(path: Path) -> str:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc.strerror or exc}", 2) from None
    except yaml.YAMLError as exc:
        raise _fail(f"{path} is not valid YAML: {exc}") from None
    if isinstance(data, dict) and "groups" in data:
        return "rules"
    if isinstance(data, dict) and "tests" in data:
        return "tests"
    raise _fail(f"{path} is neither a rules file (groups:) nor a promtool test file (tests:)", 2)


@rules_app.command()
def check(
    files: Annotated[list[Path], typer.Argument(help="Rules files and promtool test files.", show_default=False)],
) -> None:
    """Check rules files with `promtool check rules --lint=all --lint-fatal` and run promtool test files.

    Needs promtool (Debian/Ubuntu: apt-get install prometheus).
    """
    from llmslo.rules import PromtoolError, check_rules, run_rule_tests

    kinds = {path: _kind(path) for path in files}
    rule_files = [p for p, k in kinds.items() if k == "rules"]
    test_files = [p for p, k in kinds.items() if k == "tests"]
    console = _console()
    failed = False
    try:
        if rule_files:
            result = check_rules(rule_files)
            failed |= not result.ok
            console.print(result.output.rstrip(), highlight=False, markup=False)
        for path, result in zip(test_files, run_rule_tests(test_files), strict=True):
            failed |= not result.ok
            console.print(result.output.rstrip(), highlight=False, markup=False)
            console.print(f"{path}: {'passed' if result.ok else 'FAILED'} in {result.seconds:.1f}s", highlight=False)
    except PromtoolError as exc:
        raise _fail(str(exc)) from None
    if failed:
        raise _fail("promtool found problems (see above)")


@rules_app.command("explain")
def explain_command(
    spec: SpecArgument,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")] = False,
) -> None:
    """Each alert of SPEC: windows, burn rate, time to detect a total outage, budget spent when it fires,
    time to reset after recovery; then the absent-data and operational alerts."""
    from rich.table import Table

    from llmslo.rules import explain

    result = explain(_model(spec))
    if as_json:
        print(json.dumps(result.as_dict(), indent=2, ensure_ascii=False))
        return
    console = _console()
    columns, rows = result.burn_table()
    burn = Table(title=f"{result.service}: burn-rate alerts (period {result.period})", title_justify="left")
    for column in columns:
        burn.add_column(column, justify="left" if column in ("SLO", "alert", "severity", "windows") else "right")
    for cells in rows:
        burn.add_row(*cells)
    console.print(burn)
    console.print("Detection and reset times assume error-free traffic before a total outage; the budget spent "
                  "is burn rate × long window ÷ period.", highlight=False)
    columns, rows = result.other_table()
    other = Table(title=f"{result.service}: absent-data and operational alerts", title_justify="left")
    for column in columns:
        other.add_column(column, justify="right" if column == "for" else "left")
    for cells in rows:
        other.add_row(*cells)
    console.print(other)
