"""Running a gateway: the front server, the admin API, health checks, and the drain on SIGTERM.

The admin API listens on 127.0.0.1 only, on its own port:

- ``GET /admin/backends``: every backend's state (JSON list); ``GET /admin/backends/ID``: one;
- ``POST /admin/backends/ID/drain``: drain that backend in the order of the definitions (out of the pool, the
  settle time, the wait for its requests in flight, at the budget terminate or return, the record). It answers
  202 at once with the backend's state, or with ``?wait=1`` 200 with the :class:`DrainRecord` once the drain
  ended; a JSON body may set ``budget_s``, ``settle_s``, ``idle_s``, ``max_inflight_s`` (seconds; ``"off"`` for
  the last two: never) and ``on_budget`` for this drain (:func:`drain_rules`; a bad one is 400 naming it);
  409 when it is draining already;
- ``POST /admin/backends/ID/ready``: put a drained backend back in the pool;
- ``POST /admin/backends`` with a JSON body ``{"id", "url", "version", "slots", "models", "engine",
  "metrics_path"}`` (``id`` and ``url`` required): add a backend, 201 with its state; it is health-checked at
  once and routable once healthy; 409 when the id is taken;
- ``DELETE /admin/backends/ID``: take a backend out of the gateway for good (after its drain), 200 with its last
  state; 409 while it drains or has requests in flight;
- ``POST /admin/drain``: drain the gateway itself (what SIGTERM does).

On SIGTERM (or SIGINT) the gateway drains itself: readiness false first (``/ready`` 503, new requests 503
``draining``), the settle time, the wait for the requests in flight, then it stops; a second signal ends every
request still in flight (``server_draining``) at once. With ``drain_record`` configured, that drain's record is
written there (whole or not at all) as the update record ``llmslo rollout record`` takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llmslo.controls import DrainRecord
from llmslo.gateway._config import GatewayConfig, backend_from_mapping, drain_rules
from llmslo.gateway._http import FrontConnection, Request, Responder, error_body
from llmslo.gateway._pool import Backend
from llmslo.gateway._proxy import GatewayApp
from llmslo.telemetry import ConfigurationError, Telemetry
from llmslo.telemetry._files import write_json_whole
from llmslo.telemetry._guard import never_raising

log = logging.getLogger("llmslo.gateway")

_JSON = (b"content-type", b"application/json")
ADMIN_BODY_BYTES = 64 * 1024
SWEEP_S = 1.0
"""How often the client connections are looked at for a late client, at most (seconds)."""
HANDLERS_FINISH_S = 5.0
"""At the close, the longest wait for the requests still in flight to write their last events (seconds)."""


@dataclass
class GatewayResult:
    """What a run did: its own drain's record (None: it stopped without one), where that record was written
    (``drain_record``; None: nowhere) or why it could not be (``drain_record_error``), its backends' drains."""

    drain: DrainRecord | None = None
    backend_drains: dict[str, list[DrainRecord]] = field(default_factory=dict)
    drain_record: Path | None = None
    drain_record_error: str | None = None


class Gateway:
    """One gateway: :meth:`start` it in a running event loop, :meth:`drain_and_stop` or :meth:`close` it.

    Example (as the tests run it)::

        gw = Gateway(GatewayConfig(backends=(BackendSpec("a", "http://127.0.0.1:8001"),), port=0, admin_port=0),
                     Telemetry(version="gateway"))
        await gw.start()
        ...  # requests to http://127.0.0.1:{gw.port}
        await gw.close()
    """

    def __init__(self, config: GatewayConfig, tel: Telemetry, say: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.tel = tel
        self.app = GatewayApp(config, tel)
        self.pool = self.app.pool
        self.say = never_raising(say)
        """Log one line through the ``say`` given (none: nothing); a line that cannot be written is dropped."""
        self.result = GatewayResult()
        self._servers: list[asyncio.Server] = []
        self._conns: set[FrontConnection] = set()
        self._drains: set[asyncio.Task[DrainRecord]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.stopped = asyncio.Event()
        self.port = config.port
        self.admin_port = config.admin_port

    async def start(self) -> None:
        """Listen (front and admin), start the health checks and the reads of the engines' own load."""
        loop = asyncio.get_running_loop()
        cfg = self.config
        front = await loop.create_server(
            lambda: FrontConnection(self.app.handle, cfg.max_body_bytes, self._conns.add, self._conns.discard),
            cfg.host, cfg.port, reuse_address=True)
        admin = await loop.create_server(lambda: FrontConnection(self.admin, ADMIN_BODY_BYTES),
                                         "127.0.0.1", cfg.admin_port, reuse_address=True)
        self._servers = [front, admin]
        self.port = front.sockets[0].getsockname()[1]
        self.admin_port = admin.sockets[0].getsockname()[1]
        await asyncio.gather(*(self.pool.check_health(b) for b in self.pool.backends.values()))
        self.pool.start_health_checks()
        self.pool.start_engine_reads()
        self._sweeper = loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        """Close the client connections whose clients are late (:meth:`FrontConnection.expire`), every second or
        every quarter of the shorter timeout: a request that never finishes arriving, a connection left idle."""
        cfg = self.config
        read_s, idle_s = cfg.read_timeout_s, cfg.idle_timeout_s
        tick = min(SWEEP_S, read_s / 4, SWEEP_S if idle_s is None else idle_s / 4)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for conn in list(self._conns):
                try:
                    conn.expire(now, read_s, idle_s)
                except Exception:  # a bug: log it, and go on sweeping the others
                    log.exception("closing a late client's connection failed")

    async def close(self) -> None:
        """Stop listening, end what is in flight (``server_draining``), close every connection."""
        for server in self._servers:
            server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in self._drains:
            task.cancel()
        self.app.stopping = True
        self.app.stop_checks()
        for ex in list(self.app.exchanges.values()):
            ex.cut("drain:budget_exhausted")
        self.tel.finish_all("server_draining")
        deadline = asyncio.get_running_loop().time() + HANDLERS_FINISH_S
        while self.app.exchanges and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)  # the handlers write their streams' last events
        await asyncio.sleep(0)
        for conn in list(self._conns):
            if conn.transport is not None:
                conn.transport.abort()
        await self.pool.close()
        self.stopped.set()

    async def drain_and_stop(self) -> DrainRecord:
        """Drain the gateway itself (readiness false first), then close it; the record."""
        drain = self.app.drain
        if drain.begin(from_version=self.tel.version, to_version=self.config.next_version or ""):
            self.say(f"draining: /ready is 503, new requests get 503 draining; settle {self.config.drain_settle_s:g} s")
        record = await drain.run()
        self.result.drain = record
        self.say(f"drain ended ({record.decision}) after {record.actual_drain_s:.2f} s: "
                 f"{record.in_flight_at_start} in flight at start, {record.terminated} closed")
        if self.config.drain_record is not None:
            self._write_record(Path(self.config.drain_record), record)
        await self.close()
        return record

    def _write_record(self, path: Path, record: DrainRecord) -> None:
        """Write the gateway's own drain record to ``path`` and say where; why not, in ``drain_record_error``."""
        document = drain_record_document(self.config, record)
        try:
            write_json_whole(path, document)
        except OSError as exc:
            self.result.drain_record_error = f"cannot write the drain record to {path}: {exc.strerror or exc}"
            return  # the caller says it (the command exits 1 with it)
        self.result.drain_record = path
        where = "" if path.is_absolute() else f" ({path.absolute()})"
        self.say(f"drain record written to {path}{where}, update {document['update_id']}: "
                 f"llmslo rollout record {path} --db STORE stores it")

    # ---- the admin API -----------------------------------------------------------------------------------

    async def admin(self, req: Request, res: Responder) -> None:
        parts = [p for p in req.path.split("/") if p]
        if parts[:2] != ["admin", "backends"] and parts != ["admin", "drain"]:
            res.send(404, [_JSON], error_body(f"no route {req.path[:200]}", "not_found", 404))
            return
        if parts == ["admin", "drain"]:
            if req.method != "POST":
                res.send(405, [_JSON], error_body("use POST", "invalid_request_error", 405))
                return
            asyncio.get_running_loop().create_task(self.drain_and_stop())
            res.send(202, [_JSON], json.dumps({"draining": True}).encode())
            return
        if len(parts) == 2:
            if req.method == "POST":
                await self._admin_add(req, res)
            else:
                res.send(200, [_JSON], json.dumps(self.pool.status()).encode())
            return
        backend = self.pool.backends.get(parts[2])
        if backend is None:
            res.send(404, [_JSON], error_body(f"no backend {parts[2][:40]!r}; known: "
                                              f"{', '.join(self.pool.backends)}", "not_found", 404))
            return
        action = parts[3] if len(parts) > 3 else ""
        if action == "" and req.method == "GET":
            res.send(200, [_JSON], json.dumps(backend.status()).encode())
        elif action == "" and req.method == "DELETE":
            why = self.pool.remove(backend)
            if why is None:
                self.say(f"backend {backend.id} removed from the gateway")
                res.send(200, [_JSON], json.dumps(backend.status()).encode())
            else:
                res.send(409, [_JSON], error_body(f"backend {backend.id} cannot be removed: {why}", "conflict", 409))
        elif action == "drain" and req.method == "POST":
            await self._admin_drain(req, res, backend)
        elif action == "ready" and req.method == "POST":
            self.pool.undrain(backend)
            res.send(200, [_JSON], json.dumps(backend.status()).encode())
        else:
            res.send(404, [_JSON], error_body(f"no route {req.method} {req.path[:200]}", "not_found", 404))

    async def _admin_add(self, req: Request, res: Responder) -> None:
        try:
            body = json.loads(req.body) if req.body.strip() else None
            if not isinstance(body, dict):
                raise ValueError('expected a JSON object: {"id": ..., "url": ..., "version": ..., "slots": ...}')
            if "id" not in body or "url" not in body:
                raise ValueError("id and url are required")
            spec = backend_from_mapping(body, str(body["id"]))
        except (ValueError, TypeError, ConfigurationError) as exc:
            res.send(400, [_JSON], error_body(f"backend: {exc}", "invalid_request_error", 400))
            return
        try:
            backend = self.pool.add(spec)  # the one check of the id: the pool refuses one that is taken
        except ConfigurationError as exc:
            # the pool's refusals: the id names a backend it holds (a conflict), or models it does not serve
            taken = spec.id in self.pool.backends
            res.send(409 if taken else 400, [_JSON], error_body(
                str(exc) if taken else f"backend: {exc}", "conflict" if taken else "invalid_request_error",
                409 if taken else 400))
            return
        self.say(f"backend {spec.id} added ({spec.url}, version {spec.version})")
        await self.pool.check_health(backend)
        res.send(201, [_JSON], json.dumps(backend.status()).encode())

    async def _admin_drain(self, req: Request, res: Responder, backend: Backend) -> None:
        try:
            options = json.loads(req.body) if req.body.strip() else {}
            if not isinstance(options, dict):
                raise ValueError("expected a JSON object")
            config = self.pool.drain_config(drain_rules(options))
        except (ValueError, ConfigurationError) as exc:
            res.send(400, [_JSON], error_body(f"drain options: {exc}", "invalid_request_error", 400))
            return
        drain = self.pool.begin_drain(backend, self.app._drain_closed, config)
        if drain is None:
            res.send(409, [_JSON], error_body(f"backend {backend.id} is draining already", "conflict", 409))
            return
        task = asyncio.get_running_loop().create_task(self.pool.run_drain(backend, drain))
        self._drains.add(task)
        task.add_done_callback(lambda t: self._drained(backend, t))
        if b"wait=1" in req.target.encode():
            record = await asyncio.shield(task)
            res.send(200, [_JSON], json.dumps(record.to_dict()).encode())
        else:
            res.send(202, [_JSON], json.dumps(backend.status()).encode())

    def _drained(self, backend: Backend, task: asyncio.Task[DrainRecord]) -> None:
        self._drains.discard(task)
        if not task.cancelled() and task.exception() is None:
            self.result.backend_drains.setdefault(backend.id, []).append(task.result())


def drain_record_document(config: GatewayConfig, record: DrainRecord) -> dict[str, object]:
    """The update record ``llmslo rollout record`` accepts for the gateway's own drain: ``update_id``
    (``config.update_id``, else ``FROM-to-TO-STARTED``, the drain's start in whole Unix seconds) and the drain
    section, ``record.to_dict()``, from which it takes the versions, the impact, the start and the end."""
    update_id = config.update_id or f"{record.from_version}-to-{record.to_version}-{int(record.started_unix_s)}"
    return {"update_id": update_id, "drain": record.to_dict()}


def settle_heap() -> None:
    """Collect once, then move every object alive now (the modules imported, the configuration, the pools) out of
    the garbage collector's reach (:func:`gc.freeze`): a full collection then walks only what the requests made
    since. Without it, a full collection here walked the imports too and stopped the event loop for 17-30 ms,
    every few seconds under load: the tail of the requests' wait before they were forwarded."""
    gc.collect()
    gc.freeze()


async def serve(config: GatewayConfig, tel: Telemetry, *, say: Callable[[str], None] | None = None,
                on_ready: Callable[[Gateway], None] | None = None) -> GatewayResult:
    """Run a gateway until SIGTERM/SIGINT (drained first) or an admin drain; what it did. It takes the process as
    its own: once started, it settles the heap (:func:`settle_heap`)."""
    gw = Gateway(config, tel, say)
    await gw.start()
    settle_heap()
    loop = asyncio.get_running_loop()
    signals = 0
    tasks: list[asyncio.Task[object]] = []

    def on_signal(sig: int) -> None:
        nonlocal signals
        signals += 1
        name = signal.Signals(sig).name
        if signals == 1:
            gw.say(f"{name}: draining (a second {name} ends every request at once)")
            tasks.append(loop.create_task(gw.drain_and_stop()))
        else:
            gw.say(f"{name} again: ending every request in flight now")
            tasks.append(loop.create_task(gw.close()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)
    if on_ready is not None:
        on_ready(gw)
    try:
        await gw.stopped.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
    return gw.result
