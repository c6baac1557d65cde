"""``llmslo autoscale``: replay a trace through simulated engines, the gateway's queue and an HPA-like controller."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmslo.cli._common import EXIT_INPUT, EXIT_USAGE, shown
from llmslo.cli._common import console as _console
from llmslo.cli._common import duration as _duration
from llmslo.cli._common import fail as _fail
from llmslo.telemetry import LlmsloError, format_duration

if TYPE_CHECKING:
    from rich.console import Console

    from llmslo.ops import AutoscalePolicy, Simulation

__all__ = ["autoscale_app", "simulate_command"]

PICTURE_SUFFIXES = (".svg", ".png", ".html")
"""The picture formats ``--out`` writes (SVG and PNG through vl-convert-python, HTML without it)."""

autoscale_app = typer.Typer(
    name="autoscale",
    help=(
        "Simulate HPA autoscaling on a trace, by policy.\n\n"
        "An arrival schedule replayed through N simulated engines (the fitted profiles of llmslo serve), the "
        "gateway's bounded queue with 429 + Retry-After, and an HPA-like controller (sync period, "
        "stabilisation windows, pod start delay); policies compared by goodput and GPU-seconds.\n\n"
        "Start with: llmslo autoscale simulate --trace-kind azure AzureLLMInferenceTrace_code.csv "
        "--policy examples/hpa-queue.yaml --policy examples/hpa-gpu.yaml --out autoscale.svg"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _offset(name: str, text: str | None) -> float | None:
    """``--NAME`` in seconds (``0`` allowed); a bad value exits 2 naming the option."""
    if text is None:
        return None
    if text.strip() in ("0", "0s"):
        return 0.0
    return _duration(name, text)


def _check_out(out: Path | None) -> None:
    """Exit 2 for a picture format ``--out`` cannot write, 1 when SVG/PNG lack vl-convert-python."""
    if out is None:
        return
    suffix = out.suffix.lower()
    if suffix not in PICTURE_SUFFIXES:
        raise _fail(f"--out {out}: the picture is written as {', '.join(PICTURE_SUFFIXES)} (from the file's "
                    f"suffix), got {suffix or 'no suffix'!r}", EXIT_USAGE)
    if importlib.util.find_spec("altair") is None:
        raise _fail("--out: drawing the picture needs Altair: pip install 'llmslo[app]'", EXIT_INPUT)
    if suffix in (".svg", ".png") and importlib.util.find_spec("vl_convert") is None:
        raise _fail(f"--out {out}: writing {suffix[1:].upper()} needs the vl-convert-python package (pip install "
                    "vl-convert-python); an .html picture is written without it", EXIT_INPUT)


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g} s" if x < 10 else f"{x:,.1f} s"


def _print_run(out: Console, sim: Simulation, bucket_s: float) -> None:
    from rich.table import Table

    p = sim.policy
    out.print(f"[bold]{shown(p.name)}[/bold]: {shown(p.metric)} target {p.target:g}"
              f"{' per replica' if p.metric != 'gpu_utilization' else ''}; replicas {p.min_replicas}-"
              f"{p.max_replicas} (start {p.initial_replicas}), sync {p.sync_period_s:g} s, stabilisation up "
              f"{p.scale_up_stabilization_s:g} s / down {p.scale_down_stabilization_s:g} s, pod start "
              f"{p.pod_start_delay_s:g} s; engine {shown(p.profile)} x {p.max_num_seqs} slots; queue "
              f"{p.max_queue}, timeout {p.queue_timeout_s:g} s", highlight=False, soft_wrap=True)
    t = Table(title=f"{p.name}: over time (requests by arrival, per {format_duration(bucket_s)})",
              title_justify="left")
    for col in ("from", "arrivals", "admitted", "429 full", "429 timeout", "429/s", "good", "goodput/s",
                "desired", "ready", "queue max", "GPU-s"):
        t.add_column(col, justify="right")
    for b in sim.buckets(bucket_s):
        t.add_row(f"{b.start_s:,.0f} s", f"{b.arrivals:,}", f"{b.admitted:,}", f"{b.rejected:,}",
                  f"{b.timed_out:,}", f"{b.http_429_per_s:.2f}", f"{b.good:,}", f"{b.goodput_per_s:.2f}",
                  str(b.desired), str(b.ready), str(b.queue_max), f"{b.gpu_s:,.0f}")
    out.print(t)


def _print_comparison(out: Console, sims: list[Simulation]) -> None:
    from rich.table import Table

    t = Table(title="Policies by goodput and GPU-seconds", title_justify="left")
    for col in ("policy", "arrivals", "good", "goodput", "good/s", "GPU-s", "good per GPU-s", "429 full",
                "429 timeout", "TTFT p99 (admitted)", "TTFT max", "most ready"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for sim in sims:
        s = sim.totals()
        t.add_row(shown(s.policy), f"{s.arrivals:,}", f"{s.good:,}", f"{s.goodput_fraction:.1%}",
                  f"{s.goodput_per_s:.2f}", f"{s.gpu_s:,.0f}", f"{s.good_per_gpu_s:.3f}", f"{s.rejected:,}",
                  f"{s.timed_out:,}", _seconds(s.ttft_p99_s), _seconds(s.ttft_max_s), str(s.max_ready))
    out.print(t)
    slo = sims[0].policy.slo
    out.print(f"good: completed with TTFT <= {slo.ttft_s:g} s and TPOT <= {slo.tpot_s:g} s (each policy's slo); "
              "goodput = good / arrivals (refused requests count); GPU-s: replica-seconds from creation, starting "
              "replicas included", highlight=False, soft_wrap=True)


def _picture_rows(sims: list[Simulation], bucket_s: float) -> list[dict[str, Any]]:
    """Long rows (policy, t_s, panel, line, value) for the picture: replicas and the queue from the
    samples, 429s and goodput per second by bucket."""
    rows: list[dict[str, Any]] = []
    for sim in sims:
        name = sim.policy.name
        for s in sim.samples:
            rows.append({"policy": name, "t_s": s.t_s, "panel": "replicas", "line": "ready",
                         "value": s.ready})
            rows.append({"policy": name, "t_s": s.t_s, "panel": "replicas", "line": "desired",
                         "value": s.desired})
            rows.append({"policy": name, "t_s": s.t_s, "panel": "queue length", "line": "", "value": s.queue})
        for b in sim.buckets(bucket_s):
            mid = b.start_s
            rows.append({"policy": name, "t_s": mid, "panel": "429 per s", "line": "",
                         "value": b.http_429_per_s})
            rows.append({"policy": name, "t_s": mid, "panel": "goodput per s", "line": "",
                         "value": b.goodput_per_s})
    return rows


def _write_picture(path: Path, sims: list[Simulation], bucket_s: float, title: str) -> None:
    """Draw replicas, queue length, 429s and goodput over time, one panel each, and write ``path``."""
    import altair as alt

    panels = ("replicas", "queue length", "429 per s", "goodput per s")
    data = alt.InlineData(values=_picture_rows(sims, bucket_s))
    charts = []
    for panel in panels:
        mark = alt.Chart(data).mark_line(interpolate="step-after", strokeWidth=1.5)
        charts.append(mark.transform_filter(alt.datum.panel == panel).encode(
            alt.X("t_s:Q", title="seconds after the window's first arrival"),
            alt.Y("value:Q", title=panel),
            alt.Color("policy:N", title="policy"),
            alt.StrokeDash("line:N", title="replicas", legend=alt.Legend() if panel == "replicas" else None),
        ).properties(width=720, height=130))
    chart = alt.vconcat(*charts, title=title)
    chart.save(str(path))


@autoscale_app.command("simulate")
def simulate_command(
    trace: Annotated[Path, typer.Argument(help="The trace file (Azure CSV, Mooncake JSONL or BurstGPT CSV).",
                                          show_default=False)],
    policy: Annotated[list[Path], typer.Option(
        "--policy", help="A policy file (YAML; see examples/hpa-queue.yaml). Repeat it to compare policies.",
        show_default=False)],
    trace_kind: Annotated[str, typer.Option(
        "--trace-kind", help="azure, mooncake, burstgpt, or auto (from the file's first line).")] = "auto",
    start: Annotated[str | None, typer.Option(
        "--start", help="Replay from this long after the trace's first arrival, e.g. 180s (default: 0).",
        show_default=False)] = None,
    duration: Annotated[str | None, typer.Option(
        "--duration", help="Replay this much of the trace, e.g. 10m (default: to its end).",
        show_default=False)] = None,
    bucket: Annotated[str, typer.Option("--bucket", help="Width of a row of the table over time, e.g. 30s.")]
        = "60s",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the Retry-After jitter (runs are deterministic).")]
        = 0,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write the picture (replicas, queue, 429/s, goodput/s over time): .svg or .png (needs "
        "vl-convert-python) or .html.", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")] = False,
) -> None:
    """Replay a trace through simulated engines, the gateway's queue and an HPA-like controller, per policy.

    Each policy file sets the controller (metric: queue_length, concurrency or gpu_utilization, and its
    target; sync_period_s; scale_up/down_stabilization_s; min/max/initial_replicas; pod_start_delay_s), the
    engines (profile, max_num_seqs: slots per replica), the gateway's queue (max_queue, queue_timeout_s)
    and the SLO (slo: ttft_s, tpot_s). Everything runs on simulated time, deterministic for --seed.

    Prints, per policy, a table over time by --bucket (arrivals, admitted, 429s at the full queue and after
    the queue timeout, good requests, replicas desired and ready, the deepest queue, GPU-seconds), then the
    policies side by side by goodput and GPU-seconds. docs/autoscaling.md says what is simulated and what is
    not.
    """
    from llmslo.ops import PolicyError, load_policy, read_arrivals, simulate

    bucket_s = _duration("bucket", bucket)
    start_s = _offset("start", start) or 0.0
    span_s = _duration("duration", duration) if duration is not None else None
    kinds = ("azure", "mooncake", "burstgpt", "auto")
    if trace_kind not in kinds:
        raise _fail(f"--trace-kind: must be one of {', '.join(kinds)}, got {trace_kind!r}", EXIT_USAGE)
    _check_out(out)
    if not trace.is_file():
        raise _fail(f"{trace}: no such trace file", EXIT_INPUT)
    policies: list[AutoscalePolicy] = []
    try:
        for path in policy:
            policies.append(load_policy(path))
    except PolicyError as exc:
        raise _fail(str(exc), EXIT_INPUT) from None
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise _fail(f"--policy: two policies share a name ({', '.join(names)}): give each file its own name",
                    EXIT_INPUT)
    try:
        arrivals = read_arrivals(trace_kind, trace, start_s=start_s,
                                 end_s=None if span_s is None else start_s + span_s)
    except (LlmsloError, ValueError) as exc:
        raise _fail(str(exc), EXIT_INPUT) from None
    if not arrivals:
        raise _fail(f"{trace}: no arrival between --start {start_s:g} s and the end of the window", EXIT_INPUT)
    sims = [simulate(p, arrivals, seed=seed) for p in policies]
    window = f"{start_s:g} s + {'the rest' if span_s is None else format_duration(span_s)}"
    if out is not None:
        _write_picture(out, sims, bucket_s, f"{trace.name} ({window}), {len(arrivals):,} requests")
    if as_json:
        print(json.dumps({
            "trace": {"file": str(trace), "kind": trace_kind, "start_s": start_s, "duration_s": span_s,
                      "requests": len(arrivals)},
            "seed": seed, "bucket_s": bucket_s, "picture": None if out is None else str(out),
            "policies": [{"policy": s.policy.to_dict(), "totals": _asdict(s.totals()),
                          "buckets": [_asdict(b) for b in s.buckets(bucket_s)]} for s in sims],
        }))
        return
    console = _console()
    console.print(f"{shown(trace)} ({shown(trace_kind)}), window {window}: {len(arrivals):,} requests, seed {seed}",
                  highlight=False, soft_wrap=True)
    for sim in sims:
        _print_run(console, sim, bucket_s)
    _print_comparison(console, sims)
    if out is not None:
        console.print(f"picture: {shown(out)}", highlight=False, soft_wrap=True)


def _asdict(obj: object) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(obj)  # type: ignore[call-overload, no-any-return]
