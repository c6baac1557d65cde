"""``llmslo rules``: generate Prometheus rules from an SLO spec, check them with promtool, explain them."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmslo.cli._common import EXIT_INPUT, print_refusals, refusals_json, shown, spec_model
from llmslo.cli._common import console as _console
from llmslo.cli._common import fail as _fail
from llmslo.cli._help import INFERENCE_ENGINES

if TYPE_CHECKING:
    from llmslo.rules import PromtoolResult

rules_app = typer.Typer(
    name="rules",
    help=(
        "Prometheus recording and alert rules from an SLO spec (YAML, version: llmslo/v1): multi-window "
        "multi-burn-rate alerts on goodput, TTFT/TPOT/e2e latency and errors, absent-data and operational "
        "alerts, with promtool tests proving when each alert fires and resets.\n\n"
        "Start with: llmslo rules explain examples/chat-slo.yaml\n\n"
        "Over an inference engine's own /metrics instead (no llmslo inside the server): --engine "
        f"{'|'.join(INFERENCE_ENGINES)}; what the engine cannot give is refused with the reason and the way out."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


SpecArgument = Annotated[Path, typer.Argument(help="SLO spec (YAML, version: llmslo/v1).", show_default=False)]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")]
EngineOption = Annotated[str | None, typer.Option(
    "--engine", help=f"Read the inference engine's own series ({', '.join(INFERENCE_ENGINES)}) instead of llmslo's "
    "telemetry: for servers without llmslo inside. Objectives the engine cannot give (goodput; a latency "
    "without its histogram or at a threshold that is not one of its bucket bounds; ...) are refused with the "
    "reason and the way out, the others generated; none left exits 1.", show_default=False)]


@rules_app.command()
def generate(
    spec: SpecArgument,
    output: Annotated[Path, typer.Option("-o", "--output", help="Rules file to write.", show_default=False)],
    tests: Annotated[Path | None, typer.Option(
        "--tests", help="promtool test file to write. Long windows are proven in sibling files evaluated less "
        "often (NAME.eval10m.yml, ...); run them all with llmslo rules check.")] = None,
    as_json: JsonOption = False,
    engine: EngineOption = None,
) -> None:
    """Write the recording and alert rules of SPEC (and, with --tests, the promtool tests proving them).

    The output is byte-deterministic: the same spec and llmslo version give the same files. With --json,
    one object: rules_file, rule_count, group_count, test_files (and with --engine: engine, refused).

    With --engine, the rules read that engine's own series (docs/dashboards.md says what each engine can
    and cannot alert on); each spec entry it cannot give is printed first, with why and the way out (put
    llmslo gateway in front of the engine, or llmslo's middleware inside a Python server), and named in the rules
    file's header.
    """
    from llmslo.rules import SpecError, render

    model = spec_model(spec, engine)
    print_refusals(model)
    tests_name = tests.name if tests is not None else "rules_test.yml"
    rule_file = os.path.relpath(output.resolve(), (tests or output).resolve().parent)
    rule_file = re.sub(r"([*?\[\\])", r"\\\1", rule_file)  # promtool reads it as a glob: run[1]/ would match nothing
    try:
        out = render(model, rule_file, tests_name, spec.name, with_tests=tests is not None)
    except SpecError as exc:
        raise _fail(f"{spec}: {exc}", EXIT_INPUT) from None
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
        raise _fail(f"cannot write: {exc}", EXIT_INPUT) from None
    if as_json:
        data: dict[str, object] = {"rules_file": str(output), "rule_count": out.rule_count,
                                   "group_count": out.group_count, "test_files": [str(p) for p in written[1:]]}
        if engine is not None:
            data |= {"engine": engine, "refused": refusals_json(model)}
        print(json.dumps(data, indent=2))
        return
    console = _console()
    console.print(f"wrote {shown(output)}: {out.rule_count} rules in {out.group_count} groups", highlight=False)
    for path in written[1:]:
        console.print(f"wrote {shown(path)}", highlight=False)
    if tests is not None:
        console.print(f"check them: llmslo rules check {shown(' '.join(str(p) for p in written))}", highlight=False)


def _kind(path: Path) -> str:
    """``rules`` or ``tests``, from the file's top-level keys; a file that is neither exits 1 naming it."""
    from llmslo.rules import SpecError, top_level_keys

    try:
        keys = top_level_keys(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc.strerror or exc}", EXIT_INPUT) from None
    except UnicodeDecodeError:
        raise _fail(f"{path} is not UTF-8 text", EXIT_INPUT) from None
    except SpecError as exc:
        raise _fail(str(exc), EXIT_INPUT) from None
    if "groups" in keys:
        return "rules"
    if "tests" in keys:
        return "tests"
    raise _fail(f"{path} is neither a rules file (groups:) nor a promtool test file (tests:)", EXIT_INPUT)


def _result(result: PromtoolResult, files: list[Path]) -> dict[str, object]:
    return {"files": [str(p) for p in files], "ok": result.ok, "seconds": round(result.seconds, 3),
            "output": result.output}


@rules_app.command()
def check(
    files: Annotated[list[Path], typer.Argument(help="Rules files and promtool test files.", show_default=False)],
    as_json: JsonOption = False,
) -> None:
    """Check rules files with `promtool check rules --lint=all --lint-fatal` and run promtool test files.

    Needs promtool (Debian/Ubuntu: apt-get install prometheus). Exits 1 when promtool finds a problem. With
    --json, one object: ok, rules (files, ok, seconds, output; null without a rules file) and tests (one per
    test file).
    """
    from llmslo.rules import PromtoolError, check_rules, run_rule_tests

    kinds = {path: _kind(path) for path in files}
    rule_files = [p for p, k in kinds.items() if k == "rules"]
    test_files = [p for p, k in kinds.items() if k == "tests"]
    try:
        rules = check_rules(rule_files) if rule_files else None
        tests = run_rule_tests(test_files) if test_files else []
    except PromtoolError as exc:
        raise _fail(str(exc)) from None
    failed = (rules is not None and not rules.ok) or not all(t.ok for t in tests)
    if as_json:
        print(json.dumps({"ok": not failed, "rules": _result(rules, rule_files) if rules is not None else None,
                          "tests": [_result(t, [p]) for p, t in zip(test_files, tests, strict=True)]}, indent=2))
    else:
        console = _console()
        if rules is not None:
            console.print(shown(rules.output.rstrip(), newlines=True), highlight=False)
        for path, result in zip(test_files, tests, strict=True):
            console.print(shown(result.output.rstrip(), newlines=True), highlight=False)
            console.print(f"{shown(path)}: {'passed' if result.ok else 'FAILED'} in {result.seconds:.1f}s",
                          highlight=False)
    if failed:
        if as_json:
            raise typer.Exit(EXIT_INPUT)
        raise _fail("promtool found problems (see above)")


@rules_app.command("explain")
def explain_command(
    spec: SpecArgument,
    as_json: JsonOption = False,
    engine: EngineOption = None,
) -> None:
    """Each alert of SPEC: windows, burn rate, time to detect a total outage, budget spent when it fires,
    time to reset after recovery; then the absent-data and operational alerts (with --engine, those the
    engine's own series can give)."""
    from rich.table import Table

    from llmslo.rules import explain

    model = spec_model(spec, engine)
    print_refusals(model)
    result = explain(model)
    if as_json:
        print(json.dumps(result.as_dict(), indent=2, ensure_ascii=False))
        return
    console = _console()
    columns, rows = result.burn_table()
    burn = Table(title=f"{shown(result.service)}: burn-rate alerts (period {shown(result.period)})",
                 title_justify="left")
    for column in columns:
        burn.add_column(column, justify="left" if column in ("SLO", "alert", "severity", "windows") else "right")
    for cells in rows:
        burn.add_row(*(shown(c) for c in cells))
    console.print(burn)
    console.print("Detection and reset times assume error-free traffic before a total outage; the budget spent "
                  "is burn rate × long window ÷ period.", highlight=False)
    columns, rows = result.other_table()
    other = Table(title=f"{shown(result.service)}: absent-data and operational alerts", title_justify="left")
    for column in columns:
        other.add_column(column, justify="right" if column == "for" else "left")
    for cells in rows:
        other.add_row(*(shown(c) for c in cells))
    console.print(other)
