"""``llmslo dashboards``: Grafana dashboards from the metric name catalogue and, when given, an SLO spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmslo.cli._common import EXIT_INPUT, EXIT_USAGE, print_refusals, refusals_json, shown, spec_model
from llmslo.cli._common import console as _console
from llmslo.cli._common import fail as _fail
from llmslo.cli._help import INFERENCE_ENGINES

if TYPE_CHECKING:
    from llmslo.dashboards import Dashboard

__all__ = ["dashboards_app"]

dashboards_app = typer.Typer(
    name="dashboards",
    help=(
        "Grafana dashboards for llmslo telemetry: a serving dashboard (requests and tokens, TTFT/TPOT/ITL/e2e "
        "heatmaps and quantiles with request_id exemplars, queue against capacity, rejections, breakers, "
        "drains, backpressure, GPUs) and an SLO dashboard (error budget left, burn rates, alert state, from "
        "the recording rules of llmslo rules generate).\n\n"
        "Start with: llmslo dashboards generate --spec examples/chat-slo.yaml -o dashboards/\n\n"
        f"Over an inference engine's own /metrics instead: --engine {'|'.join(INFERENCE_ENGINES)}."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@dashboards_app.callback()
def _group() -> None:
    """Keeps ``dashboards`` a group of commands (``llmslo dashboards generate``) however many it holds."""


def _summary(dashboard: Dashboard, path: Path) -> dict[str, object]:
    from llmslo.dashboards import panel_queries

    panels = [p for p in dashboard.data["panels"] if p.get("type") != "row"]
    return {"path": str(path), "kind": dashboard.kind, "uid": dashboard.uid, "title": dashboard.title,
            "panels": len(panels), "queries": len(panel_queries(dashboard.data))}


@dashboards_app.command()
def generate(
    output: Annotated[Path, typer.Option(
        "-o", "--output", help="Folder to write the dashboards into (created if missing); files of the same "
        "name are replaced.", show_default=False)],
    spec: Annotated[Path | None, typer.Option(
        "--spec", help="SLO spec (YAML, version: llmslo/v1): the SLO dashboard then shows its objectives with "
        "their own windows and burn rates, the job and model are preselected, and its latency thresholds are "
        "drawn on the serving dashboard. Without it, the SLO dashboard repeats one row per SLO found in "
        "Prometheus, with the default burn-rate windows.", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object listing the files written.")] = False,
    engine: Annotated[str | None, typer.Option(
        "--engine", help=f"Draw the inference engine's own series ({', '.join(INFERENCE_ENGINES)}) instead of "
        "llmslo's telemetry: a serving dashboard of what the engine exports, and the SLO dashboard of the rules "
        "llmslo rules generate --engine makes for the same spec (objectives the engine cannot give are "
        "refused, with the reason).", show_default=False)] = None,
    spec_argument: Annotated[Path | None, typer.Argument(
        metavar="SPEC", help="SLO spec, as with --spec (give one or the other).", show_default=False)] = None,
) -> None:
    """Write the serving and SLO dashboards (Grafana JSON) into a folder.

    Files: llmslo-serving.json and llmslo-slo.json, or llmslo-SERVICE-serving.json and
    llmslo-SERVICE-slo.json with --spec. Byte-deterministic: the same spec and llmslo version give the same
    files. Every file is written completely before any is replaced.

    Every query reads the Prometheus data source chosen in the dashboard's "datasource" variable and the
    scrape job chosen in its "job" variable; every metric name is one llmslo's telemetry exposes. The SLO
    dashboard reads the series of the rules from llmslo rules generate with the same spec: load those rules
    into Prometheus first.

    Import into Grafana: Dashboards > New > Import, upload each file, then pick the Prometheus data
    source in the "datasource" drop-down. Or provision the folder (a dashboards provider whose path is
    the output folder). Exemplars (request_id, trace_id) need Prometheus started with
    --enable-feature=exemplar-storage.

    With --engine, the serving dashboard draws that engine's own series (requests and tokens, latency
    histograms, running and waiting requests, KV cache: what the engine exports) and the files are named
    llmslo-[SERVICE-]ENGINE-serving.json and -slo.json.

    With --json, one object: spec, and files (path, kind, uid, title, panels, queries) (and with --engine:
    engine, refused).
    """
    from llmslo.dashboards import build_dashboards, write_dashboards

    if spec is not None and spec_argument is not None:
        raise _fail("give the spec once: as SPEC or as --spec", EXIT_USAGE)
    spec = spec if spec is not None else spec_argument
    model = spec_model(spec, engine) if spec is not None else None
    if model is not None:
        print_refusals(model)
    profile = None
    if engine is not None and model is None:
        from llmslo.engines import ENGINES

        if engine not in ENGINES:
            raise _fail(f"--engine: unknown engine {engine!r}; known engines: {', '.join(ENGINES)}", EXIT_USAGE)
        profile = ENGINES[engine]
    dashboards = build_dashboards(model, profile)
    try:
        paths = write_dashboards(dashboards, output)
    except OSError as exc:
        raise _fail(f"cannot write the dashboards into {output}: {exc.strerror or exc}", EXIT_INPUT) from None
    summaries = [_summary(d, p) for d, p in zip(dashboards, paths, strict=True)]
    if as_json:
        data: dict[str, object] = {"spec": str(spec) if spec is not None else None, "files": summaries}
        if engine is not None:
            data |= {"engine": engine, "refused": refusals_json(model) if model is not None else []}
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    console = _console()
    for s in summaries:
        console.print(f"wrote {shown(s['path'])}: {shown(s['title'])} ({s['panels']} panels, {s['queries']} "
                      f"queries, uid {shown(s['uid'])})", highlight=False)
    console.print("import them in Grafana: Dashboards > New > Import, upload each file, pick the Prometheus data "
                  "source", highlight=False)
