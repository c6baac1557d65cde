"""The live run on a real engine, behind ``llmslo demo --engine llamacpp`` and its CI test.

:func:`run_engine_live` starts llama.cpp's ``llama-server`` (SmolLM2-135M, ``--parallel`` slots, ``--metrics``)
on a free port of 127.0.0.1, a Prometheus scraping the engine's own ``/metrics`` every second with the rules
``llmslo rules generate --engine llamacpp`` makes, ``llmslo gateway`` in front of the engine (its summaries to
JSONL; it forwards up to :data:`GATEWAY_CONCURRENCY` requests at once, so the engine's slots, not the gateway,
make requests wait), and ``llmslo load`` through the gateway: a calm phase under the engine's capacity, then a
burst above its slots (requests wait: ``llamacpp:requests_deferred``), then calm again. It reads the engine's
counters straight from ``/metrics`` before the load and once the engine is idle after it, and Prometheus's
view of the same run: the deferred requests, the rules' health, and what every query of the engine's dashboard
returned.

What the run is to prove (checked on its files by ``llmslo.cli._live_engine.engine_checks``, which reads the
client's store): one client summary per attempt; the client's ``usage`` sums equal the engine's counter deltas
exactly (prompt = ``prompt_tokens_total`` + ``prompt_tokens_cached_total``, completion =
``tokens_predicted_total``); the gateway's summaries match the client's one to one, each stream's TTFT at the
gateway within the client's; the rules load and evaluate without error and every dashboard query returns data;
the burst queues (deferred > 0, the client's TTFT grows) and goodput falls below the calm phase's. Every
process is stopped by its pid; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmslo.ops._live_processes import (
    GATEWAY_READY,
    LiveRunError,
    llmslo_command,
    load_started,
    ready_match,
    run_llmslo,
    started,
)
from llmslo.ops._llamacpp import LlamaServer, locate_engine, running_llama_server
from llmslo.ops._process import stop_process
from llmslo.ops._prometheus import Prometheus, PrometheusError, RulesNotLoaded, running_prometheus

__all__ = ["ENGINE_COUNTERS", "ENGINE_SPEC", "EnginePlan", "EngineRun", "read_counters", "run_engine_live"]

ENGINE_SPEC = Path(__file__).resolve().parents[1] / "examples" / "llamacpp-slo.yaml"
"""The SLO spec of the engine run: objectives llama.cpp's counters and gauges can support."""
JOB = "llama-server"
"""The scrape job of the engine (the spec's ``scrape.job``)."""
ENGINE_COUNTERS = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total",
                   "llamacpp:tokens_predicted_total")
"""The engine's token counters the run compares with the client's ``usage`` sums."""
GATEWAY_CONCURRENCY = 64
"""Requests the gateway of the run forwards at once: above the burst's requests in flight, so they wait in the
engine (its deferred requests), not in the gateway's queue."""
IDLE_TIMEOUT_S = 120.0
"""How long the engine may take to finish the requests still running when the load has ended, seconds."""


@dataclass(frozen=True)
class EnginePlan:
    """The shape of the run; times in seconds from the start of the load's schedule.

    Sized for two shared cores and SmolLM2-135M (about 90 tokens/s decode for one stream, about 3 requests a
    second over four slots on a quiet machine, fewer on a busy one): ``rate_per_s`` stays under the engine's
    capacity, ``burst_factor`` × that rate is well above it, so requests wait for a slot, seconds by the burst's
    end. (5× was too little on a quiet machine: 3.5 requests a second left the longest wait at 1.499 s, just
    inside the 1.5 s rule, and goodput did not fall.)
    """

    rate_per_s: float = 0.7
    calm_s: float = 20.0
    burst_s: float = 8.0
    burst_factor: float = 8.0
    after_burst_s: float = 8.0
    parallel: int = 4
    context_tokens: int = 4096
    prompt_words: str = "40"
    output_tokens: str = "24"
    ttft_slo_ms: int = 1500
    """The goodput rule of the run (the client's TTFT); the calm phase meets it, the burst's queue does not."""
    client_timeout_s: float = 300.0
    """The client's patience: far beyond the burst's queue even on a busy machine, so no attempt is hung up
    (a hung-up stream's tokens reach the engine's counters but not the client's usage sums)."""
    seed: int = 0

    @property
    def duration_s(self) -> float:
        return self.calm_s + self.burst_s + self.after_burst_s


@dataclass
class EngineRun:
    """Where the run left its files, and what it saw (times in Unix seconds)."""

    folder: Path
    plan: EnginePlan
    client_db: Path
    attempts_log: Path
    gateway_rows: Path
    """The folder of the gateway's summaries (JSONL)."""
    url: str = ""
    gateway_url: str = ""
    started_unix_s: float = 0.0
    burst_unix_s: tuple[float, float] = (0.0, 0.0)
    load_exit_code: int | None = None
    load_json: dict[str, Any] | None = None
    counters_before: dict[str, float] = field(default_factory=dict)
    counters_after: dict[str, float] = field(default_factory=dict)
    deferred_max: float | None = None
    rule_groups: list[dict[str, Any]] = field(default_factory=list)
    """Each rule: ``{"name", "health", "last_error"}`` as Prometheus evaluated it at the end."""
    dashboard_queries: list[dict[str, Any]] = field(default_factory=list)
    """Each query of the engine's dashboard, asked over the run's time range as a panel asks:
    ``{"panel", "expr", "series", "error"}``."""
    prometheus_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("folder", "client_db", "attempts_log", "gateway_rows"):
            data[key] = str(data[key])
        return data

    def attempts(self) -> list[dict[str, Any]]:
        """The load's attempts, one per line of ``attempts_log``."""
        return [json.loads(line) for line in self.attempts_log.read_text().splitlines() if line.strip()]

    def gateway_summaries(self) -> list[dict[str, Any]]:
        """The gateway's summaries, one per request it read (its JSONL files, in order)."""
        return [json.loads(line) for path in sorted(self.gateway_rows.glob("*.jsonl"))
                for line in path.read_text().splitlines() if line.strip()]

    def phases(self) -> dict[str, list[dict[str, Any]]]:
        """The attempts by the phase of their scheduled arrival: ``calm`` (before the burst), ``burst``."""
        plan = self.plan
        out: dict[str, list[dict[str, Any]]] = {"calm": [], "burst": []}
        for a in self.attempts():
            offset = float(a["scheduled_offset_s"])
            if offset < plan.calm_s:
                out["calm"].append(a)
            elif offset < plan.calm_s + plan.burst_s:
                out["burst"].append(a)
        return out


# ---- the run ---------------------------------------------------------------------------------------------


def read_counters(url: str) -> dict[str, float]:
    """The engine's counters and gauges as ``/metrics`` says now, by sample name as written (llama-server's
    samples have no labels; a sample with labels, a comment or a value that is no number is left out)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10.0) as r:
        text = r.read().decode("utf-8", errors="replace")
    out: dict[str, float] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[0].startswith("#") or "{" in fields[0]:
            continue
        with contextlib.suppress(ValueError):
            out[fields[0]] = float(fields[1])
    return out


def _wait_idle(url: str, timeout_s: float = IDLE_TIMEOUT_S) -> dict[str, float]:
    """The counters once nothing is processing or deferred (read twice, equal, so the last reply is counted)."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, float] | None = None
    while time.monotonic() < deadline:
        now = read_counters(url)
        idle = now.get("llamacpp:requests_processing", 0) == 0 and now.get("llamacpp:requests_deferred", 0) == 0
        if idle and last is not None and all(now.get(k) == last.get(k) for k in ENGINE_COUNTERS):
            return now
        last = now if idle else None
        time.sleep(0.5)
    raise LiveRunError(f"llama-server was still busy {timeout_s:g} s after the load ended")


def _write_rules_and_dashboard(folder: Path) -> tuple[Path, Path]:
    rules, dashboard = folder / "llamacpp-rules.yml", folder / "dashboards"
    run_llmslo("rules", "generate", str(ENGINE_SPEC), "--engine", "llamacpp", "-o", str(rules))
    run_llmslo("dashboards", "generate", str(ENGINE_SPEC), "--engine", "llamacpp", "-o", str(dashboard))
    return rules, dashboard


def _dashboard_exprs(folder: Path) -> list[tuple[str, str]]:
    """Every (panel title, PromQL) of the generated dashboards, with Grafana's ``$__rate_interval`` as 30s."""
    out = []
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        panels = list(doc.get("panels", []))
        while panels:
            panel = panels.pop(0)
            panels.extend(panel.get("panels", []))
            for target in panel.get("targets", []):
                expr = target.get("expr")
                if isinstance(expr, str) and expr:
                    out.append((str(panel.get("title", "")), _concrete(expr)))
    return out


def _concrete(expr: str) -> str:
    """A dashboard expression with Grafana's variables made concrete (the run's job, a 30 s range)."""
    for var, value in (("$__rate_interval", "30s"), ("$__interval", "5s"), ("$__range", "5m"),
                       ("${job}", JOB), ("$job", JOB), ("${instance}", ".*"), ("$instance", ".*")):
        expr = expr.replace(var, value)
    return expr


def run_engine_live(folder: Path, plan: EnginePlan = EnginePlan(), *,
                    say: Callable[[str], None] = lambda _: None) -> EngineRun:
    """Run the engine demo into ``folder`` (created; must hold no earlier run) and return what it saw.

    :class:`llmslo.ops.EngineNotFound` when llama-server or the model is missing (the message says how to get
    them); :class:`LiveRunError` when a process fails.
    """
    binary, model = locate_engine()  # before anything is written
    folder.mkdir(parents=True, exist_ok=True)
    run = EngineRun(folder=folder, plan=plan, client_db=folder / "client.duckdb",
                    attempts_log=folder / "attempts.jsonl", gateway_rows=folder / "gateway")
    stale = [p for p in (run.client_db, run.attempts_log, run.gateway_rows) if p.exists()]
    if stale:
        raise LiveRunError(f"{folder} already holds a run ({stale[0].name}): choose an empty folder")
    rules, dashboards = _write_rules_and_dashboard(folder)
    say(f"starting llama-server (SmolLM2-135M, {plan.parallel} slots) on 127.0.0.1")
    with running_llama_server(folder, parallel=plan.parallel, context_tokens=plan.context_tokens,
                              binary=binary, model=model) as engine:
        run.url = engine.url
        with contextlib.ExitStack() as stack:
            prometheus: Prometheus | None = None
            try:
                prometheus = stack.enter_context(running_prometheus(
                    folder / "prometheus", [engine.target], job=JOB, rule_files=[rules]))
                groups, n = prometheus.rules_loaded
                say(f"Prometheus {prometheus.url} scrapes {engine.url}/metrics every second, rules {rules.name} "
                    f"loaded ({groups} groups, {n} rules, as Prometheus reports)")
                prometheus.wait_first_scrape("the engine")
            except RulesNotLoaded as exc:  # the rules and dashboards checks would mean nothing
                raise LiveRunError(f"{rules}: {exc}") from None
            except PrometheusError as exc:
                run.prometheus_note = f"no Prometheus: {exc}"
                say(run.prometheus_note)
            gateway = stack.enter_context(started(llmslo_command(
                "gateway", "--port", "0", "--admin-port", "0", "--backend",
                f"llama={engine.url}@llama-server,slots={plan.parallel}", "--concurrency", str(GATEWAY_CONCURRENCY),
                "--jsonl", str(run.gateway_rows)), folder / "gateway.log", stdout=subprocess.PIPE))
            run.gateway_url = f"http://127.0.0.1:{ready_match(gateway, GATEWAY_READY, 'llmslo gateway').group(1)}"
            say(f"llmslo gateway {run.gateway_url} in front of it (summaries to {run.gateway_rows.name}/)")
            run.counters_before = read_counters(engine.url)
            _drive(run, engine, say)
            run.counters_after = _wait_idle(engine.url)
            stop_process(gateway)  # SIGTERM: it drains and writes its last summaries
            if prometheus is not None:
                time.sleep(2.5)  # two more scrapes: the idle engine's last counters reach Prometheus
                _read_prometheus(run, prometheus, dashboards)
    return run


def _drive(run: EngineRun, engine: LlamaServer, say: Callable[[str], None]) -> None:
    plan = run.plan
    burst = f"{plan.burst_factor:g}x@{plan.calm_s:g}s+{plan.burst_s:g}s"
    argv = llmslo_command(
        "load", run.gateway_url, "--model", engine.alias, "--endpoint", "chat", "--rate", f"{plan.rate_per_s:g}",
        "--duration", f"{plan.duration_s:g}s", "--burst", burst, "--seed", str(plan.seed),
        "--prompt-tokens", plan.prompt_words, "--output-tokens", plan.output_tokens,
        "--goodput", f"ttft:{plan.ttft_slo_ms}", "--timeout", f"{plan.client_timeout_s:g}s",
        "--db", str(run.client_db), "--attempts-log", str(run.attempts_log), "--json", "--no-progress")
    say(f"load through the gateway: {plan.rate_per_s:g} req/s, burst {burst} (above the {plan.parallel} slots), "
        "then calm")
    out_path = run.folder / "load.json"
    with out_path.open("w") as out, started(argv, run.folder / "load.log", stdout=out.fileno()) as load:
        run.started_unix_s = load_started(run.attempts_log, load, timeout_s=60.0)
        run.burst_unix_s = (run.started_unix_s + plan.calm_s, run.started_unix_s + plan.calm_s + plan.burst_s)
        limit_s = plan.duration_s + plan.client_timeout_s + 60.0
        try:
            run.load_exit_code = load.wait(timeout=limit_s)
        except Exception:
            raise LiveRunError(f"llmslo load did not end within {limit_s:g} s") from None
    with contextlib.suppress(OSError, ValueError):
        run.load_json = json.loads(out_path.read_text())
    if run.load_exit_code != 0:
        raise LiveRunError(f"llmslo load exited with status {run.load_exit_code}: "
                           f"{(run.folder / 'load.log').read_text(errors='replace')[-1500:]}")


def _read_prometheus(run: EngineRun, prometheus: Prometheus, dashboards: Path) -> None:
    span = max(60, math.ceil(time.time() - run.started_unix_s) + 30)
    deferred = prometheus.query(f'max_over_time(llamacpp:requests_deferred{{job="{JOB}"}}[{span}s])')
    run.deferred_max = max((float(r["value"][1]) for r in deferred), default=None)
    groups = prometheus.get("/api/v1/rules")["groups"]
    run.rule_groups = [{"name": str(r.get("name")), "health": str(r.get("health")),
                        "last_error": str(r.get("lastError") or "")} for g in groups for r in g.get("rules", [])]
    start, end = run.started_unix_s - 5, time.time()
    for panel, expr in _dashboard_exprs(dashboards):  # as Grafana asks: over the run's time range
        try:
            series, error = len(prometheus.query_range(expr, start, end)), ""
        except PrometheusError as exc:
            series, error = 0, str(exc)[:300]
        run.dashboard_queries.append({"panel": panel, "expr": expr, "series": series, "error": error})
