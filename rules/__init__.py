"""SLO spec -> Prometheus recording and alert rules, with promtool tests proving how every alert behaves.

The pipeline is four small pure steps: :func:`load_spec` (YAML, ``version: llmslo/v1``, validated with
errors naming the field) -> :func:`build_model` (budgets, thresholds, detection times) ->
:func:`generate_groups` (rule groups; metric names from the :mod:`llmslo.telemetry` catalogue) ->
:func:`render` (byte-deterministic YAML for the rules and the promtool test files). :func:`explain` turns
the model into a table; :func:`check_rules` and :func:`run_rule_tests` run promtool.

``build_model(spec, engine="vllm")`` (with ``load_spec(path, engine=True)``) reads an inference engine's own
series instead of llmslo's (:mod:`llmslo.engines`): what the engine cannot give is left out and listed in
``Model.refused`` (:class:`Refusal`: the entry, the engine, why, the way out); :class:`EngineSupportError` when
no objective is left.

Example::

    from llmslo.rules import build_model, load_spec, render

    out = render(build_model(load_spec("examples/chat-slo.yaml")), "rules.yml", "rules_test.yml")
    Path("rules.yml").write_text(out.rules)
"""

from llmslo.rules._durations import MAX_PROMETHEUS_DURATION_S
from llmslo.rules._engine import EngineSupportError, Refusal, Sli
from llmslo.rules._errors import PromtoolError, SpecError
from llmslo.rules._explain import BurnRow, Explanation, OtherRow, explain
from llmslo.rules._generator import Rule, RuleGroup, generate_groups
from llmslo.rules._model import BurnRateAlert, Model, OperationalAlert, Slo, build_model
from llmslo.rules._output import Rendered, proof_file_name, render
from llmslo.rules._promtool import PromtoolResult, check_rules, find_promtool, run_rule_tests
from llmslo.rules._proofs import Check, Proof, generate_proofs
from llmslo.rules._spec import (
    DEFAULT_BURN_ALERTS,
    SATURATION_METRICS,
    SPEC_VERSION,
    BurnAlertSpec,
    ObjectiveSpec,
    OperationalSpec,
    Spec,
    load_spec,
    parse_spec,
    parse_spec_text,
)
from llmslo.rules._yaml import MAX_YAML_DEPTH, MAX_YAML_NODES, load_yaml, top_level_keys

__all__ = [
    "BurnAlertSpec",
    "BurnRateAlert",
    "BurnRow",
    "Check",
    "DEFAULT_BURN_ALERTS",
    "EngineSupportError",
    "Explanation",
    "MAX_PROMETHEUS_DURATION_S",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "Model",
    "ObjectiveSpec",
    "OperationalAlert",
    "OperationalSpec",
    "OtherRow",
    "PromtoolError",
    "PromtoolResult",
    "Proof",
    "Refusal",
    "Rendered",
    "Rule",
    "RuleGroup",
    "SATURATION_METRICS",
    "SPEC_VERSION",
    "Sli",
    "Slo",
    "Spec",
    "SpecError",
    "build_model",
    "check_rules",
    "explain",
    "find_promtool",
    "generate_groups",
    "generate_proofs",
    "load_spec",
    "load_yaml",
    "parse_spec",
    "parse_spec_text",
    "proof_file_name",
    "render",
    "run_rule_tests",
    "top_level_keys",
]
