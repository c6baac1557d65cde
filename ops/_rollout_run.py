"""A rolling update of a pool behind ``llmslo gateway``, run batch by batch through the gateway's admin API.

The plan (:func:`load_plan`, YAML or JSON; :class:`RolloutPlan`) names the gateway's admin address, the version
updated from and to (each a start command with ``{port}``, ``{model}`` and ``{version}`` placeholders, a model
file and optionally its SHA-256), the batch size and the drain parameters under the names the runbooks use:
``caller_timeout_s``, ``wait_budget_s``, ``idle_threshold_s``, ``poll_interval_s``, ``unregister_settle_s``,
``max_overlap_window_s``, ``terminate_on_budget`` (and ``soak_s``, a canary period: how long both versions
serve before the old ones' drain; 0 by default). It is refused, before anything changes, when
``wait_budget_s > caller_timeout_s`` (the callers give up before the drain does), when
``soak_s + unregister_settle_s + wait_budget_s > max_overlap_window_s`` (the overlap could not stay in its
bound), or when either version's artefacts are not present and loadable: the command's program, the model file and its
checksum. The old version's are checked too, so that a rollback stays possible.

Each batch (:meth:`RolloutRunner.run`):

1. start as many backends of the new version as the batch has old ones, each on a free port of 127.0.0.1, in a
   session of its own (they outlive this process: they are the pool now); wait until each ``/health`` answers
   200;
2. add them to the gateway (``POST /admin/backends``); the overlap window opens;
3. to 5. drain the old backends (``POST /admin/backends/ID/drain?wait=1``): the gateway takes each out of the pool,
   waits the settle time, then waits for its requests in flight up to the budget, and at the budget terminates
   the rest or returns the backend to the pool (``terminate_on_budget``);
6. take each drained backend out of the gateway (``DELETE /admin/backends/ID``) and stop its process (the one
   listening on its port: SIGTERM, SIGKILL after ``stop_timeout_s``); the overlap window closes.

Three numbers per drained backend: the actual drain time, the requests terminated, and the removal propagation
delay, from its removal from the pool to the last new request it received (0 when none came after the removal;
both times are the gateway's). When a budget runs out with ``terminate_on_budget: false`` the backend is back in
the pool and the update stops there; the result says so. A rollback is the same run with the versions swapped
(``rollback=True``).

When a call to the admin API fails during a backend's drain (steps 3 to 6: the drain, the read of its times, its
removal), the runner puts that backend back in the pool (``POST /admin/backends/ID/ready``; not when the gateway
refused the drain itself with a 4xx: nothing was taken out), leaves its process running, and stops the update
with outcome ``failed``: the new backends stay in the pool (both versions serve) and the failure goes into the
backend's update record (``notes``, ``extra.failure``, ``extra.put_back``). When the backend cannot be put back,
the failure names it and the command that does (``llmslo gateway ready ID --admin URL``).

Standard library only; every wait is bounded; every address is on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from llmslo.ops._process import free_port, pid_alive, pid_listening_on, stop_process
from llmslo.telemetry import LlmsloError

__all__ = ["DrainParams", "RolloutError", "RolloutPlan", "RolloutResult", "RolloutRunner", "VersionSpec",
           "load_plan", "plan_from_dict", "stop_pid"]

ADMIN_TIMEOUT_S = 10.0
"""The longest wait for one admin call (seconds), besides a drain's own time."""
HEALTH_POLL_S = 0.2


class RolloutError(LlmsloError):
    """A plan that cannot run, or a step that failed (the message says which, and what the pool is left as)."""


class _AdminCallFailed(RolloutError):
    """A call to the gateway's admin API that failed: ``status`` is the HTTP status it answered (None when it
    could not be reached or did not answer in time)."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class VersionSpec:
    """One version's start command (placeholders ``{port}``, ``{model}``, ``{version}``) and model file."""

    version: str
    command: tuple[str, ...]
    model: str | None = None
    model_sha256: str | None = None
    slots: int = 1
    models: tuple[str, ...] = ()
    """The model names it serves (as the gateway's backends list them; empty: any)."""

    def argv(self, port: int) -> list[str]:
        return [part.format(port=port, model=self.model or "", version=self.version) for part in self.command]


@dataclass(frozen=True)
class DrainParams:
    """The drain of each old backend (seconds; see the module docstring)."""

    caller_timeout_s: float
    wait_budget_s: float
    idle_threshold_s: float = 5.0
    poll_interval_s: float = 0.1
    unregister_settle_s: float = 1.0
    max_overlap_window_s: float = 600.0
    terminate_on_budget: bool = True
    soak_s: float = 0.0
    """How long both versions serve side by side before the old backends' drain (a canary period, so that
    ``rollout compare`` has both versions in one window); 0: drain at once."""


@dataclass(frozen=True)
class RolloutPlan:
    """What :class:`RolloutRunner` runs (see the module docstring)."""

    admin_url: str
    from_version: VersionSpec
    to_version: VersionSpec
    drain: DrainParams
    batch_size: int = 1
    start_timeout_s: float = 120.0
    stop_timeout_s: float = 10.0
    logs: str = "rollout-logs"

    def swapped(self) -> RolloutPlan:
        """The same plan in the other direction: the rollback."""
        return replace(self, from_version=self.to_version, to_version=self.from_version)

    def problems(self) -> list[str]:
        """Why the plan cannot run (empty: it can); the artefacts are checked by :func:`check_artifacts`."""
        from llmslo.analysis.rollout import budget_verdict, overlap_verdict, part  # standard library only

        d = self.drain
        budget = budget_verdict(d.wait_budget_s, d.caller_timeout_s, prefix="drain.")
        overlap = overlap_verdict(
            [part("drain.soak_s", d.soak_s), part("drain.unregister_settle_s", d.unregister_settle_s),
             part("drain.wait_budget_s", d.wait_budget_s)], d.max_overlap_window_s,
            limit_name="drain.max_overlap_window_s",
            fix="raise drain.max_overlap_window_s, or lower drain.soak_s or drain.wait_budget_s")
        out = [f"{v.message}; {v.fix}" for v in (budget, overlap) if not v.holds]
        if self.from_version.version == self.to_version.version:
            out.append(f"from.version and to.version are both {self.from_version.version!r}: nothing to update")
        for name, spec in (("from", self.from_version), ("to", self.to_version)):
            if not any("{port}" in part for part in spec.command):
                out.append(f"{name}.command has no {{port}}: the backend must listen on the port it is given")
        return out


# ---- the plan file -------------------------------------------------------------------------------------------

_PLAN_KEYS = {"gateway", "from", "to", "batch_size", "drain", "start_timeout_s", "stop_timeout_s", "logs"}
_VERSION_KEYS = {"version", "command", "model", "model_sha256", "slots", "models"}
_DRAIN_KEYS = {f.name for f in DrainParams.__dataclass_fields__.values()}


def load_plan(path: str | Path) -> RolloutPlan:
    """Read a plan file (YAML or JSON). Raises :class:`RolloutError` naming the field and the fix."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise RolloutError(f"{path}: cannot read the plan ({exc.strerror or exc})") from None
    try:
        import yaml

        data = yaml.safe_load(text)
    except Exception as exc:  # yaml.YAMLError; PyYAML reads JSON too
        raise RolloutError(f"{path}: not YAML or JSON ({exc})") from None
    return plan_from_dict(data, str(path))


def plan_from_dict(data: object, where: str = "plan") -> RolloutPlan:
    """A :class:`RolloutPlan` from parsed YAML/JSON (see :func:`load_plan`)."""
    obj = _mapping(data, where, _PLAN_KEYS, required=("gateway", "from", "to", "drain"))
    drain = _mapping(obj["drain"], f"{where}: drain", _DRAIN_KEYS, required=("caller_timeout_s", "wait_budget_s"))
    params: dict[str, Any] = {}
    for key, value in drain.items():
        if key == "terminate_on_budget":
            if not isinstance(value, bool):
                raise RolloutError(f"{where}: drain.terminate_on_budget must be true or false, got {value!r}")
            params[key] = value
        else:
            params[key] = _seconds(value, f"{where}: drain.{key}")
    return RolloutPlan(
        admin_url=_text(obj["gateway"], f"{where}: gateway").rstrip("/"),
        from_version=_version(obj["from"], f"{where}: from"), to_version=_version(obj["to"], f"{where}: to"),
        drain=DrainParams(**params), batch_size=_count(obj.get("batch_size", 1), f"{where}: batch_size"),
        start_timeout_s=_seconds(obj.get("start_timeout_s", 120.0), f"{where}: start_timeout_s"),
        stop_timeout_s=_seconds(obj.get("stop_timeout_s", 10.0), f"{where}: stop_timeout_s"),
        logs=_text(obj.get("logs", "rollout-logs"), f"{where}: logs"))


def _mapping(value: object, where: str, known: set[str], required: Sequence[str] = ()) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise RolloutError(f"{where}: expected a mapping, got {type(value).__name__}")
    unknown = sorted(set(map(str, value)) - known)
    if unknown:
        raise RolloutError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    missing = [k for k in required if k not in value]
    if missing:
        raise RolloutError(f"{where}: {', '.join(missing)} missing")
    return value


def _version(value: object, where: str) -> VersionSpec:
    obj = _mapping(value, where, _VERSION_KEYS, required=("version", "command"))
    command = obj["command"]
    if isinstance(command, str) or not isinstance(command, Sequence) or not command \
            or not all(isinstance(c, str) for c in command):
        raise RolloutError(f"{where}.command: expected a list of strings (program and arguments), got {command!r}")
    models = obj.get("models") or ()
    if isinstance(models, str) or not all(isinstance(m, str) for m in models):
        raise RolloutError(f"{where}.models: expected a list of model names, got {models!r}")
    sha = obj.get("model_sha256")
    if sha is not None and (not isinstance(sha, str) or len(sha.removeprefix("sha256:")) != 64):
        raise RolloutError(f"{where}.model_sha256: expected 64 hex digits, got {sha!r}")
    return VersionSpec(version=_text(obj["version"], f"{where}.version"), command=tuple(command),
                       model=None if obj.get("model") is None else _text(obj["model"], f"{where}.model"),
                       model_sha256=None if sha is None else sha.removeprefix("sha256:").lower(),
                       slots=_count(obj.get("slots", 1), f"{where}.slots"), models=tuple(models))


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RolloutError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _seconds(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e7:
        raise RolloutError(f"{where}: expected seconds (a number >= 0), got {value!r}")
    return float(value)


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RolloutError(f"{where}: expected an integer >= 1, got {value!r}")
    return value


# ---- artefacts -----------------------------------------------------------------------------------------------

def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_artifacts(spec: VersionSpec, role: str) -> dict[str, str]:
    """The SHA-256 of the version's program, model file and start command; :class:`RolloutError` when the
    program or the model is missing or unreadable, or the model's checksum is not the one given."""
    program = spec.command[0]
    found = shutil.which(program)
    if found is None:
        raise RolloutError(f"{role} version {spec.version}: its program {program!r} is not found or not "
                           "executable; a rollback needs it: fix the command before updating")
    artifacts = {"program": sha256_file(Path(found)),
                 "config": hashlib.sha256(json.dumps([spec.version, *spec.command]).encode()).hexdigest()}
    if spec.model is not None:
        model = Path(spec.model)
        try:
            artifacts["weights"] = sha256_file(model)
        except OSError as exc:
            raise RolloutError(f"{role} version {spec.version}: its model {spec.model} cannot be read "
                               f"({exc.strerror or exc})") from None
        if spec.model_sha256 is not None and artifacts["weights"] != spec.model_sha256:
            raise RolloutError(f"{role} version {spec.version}: its model {spec.model} has SHA-256 "
                               f"{artifacts['weights']}, not the {spec.model_sha256} the plan gives")
    return artifacts


# ---- the result ----------------------------------------------------------------------------------------------

@dataclass
class BackendDrained:
    """One old backend's drain: the gateway's drain record and the three numbers."""

    backend: str
    drain: dict[str, Any]
    actual_drain_s: float
    terminated: int
    propagation_s: float
    """From its removal from the pool to the last new request it received (seconds; 0: none after)."""
    stopped_pid: int | None
    note: str | None = None
    failure: str | None = None
    """Why its drain did not complete: a call to the gateway's admin API failed (None: it completed)."""
    put_back: bool | None = None
    """After a failure: whether it was put back in the pool (None: no failure, or nothing was taken out)."""


@dataclass
class BatchResult:
    """One batch: its old and new backends, their drains, the overlap window (Unix seconds) and the outcome;
    ``started_unix_s``: when its new backends were started (the update's period begins)."""

    index: int
    of: int
    old: list[str]
    new: list[str]
    new_pids: list[int]
    drained: list[BackendDrained]
    overlap_from_unix_s: float
    overlap_to_unix_s: float | None
    outcome: str
    """``done``; ``stopped``: a budget ran out and its backend was returned to the pool; ``failed``: a call to the
    gateway's admin API failed during a drain (see each :class:`BackendDrained`'s ``failure``)."""
    started_unix_s: float = 0.0

    @property
    def overlap_s(self) -> float | None:
        return None if self.overlap_to_unix_s is None else self.overlap_to_unix_s - self.overlap_from_unix_s


@dataclass
class RolloutResult:
    update_id: str
    from_version: str
    to_version: str
    rollback: bool
    artifacts: dict[str, dict[str, str]]
    batches: list[BatchResult] = field(default_factory=list)
    started_unix_s: float = 0.0
    ended_unix_s: float | None = None
    outcome: str = "running"
    """``done``; ``stopped`` (a budget ran out: the update stopped with both versions in the pool); ``failed``
    (the gateway's admin API failed during a drain: the update stopped, ``failure`` says what the pool is left
    as)."""
    failure: str | None = None
    """With ``failed``: what failed, what was put back in the pool, and what could not be (with the command that
    puts it back)."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for b, batch in zip(out["batches"], self.batches, strict=True):
            b["overlap_s"] = batch.overlap_s
        return out

    def records(self, plan: RolloutPlan) -> list[dict[str, Any]]:
        """One update record per drained backend, in the shape ``llmslo rollout record`` stores."""
        out = []
        for batch in self.batches:
            for d in batch.drained:
                drain = {**d.drain, "from_version": self.from_version, "to_version": self.to_version,
                         "batch": batch.index, "batches": batch.of}
                out.append({
                    "update_id": f"{self.update_id}-b{batch.index}-{d.backend}",
                    "versions": {"from": self.from_version, "to": self.to_version,
                                 "artifacts": self.artifacts[self.to_version]},
                    "drain": drain,
                    "overlap": {"from_unix_s": batch.overlap_from_unix_s, "to_unix_s": batch.overlap_to_unix_s},
                    "started_unix_s": batch.started_unix_s or None, "ended_unix_s": batch.overlap_to_unix_s,
                    "rollback": {"triggered": self.rollback,
                                 "reason": "rollout run --rollback" if self.rollback else None},
                    "notes": f"llmslo rollout run: batch {batch.index} of {batch.of}, {batch.outcome}"
                             + (f"; {d.note}" if d.note else "") + (f"; failed: {d.failure}" if d.failure else ""),
                    "extra": {"removal_propagation_s": d.propagation_s, "backend": d.backend,
                              "new_backends": batch.new, "caller_timeout_s": plan.drain.caller_timeout_s,
                              "max_overlap_window_s": plan.drain.max_overlap_window_s,
                              "terminate_on_budget": plan.drain.terminate_on_budget,
                              **({"failure": d.failure, "put_back": d.put_back} if d.failure else {})},
                })
        return out


# ---- running -------------------------------------------------------------------------------------------------

class RolloutRunner:
    """Runs a :class:`RolloutPlan` (see the module docstring). ``say`` gets one line per step."""

    def __init__(self, plan: RolloutPlan, say: Callable[[str], None] | None = None) -> None:
        self.plan = plan
        self.say = say or (lambda line: None)
        self.started: list[subprocess.Popen[bytes]] = []
        """The backends this runner started (they outlive the run: a caller in the same process that wants
        them gone stops them with :func:`llmslo.ops.stop_process`)."""

    def run(self, *, rollback: bool = False, update_id: str | None = None) -> RolloutResult:
        plan = self.plan.swapped() if rollback else self.plan
        problems = plan.problems()
        if problems:
            raise RolloutError("the plan cannot run: " + "; ".join(problems))
        artifacts = {plan.from_version.version: check_artifacts(plan.from_version, "the old"),
                     plan.to_version.version: check_artifacts(plan.to_version, "the new")}
        old = [b for b in self._backends() if b.get("version") == plan.from_version.version]
        if not old:
            raise RolloutError(f"the gateway at {plan.admin_url} has no backend of version "
                               f"{plan.from_version.version}: nothing to update")
        batches = [old[i:i + plan.batch_size] for i in range(0, len(old), plan.batch_size)]
        now = time.time()
        result = RolloutResult(update_id or time.strftime("rollout-%Y%m%dT%H%M%SZ", time.gmtime(now)),
                               plan.from_version.version, plan.to_version.version, rollback, artifacts,
                               started_unix_s=now)
        self.say(f"{'rollback' if rollback else 'update'} {plan.from_version.version} → "
                 f"{plan.to_version.version}: {len(old)} backend(s) in {len(batches)} batch(es) of at most "
                 f"{plan.batch_size}; artefacts of both versions present")
        for index, batch in enumerate(batches, start=1):
            done = self._batch(plan, index, len(batches), [str(b["id"]) for b in batch], [int(b["slots"]) for b
                                                                                          in batch])
            result.batches.append(done)
            if done.outcome == "failed":
                result.outcome = "failed"
                result.failure = self._failure(plan, done)
                self.say(result.failure)
                break
            if done.outcome != "done":
                result.outcome = "stopped"
                break
        else:
            result.outcome = "done"
        result.ended_unix_s = time.time()
        return result

    # ---- one batch ----

    def _batch(self, plan: RolloutPlan, index: int, of: int, old: list[str], slots: list[int]) -> BatchResult:
        new_spec = plan.to_version
        begun = time.time()
        started = [self._start(new_spec) for _ in old]
        ids = [f"{new_spec.version}-{port}"[:32] for port, _ in started]
        try:
            for (port, process), _ in zip(started, ids, strict=True):
                self._wait_ready(port, process)
            for (port, _), ident, n in zip(started, ids, slots, strict=True):
                self._admin("POST", "/admin/backends", {"id": ident, "url": f"http://127.0.0.1:{port}",
                                                        "version": new_spec.version, "slots": n,
                                                        "models": list(new_spec.models)})
        except RolloutError:
            for ident in ids:
                self._try_remove(ident)
            for _, process in started:
                stop_process(process, plan.stop_timeout_s)
            raise
        opened = time.time()
        soak = plan.drain.soak_s
        then = f"both versions serve for {soak:g} s (soak_s), then " if soak else ""
        self.say(f"batch {index}/{of}: {', '.join(ids)} ({new_spec.version}) ready and in the pool; {then}draining "
                 f"{', '.join(old)}")
        if soak:
            time.sleep(soak)
        with ThreadPoolExecutor(max_workers=len(old)) as pool:
            drained = list(pool.map(lambda ident: self._drain(plan, ident), old))
        returned = [d.backend for d in drained if d.drain.get("decision") == "return_to_pool"]
        failed = [d for d in drained if d.failure is not None]
        closed = None if returned or failed else time.time()
        for d in drained:
            if d.failure is None:
                self.say(f"batch {index}/{of}: {d.backend} drained in {d.actual_drain_s:.2f} s "
                         f"({d.drain.get('decision')}), {d.terminated} terminated, removal propagated in "
                         f"{d.propagation_s:.3f} s" + (f"; {d.note}" if d.note else ""))
        outcome = "done"
        if failed:
            outcome = "failed"
        elif returned:
            outcome = "stopped"
            self.say(f"batch {index}/{of}: the wait budget ran out on {', '.join(returned)}: returned to the "
                     "pool (terminate_on_budget is false); the update stops here with both versions serving")
        elif closed is not None and closed - opened > plan.drain.max_overlap_window_s:
            self.say(f"batch {index}/{of}: the versions overlapped {closed - opened:.1f} s, above "
                     f"max_overlap_window_s ({plan.drain.max_overlap_window_s:g} s)")
        return BatchResult(index, of, old, ids, [p.pid for _, p in started], drained, opened, closed, outcome,
                           started_unix_s=begun)

    def _start(self, spec: VersionSpec) -> tuple[int, subprocess.Popen[bytes]]:
        port = free_port()
        logs = Path(self.plan.logs)
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"{spec.version}-{port}.log").open("wb") as log:
            process = subprocess.Popen(spec.argv(port), stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        self.started.append(process)
        return port, process

    def _wait_ready(self, port: int, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.plan.start_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RolloutError(f"the new backend on port {port} exited with status {process.returncode} "
                                   f"before it was ready (its log: {self.plan.logs}); the pool is unchanged")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2.0) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(HEALTH_POLL_S)
        raise RolloutError(f"the new backend on port {port} was not healthy within {self.plan.start_timeout_s:g} s "
                           "(start_timeout_s); the pool is unchanged")

    def _drain(self, plan: RolloutPlan, ident: str) -> BackendDrained:
        """Drain ``ident``, read when it left the pool, take it out of the gateway and stop its process. When a
        call to the admin API fails on the way, the backend is put back in the pool (see :meth:`_undo`)."""
        d = plan.drain
        body = {"budget_s": d.wait_budget_s, "settle_s": d.unregister_settle_s, "idle_s": d.idle_threshold_s,
                "on_budget": "terminate" if d.terminate_on_budget else "return_to_pool"}
        begun = time.monotonic()
        record: dict[str, Any] | None = None
        try:
            record = self._admin("POST", f"/admin/backends/{ident}/drain?wait=1", body,
                                 timeout_s=d.unregister_settle_s + d.wait_budget_s + 60.0)
            status = self._admin("GET", f"/admin/backends/{ident}")
            if record.get("decision") != "return_to_pool":
                self._admin("DELETE", f"/admin/backends/{ident}")
        except _AdminCallFailed as exc:
            return self._undo(plan, ident, exc, record, time.monotonic() - begun)
        removed, last = status.get("removed_unix_s"), status.get("last_routed_unix_s")
        propagation = max(0.0, float(last) - float(removed)) if removed is not None and last is not None else 0.0
        pid = None
        note = None
        if record.get("decision") != "return_to_pool":
            url = str(status.get("url", ""))
            port = int(url.rsplit(":", 1)[1]) if ":" in url.split("//", 1)[-1] else None
            pid = pid_listening_on(port) if port is not None else None
            if pid is None:
                note = f"no process found listening on {url}: stop it yourself"
            else:
                stop_pid(pid, plan.stop_timeout_s)
        return BackendDrained(ident, record, float(record["actual_drain_s"]), int(record["terminated"]),
                              propagation, pid, note)

    def _undo(self, plan: RolloutPlan, ident: str, exc: _AdminCallFailed, record: dict[str, Any] | None,
              elapsed_s: float) -> BackendDrained:
        """After a failed admin call in the drain of ``ident``: put it back in the pool (``POST
        /admin/backends/ID/ready``), unless the gateway refused the drain itself (an HTTP 4xx to it: nothing was
        taken out). Its process is left running. ``elapsed_s``: from the drain request to the failure (seconds),
        the drain time recorded when the gateway gave no drain record."""
        refused = record is None and exc.status is not None and 400 <= exc.status < 500
        if refused:
            put_back: bool | None = None
            failure = f"{exc}; the gateway refused the drain of {ident}: nothing was taken out of the pool"
        else:
            try:
                self._admin("POST", f"/admin/backends/{ident}/ready", {})
            except _AdminCallFailed as again:
                put_back = False
                failure = (f"{exc}; {ident} could not be put back in the pool ({again}): it is out of the pool "
                           f"with its process running; put it back with: llmslo gateway ready {ident} --admin "
                           f"{plan.admin_url}")
            else:
                put_back = True
                failure = f"{exc}; {ident} was put back in the pool"
        if record is None:  # the gateway gave no drain record: the plan's numbers and this runner's time
            drain: dict[str, Any] = {"wait_budget_s": plan.drain.wait_budget_s,
                                     "unregister_settle_s": plan.drain.unregister_settle_s,
                                     "actual_drain_s": round(elapsed_s, 6)}
        else:
            drain = record
        return BackendDrained(ident, drain, float(drain["actual_drain_s"]), int(drain.get("terminated") or 0),
                              0.0, None, None, failure, put_back)

    def _failure(self, plan: RolloutPlan, batch: BatchResult) -> str:
        """The message of a batch whose drain failed: each failure, and what the pool is left as."""
        failed = [d for d in batch.drained if d.failure is not None]
        lines = "; ".join(f"{d.backend}: {d.failure}" for d in failed)
        return (f"batch {batch.index}/{batch.of}: the gateway's admin API failed during the drain ({lines}). The "
                f"new backend(s) {', '.join(batch.new)} ({plan.to_version.version}) stay in the pool: both versions "
                f"serve. The update stops here; llmslo rollout run --rollback takes the pool back to "
                f"{plan.from_version.version}")

    # ---- the admin API ----

    def _backends(self) -> list[dict[str, Any]]:
        backends = self._admin("GET", "/admin/backends")
        if not isinstance(backends, list):
            raise RolloutError(f"{self.plan.admin_url}/admin/backends did not answer a list: is it a gateway's "
                               "admin address?")
        return backends

    def _try_remove(self, ident: str) -> None:
        with contextlib.suppress(RolloutError):
            self._admin("DELETE", f"/admin/backends/{ident}")

    def _admin(self, method: str, path: str, body: Mapping[str, Any] | None = None,
               timeout_s: float = ADMIN_TIMEOUT_S) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.plan.admin_url}{path}", data=data, method=method,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as reply:
                return json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode("utf-8", "replace")
            raise _AdminCallFailed(f"the gateway's admin API answered {exc.code} to {method} {path}: {detail}",
                                   exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise _AdminCallFailed(f"the gateway's admin API at {self.plan.admin_url} cannot be reached for "
                                   f"{method} {path} ({getattr(exc, 'reason', exc)})", None) from None


def stop_pid(pid: int, timeout_s: float) -> None:
    """SIGTERM ``pid``, SIGKILL after ``timeout_s``; returns once it is gone (or the kill was sent)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            waited, _ = os.waitpid(pid, os.WNOHANG)
            if waited == pid:
                return
        except ChildProcessError:  # not our child: poll for it
            if not pid_alive(pid):
                return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
