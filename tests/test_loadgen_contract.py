"""The attempt -> summary row mapping, one test per row of the wire contract's table, against a small ASGI server
of these tests (tests/_loadgen_server.py) under a real uvicorn on 127.0.0.1; every row validates."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from llmslo.loadgen import Behaviours, Cancel, LoadConfig, Target, make_breaker
from llmslo.tests._loadgen_server import ServerProcess
from llmslo.tests._loadgen_util import MODEL, at, only, run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as srv:
        yield srv


def _outcome(row: dict[str, Any]) -> tuple[str, str | None, str | None]:
    return row["finish_reason"], row["reject_reason"], row["error_type"]


# ---- finished replies ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "finish"), [({}, "length"), ({"finish": "stop"}, "stop"),
                                              ({"finish": "eos_token"}, "stop")])
def test_a_stream_that_finishes_stop_or_length_is_recorded_so(server: ServerProcess, mode: dict[str, str],
                                                               finish: str) -> None:
    row, entry = only(server.url(**mode))
    assert _outcome(row) == (finish, None, None)
    assert row["generated_tokens"] == row["sent_tokens"] == 8          # usage.completion_tokens
    assert row["prompt_tokens"] == 4                                   # usage.prompt_tokens: the server's word
    assert 0 < row["ttft_s"] <= row["last_token_s"] <= row["e2e_s"]
    assert row["client_ttft_s"] == row["ttft_s"] and row["client_e2e_s"] == row["e2e_s"]
    assert row["queue_s"] is None and len(row["itl_s"]) == 7
    assert entry["saw_done"] and entry["server_request_id"] == row["request_id"]
    assert len(entry["chunk_ns"]) == 8 and entry["chunk_ns"] == sorted(entry["chunk_ns"])
    assert row["itl_s"] == pytest.approx([(b - a) / 1e9 for a, b in itertools.pairwise(entry["chunk_ns"])])


def test_without_usage_the_tokens_are_the_chunks_counted(server: ServerProcess) -> None:
    result, entries = run(server.url(usage=0, tokens=5), at(0.0, output=9))
    row = result.rows[0]
    assert row["generated_tokens"] == row["sent_tokens"] == 5 and entries[0]["usage_completion_tokens"] is None
    assert entries[0]["token_source"] == "chunks"
    assert (result.tokens.replies, result.tokens.from_usage, result.tokens.counted_chunks) == (1, 0, 1)
    assert result.tokens.describe().startswith("tokens: counted content chunks (no usage in 1 of 1 replies")


def test_a_chunk_of_k_tokens_gives_k_gaps_of_a_kth(server: ServerProcess) -> None:
    row, entry = only(server.url(k=3, per_chunk_usage=1, tokens=9, tps=200))
    chunks = entry["chunk_ns"]
    assert entry["chunk_tokens"] == [3, 3, 3] and row["generated_tokens"] == 9
    expected = [g for a, b in itertools.pairwise(chunks) for g in [(b - a) / 3e9] * 3]
    assert row["itl_s"] == pytest.approx(expected)


def test_the_chat_endpoint_and_its_role_chunk(server: ServerProcess) -> None:
    row, entry = only(server.url(), endpoint="chat")
    assert _outcome(row) == ("length", None, None) and row["generated_tokens"] == 8
    assert len(entry["chunk_ns"]) == 8
    assert server.stats(row["request_id"])["body"]["messages"][0]["content"].split()[0] == "r0"


def test_a_whole_reply_without_streaming(server: ServerProcess) -> None:
    row, _ = only(server.url(), stream=False)
    assert _outcome(row) == ("length", None, None) and row["generated_tokens"] == 8
    assert row["ttft_s"] == row["last_token_s"] and row["itl_s"] is None
    assert server.stats(row["request_id"])["body"]["stream"] is False


def test_crlf_line_ends_comments_and_a_malformed_event_are_read_defensively(server: ServerProcess) -> None:
    result, entries = run(server.url(crlf=1, malformed=1), at(0.0))
    assert _outcome(result.rows[0]) == ("length", None, None) and result.rows[0]["generated_tokens"] == 8
    assert entries[0]["malformed_events"] == 1 and result.malformed_events == 1


# ---- drains and deadlines --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [{"drain_after": 3}, {"error_after": 3, "error_type": "server_draining"}])
def test_a_drained_stream_is_server_draining(server: ServerProcess, mode: dict[str, object]) -> None:
    row, entry = only(server.url(**mode))
    assert _outcome(row) == ("server_draining", None, None)
    assert row["generated_tokens"] == row["sent_tokens"] == 3
    if "drain_after" in mode:
        assert entry["drain_reason"] == "idle"


def test_an_error_event_of_type_deadline_is_deadline(server: ServerProcess) -> None:
    row, entry = only(server.url(error_after=2, error_type="deadline"))
    assert _outcome(row) == ("deadline", None, None) and row["generated_tokens"] == 2
    assert entry["server_error"] == "deadline"


# ---- the client hangs up ---------------------------------------------------------------------------------


def test_a_cancel_hangs_up_after_its_delay_and_the_server_sees_it(server: ServerProcess) -> None:
    row, entry = only(server.url(tps=20, tokens=40), behaviours=Behaviours(cancel=Cancel(1.0, 0.3)))
    assert _outcome(row) == ("client_cancel", None, None) and entry["hangup"] == "cancel"
    assert 0 < row["generated_tokens"] == row["sent_tokens"] < 40
    assert row["e2e_s"] >= 0.3 and row["client_e2e_s"] <= row["e2e_s"]
    assert server.wait_for(row["request_id"], "disconnected")["disconnected"] is True


def test_a_client_timeout_hangs_up_before_any_byte(server: ServerProcess) -> None:
    row, entry = only(server.url(headers_delay=3), behaviours=Behaviours(timeout_s=0.2))
    assert _outcome(row) == ("client_cancel", None, None) and entry["hangup"] == "timeout"
    assert row["ttft_s"] is None and row["generated_tokens"] == 0
    assert row["client_e2e_s"] is None and row["e2e_s"] >= 0.2   # nothing received: no last byte


# ---- refusals --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "reason"), [
    ({"status": 429, "type": "queue_full"}, "queue_full"),
    ({"status": 429, "type": "rate_limited", "retry_after": 1}, "rate_limited"),
    ({"status": 503, "type": "draining", "retry_after": 2}, "draining"),
    ({"status": 503, "type": "circuit_open"}, "circuit_open"),
    ({"status": 429}, "rate_limited"),
    ({"status": 429, "type": "too_many"}, "rate_limited"),
])
def test_a_refusal_is_rejected_with_its_reason(server: ServerProcess, mode: dict[str, object], reason: str) -> None:
    row, entry = only(server.url(**mode))
    assert _outcome(row) == ("rejected", reason, None)
    assert row["ttft_s"] is None and row["generated_tokens"] == row["sent_tokens"] == 0
    assert entry["status"] == mode["status"]
    assert entry["retry_after"] == (str(mode["retry_after"]) if "retry_after" in mode else None)
    assert entry["server_request_id"] == row["request_id"]


@pytest.mark.parametrize("status", [429, 504])
def test_an_answer_that_says_deadline_finishes_deadline(server: ServerProcess, status: int) -> None:
    # llmslo serve answers a queue timeout 429 + Retry-After and a request timeout 504, both of type deadline.
    row, _ = only(server.url(status=status, type="deadline"))
    assert _outcome(row) == ("deadline", None, None)
    assert row["ttft_s"] is None and row["generated_tokens"] == 0


def test_the_client_breaker_refuses_without_sending(server: ServerProcess) -> None:
    cfg = LoadConfig(Target.parse(server.url()), MODEL)
    breaker = make_breaker(cfg)
    assert breaker.honour_retry_after(30)
    result, entries = run(server.url(), at(0.0), client_breaker=breaker)
    row = result.rows[0]
    assert _outcome(row) == ("rejected", "circuit_open", None)
    assert row["client_e2e_s"] is None and row["client_ttft_s"] is None and row["e2e_s"] == 0
    assert entries[0]["sent_ns"] is None and entries[0]["breaker_refused"] is True
    assert server.stats(row["request_id"]) == {}          # the server never heard of it
    assert result.sent == 0 and result.refused == 1


# ---- errors ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "error_type"), [
    ({"status": 503}, "http_503"),
    ({"status": 503, "type": "overloaded"}, "http_503"),
    ({"status": 500}, "http_500"),
    ({"status": 404, "type": "model_not_found"}, "http_404"),
    ({"error_after": 2, "error_type": "engine_error"}, "stream_error"),
    ({"truncate_after": 3}, "truncated"),
    ({"finish": "none"}, "truncated"),
    ({"reset_after": 3}, "read_error"),
])
def test_an_error_gets_its_bounded_type(server: ServerProcess, mode: dict[str, object], error_type: str) -> None:
    row, _ = only(server.url(**mode))
    assert _outcome(row) == ("error", None, error_type)


def test_a_closed_port_is_a_connect_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        row, entry = only(f"http://127.0.0.1:{port}")
    assert _outcome(row) == ("error", None, "connect_error")
    assert row["client_e2e_s"] is None and entry["status"] is None and "Connect" in entry["transport_error"]


# ---- what every request carries ------------------------------------------------------------------------


def test_every_request_carries_its_id_tenant_class_key_and_limits(server: ServerProcess) -> None:
    result, _ = run(server.url(), at(0.0, 0.01, output=5), tenant_class="batch", api_key="sk-test", version="v9",
                    ignore_eos=True)
    for row in result.rows:
        seen = server.stats(row["request_id"])
        assert seen["headers"]["x-request-id"] == row["request_id"]
        assert seen["headers"]["x-tenant-class"] == "batch"
        assert seen["headers"]["authorization"] == "Bearer sk-test"
        assert seen["headers"]["user-agent"].startswith("llmslo-load/")
        body = seen["body"]
        assert body["max_tokens"] == 5 and body["ignore_eos"] is True and body["model"] == MODEL
        assert body["stream_options"] == {"include_usage": True} and len(body["prompt"].split()) == 4
        assert (row["tenant_class"], row["version"], row["model"]) == ("batch", "v9", MODEL)
    assert len({r["request_id"] for r in result.rows}) == 2
