"""The two process primitives of every live run: a free loopback port, and a stop by process id."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from typing import Any


def free_port() -> int:
    """A TCP port free on 127.0.0.1 at the time of the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(process: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """SIGTERM ``process`` (by its pid), then SIGKILL after ``timeout_s``; waits for it."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=timeout_s)
