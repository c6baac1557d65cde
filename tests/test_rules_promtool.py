"""The generated rules checked by promtool (Prometheus 2.42): lint, behaviour proofs, and why long windows
must be traffic-weighted."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest
import yaml

from llmslo.rules import build_model, check_rules, find_promtool, load_spec, parse_spec, render, run_rule_tests
from llmslo.rules._output import dump_yaml

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "rules"
SPECS = [ROOT / "examples" / "chat-slo.yaml", *sorted(GOLDEN.glob("*.spec.yaml"))]


@pytest.fixture(autouse=True)
def _promtool() -> None:
    if find_promtool() is None:
        pytest.skip("promtool not installed: apt-get install prometheus")


def write(spec: Path, folder: Path) -> tuple[Path, list[Path]]:
    out = render(build_model(load_spec(spec)), "rules.yml", "rules_test.yml", spec.name)
    rules = folder / "rules.yml"
    rules.write_text(out.rules)
    tests = []
    for name, text in out.tests:
        (folder / name).write_text(text)
        tests.append(folder / name)
    return rules, tests


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_generated_rules_pass_promtool_check_with_every_lint_fatal(spec: Path, tmp_path: Path) -> None:
    rules, _ = write(spec, tmp_path)
    result = check_rules([rules])
    assert result.ok, result.output
    assert "SUCCESS" in result.output


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_every_alert_behaves_as_its_generated_promtool_proofs_say(spec: Path, tmp_path: Path) -> None:
    _, tests = write(spec, tmp_path)
    results = run_rule_tests(tests)
    for path, result in zip(tests, results, strict=True):
        assert result.ok, f"{path.name}:\n{result.output[-8000:]}"
    proven = {a["alertname"] for t in tests for g in yaml.safe_load(t.read_text())["tests"]
              for a in g["alert_rule_test"] if a["exp_alerts"]}
    rules = yaml.safe_load((tmp_path / "rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert proven == alerts, f"alerts never shown firing: {sorted(alerts - proven)}"


def test_proofs_catch_an_alert_whose_threshold_is_ten_times_too_low(tmp_path: Path) -> None:
    spec = GOLDEN / "completions-availability-and-e2e.spec.yaml"
    rules, tests = write(spec, tmp_path)
    text = rules.read_text()
    broken = re.sub(r"(> )0\.0144( and )", r"\g<1>0.00144\2", text)
    assert broken != text
    rules.write_text(broken)
    doc = yaml.safe_load(tests[0].read_text())
    doc["tests"] = doc["tests"][:2]  # the 1h/5m total and partial outage groups
    tests[0].write_text(dump_yaml(doc))
    result = run_rule_tests(tests[:1])[0]
    assert not result.ok
    assert "CompletionsAvailabilityBudgetBurn1h5m" in result.output


WEIGHTED_SPEC = {
    "version": "llmslo/v1", "service": "chat", "scrape": {"interval": "1m"},
    "burn_alerts": [{"severity": "page", "burn_rate": 14.4, "long_window": "1h", "short_window": "5m"}],
    "objectives": [{"name": "goodput", "kind": "goodput", "objective": 99}],
}
BUSY, QUIET = 55, 5
"""An hour of uneven traffic: 55 busy minutes of 1,000 requests, all good, then 5 quiet minutes of 10, all bad."""


def test_the_one_hour_ratio_weights_traffic_where_an_average_of_5m_ratios_is_wrong(tmp_path: Path) -> None:
    attempted = [1000] * BUSY + [10] * QUIET
    good = [1000] * BUSY + [0] * QUIET
    true_ratio = 1 - sum(good) / sum(attempted)  # 50 bad of 55,050: 0.09%
    five_minute = [1 - sum(good[i:i + 5]) / sum(attempted[i:i + 5]) for i in range(0, 60, 5)]
    rolling = [1 - sum(good[i - 5:i]) / sum(attempted[i - 5:i]) for i in range(5, 61)]
    assert true_ratio == pytest.approx(50 / 55050)
    assert statistics.mean(five_minute) == pytest.approx(1 / 12)  # 92× the true ratio
    assert statistics.mean(rolling) > 15 * true_ratio  # what averaging a 5m ratio recorded every minute gives

    out = render(build_model(parse_spec(WEIGHTED_SPEC)), "rules.yml", "t.yml")
    (tmp_path / "rules.yml").write_text(out.rules)
    labels = '{llmslo_service="chat",llmslo_slo="goodput"}'
    cumulative = [0]
    for a in attempted:
        cumulative.append(cumulative[-1] + a)
    cumulative_good = [0]
    for g in good:
        cumulative_good.append(cumulative_good[-1] + g)
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "name": "uneven traffic: the 1h ratio is total bad over total events",
            "interval": "1m",
            "input_series": [
                {"series": "llmslo_goodput_attempted_requests_total", "values": " ".join(map(str, cumulative))},
                {"series": "llmslo_goodput_good_requests_total", "values": " ".join(map(str, cumulative_good))},
            ],
            "promql_expr_test": [
                {"expr": f"abs(llmslo:slo_error:ratio_rate1h{labels} - {true_ratio!r}) < bool 1e-12",
                 "eval_time": "1h", "exp_samples": [{"labels": labels, "value": 1}]},
                # the average of the recorded 5m ratios over the same hour: some 20 times too high
                {"expr": f"avg_over_time(llmslo:slo_error:ratio_rate5m{labels}[1h]) > bool {15 * true_ratio!r}",
                 "eval_time": "1h", "exp_samples": [{"labels": labels, "value": 1}]},
                # the traffic-weighted ratio stays far below the page threshold: no false page
                {"expr": 'ALERTS{alertname="ChatGoodputBudgetBurn1h5m"}', "eval_time": "1h", "exp_samples": []},
            ],
        }, {
            "name": "no traffic: no ratio at all, never NaN",
            "interval": "1m",
            "input_series": [
                {"series": "llmslo_goodput_attempted_requests_total", "values": "0+0x90"},
                {"series": "llmslo_goodput_good_requests_total", "values": "0+0x90"},
            ],
            "promql_expr_test": [
                {"expr": f"llmslo:slo_error:ratio_rate1h{labels}", "eval_time": "1h30m", "exp_samples": []},
                {"expr": f"llmslo:slo_error:ratio_rate30d{labels}", "eval_time": "1h30m", "exp_samples": []},
            ],
        }],
    }
    path = tmp_path / "weighted_test.yml"
    path.write_text(dump_yaml(test))
    result = run_rule_tests([path])[0]
    assert result.ok, result.output
