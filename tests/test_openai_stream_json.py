"""The stream reader's JSON read (``_openai_stream.json_value``, also the gateway's read of a request body) is
``json.loads``: the same value or the same refusal, its message included (the gateway shows it in its 400), for
any bytes, whether they take its direct scan (compact UTF-8, what servers and clients send) or the fallback."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.telemetry._openai_stream import json_value

VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                      lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=8)


def outcome(read: object, data: bytes) -> str:
    """What a reader makes of ``data``: the value's repr (NaN compares by its text), or its refusal and message."""
    try:
        return repr(read(data))  # type: ignore[operator]
    except ValueError as exc:  # UnicodeDecodeError included
        return f"refused: {type(exc).__name__}: {exc}"


@settings(max_examples=400)
@given(VALUES, st.sampled_from(["", " ", "\t", "\n"]), st.sampled_from(["", " ", "\r\n", " x", "}", "\u00a0", "{}"]))
def test_a_json_text_reads_as_json_loads_reads_it(value: object, head: str, tail: str) -> None:
    data = (head + json.dumps(value) + tail).encode()
    assert outcome(json_value, data) == outcome(json.loads, data)


@settings(max_examples=300, deadline=None)
@given(value=VALUES, pad=st.sampled_from(["", " ", "\n", " \t"]), tail=st.sampled_from(["", "x", "}", " 1"]),
       encoding=st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32"]))
def test_a_json_text_in_any_encoding_json_loads_takes_reads_as_it_reads_it(value: object, pad: str, tail: str,
                                                                          encoding: str) -> None:
    data = (pad + json.dumps(value) + pad + tail).encode(encoding)
    assert outcome(json_value, data) == outcome(json.loads, data)


@settings(max_examples=400)
@given(st.binary(max_size=64))
def test_any_bytes_read_as_json_loads_reads_them(data: bytes) -> None:
    assert outcome(json_value, data) == outcome(json.loads, data)


def test_the_edges_json_loads_decides() -> None:
    for data in (b'{"a":1}{"b":2}', b'\xff\xfe{\x00}\x00', b"NaN", b"[1,", b'"\\ud800"', b'{"a":1}\n\n', b"",
                 b'\xef\xbb\xbf{"a":1}', b'{"a":1}\x00'):
        assert outcome(json_value, data) == outcome(json.loads, data), data
