"""The live run behind ``llmslo demo --live`` and the end-to-end test: server, Prometheus and load, for real.

:func:`run_live` starts ``llmslo serve`` (the simulated engine) on a free port on 127.0.0.1, a Prometheus
that scrapes it every second with the rules ``llmslo rules generate`` makes from ``examples/live-slo.yaml``,
and ``llmslo load`` against it: a calm phase, an overload burst, calm again, then SIGTERM to the server
while the load still runs, so the drain is seen from both sides; a one-request load started a few seconds
before SIGTERM asks for a reply longer than the drain budget, so the drain always cuts a stream. It watches
Prometheus's alerts every second and, once the processes have exited, reads back from Prometheus what it
recorded: the request counts by finish reason, the TTFT bucket counts and the ``request_id`` exemplars, as of
its last scrape.
Everything the run wrote stays in one folder: the server's and the clients' stores, the attempts logs, the
drain record, the rules, Prometheus's configuration and log, and ``run.json`` (what the run saw,
:meth:`LiveRun.to_dict`; :meth:`LiveRun.from_dict` reads it back).

Each process is started by this module and stopped by its process id, every wait is bounded, and every
address is on 127.0.0.1. ``llmslo demo --live`` prints the run (``llmslo.cli._live``).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable
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
from llmslo.ops._prometheus import Prometheus, PrometheusError, RulesNotLoaded, running_prometheus

__all__ = ["LIVE_SPEC", "AlertSpan", "LivePlan", "LiveRun", "LiveRunError", "PrometheusFacts", "run_live"]

LIVE_SPEC = Path(__file__).resolve().parents[1] / "examples" / "live-slo.yaml"
"""The SLO spec of the live run: short windows, so its alerts fire and resolve within the run."""
JOB = "llmslo-serve"
"""The scrape job (the spec's ``scrape.job``, so its operational alerts select this target)."""
LONG = "long-stream"
"""The name of the long reply's files (``long-stream.log``, ``long-stream-attempts.jsonl``)."""


@dataclass(frozen=True)
class LivePlan:
    """The shape of a live run; times in seconds from the start of the load's schedule.

    The default is sized for two shared cores: the engine runs ``speed`` times faster than the fitted
    profile, ``rate_per_s`` stays under its capacity, and ``burst_factor`` × that rate overloads it.
    """

    rate_per_s: float = 6.0
    calm_s: float = 10.0
    burst_s: float = 12.0
    burst_factor: float = 4.0
    after_burst_s: float = 35.0
    """Calm between the end of the burst and SIGTERM: long enough for the alerts to resolve."""
    load_after_sigterm_s: float = 3.0
    """The load goes on this long after SIGTERM: arrivals that meet the drain (503 ``draining``)."""
    long_stream_tokens: int = 1500
    """Tokens of the one long reply (about 25 s at ``--speed 2``; 0: no long reply), far beyond the
    settle time plus the drain budget: the drain must cut it."""
    long_stream_lead_s: float = 6.0
    """The long reply's load starts this long before SIGTERM (its start-up takes a second or two)."""
    seed: int = 0
    server_args: tuple[str, ...] = (
        "--speed", "2", "--max-num-seqs", "12", "--max-queue", "48", "--queue-timeout", "8s",
        "--drain-settle", "500ms", "--drain-budget", "500ms", "--drain-idle", "1s", "--exit-linger", "4s",
    )
    """The server's flags: ``--exit-linger`` keeps it answering (503 ``draining``) past the load's last arrival
    (``load_after_sigterm_s`` after SIGTERM) for at least one more scrape, which sees the final counts."""
    load_args: tuple[str, ...] = (
        "--prompt-tokens", "100-600", "--output-tokens", "16-128", "--cancel", "0.04@1s",
        "--slow-reader", "0.05@10", "--timeout", "20s",
    )

    @property
    def sigterm_at_s(self) -> float:
        return self.calm_s + self.burst_s + self.after_burst_s

    @property
    def duration_s(self) -> float:
        return self.sigterm_at_s + self.load_after_sigterm_s


@dataclass(frozen=True)
class AlertSpan:
    """One alert seen during the run: when it was first pending, first firing and gone (Unix seconds)."""

    name: str
    pending_unix_s: float | None
    firing_unix_s: float | None
    resolved_unix_s: float | None


@dataclass(frozen=True)
class PrometheusFacts:
    """What Prometheus held at its last scrape of the server (Unix seconds ``at_unix_s``)."""

    at_unix_s: float
    requests_by_finish_reason: dict[str, int]
    rejected_by_reason: dict[str, int]
    ttft_buckets: dict[str, int]
    """Cumulative TTFT bucket counts by ``le`` (as Prometheus writes the bound: ``0.5``, ``+Inf``)."""
    exemplars: list[dict[str, Any]]
    """TTFT bucket exemplars: ``{"le", "request_id", "value", "unix_s"}``."""


@dataclass
class LiveRun:
    """Where a live run left its files, and what it saw (times in Unix seconds)."""

    folder: Path
    plan: LivePlan
    server_db: Path
    client_db: Path
    attempts_log: Path
    drain_record: Path
    long_client_db: Path
    long_attempts_log: Path
    load_json: dict[str, Any] | None = None
    started_unix_s: float = 0.0
    burst_unix_s: tuple[float, float] = (0.0, 0.0)
    sigterm_unix_s: float | None = None
    long_stream_unix_s: float | None = None
    server_exit_code: int | None = None
    load_exit_code: int | None = None
    long_stream_exit_code: int | None = None
    alerts: list[AlertSpan] = field(default_factory=list)
    prometheus: PrometheusFacts | None = None
    prometheus_note: str | None = None

    @property
    def record(self) -> Path:
        """``run.json`` in the run's folder: :meth:`to_dict`, written at the end of the run."""
        return self.folder / "run.json"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in _PATHS:
            data[key] = str(data[key])
        data["plan"] = {**asdict(self.plan), "sigterm_at_s": self.plan.sigterm_at_s}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], relative_to: Path | None = None) -> LiveRun:
        """The run :meth:`to_dict` gave (``run.json``); relative paths are taken from ``relative_to``, the
        working directory of the run (default: this one)."""
        base = relative_to if relative_to is not None else Path()
        plan: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data["plan"].items()
                                if k != "sigterm_at_s"}
        facts = data.get("prometheus")
        return cls(**{
            **data, **{key: base / str(data[key]) for key in _PATHS}, "plan": LivePlan(**plan),
            "burst_unix_s": tuple(data["burst_unix_s"]), "alerts": [AlertSpan(**a) for a in data["alerts"]],
            "prometheus": PrometheusFacts(**facts) if facts is not None else None})


_PATHS = ("folder", "server_db", "client_db", "attempts_log", "drain_record", "long_client_db", "long_attempts_log")
"""The fields of :class:`LiveRun` that are paths."""


class _AlertWatch:
    """The alerts' states seen at each poll, folded into one :class:`AlertSpan` per alert name."""

    def __init__(self) -> None:
        self.spans: dict[str, dict[str, float | None]] = {}

    def poll(self, prometheus: Prometheus) -> None:
        now = time.time()
        try:
            active = prometheus.alerts()
        except PrometheusError:
            return
        names = set()
        for alert in active:
            name = str(alert.get("labels", {}).get("alertname", ""))
            names.add(name)
            span = self.spans.setdefault(name, {"pending": None, "firing": None, "resolved": None})
            state = alert.get("state")
            if state == "pending" and span["pending"] is None:
                span["pending"] = now
            if state == "firing" and span["firing"] is None:
                span["firing"] = now
                span["pending"] = span["pending"] or now
            if state == "firing":
                span["resolved"] = None  # firing again
        for name, span in self.spans.items():
            if name not in names and span["firing"] is not None and span["resolved"] is None:
                span["resolved"] = now

    def result(self) -> list[AlertSpan]:
        return [AlertSpan(n, s["pending"], s["firing"], s["resolved"]) for n, s in sorted(self.spans.items())]


def _vector(prometheus: Prometheus, expr: str, label: str) -> dict[str, int]:
    return {str(r["metric"].get(label, "")): round(float(r["value"][1])) for r in prometheus.query(expr)}


def _last(series: str) -> str:
    """The last sample of each series of ``series`` scraped from the server in the last five minutes: the
    values of its final scrape, even once the server has exited (a range ignores the staleness marker)."""
    return f'last_over_time({series}{{job="{JOB}"}}[5m])'


def _facts(prometheus: Prometheus, started: float) -> PrometheusFacts | None:
    from llmslo.telemetry import METRICS_BY_KEY

    last_up = prometheus.query(f'max_over_time(timestamp(up{{job="{JOB}"}} == 1)[5m:250ms])')
    if not last_up:
        return None
    at = float(last_up[0]["value"][1])
    ttft = METRICS_BY_KEY["ttft"]
    exemplars = []
    for series in prometheus.exemplars(f'{ttft.bucket}{{job="{JOB}"}}', started - 5, at + 5):
        le = str(series["seriesLabels"].get("le", ""))
        for e in series["exemplars"]:
            exemplars.append({"le": le, "request_id": e["labels"].get("request_id"), "value": float(e["value"]),
                              "unix_s": float(e["timestamp"])})
    return PrometheusFacts(
        at_unix_s=at,
        requests_by_finish_reason=_vector(
            prometheus, f"sum by (finish_reason) ({_last(METRICS_BY_KEY['requests'].name)})", "finish_reason"),
        rejected_by_reason=_vector(
            prometheus, f"sum by (reject_reason) ({_last(METRICS_BY_KEY['rejected_requests'].name)})",
            "reject_reason"),
        ttft_buckets=_vector(prometheus, f"sum by (le) ({_last(ttft.bucket)})", "le"),
        exemplars=exemplars,
    )


def _write_rules(folder: Path) -> Path:
    """``folder/live-rules.yml``: the rules ``llmslo rules generate`` makes from :data:`LIVE_SPEC`."""
    rules = folder / "live-rules.yml"
    run_llmslo("rules", "generate", str(LIVE_SPEC), "-o", str(rules))
    return rules


def run_live(folder: Path, plan: LivePlan = LivePlan(), *, prometheus_required: bool = True,
             say: Callable[[str], None] = lambda _: None) -> LiveRun:
    """Run the live demo into ``folder`` (created; must hold no earlier run) and return what it saw.

    Without a ``prometheus`` binary the run goes on without it when ``prometheus_required`` is False (the
    ``prometheus_note`` says so); otherwise :class:`LiveRunError`.
    """
    folder.mkdir(parents=True, exist_ok=True)
    run = LiveRun(folder=folder, plan=plan, server_db=folder / "server.duckdb", client_db=folder / "client.duckdb",
                  attempts_log=folder / "attempts.jsonl", drain_record=folder / "drain-record.json",
                  long_client_db=folder / "long-client.duckdb", long_attempts_log=folder / f"{LONG}-attempts.jsonl")
    stale = [p for p in (run.server_db, run.client_db, run.attempts_log, run.drain_record, run.long_client_db,
                         run.long_attempts_log, run.record) if p.exists()]
    if stale:
        raise LiveRunError(f"{folder} already holds a run ({stale[0].name}): choose an empty folder")
    rules = _write_rules(folder)
    server_argv = llmslo_command(
        "serve", "--port", "0", "--db", str(run.server_db), "--seed", str(plan.seed), "--update-id", "live-demo",
        "--next-version", "sim-2", "--drain-record", str(run.drain_record), *plan.server_args)
    say("starting llmslo serve (simulated engine) on 127.0.0.1")
    with started(server_argv, folder / "server.log", stdout=subprocess.PIPE) as server:
        port = ready_port(server, READY_TIMEOUT_S)
        url = f"http://127.0.0.1:{port}"
        with contextlib.ExitStack() as stack:
            prometheus: Prometheus | None = None
            try:
                prometheus = stack.enter_context(running_prometheus(
                    folder / "prometheus", [f"127.0.0.1:{port}"], job=JOB, rule_files=[rules]))
                say(f"Prometheus {prometheus.url} scrapes {url}/metrics every second, rules {rules.name} loaded "
                    f"({_loaded(prometheus)})")
                prometheus.wait_first_scrape("the server")
            except RulesNotLoaded as exc:  # no alert could fire: never a run to show
                raise LiveRunError(f"{rules}: {exc}") from None
            except PrometheusError as exc:
                if prometheus_required:
                    raise LiveRunError(str(exc)) from None
                run.prometheus_note = f"no Prometheus: {exc}"
                say(run.prometheus_note)
            _drive(run, server, url, prometheus, say)
            if prometheus is not None:
                run.prometheus = _facts(prometheus, run.started_unix_s)
    run.record.write_text(json.dumps(run.to_dict(), indent=2, default=str) + "\n")
    return run


def _loaded(prometheus: Prometheus) -> str:
    """What Prometheus reported loaded from its rule files: ``2 groups, 14 rules``."""
    groups, rules = prometheus.rules_loaded
    return f"{groups} group{'' if groups == 1 else 's'}, {rules} rule{'' if rules == 1 else 's'}, as Prometheus reports"


def _drive(run: LiveRun, server: subprocess.Popen[str], url: str, prometheus: Prometheus | None,
           say: Callable[[str], None]) -> None:
    """Run the load, start the long reply and SIGTERM the server on time, watch the alerts, wait for every
    process to end."""
    plan = run.plan
    burst = f"{plan.burst_factor:g}x@{plan.calm_s:g}s+{plan.burst_s:g}s"
    load_argv = llmslo_command(
        "load", url, "--model", "llmslo-sim", "--rate", f"{plan.rate_per_s:g}", "--duration", f"{plan.duration_s:g}s",
        "--burst", burst, "--seed", str(plan.seed), "--db", str(run.client_db), "--attempts-log",
        str(run.attempts_log), "--json", "--no-progress", *plan.load_args)
    watch = _AlertWatch()
    say(f"load: {plan.rate_per_s:g} req/s, burst {burst}, SIGTERM to the server at {plan.sigterm_at_s:g} s")
    out_path = run.folder / "load.json"
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(out_path.open("w"))
        load = stack.enter_context(started(load_argv, run.folder / "load.log", stdout=out.fileno()))
        long: subprocess.Popen[str] | None = None
        run.started_unix_s = load_started(run.attempts_log, load)  # the schedule's clock: its first arrival
        run.burst_unix_s = (run.started_unix_s + plan.calm_s, run.started_unix_s + plan.calm_s + plan.burst_s)
        deadline = time.monotonic() + plan.duration_s + 60.0
        while load.poll() is None and time.monotonic() < deadline:
            elapsed = time.time() - run.started_unix_s
            if long is None and plan.long_stream_tokens and elapsed >= plan.sigterm_at_s - plan.long_stream_lead_s:
                long = stack.enter_context(long_stream(url, plan.long_stream_tokens, run.folder, LONG,
                                                       seed=plan.seed + 1, client_db=run.long_client_db))
                run.long_stream_unix_s = time.time()
                say(f"one long reply ({plan.long_stream_tokens} tokens) asked for: the drain will cut it")
            if run.sigterm_unix_s is None and elapsed >= plan.sigterm_at_s:
                run.sigterm_unix_s = terminate(server)
                say("SIGTERM sent to llmslo serve: readiness false, settle, drain")
            if prometheus is not None:
                watch.poll(prometheus)
            time.sleep(0.5)
        if load.poll() is None:
            raise LiveRunError(f"llmslo load did not end within {plan.duration_s + 60:g} s")
        run.load_exit_code = load.returncode
        if run.sigterm_unix_s is None:  # the load ended early: drain anyway
            run.sigterm_unix_s = terminate(server)
        deadline = time.monotonic() + 60.0
        while server.poll() is None and time.monotonic() < deadline:
            if prometheus is not None:
                watch.poll(prometheus)
            time.sleep(0.5)
        if server.poll() is None:
            raise LiveRunError("llmslo serve did not exit within 60 s of SIGTERM")
        run.server_exit_code = server.returncode
        if long is not None:
            run.long_stream_exit_code = wait_exits({"the long reply's llmslo load": long}, 30.0)[
                "the long reply's llmslo load"][0]
    if prometheus is not None:
        for _ in range(4):  # a last look: alerts resolve once their series go stale
            watch.poll(prometheus)
            time.sleep(0.5)
    run.alerts = watch.result()
    with contextlib.suppress(OSError, ValueError):
        run.load_json = json.loads(out_path.read_text())

