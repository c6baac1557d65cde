"""``llmslo serve`` and ``llmslo gateway``, the installed commands, when the reader of their log goes away (a log
pipe whose reader ended): SIGTERM still drains them and they exit 0.

Before, the first drain line that could not be written (a broken pipe on standard error) raised in the signal's
callback or in the drain's task: the drain never ran to its end, and the process ran on, deaf to every later
SIGTERM, until it was killed."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmslo.tests._tools import first_line

pytestmark = [pytest.mark.integration]


@pytest.mark.parametrize(("args", "ready"), [
    (("serve", "--port", "0"), "serving llmslo-sim on http://127.0.0.1:"),
    (("gateway", "--backend", "http://127.0.0.1:9", "--port", "0", "--admin-port", "0"),
     "gateway on http://127.0.0.1:"),
])
def test_sigterm_drains_and_exits_0_when_standard_error_is_closed(args: tuple[str, ...], ready: str,
                                                                 tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "llmslo.cli", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = first_line(proc.stdout, 60)
        assert line.startswith(ready), line
        proc.stderr.close()  # the reader of its log goes away
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
    assert code == 0, code
