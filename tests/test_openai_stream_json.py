"""The stream reader's JSON read (``_openai_stream._json``) is ``json.loads``: the same value or the same refusal
for any bytes, whether they take its direct scan (compact UTF-8, what servers send) or the fallback."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.telemetry._openai_stream import _json

VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                      lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=8)


def outcome(read: object, data: bytes) -> str:
    """What a reader makes of ``data``: the value's repr (NaN compares by its text), or a refusal."""
    try:
        return repr(read(data))  # type: ignore[operator]
    except ValueError:
        return "refused"


@settings(max_examples=400)
@given(VALUES, st.sampled_from(["", " ", "\t", "\n"]), st.sampled_from(["", " ", "\r\n", " x", "}", "\u00a0", "{}"]))
def test_a_json_text_reads_as_json_loads_reads_it(value: object, head: str, tail: str) -> None:
    data = (head + json.dumps(value) + tail).encode()
    assert outcome(_json, data) == outcome(json.loads, data)


@settings(max_examples=400)
@given(st.binary(max_size=64))
def test_any_bytes_read_as_json_loads_reads_them(data: bytes) -> None:
    assert outcome(_json, data) == outcome(json.loads, data)


def test_the_edges_json_loads_decides() -> None:
    for data in (b'{"a":1}{"b":2}', b'\xff\xfe{\x00}\x00', b"NaN", b"[1,", b'"\\ud800"', b'{"a":1}\n\n', b"",
                 b'\xef\xbb\xbf{"a":1}', b'{"a":1}\x00'):
        assert outcome(_json, data) == outcome(json.loads, data), data
