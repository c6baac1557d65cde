"""``llmslo rollout compare``: the versions during an update's overlap window, against their baselines and
each other, with a verdict (``lossless``, ``regression``, ``insufficient_data``).

Outcome figures and process figures are printed as separate sections; every value read from the store
reaches the terminal through :func:`shown`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmslo.cli._common import EXIT_USAGE, parse_time, shown
from llmslo.cli._common import console as _console
from llmslo.cli._common import fail as _fail
from llmslo.cli._common import threshold as _threshold
from llmslo.telemetry import DEFAULT_TPOT_S, DEFAULT_TTFT_S, FINISH_REASONS, LlmsloError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from llmslo.analysis.report import GoodputPolicy
    from llmslo.analysis.rollout import MetricComparison, VersionComparison, VersionOutcome

__all__ = ["compare_command"]


def _policy(ttft: str | None, tpot: str | None, e2e: str | None, success: str, one_token_fails: bool
            ) -> GoodputPolicy:
    from llmslo.analysis.report import GoodputPolicy

    try:
        return GoodputPolicy(
            success=frozenset(s.strip() for s in success.split(",") if s.strip()),
            ttft_s=_threshold("ttft", ttft, DEFAULT_TTFT_S), tpot_s=_threshold("tpot", tpot, DEFAULT_TPOT_S),
            e2e_s=_threshold("e2e", e2e, None), one_token_passes_tpot=not one_token_fails,
        )
    except LlmsloError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None


def _window(update: str | None, start: str | None, end: str | None) -> tuple[float | None, float | None]:
    """The explicit window, after checking that the command line names exactly one window."""
    if update is not None and (start is not None or end is not None):
        raise _fail("choose --update ID or --from T --to T, not both", EXIT_USAGE)
    if update is not None:
        return None, None
    if start is None or end is None:
        raise _fail("give --update ID, or both --from T and --to T (Unix seconds or ISO 8601)", EXIT_USAGE)
    lo, hi = parse_time("from", start), parse_time("to", end)
    if hi <= lo:
        raise _fail(f"--to ({end}) must be after --from ({start})", EXIT_USAGE)
    return lo, hi


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.2f}%"


def _sec(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.3g}ms" if abs(x) < 1 else f"{x:.3g}s"


def _signed(metric: str, x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 100:+.2f}pp" if not metric.endswith("_s") else ("+" if x >= 0 else "-") + _sec(abs(x))


def _outcome_table(outcomes: tuple[VersionOutcome, ...]) -> Table:
    from rich.table import Table

    t = Table(title="Outcomes per version (rates over the outcome population: attempted less drain-ended)",
              title_justify="left")
    cols = ("version", "side", "attempted", "drain-ended", "outcome pop.", "error", "timeout", "rejected",
            "goodput", "goodput (all)", "TTFT p50", "p90", "p99", "e2e p50", "p90", "p99")
    for col in cols:
        t.add_column(col, justify="left" if col in ("version", "side") else "right")
    for o in outcomes:
        d = o.to_dict()
        t.add_row(shown(o.version), o.side, f"{o.attempted:,}", f"{o.drain_ended:,}", f"{o.outcome_population:,}",
                  _pct(d["error_rate"]), _pct(d["timeout_rate"]), _pct(d["rejected_share"]),
                  _pct(d["goodput_fraction"]), _pct(d["goodput_fraction_all"]),
                  _sec(o.ttft.p50_s), _sec(o.ttft.p90_s), _sec(o.ttft.p99_s),
                  _sec(o.e2e.p50_s), _sec(o.e2e.p90_s), _sec(o.e2e.p99_s))
    return t


def _effect(c: MetricComparison) -> str:
    labels = {"cliffs_delta": "delta {:+.3f}", "median_change": "p50 {:+.1%}", "p99_change": "p99 {:+.1%}",
              "risk_ratio": "RR {:.2f}"}
    parts = [labels[key].format(value) for key, value in c.effect.items() if key in labels and value is not None]
    return ", ".join(parts) or "-"


def _value(metric: str, x: float | None) -> str:
    return _sec(x) if metric.endswith("_s") else _pct(x)


def _comparison_table(comparisons: tuple[MetricComparison, ...], alpha: float) -> Table:
    from rich.table import Table

    t = Table(title=f"Comparisons (candidate - reference; 95% CI; Holm-adjusted p, alpha {alpha:g}; latency "
              "values are medians)", title_justify="left")
    for col in ("reference", "candidate", "metric", "n ref / cand", "reference", "candidate", "difference",
                "95% CI", "test", "p", "Holm p", "effect", "result"):
        t.add_column(col, justify="left" if col in ("reference", "candidate", "metric", "test", "result") else "right")
    for c in comparisons:
        if c.skipped:
            t.add_row(shown(c.reference), shown(c.candidate), c.metric, f"{c.n_reference:,} / {c.n_candidate:,}",
                      "-", "-", "-", "-", "-", "-", "-", "-", "not tested: too few")
            continue
        result = ("REGRESSION: " + shown(c.version) if c.finding is not None
                  else ("significant, " + (c.direction or "") if (c.p_adjusted or 1) <= alpha else "no difference"))
        t.add_row(shown(c.reference), shown(c.candidate), c.metric, f"{c.n_reference:,} / {c.n_candidate:,}",
                  _value(c.metric, c.estimate_reference), _value(c.metric, c.estimate_candidate),
                  _signed(c.metric, c.difference),
                  f"[{_signed(c.metric, c.ci_low)}, {_signed(c.metric, c.ci_high)}]", c.test or "-",
                  f"{c.p_value:.2g}" if c.p_value is not None else "-",
                  f"{c.p_adjusted:.2g}" if c.p_adjusted is not None else "-", _effect(c), result)
    return t


def _figure(key: str, value: object) -> str:
    """A process figure as text: ``-`` when unknown, a time in UTC, 4 significant digits for another float,
    JSON for a map."""
    if value is None:
        return "-"
    if key.endswith("_unix_s") and isinstance(value, (int, float)):
        return f"{_utc(value)} UTC"
    if isinstance(value, float):
        return f"{value:.4g}"
    return shown(json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else value)


def _process_table(result: VersionComparison) -> Table:
    from rich.table import Table

    p = result.process
    t = Table(title="Process figures (the update procedure; not part of the verdict)", title_justify="left")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for key, value in (p.update or {}).items():
        t.add_row(f"update record: {key}", _figure(key, value))
    for version, n in p.terminated_by_version.items():
        t.add_row(f"summaries: terminated (server_draining) in window, {shown(version)}", f"{n:,}")
    for version, n in p.drain_rejected_by_version.items():
        t.add_row(f"summaries: rejected (draining) in window, {shown(version)}", f"{n:,}")
    return t


def _render(out: Console, result: VersionComparison) -> None:
    w = result.window
    what = f"update {shown(w.update_id)}: overlap window" if w.update_id else "window"
    out.print(f"{what} {_utc(w.from_unix_s)} to {_utc(w.to_unix_s)} UTC (Unix {w.from_unix_s:.3f} to "
              f"{w.to_unix_s:.3f}, {w.to_unix_s - w.from_unix_s:g}s); baseline: each version outside every "
              f"stored update window ({len(w.excluded_from_baseline)} excluded)", highlight=False)
    out.print(f"policy: {shown(result.policy.rule_text())}", highlight=False)
    out.print(f"tests: two-proportion z (Fisher exact for small counts) for rates, Mann-Whitney U for latency; "
              f"Holm over the family, alpha {result.alpha:g}; at least {result.min_side_count:,} per side; a "
              f"regression needs a difference of at least {result.min_rate_difference * 100:g}pp (rates) or "
              f"{result.min_latency_change * 100:g}% of the median or p99 (latency)", highlight=False)
    out.print(_outcome_table(result.outcomes))
    out.print(f"missing terminal events: {shown(result.to_dict()['missing_terminal_events']['reason'])}",
              highlight=False)
    out.print(_comparison_table(result.comparisons, result.alpha))
    out.print(_process_table(result))
    for note in (*result.process.notes, *result.notes):
        out.print(f"note: {shown(note)}", highlight=False)
    out.print(f"verdict: {result.verdict}", highlight=False)
    for reason in result.reasons:
        out.print(f"  - {shown(reason)}", highlight=False)


DbOption = Annotated[Path, typer.Option("--db", help="DuckDB store file.", show_default=False)]
UpdateOption = Annotated[str | None, typer.Option(
    "--update", help="Compare over this stored update's overlap window (see `llmslo rollout list`).")]
FromOption = Annotated[str | None, typer.Option(
    "--from", help="Window start: Unix seconds or ISO 8601 (UTC without an offset); with --to.")]
ToOption = Annotated[str | None, typer.Option("--to", help="Window end (included), as --from.")]


def compare_command(
    db: DbOption,
    update: UpdateOption = None,
    start: FromOption = None,
    end: ToOption = None,
    ttft: Annotated[str | None, typer.Option(
        "--ttft", help=f"TTFT SLO of the goodput policy, e.g. 2s; 'off' to ignore. (default: {DEFAULT_TTFT_S:g}s)"
    )] = None,
    tpot: Annotated[str | None, typer.Option(
        "--tpot", help=f"TPOT SLO, e.g. 100ms; 'off' to ignore. (default: {DEFAULT_TPOT_S * 1e3:g}ms)")] = None,
    e2e: Annotated[str | None, typer.Option("--e2e", help="End-to-end SLO, e.g. 30s (default: off)")] = None,
    success: Annotated[str, typer.Option(
        "--success", help=f"Finish reasons that can be good (from: {', '.join(FINISH_REASONS)}).")] = "stop,length",
    one_token_fails: Annotated[bool, typer.Option(
        "--one-token-fails", help="Replies of one token fail the TPOT condition (default: they pass).")] = False,
    alpha: Annotated[float, typer.Option(
        "--alpha", help="Familywise false-alarm level of all the tests together (Holm).")] = 0.01,
    min_count: Annotated[int, typer.Option(
        "--min-count", help="Fewest requests (rates) or latency samples per side for a test.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")] = False,
) -> None:
    """Compare the versions serving during an update's overlap window (or --from/--to).

    Per version: error, timeout and rejection rates, goodput under the printed policy, TTFT and e2e
    quantiles, in the window and in its baseline (the same version outside every stored update
    window). Each version is tested against its baseline and the versions against each other
    (two-proportion z or Fisher exact for rates, Mann-Whitney U for latency; Holm over all tests).
    Requests the drain ended (server_draining, rejected: draining) are process figures, printed
    apart and kept out of the outcome rates. Verdict: lossless, regression (version, metric,
    tenant class, size) or insufficient_data, with the reasons.

    Examples: llmslo rollout compare --db s.duckdb --update 2026-11-03-v1-v2-b1
              llmslo rollout compare --db s.duckdb --from 2026-11-03T10:00:00Z --to 2026-11-03T10:20:00Z
    """
    from llmslo.analysis.rollout import compare_versions
    from llmslo.analysis.store import Store

    lo, hi = _window(update, start, end)
    policy = _policy(ttft, tpot, e2e, success, one_token_fails)
    if not 0 < alpha < 1:
        raise _fail(f"--alpha: must be between 0 and 1, got {alpha:g}", EXIT_USAGE)
    if min_count < 2:
        raise _fail(f"--min-count: must be at least 2, got {min_count}", EXIT_USAGE)
    try:
        with Store.open(db, read_only=True) as store:
            result = compare_versions(store.con, update_id=update, from_unix_s=lo, to_unix_s=hi, policy=policy,
                                      alpha=alpha, min_side_count=min_count)
    except LlmsloError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        out: dict[str, Any] = result.to_dict()
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return
    _render(_console(), result)
