"""``llmslo gateway``: run the gateway in front of engines, drain one of its backends, show its pool.

``llmslo gateway --backend URL ...`` (or ``--pool pool.yaml``) runs a gateway until SIGTERM has drained it; the
sub-commands talk to a running gateway's admin API (127.0.0.1 only): ``status``, ``drain ID``, ``ready ID``.
The module's imports stay light: the gateway is imported when it runs.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypedDict

import typer

from llmslo.cli._common import EXIT_INPUT, EXIT_USAGE, say_on_stderr
from llmslo.cli._common import fail as _fail
from llmslo.cli._serve import _seconds, _writer
from llmslo.telemetry import ConfigurationError

if TYPE_CHECKING:
    from llmslo.gateway import GatewayConfig
    from llmslo.telemetry import SummaryWriter

__all__ = ["gateway_app"]

gateway_app = typer.Typer(
    name="gateway",
    help=(
        "An OpenAI-compatible gateway in front of engines (llama.cpp, vLLM, SGLang, TGI, llmslo serve): token "
        "budgets reserved at admission and settled from usage, a bounded priority queue with 429 + "
        "Retry-After, a breaker per backend on stream health, least-loaded routing, streams passed on byte for "
        "byte, one backend drained at a time, a request summary per request.\n\n"
        "Start with: llmslo gateway --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002\n\n"
        "A backend is [ID=]URL[@VERSION][,slots=N] (ID defaults to b1, b2, ...; slots to 1); --pool FILE reads "
        "them from YAML (docs/gateway.md). The admin API listens on 127.0.0.1:--admin-port; "
        "'llmslo gateway drain ID' drains one backend through it."
    ),
    invoke_without_command=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

AdminOption = Annotated[str, typer.Option("--admin", help="The gateway's admin API.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the JSON the admin API answered (for scripts).")]
DEFAULT_ADMIN = "http://127.0.0.1:8081"


@gateway_app.callback()
def run_gateway(
    ctx: typer.Context,
    backend: Annotated[list[str] | None, typer.Option(
        "--backend", help="A backend, [ID=]URL[@VERSION][,slots=N], e.g. a=http://127.0.0.1:8001@b4000,slots=4 "
        "(slots: the sequences it runs at once, its weight in routing; its concurrency limit starts at twice it; "
        "default 1); repeat for more.",
        show_default=False)] = None,
    pool: Annotated[Path | None, typer.Option(
        "--pool", help="A pool file (YAML: backends with id, url, version, slots, models, engine, metrics_path).",
        show_default=False)] = None,
    engine_metrics: Annotated[str | None, typer.Option(
        "--engine-metrics", help="The engine every --backend runs (llamacpp, nim, sglang, tgi, trtllm, vllm): "
        "route on its own queue and KV usage, read from its /metrics every --engine-interval; in a pool file: "
        "engine: per backend. Default: outstanding requests alone.", metavar="ENGINE", show_default=False)] = None,
    engine_interval: Annotated[str, typer.Option(
        "--engine-interval", help="How often each engine's /metrics is read (--engine-metrics, engine:); figures "
        "older than three intervals are not used.")] = "1s",
    health_interval: Annotated[str, typer.Option(
        "--health-interval", help="How often each backend's /health is checked.")] = "2s",
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port; 0 picks a free one (printed when ready).")] = 8080,
    admin_port: Annotated[int, typer.Option(
        "--admin-port", help="Admin API port on 127.0.0.1; 0 picks a free one.")] = 8081,
    model: Annotated[list[str] | None, typer.Option(
        "--model", help="A model served (others get 404); default: the pool's lists, else any.",
        show_default=False)] = None,
    version: Annotated[str, typer.Option(
        "--version", help="The version label of requests no backend served (refused, bad).")] = "gateway",
    concurrency: Annotated[int | None, typer.Option(
        "--concurrency", help="Requests forwarded at once, all backends together (default: twice the slots).",
        show_default=False)] = None,
    max_queue: Annotated[int, typer.Option(
        "--max-queue", help="Requests waiting per model at most (beyond: 429 queue_full).")] = 256,
    queue_timeout: Annotated[str, typer.Option("--queue-timeout", help="The longest wait in the queue.")] = "30s",
    degrade_max_tokens: Annotated[int | None, typer.Option(
        "--degrade-max-tokens", help="Under load (the queue at half its class's shed level), cap max_tokens to "
        "this before refusing anyone; default off.", show_default=False)] = None,
    tenant_classes: Annotated[str, typer.Option(
        "--tenant-classes", help="Tenant classes (X-Tenant-Class), most important first; must hold 'default'. "
        "The last is shed first.")] = "interactive,default,batch",
    tokens_per_min: Annotated[float | None, typer.Option(
        "--tokens-per-min", help="Token budget per API key (prompt + max_tokens reserved, settled from usage); "
        "default off.", show_default=False)] = None,
    token_burst: Annotated[float | None, typer.Option(
        "--token-burst", help="Burst of --tokens-per-min, tokens (default: a minute's worth).",
        show_default=False)] = None,
    reserve_quantile: Annotated[float | None, typer.Option(
        "--reserve-quantile", help="Reserve prompt + this quantile of the model's recent outputs (at most "
        "max_tokens; e.g. 0.9) instead of max_tokens, once 20 replies completed: less held back, but parallel "
        "requests may overshoot the budget by what they generate beyond it (settled from usage); default off.",
        show_default=False)] = None,
    requests_per_s: Annotated[float | None, typer.Option(
        "--requests-per-s", help="Requests per second per API key; default off.", show_default=False)] = None,
    redis: Annotated[str | None, typer.Option(
        "--redis", help="Share the budgets between gateway replicas through this Redis URL.",
        show_default=False)] = None,
    max_body: Annotated[int, typer.Option(
        "--max-body", help="The largest request body taken, bytes (beyond: 413).")] = 4 * 1024 * 1024,
    retries: Annotated[int, typer.Option(
        "--retries", help="Other backends tried for a request that sent its client nothing yet.")] = 1,
    breaker_failures: Annotated[int, typer.Option(
        "--breaker-failures", help="A backend's breaker opens after this many failures in a row.")] = 5,
    breaker_open: Annotated[str, typer.Option(
        "--breaker-open", help="Time a breaker stays open before one probe is let through.")] = "5s",
    ttft_bound: Annotated[str, typer.Option(
        "--ttft-bound", help="A first token later than this counts against the backend; 'off' never.")] = "off",
    stall: Annotated[str, typer.Option(
        "--stall", help="No chunk for this long mid-stream: the stream ends with an error event.")] = "30s",
    request_timeout: Annotated[str, typer.Option(
        "--request-timeout", help="End a request this long after its admission (deadline event; checked every "
                                  "second, or a quarter of it if shorter); 'off' never.")] =
        "10m",
    read_timeout: Annotated[str, typer.Option(
        "--read-timeout", help="A request's head and body must arrive within this long of their start, else "
        "408 and the connection closes (checked every second).")] = "30s",
    idle_timeout: Annotated[str, typer.Option(
        "--idle-timeout", help="Close a client's connection with no request on it for this long; 'off' "
        "never.")] = "10m",
    drain_settle: Annotated[str, typer.Option(
        "--drain-settle", help="After removing a backend (or the gateway) from the pool, wait this long.")] = "1s",
    drain_budget: Annotated[str, typer.Option(
        "--drain-budget", help="The longest wait for requests in flight during a drain.")] = "30s",
    drain_idle: Annotated[str, typer.Option(
        "--drain-idle", help="During a drain, close a stream idle this long; 'off' never.")] = "10s",
    drain_max_inflight: Annotated[str, typer.Option(
        "--drain-max-inflight", help="During a drain, close a stream in flight this long since its arrival, "
        "however active (server_draining, drain_reason max_inflight); 'off' never.")] = "off",
    on_budget: Annotated[str, typer.Option(
        "--on-budget", help="At the drain budget: terminate the rest, or return_to_pool.")] = "terminate",
    drain_record: Annotated[Path | None, typer.Option(
        "--drain-record", help="When the gateway drains itself (SIGTERM, POST /admin/drain), write that drain as "
        "an update record for 'llmslo rollout record FILE.json --db STORE' (JSON, whole: a temporary file renamed "
        "over it); the path is said on stderr. Needs --next-version.", metavar="FILE.json",
        show_default=False)] = None,
    next_version: Annotated[str | None, typer.Option(
        "--next-version", help="The version replacing this gateway (the drain record's to_version; its "
        "from_version is --version).", show_default=False)] = None,
    update_id: Annotated[str | None, typer.Option(
        "--update-id", help="The drain record's update_id (default: VERSION-to-NEXT-STARTED).",
        show_default=False)] = None,
    db: Annotated[Path | None, typer.Option(
        "--db", help="Write the request summaries to this DuckDB store.", show_default=False)] = None,
    jsonl: Annotated[Path | None, typer.Option(
        "--jsonl", help="Write the request summaries as rotated JSONL files in this folder.",
        show_default=False)] = None,
) -> None:
    """Run the gateway until SIGTERM (drained first: /ready 503, the settle time, the requests in flight).

    It runs on uvloop's event loop where uvloop is installed (pip install 'llmslo[gateway]'), else on asyncio's;
    LLMSLO_LOOP=asyncio|uvloop|auto chooses, and the ready line says which.
    """
    if ctx.invoked_subcommand is not None:
        return
    from llmslo.gateway import BudgetConfig, GatewayConfig, backend_from_arg, load_pool

    if not backend and pool is None:
        raise _fail("give the engines: --backend URL (repeat it) or --pool FILE; see llmslo gateway --help",
                    EXIT_USAGE)
    if backend and pool is not None:
        raise _fail("--backend and --pool: choose one", EXIT_USAGE)
    if db is not None and jsonl is not None:
        raise _fail("--db and --jsonl: choose one place for the summaries", EXIT_USAGE)
    _check_engine_metrics(engine_metrics, pool)
    pool_drain: Mapping[str, float | str | None] = {}
    try:
        if pool is not None:
            read = load_pool(pool)
            backends, pool_drain = read.backends, read.drain
        else:
            backends = tuple(backend_from_arg(text, i, engine=engine_metrics)
                             for i, text in enumerate(backend or (), start=1))
    except ConfigurationError as exc:
        raise _fail(f"{'--pool' if pool is not None else '--backend'}: {exc}", EXIT_USAGE) from None
    drain = _drain_settings(ctx, pool_drain, drain_settle=drain_settle, drain_budget=drain_budget,
                            drain_idle=drain_idle, drain_max_inflight=drain_max_inflight, on_budget=on_budget)
    try:
        config = GatewayConfig(
            backends=backends, host=host, port=port, admin_port=admin_port, models=tuple(model or ()),
            concurrency=concurrency, queue_capacity=max_queue, max_body_bytes=max_body,
            degrade_max_tokens=degrade_max_tokens,
            queue_timeout_s=_required("--queue-timeout", queue_timeout),
            tenant_classes=tuple(c.strip() for c in tenant_classes.split(",") if c.strip()),
            budget=BudgetConfig(tokens_per_min=tokens_per_min, token_burst=token_burst,
                                requests_per_s=requests_per_s, redis_url=redis, reserve_quantile=reserve_quantile),
            retries=retries, breaker_failures=breaker_failures,
            breaker_open_s=_required("--breaker-open", breaker_open),
            ttft_bound_s=_seconds("--ttft-bound", ttft_bound, off=True),
            stall_s=_required("--stall", stall),
            request_timeout_s=_seconds("--request-timeout", request_timeout, off=True),
            read_timeout_s=_required("--read-timeout", read_timeout),
            idle_timeout_s=_seconds("--idle-timeout", idle_timeout, off=True),
            **drain,
            drain_record=drain_record, next_version=next_version, update_id=update_id,
            engine_interval_s=_required("--engine-interval", engine_interval),
            health_interval_s=_required("--health-interval", health_interval))
    except ConfigurationError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    writer = _writer(db, jsonl)
    _run(config, version, writer)


class _DrainSettings(TypedDict):
    """The drain rules of a gateway, as :class:`GatewayConfig` takes them."""

    drain_settle_s: float
    drain_budget_s: float
    drain_idle_s: float | None
    drain_max_inflight_s: float | None
    on_budget: str


def _check_engine_metrics(engine: str | None, pool: Path | None) -> None:
    """Refuse an ``--engine-metrics`` that names no known engine, or that comes with ``--pool``."""
    from llmslo.gateway import ENGINE_CHOICES

    if engine is None:
        return
    if pool is not None:
        raise _fail("--engine-metrics applies to --backend; in a pool file set engine: on each backend instead",
                    EXIT_USAGE)
    if engine not in ENGINE_CHOICES:
        raise _fail(f"--engine-metrics: {engine!r} is not a known engine; use one of {', '.join(ENGINE_CHOICES)}",
                    EXIT_USAGE)


def _drain_settings(ctx: typer.Context, pool_drain: Mapping[str, float | str | None], *, drain_settle: str,
                    drain_budget: str, drain_idle: str, drain_max_inflight: str, on_budget: str) -> _DrainSettings:
    """The drain rules, by :class:`GatewayConfig` field: the pool file's ``drain:`` where it sets one, else the
    flag's; a rule set both in the file and on the command line is refused."""
    from llmslo.gateway import DRAIN_FIELDS, DRAIN_FLAGS

    def from_file(key: str) -> bool:
        """Whether the pool file sets the rule ``key`` (refused when its flag was given too)."""
        field = DRAIN_FIELDS[key]
        if field not in pool_drain:
            return False
        source = ctx.get_parameter_source(field.removesuffix("_s"))  # the flag's parameter
        if source is not None and source.name == "COMMANDLINE":
            value = pool_drain[field]
            raise _fail(f"{DRAIN_FLAGS[key]} and the pool file's drain: {key}: choose one (the file has "
                        f"{key}: {'off' if value is None else value})", EXIT_USAGE)
        return True

    def seconds(key: str, flag: Callable[[], float | None]) -> float | None:
        if not from_file(key):
            return flag()
        value = pool_drain[DRAIN_FIELDS[key]]
        assert value is None or isinstance(value, float)  # drain_rules gives seconds as floats, None for off
        return value

    settle = seconds("settle_s", lambda: _required("--drain-settle", drain_settle, zero=True))
    budget = seconds("budget_s", lambda: _required("--drain-budget", drain_budget))
    idle = seconds("idle_s", lambda: _seconds("--drain-idle", drain_idle, off=True))
    max_inflight = seconds("max_inflight_s", lambda: _seconds("--drain-max-inflight", drain_max_inflight, off=True))
    decision = str(pool_drain["on_budget"]) if from_file("on_budget") else on_budget
    assert settle is not None and budget is not None  # neither can be switched off
    return {"drain_settle_s": settle, "drain_budget_s": budget, "drain_idle_s": idle,
            "drain_max_inflight_s": max_inflight, "on_budget": decision}


def _required(flag: str, text: str, *, zero: bool = False) -> float:
    value = _seconds(flag, text, zero=zero)
    assert value is not None
    return value


def _run(config: GatewayConfig, version: str, writer: SummaryWriter | None) -> None:
    import asyncio

    from llmslo.gateway import Gateway, event_loop_factory, loop_name, serve
    from llmslo.telemetry import SummarySink, Telemetry

    try:
        loop_factory = event_loop_factory()  # LLMSLO_LOOP
    except ConfigurationError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    sink = SummarySink(writer) if writer is not None else None
    tel = Telemetry(version=version, sink=sink, record_itl=True)  # the chunk times in each summary

    def ready(gw: Gateway) -> None:
        states = ", ".join(f"{b.id} {b.spec.url} ({'healthy' if b.healthy else 'unhealthy'})"
                           for b in gw.pool.backends.values())
        print(f"gateway on http://{config.host}:{gw.port} (admin http://127.0.0.1:{gw.admin_port}); "
              f"backends: {states}; event loop: {loop_name(asyncio.get_running_loop())}", flush=True)

    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            result = runner.run(serve(config, tel, say=say_on_stderr, on_ready=ready))
    except OSError as exc:
        raise _fail(f"cannot listen on {config.host}:{config.port} or admin port {config.admin_port}: "
                    f"{exc.strerror or exc}", EXIT_INPUT) from None
    finally:
        if sink is not None:
            sink.close(timeout_s=10.0)
    if result.drain_record_error is not None:
        raise _fail(result.drain_record_error, EXIT_INPUT)
    if result.drain is not None:
        written = "" if result.drain_record is None else f"; drain record {result.drain_record}"
        say_on_stderr(f"exit 0 (drain {result.drain.decision}{written})")


# ---- the admin API's client ------------------------------------------------------------------------------


def _call(admin: str, method: str, path: str, body: bytes | None = None, timeout: float = 10.0) -> object:
    url = admin.rstrip("/") + path
    request = urllib.request.Request(url, data=body, method=method,
                                     headers={"content-type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {exc.code}"
        raise _fail(f"{url}: {message}", EXIT_INPUT) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise _fail(f"{url}: no gateway admin API there ({reason}); is the gateway running? (--admin URL)",
                    EXIT_INPUT) from None


def _backend_line(b: dict[str, object]) -> str:
    state = "routable" if b.get("routable") else ("draining" if b.get("draining") else
                                                 ("out of the pool" if not b.get("in_pool") else
                                                  ("not routable" if b.get("breaker") == "open" else "unhealthy")))
    limit = b.get("limit")
    cap = ""
    if isinstance(limit, dict):
        tokens = limit.get("token_limit")
        over = limit.get("over_limit")
        past = f" ({over} sent past it)" if over else ""
        cap = (f"  slots {b.get('slots')}  limit {limit.get('limit')}{past}  tokens {limit.get('tokens_in_flight')}/"
               f"{'-' if tokens is None else tokens}")
    return (f"{b.get('id')}  {b.get('url')}  version {b.get('version')}  {state}  breaker {b.get('breaker')}{cap}  "
            f"outstanding {b.get('outstanding')}  served {b.get('served')}{_engine_part(b)}")


def _engine_part(b: dict[str, object]) -> str:
    """The engine's own load in a status line (empty when the gateway does not read it)."""
    if not b.get("engine"):
        return ""
    age = b.get("engine_read_age_s")
    if not isinstance(age, int | float):
        return f"  engine {b.get('engine')}: not read yet ({b.get('engine_last_error') or 'no read so far'})"
    kv = b.get("engine_kv_usage")
    kv_text = f"{kv:.0%}" if isinstance(kv, int | float) else "n/a"
    error = b.get("engine_last_error")
    stale = "" if b.get("engine_fresh") else \
        f" (stale: routing on outstanding requests{f'; {error}' if error else ''})"
    return (f"  engine {b.get('engine')}: waiting {b.get('engine_waiting'):g} running {b.get('engine_running'):g} "
            f"kv {kv_text}, read {age:.1f} s ago{stale}")


@gateway_app.command("status")
def status_command(admin: AdminOption = DEFAULT_ADMIN, as_json: JsonOption = False) -> None:
    """Every backend of a running gateway: routable or why not, its breaker, its requests."""
    data = _call(admin, "GET", "/admin/backends")
    if as_json:
        print(json.dumps(data, indent=2))
        return
    assert isinstance(data, list)
    for b in data:
        print(_backend_line(b))


@gateway_app.command("drain")
def drain_command(
    backend_id: Annotated[str, typer.Argument(help="The backend's id (llmslo gateway status lists them).",
                                              metavar="ID")],
    admin: AdminOption = DEFAULT_ADMIN,
    no_wait: Annotated[bool, typer.Option(
        "--no-wait", help="Return once the drain has begun (default: wait for its end and print its record).")]
        = False,
    budget: Annotated[str | None, typer.Option("--budget", help="This drain's wait budget (default: the "
                                                                "gateway's --drain-budget).", show_default=False)]
        = None,
    on_budget: Annotated[str | None, typer.Option(
        "--on-budget", help="At the budget: terminate, or return_to_pool (default: the gateway's).",
        show_default=False)] = None,
    as_json: JsonOption = False,
) -> None:
    """Drain one backend: out of the pool, the settle time, its requests in flight, then the record."""
    options: dict[str, object] = {}
    if budget is not None:
        options["budget_s"] = _required("--budget", budget)
    if on_budget is not None:
        if on_budget not in ("terminate", "return_to_pool"):
            raise _fail(f"--on-budget: terminate or return_to_pool, got {on_budget!r}", EXIT_USAGE)
        options["on_budget"] = on_budget
    wait = not no_wait
    path = f"/admin/backends/{backend_id}/drain" + ("?wait=1" if wait else "")
    data = _call(admin, "POST", path, json.dumps(options).encode(), timeout=3600.0)
    if as_json:
        print(json.dumps(data, indent=2))
        return
    assert isinstance(data, dict)
    if not wait:
        print(f"draining {backend_id}: {_backend_line(data)}")
        return
    closed = ", ".join(f"{k} {v}" for k, v in dict(data.get("closed_by_reason") or {}).items() if v) or "none"
    print(f"drained {backend_id}: {data.get('decision')} after {float(str(data.get('actual_drain_s'))):.2f} s; "
          f"{data.get('in_flight_at_start')} in flight at start, closed: {closed}")


@gateway_app.command("ready")
def ready_command(
    backend_id: Annotated[str, typer.Argument(help="The backend's id.", metavar="ID")],
    admin: AdminOption = DEFAULT_ADMIN,
) -> None:
    """Put a drained backend back in the pool."""
    data = _call(admin, "POST", f"/admin/backends/{backend_id}/ready", b"{}")
    assert isinstance(data, dict)
    print(_backend_line(data))
