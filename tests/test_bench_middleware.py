"""The middleware's benchmark (``bench/bench_middleware.py``) runs end to end on a small load: both servers are
measured, the overhead is judged against its target, and the server with the middleware wrote a complete summary
for every request it served (a server without it would look cheaper and write none)."""

from __future__ import annotations

import re
import subprocess
import sys


def test_the_command_measures_both_servers_and_the_middleware_wrote_every_summary() -> None:
    out = subprocess.run([sys.executable, "-m", "llmslo.bench.bench_middleware", "--repeats", "1", "--requests", "12",
                          "--tokens", "8", "--concurrency", "2", "--chunks", "2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "streamed chat completions of 8 tokens, 12 per repeat" in text, text
    rows = re.findall(r"^(.+?)\s{2,}(\d[\d,.]*)\s+(\d[\d,.]*)$", text, re.M)
    assert len(rows) == 2, text  # the server with the middleware and the bare one, each with its figures
    assert re.search(r"^overhead per request, 8 tokens\s+-?\d+\.\d %\s+<= 3 %\s+(PASS|MISS)$", text, re.M), text
    written = re.search(r"^summaries written by on, complete \(info\)\s+([\d,]+) of ([\d,]+)", text, re.M)
    assert written is not None, text
    complete, total = (int(g.replace(",", "")) for g in written.groups())
    assert complete == total >= 12, text  # the warm-up's requests and the measured ones
