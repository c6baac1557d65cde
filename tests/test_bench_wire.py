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


def frame(sport: int, payload: bytes, proto: int = 6) -> bytes:
    """An Ethernet-framed IPv4 segment (TCP unless ``proto`` says otherwise) from ``sport`` carrying ``payload``."""
    tcp = struct.pack("!HHIIBBHHH", sport, 40000, 1, 1, 5 << 4, 0x18, 65535, 0, 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp) + len(payload), 0, 0, 64, proto, 0,
                     bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1]))
    return b"\x00" * 12 + b"\x08\x00" + ip + tcp + payload


def test_a_segment_gives_its_source_port_and_payload_and_anything_else_none() -> None:
    assert _tcp_payload(frame(8001, EVENT)) == (8001, EVENT)
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


def test_the_proxys_hold_of_a_first_event_is_read_off_the_wire(capture_allowed: None) -> None:
    """An upstream sends one event; a stand-in proxy reads it, holds it HOLD_S, passes it to its client. On the
    wire, the proxy's packet leaves at least HOLD_S after the upstream's, and the capture says so for that id."""
    upstream, proxy = _listener(), _listener()
    up_port, proxy_port = upstream.getsockname()[1], proxy.getsockname()[1]

    def engine(conn: socket.socket) -> None:
        conn.recv(100)
        conn.sendall(EVENT)

    def forward(conn: socket.socket) -> None:
        conn.recv(100)
        with socket.create_connection(("127.0.0.1", up_port)) as up:
            up.sendall(b"go")
            data = up.recv(len(EVENT))
            time.sleep(HOLD_S)
            conn.sendall(data)

    with WireCapture({up_port, proxy_port}) as cap:
        threads = [_serve_once(upstream, engine), _serve_once(proxy, forward)]
        with socket.create_connection(("127.0.0.1", proxy_port)) as client:
            client.sendall(b"go")
            assert client.recv(len(EVENT)) == EVENT
        for thread in threads:
            thread.join(timeout=10)
        time.sleep(0.2)  # the capture reads what is queued before it stops
    for sock in (upstream, proxy):
        sock.close()
    holds = cap.holds(up_port, proxy_port)
    assert list(holds) == ["2f1c9a7e-1d2b-4c3d-8e4f-5a6b7c8d9e0f"]
    assert HOLD_S <= holds["2f1c9a7e-1d2b-4c3d-8e4f-5a6b7c8d9e0f"] < 5.0
    assert cap.packets == 2  # one packet with a payload from each watched port (the client's "go" is not watched)
