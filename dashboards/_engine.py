"""The serving dashboard of an inference engine's own series (:mod:`llmslo.engines`), for servers without llmslo.

Built from the engine's profile: only the series it exports, each panel saying how the engine's definition
differs from llmslo's (``Series.difference``). Traffic (requests and token rates), latency (a heatmap and
p50/p90/p99 of each latency histogram the engine has, the spec's thresholds drawn), load (running and waiting
requests, KV-cache usage). No exemplars: engines attach none. A high-water mark is never drawn as a rate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmslo.dashboards._dashboard import Dashboard, Kind, datasource_variable, envelope, query_variable, uid
from llmslo.dashboards._panels import Grid, Step, Target, heatmap, timeseries
from llmslo.dashboards._promql import JOB, RATE_INTERVAL, Matcher, selector

if TYPE_CHECKING:
    from llmslo.engines import EngineProfile, Series
    from llmslo.rules import Model

LATENCY_CONCEPTS: tuple[tuple[str, str], ...] = (
    ("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "End-to-end latency"),
    ("queue_s", "Queue time"), ("prefill_s", "Prefill time"), ("decode_s", "Decode time"))
"""The latency concepts drawn when the engine has their histogram, with their panel names."""
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
REQUEST_CONCEPTS: tuple[str, ...] = (
    "requests_received", "requests_finished", "requests_succeeded", "requests_failed", "aborts", "preemptions")
TOKEN_CONCEPTS: tuple[tuple[str, str], ...] = (
    ("prompt_tokens", "prompt"), ("prompt_tokens_cached", "prompt, from the cache"), ("generated_tokens", "generated"))
MODEL_LABEL = "model_name"
"""The label engines that serve several models put the model name in (vLLM, SGLang, trtllm-serve)."""
MODEL = (MODEL_LABEL, "=~", "$model")


def _series(profile: EngineProfile, concept: str) -> Series | None:
    """The engine's current series of ``concept``, unless the profile says it lacks it."""
    series = profile.get(concept)
    return None if series is None or concept in profile.lacks or series.deprecated else series


def _filters(series: Series) -> list[Matcher]:
    return [JOB, MODEL] if MODEL_LABEL in series.labels else [JOB]


def _rate(series: Series, name: str | None = None, by: tuple[str, ...] = ()) -> str:
    grouping = f" by ({', '.join(by)})" if by else ""
    return f"sum{grouping} (rate({selector(name or series.name, _filters(series))}[{RATE_INTERVAL}]))"


def _about(series: Series, what: str) -> str:
    difference = f" How it differs from llmslo's definition: {series.difference}." if series.difference else ""
    return f"{what} ({series.name}).{difference}"


def _traffic(grid: Grid, profile: EngineProfile) -> None:
    targets, about = [], []
    for concept in REQUEST_CONCEPTS:
        series = _series(profile, concept)
        if series is None or series.type != "counter" or series.high_water:
            continue
        label = series.finish_label or next((x for x in series.labels if x in ("err", "http_code")), None)
        by = (label,) if label else ()
        legend = f"{concept} {{{{{label}}}}}" if label else concept
        targets.append(Target(_rate(series, by=by), legend))
        about.append(_about(series, concept.replace("_", " ")))
    grid.row("Traffic (the engine's counters)")
    if targets:
        grid.add(timeseries("Requests per second", " ".join(about), targets, unit="reqps"), 12)
    targets, about = [], []
    for concept, legend in TOKEN_CONCEPTS:
        series = _series(profile, concept)
        if series is None:
            continue
        name = f"{series.name}_sum" if series.type == "histogram" else series.name
        targets.append(Target(_rate(series, name), f"{legend} tokens per s"))
        about.append(_about(series, f"{legend} tokens"))
    if targets:
        grid.add(timeseries("Tokens per second (throughput)", " ".join(about), targets, unit="short"), 12)


def _thresholds(model: Model | None, concept: str) -> tuple[Step, ...]:
    if model is None:
        return ()
    bounds = sorted({slo.sli.threshold for slo in model.slos
                     if slo.sli is not None and slo.sli.kind == "histogram" and f"{slo.spec.metric}_s" == concept})
    return ((None, "green"), *((b, "red") for b in bounds)) if bounds else ()


def _latency(grid: Grid, profile: EngineProfile, model: Model | None) -> None:
    shown = [(c, n, s) for c, n in LATENCY_CONCEPTS if (s := _series(profile, c)) is not None and s.type == "histogram"]
    if not shown:
        return
    grid.row("Latency (the engine's clock)")
    for concept, name, series in shown:
        buckets = _rate(series, f"{series.name}_bucket", ("le",))
        grid.add(heatmap(f"{name}: distribution", _about(series, f"{name}: observations per second in each bucket"),
                         Target(buckets, "{{le}}", format="heatmap"), y_unit="s", cell_unit="short"), 12)
        steps = _thresholds(model, concept)
        slo = " The dashed line is the spec's SLO threshold." if steps else ""
        quantiles = [Target(f"histogram_quantile({q:g}, {buckets})", f"p{q * 100:g}") for q in QUANTILES]
        grid.add(timeseries(f"{name}: p50, p90, p99",
                            _about(series, f"{name}: quantiles estimated from the buckets over {RATE_INTERVAL}") + slo,
                            quantiles, unit="s", steps=steps, threshold_lines=bool(steps)), 12)


def _load(grid: Grid, profile: EngineProfile) -> None:
    targets, about = [], []
    for concept in ("running", "waiting"):
        series = _series(profile, concept)
        if series is not None:
            targets.append(Target(f"sum by (instance) ({selector(series.name, _filters(series))})",
                                  f"{{{{instance}}}} {concept}"))
            about.append(_about(series, f"requests {concept}"))
    grid.row("Load (the engine's gauges)")
    if targets:
        grid.add(timeseries("Requests running and waiting", " ".join(about), targets, unit="short", minimum=0), 12)
    kv = _series(profile, "kv_usage")
    if kv is not None:
        grid.add(timeseries("KV-cache usage", _about(kv, "KV-cache usage, a fraction of the cache"),
                            [Target(f"max by (instance) ({selector(kv.name, _filters(kv))})", "{{instance}}")],
                            unit="percentunit", minimum=0), 12)


def job_series(profile: EngineProfile) -> str:
    """A series every scrape of the engine holds, to list its jobs and models: its running-requests gauge."""
    for concept in ("running", "waiting", "generated_tokens", "prompt_tokens"):
        series = _series(profile, concept)
        if series is not None:
            return series.sample_names[0] if series.type == "histogram" else series.name
    raise ValueError(f"{profile.name} has no series to list its scrape jobs from")


def engine_dashboard(profile: EngineProfile, model: Model | None = None) -> Dashboard:
    """The serving dashboard of ``profile``'s own series; with a spec's ``model``, its job is preselected and
    its latency thresholds drawn."""
    spec = model.spec if model is not None else None
    grid = Grid()
    _traffic(grid, profile)
    _latency(grid, profile, model)
    _load(grid, profile)
    running = job_series(profile)
    variables = [
        datasource_variable(),
        query_variable("job", "Job", f"label_values({running}, job)", current=spec.job if spec else None,
                       description=f"The Prometheus job scraping the {profile.name} servers."),
    ]
    if any(MODEL_LABEL in s.labels for s in profile.series):
        selected = dict(spec.selector).get("model") if spec is not None else None
        variables.append(query_variable(
            "model", "Model", f"label_values({selector(running, [('job', '=', '$job')])}, {MODEL_LABEL})",
            current=selected, multi=True, include_all=True))
    service = spec.service if spec is not None else None
    title = f"llmslo {profile.name}: {service}" if service else f"llmslo {profile.name}"
    lacks = ", ".join(sorted(profile.lacks))
    description = (f"{profile.name}'s own /metrics ({profile.version}), read through llmslo's engine profile: "
                   f"requests and tokens, latency distributions, load. It lacks: {lacks}. "
                   + "Notes: " + "; ".join(profile.notes) + ".")
    kind: Kind = "serving"
    data = envelope(uid_=uid(engine_service(profile, service), kind), title=title, description=description,
                    service=service, variables=variables, panels=grid.panels, time_from="now-3h")
    return Dashboard(kind, data["uid"], title, f"{data['uid']}.json", data)


def engine_service(profile: EngineProfile, service: str | None) -> str:
    """The name in an engine dashboard's uid and file name: ``<service>-<engine>`` (the engine alone without a
    spec), so that they never replace the dashboards of llmslo's own series."""
    return f"{service}-{profile.key}" if service else profile.key
