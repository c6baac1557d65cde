"""A hostile or broken spec fails at once with a message: alias bombs, deep nesting, bytes that are not
UTF-8, durations Prometheus cannot hold, and proofs too long to build."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmslo.cli._rules import rules_app
from llmslo.rules import (
    MAX_PROMETHEUS_DURATION_S,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    SpecError,
    build_model,
    find_promtool,
    load_spec,
    load_yaml,
    parse_spec_text,
    render,
)

runner = CliRunner()
needs_promtool = pytest.mark.skipif(find_promtool() is None,
                                    reason="promtool not installed: apt-get install prometheus")

BASE = """\
version: llmslo/v1
service: chat
scrape: {interval: 1m}
burn_alerts:
  - {severity: page, burn_rate: 14.4, long_window: 1h, short_window: 5m}
objectives:
  - {name: ttft, kind: latency, metric: ttft, threshold: 2s, objective: 99}
"""


def bomb(levels: int) -> str:
    """A spec whose ``service`` is ``9 ** levels`` strings through nested aliases: a few hundred bytes."""
    lines = ["version: llmslo/v1", 'a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join([*lines, f"service: *a{levels - 1}"]) + "\n"


@pytest.fixture
def no_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the YAML text reaches PyYAML's constructor (the refusal must come first)."""
    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("the document was constructed")
    monkeypatch.setattr(yaml, "safe_load", refuse)


@pytest.mark.usefixtures("no_construction")
def test_an_alias_bomb_is_refused_before_it_is_built() -> None:
    text = bomb(9)  # 387,420,489 strings once expanded; took 27-49 s and gigabytes before
    assert len(text) < 1000
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, "bomb.yaml")
    message = str(info.value)
    assert f"bomb.yaml: more than {MAX_YAML_NODES:,} YAML nodes once its aliases are expanded" in message
    assert "line 6" in message  # the alias where the count went past the limit
    assert len(message) < 400  # the message quotes no part of the structure


def test_aliases_that_share_a_part_of_the_spec_are_fine() -> None:
    text = BASE.replace("objectives:\n", "objectives:\n  - {name: tpot, kind: latency, metric: tpot, threshold: "
                        "100ms, objective: 99, selector: *sel}\n")
    text = text.replace("scrape: {interval: 1m}", "scrape: {interval: 1m}\nselector: &sel {model: chat}")
    spec = parse_spec_text(text)
    assert [dict(o.selector) for o in spec.objectives] == [{"model": "chat"}, {"model": "chat"}]


def test_expansion_is_counted_exactly_up_to_the_limit() -> None:
    """``n`` aliases of a list of 98 scalars: 1 + 99·k nodes per alias; the limit is inclusive."""
    base = "a: &a [" + ",".join(["x"] * 98) + "]\nb: ["
    # root mapping 1, key a 1, list 99, key b 1, list b 1: 103 nodes before the aliases
    fits = (MAX_YAML_NODES - 103) // 99
    assert load_yaml(base + ",".join(["*a"] * fits) + "]\n") is not None
    with pytest.raises(SpecError, match="more than 10,000 YAML nodes"):
        load_yaml(base + ",".join(["*a"] * (fits + 1)) + "]\n")


@pytest.mark.parametrize(("text", "why"), [
    ("a: &a [1, *a]\n", "alias *a at line 1, column 11 refers to a node that contains it"),
    ("a: *b\n", "alias *b at line 1, column 4 is not defined before it is used"),
])
def test_recursive_or_undefined_aliases_are_named(text: str, why: str) -> None:
    with pytest.raises(SpecError, match="^spec: " + why.replace("*", r"\*")):
        load_yaml(text)


@pytest.mark.usefixtures("no_construction")
def test_nesting_5000_deep_is_refused_with_a_message_not_a_recursion_error() -> None:
    text = "version: llmslo/v1\nservice: " + "[" * 5000 + "]" * 5000 + "\n"
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, "deep.yaml")
    assert str(info.value).startswith(f"deep.yaml: nested more than {MAX_YAML_DEPTH} levels deep at line 2")


def test_a_spec_that_is_not_utf8_names_the_line_and_byte(tmp_path: Path) -> None:
    spec = tmp_path / "latin1.yaml"
    spec.write_bytes(BASE.replace("service: chat", "service: caf\xe9").encode("latin-1"))
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    assert str(info.value) == (f"{spec} is not UTF-8 text: byte 0xe9 at line 2, byte 13 of the line "
                               "(invalid continuation byte); save the spec as UTF-8")


@pytest.mark.parametrize("name", ["bomb", "deep", "latin1"])
def test_the_command_reports_a_hostile_spec_in_one_line_and_exits_1(tmp_path: Path, name: str) -> None:
    spec = tmp_path / f"{name}.yaml"
    if name == "latin1":
        spec.write_bytes(b"version: llmslo/v1\nservice: caf\xe9\n")
    else:
        spec.write_text(bomb(9) if name == "bomb" else "a: " + "[" * 5000 + "]" * 5000 + "\n")
    for command in (["explain", str(spec)], ["generate", str(spec), "-o", str(tmp_path / "r.yml")]):
        result = runner.invoke(rules_app, command)
        assert result.exit_code == 1, result.output
        assert result.output.startswith(f"error: {spec}")
        assert result.output.count("\n") == 1 and "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "r.yml").exists()


LONGEST = "106751d23h47m16s"
"""The longest duration Prometheus reads: 2^63-1 ns, rounded down to whole seconds."""


def test_the_longest_prometheus_duration_is_2_to_the_63_nanoseconds() -> None:
    assert MAX_PROMETHEUS_DURATION_S == 9_223_372_036
    spec = parse_spec_text(BASE.replace("scrape:", f"absent_for: {LONGEST}\nscrape:"))
    assert spec.absent_for_s == MAX_PROMETHEUS_DURATION_S


@pytest.mark.parametrize(("field", "yaml_text"), [
    ("period", "period: 106751d23h47m17s"),
    ("period", "period: 15251w"),
    ("absent_for", "absent_for: 100000000000000000000000"),  # a number of seconds
    ("operational.breaker_open.for", "operational: {breaker_open: {for: 15251w}}"),
    ("burn_alerts[0].long_window", None),
])
def test_a_duration_longer_than_prometheus_accepts_is_refused_at_the_spec(field: str, yaml_text: str | None) -> None:
    if yaml_text is None:
        text = BASE.replace("long_window: 1h", "long_window: 106752d")
    else:
        text = BASE.replace("scrape:", f"{yaml_text}\nscrape:")
    with pytest.raises(SpecError) as info:
        parse_spec_text(text)
    assert info.value.path == field
    assert f"is longer than Prometheus accepts: a duration may be at most {LONGEST}" in info.value.problem


@needs_promtool
def test_promtool_accepts_rules_with_the_longest_duration_the_spec_accepts(tmp_path: Path) -> None:
    spec = tmp_path / "long.yaml"
    spec.write_text(BASE.replace("scrape:", f"absent_for: {LONGEST}\noperational: {{breaker_open: {{for: {LONGEST}}}}}"
                                 "\nscrape:"))
    rules = tmp_path / "rules.yml"
    assert runner.invoke(rules_app, ["generate", str(spec), "-o", str(rules)]).exit_code == 0
    assert f"for: {LONGEST}" in rules.read_text()
    result = runner.invoke(rules_app, ["check", str(rules)])
    assert result.exit_code == 0, result.output


def test_tests_too_long_to_build_are_refused_naming_the_field(tmp_path: Path) -> None:
    model = build_model(parse_spec_text(BASE.replace("scrape:", "operational: {breaker_open: {for: 90d}}\nscrape:")))
    with pytest.raises(SpecError) as info:
        render(model)
    assert info.value.path == "operational.breaker_open"
    assert re.search(r"the promtool tests of ChatBreakerOpen would sample a series [\d,]+ times, every 1m "
                     r"\(at most 50,000\)", info.value.problem)
    assert render(model, with_tests=False).tests == ()  # the rules alone are fine
    spec = tmp_path / "long.yaml"
    spec.write_text(BASE.replace("scrape:", "operational: {breaker_open: {for: 90d}}\nscrape:"))
    rules, tests = tmp_path / "rules.yml", tmp_path / "rules_test.yml"
    assert runner.invoke(rules_app, ["generate", str(spec), "-o", str(rules)]).exit_code == 0
    refused = runner.invoke(rules_app, ["generate", str(spec), "-o", str(rules), "--tests", str(tests)])
    assert refused.exit_code == 1 and "operational.breaker_open: the promtool tests" in refused.output
    assert not tests.exists()
