"""The listening socket of a test server started in another process (``python -m uvicorn ... --fd N``)."""

from __future__ import annotations

import socket


def tcp_listener(sndbuf: int | None = None) -> socket.socket:
    """A TCP socket listening on 127.0.0.1, on a port the OS picks, for a server process to inherit.

    uvicorn opens an ``--fd`` socket as a Unix socket, so its event loop leaves Nagle's algorithm on for the
    connections it accepts (asyncio and uvloop switch it off for TCP sockets only): on a kept-alive connection a
    small write then waits for the client's delayed acknowledgement of the one before, up to 40 ms. So the
    listener has ``TCP_NODELAY``, which Linux hands on to the connections it accepts, as it does ``SO_SNDBUF``
    (``sndbuf``, bytes; None: the kernel's autotuning)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if sndbuf is not None:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    return listener
