"""The gateway's reading of a request head, as bytes: its results on good heads and every refusal of a bad one,
with its status and the line shown. (Its body is read by the stream reader's ``json_value``, tested against
``json.loads`` in ``test_openai_stream_json.py``.)"""

from __future__ import annotations

import pytest

from llmslo.gateway._http import HttpError, UpstreamError, _parse_head, parse_response_head


def test_the_head_is_read_as_bytes_with_lower_case_names_and_trimmed_values() -> None:
    head = (b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nX-Request-Id:  r-1 \r\nConnection: close\r\n"
            b"Content-Length: 12")
    req, length = _parse_head(head, 100)
    assert (req.method, req.target, req.path, req.keep_alive, length) == ("POST", "/v1/completions?x=1",
                                                                         "/v1/completions", False, 12)
    assert req.headers == [(b"host", b"a"), (b"x-request-id", b"r-1"), (b"connection", b"close"),
                           (b"content-length", b"12")]
    assert req.lines == [b"Host: a", b"X-Request-Id:  r-1 ", b"Connection: close", b"Content-Length: 12"]
    assert req.header_lines(frozenset({b"connection", b"host"})) == b"X-Request-Id:  r-1 \r\nContent-Length: 12\r\n"


@pytest.mark.parametrize(("head", "status", "says"), [
    (b"GET /\r\nHost: a", 400, "request line: expected 'METHOD /path HTTP/1.1', got 'GET /'"),
    (b"GET / HTTP/1.1\r\nHost a", 400, "request header: expected 'Name: value', got 'Host a'"),
    (b"GET / HTTP/1.1\r\n Host: a", 400, "request header: expected 'Name: value', got ' Host: a'"),
    (b"GET / HTTP/1.1\r\nContent-Length: 1x", 400, "Content-Length: expected a number of bytes, got b'1x'"),
    (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked", 411, "Transfer-Encoding: a chunked request body"),
    (b"GET / HTTP/1.1\r\nContent-Length: 101", 413, "body: 101 bytes is more than the limit of 100 bytes"),
    (b"GET / HTTP/1.1\r\nX-A: b\nX-Injected: c", 400,
     "request head: a CR, LF or NUL byte inside a line: 'X-A: b\\nX-Injected: c'"),
    (b"GET / HTTP/1.1\r\nX-A: b\rX-B: c", 400, "request head: a CR, LF or NUL byte inside a line: 'X-A: b\\rX-B: c'"),
    (b"GET /\0 HTTP/1.1\r\nX-A: b", 400, "request head: a CR, LF or NUL byte inside a line: 'GET /\\x00 HTTP/1.1'"),
])
def test_a_bad_head_is_refused_with_its_status_and_the_line_shown(head: bytes, status: int, says: str) -> None:
    with pytest.raises(HttpError) as caught:
        _parse_head(head, 100)
    assert caught.value.status == status and caught.value.message.startswith(says)


def test_any_byte_of_a_header_value_is_kept_as_it_came() -> None:
    req, _ = _parse_head(b"GET / HTTP/1.1\r\nX-Name: \xa0\xff\xfe ", 100)
    assert req.headers == [(b"x-name", b"\xa0\xff\xfe")]   # only ASCII whitespace is trimmed


@pytest.mark.parametrize(("value", "keep_alive", "options"), [
    (b"close", False, set()), (b"Keep-Alive", True, set()),
    (b"close, X-Hop", False, {b"x-hop"}), (b"Upgrade , keep-alive,", True, {b"upgrade"}), (b"X-Hop", True, {b"x-hop"}),
])
def test_the_connection_header_is_read_as_a_list_of_options(value: bytes, keep_alive: bool,
                                                            options: set[bytes]) -> None:
    req, _ = _parse_head(b"GET / HTTP/1.1\r\nConnection: " + value, 100)
    assert req.keep_alive is keep_alive and req.connection_options == options


@pytest.mark.parametrize(("value", "keep_alive", "options"), [
    (b"close", False, set()), (b"keep-alive, X-Hop", True, {b"x-hop"}), (b"X-Hop, close", False, {b"x-hop"}),
])
def test_a_backends_connection_header_is_read_the_same_way(value: bytes, keep_alive: bool,
                                                           options: set[bytes]) -> None:
    resp = parse_response_head(b"HTTP/1.1 200 OK\r\nConnection: " + value + b"\r\nX-Hop: s")
    assert resp.keep_alive is keep_alive and resp.connection_options == options


def test_a_backends_head_with_a_bare_lf_in_a_line_is_a_broken_response() -> None:
    with pytest.raises(UpstreamError, match=r"^response head: a CR, LF or NUL byte inside a line: 'X-A: b\\nX-B: c'$"):
        parse_response_head(b"HTTP/1.1 200 OK\r\nX-A: b\nX-B: c")
