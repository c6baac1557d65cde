"""``events_end`` and ``raw_events`` (what a proxy uses to pass events on as they came) frame an event stream as
``SseParser`` reads it: the same events, whatever the line ends (LF, CR LF, CR) and however the bytes are split."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.telemetry._openai_stream import SseParser, events_end, raw_events

LINE_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])
LINE = st.sampled_from([b"data: {\"a\": 1}", b"data:x", b": comment", b"event: e", b"id: 7", b"data: [DONE]",
                        b"data: {\"choices\": [], \"usage\": {}}", b"data:", b"retry: 5"])


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    """Events of one to three lines, each line end drawn alone, sometimes a blank line of no event between."""
    out = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()) and draw(st.booleans()):
            out.append(draw(LINE_ENDS))  # a blank line of no event
        for _ in range(draw(st.integers(1, 3))):
            out.append(draw(LINE) + draw(LINE_ENDS))
        out.append(draw(LINE_ENDS))
    if draw(st.booleans()):
        out.append(draw(LINE))  # a last event not complete
    return b"".join(out)


def parsed(data: bytes) -> list[bytes]:
    return SseParser().feed(data)


@settings(max_examples=400, deadline=None)
@given(streams())
def test_the_raw_events_are_the_parsers_events_as_they_came(data: bytes) -> None:
    events, rest = raw_events(data)
    assert b"".join(events) + rest == data
    assert [p for e in events for p in parsed(e)] == parsed(data)  # each event read alone says the same
    assert parsed(rest) == []  # the rest completes no event
    end = events_end(data)
    if not events:
        assert end == -1
    else:  # the last blank line may take a line end of the one before it (LF LF LF): only line ends between
        whole = len(data) - len(rest)
        assert whole <= end and data[whole:end].strip(b"\r\n") == b""


@settings(max_examples=300, deadline=None)
@given(streams(), st.data())
def test_the_last_events_end_is_where_a_parser_fed_that_far_has_read_every_event(data: bytes,
                                                                                 draw: st.DataObject) -> None:
    cut = draw.draw(st.integers(0, len(data)))
    prefix = data[:cut]
    if prefix.endswith(b"\r") and data[cut:cut + 1] == b"\n":
        return  # a CR LF split in two: read as a line end once the LF comes (events_end's precondition)
    end = events_end(prefix)
    complete = parsed(prefix[:end]) if end >= 0 else []
    assert complete == parsed(prefix)


def test_a_cr_lf_is_one_line_end_not_two() -> None:
    assert events_end(b"data: a\r\n") == -1
    assert events_end(b"data: a\r\n\r\n") == len(b"data: a\r\n\r\n")
    assert raw_events(b"data: a\r\n\r\ndata: b\r") == ([b"data: a\r\n\r\n"], b"data: b\r")
    assert events_end(b"data: a\r\r") == len(b"data: a\r\r")
