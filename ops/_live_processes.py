"""The processes of the live runs (``llmslo demo --live``, ``--engine`` and ``--rollout``), and what they share.

Every process is an ``llmslo`` command run by this interpreter (:func:`llmslo_command`), started by
:func:`started` and stopped by its process id on the way out whatever happens; every wait is bounded and
every address is on 127.0.0.1. :func:`run_llmslo` runs one command to its end (ingest, record, compare);
:func:`long_stream` starts a one-request load whose reply outlives any short drain budget, so a drain is
sure to cut a stream. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from llmslo.ops._process import stop_process
from llmslo.telemetry import LlmsloError

__all__ = [
    "CLI_TIMEOUT_S",
    "GATEWAY_READY",
    "READY_TIMEOUT_S",
    "LiveRunError",
    "llmslo_command",
    "load_started",
    "long_stream",
    "ready_port",
    "run_llmslo",
    "started",
    "terminate",
    "wait_exits",
]

READY_TIMEOUT_S = 30.0
"""How long a server may take to print its ready line, seconds."""
CLI_TIMEOUT_S = 120.0
"""How long one ``llmslo`` command run to its end (ingest, record, compare) may take, seconds."""


class LiveRunError(LlmsloError):
    """A process of a live run did not start or did not end as it should (the message says which)."""


def llmslo_command(*args: str) -> list[str]:
    """The command line of ``llmslo ARGS`` run by this interpreter."""
    return [sys.executable, "-m", "llmslo.cli", *args]


def ready_match(process: subprocess.Popen[str], pattern: re.Pattern[str], name: str,
                timeout_s: float = READY_TIMEOUT_S) -> re.Match[str]:
    """The first line of ``process``'s standard output that ``pattern`` matches (waits at most ``timeout_s``);
    :class:`LiveRunError` naming ``name`` when it exits first or prints none."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise LiveRunError(f"{name} exited with status {process.returncode} before it was ready")
            if not sel.select(timeout=0.2):
                continue
            found = pattern.match(process.stdout.readline().strip())
            if found:
                return found
    raise LiveRunError(f"{name} printed no ready line within {timeout_s:g} s")


SERVING = re.compile(r"^serving .+ on http://\S+:(\d+)/?$")
"""The ready line of ``llmslo serve``."""
GATEWAY_READY = re.compile(r"^gateway on http://127\.0\.0\.1:(\d+) \(admin http://127\.0\.0\.1:(\d+)\)")
"""The ready line of ``llmslo gateway``: its port, then its admin port."""


def ready_port(process: subprocess.Popen[str], timeout_s: float = READY_TIMEOUT_S) -> int:
    """The port from the server's ``serving MODEL on http://HOST:PORT`` line (waits at most ``timeout_s``)."""
    return int(ready_match(process, SERVING, "llmslo serve", timeout_s).group(1))


@contextlib.contextmanager
def started(argv: list[str], log: Path, *, stdout: int | None = None) -> Iterator[subprocess.Popen[str]]:
    """Run ``argv`` (stderr to ``log``; stdout to the file descriptor ``stdout``, a pipe for
    ``subprocess.PIPE``, else nowhere); stopped by its pid on the way out if still running."""
    with log.open("w") as err:
        process = subprocess.Popen(argv, stdout=stdout if stdout is not None else subprocess.DEVNULL,
                                   stderr=err, text=True)
    try:
        yield process
    finally:
        stop_process(process)
        if process.stdout is not None:
            process.stdout.close()


def terminate(process: subprocess.Popen[str]) -> float:
    """SIGTERM to ``process`` by its pid (when still running); the Unix time it was sent, seconds."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
    return time.time()


def wait_exits(processes: Mapping[str, subprocess.Popen[str]], timeout_s: float = 60.0) -> dict[str, tuple[int, float]]:
    """Wait at most ``timeout_s`` for every process of ``processes`` (by name) to exit, watching them all at
    once: by name, its exit status and the Unix time it was first seen gone (within 50 ms). Raises
    :class:`LiveRunError` naming those still running at the deadline."""
    deadline = time.monotonic() + timeout_s
    done: dict[str, tuple[int, float]] = {}
    while True:
        for name, process in processes.items():
            if name not in done and process.poll() is not None:
                done[name] = (process.returncode, time.time())
        left = [name for name in processes if name not in done]
        if not left:
            return done
        if time.monotonic() >= deadline:
            raise LiveRunError(f"{', '.join(left)} did not exit within {timeout_s:g} s")
        time.sleep(0.05)


def load_started(attempts_log: Path, process: subprocess.Popen[str], timeout_s: float = READY_TIMEOUT_S) -> float:
    """When the ``llmslo load`` writing ``attempts_log`` began its schedule (Unix seconds): the first sent
    attempt's send time less its lateness and its offset in the schedule. Waits at most ``timeout_s`` for
    an attempt to end (a line is written when it does); :class:`LiveRunError` when none does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LiveRunError(f"llmslo load exited with status {process.returncode} before it sent anything")
        with contextlib.suppress(OSError):
            for line in attempts_log.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    a = json.loads(line)
                    if a.get("sent_unix_s") is not None:
                        return float(a["sent_unix_s"]) - float(a["late_s"] or 0.0) - float(a["scheduled_offset_s"])
        time.sleep(0.1)
    raise LiveRunError(f"{attempts_log}: no attempt was sent within {timeout_s:g} s")


def run_llmslo(*args: str, timeout_s: float = CLI_TIMEOUT_S) -> str:
    """Run ``llmslo ARGS`` to its end (at most ``timeout_s``) and return its standard output; a failure
    raises :class:`LiveRunError` with the command and the end of its standard error."""
    argv = llmslo_command(*args)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise LiveRunError(f"llmslo {' '.join(args)} did not end within {timeout_s:g} s") from None
    if done.returncode != 0:
        raise LiveRunError(f"llmslo {' '.join(args)} exited with status {done.returncode}: "
                           f"{done.stderr.strip()[-1500:]}")
    return done.stdout


def long_stream(url: str, tokens: int, folder: Path, name: str, *, seed: int = 0,
                client_db: Path | None = None) -> contextlib.AbstractContextManager[subprocess.Popen[str]]:
    """A load of one streamed request asking for exactly ``tokens`` tokens (``ignore_eos``), sent about
    a second after the process starts: started a few seconds before a SIGTERM, its reply outlives a drain
    budget of a few seconds, so the drain cuts it. Its attempt goes to ``folder/NAME-attempts.jsonl`` (and
    its client summary to ``client_db``); stderr to ``folder/NAME.log``; stopped by its pid on the way out."""
    argv = llmslo_command("load", url, "--model", "llmslo-sim", "--max-requests", "1", "--rate", "100",
               "--prompt-tokens", "8", "--output-tokens", str(tokens), "--seed", str(seed), "--no-progress",
               "--attempts-log", str(folder / f"{name}-attempts.jsonl"),
               *(("--db", str(client_db)) if client_db is not None else ()))
    return started(argv, folder / f"{name}.log")

