"""What a proxy adds to a first token, read off the loopback interface with the kernel's own timestamps.

A proxy's added TTFT, measured at the client, moves with everything else on the machine: the engine's step,
the load generator's own event loop, the proxy's CPU slowing the other two. On the wire it is two differences,
one each way:

- **the request**: the moment the proxy's last packet of a request reached the engine, less the moment the
  client's last packet of the same request reached the proxy (the engine cannot start before it has the whole
  request, and a proxy that reads the whole body before it forwards it holds the request at least that long);
- **the first event**: the moment the proxy's packet carrying a stream's first event leaves it, less the moment
  the engine's packet carrying the same event left the engine.

:class:`WireCapture` reads every packet on ``lo`` (a raw ``AF_PACKET`` socket, so root or ``CAP_NET_RAW``) and
keeps the outgoing copies of those sent from or to the ports it watches, with the kernel's timestamp
(``SO_TIMESTAMPNS``, taken when the packet was handed to the interface). From a watched port: per stream (the
request id in its events' ``"id": "chatcmpl-<request id>"``, as ``llmslo serve`` writes it), the first packet
that carries one of its events; the proxy forwards the engine's bytes unchanged, so the same event is found on
both sides. To a watched port: per connection, the request whose head carries ``X-Request-Id`` (as ``llmslo
load`` and the proxies send it) owns every packet until the next request's head, with an id or without (a
proxy's health check on a kept-alive connection; HTTP/1.1: one request at a time on a connection), and the last
of them is the request's end.

Standard library only; Linux only. Loopback packets are seen twice (as sent and as received): only the sent copy
is kept. An event split between two TCP segments before its id is not found (the stream is then left out, and
counted as missing by the caller).
"""

from __future__ import annotations

import math
import re
import socket
import struct
import threading
from collections.abc import Iterable, Sequence
from types import TracebackType

SO_TIMESTAMPNS = 35
"""``SO_TIMESTAMPNS`` (Linux): a ``struct timespec`` of the packet's arrival at the socket, as ancillary data."""
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
"""``sll_pkttype`` of a packet this host sent (the other copy of a loopback packet is ``PACKET_HOST``)."""
EVENT_ID = re.compile(rb'data: ?\{"id": ?"(?:chatcmpl|cmpl)-([A-Za-z0-9._:-]{1,128})"')
"""The start of a streamed event of ``llmslo serve`` (and of vLLM-shaped servers): its response id holds the
request id."""
REQUEST_LINE = re.compile(rb"[A-Z]{3,7} \S+ HTTP/1\.[01]\r\n")
"""The start of a request's head."""
REQUEST_ID = re.compile(rb"\r\n[Xx]-[Rr]equest-[Ii][Dd]: *([A-Za-z0-9._:-]{1,128})\r\n")
"""The request id header of a request's head."""
RECEIVE_BUFFER = 64 << 20
"""The capture socket's receive buffer, bytes: room for the packets of a busy second while the reader catches up."""


class WireUnavailable(RuntimeError):
    """Packets cannot be captured here (not Linux, or neither root nor ``CAP_NET_RAW``)."""


class WireCapture:
    """``with WireCapture(ports) as cap:`` captures until the block ends; then :attr:`first` holds, per source port,
    ``request id -> Unix seconds`` of the first packet sent from that port carrying one of the stream's events, and
    :attr:`request_end`, per destination port, ``request id -> Unix seconds`` of the last packet of the request
    sent to that port."""

    def __init__(self, ports: Iterable[int], interface: str = "lo") -> None:
        self.ports = frozenset(ports)
        self.interface = interface
        self.first: dict[int, dict[str, float]] = {p: {} for p in self.ports}
        self.request_end: dict[int, dict[str, float]] = {p: {} for p in self.ports}
        self._sending: dict[tuple[int, int], str] = {}
        """Per connection to a watched port (its port, the sender's): the request id its packets belong to now."""
        self.packets = 0
        """Outgoing packets with a payload, from or to a watched port."""
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> WireCapture:
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(ETH_P_ALL))
        except (AttributeError, PermissionError, OSError) as exc:
            raise WireUnavailable(f"no raw packet socket here ({exc}): run as root, or grant CAP_NET_RAW") from None
        try:
            sock.bind((self.interface, 0))
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            sock.settimeout(0.1)
        except OSError as exc:
            sock.close()
            raise WireUnavailable(f"cannot capture on {self.interface}: {exc}") from None
        self._sock = sock
        self._thread = threading.Thread(target=self._run, name="wire-capture", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._sock is not None:
            self._sock.close()

    def _run(self) -> None:
        assert self._sock is not None
        sock, ports = self._sock, self.ports
        while True:
            try:
                data, ancillary, _, address = sock.recvmsg(65_600, 64)
            except TimeoutError:
                if self._stop.is_set():
                    return  # the socket is drained: nothing arrived for a read's timeout
                continue
            except OSError:
                return
            if address[2] != PACKET_OUTGOING:
                continue
            found = _tcp_payload(data)
            if found is None or (found[0] not in ports and found[1] not in ports):
                continue
            sport, dport, payload = found
            when = _timestamp(ancillary)
            if when is None:
                continue
            self.packets += 1
            if dport in ports:
                self._request_packet(dport, sport, payload, when)
            if sport not in ports:
                continue
            first = self.first[sport]
            for match in EVENT_ID.finditer(payload):
                rid = match.group(1).decode("ascii")
                if rid not in first:
                    first[rid] = when

    def _request_packet(self, port: int, sender: int, payload: bytes, when: float) -> None:
        """A packet of a request sent to ``port`` from ``sender`` at ``when``: the end of its request so far."""
        connection = (port, sender)
        if REQUEST_LINE.match(payload):  # a new request: its own id, or none (a health check's GET)
            head = REQUEST_ID.search(payload)
            if head is None:
                self._sending.pop(connection, None)
            else:
                self._sending[connection] = head.group(1).decode("ascii")
        rid = self._sending.get(connection)
        if rid is not None:
            self.request_end[port][rid] = when

    def holds(self, engine_port: int, proxy_port: int) -> dict[str, float]:
        """Per request id seen on both sides: the proxy's first packet of the stream less the engine's, seconds."""
        engine, proxy = self.first.get(engine_port, {}), self.first.get(proxy_port, {})
        return {rid: proxy[rid] - engine[rid] for rid in engine.keys() & proxy.keys()}

    def request_holds(self, engine_port: int, proxy_port: int) -> dict[str, float]:
        """Per request id seen on both sides: the end of the request the proxy sent the engine less the end of the
        one the client sent the proxy, seconds."""
        engine, proxy = self.request_end.get(engine_port, {}), self.request_end.get(proxy_port, {})
        return {rid: engine[rid] - proxy[rid] for rid in engine.keys() & proxy.keys()}


def _tcp_payload(frame: bytes) -> tuple[int, int, bytes] | None:
    """The source port, destination port and payload of an Ethernet-framed IPv4 TCP segment with a payload; None
    for anything else."""
    if len(frame) < 14 + 20 + 20 or frame[12:14] != b"\x08\x00":
        return None
    ip = 14
    ihl = (frame[ip] & 0x0F) * 4
    if frame[ip] >> 4 != 4 or frame[ip + 9] != 6:  # IPv4, TCP
        return None
    total = struct.unpack_from("!H", frame, ip + 2)[0]
    tcp = ip + ihl
    if len(frame) < tcp + 20:
        return None
    offset = (frame[tcp + 12] >> 4) * 4
    start, end = tcp + offset, min(len(frame), ip + total)
    if end <= start:
        return None
    sport, dport = struct.unpack_from("!HH", frame, tcp)
    return sport, dport, frame[start:end]


def _timestamp(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    """The kernel's timestamp of a packet (``SO_TIMESTAMPNS``), Unix seconds; None when absent."""
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(value) >= 16:
            seconds, nanoseconds = struct.unpack_from("qq", value)
            return seconds + nanoseconds / 1e9
    return None


# ---- arrivals in groups ------------------------------------------------------------------------------------------

GROUP_GAP_S = 0.001
"""Arrivals at the proxy less than this apart belong to one group (seconds): streams that ended together send
their next requests within a few hundred microseconds of each other, a new round's first one comes tens of
milliseconds (an engine step) after the last group."""
PLACES: tuple[tuple[int, int], ...] = ((1, 1), (2, 5), (6, 10), (11, 20), (21, 40), (41, 1 << 30))
"""The places in a group shown (1-based, both ends included)."""


def place_label(first: int, last: int) -> str:
    """``1st``, ``2-5``, ``41+``: a range of :data:`PLACES` as a column heading."""
    if first == last == 1:
        return "1st"
    return f"{first}+" if last >= 1 << 30 else f"{first}-{last}"


def _places(times_s: Sequence[float], gap_s: float) -> list[int]:
    """The place (1-based) of each of ``times_s`` (sorted) in its group: a new group starts where an arrival comes
    ``gap_s`` or more after the one before it."""
    places: list[int] = []
    last = -math.inf
    for t in times_s:
        places.append(places[-1] + 1 if places and t - last < gap_s else 1)
        last = t
    return places


def group_sizes(arrivals_s: Iterable[float], gap_s: float = GROUP_GAP_S) -> list[int]:
    """The sizes of the groups ``arrivals_s`` (Unix seconds, any order) fall into, in time order (see
    :func:`_places`)."""
    sizes: list[int] = []
    for place in _places(sorted(arrivals_s), gap_s):
        if place == 1:
            sizes.append(0)
        sizes[-1] += 1
    return sizes


def by_place(arrivals_s: Sequence[float], values: Sequence[float],
             gap_s: float = GROUP_GAP_S) -> dict[tuple[int, int], list[float]]:
    """``values[i]`` (the added TTFT of the stream that arrived at ``arrivals_s[i]``) by the place of its arrival
    in its group (see :func:`_places`), per range of :data:`PLACES`; ranges no arrival fell in are left out.
    Raises ValueError when the two lengths differ."""
    if len(arrivals_s) != len(values):
        raise ValueError(f"{len(arrivals_s)} arrivals but {len(values)} values")
    pairs = sorted(zip(arrivals_s, values, strict=True))
    out: dict[tuple[int, int], list[float]] = {}
    for place, (_, v) in zip(_places([t for t, _ in pairs], gap_s), pairs, strict=True):
        key = next(r for r in PLACES if r[0] <= place <= r[1])
        out.setdefault(key, []).append(v)
    return out
