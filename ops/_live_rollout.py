"""A rolling update, live: two ``llmslo serve`` versions, a load on each, v1 drained, the update measured.

:func:`run_live_rollout` starts ``llmslo serve --version v1`` on a free port on 127.0.0.1 and ``llmslo load``
against it; after the plan's ``v1_alone_s`` it starts ``llmslo serve --version v2`` (a slower engine unless
the plan makes the speeds equal) and a second load against it, at the same constant rate: ``llmslo load``
takes one URL, so each server gets its own load, the even split a load balancer in front of both would
make. Once v2's load sends, both versions serve; ``overlap_s`` later v1 gets SIGTERM, and its drain
(short settle and budget) cuts a long reply asked of it a few seconds before; v1's load goes on
``load_after_sigterm_s`` more, so some arrivals meet the drain (503 ``draining``), then it is stopped.
Once v1 and the loads on it have exited, v2 serves alone for ``v2_alone_s``; then its load is stopped and
v2 gets its SIGTERM.

The phases, in the order the versions see them:

1. v1 alone with its load: v1's baseline;
2. v2 started, ready and serving its load: the overlap window, from v2's load's start to v1's exit;
3. SIGTERM to v1 (its drain), then v2 alone: v2's baseline.

The update's period runs from v2's start to the exit of the last v1 process (v1, its load, the long reply's
load): it holds the start-up of v2 and of its load, whose CPU bursts on a small machine would slow what
runs beside them, so those seconds are neither window nor baseline; the window starts once v2 is ready
*and* in the pool (its load sending), as a load balancer adds an instance.

Then the commands a user would run: ``llmslo ingest`` of both servers' JSONL summaries into one store, the
update record (v1's drain record plus what this module knows: the update's period and the overlap window)
written to a file and stored with ``llmslo rollout record``, and ``llmslo rollout compare --update ID
--json``, whose answer the run keeps. The update's period is left out of every baseline, so v1's phase-1
requests and v2's phase-3 requests are the baselines.

Each process is started by this module and stopped by its process id whatever happens, every wait is
bounded, every address is on 127.0.0.1. Times are Unix seconds, durations seconds. ``llmslo demo --rollout``
prints the run (``llmslo.cli._live_rollout``).
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
    READY_TIMEOUT_S,
    LiveRunError,
    llmslo_command,
    load_started,
    long_stream,
    ready_port,
    run_llmslo,
    started,
    terminate,
    wait_exits,
)

__all__ = ["LiveRolloutPlan", "LiveRolloutRun", "run_live_rollout"]

V1, V2 = "v1", "v2"
"""The versions' names (the servers' ``--version``, so the summaries' ``version``)."""
LONG = "long-stream"
"""The name of the long reply's files (``long-stream.log``, ``long-stream-attempts.jsonl``)."""
EXIT_TIMEOUT_S = 60.0
"""How long a process may take to exit after its SIGTERM, seconds."""


@dataclass(frozen=True)
class LiveRolloutPlan:
    """The shape of a live rolling update; durations in seconds, rates in requests per second per server.

    The default is sized for two shared cores: enough requests in each phase (at least 100 per version
    and side) for ``rollout compare`` to test, short replies, and engines fast enough (``--speed 5``) that
    prefill takes under a tenth of each engine's time at this rate: its latency then hardly moves with the
    random ups and downs of a Poisson rate from one phase to the next (at ``--speed 2`` a phase with 20 %
    more arrivals was 20 % slower, a false regression). ``v2_speed`` below ``v1_speed`` makes v2 slower
    (5 / 4: every engine step takes 25 % longer); equal speeds give the null run, whose verdict must be
    ``lossless``.
    """

    rate_per_s: float = 10.0
    """Each server's load: Poisson arrivals at this rate."""
    v1_alone_s: float = 15.0
    """Phase 1: v1 alone with its load (its baseline)."""
    overlap_s: float = 18.0
    """Phase 2: from v2's load's start to the SIGTERM to v1."""
    load_after_sigterm_s: float = 2.0
    """v1's load goes on this long after the SIGTERM: arrivals that meet the drain."""
    v2_alone_s: float = 15.0
    """Phase 3: v2 alone after v1 and its loads exited (its baseline)."""
    v1_speed: float = 5.0
    v2_speed: float = 4.0
    long_stream_tokens: int = 3000
    """The long reply to v1 (about 20 s at ``--speed 5``), far beyond its lead, settle and drain budget."""
    long_stream_lead_s: float = 6.0
    """The long reply's load starts this long before the SIGTERM to v1 (its start-up takes a second or two)."""
    update_id: str = "live-rollout-v1-v2"
    seed: int = 0
    server_args: tuple[str, ...] = (
        "--max-num-seqs", "16", "--max-queue", "64", "--queue-timeout", "8s", "--drain-settle", "500ms",
        "--drain-idle", "1s",
    )
    """Flags of both servers."""
    drain_args: tuple[str, ...] = ("--drain-budget", "1s", "--exit-linger", "1500ms")
    """Flags of v1 only: a short drain budget, and answering (503 ``draining``) until its load has stopped."""
    load_args: tuple[str, ...] = ("--prompt-tokens", "32-256", "--output-tokens", "16-48", "--timeout", "20s")
    """Flags of both loads."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LiveRolloutRun:
    """Where a live rolling update left its files, what happened when (Unix seconds), and the comparison.

    ``exit_codes`` by process (``serve v1``, ``load v1``, ``long stream``, ``serve v2``, ``load v2``): the
    servers exit 0 after their drain; a load stopped by SIGTERM exits 143. ``loads``: each load's
    ``--json`` output by version; ``comparison``: the JSON of ``llmslo rollout compare``.
    """

    folder: Path
    plan: LiveRolloutPlan
    store: Path
    summaries: dict[str, Path]
    attempts_logs: dict[str, Path]
    long_attempts_log: Path
    drain_record: Path
    update_record: Path
    started_unix_s: float = 0.0
    """When v1's load began its schedule (the phases count from here)."""
    v2_started_unix_s: float | None = None
    v2_ready_unix_s: float | None = None
    v2_serving_unix_s: float | None = None
    long_stream_unix_s: float | None = None
    v1_sigterm_unix_s: float | None = None
    v1_load_stopped_unix_s: float | None = None
    v1_exited_unix_s: float | None = None
    update_ended_unix_s: float | None = None
    v2_load_stopped_unix_s: float | None = None
    v2_sigterm_unix_s: float | None = None
    v2_exited_unix_s: float | None = None
    exit_codes: dict[str, int] = field(default_factory=dict)
    loads: dict[str, dict[str, Any]] = field(default_factory=dict)
    comparison: dict[str, Any] | None = None

    def paths(self) -> list[Path]:
        """Every file and folder the run writes (none may exist before it)."""
        return [self.store, *self.summaries.values(), *self.attempts_logs.values(), self.long_attempts_log,
                self.drain_record, self.update_record]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["plan"] = self.plan.to_dict()
        for key in ("folder", "store", "long_attempts_log", "drain_record", "update_record"):
            data[key] = str(data[key])
        for key in ("summaries", "attempts_logs"):
            data[key] = {v: str(p) for v, p in data[key].items()}
        return data


def _new_run(folder: Path, plan: LiveRolloutPlan) -> LiveRolloutRun:
    return LiveRolloutRun(
        folder=folder, plan=plan, store=folder / "rollout.duckdb",
        summaries={v: folder / f"summaries-{v}" for v in (V1, V2)},
        attempts_logs={v: folder / f"attempts-{v}.jsonl" for v in (V1, V2)},
        long_attempts_log=folder / f"{LONG}-attempts.jsonl", drain_record=folder / "drain-record-v1.json",
        update_record=folder / "update-record.json")


def _serve_argv(run: LiveRolloutRun, version: str) -> list[str]:
    plan = run.plan
    speed = plan.v1_speed if version == V1 else plan.v2_speed
    drain = ("--update-id", plan.update_id, "--next-version", V2, "--drain-record", str(run.drain_record),
             *plan.drain_args) if version == V1 else ()
    return llmslo_command("serve", "--port", "0", "--version", version, "--speed", f"{speed:g}",
                          "--seed", str(plan.seed), "--jsonl", str(run.summaries[version]), *plan.server_args, *drain)


def _load_argv(run: LiveRolloutRun, version: str, url: str) -> list[str]:
    """A load at the plan's rate, stopped by SIGTERM; its own end (``--duration``) lies beyond the longest
    run the waits allow, so it never ends first."""
    plan = run.plan
    seed = plan.seed if version == V1 else plan.seed + 1  # two independent arrival streams
    limit_s = plan.v1_alone_s + plan.overlap_s + plan.load_after_sigterm_s + plan.v2_alone_s + READY_TIMEOUT_S \
        + EXIT_TIMEOUT_S
    return llmslo_command("load", url, "--model", "llmslo-sim", "--rate", f"{plan.rate_per_s:g}",
                          "--duration", f"{limit_s:g}s", "--seed", str(seed), "--attempts-log",
                          str(run.attempts_logs[version]), "--json", "--no-progress", *plan.load_args)


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
    (nothing is started then), a process that did not start, ended early or did not exit in time, or a
    command (ingest, record, compare) that failed.
    """
    folder.mkdir(parents=True, exist_ok=True)
    run = _new_run(folder, plan)
    stale = [p for p in run.paths() if p.exists()]
    if stale:
        raise LiveRunError(f"{folder} already holds a run ({stale[0].name}): choose an empty folder")
    _drive(run, say)
    for version in (V1, V2):
        with contextlib.suppress(OSError, ValueError):
            run.loads[version] = json.loads((folder / f"load-{version}.json").read_text())
    _measure(run, say)
    return run


def _drive(run: LiveRolloutRun, say: Callable[[str], None]) -> None:
    """The three phases: every process started, signalled on time and waited for."""
    plan, folder = run.plan, run.folder
    with contextlib.ExitStack() as stack:
        def serve(version: str) -> tuple[subprocess.Popen[str], str]:
            process = stack.enter_context(started(_serve_argv(run, version), folder / f"serve-{version}.log",
                                                  stdout=subprocess.PIPE))
            return process, f"http://127.0.0.1:{ready_port(process)}"

        def load(version: str, url: str) -> subprocess.Popen[str]:
            out = stack.enter_context((folder / f"load-{version}.json").open("w"))
            return stack.enter_context(started(_load_argv(run, version, url), folder / f"load-{version}.log",
                                               stdout=out.fileno()))

        say(f"starting llmslo serve --version {V1} (speed {plan.v1_speed:g}) on 127.0.0.1")
        v1, url1 = serve(V1)
        load1 = load(V1, url1)
        run.started_unix_s = load_started(run.attempts_logs[V1], load1)  # phase 1 starts with v1's traffic
        say(f"load on {V1}: {plan.rate_per_s:g} req/s; {V1} alone for {plan.v1_alone_s:g} s")
        _sleep_until(run.started_unix_s + plan.v1_alone_s, {"serve v1": v1, "load v1": load1}, folder)
        run.v2_started_unix_s = time.time()
        say(f"starting llmslo serve --version {V2} (speed {plan.v2_speed:g})")
        v2, url2 = serve(V2)
        run.v2_ready_unix_s = time.time()
        load2 = load(V2, url2)
        run.v2_serving_unix_s = load_started(run.attempts_logs[V2], load2)
        say(f"overlap: both versions serve, {V2}'s load began at {run.v2_serving_unix_s - run.started_unix_s:.1f} s")
        watched = {"serve v1": v1, "load v1": load1, "serve v2": v2, "load v2": load2}
        sigterm_at = run.v2_serving_unix_s + plan.overlap_s
        _sleep_until(sigterm_at - plan.long_stream_lead_s, watched, folder)
        long = stack.enter_context(long_stream(url1, plan.long_stream_tokens, folder, LONG, seed=plan.seed + 2))
        run.long_stream_unix_s = time.time()
        say(f"one long reply ({plan.long_stream_tokens} tokens) asked of {V1}: its drain will cut it")
        _sleep_until(sigterm_at, watched, folder)
        run.v1_sigterm_unix_s = terminate(v1)
        say(f"SIGTERM to {V1}: readiness false, settle, drain; its load goes on {plan.load_after_sigterm_s:g} s")
        del watched["serve v1"]
        _sleep_until(run.v1_sigterm_unix_s + plan.load_after_sigterm_s, watched, folder)
        run.v1_load_stopped_unix_s = terminate(load1)
        ended = _wait(run, {"serve v1": v1, "load v1": load1, "long stream": long})
        run.v1_exited_unix_s, run.update_ended_unix_s = ended["serve v1"], max(ended.values())
        say(f"{V1} and its loads exited; {V2} alone for {plan.v2_alone_s:g} s")
        _sleep_until(run.update_ended_unix_s + plan.v2_alone_s, {"serve v2": v2, "load v2": load2}, folder)
        run.v2_load_stopped_unix_s = terminate(load2)
        _wait(run, {"load v2": load2})
        run.v2_sigterm_unix_s = terminate(v2)
        run.v2_exited_unix_s = _wait(run, {"serve v2": v2})["serve v2"]


def _wait(run: LiveRolloutRun, processes: Mapping[str, subprocess.Popen[str]]) -> dict[str, float]:
    """Wait for ``processes`` to exit (bounded); their exit statuses go to ``run.exit_codes``; when each was
    seen gone (Unix seconds), by name."""
    done = wait_exits({f"llmslo {name}": p for name, p in processes.items()}, EXIT_TIMEOUT_S)
    run.exit_codes.update({name: done[f"llmslo {name}"][0] for name in processes})
    return {name: done[f"llmslo {name}"][1] for name in processes}


def update_record(run: LiveRolloutRun) -> dict[str, Any]:
    """The update record of the run: v1's drain record (its ``update_id`` and drain section, as the server
    wrote them) with the update's period (v2 started .. v1 and the loads on it exited) and the overlap
    window (v2 serving .. v1 exited), in the shape ``llmslo rollout record`` takes (``docs/rollouts.md``)."""
    try:
        written = json.loads(run.drain_record.read_text())
    except (OSError, ValueError) as exc:
        raise LiveRunError(f"{run.drain_record}: v1 wrote no readable drain record ({exc})") from None
    if written.get("update_id") != run.plan.update_id or not isinstance(written.get("drain"), dict):
        raise LiveRunError(f"{run.drain_record}: expected update_id {run.plan.update_id!r} and a drain section, "
                           f"got the keys {sorted(written)}")
    assert run.v2_started_unix_s is not None and run.v2_serving_unix_s is not None
    assert run.v1_exited_unix_s is not None and run.update_ended_unix_s is not None
    return {
        "update_id": run.plan.update_id,
        "drain": written["drain"],
        "overlap": {"from_unix_s": run.v2_serving_unix_s, "to_unix_s": run.v1_exited_unix_s},
        "started_unix_s": run.v2_started_unix_s,
        "ended_unix_s": run.update_ended_unix_s,
        "notes": f"live rolling update by llmslo: {V1} (speed {run.plan.v1_speed:g}) to {V2} (speed "
                 f"{run.plan.v2_speed:g}), one server each, {run.plan.rate_per_s:g} req/s on each",
    }


def _measure(run: LiveRolloutRun, say: Callable[[str], None]) -> None:
    """Ingest both servers' summaries into one store, record the update, compare the versions."""
    files: list[str] = []
    for version, path in run.summaries.items():
        found = sorted(str(p) for p in path.glob("*.jsonl"))
        if not found:
            raise LiveRunError(f"{path}: llmslo serve --version {version} wrote no summaries")
        files += found
    say(f"llmslo ingest: {len(files)} JSONL file(s) into {run.store.name}")
    run_llmslo("ingest", *files, "--db", str(run.store), "--json", "--no-progress")
    run.update_record.write_text(json.dumps(update_record(run), indent=2) + "\n")
    run_llmslo("rollout", "record", str(run.update_record), "--db", str(run.store), "--json")
    say(f"llmslo rollout compare --update {run.plan.update_id}")
    run.comparison = json.loads(run_llmslo("rollout", "compare", "--db", str(run.store), "--update",
                                        run.plan.update_id, "--json"))
