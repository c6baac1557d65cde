"""The benchmark of a request's start in the gateway (``bench/bench_gateway_start.py``): both cases run, and every
request reaches the stand-in backend (a gateway that refused them would start nothing and look cheap)."""

from __future__ import annotations

import re
import subprocess
import sys

from llmslo.bench.bench_gateway_start import measure, parts, request_bytes


def test_every_request_of_both_cases_reaches_the_backend() -> None:
    got = measure(50, 10)
    assert set(got) == {"floor", "gateway"}
    for case, (ns, writes) in got.items():
        assert writes == 50, case
        assert ns > 0, case


def test_the_request_is_one_whole_http_request_with_its_id() -> None:
    raw = request_bytes("abc-1")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"\r\nx-request-id: abc-1\r\n" in head
    assert f"content-length: {len(body)}".encode() in head


def test_the_command_prints_both_cases_and_the_ratio() -> None:
    out = subprocess.run([sys.executable, "-m", "llmslo.bench.bench_gateway_start", "--requests", "40", "--repeats",
                          "1", "--in-flight", "8", "--parts"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "floor: parse the head, write the request" in out.stdout and "beside the floor" in out.stdout
    assert re.search(r"gateway: parse, admit, route, write +\d+\.\d +\d+\.\d\dx$", out.stdout, re.M), out.stdout
    for part in ("the head's parse", "the body's parse and checks", "a tracker, started and finished",
                 "the route (a backend picked)", "the breaker's decision", "the garbage collector, per start",
                 "at the end: the limit's sample, 20 chunks", "at the end: the limit's sample, 200 chunks"):
        assert re.search(rf"^{re.escape(part)} +-?\d", out.stdout, re.M), (part, out.stdout)


def test_each_part_of_a_start_is_timed() -> None:
    got = parts(200)
    assert list(got) == ["the head's parse", "the body's parse and checks", "a tracker, started and finished",
                         "the route (a backend picked)", "the breaker's decision",
                         "at the end: the limit's sample, 20 chunks", "at the end: the limit's sample, 200 chunks"]
    assert all(us > 0 for us in got.values()), got

