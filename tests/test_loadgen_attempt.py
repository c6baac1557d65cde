"""Reading what a server sends, without a server: the SSE parser (any split of the bytes, CRLF, comments,
multi-line data), the classification of an attempt (first terminal signal wins), and the summary row an
attempt gives (tokens from usage or counted, token-weighted gaps, valid by the contract)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.loadgen import Attempt, Identity, SseParser, attempt_row, token_weighted_gaps
from llmslo.telemetry import validate_summary
from llmslo.telemetry._openai_stream import MAX_EVENT_BYTES, SseTooLarge

MS = 1_000_000


def _feed_all(parts: list[bytes]) -> list[bytes]:
    p = SseParser()
    return [payload for part in parts for payload in p.feed(part)]


STREAM = (b": comment\n\ndata: {\"a\": 1}\n\nevent: x\nid: 7\ndata: line1\ndata:line2\n\n"
          b"data: {\"b\": 2}\r\n\r\ndata: [DONE]\r\r")
PAYLOADS = [b'{"a": 1}', b"line1\nline2", b'{"b": 2}', b"[DONE]"]


def test_the_parser_reads_comments_fields_multiline_data_and_every_line_end() -> None:
    assert _feed_all([STREAM]) == PAYLOADS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_the_parser_gives_the_same_events_however_the_bytes_are_split(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    assert _feed_all([STREAM[a:b] for a, b in itertools.pairwise(points)]) == PAYLOADS


def test_an_endless_event_is_refused_not_held() -> None:
    p = SseParser()
    with pytest.raises(SseTooLarge):
        for _ in range(MAX_EVENT_BYTES // 65536 + 2):
            p.feed(b"x" * 65536)


def _chunk(text: str, finish: str | None = None, usage: int | None = None) -> bytes:
    obj: dict[str, object] = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = {"prompt_tokens": 3, "completion_tokens": usage}
    return json.dumps(obj).encode()


def _attempt(*events: tuple[int, bytes], status: int = 200, hangup: str | None = None) -> Attempt:
    a = Attempt("r-1", 0, 0.0, 3, 8, sent_unix_s=1.8e9, sent_ns=1000 * MS, status=status)
    a.first_byte_ns = 1001 * MS
    for t_ms, payload in events:
        a.on_payload(payload, t_ms * MS)
        a.last_byte_ns = t_ms * MS
    a.hangup_cause = hangup
    a.end_ns = (events[-1][0] + 5) * MS if events else 1010 * MS
    a.classify()
    return a


def _row(a: Attempt) -> dict[str, object]:
    row = attempt_row(a, Identity("m"))
    assert validate_summary(row) == []
    return row


def test_a_finish_reason_before_the_hang_up_decides_the_outcome() -> None:
    a = _attempt((1100, _chunk("x ")), (1200, _chunk("y ", "length")), hangup="cancel")
    assert a.finish_reason == "length"
    b = _attempt((1100, _chunk("x ")), hangup="cancel")
    assert b.finish_reason == "client_cancel"


def test_the_first_terminal_signal_wins() -> None:
    err = json.dumps({"error": {"type": "deadline"}}).encode()
    assert _attempt((1100, _chunk("x ")), (1150, err), (1200, _chunk("", "stop"))).finish_reason == "deadline"
    assert _attempt((1100, _chunk("x ", "stop")), (1150, err)).finish_reason == "stop"


@pytest.mark.parametrize(("reason", "finish", "error_type", "unknown"), [
    ("stop", "stop", None, False), ("eos_token", "stop", None, False), ("tool_calls", "stop", None, False),
    ("length", "length", None, False), ("server_draining", "server_draining", None, False),
    ("abort", "error", "stream_error", False), ("something_new", "stop", None, True),
])
def test_finish_reasons_servers_send_map_to_the_closed_set(reason: str, finish: str, error_type: str | None,
                                                           unknown: bool) -> None:
    a = _attempt((1100, _chunk("x ", reason)))
    assert (a.finish_reason, a.error_type, a.unknown_finish) == (finish, error_type, unknown)


def test_tokens_come_from_usage_and_sent_never_exceeds_generated() -> None:
    full = _row(_attempt((1100, _chunk("a ")), (1200, _chunk("b c ", "length")), (1201, _chunk("", None, 3))))
    assert (full["generated_tokens"], full["sent_tokens"], full["prompt_tokens"]) == (3, 3, 3)   # 2 chunks, 3 tokens
    assert full["itl_s"] == pytest.approx([0.1])        # the split of each chunk is unknown: one gap per chunk
    cut = _row(_attempt((1100, _chunk("a ")), (1200, _chunk("b ")), hangup="cancel"))
    assert (cut["finish_reason"], cut["generated_tokens"], cut["sent_tokens"]) == ("client_cancel", 2, 2)
    assert cut["e2e_s"] == pytest.approx(0.205) and cut["client_e2e_s"] == pytest.approx(0.2)


def test_a_reply_cut_after_its_usage_counts_only_the_tokens_that_arrived_as_sent() -> None:
    """The server's usage says 5 generated; 3 arrived and no finish reason came: sent 3 (waste 2)."""
    usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}}).encode()
    row = _row(_attempt((1100, _chunk("a ")), (1150, _chunk("b ")), (1200, _chunk("c ")), (1250, usage)))
    assert (row["finish_reason"], row["error_type"]) == ("error", "truncated")
    assert (row["generated_tokens"], row["sent_tokens"]) == (5, 3)


def test_per_chunk_usage_weights_the_gaps() -> None:
    a = _attempt((1100, _chunk("a ", None, 1)), (1300, _chunk("b c ", None, 3)), (1400, _chunk("d ", "stop", 4)))
    assert a.per_chunk_tokens() == [1, 2, 1]
    row = _row(a)
    assert row["itl_s"] == pytest.approx([0.1, 0.1, 0.1]) and row["generated_tokens"] == 4
    assert row["ttft_s"] == pytest.approx(0.1) and row["last_token_s"] == pytest.approx(0.4)


def test_gaps_without_counts_are_one_per_chunk() -> None:
    assert token_weighted_gaps([0, 10 * MS, 30 * MS], None) == pytest.approx([0.01, 0.02])
    assert token_weighted_gaps([0, 10 * MS, 30 * MS], [1, 2, 4]) == pytest.approx([0.005, 0.005] + [0.005] * 4)
    assert token_weighted_gaps([5], [1]) is None


def test_a_refusal_has_no_tokens_whatever_its_body_says() -> None:
    a = Attempt("r-2", 1, 0.0, 3, 8, sent_unix_s=1.8e9, sent_ns=1000 * MS, status=429)
    a.first_byte_ns = a.last_byte_ns = 1002 * MS
    a.end_ns = 1002 * MS
    a.usage_completion_tokens = 5
    a.classify(b'{"error": {"type": "queue_full", "message": "full"}}')
    row = _row(a)
    assert (row["finish_reason"], row["reject_reason"], row["generated_tokens"], row["ttft_s"]) == (
        "rejected", "queue_full", 0, None)


def test_tokens_sent_as_empty_text_get_the_finish_events_time() -> None:
    row = _row(_attempt((1100, _chunk("")), (1200, _chunk("", "stop", 2))))
    assert row["generated_tokens"] == 2 and row["ttft_s"] == row["last_token_s"] == pytest.approx(0.2)


@pytest.mark.parametrize("payload", [b"not json", b"[1, 2]", b'"text"', b"{\"choices\": 7}",
                                     b'{"choices": [{"text": 5}]}', b'{"usage": {"completion_tokens": -1}}'])
def test_whatever_a_server_sends_is_data_never_a_crash(payload: bytes) -> None:
    a = _attempt((1100, payload), (1200, _chunk("x ", "stop")))
    assert a.finish_reason == "stop"
    _row(a)


def test_an_attempt_sent_after_a_stop_hung_everything_up_is_hung_up_at_once() -> None:
    """The stop closed the hang-ups before this attempt registered: it is hung up as soon as it is in flight
    (a listening socket that never answers holds it otherwise)."""
    import asyncio
    import socket

    import httpx

    from llmslo.loadgen._attempt import HangUps, Request, send_attempt

    async def main(port: int) -> tuple[Attempt, HangUps]:
        hangups = HangUps()
        hangups.hang_up_all()
        a = Attempt("r-3", 0, 0.0, 1, 1)
        async with httpx.AsyncClient(trust_env=False) as client:
            await send_attempt(client, Request(f"http://127.0.0.1:{port}/v1/completions", b"{}", {}, True), a,
                               hangups)
        return a, hangups

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        a, hangups = asyncio.run(main(listener.getsockname()[1]))
    assert (a.finish_reason, a.hangup_cause, hangups.hung_up) == ("client_cancel", "stop", 1)
    assert _row(a)["client_e2e_s"] is None
