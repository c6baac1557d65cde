"""A failed attempt keeps why: the HTTP status and the first bytes of the body as received (an empty body as empty),
the class of the exception that broke the connection. The attempts log carries it, and the run's summary (text and
``--json``) lists the top causes with their counts under each finish reason, never a bare ``error: 10``."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmslo.loadgen import Attempt, Cause, top_causes
from llmslo.loadgen._attempt import ERROR_BODY_KEPT_BYTES, body_shown, keep_body, printable
from llmslo.tests._loadgen_server import ServerProcess
from llmslo.tests._loadgen_util import at, attempts_log, llmslo, only, run


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as srv:
        yield srv


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- the words of a cause ------------------------------------------------------------------------------------


def test_a_body_is_kept_literally_bounded_and_shown_on_one_line() -> None:
    assert keep_body(b"") == "" and body_shown("", 0) == "(empty body)"
    assert body_shown(None, 0, "ReadError") == "(body not read: ReadError)"
    long = b'{"error": "' + b"x" * 500 + b'"}'
    kept = keep_body(long)
    assert kept == long[:ERROR_BODY_KEPT_BYTES].decode() and len(kept) == 200
    assert body_shown(kept, len(long)).endswith("x…") and len(body_shown(kept, len(long))) == 101
    # a character cut by the limit is left out; bytes that are not UTF-8 are written as escapes
    assert keep_body("é".encode() * 150) == "é" * 100
    assert keep_body(b"\xff\xfeok") == "\\xff\\xfeok"
    # control characters never reach a terminal: escapes on one line
    assert printable("a\x1b[31mb\nc\td\u202e") == "a\\x1b[31mb\\nc\\td\\u202e"
    assert body_shown("line1\r\nline2", 12) == "line1\\r\\nline2"


def test_each_way_an_attempt_fails_has_its_cause() -> None:
    def attempt(**fields: object) -> Attempt:
        a = Attempt("r", 0, 0.0, 4, 8)
        for k, v in fields.items():
            setattr(a, k, v)
        a.classify()
        return a

    assert attempt(status=400, error_body="", error_body_bytes=0).cause() == "HTTP 400 (empty body)"
    busy = '{"error":"busy"}'
    assert attempt(status=503, error_body=busy, error_body_bytes=16).cause() == f"HTTP 503 {busy}"
    assert attempt(transport_error="connect_error", error_class="ConnectError").cause() == "ConnectError"
    assert attempt(transport_error="read_error", error_class="RemoteProtocolError").cause() == "RemoteProtocolError"
    assert attempt(breaker_refused=True).cause() == "refused by the client breaker (not sent)"
    assert attempt(status=200, terminal="error", server_error="engine\x1b").cause() == "error event: engine\\x1b"
    assert attempt(status=200, terminal="finish", server_finish_reason="abort").cause() == "finish_reason abort"
    assert attempt(status=200, hangup_cause="timeout").cause() == "client timeout (--timeout)"
    assert attempt(status=200).cause() == "the body ended without a finish reason"
    assert attempt(status=200, terminal="finish", server_finish_reason="stop").cause() is None


def test_top_causes_per_finish_reason_most_frequent_first_the_rest_together() -> None:
    causes = [Cause("error", f"HTTP 500 body {i}", i) for i in range(1, 9)] + [Cause("rejected", "x", 2)]
    top = top_causes(causes, limit=3)
    assert top["rejected"] == [("x", 2)]
    assert top["error"] == [("HTTP 500 body 8", 8), ("HTTP 500 body 7", 7), ("HTTP 500 body 6", 6),
                            ("5 other cause(s)", 15)]


# ---- what a run records --------------------------------------------------------------------------------------


def test_an_empty_400_is_recorded_as_empty_with_its_status(server: ServerProcess) -> None:
    row, entry = only(server.url(status=400, body_hex=""))
    assert (row["finish_reason"], row["error_type"]) == ("error", "http_400")
    assert entry["cause"] == "HTTP 400 (empty body)"
    assert entry["status"] == 400 and entry["error_body"] == "" and entry["error_body_bytes"] == 0
    # the answer (its headers) arrived: the attempt ended then, on the client's clock
    assert row["client_e2e_s"] is not None and row["client_e2e_s"] == row["e2e_s"]


def test_a_body_is_kept_as_received_and_its_control_characters_escaped_in_the_cause(server: ServerProcess) -> None:
    body = b"upstream \x1b[31mfailed\x1b[0m\nretry later"
    _, entry = only(server.url(status=502, body_hex=body.hex()))
    assert entry["error_body"] == body.decode() and entry["error_body_bytes"] == len(body)
    assert entry["cause"] == "HTTP 502 upstream \\x1b[31mfailed\\x1b[0m\\nretry later"


def test_a_connection_error_keeps_its_class() -> None:
    row, entry = only(f"http://127.0.0.1:{_closed_port()}")
    assert row["error_type"] == "connect_error" and entry["error_class"] == "ConnectError"
    assert entry["cause"] == "ConnectError" and entry["transport_error"].startswith("ConnectError: ")


def test_a_run_counts_its_causes(server: ServerProcess) -> None:
    result, _ = run(server.url(status=503), at(0.0, 0.01, 0.02), breaker=False)
    (cause,) = result.causes
    assert (cause.finish_reason, cause.count) == ("error", 3)
    assert cause.cause.startswith('HTTP 503 {"error": {"message": "refused with 503"')
    assert result.to_dict()["causes"] == {"error": [{"cause": cause.cause, "count": 3}]}


# ---- the summary of the installed command ----------------------------------------------------------------------


def test_the_summary_says_why_ten_of_ten_failed(tmp_path: Path, server: ServerProcess) -> None:
    ran = llmslo("load", server.url(status=400, body_hex=""), "--rate", "50", "--max-requests", "10",
                 "--attempts-log", "attempts.jsonl", "--no-progress", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    at_error = lines.index("  error:                                     10")
    assert lines[at_error + 1] == "    10 × HTTP 400 (empty body)"
    assert all(e["cause"] == "HTTP 400 (empty body)" for e in attempts_log(tmp_path / "attempts.jsonl"))
    ran = llmslo("load", server.url(status=400, body_hex=""), "--rate", "50", "--max-requests", "10", "--json",
                 cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    doc = json.loads(ran.stdout)
    assert doc["run"]["causes"] == {"error": [{"cause": "HTTP 400 (empty body)", "count": 10}]}


def test_the_summary_shows_several_causes_with_counts_and_bodies_literally(tmp_path: Path,
                                                                          server: ServerProcess) -> None:
    """503s with a JSON body trip the client breaker after 5 failures (how many are sent before it opens depends
    on timing): each finish reason lists its cause with a count that adds up. Hostile text in a body is shown
    literally (no markup, no escape sequence reaches the terminal)."""
    ran = llmslo("load", server.url(status=503), "--rate", "100", "--max-requests", "8", "--no-progress",
                 cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    counts = {m.group(1): int(m.group(2)) for line in lines if (m := re.fullmatch(r"  (\w+): +(\d+)", line))}
    assert counts["error"] >= 5 and counts["error"] + counts.get("rejected", 0) == 8, ran.stdout
    assert (f'    {counts["error"]} × HTTP 503 {{"error": {{"message": "refused with 503", "code": 503}}}}'
            in lines), ran.stdout
    if counts.get("rejected"):
        assert f'    {counts["rejected"]} × refused by the client breaker (not sent)' in lines
    hostile = b'[link=https://evil.example]x[/link] \x1b[31m{"error":"x"}'
    ran = llmslo("load", server.url(status=500, body_hex=hostile.hex()), "--rate", "100", "--max-requests", "2",
                 "--no-progress", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert '    2 × HTTP 500 [link=https://evil.example]x[/link] \\x1b[31m{"error":"x"}' in ran.stdout, ran.stdout
    assert "\x1b" not in ran.stdout
