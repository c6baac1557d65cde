"""``llmslo drain``: advise a wait budget from the stored request durations, check a drain configuration."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmslo.cli._common import EXIT_INPUT, EXIT_USAGE, parse_time, shown
from llmslo.cli._common import console as _console
from llmslo.cli._common import duration as _duration
from llmslo.cli._common import fail as _fail
from llmslo.telemetry import LlmsloError

if TYPE_CHECKING:
    from llmslo.analysis.rollout import BudgetAdvice, DrainCheck, DurationFit

__all__ = ["drain_app"]

drain_app = typer.Typer(
    name="drain",
    help=(
        "Draining for rolling updates: the wait budget from the stored request durations and the callers' "
        "timeout, and the check of a drain configuration against the rules of the update.\n\n"
        "Start with: llmslo drain advise --db s.duckdb --caller-timeout 300s"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

DbOption = Annotated[Path, typer.Option("--db", help="DuckDB store file.", show_default=False)]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object (for scripts).")]


def _settle(text: str | None) -> float | None:
    """``--settle`` in seconds; ``0`` (or ``0s``) is allowed: no settle wait. A bad value exits 2."""
    if text is None:
        return None
    if text.strip() in ("0", "0s"):
        return 0.0
    return _duration("settle", text)


def _checked_options(quantile: float, batches: int) -> None:
    """Exit 2 naming the option for a quantile outside (0, 1) or fewer than one batch."""
    if not (math.isfinite(quantile) and 0.0 < quantile < 1.0):
        raise _fail(f"--quantile: must be strictly between 0 and 1 (e.g. 0.99), got {quantile:g}", EXIT_USAGE)
    if batches < 1:
        raise _fail(f"--batches: must be a whole number >= 1 (instances drained in series), got {batches}",
                    EXIT_USAGE)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g} s" if value < 10 else f"{value:,.1f} s"


def _fit_line(fit: DurationFit, label: str) -> str:
    quantile = (_seconds(fit.quantile_s) if fit.quantile_s is not None
                else f"unbounded (at least {_seconds(fit.quantile_at_least_s)})")
    return (f"  {fit.kind}: {fit.admitted:,} admitted ({fit.censored:,} cut, censored); {label} {quantile} "
            f"(completed only: {_seconds(fit.completed_only_quantile_s)}); needs {_seconds(fit.budget_s)}; "
            f"termination at the budget {_share(fit.termination_rate)} "
            f"(completed only: {_share(fit.completed_only_termination_rate)})")


def _print_advice(advice: BudgetAdvice) -> None:
    from llmslo.analysis.report import quantile_label

    out = _console()
    label = quantile_label(advice.quantile)
    cap = " (capped by the caller timeout)" if advice.cap_binds else ""
    lines = [
        f"recommended wait_budget_s: {advice.recommended_budget_s:g}{cap}; caller timeout "
        f"{advice.caller_timeout_s:g} s, {label} of the request duration",
        f"budget {advice.budget_s:g} s: expected termination rate {_share(advice.termination_rate)} "
        f"(covers {_share(advice.coverage)}; completed requests only: "
        f"{_share(advice.completed_only_termination_rate)})",
        f"update window: {advice.update_window_s:g} s = {advice.batches} batches x (settle {advice.settle_s:g} s "
        f"+ budget {advice.budget_s:g} s); settle: {advice.settle_source}",
        "durations (e2e_s of admitted requests, Kaplan-Meier: cut requests count as 'at least e2e_s'):",
        _fit_line(advice.overall, label),
        *(_fit_line(f, label) for f in advice.by_kind),
    ]
    if advice.observed:
        lines.append("observed (stored updates, by budget): budget -> terminated / in flight at start")
        lines += [f"  {o.update_id}: {_seconds(o.wait_budget_s)} -> {o.terminated if o.terminated is not None else '-'}"
                  f" / {o.in_flight_at_start if o.in_flight_at_start is not None else '-'} = "
                  f"{_share(o.termination_rate)}" for o in advice.observed]
    else:
        lines.append("observed: no stored update record (llmslo rollout record) to draw the curve from")
    lines += [f"note: {n}" for n in advice.notes]
    for line in lines:
        out.print(shown(line), highlight=False, soft_wrap=True)


@drain_app.command()
def advise(
    db: DbOption,
    caller_timeout: Annotated[str, typer.Option(
        "--caller-timeout", help="The callers' timeout, e.g. 300s, 5m: the budget never exceeds it.",
        show_default=False)],
    quantile: Annotated[float, typer.Option(
        "--quantile", help="Share of the request durations the budget covers, in (0, 1).")] = 0.99,
    batches: Annotated[int, typer.Option("--batches", help="Instances (batches) drained in series.")] = 1,
    settle: Annotated[str | None, typer.Option(
        "--settle", help="Discovery settle per batch, e.g. 5s (default: the latest stored update's "
        "unregister_settle_s, else 5s).", show_default=False)] = None,
    budget: Annotated[str | None, typer.Option(
        "--budget", help="Evaluate this budget (e.g. 120s) instead of the recommended one.",
        show_default=False)] = None,
    start: Annotated[str | None, typer.Option(
        "--from", help="Only requests that arrived (and updates that started) at or after this time: Unix "
        "seconds or ISO 8601 (UTC without an offset).", show_default=False)] = None,
    end: Annotated[str | None, typer.Option(
        "--to", help="Only requests that arrived (and updates that started) before this time, as --from.",
        show_default=False)] = None,
    as_json: JsonOption = False,
) -> None:
    """The wait budget for a drain: the --quantile of the stored request durations, capped by --caller-timeout.

    Prints the expected termination rate of the budget (Kaplan-Meier: requests cut by deadline,
    server_draining or client_cancel count as 'at least their e2e_s'), the update window (batches x
    (settle + budget)), streaming and non-streaming requests apart where the store tells them apart
    (stream_max_queued > 0), and the observed budget against termination rate of the stored updates.
    With --json, one object (BudgetAdvice.to_dict()).
    """
    timeout_s = _duration("caller-timeout", caller_timeout)
    settle_s = _settle(settle)
    budget_s = _duration("budget", budget) if budget is not None else None
    _checked_options(quantile, batches)
    lo = parse_time("from", start) if start is not None else None
    hi = parse_time("to", end) if end is not None else None
    if lo is not None and hi is not None and hi <= lo:
        raise _fail(f"--to ({end}) must be after --from ({start})", EXIT_USAGE)
    from llmslo.analysis.rollout import advise_wait_budget
    from llmslo.analysis.store import Store

    try:
        with Store.open(db, read_only=True) as store:
            advice = advise_wait_budget(store.con, caller_timeout_s=timeout_s, quantile=quantile, batches=batches,
                                        settle_s=settle_s, budget_s=budget_s, from_unix_s=lo, to_unix_s=hi)
    except LlmsloError as exc:
        raise _fail(str(exc), EXIT_INPUT) from None
    if as_json:
        print(json.dumps(advice.to_dict(), indent=2))
    else:
        _print_advice(advice)


def _config(path: Path) -> object:
    """The YAML document of ``path`` (bounded loader of the rules package); a bad file exits 1 naming it."""
    from llmslo.rules import SpecError, load_yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc.strerror or exc}", EXIT_INPUT) from None
    except UnicodeDecodeError:
        raise _fail(f"{path} is not UTF-8 text", EXIT_INPUT) from None
    try:
        return load_yaml(text, str(path))
    except SpecError as exc:
        raise _fail(str(exc), EXIT_INPUT) from None


def _print_checks(path: Path, checks: list[DrainCheck]) -> None:
    out = _console()
    for c in checks:
        line = f"{c.status.upper()} {c.rule}: {c.message}" + (f"; fix: {c.fix}" if c.fix else "")
        out.print(shown(line), highlight=False, soft_wrap=True)
    failed = sum(c.status == "fail" for c in checks)
    verdict = f"{failed} rule(s) violated" if failed else "no rule violated"
    out.print(shown(f"{path}: {verdict}"), highlight=False, soft_wrap=True)


@drain_app.command()
def check(
    config: Annotated[Path, typer.Argument(
        help="Drain configuration (YAML): DrainConfig's keys plus overlap_window_s, batches, "
        "termination_grace_period_s and exit_margin_s.",
        show_default=False)],
    db: Annotated[Path | None, typer.Option(
        "--db", help="Store whose itl_s gaps give the observed p99.9 inter-token gap.", show_default=False)] = None,
    as_json: JsonOption = False,
) -> None:
    """Check a drain configuration against the rules of the update; exit 1 listing every violated rule.

    Rules: wait_budget_s <= caller_timeout_s; idle_threshold_s above the p99.9 of the stored itl_s gaps
    (--db; else normal_gap_s); overlap_window_s >= batches x (unregister_settle_s + wait_budget_s);
    termination_grace_period_s >= unregister_settle_s + wait_budget_s + exit_margin_s (Kubernetes). A rule
    whose input is absent is skipped, saying which. Unknown keys are an error. With --json, one object:
    config, ok, checks (each rule: rule, status, values, message, fix), violations.
    """
    from llmslo.analysis.rollout import RolloutInputError, evaluate_drain_config
    from llmslo.analysis.store import Store

    document = _config(config)
    if not isinstance(document, dict):
        raise _fail(f"{config}: must be a mapping of drain settings (wait_budget_s: 120, ...)", EXIT_INPUT)
    try:
        if db is None:
            checks = evaluate_drain_config(document)
        else:
            with Store.open(db, read_only=True) as store:
                checks = evaluate_drain_config(document, con=store.con)
    except RolloutInputError as exc:  # a key or value of the file: name the file
        raise _fail(f"{config}: {exc}", EXIT_INPUT) from None
    except LlmsloError as exc:  # the store (its message names it)
        raise _fail(str(exc), EXIT_INPUT) from None
    failed = [c for c in checks if c.status == "fail"]
    if as_json:
        print(json.dumps({"config": str(config), "ok": not failed, "checks": [c.to_dict() for c in checks],
                          "violations": [c.rule for c in failed]}, indent=2))
    else:
        _print_checks(config, checks)
    if failed:
        raise typer.Exit(EXIT_INPUT)
