"""A rolling update, live: ``llmslo rollout run`` through ``llmslo gateway``, under load, measured and compared.

:func:`run_live_rollout` starts ``llmslo serve --version v1`` and ``llmslo gateway`` in front of it (its
summaries as JSONL), and one ``llmslo load`` through the gateway at the plan's constant rate. After the plan's
``v1_alone_s`` it runs the update the way an operator does, with :class:`llmslo.ops.RolloutRunner` (what
``llmslo rollout run`` runs): it starts ``llmslo serve --version v2`` (a slower engine unless the plan makes the
speeds equal), adds it to the gateway's pool, lets both versions serve for ``overlap_s`` (the runner's
``soak_s``), then drains v1 through the gateway (short settle and budget), takes it out of the pool and stops it.
A long reply asked a few seconds before v2 joins can only go to v1, and outlives the drain budget, so the drain
cuts it (``server_draining``). Arrivals never meet a drain: the gateway routes them to v2. Then v2 serves alone
for ``v2_alone_s``; the load is stopped, then v2 and the gateway.

The phases, in the order the versions see them:

1. v1 alone: v1's baseline;
2. v2 started, ready and in the pool: the overlap window, from v2's addition to v1's stop;
3. v2 alone: v2's baseline.

The update's period runs from v2's start to v1's stop: it holds v2's start-up, whose CPU burst on a small
machine would slow what runs beside it, so those seconds are neither window nor baseline.

Then what a user would run: ``llmslo ingest`` of the gateway's summaries (one per request, its ``version``
the backend's) into one store, the update record the runner made (its drain, its period and overlap)
stored with ``llmslo rollout record``, and ``llmslo rollout compare --update ID --json``, whose answer the run
keeps.

Each process is stopped by its process id whatever happens, every wait is bounded, every address is on
127.0.0.1. Times are Unix seconds, durations seconds. ``llmslo demo --rollout`` prints the run
(``llmslo.cli._live_rollout``).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmslo.ops._live_processes import (
    GATEWAY_READY,
    READY_TIMEOUT_S,
    LiveRunError,
    llmslo_command,
    load_started,
    long_stream,
    ready_match,
    ready_port,
    run_llmslo,
    started,
    terminate,
    wait_exits,
)
from llmslo.ops._process import stop_process
from llmslo.ops._rollout_run import (
    DrainParams,
    RolloutError,
    RolloutPlan,
    RolloutResult,
    RolloutRunner,
    VersionSpec,
)

__all__ = ["LiveRolloutPlan", "LiveRolloutRun", "run_live_rollout"]

V1, V2 = "v1", "v2"
"""The versions' names (the servers' ``--version``, so the summaries' ``version``)."""
LONG = "long-stream"
"""The name of the long reply's files (``long-stream.log``, ``long-stream-attempts.jsonl``)."""
EXIT_TIMEOUT_S = 60.0
"""How long a process may take to exit after its SIGTERM, seconds."""
SERVER_SLOTS = 16
"""The sequences each version's server runs at once (``--max-num-seqs``), and so its slots in the gateway's pool:
both versions start at the same concurrency limit (twice their slots)."""
@dataclass(frozen=True)
class LiveRolloutPlan:
    """The shape of a live rolling update; durations in seconds, the rate in requests per second.

    The default is sized for two shared cores: enough requests in each phase (at least 100 per version
    and side) for ``rollout compare`` to test, short replies, and engines fast enough (``--speed 5``) that
    prefill takes under a tenth of each engine's time at this rate: its latency then hardly moves with the
    random ups and downs of a Poisson rate from one phase to the next. ``v2_speed`` below ``v1_speed`` makes
    v2 slower (5 / 4: every engine step takes 25 % longer); equal speeds give the null run, whose verdict
    must be ``lossless``.
    """

    rate_per_s: float = 20.0
    """The load through the gateway: Poisson arrivals at this rate (split between the versions while both
    serve)."""
    v1_alone_s: float = 15.0
    """Phase 1: v1 alone with the load (its baseline)."""
    overlap_s: float = 18.0
    """Phase 2: both versions in the pool before v1's drain (the rollout's ``soak_s``)."""
    v2_alone_s: float = 15.0
    """Phase 3: v2 alone after v1 stopped (its baseline)."""
    v1_speed: float = 5.0
    v2_speed: float = 4.0
    long_stream_tokens: int = 6000
    """The long reply to v1 (about 40 s at ``--speed 5``), far beyond its lead, the overlap and the budget."""
    long_stream_lead_s: float = 4.0
    """The long reply's load starts this long before the update (its start-up takes a second or two), while
    v1 is the only backend."""
    drain_settle_s: float = 0.5
    drain_budget_s: float = 1.0
    drain_idle_s: float = 1.0
    update_id: str = "live-rollout-v1-v2"
    seed: int = 0
    server_args: tuple[str, ...] = ("--max-num-seqs", str(SERVER_SLOTS), "--max-queue", "64",
                                    "--queue-timeout", "8s", "--drain-settle", "0s")
    """Flags of both servers (no settle of their own at their SIGTERM: the gateway has drained them by then)."""
    load_args: tuple[str, ...] = ("--prompt-tokens", "32-256", "--output-tokens", "16-48", "--timeout", "20s")
    """Flags of the load."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LiveRolloutRun:
    """Where a live rolling update left its files, what happened when (Unix seconds), and the comparison.

    ``exit_codes`` by process (``gateway``, ``load``, ``long stream``): the gateway exits 0 after its drain; a
    load stopped by SIGTERM exits 143. ``load``: the load's ``--json`` output; ``rollout``: what the rollout run
    did (``RolloutResult.to_dict()``); ``comparison``: the JSON of ``llmslo rollout compare``.
    """

    folder: Path
    plan: LiveRolloutPlan
    store: Path
    summaries: Path
    attempts_log: Path
    long_attempts_log: Path
    update_record: Path
    started_unix_s: float = 0.0
    """When the load began its schedule (the phases count from here)."""
    long_stream_unix_s: float | None = None
    v2_started_unix_s: float | None = None
    v2_serving_unix_s: float | None = None
    v1_drain_started_unix_s: float | None = None
    v1_stopped_unix_s: float | None = None
    load_stopped_unix_s: float | None = None
    exit_codes: dict[str, int] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)
    rollout: dict[str, Any] = field(default_factory=dict)
    comparison: dict[str, Any] | None = None

    @property
    def record_id(self) -> str:
        """The stored update record's id (the rollout's id, its batch and v1's backend id)."""
        return f"{self.plan.update_id}-b1-{V1}"

    def paths(self) -> list[Path]:
        """Every file and folder the run writes (none may exist before it)."""
        return [self.store, self.summaries, self.attempts_log, self.long_attempts_log, self.update_record]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["plan"] = self.plan.to_dict()
        for key in ("folder", "store", "summaries", "attempts_log", "long_attempts_log", "update_record"):
            data[key] = str(data[key])
        return data


def _new_run(folder: Path, plan: LiveRolloutPlan) -> LiveRolloutRun:
    return LiveRolloutRun(folder=folder, plan=plan, store=folder / "rollout.duckdb",
                          summaries=folder / "summaries-gateway", attempts_log=folder / "attempts.jsonl",
                          long_attempts_log=folder / f"{LONG}-attempts.jsonl",
                          update_record=folder / "update-record.json")


def _serve_argv(plan: LiveRolloutPlan, version: str, port: str) -> list[str]:
    speed = plan.v1_speed if version == V1 else plan.v2_speed
    return llmslo_command("serve", "--port", port, "--version", version, "--speed", f"{speed:g}",
                          "--seed", str(plan.seed), *plan.server_args)


def _rollout_plan(run: LiveRolloutRun, admin_port: int) -> RolloutPlan:
    """The rollout the demo runs: v1 to v2, one batch, both serving ``overlap_s``, a short drain."""
    plan = run.plan
    return RolloutPlan(
        admin_url=f"http://127.0.0.1:{admin_port}",
        from_version=VersionSpec(V1, tuple(_serve_argv(plan, V1, "{port}")), slots=SERVER_SLOTS),
        to_version=VersionSpec(V2, tuple(_serve_argv(plan, V2, "{port}")), slots=SERVER_SLOTS),
        drain=DrainParams(caller_timeout_s=30.0, wait_budget_s=plan.drain_budget_s,
                          idle_threshold_s=plan.drain_idle_s, poll_interval_s=0.05,
                          unregister_settle_s=plan.drain_settle_s, soak_s=plan.overlap_s,
                          max_overlap_window_s=plan.overlap_s + 60.0, terminate_on_budget=True),
        batch_size=1, start_timeout_s=READY_TIMEOUT_S, logs=str(run.folder / "rollout-logs"))


def _load_argv(run: LiveRolloutRun, url: str) -> list[str]:
    """A load at the plan's rate, stopped by SIGTERM; its own end (``--duration``) lies beyond the longest
    run the waits allow, so it never ends first."""
    plan = run.plan
    limit_s = plan.v1_alone_s + plan.overlap_s + plan.v2_alone_s + 3 * READY_TIMEOUT_S + EXIT_TIMEOUT_S
    return llmslo_command("load", url, "--model", "llmslo-sim", "--rate", f"{plan.rate_per_s:g}",
                          "--duration", f"{limit_s:g}s", "--seed", str(plan.seed), "--attempts-log",
                          str(run.attempts_log), "--json", "--no-progress", *plan.load_args)


def _sleep_until(t_unix_s: float, watched: Mapping[str, subprocess.Popen[str]], folder: Path) -> None:
    """Sleep until ``t_unix_s``; a watched process that exits meanwhile raises :class:`LiveRunError`."""
    while (left := t_unix_s - time.time()) > 0:
        for name, process in watched.items():
            if process.poll() is not None:
                log = folder / f"{name.replace(' ', '-')}.log"
                raise LiveRunError(f"llmslo {name} exited early with status {process.returncode}; see {log}")
        time.sleep(min(left, 0.1))


def run_live_rollout(folder: Path, plan: LiveRolloutPlan = LiveRolloutPlan(), *,
                     say: Callable[[str], None] = lambda _: None) -> LiveRolloutRun:
    """Run the live rolling update into ``folder`` (created; it must hold no earlier run) and compare it.

    Raises :class:`~llmslo.ops.LiveRunError` naming the file of an earlier run in ``folder``
    (nothing is started then), a process that did not start, ended early or did not exit in time, a rollout
    step that failed, or a command (ingest, record, compare) that failed.
    """
    folder.mkdir(parents=True, exist_ok=True)
    run = _new_run(folder, plan)
    stale = [p for p in run.paths() if p.exists()]
    if stale:
        raise LiveRunError(f"{folder} already holds a run ({stale[0].name}): choose an empty folder")
    rollout, result = _drive(run, say)
    with contextlib.suppress(OSError, ValueError):
        run.load = json.loads((folder / "load.json").read_text())
    _measure(run, result.records(rollout), say)
    return run


def _drive(run: LiveRolloutRun, say: Callable[[str], None]) -> tuple[RolloutPlan, RolloutResult]:
    """The three phases: every process started, the rollout run, everything stopped and waited for."""
    plan, folder = run.plan, run.folder
    with contextlib.ExitStack() as stack:
        say(f"starting llmslo serve --version {V1} (speed {plan.v1_speed:g}) and llmslo gateway on 127.0.0.1")
        v1 = stack.enter_context(started(_serve_argv(plan, V1, "0"), folder / "serve-v1.log",
                                         stdout=subprocess.PIPE))
        url1 = f"http://127.0.0.1:{ready_port(v1)}"
        gateway = stack.enter_context(started(llmslo_command(
            "gateway", "--port", "0", "--admin-port", "0", "--backend", f"{V1}={url1}@{V1},slots={SERVER_SLOTS}",
            "--jsonl", str(run.summaries), "--drain-settle", f"{plan.drain_settle_s:g}s"), folder / "gateway.log",
            stdout=subprocess.PIPE))
        ports = ready_match(gateway, GATEWAY_READY, "llmslo gateway")
        front, admin = f"http://127.0.0.1:{ports.group(1)}", int(ports.group(2))
        out = stack.enter_context((folder / "load.json").open("w"))
        load = stack.enter_context(started(_load_argv(run, front), folder / "load.log", stdout=out.fileno()))
        run.started_unix_s = load_started(run.attempts_log, load)  # phase 1 starts with the traffic
        say(f"load through the gateway: {plan.rate_per_s:g} req/s; {V1} alone for {plan.v1_alone_s:g} s")
        watched = {"gateway": gateway, "load": load}
        update_at = run.started_unix_s + plan.v1_alone_s
        _sleep_until(update_at - plan.long_stream_lead_s, watched, folder)
        long = stack.enter_context(long_stream(front, plan.long_stream_tokens, folder, LONG, seed=plan.seed + 2))
        run.long_stream_unix_s = time.time()
        say(f"one long reply ({plan.long_stream_tokens} tokens) asked while {V1} serves alone: its drain will cut it")
        _sleep_until(update_at, watched, folder)
        say(f"llmslo rollout run: {V1} -> {V2} (speed {plan.v2_speed:g}), both serving {plan.overlap_s:g} s, then "
            f"{V1} drained (settle {plan.drain_settle_s:g} s, budget {plan.drain_budget_s:g} s)")
        rollout = _rollout_plan(run, admin)
        runner = RolloutRunner(rollout, say)
        stack.callback(_stop_new, runner)
        try:
            result = runner.run(update_id=plan.update_id)
        except RolloutError as exc:
            raise LiveRunError(f"the rollout failed: {exc}") from None
        (batch,) = result.batches
        (drained,) = batch.drained
        run.v2_started_unix_s, run.v2_serving_unix_s = batch.started_unix_s, batch.overlap_from_unix_s
        run.v1_drain_started_unix_s = float(drained.drain["started_unix_s"])
        run.v1_stopped_unix_s = batch.overlap_to_unix_s
        run.rollout = result.to_dict()
        if result.outcome != "done" or run.v1_stopped_unix_s is None:
            raise LiveRunError(f"the rollout stopped: {result.outcome}")
        say(f"{V1} drained and stopped; {V2} alone for {plan.v2_alone_s:g} s")
        _sleep_until(run.v1_stopped_unix_s + plan.v2_alone_s, watched, folder)
        run.load_stopped_unix_s = terminate(load)
        _wait(run, {"load": load, "long stream": long})
        terminate(gateway)  # it drains itself and writes its last summaries
        _wait(run, {"gateway": gateway})
        v1.wait(EXIT_TIMEOUT_S)
    return rollout, result


def _stop_new(runner: RolloutRunner) -> None:
    """Stop the backends the rollout started (they outlive it by design), by their process ids."""
    for process in runner.started:
        stop_process(process, EXIT_TIMEOUT_S)


def _wait(run: LiveRolloutRun, processes: Mapping[str, subprocess.Popen[str]]) -> dict[str, float]:
    """Wait for ``processes`` to exit (bounded); their exit statuses go to ``run.exit_codes``; when each was
    seen gone (Unix seconds), by name."""
    done = wait_exits({f"llmslo {name}": p for name, p in processes.items()}, EXIT_TIMEOUT_S)
    run.exit_codes.update({name: done[f"llmslo {name}"][0] for name in processes})
    return {name: done[f"llmslo {name}"][1] for name in processes}


def _measure(run: LiveRolloutRun, records: list[dict[str, Any]], say: Callable[[str], None]) -> None:
    """Ingest the gateway's summaries into one store, record the update, compare the versions."""
    files = sorted(str(p) for p in run.summaries.glob("*.jsonl"))
    if not files:
        raise LiveRunError(f"{run.summaries}: llmslo gateway wrote no summaries")
    say(f"llmslo ingest: {len(files)} JSONL file(s) into {run.store.name}")
    run_llmslo("ingest", *files, "--db", str(run.store), "--json", "--no-progress")
    notes = (f"live rolling update by llmslo: {V1} (speed {run.plan.v1_speed:g}) to {V2} (speed "
             f"{run.plan.v2_speed:g}) behind llmslo gateway, {run.plan.rate_per_s:g} req/s")
    run.update_record.write_text(json.dumps([{**r, "notes": notes} for r in records], indent=2) + "\n")
    run_llmslo("rollout", "record", str(run.update_record), "--db", str(run.store), "--json")
    say(f"llmslo rollout compare --update {run.record_id}")
    run.comparison = json.loads(run_llmslo("rollout", "compare", "--db", str(run.store), "--update",
                                           run.record_id, "--json"))
