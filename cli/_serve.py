"""``llmslo serve``: the reference OpenAI-compatible streaming server (extra ``serve``).

The module's imports stay light (typer and the standard library): ``llmslo --help`` must not load the
server, uvicorn or the analysis stack. The command builds a :class:`llmslo.server.ServerConfig` from its
flags (a bad value exits 2 naming the flag), chooses the summary writer (``--db``: the store's
``DuckDBSummaryWriter``, which needs the ``analysis`` extra; ``--jsonl``: ``JsonlWriter``) and the journal
(``--journal``: by default ``<the summaries' path>.journal`` beside them), and runs the server until SIGTERM
has drained it.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmslo.cli._common import EXIT_INPUT, EXIT_USAGE, say_on_stderr
from llmslo.cli._common import fail as _fail
from llmslo.cli._common import threshold as _threshold
from llmslo.telemetry import DEFAULT_TPOT_S, DEFAULT_TTFT_S, LlmsloError, parse_duration

if TYPE_CHECKING:
    from llmslo.telemetry import SummaryWriter

__all__ = ["serve_command"]

OFF = "off"
SERVE_HINT = "llmslo serve needs the 'serve' extra (uvicorn is missing): pip install 'llmslo[serve]'"
DB_HINT = "--db needs the 'analysis' extra (duckdb is missing): pip install 'llmslo[analysis]', or use --jsonl DIR"


def _seconds(flag: str, text: str, *, off: bool = False, zero: bool = False) -> float | None:
    """Seconds from a duration flag (``250ms``, ``2s``, ``5m``); ``off`` where the flag allows it, ``0``
    where it allows zero. A bad value exits 2 naming the flag."""
    value = text.strip().lower()
    if off and value == OFF:
        return None
    if zero and value in ("0", "0s"):
        return 0.0
    try:
        return parse_duration(text)
    except ValueError as exc:
        hint = f"; '{OFF}' switches it off" if off else ""
        raise _fail(f"{flag}: {exc}{hint}", EXIT_USAGE) from None


def _required_seconds(flag: str, text: str, *, zero: bool = False) -> float:
    value = _seconds(flag, text, zero=zero)
    assert value is not None
    return value


def _classes(text: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in text.split(",") if c.strip())


def _writer(db: Path | None, jsonl: Path | None) -> SummaryWriter | None:
    if db is not None:
        if importlib.util.find_spec("duckdb") is None:
            raise _fail(DB_HINT, EXIT_INPUT)
        from llmslo.analysis import DuckDBSummaryWriter

        return DuckDBSummaryWriter(db)
    if jsonl is not None:
        from llmslo.telemetry import JsonlWriter

        if jsonl.exists() and not jsonl.is_dir():
            raise _fail(f"--jsonl: {jsonl} exists and is not a folder", EXIT_INPUT)
        return JsonlWriter(jsonl)
    return None


JOURNAL_SUFFIX = ".journal"
"""The default journal of ``--db FILE`` / ``--jsonl DIR``: ``FILE.journal`` / ``DIR.journal``, beside them."""


def _journal(flag_value: str | None, db: Path | None, jsonl: Path | None, no_telemetry: bool) -> Path | None:
    """The journal folder: ``--journal DIR``, none with ``--journal off``, else beside the summaries."""
    output = db if db is not None else jsonl
    if flag_value is not None and flag_value.strip().lower() == OFF:
        return None
    if flag_value is None:
        return None if output is None or no_telemetry else output.with_name(output.name + JOURNAL_SUFFIX)
    if no_telemetry:
        raise _fail("--no-telemetry keeps no summaries: leave out --journal", EXIT_USAGE)
    if not flag_value.strip():
        raise _fail("--journal: give a folder, or 'off'", EXIT_USAGE)
    if output is None:
        raise _fail("--journal: the journal turns requests lost in a crash into summary rows; give --db or "
                    "--jsonl for them too (or leave out --journal)", EXIT_USAGE)
    folder = Path(flag_value)
    if folder.exists() and not folder.is_dir():
        raise _fail(f"--journal: {folder} exists and is not a folder", EXIT_INPUT)
    return folder


def _stored_in_db(db: Path, ids: Sequence[str]) -> Collection[str]:
    """Those of ``ids`` already in the store ``db`` (none when it does not exist yet)."""
    if not db.exists():
        return set()
    from llmslo.analysis.store import SUMMARY_TABLE, Store

    with Store.open(db, create=False, read_only=True) as store:
        rows = store.con.execute(f"SELECT request_id FROM {SUMMARY_TABLE} WHERE request_id IN "
                                 "(SELECT unnest(CAST($ids AS VARCHAR[])))", {"ids": list(ids)}).fetchall()
    return {r[0] for r in rows}


def _stored(db: Path | None, jsonl: Path | None) -> Callable[[Sequence[str]], Collection[str]] | None:
    """How the start's recovery finds the requests that already have a summary where the writer writes."""
    if db is not None:
        return functools.partial(_stored_in_db, db)
    if jsonl is not None:
        from llmslo.telemetry import stored_in_jsonl

        return functools.partial(stored_in_jsonl, jsonl)
    return None


def _announce(line: str) -> None:
    print(line, flush=True)


def serve_command(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port; 0 picks a free one (printed when ready).")] = 8000,
    model: Annotated[str, typer.Option("--model", help="The served model name (requests must name it).")] =
        "llmslo-sim",
    version: Annotated[str, typer.Option("--version", help="The version label of every summary and metric.")] =
        "sim-1",
    tenant_classes: Annotated[str, typer.Option(
        "--tenant-classes", help="Tenant classes, highest priority first (X-Tenant-Class; others count as "
        "'default').")] = "default",
    profile: Annotated[str, typer.Option(
        "--profile", help="Engine timing profile, model/hardware (fitted to measured A100/H100 runs; see "
        "docs/server.md).")] = "llama2-70b/h100-80gb",
    speed: Annotated[float, typer.Option("--speed", help="Engine time scale: 10 runs every step 10x faster.")] = 1.0,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", help="Sequences in the running batch.")] = 256,
    kv_blocks: Annotated[int, typer.Option("--kv-blocks", help="KV cache size in blocks.")] = 16384,
    block_size: Annotated[int, typer.Option("--block-size", help="Tokens per KV block.")] = 16,
    mean_output_tokens: Annotated[float, typer.Option(
        "--mean-output-tokens", help="Mean natural output length without ignore_eos (tokens).")] = 128.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the per-request draws (length, errors).")] = 0,
    error_rate: Annotated[float, typer.Option(
        "--error-rate", help="Failure injection: the share of requests the engine fails (0 to 1).")] = 0.0,
    stream_capacity: Annotated[int, typer.Option(
        "--stream-capacity", help="Per-request send queue, in chunks: the engine pauses a request whose "
        "client is this far behind.")] = 16,
    stream_idle: Annotated[str, typer.Option(
        "--stream-idle", help="End a stream that sent nothing this long (deadline); 'off' never.")] = "30s",
    send_buffer: Annotated[int, typer.Option(
        "--send-buffer", help="Bytes: SO_SNDBUF of the accepted sockets and the transport's write buffer, so a "
        "slow reader is felt within a few KB.")] = 4096,
    request_timeout: Annotated[str, typer.Option(
        "--request-timeout", help="End a request this long after its arrival (deadline); 'off' never.")] = "10m",
    max_queue: Annotated[int, typer.Option(
        "--max-queue", help="Admission queue: requests waiting at most (beyond: 429 queue_full).")] = 1000,
    queue_timeout: Annotated[str, typer.Option(
        "--queue-timeout", help="Admission queue: the longest wait for a slot (then 429).")] = "30s",
    max_concurrency: Annotated[int | None, typer.Option(
        "--max-concurrency", help="Admission slots (default: --max-num-seqs).", show_default=False)] = None,
    rate_limit: Annotated[float | None, typer.Option(
        "--rate-limit", help="Requests per second per key (the Authorization header, else the client address); "
        "default off.", show_default=False)] = None,
    rate_burst: Annotated[float | None, typer.Option(
        "--rate-burst", help="Burst of --rate-limit, requests (default: one second's worth, at least 1).",
        show_default=False)] = None,
    token_rate_limit: Annotated[float | None, typer.Option(
        "--token-rate-limit", help="Tokens (prompt + max_tokens) per second per key; default off.",
        show_default=False)] = None,
    token_burst: Annotated[float | None, typer.Option(
        "--token-burst", help="Burst of --token-rate-limit, tokens (default: a minute's worth).",
        show_default=False)] = None,
    no_breaker: Annotated[bool, typer.Option(
        "--no-breaker", help="Switch off the circuit breaker on engine errors (on by default: 503 circuit_open "
        "while open).")] = False,
    breaker_failures: Annotated[int, typer.Option(
        "--breaker-failures", help="Breaker: trip after this many engine errors in a row.")] = 5,
    breaker_error_rate: Annotated[float, typer.Option(
        "--breaker-error-rate", help="Breaker: trip when this share of a window's requests failed (3 windows "
        "in a row).")] = 0.6,
    breaker_window: Annotated[str, typer.Option("--breaker-window", help="Breaker: window length.")] = "10s",
    breaker_open: Annotated[str, typer.Option(
        "--breaker-open", help="Breaker: time open before one probe is let through.")] = "30s",
    shed_queue_fraction: Annotated[float | None, typer.Option(
        "--shed-queue-fraction", help="Load shedding: refuse (429) the lowest tenant class once the queue is "
        "this full (higher classes at evenly higher fill, the highest at 1.0); default off.",
        show_default=False)] = None,
    shed_ttft: Annotated[str, typer.Option(
        "--shed-ttft", help="Load shedding: refuse the lowest class while the recent p99 TTFT is at least this "
        "(the next class up at twice it, and so on); 'off' by default.")] = OFF,
    drain_settle: Annotated[str, typer.Option(
        "--drain-settle", help="Drain: after SIGTERM, the wait for discovery to drop this instance (0 allowed).")]
        = "5s",
    exit_linger: Annotated[str, typer.Option(
        "--exit-linger", help="After the drain, keep answering this long before exiting (requests get 503 "
        "draining; /metrics still answers), so a last Prometheus scrape sees the final counts (0 allowed).")]
        = "0s",
    drain_budget: Annotated[str, typer.Option(
        "--drain-budget", help="Drain: the longest wait for in-flight requests after the settle time.")] = "120s",
    drain_idle: Annotated[str, typer.Option(
        "--drain-idle", help="Drain: close a stream that sent nothing this long ('off': never).")] = "30s",
    drain_max_inflight: Annotated[str, typer.Option(
        "--drain-max-inflight", help="Drain: close a stream in flight this long since its arrival ('off': "
        "never).")] = "5m",
    on_budget: Annotated[str, typer.Option(
        "--on-budget", help="Drain: at the budget, 'terminate' the rest (then exit) or 'return_to_pool' (serve "
        "on, skip this update).")] = "terminate",
    drain_poll: Annotated[str, typer.Option(
        "--drain-poll", help="Drain: how often the in-flight requests are checked.")] = "500ms",
    drain_record: Annotated[Path | None, typer.Option(
        "--drain-record", help="At exit, write the drain as an update record for 'llmslo rollout record' "
        "(needs --next-version).", show_default=False)] = None,
    next_version: Annotated[str | None, typer.Option(
        "--next-version", help="The version replacing this one (the drain record's to_version).",
        show_default=False)] = None,
    update_id: Annotated[str | None, typer.Option(
        "--update-id", help="The drain record's update_id (default: VERSION-to-NEXT-STARTED).",
        show_default=False)] = None,
    slo_ttft: Annotated[str | None, typer.Option(
        "--slo-ttft", help=f"SLO on TTFT for goodput, e.g. 500ms; 'off' to ignore. (default: {DEFAULT_TTFT_S:g}s)",
        show_default=False)] = None,
    slo_tpot: Annotated[str | None, typer.Option(
        "--slo-tpot", help=f"SLO on TPOT for goodput, e.g. 50ms; 'off' to ignore. (default: "
        f"{DEFAULT_TPOT_S * 1e3:g}ms)", show_default=False)] = None,
    db: Annotated[Path | None, typer.Option(
        "--db", help="Write the request summaries to this DuckDB store (the analysis extra).",
        show_default=False)] = None,
    jsonl: Annotated[Path | None, typer.Option(
        "--jsonl", help="Write the request summaries as JSONL files into this folder.", show_default=False)] = None,
    journal: Annotated[str | None, typer.Option(
        "--journal", help="Folder of the write-ahead journal of requests, so a crash loses none: at the next "
        "start each request left without a summary gets a row (error, server_crash). Default: beside the "
        "summaries (--db FILE: FILE.journal, --jsonl DIR: DIR.journal); 'off' keeps none.",
        show_default=False)] = None,
    no_telemetry: Annotated[bool, typer.Option(
        "--no-telemetry", help="For the overhead benchmark only: the same engine and HTTP work with no "
        "telemetry and no controls (no metrics, no summaries, no admission queue, no drain).")] = False,
) -> None:
    """Run the reference OpenAI-compatible streaming server on a simulated engine.

    Routes: POST /v1/completions and /v1/chat/completions (streamed as server-sent events with stream:
    true), GET /v1/models, /metrics, /health, /ready. The engine batches continuously with a KV-block
    budget; its step times are fitted to measured A100/H100 runs. Every request gets one summary row
    (--db or --jsonl); a journal beside them keeps every request until its row is written, and the next
    start turns those a crash left into rows (--journal). Prints 'serving MODEL on http://HOST:PORT' when
    ready. On SIGTERM: /ready goes 503, new requests get 503 draining, in-flight requests finish or are
    closed by the drain, the summaries are flushed, and the process exits 0, printing one line per step on
    standard error (the settle, the requests drained, the streams closed, the exit). See docs/server.md.
    """
    if db is not None and jsonl is not None:
        raise _fail("--db and --jsonl: choose one place for the summaries", EXIT_USAGE)
    if no_telemetry and (db is not None or jsonl is not None):
        raise _fail("--no-telemetry keeps no summaries: leave out --db and --jsonl", EXIT_USAGE)
    journal_dir = _journal(journal, db, jsonl, no_telemetry)
    if importlib.util.find_spec("uvicorn") is None:
        raise _fail(SERVE_HINT, EXIT_INPUT)
    from llmslo.server import ServerConfig, run_server

    try:
        config = ServerConfig(
            host=host, port=port, send_buffer=send_buffer, model=model, version=version,
            tenant_classes=_classes(tenant_classes), profile=profile, speed=speed, max_num_seqs=max_num_seqs,
            kv_blocks=kv_blocks, block_size=block_size, mean_output_tokens=mean_output_tokens, seed=seed,
            error_rate=error_rate, stream_capacity=stream_capacity,
            stream_idle_s=_seconds("--stream-idle", stream_idle, off=True),
            request_timeout_s=_seconds("--request-timeout", request_timeout, off=True), max_queue=max_queue,
            queue_timeout_s=_required_seconds("--queue-timeout", queue_timeout), max_concurrency=max_concurrency,
            rate_limit=rate_limit, rate_burst=rate_burst, token_rate_limit=token_rate_limit, token_burst=token_burst,
            breaker=not no_breaker, breaker_failures=breaker_failures, breaker_error_rate=breaker_error_rate,
            breaker_window_s=_required_seconds("--breaker-window", breaker_window),
            breaker_open_s=_required_seconds("--breaker-open", breaker_open),
            shed_queue_fraction=shed_queue_fraction, shed_ttft_s=_seconds("--shed-ttft", shed_ttft, off=True),
            drain_settle_s=_required_seconds("--drain-settle", drain_settle, zero=True),
            exit_linger_s=_required_seconds("--exit-linger", exit_linger, zero=True),
            drain_budget_s=_required_seconds("--drain-budget", drain_budget),
            drain_idle_s=_seconds("--drain-idle", drain_idle, off=True),
            drain_max_inflight_s=_seconds("--drain-max-inflight", drain_max_inflight, off=True),
            on_budget=on_budget, drain_poll_s=_required_seconds("--drain-poll", drain_poll),
            drain_record=drain_record, next_version=next_version, update_id=update_id,
            slo_ttft_s=_threshold("slo-ttft", slo_ttft, DEFAULT_TTFT_S),
            slo_tpot_s=_threshold("slo-tpot", slo_tpot, DEFAULT_TPOT_S),
            telemetry=not no_telemetry, journal=journal_dir)
    except LlmsloError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    writer = _writer(db, jsonl)
    try:
        result = run_server(config, writer=writer, on_ready=_announce, say=say_on_stderr, stored=_stored(db, jsonl))
    except OSError as exc:
        raise _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", EXIT_INPUT) from None
    except LlmsloError as exc:  # the journal: in use by another process, or its rows could not be written
        raise _fail(str(exc), EXIT_INPUT) from None
    dropped = sum(result.summaries_dropped.values())
    if dropped:
        sys.stderr.write(f"llmslo serve: {dropped} request summaries could not be written "
                         f"({result.summaries_dropped})\n")
    raise typer.Exit(result.exit_code)
