"""The gateway's reading of a request, piece by piece: the head as bytes and the JSON body's quick path, each
equal to the plain reading it replaces (``json.loads``; the text head parser's results) on any input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.gateway._http import HttpError, _parse_head
from llmslo.gateway._proxy import _json_value

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                     max_leaves=12)


def _outcome(read: object, data: bytes) -> tuple[str, object]:
    try:
        return "value", read(data)  # type: ignore[operator]
    except (ValueError, UnicodeDecodeError) as exc:
        return type(exc).__name__, str(exc)


@settings(max_examples=300, deadline=None)
@given(value=_json, pad=st.sampled_from(["", " ", "\n", " \t"]), tail=st.sampled_from(["", "x", "}", " 1"]),
       encoding=st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32"]))
def test_the_quick_json_path_reads_every_body_as_json_loads_does(value: object, pad: str, tail: str,
                                                                  encoding: str) -> None:
    data = (pad + json.dumps(value) + pad + tail).encode(encoding)
    assert _outcome(_json_value, data) == _outcome(json.loads, data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_any_bytes_get_the_value_or_the_error_json_loads_gives(data: bytes) -> None:
    assert _outcome(_json_value, data) == _outcome(json.loads, data)


def test_the_head_is_read_as_bytes_with_lower_case_names_and_trimmed_values() -> None:
    head = (b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nX-Request-Id:  r-1 \r\nConnection: close\r\n"
            b"Content-Length: 12")
    req, length = _parse_head(head, 100)
    assert (req.method, req.target, req.path, req.keep_alive, length) == ("POST", "/v1/completions?x=1",
                                                                         "/v1/completions", False, 12)
    assert req.headers == [(b"host", b"a"), (b"x-request-id", b"r-1"), (b"connection", b"close"),
                           (b"content-length", b"12")]


@pytest.mark.parametrize(("head", "status", "says"), [
    (b"GET /\r\nHost: a", 400, "request line: expected 'METHOD /path HTTP/1.1', got 'GET /'"),
    (b"GET / HTTP/1.1\r\nHost a", 400, "request header: expected 'Name: value', got 'Host a'"),
    (b"GET / HTTP/1.1\r\n Host: a", 400, "request header: expected 'Name: value', got ' Host: a'"),
    (b"GET / HTTP/1.1\r\nContent-Length: 1x", 400, "Content-Length: expected a number of bytes, got b'1x'"),
    (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked", 411, "Transfer-Encoding: a chunked request body"),
    (b"GET / HTTP/1.1\r\nContent-Length: 101", 413, "body: 101 bytes is more than the limit of 100 bytes"),
])
def test_a_bad_head_is_refused_with_its_status_and_the_line_shown(head: bytes, status: int, says: str) -> None:
    with pytest.raises(HttpError) as caught:
        _parse_head(head, 100)
    assert caught.value.status == status and caught.value.message.startswith(says)


def test_any_byte_of_a_header_value_is_kept_as_it_came() -> None:
    req, _ = _parse_head(b"GET / HTTP/1.1\r\nX-Name: \xa0\xff\xfe ", 100)
    assert req.headers == [(b"x-name", b"\xa0\xff\xfe")]   # only ASCII whitespace is trimmed
