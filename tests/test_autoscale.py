"""``llmslo autoscale simulate``: the simulation's invariants on the Azure trace's burst, backpressure during
scale-up, the engine's step times, policy validation, determinism, the command in process.

The real trace is read from ../shared/real_data/azure (skipped with the reason when missing). The command run
as a process (the installed ``llmslo``) is in tests/test_autoscale_cli.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmslo.cli._app import app
from llmslo.ops._autoscale import (
    COMPLETED,
    REJECTED,
    TIMED_OUT,
    Arrival,
    AutoscalePolicy,
    PolicyError,
    Simulation,
    load_policy,
    parse_policy,
    read_arrivals,
    simulate,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(ROOT.glob("examples/hpa-*.yaml"))
CODE_TRACE = Path(__file__).resolve().parents[2] / "shared" / "real_data" / "azure" / "AzureLLMInferenceTrace_code.csv"
needs_trace = pytest.mark.skipif(
    not CODE_TRACE.is_file(), reason=f"the real Azure trace is missing: {CODE_TRACE} (see shared/real_data/README.md)")
# The burst: no arrival from about 64 s to 180 s after the first one, then 531 in a minute.
BURST = (120.0, 420.0)
runner = CliRunner()


@pytest.fixture(scope="module")
def burst() -> list[Arrival]:
    if not CODE_TRACE.is_file():
        pytest.skip(f"the real Azure trace is missing: {CODE_TRACE}")
    return read_arrivals("azure", CODE_TRACE, start_s=BURST[0], end_s=BURST[1])


def _scale_ups(sim: Simulation) -> list[tuple[float, float]]:
    """The intervals from a scale-up until every desired replica is ready (seconds)."""
    spans: list[tuple[float, float]] = []
    begin: float | None = None
    for c in sim.changes:
        if begin is None and c.why.startswith("scale up"):
            begin = c.t_s
        if begin is not None and c.starting == 0 and c.ready >= c.desired:
            spans.append((begin, c.t_s))
            begin = None
    if begin is not None:
        spans.append((begin, sim.end_s))
    return spans


# ---- the three invariants on the real burst ----------------------------------------------------------------


@needs_trace
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_the_azure_burst_keeps_the_three_invariants(burst: list[Arrival], example: Path) -> None:
    policy = dataclasses.replace(load_policy(example), max_replicas=2)  # low enough that the maximum binds
    sim = simulate(policy, burst, seed=3)
    outs = sim.outcomes
    assert len(outs) == len(burst) and sum(o.outcome == REJECTED for o in outs) > 0, "the burst overloads"
    # 1. nobody is admitted beyond capacity: into a slot only while its replica has one free, into the queue
    #    only while it has a free place; the sampled queue never beyond it either
    for o in outs:
        if o.outcome != REJECTED:
            assert o.queue_depth < policy.max_queue, o
        if o.outcome == COMPLETED:
            assert o.replica_in_flight is not None and 1 <= o.replica_in_flight <= policy.max_num_seqs, o
    assert max(s.queue for s in sim.samples) == policy.max_queue  # it filled, and never went beyond
    # 2. a 429 at the door only while the queue is full, always with a Retry-After
    for o in outs:
        if o.outcome == REJECTED:
            assert o.queue_depth == policy.max_queue, o
        if o.outcome in (REJECTED, TIMED_OUT):
            assert o.retry_after_s is not None and int(o.retry_after_header or "0") >= 1, o
    # 3. the replica count never exceeds its maximum (and the controller wanted more than it)
    counts = [c.starting + c.ready for c in sim.changes] + [s.starting + s.ready for s in sim.samples]
    assert max(counts) == policy.max_replicas
    assert max(c.desired for c in sim.changes) <= policy.max_replicas
    unclamped = simulate(dataclasses.replace(policy, max_replicas=8), burst, seed=3)
    assert max(c.desired for c in unclamped.changes) > policy.max_replicas, "the maximum must bind in this test"


@needs_trace
def test_a_new_replica_serves_only_after_the_pod_start_delay(burst: list[Arrival]) -> None:
    policy = load_policy(ROOT / "examples" / "hpa-queue.yaml")
    sim = simulate(policy, burst)
    ready = {int(c.why.split()[1]): c.t_s for c in sim.changes if c.why.endswith(" ready")}
    assert ready, "the burst makes the controller add replicas"
    for rid, t in ready.items():
        assert t - sim.replica_spans[rid][0] == pytest.approx(policy.pod_start_delay_s)
    served = {o.replica: o.dispatched_s for o in sim.outcomes if o.replica in ready and o.dispatched_s is not None}
    for rid, first in served.items():
        assert first >= ready[rid]


@needs_trace
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_during_scale_up_admitted_ttft_stays_inside_the_slo_while_the_excess_gets_429(
        burst: list[Arrival], example: Path) -> None:
    policy = load_policy(example)
    sim = simulate(policy, burst, seed=1)
    spans = _scale_ups(sim)
    assert spans, "the burst makes the controller scale up"
    during = [o for o in sim.outcomes if any(a <= o.arrival_s < b for a, b in spans)]
    served = [o for o in during if o.outcome == COMPLETED]
    refused = [o for o in during if o.outcome in (REJECTED, TIMED_OUT)]
    limit = policy.slo.ttft_s
    assert limit is not None and served and refused
    assert max(o.ttft_s or 0.0 for o in served) <= limit
    assert all(o.retry_after_header is not None and int(o.retry_after_header) >= 1 for o in refused)
    # without the backpressure (a queue as long as the burst, no queue timeout to speak of) the same scale-up
    # breaks the SLO: the bound above is the queue's doing
    loose = simulate(dataclasses.replace(policy, max_queue=10_000, queue_timeout_s=3600.0), burst, seed=1)
    assert max(o.ttft_s or 0.0 for o in loose.outcomes) > limit


# ---- the engine model, the controller, the totals -------------------------------------------------------------


def test_the_default_profile_is_the_one_of_llmslo_serve() -> None:
    from llmslo.ops._autoscale import DEFAULT_PROFILE
    from llmslo.server._profile import DEFAULT_PROFILE as SERVE_DEFAULT

    assert DEFAULT_PROFILE == SERVE_DEFAULT


def test_one_request_alone_takes_the_profile_step_times() -> None:
    policy = parse_policy({"name": "p", "metric": "queue_length", "target": 4})
    prof = policy.engine_profile
    sim = simulate(policy, [Arrival(0.0, 1000, 50)])
    (o,) = sim.outcomes
    assert o.outcome == COMPLETED and o.queue_depth == 0 and o.replica_in_flight == 1
    assert o.ttft_s == pytest.approx(prof.step_s(1000, 0))
    assert o.e2e_s == pytest.approx(prof.step_s(1000, 0) + 49 * prof.decode_s(1))
    assert o.tpot_s == pytest.approx(prof.decode_s(1))
    assert o.good is (o.ttft_s <= 2.0 and o.tpot_s <= 0.1)


def test_slots_queue_and_refusals_follow_the_gateway_rules() -> None:
    """Three slots, a queue of two: the first three get slots, two wait, the sixth is refused (429)."""
    policy = parse_policy({"name": "p", "metric": "queue_length", "target": 100, "max_num_seqs": 3,
                           "max_queue": 2, "queue_timeout_s": 60})
    sim = simulate(policy, [Arrival(0.0, 100, 10)] * 6)
    kinds = [(o.outcome, o.queue_depth) for o in sim.outcomes]
    assert kinds == [(COMPLETED, 0)] * 3 + [(COMPLETED, 0), (COMPLETED, 1), (REJECTED, 2)]
    waited = sim.outcomes[3:5]
    assert all(o.dispatched_s is not None and o.dispatched_s > 0 for o in waited)


def test_a_waiter_past_the_queue_timeout_gets_429_and_retry_after() -> None:
    policy = parse_policy({"name": "p", "metric": "queue_length", "target": 100, "max_num_seqs": 1,
                           "max_queue": 4, "queue_timeout_s": 0.5})
    sim = simulate(policy, [Arrival(0.0, 100, 200), Arrival(0.1, 100, 10)])
    first, second = sim.outcomes
    assert first.outcome == COMPLETED and first.e2e_s is not None and first.e2e_s > 0.6
    assert second.outcome == TIMED_OUT and second.retry_after_header is not None


def test_scale_down_waits_for_its_stabilisation_window() -> None:
    base = {"name": "p", "metric": "concurrency", "target": 1, "max_replicas": 4, "sync_period_s": 5,
            "pod_start_delay_s": 10, "scale_down_stabilization_s": 60}
    # 10 s of load, then one request at 150 s (the run, and the controller, last until it ends)
    arrivals = [Arrival(i * 0.25, 200, 100) for i in range(40)] + [Arrival(150.0, 10, 1)]
    sim = simulate(parse_policy(base), arrivals)
    up = next(c for c in sim.changes if c.why.startswith("scale up"))
    down = next(c for c in sim.changes if c.why.startswith("scale down"))
    last_busy = max(s.t_s for s in sim.samples if s.in_flight > 0 and s.t_s < 100)
    assert down.t_s - last_busy >= 60 - base["sync_period_s"]  # the highest recommendation of the window held
    quick = simulate(parse_policy({**base, "scale_down_stabilization_s": 0}), arrivals)
    quick_down = next(c for c in quick.changes if c.why.startswith("scale down"))
    assert quick_down.t_s < down.t_s and up.t_s <= base["sync_period_s"]


@needs_trace
def test_buckets_add_up_to_the_totals(burst: list[Arrival]) -> None:
    sim = simulate(load_policy(EXAMPLES[0]), burst)
    totals = sim.totals()
    rows = sim.buckets(30.0)
    assert sum(b.arrivals for b in rows) == totals.arrivals == len(burst)
    assert sum(b.rejected for b in rows) == totals.rejected
    assert sum(b.good for b in rows) == totals.good
    assert sum(b.gpu_s for b in rows) == pytest.approx(totals.gpu_s)
    assert totals.gpu_s >= totals.duration_s  # at least one replica all along


@needs_trace
def test_a_run_is_deterministic_for_its_seed(burst: list[Arrival]) -> None:
    policy = load_policy(EXAMPLES[0])
    a, b, c = simulate(policy, burst, seed=7), simulate(policy, burst, seed=7), simulate(policy, burst, seed=8)
    assert a == b
    assert [o.retry_after_s for o in a.outcomes] != [o.retry_after_s for o in c.outcomes]  # the jitter's seed


# ---- policy validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "field", "says"), [
    ({"metric": "queue_length", "target": 4}, "name", "is required"),
    ({"name": "p", "metric": "cpu", "target": 4}, "metric", "queue_length, concurrency, gpu_utilization"),
    ({"name": "p", "metric": "queue_length", "target": -1}, "target", "> 0"),
    ({"name": "p", "metric": "gpu_utilization", "target": 80}, "target", "share in (0, 1]"),
    ({"name": "p", "metric": "queue_length", "target": 4, "max_replicas": 0}, "max_replicas", ">= 1"),
    ({"name": "p", "metric": "queue_length", "target": 4, "min_replicas": 3, "max_replicas": 2}, "max_replicas",
     ">= min_replicas (3)"),
    ({"name": "p", "metric": "queue_length", "target": 4, "initial_replicas": 11}, "initial_replicas", "[1, 10]"),
    ({"name": "p", "metric": "queue_length", "target": 4, "sync_period_s": 0}, "sync_period_s", "> 0"),
    ({"name": "p", "metric": "queue_length", "target": 4, "pod_start_delay_s": "45s"}, "pod_start_delay_s",
     "must be a number"),
    ({"name": "p", "metric": "queue_length", "target": 4, "profile": "gpt-5/tpu"}, "profile", "llama2-70b/h100-80gb"),
    ({"name": "p", "metric": "queue_length", "target": 4, "max_replica": 3}, "max_replica",
     "did you mean max_replicas"),
    ({"name": "p", "metric": "queue_length", "target": 4, "slo": {"ttft": 2}}, "slo.ttft", "did you mean slo.ttft_s"),
    ({"name": "p", "metric": "queue_length", "target": 4, "slo": {"ttft_s": 0}}, "slo.ttft_s", "> 0"),
    ({"name": "p", "metric": "queue_length", "target": True}, "target", "must be a number"),
])
def test_a_bad_policy_is_refused_naming_the_field(data: dict[str, object], field: str, says: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(data, "hpa.yaml")
    assert info.value.field == field
    assert str(info.value).startswith(f"hpa.yaml: field {field!r}: ") and says in str(info.value)


def test_a_policy_file_that_is_no_mapping_or_no_yaml_is_named(tmp_path: Path) -> None:
    for text, says in (("- a\n- b\n", "must be a mapping"), ("name: [\n", "not valid YAML")):
        path = tmp_path / "bad.yaml"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(PolicyError, match=str(path).replace(".", r"\.")) as info:
            load_policy(path)
        assert says in str(info.value)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_the_example_policies_load(example: Path) -> None:
    policy = load_policy(example)
    assert isinstance(policy, AutoscalePolicy) and policy.to_dict()["name"] == policy.name
    assert 30 <= policy.pod_start_delay_s <= 60


def test_three_example_policies_cover_the_three_metrics() -> None:
    assert sorted(load_policy(p).metric for p in EXAMPLES) == ["concurrency", "gpu_utilization", "queue_length"]


# ---- the command, in process ------------------------------------------------------------------------------


def test_help_teaches_the_policy_fields_and_the_outputs() -> None:
    result = runner.invoke(app, ["autoscale", "simulate", "--help"], terminal_width=100)
    assert result.exit_code == 0
    for word in ("--policy", "--trace-kind", "--out", "--json", "queue_length", "gpu_utilization",
                 "pod_start_delay_s", "GPU-seconds"):
        assert word in result.output


@pytest.mark.parametrize(("args", "code", "says"), [
    (["--policy", "{ex}", "--bucket", "0s"], 2, "--bucket"),
    (["--policy", "{ex}", "--trace-kind", "csv"], 2, "--trace-kind: must be one of"),
    (["--policy", "{ex}", "--out", "{tmp}/picture.gif"], 2, "--out"),
    (["--policy", "{tmp}/none.yaml"], 1, "none.yaml: field '(file)': cannot be read"),
])
def test_bad_command_lines_exit_with_a_message(tmp_path: Path, args: list[str], code: int, says: str) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\n", encoding="utf-8")
    argv = ["autoscale", "simulate", str(trace), *(a.format(ex=EXAMPLES[0], tmp=tmp_path) for a in args)]
    result = runner.invoke(app, argv)
    assert result.exit_code == code, result.output
    assert says in result.output
    assert not (tmp_path / "picture.gif").exists()


def test_json_compares_the_policies(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    rows = "".join(f"2023-11-16 18:15:{i // 10:02d}.{i % 10}000000,800,20\n" for i in range(200))
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows, encoding="utf-8")
    argv = ["autoscale", "simulate", str(trace), "--trace-kind", "azure", "--json", "--bucket", "5s",
            *(x for p in EXAMPLES for x in ("--policy", str(p)))]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [p["policy"]["metric"] for p in data["policies"]] == [load_policy(p).metric for p in EXAMPLES]
    for p in data["policies"]:
        assert p["totals"]["arrivals"] == 200 == sum(b["arrivals"] for b in p["buckets"])
        assert p["totals"]["gpu_s"] > 0
