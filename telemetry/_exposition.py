"""``/metrics``: content negotiation (OpenMetrics with exemplars, or the plain text format), an ASGI app and
a stand-alone HTTP server bound to 127.0.0.1 unless told otherwise."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.exposition import choose_encoder

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def render_metrics(registry: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """The exposition body and its content type for an ``Accept`` header.

    OpenMetrics (which carries exemplars) when the scraper asks for ``application/openmetrics-text``,
    else the plain text format 0.0.4 (exemplars left out).
    """
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


def metrics_app(registry: CollectorRegistry) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """An ASGI app serving ``registry`` (mount it at ``/metrics``)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            return
        accept = ""
        for key, value in scope.get("headers", []):
            if key.lower() == b"accept":
                accept = value.decode("latin-1")
        body, content_type = render_metrics(registry, accept)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type.encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


class MetricsServer:
    """A stand-alone ``/metrics`` server in a daemon thread; ``port=0`` picks a free port.

    Example::

        server = MetricsServer(tel.registry, port=9464)   # http://127.0.0.1:9464/metrics
        ...
        server.stop()
    """

    def __init__(self, registry: CollectorRegistry, *, port: int = 0, host: str = "127.0.0.1") -> None:
        self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        self.host = host
        self.port: int = self._httpd.server_port

    @property
    def url(self) -> str:
        """The ``/metrics`` URL."""
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


