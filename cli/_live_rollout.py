"""``llmslo demo --rollout`` for a person: the live rolling update (:func:`llmslo.ops.run_live_rollout`) printed.

:func:`print_live_rollout` shows the phases, the requests by version (sent by the load; finished, by the
gateway's summaries), v1's drain with the rollout's three numbers, the verdict of ``llmslo rollout compare``
with the regressions it found, and the process figures apart from the outcomes. Times are Unix seconds,
durations seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llmslo.cli._live import finish_counts

if TYPE_CHECKING:
    from rich.console import Console

    from llmslo.ops import LiveRolloutRun

__all__ = ["print_live_rollout"]

V1, V2 = "v1", "v2"
"""The versions' names (the servers' ``--version``, so the summaries' ``version``)."""


def _offset(run: LiveRolloutRun, t: float | None) -> str:
    return "-" if t is None else f"{t - run.started_unix_s:.1f} s"


def _size(regression: Mapping[str, Any]) -> str:
    """A regression's size: the difference (seconds for a latency's median, a share for a rate) and the
    relative change."""
    metric = str(regression.get("metric"))
    diff, rel = regression.get("difference"), regression.get("relative_change")
    shown = "-" if diff is None else (f"{diff:+.4g} s (median)" if metric.endswith("_s") else f"{diff:+.4g}")
    return shown + ("" if rel is None else f", {rel * 100:+.1f} %")


def _p_value(p: float | None) -> str:
    """A p-value for a person: two significant digits, and below 1e-15 (where doubles stop) said so."""
    if p is None:
        return "-"
    return "< 1e-15" if p < 1e-15 else f"{p:.2g}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _drained(run: LiveRolloutRun) -> Mapping[str, Any] | None:
    batches = run.rollout.get("batches") or []
    drained = batches[0].get("drained") if batches else None
    return drained[0] if drained else None


def print_live_rollout(run: LiveRolloutRun, out: Console) -> None:
    """The run for a person: the phases, requests per version (sent, finished by reason), the drain, the
    verdict with the regressions found, and the process figures apart from the outcomes."""
    from rich.table import Table

    from llmslo.cli._common import shown

    plan = run.plan
    out.print(shown(f"phases: {V1} alone from 0 s; llmslo rollout run started {V2} at "
                    f"{_offset(run, run.v2_started_unix_s)} (the update begins), added it to the gateway's pool at "
                    f"{_offset(run, run.v2_serving_unix_s)} (the overlap begins), drained {V1} from "
                    f"{_offset(run, run.v1_drain_started_unix_s)} and stopped it at "
                    f"{_offset(run, run.v1_stopped_unix_s)} (the overlap and the update end); {V2} alone until "
                    f"{_offset(run, run.load_stopped_unix_s)}"), highlight=False, soft_wrap=True)
    counts = finish_counts(run.store, by=("version",)) if run.store.exists() else {}
    reasons = sorted({r for c in counts.values() for r in c})
    table = Table(title="Requests by version (finished, by the gateway's summaries)", title_justify="left")
    for col in ("version", "speed", "requests", *reasons):
        table.add_column(shown(col), justify="left" if col == "version" else "right")
    for version, speed in ((V1, plan.v1_speed), (V2, plan.v2_speed)):
        row = counts.get((version,), {})
        table.add_row(version, f"{speed:g}", f"{sum(row.values()):,}", *(f"{row.get(r, 0):,}" for r in reasons))
    out.print(table)
    sent = run.load.get("run", {}).get("sent")
    out.print(shown(f"sent by the load: {sent if sent is None else f'{sent:,}'}, plus 1 long reply"),
              highlight=False)
    drained = _drained(run)
    if drained is None:
        out.print(f"drain of {V1}: none recorded", highlight=False)
    else:
        drain = drained["drain"]
        cut = ", ".join(f"{k} {v}" for k, v in drain.get("closed_by_reason", {}).items())
        out.print(shown(f"drain of {V1}: {drain.get('decision')}; {drain.get('in_flight_at_start')} in flight when "
                        f"it began; cut by reason: {cut}; terminated {drained['terminated']}; actual drain "
                        f"{drained['actual_drain_s']:.2f} s; removal propagated in {drained['propagation_s']:.3f} s"),
                  highlight=False, soft_wrap=True)
    comparison = run.comparison
    if comparison is None:
        out.print("comparison: none (the run stopped before it)", highlight=False)
        return
    out.print(shown(f"verdict: {comparison['verdict']} (Holm over {comparison['tests_in_family']} tests, alpha "
                    f"{comparison['alpha']:g})"), highlight=False)
    regressions = Table(title="Regressions found", title_justify="left")
    for col in ("version", "metric", "against", "size", "Holm p"):
        regressions.add_column(col)
    for r in comparison["regressions"]:
        regressions.add_row(shown(str(r["version"])), shown(str(r["metric"])), shown(str(r["reference"])),
                            shown(_size(r)), _p_value(r["p_adjusted"]))
    if comparison["regressions"]:
        out.print(regressions)
    process = comparison["process"]
    update = process.get("update") or {}
    out.print(shown(
        f"process figures (kept out of the outcome rates): wait budget {_seconds(update.get('wait_budget_s'))}, "
        f"actual drain {_seconds(update.get('actual_drain_s'))}, settle {_seconds(update.get('unregister_settle_s'))}"
        "; of the window's "
        f"arrivals, ended by the drain, by version: {process['terminated_by_version']}; refused while draining, by "
        "version: "
        f"{process['drain_rejected_by_version']}"), highlight=False, soft_wrap=True)
    out.print(shown(f"files: {run.folder} ({run.store.name}, {run.summaries.name}/, {run.attempts_log.name}, "
                    f"{run.update_record.name}, rollout-logs/, *.log)"), highlight=False, soft_wrap=True)
    out.print(shown(f"explore: llmslo rollout compare --db {run.store} --update {run.record_id}   |   "
                    f"llmslo rollout show {run.record_id} --db {run.store}"), highlight=False, soft_wrap=True)
