"""ReplyObserver's per-chunk shortcut: a plain content chunk that differs from the one learnt only in its text is
counted without parsing, one at a time or several in one body, and learnt anew when the first chunk carried the
role as well."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmslo.telemetry import Telemetry
from llmslo.telemetry import _reply_observer as R


def chunk(text: str, role: bool = False, finish: str | None = None) -> bytes:
    delta: dict[str, Any] = {"content": text}
    if role:
        delta = {"role": "assistant", **delta}
    event = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def test_plain_chunks_skip_the_parse_after_a_first_chunk_that_carried_the_role(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[bytes] = []
    real = R.read_event
    monkeypatch.setattr(R, "read_event", lambda payload: parsed.append(payload) or real(payload))
    tel = Telemetry()
    t = tel.start("r1", model="m")
    obs = R.ReplyObserver(t)
    obs.start(200, b"text/event-stream")
    bodies = [chunk("Hello", role=True), *(chunk(f" w{i}") for i in range(20))]
    for body in bodies:  # one event per body, as most servers write them
        if not obs.plain(body):
            obs.body(body, False)
    several = b"".join(chunk(f" x{i}") for i in range(5)) + chunk("", finish="stop") + b"data: [DONE]\n\n"
    obs.body(several, True)  # several events in one body, as a fast engine's reads hold them
    obs.complete()
    assert t.generated_tokens == 26 and t.finish_reason == "stop"
    # parsed: the role chunk, the first plain one (learnt from), then the finish event and [DONE] only
    assert len(parsed) == 4, [p[:40] for p in parsed]


def test_a_chunk_whose_text_holds_a_quote_is_parsed_not_counted_blindly() -> None:
    tel = Telemetry()
    t = tel.start("r2", model="m")
    obs = R.ReplyObserver(t)
    obs.start(200, b"text/event-stream")
    for body in (chunk("a"), chunk("b")):
        if not obs.plain(body):
            obs.body(body, False)
    tricky = chunk('say "hi"')
    assert not obs.plain(tricky)  # the quote breaks the shape: read it
    obs.body(tricky + chunk("c"), False)
    assert t.generated_tokens == 4


# ---- error bodies: one reading for every front door ----------------------------------------------------------

ERROR_BODIES: list[tuple[bytes, str | None]] = [
    (b'{"error": {"type": "queue_full", "message": "full"}}', "queue_full"),      # OpenAI's, llmslo's own
    (b'{"error": "queue_full"}', "queue_full"),                                   # a bare string
    (b'{"error": "Model is overloaded", "error_type": "overloaded"}', "overloaded"),  # TGI's
    (b'{"object": "error", "message": "x", "type": "BadRequestError", "code": 400}', "BadRequestError"),  # vLLM's
    (b'{"object": "error", "message": "no room"}', "no room"),
    (b'{"detail": "Not Found"}', None),
    (b"not json", None),
    (b"", None),
]


@pytest.mark.parametrize(("body", "kind"), ERROR_BODIES)
def test_an_error_body_reads_the_same_for_the_load_generator_and_the_observer(body: bytes, kind: str | None) -> None:
    from llmslo.loadgen import Attempt
    from llmslo.telemetry._openai_stream import read_reply

    assert (read_reply(body).error if body else None) == kind
    expected = ("rejected", kind) if kind == "queue_full" else ("error", None)
    a = Attempt("r-err", 1, 0.0, 3, 8, sent_unix_s=1.8e9, sent_ns=1, status=503)
    a.classify(body)  # what the load generator records for the same refusal
    assert (a.finish_reason, a.reject_reason) == expected
    tel = Telemetry()
    t = tel.start("r-err", model="m")
    obs = R.ReplyObserver(t)
    obs.start(503, b"application/json")
    obs.body(body, True)
    obs.complete()
    assert (t.finish_reason, t.reject_reason) == expected


def test_an_error_event_in_vllms_older_shape_ends_the_stream() -> None:
    tel = Telemetry()
    t = tel.start("r-err", model="m")
    obs = R.ReplyObserver(t)
    obs.start(200, b"text/event-stream")
    obs.body(chunk("Hi", role=True), False)
    obs.body(b'data: {"object": "error", "message": "boom", "type": "InternalServerError", "code": 500}\n\n', False)
    obs.body(b"data: [DONE]\n\n", True)
    obs.complete()
    assert (t.finish_reason, obs.error) == ("error", "InternalServerError")


@pytest.mark.parametrize("body", [
    b'{"error": {"type": "queue_full", "message": "full"}}',
    b'{"error": "queue_full"}',
    b'{"error": "the queue is full", "error_type": "queue_full"}',
    b'{"object": "error", "message": "the queue is full", "type": "queue_full", "code": 503}',
])
def test_a_refusal_in_every_shape_is_rejected_with_its_reason_by_the_load_generator_and_the_observer(
        body: bytes) -> None:
    from llmslo.loadgen import Attempt

    a = Attempt("r-err", 1, 0.0, 3, 8, sent_unix_s=1.8e9, sent_ns=1, status=503)
    a.classify(body)
    tel = Telemetry()
    t = tel.start("r-err", model="m")
    obs = R.ReplyObserver(t)
    obs.start(503, b"application/json")
    obs.body(body, True)
    obs.complete()
    assert (a.finish_reason, a.reject_reason) == (t.finish_reason, t.reject_reason) == ("rejected", "queue_full")
