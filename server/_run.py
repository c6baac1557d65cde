"""Serving a configuration under uvicorn: the listening socket, the SIGTERM drain, a clean exit.

The listening socket is made here, with a small ``SO_SNDBUF`` (the accepted sockets inherit it) and handed to
uvicorn (``Server.serve(sockets=[...])``); each connection's transport also gets a write-buffer limit of the
same size, so a client that reads slowly is felt within a few KB: the ASGI ``send`` waits, the request's
send queue fills, and the engine stops giving that request tokens.

On SIGTERM (or SIGINT) the drain runs in the one safe order: readiness false (``/ready`` 503, new requests
503 ``draining``), the settle time, the wait for in-flight requests (closing idle or too-old streams, and at
the budget ``terminate`` or ``return_to_pool``), then, unless the instance returned to the pool, uvicorn stops,
the engine stops, the summary sink is flushed and closed, the drain record is written and the process exits
0. A second signal during a drain ends every request still in flight (``server_draining``) at once.
Each step is said in one line (``run_server(..., say=...)``; ``llmslo serve`` prints them on standard error).
uvicorn is imported here, on first use (the ``serve`` extra).

With a journal (``ServerConfig.journal``) every request is journaled from its arrival until its summary is
written (:class:`llmslo.telemetry.Journal`). Before serving, the requests an earlier process left in the journal
without a summary (it was killed, it crashed) are turned into summary rows through the same writer
(:func:`llmslo.telemetry.recover_journal`), and that step is said too when there was anything to recover.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmslo.controls import DrainRecord
from llmslo.server._app import ServerApp
from llmslo.server._config import ServerConfig
from llmslo.telemetry import (
    Journal,
    JournalInUse,
    LlmsloError,
    RecoveryReport,
    SloPolicy,
    SummarySink,
    SummaryWriter,
    Telemetry,
    recover_journal,
)
from llmslo.telemetry._files import write_json_whole
from llmslo.telemetry._guard import never_raising, silent

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("llmslo.server")

SINK_CLOSE_S = 10.0
"""The longest wait for the summary sink's last writes at exit (seconds)."""
HANDLERS_FINISH_S = 5.0
"""After the drain, the longest wait for the handlers to send their last events (seconds)."""
JOURNAL_CLOSE_S = 5.0
"""The longest wait for the journal's thread at exit (seconds); its last batch is written after it."""
SHARED_JOURNAL = "two servers cannot share a journal: give each its own --journal DIR"

StoredIds = Callable[[Sequence[str]], Collection[str]]
"""Given request ids, those that already have a summary where the writer writes (recovery skips them)."""


class JournalError(LlmsloError):
    """The journal could not be opened or recovered (in use by another process, a failed write)."""


@dataclass
class RunResult:
    """How a run ended: the exit status, the drain records (one per drain), the sink's final counts."""

    exit_code: int = 0
    drains: list[DrainRecord] = field(default_factory=list)
    summaries_written: int = 0
    summaries_dropped: dict[str, int] = field(default_factory=dict)
    recovery: RecoveryReport | None = None
    """What the start recovered from the journal (None without one)."""


def listening_socket(host: str, port: int, send_buffer: int) -> socket.socket:
    """A bound, listening TCP socket whose accepted sockets inherit ``SO_SNDBUF`` = ``send_buffer`` bytes.

    Raises ``OSError`` (the address is in use, the host cannot be resolved).
    """
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        sock.bind(address)
        sock.listen(2048)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _protocol(write_limit: int) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with the transport's write buffer limited to ``write_limit`` bytes."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class LimitedWrites(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            transport.set_write_buffer_limits(high=write_limit)
            super().connection_made(transport)

    return LimitedWrites


def _server_class() -> type[uvicorn.Server]:
    import uvicorn

    class QuietSignals(uvicorn.Server):
        """uvicorn without its own signal handling: SIGTERM starts the drain instead of a stop."""

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

    return QuietSignals


def make_telemetry(config: ServerConfig, writer: SummaryWriter | None,
                   journal: Journal | None = None) -> tuple[Telemetry, SummarySink | None]:
    """The telemetry of a run: the SLO policy of ``--slo-ttft`` / ``--slo-tpot``, the version, a summary sink
    writing through ``writer`` (None: no summaries kept), the journal (None: none)."""
    sink = SummarySink(writer) if writer is not None else None
    policy = SloPolicy(ttft_s=config.slo_ttft_s, tpot_s=config.slo_tpot_s)
    return Telemetry(policies=[policy], version=config.version, sink=sink, journal=journal), sink


def recover_at_start(config: ServerConfig, writer: SummaryWriter | None,
                     stored: StoredIds | None = None) -> RecoveryReport | None:
    """Turn the requests an earlier process left open in ``config.journal`` into summary rows through
    ``writer`` (``stored``: which ids already have one there); None without a journal or a writer (then the
    entries stay in the journal). Raises :class:`JournalError` saying what failed (nothing changed then)."""
    if config.journal is None or writer is None or not config.telemetry:
        return None

    def write(rows: list[dict[str, object]]) -> None:
        writer.write(rows)

    try:
        return recover_journal(config.journal, write, stored=stored)
    except JournalInUse as exc:
        raise JournalError(f"--journal: {exc}: {SHARED_JOURNAL}") from None
    except LlmsloError as exc:
        raise JournalError(f"--journal: {exc}") from None
    except Exception as exc:  # the writer's failure (a locked store, a full disk)
        raise JournalError(f"--journal: the rows recovered from {config.journal} could not be written ({exc}); "
                           "the journal is kept as it was") from None


def open_journal(config: ServerConfig) -> Journal | None:
    """The journal of a run (None without ``config.journal`` or telemetry). Raises :class:`JournalError`."""
    if config.journal is None or not config.telemetry:
        return None
    try:
        return Journal(config.journal)
    except JournalInUse as exc:
        raise JournalError(f"--journal: {exc}: {SHARED_JOURNAL}") from None
    except LlmsloError as exc:
        raise JournalError(f"--journal: {exc}") from None
    except OSError as exc:
        raise JournalError(f"--journal: cannot write {config.journal}: {exc.strerror or exc}") from None


def run_server(config: ServerConfig, *, writer: SummaryWriter | None = None,
               on_ready: Callable[[str], None] = print, say: Callable[[str], None] | None = None,
               stored: StoredIds | None = None) -> RunResult:
    """Serve ``config`` until a signal has drained it (see the module docstring); the result.

    ``writer`` receives the request summaries (``JsonlWriter``, ``DuckDBSummaryWriter``; ignored without
    telemetry); ``on_ready`` is called once with ``serving MODEL on http://HOST:PORT`` when the server
    accepts connections; ``say`` (when given) with one line per step of a drain and one at the exit (see
    :class:`_Run`), so a person watching knows the server has not hung, and with what the journal's
    recovery did, when it found anything. ``stored(ids)`` says which request ids already have a summary
    where ``writer`` writes (recovery writes no second row for them; a writer that skips known ids itself
    needs none). Raises ``OSError`` when the socket cannot be bound and :class:`JournalError` when the
    journal cannot be recovered or opened (nothing else started then).
    """
    say = never_raising(say)
    sock = listening_socket(config.host, config.port, config.send_buffer)
    try:
        report = recover_at_start(config, writer, stored)
        if report is not None and (report.recovered or report.already_stored or report.torn_lines):
            say(f"journal {config.journal}: {report.message()}")
        journal = open_journal(config)
        try:
            result = asyncio.run(_serve(config, sock, writer, on_ready, say, journal))
        finally:
            if journal is not None:
                journal.close(timeout_s=JOURNAL_CLOSE_S)
        result.recovery = report
        return result
    finally:
        sock.close()


def _duration(seconds: float | None) -> str:
    """``5s``, ``500ms``, ``2m``, ``off``: as the flags are written."""
    if seconds is None:
        return "off"
    if seconds and seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds / 60:g}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"


def _requests(n: int) -> str:
    return f"{n} request{'' if n == 1 else 's'}"


class _Run:
    """The state of one run: the app, uvicorn, the signals seen, the drain task.

    ``say`` gets one line per step of a drain, for the person at the terminal: the signal and the settle
    time; once settled, the requests in flight the drain waits for; how the drain ended (the streams it
    closed, by reason, and those that finished on their own); then, from :func:`_serve`, the exit.
    """

    def __init__(self, config: ServerConfig, app: ServerApp, server: uvicorn.Server, result: RunResult,
                 say: Callable[[str], None] = silent) -> None:
        self.config = config
        self.app = app
        self.server = server
        self.result = result
        self.say = say
        self.signals = 0
        self.drain_task: asyncio.Task[None] | None = None
        self.stop_task: asyncio.Task[None] | None = None

    def on_signal(self, sig: int | None = None) -> None:
        self.signals += 1
        name = signal.Signals(sig).name if sig is not None else "signal"
        loop = asyncio.get_running_loop()
        if self.signals == 1:
            self.begin_drain(name)
            self.drain_task = loop.create_task(self.drain_then_stop())
        elif self.signals == 2:
            in_flight = len(self.app.telemetry.in_flight()) if self.app.telemetry is not None else 0
            self.say(f"{name} again: ending the {_requests(in_flight)} in flight now (server_draining), then exit")
            self.stop_task = loop.create_task(self.stop_now())

    def begin_drain(self, name: str) -> None:
        """Readiness false and new requests refused, at the signal (the wait runs in :meth:`drain_then_stop`)."""
        drain, cfg = self.app.drain, self.config
        if drain is None:
            self.say(f"{name}: stopping now (--no-telemetry: no drain)")
            return
        drain.begin(from_version=cfg.version, to_version=cfg.next_version or "")
        self.say(f"{name}: draining: /ready is 503 and new requests get 503 draining; settle "
                 f"{_duration(cfg.drain_settle_s)} (a second {name} ends every request at once)")

    async def drain_then_stop(self) -> None:
        app, drain, cfg = self.app, self.app.drain, self.config
        if drain is None:  # the no-telemetry mode has no drain controller
            self.server.should_exit = True
            return
        drain.begin(from_version=cfg.version, to_version=cfg.next_version or "")  # no-op when begun at the signal
        waiting = False
        while (record := drain.poll()) is None:
            if not waiting and drain.phase == "waiting":
                waiting = True
                self._say_waiting(drain.in_flight_at_start)
            await asyncio.sleep(drain.next_poll_s())
        if not waiting:
            self._say_waiting(record.in_flight_at_start)
        self.result.drains.append(record)
        self._say_ended(record)
        if record.decision == "return_to_pool":
            self.signals = 0  # the next signal drains again
            return
        await app.wait_idle(HANDLERS_FINISH_S)
        if cfg.exit_linger_s:
            self.say(f"answering for {_duration(cfg.exit_linger_s)} more (--exit-linger), then exit")
        await asyncio.sleep(cfg.exit_linger_s)  # a last scrape sees the final counts
        self.server.should_exit = True

    def _say_waiting(self, in_flight: int) -> None:
        cfg = self.config
        closing = [f"streams idle for {_duration(cfg.drain_idle_s)}"] if cfg.drain_idle_s is not None else []
        if cfg.drain_max_inflight_s is not None:
            closing.append(f"requests in flight for {_duration(cfg.drain_max_inflight_s)}")
        self.say(f"settled: draining {_requests(in_flight)} in flight (budget {_duration(cfg.drain_budget_s)}, "
                 f"then {cfg.on_budget}; " + (f"closing {' or '.join(closing)})" if closing else "closing none early)"))

    def _say_ended(self, record: DrainRecord) -> None:
        by_reason = ", ".join(f"{reason} {n}" for reason, n in record.closed_by_reason.items() if n)
        closed = f"closed {record.terminated}" + (f" ({by_reason})" if by_reason else "")
        ended = sum(record.ended_by_reason.values())
        own = f"{ended} finished on {'its' if ended == 1 else 'their'} own"
        if record.decision == "return_to_pool":
            if self.say is silent:
                log.warning("drain budget spent with %d requests in flight: back in the pool, still serving",
                            record.remaining)
            self.say(f"drain budget spent after {record.actual_drain_s:.2f}s: {closed}, {own}; "
                     f"{_requests(record.remaining)} still in flight: back in the pool, serving "
                     "(the next signal drains again)")
            return
        self.say(f"drain ended ({record.decision}) after {record.actual_drain_s:.2f}s: {closed}, {own}")

    async def stop_now(self) -> None:
        if self.drain_task is not None:
            self.drain_task.cancel()
        self.app.terminate_all()
        await self.app.wait_idle(HANDLERS_FINISH_S)
        self.server.should_exit = True


async def _serve(config: ServerConfig, sock: socket.socket, writer: SummaryWriter | None,
                 on_ready: Callable[[str], None], say: Callable[[str], None] = silent,
                 journal: Journal | None = None) -> RunResult:
    import uvicorn

    tel, sink = make_telemetry(config, writer, journal) if config.telemetry else (None, None)
    app = ServerApp(config, tel)
    uv = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                        http=_protocol(config.send_buffer), timeout_graceful_shutdown=int(HANDLERS_FINISH_S))
    server = _server_class()(uv)
    result = RunResult()
    run = _Run(config, app, server, result, say)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, run.on_signal, sig)
    try:
        app.start()
        serving = loop.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if server.started:
            host, port = sock.getsockname()[:2]
            shown_host = f"[{host}]" if ":" in host else host
            on_ready(f"serving {config.model} on http://{shown_host}:{port}")
        await serving
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await app.close()
        if sink is not None:
            sink.close(timeout_s=SINK_CLOSE_S)
            result.summaries_written = sink.written
            result.summaries_dropped = dict(sink.dropped)
        if config.drain_record is not None and result.drains:
            write_drain_record(config, result.drains[-1])
    written = result.summaries_written
    said = [f"{written} summar{'y' if written == 1 else 'ies'} written"] if sink is not None else []
    if dropped := sum(result.summaries_dropped.values()):
        said.append(f"{dropped} dropped")
    if config.drain_record is not None and result.drains:
        said.append(f"drain record {config.drain_record}")
    say(f"exit {result.exit_code}" + (f": {', '.join(said)}" if said else ""))
    return result


def drain_record_document(config: ServerConfig, record: DrainRecord) -> dict[str, object]:
    """The update record ``llmslo rollout record`` accepts for one drain: ``update_id`` and the drain section
    (from which it takes the versions, the impact, the start and the end)."""
    update_id = config.update_id or f"{config.version}-to-{config.next_version}-{int(record.started_unix_s)}"
    return {"update_id": update_id, "drain": record.to_dict()}


def write_drain_record(config: ServerConfig, record: DrainRecord) -> Path:
    """Write the drain's update record to ``config.drain_record`` (whole or not at all: a temporary file
    renamed over it); the path."""
    assert config.drain_record is not None
    return write_json_whole(config.drain_record, drain_record_document(config, record))
