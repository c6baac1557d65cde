"""The serving dashboard: traffic, latency distributions with exemplars, admission, breakers and drains, a
gateway's backends, stream backpressure, GPUs. Every query reads a metric of the :mod:`llmslo.telemetry` catalogue."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmslo.dashboards._dashboard import Dashboard, Kind, datasource_variable, envelope, query_variable, uid
from llmslo.dashboards._panels import DASHED, Grid, Json, Step, Target, heatmap, override, state_timeline, timeseries
from llmslo.dashboards._promql import RATE_INTERVAL, quantile, selector, series, sum_rate
from llmslo.telemetry import BREAKER_STATES, METRICS_BY_KEY, Metric

if TYPE_CHECKING:
    from llmslo.rules import Model, Spec

M = METRICS_BY_KEY

LATENCIES: tuple[tuple[str, str], ...] = (
    ("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL (token-weighted)"), ("e2e", "End-to-end latency"))
"""The latency histograms shown, by catalogue key, with their panel names."""
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
"""The quantiles drawn for each latency (bucket estimates)."""
TOKEN_COUNTS: tuple[str, ...] = ("prompt_tokens", "proposed_tokens", "generated_tokens", "sent_tokens")
"""The four token counters, each drawn as its own rate (every rate names its numerator)."""

_TERMINAL = ("Counted when each request reaches its terminal state (the completion's time; the offline report "
             "counts by arrival).")
_EXEMPLARS = ("Exemplars (the dots) carry the request_id and trace_id of the slowest recent request of their "
              "bucket: hover or click one to read them.")


def _traffic(grid: Grid) -> None:
    requests, good, attempted = M["requests"], M["goodput_good"], M["goodput_attempted"]
    grid.row("Traffic")
    grid.add(timeseries(
        "Requests by finish reason", f"{requests.help} Per second. {_TERMINAL}",
        [Target(sum_rate(requests, ("finish_reason",)), "{{finish_reason}}")], unit="reqps", stack=True), 8)
    grid.add(timeseries(
        "Tokens per second, by count",
        "The four token counts of finished requests, per second, each named by its numerator: prompt, proposed "
        "(speculative drafts), generated (committed by the engine), sent (handed to the transport). The token "
        f"counters carry no finish reason. {_TERMINAL}",
        [Target(sum_rate(M[key]), f"{key}_per_s") for key in TOKEN_COUNTS], unit="short"), 8)
    ratio = f"{sum_rate(good, ('slo_class',))} / ({sum_rate(attempted, ('slo_class',))} > 0)"
    grid.add(timeseries(
        "Goodput fraction by SLO class",
        f"Good / attempted requests per SLO class (goodput policy). Attempted: {attempted.help} Good: {good.help} "
        f"{_TERMINAL}",
        [Target(ratio, "{{slo_class}}")], unit="percentunit", minimum=0), 8)


def _thresholds(spec: Spec | None, key: str) -> tuple[Step, ...]:
    """The thresholds of the spec's latency objectives on ``key`` (seconds), as red steps over green."""
    if spec is None:
        return ()
    bounds = sorted({o.threshold_s for o in spec.objectives
                     if o.kind == "latency" and o.metric == key and o.threshold_s is not None})
    return ((None, "green"), *((b, "red") for b in bounds)) if bounds else ()


def _latency(grid: Grid, spec: Spec | None) -> None:
    grid.row("Latency (server clock)")
    for key, name in LATENCIES:
        metric = M[key]
        buckets = sum_rate(metric, ("le",), metric.bucket)
        grid.add(heatmap(
            f"{name}: distribution", f"{metric.help} Cells: observations per second in each bucket. {_EXEMPLARS}",
            Target(buckets, "{{le}}", exemplar=True, format="heatmap"), y_unit="s", cell_unit="short"), 12)
        steps = _thresholds(spec, key)
        slo = " The dashed line is the spec's SLO threshold." if steps else ""
        grid.add(timeseries(
            f"{name}: p50, p90, p99",
            f"{metric.help} Quantiles estimated from the buckets over {RATE_INTERVAL}.{slo} {_EXEMPLARS}",
            [Target(quantile(metric, q), f"p{q * 100:g}", exemplar=q == QUANTILES[-1]) for q in QUANTILES],
            unit="s", steps=steps, threshold_lines=bool(steps)), 12)


def _by_model(metric: Metric) -> str:
    return f"sum by (model) ({series(metric)})"


def _admission(grid: Grid) -> None:
    queued, capacity, in_flight = M["queued"], M["queue_capacity"], M["in_flight"]
    rejected, shed, degraded = M["rejected_requests"], M["shed_requests"], M["degraded_requests"]
    grid.row("Admission and load")
    grid.add(timeseries(
        "Queue depth against capacity",
        f"Queued: {queued.help} Capacity (dashed): {capacity.help} In flight: {in_flight.help}",
        [Target(_by_model(queued), "{{model}} queued"), Target(_by_model(capacity), "{{model}} capacity"),
         Target(_by_model(in_flight), "{{model}} in flight")],
        unit="short", minimum=0, overrides=[override(".* capacity", DASHED, ("custom.fillOpacity", 0))]), 8)
    grid.add(timeseries(
        "Rejections by reason", f"{rejected.help} Per second (429 queue_full and rate_limited, 503 circuit_open "
                                f"and draining). {_TERMINAL}",
        [Target(sum_rate(rejected, ("reject_reason",)), "{{reject_reason}}")], unit="reqps", stack=True), 8)
    grid.add(timeseries(
        "Load shedding and degradation", f"Shed: {shed.help} Degraded: {degraded.help} Per second.",
        [Target(sum_rate(shed, ("signal",)), "shed ({{signal}})"),
         Target(sum_rate(degraded, ("action",)), "degraded ({{action}})")], unit="reqps"), 8)


def _breaker_state_expr() -> str:
    """One value per breaker: the index of its state in the catalogue's BREAKER_STATES (0 closed, 1 half_open,
    2 open), the worst over instances."""
    breaker = M["breaker_state"]
    parts = [f"{f'{i} * ' if i > 1 else ''}max by (breaker) ({series(breaker, extra=[('state', '=', state)])})"
             for i, state in enumerate(BREAKER_STATES) if i > 0]
    return " + ".join(parts)


_STATE_COLOURS = {"closed": "green", "half_open": "yellow", "open": "red"}


def _resilience(grid: Grid) -> None:
    breaker, transitions = M["breaker_state"], M["breaker_transitions"]
    draining, closed = M["draining"], M["drain_closed_streams"]
    grid.row("Circuit breakers and drains")
    grid.add(state_timeline(
        "Circuit breaker state", f"{breaker.help} Shown per breaker, the worst state over instances.",
        [Target(_breaker_state_expr(), "{{breaker}}")],
        [(i, state, _STATE_COLOURS.get(state, "text")) for i, state in enumerate(BREAKER_STATES)]), 12)
    grid.add(timeseries(
        "Breaker transitions", f"{transitions.help} Per {RATE_INTERVAL}.",
        [Target(f"sum by (breaker, to_state) (increase({series(transitions)}[{RATE_INTERVAL}]))",
                "{{breaker}} to {{to_state}}")], unit="short", bars=True), 12)
    grid.add(state_timeline(
        "Draining", f"{draining.help} One lane per instance.",
        [Target(f"max by (instance) ({series(draining)})", "{{instance}}")],
        [(0, "serving", "green"), (1, "draining", "orange")]), 12)
    grid.add(timeseries(
        "Streams closed by the drain", f"{closed.help} Per {RATE_INTERVAL}.",
        [Target(f"sum by (reason) (increase({series(closed)}[{RATE_INTERVAL}]))", "{{reason}}")],
        unit="short", bars=True), 12)


def _gateway(grid: Grid) -> None:
    routable, draining = M["backend_routable"], M["backend_draining"]
    outstanding, limit = M["backend_outstanding"], M["backend_limit"]
    forwarded, changes = M["backend_requests"], M["backend_pool_changes"]
    grid.row("Gateway backends")
    grid.add(state_timeline(
        "Backend routable", f"{routable.help} One lane per backend, the worst over gateways.",
        [Target(f"min by (backend) ({series(routable)})", "{{backend}}")],
        [(0, "not routed", "red"), (1, "routable", "green")]), 8)
    grid.add(state_timeline(
        "Backend draining", f"{draining.help} One lane per backend.",
        [Target(f"max by (backend) ({series(draining)})", "{{backend}}")],
        [(0, "serving", "green"), (1, "draining", "orange")]), 8)
    grid.add(timeseries(
        "Backend pool changes", f"{changes.help} Per {RATE_INTERVAL}.",
        [Target(f"sum by (backend) (increase({series(changes)}[{RATE_INTERVAL}]))", "{{backend}}")],
        unit="short", bars=True), 8)
    grid.add(_against_limit("Outstanding requests against the limit", "Outstanding", outstanding, limit), 12)
    grid.add(timeseries(
        "Requests forwarded per backend", f"{forwarded.help} Per second.",
        [Target(f"sum by (backend) (rate({series(forwarded)}[{RATE_INTERVAL}]))", "{{backend}}")],
        unit="reqps", stack=True), 12)
    grid.add(_against_limit("Tokens in flight against the token limit", "In flight", M["backend_tokens"],
                            M["backend_token_limit"]), 12)
    failures, fallbacks = M["backend_engine_read_failures"], M["backend_engine_fallbacks"]
    grid.add(timeseries(
        "Engine metrics: failed reads and fallbacks",
        f"Failed reads: {failures.help} Fallbacks: {fallbacks.help} Per {RATE_INTERVAL}.",
        [Target(f"sum by (backend) (increase({series(failures)}[{RATE_INTERVAL}]))", "{{backend}} failed reads"),
         Target(f"sum by (backend) (increase({series(fallbacks)}[{RATE_INTERVAL}]))", "{{backend}} fallbacks")],
        unit="short", bars=True), 12)


def _against_limit(title: str, what: str, current: Metric, limit: Metric) -> Json:
    """A panel of each backend's ``current`` (legend: ``what``, lower-cased) beside its ``limit`` (dashed)."""
    return timeseries(
        title, f"{what}: {current.help} Limit (dashed): {limit.help}",
        [Target(f"sum by (backend) ({series(current)})", "{{backend}} " + what.lower()),
         Target(f"sum by (backend) ({series(limit)})", "{{backend}} limit")],
        unit="short", minimum=0, overrides=[override(".* limit", DASHED, ("custom.fillOpacity", 0))])


def _streams(grid: Grid) -> None:
    paused, generated, sent = M["paused_streams"], M["generated_tokens"], M["sent_tokens"]
    grid.row("Streams and backpressure")
    grid.add(timeseries(
        "Paused streams", paused.help, [Target(_by_model(paused), "{{model}}")], unit="short", minimum=0), 12)
    grid.add(timeseries(
        "Backpressure waste",
        "Generated minus sent tokens of finished requests, per second: tokens the engine committed that never "
        f"reached the client (work done for nobody). {_TERMINAL}",
        [Target(f"{sum_rate(generated)} - {sum_rate(sent)}", "generated - sent tokens per s")], unit="short"), 12)


def _gpu(grid: Grid) -> None:
    grid.row("GPU")
    legend = "{{instance}} GPU {{gpu}}"
    panels = (("gpu_utilization", "GPU utilisation", "percentunit"), ("gpu_power", "GPU power", "watt"),
              ("gpu_temperature", "GPU temperature", "celsius"), ("gpu_sm_clock", "SM clock", "hertz"))
    used, total = M["gpu_memory_used"], M["gpu_memory_total"]
    grid.add(timeseries(
        "GPU memory", f"Used: {used.help} Installed (dashed): {total.help}",
        [Target(series(used), f"{legend} used"), Target(series(total), f"{legend} installed")],
        unit="bytes", minimum=0, overrides=[override(".* installed", DASHED, ("custom.fillOpacity", 0))]), 8)
    for key, title, unit in panels:
        grid.add(timeseries(title, M[key].help, [Target(series(M[key]), legend)], unit=unit), 8)
    throttle = M["gpu_throttle_reasons"]
    grid.add(timeseries("GPU throttle reasons", throttle.help,
                        [Target(series(throttle), legend)], unit="none"), 8)


def serving_dashboard(model: Model | None = None) -> Dashboard:
    """The serving dashboard; with the ``model`` of an SLO spec, its service, job and model are preselected
    and its latency thresholds drawn on the quantile panels."""
    spec = model.spec if model is not None else None
    service = spec.service if spec is not None else None
    grid = Grid()
    _traffic(grid)
    _latency(grid, spec)
    _admission(grid)
    _resilience(grid)
    _gateway(grid)
    _streams(grid)
    _gpu(grid)
    requests = M["requests"]
    selected_model = dict(spec.selector).get("model") if spec is not None else None
    variables = [
        datasource_variable(),
        query_variable("job", "Job", f"label_values({requests.name}, job)",
                       current=spec.job if spec is not None else None,
                       description="The Prometheus job scraping the servers."),
        query_variable("model", "Model", f"label_values({selector(requests.name, [('job', '=', '$job')])}, model)",
                       current=selected_model, multi=True, include_all=True),
    ]
    title = f"llmslo serving: {service}" if service else "llmslo serving"
    description = ("Requests, tokens, latency distributions with request_id exemplars, admission, circuit "
                   "breakers, drains, a gateway's backends, backpressure and GPUs, from llmslo telemetry metrics.")
    kind: Kind = "serving"
    data = envelope(uid_=uid(service, kind), title=title, description=description, service=service,
                    variables=variables, panels=grid.panels, time_from="now-3h")
    return Dashboard(kind, data["uid"], title, f"{data['uid']}.json", data)
