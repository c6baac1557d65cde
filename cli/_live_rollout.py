"""``llmslo demo --rollout`` for a person: the live rolling update (:func:`llmslo.ops.run_live_rollout`) printed.

:func:`print_live_rollout` shows the phases, the requests by version (sent by each load; finished, by the
servers' summaries), v1's drain, the verdict of ``llmslo rollout compare`` with the regressions it found, and
the process figures apart from the outcomes. Times are Unix seconds, durations seconds.
"""

from __future__ import annotations

import json
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


def print_live_rollout(run: LiveRolloutRun, out: Console) -> None:
    """The run for a person: the phases, requests per version (sent, finished by reason), the drain, the
    verdict with the regressions found, and the process figures apart from the outcomes."""
    from rich.table import Table

    from llmslo.cli._common import shown

    plan = run.plan
    out.print(shown(f"phases: {V1} alone from 0 s; {V2} started at {_offset(run, run.v2_started_unix_s)} (the "
                    f"update begins), ready at {_offset(run, run.v2_ready_unix_s)}, serving from "
                    f"{_offset(run, run.v2_serving_unix_s)} (the overlap begins); SIGTERM to {V1} at "
                    f"{_offset(run, run.v1_sigterm_unix_s)}, exited at {_offset(run, run.v1_exited_unix_s)} (the "
                    f"overlap ends); the update ends at {_offset(run, run.update_ended_unix_s)}; {V2} alone until "
                    f"{_offset(run, run.v2_load_stopped_unix_s)}"), highlight=False, soft_wrap=True)
    counts = finish_counts(run.store, by=("version",)) if run.store.exists() else {}
    reasons = sorted({r for c in counts.values() for r in c})
    table = Table(title="Requests by version (sent by its load; finished, by the server's summaries)",
                  title_justify="left")
    for col in ("version", "speed", "sent", *reasons):
        table.add_column(shown(col), justify="left" if col == "version" else "right")
    for version, speed in ((V1, plan.v1_speed), (V2, plan.v2_speed)):
        sent = run.loads.get(version, {}).get("run", {}).get("sent")
        extra = " + 1 long reply" if version == V1 and run.long_stream_unix_s is not None else ""
        row = counts.get((version,), {})
        table.add_row(version, f"{speed:g}", f"{sent:,}{extra}" if sent is not None else "-",
                      *(f"{row.get(r, 0):,}" for r in reasons))
    out.print(table)
    try:
        drain = json.loads(run.drain_record.read_text())["drain"]
    except (OSError, ValueError, KeyError):
        out.print(f"drain of {V1}: no drain record was written", highlight=False)
    else:
        cut = ", ".join(f"{k} {v}" for k, v in drain.get("closed_by_reason", {}).items())
        out.print(shown(f"drain of {V1}: {drain.get('decision')}; {drain.get('in_flight_at_start')} in flight when "
                        f"it began; cut by reason: {cut}; terminated {drain.get('terminated')}"), highlight=False)
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
        "; ended by the "
        f"drain, by version: {process['terminated_by_version']}; refused while draining, by version: "
        f"{process['drain_rejected_by_version']}"), highlight=False, soft_wrap=True)
    out.print(shown(f"files: {run.folder} ({run.store.name}, summaries-v1/, summaries-v2/, attempts-v1.jsonl, "
                    f"attempts-v2.jsonl, {run.drain_record.name}, {run.update_record.name}, *.log)"),
              highlight=False, soft_wrap=True)
    out.print(shown(f"explore: llmslo rollout compare --db {run.store} --update {plan.update_id}   |   "
                    f"llmslo rollout show {plan.update_id} --db {run.store}"), highlight=False, soft_wrap=True)
