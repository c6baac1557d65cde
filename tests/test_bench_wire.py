"""The gateway benchmark's wire capture (``bench/_wire.py``): a stream's first event is found in the packets an
upstream and a proxy send on the loopback interface, and the proxy's hold of it is the difference of their kernel
timestamps. A real capture needs root or CAP_NET_RAW (the tests skip, saying so, without it)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from llmslo.bench._wire import EVENT_ID, WireCapture, WireUnavailable, _tcp_payload

EVENT = b'data: {"id": "chatcmpl-2f1c9a7e-1d2b-4c3d-8e4f-5a6b7c8d9e0f", "object": "chat.completion.chunk"}\n\n'
HOLD_S = 0.05
"""How long the stand-in proxy holds the event before passing it on, seconds."""


def frame(sport: int, payload: bytes, proto: int = 6, dport: int = 40000) -> bytes:
    """An Ethernet-framed IPv4 segment (TCP unless ``proto`` says otherwise) from ``sport`` to ``dport`` carrying
    ``payload``."""
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 1, 1, 5 << 4, 0x18, 65535, 0, 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp) + len(payload), 0, 0, 64, proto, 0,
                     bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1]))
    return b"\x00" * 12 + b"\x08\x00" + ip + tcp + payload


def test_a_segment_gives_its_source_port_and_payload_and_anything_else_none() -> None:
    assert _tcp_payload(frame(8001, EVENT)) == (8001, 40000, EVENT)
    assert _tcp_payload(frame(8001, b"")) is None  # an ACK: no payload
    assert _tcp_payload(frame(8001, EVENT, proto=17)) is None  # UDP
    assert _tcp_payload(b"\x00" * 12 + b"\x86\xdd" + frame(8001, EVENT)[14:]) is None  # not IPv4
    assert _tcp_payload(frame(8001, EVENT)[:40]) is None  # cut short


def test_the_request_id_is_read_from_the_events_response_id() -> None:
    found = [m.group(1) for m in EVENT_ID.finditer(b"1a3\r\n" + EVENT + EVENT.replace(b"chatcmpl-2f", b"cmpl-3e"))]
    assert found == [b"2f1c9a7e-1d2b-4c3d-8e4f-5a6b7c8d9e0f", b"3e1c9a7e-1d2b-4c3d-8e4f-5a6b7c8d9e0f"]
    assert EVENT_ID.search(b'data: {"object": "x", "id": "chatcmpl-1"}') is None  # not an event's first field


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


def _serve_once(listener: socket.socket, handle: object) -> threading.Thread:
    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            handle(conn)  # type: ignore[operator]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def capture_allowed() -> Iterator[None]:
    try:
        with WireCapture(()):
            pass
    except WireUnavailable as exc:
        pytest.skip(f"no packet capture here: {exc}")
    yield


HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-request-id: 2f1c9a7e-1d2b-4c3d-8e4f-5a6b7c8d9e0f\r\n"
        b"content-length: 4\r\n\r\n")
BODY = b"{}\r\n"
GAP_S = 0.5
"""How long the client waits between its request's head and its body, seconds."""


def test_a_request_ends_with_the_last_packet_its_connection_carried_before_the_next_requests_head() -> None:
    cap = WireCapture({8000})
    cap._request_packet(8000, 50001, b"body of a request whose head was not seen", 1.0)
    cap._request_packet(8000, 50001, HEAD, 2.0)
    cap._request_packet(8000, 50001, BODY, 3.0)
    cap._request_packet(8000, 50002, b"other connection", 4.0)
    cap._request_packet(8000, 50001, HEAD.replace(b"2f1c", b"3e1c"), 5.0)
    cap._request_packet(8000, 50001, BODY, 6.0)
    cap._request_packet(8000, 50001, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n", 7.0)  # no id: owned by none
    cap._request_packet(8000, 50001, b"more of that health check", 8.0)
    assert cap.request_end[8000] == {"2f1c9a7e-1d2b-4c3d-8e4f-5a6b7c8d9e0f": 3.0,
                                     "3e1c9a7e-1d2b-4c3d-8e4f-5a6b7c8d9e0f": 6.0}


def test_the_proxys_holds_of_a_request_and_of_its_first_event_are_read_off_the_wire(capture_allowed: None) -> None:
    """A client sends a request's head, then GAP_S later its body; a stand-in proxy reads the whole request,
    holds it HOLD_S and sends it on in one packet; the upstream answers one event, which the proxy holds HOLD_S
    before passing it on. On the wire, each hold is at least HOLD_S, and the request's counts from the client's
    last packet (the body), not its first (the head)."""
    upstream, proxy = _listener(), _listener()
    up_port, proxy_port = upstream.getsockname()[1], proxy.getsockname()[1]

    def engine(conn: socket.socket) -> None:
        got = b""
        while not got.endswith(BODY):
            got += conn.recv(1000)
        conn.sendall(EVENT)

    def forward(conn: socket.socket) -> None:
        got = b""
        while not got.endswith(BODY):
            got += conn.recv(1000)
        time.sleep(HOLD_S)
        with socket.create_connection(("127.0.0.1", up_port)) as up:
            up.sendall(got)
            data = up.recv(len(EVENT))
            time.sleep(HOLD_S)
            conn.sendall(data)

    with WireCapture({up_port, proxy_port}) as cap:
        threads = [_serve_once(upstream, engine), _serve_once(proxy, forward)]
        with socket.create_connection(("127.0.0.1", proxy_port)) as client:
            client.sendall(HEAD)
            time.sleep(GAP_S)
            client.sendall(BODY)
            assert client.recv(len(EVENT)) == EVENT
        for thread in threads:
            thread.join(timeout=10)
        time.sleep(0.2)  # the capture reads what is queued before it stops
    for sock in (upstream, proxy):
        sock.close()
    rid = "2f1c9a7e-1d2b-4c3d-8e4f-5a6b7c8d9e0f"
    holds, requests = cap.holds(up_port, proxy_port), cap.request_holds(up_port, proxy_port)
    assert list(holds) == [rid] and HOLD_S <= holds[rid] < 5.0
    assert list(requests) == [rid] and HOLD_S <= requests[rid] < GAP_S
    # from each watched port one packet with a payload; to them the client's two and the proxy's one
    assert cap.packets == 5
