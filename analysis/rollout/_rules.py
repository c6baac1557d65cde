"""The rules a drain's numbers must keep, in one place: ``llmslo drain check`` (:mod:`._advice`), the Kubernetes
manifests (``llmslo.ops.DrainPlan``, ``rolling_plan``) and ``llmslo rollout run`` (``RolloutPlan.problems``)
ask these functions, so a rule and its message read the same wherever it is checked.

Every rule here has one shape: a time the drain *needs* (a figure, or a sum of figures) must not exceed a time
*allowed* (``need <= limit``, seconds). :func:`within` writes the verdict: the names and numbers compared and,
when the rule is broken, why it matters and what to change. The rules:

* **budget**: ``wait_budget_s <= caller_timeout_s`` (past the callers' timeout nobody waits for the answer);
* **update window**: ``batches x (unregister_settle_s + wait_budget_s) <= overlap_window_s`` (the previous
  version must outlive a serial update, so that it can end or roll back);
* **grace**: ``unregister_settle_s + wait_budget_s + exit_margin_s <= termination_grace_period_s``
  (Kubernetes ends the pod at its grace period whatever the drain does);
* **overlap**: the overlap of the versions, a sum of parts that depends on how the update runs, ``<=
  max_overlap_window_s``.

Standard library only: ``llmslo.ops`` imports it without the ``analysis`` extra's heavy part.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Part = tuple[str, float]
"""One term of a needed time: its text as shown (the name and value, e.g. ``wait_budget_s 120 s``) and its
seconds."""


@dataclass(frozen=True)
class RuleVerdict:
    """One rule applied to numbers (seconds): ``holds``; ``message`` (the names and numbers compared, and when
    the rule is broken why it matters); ``fix`` (what to change; None when the rule holds)."""

    holds: bool
    message: str
    fix: str | None = None


def part(name: str, seconds: float) -> Part:
    """The term ``name`` of ``seconds`` seconds, shown as ``name 120 s``."""
    return f"{name} {seconds:g} s", seconds


def within(need: Sequence[Part], limit_name: str, limit_s: float, *, why: str, fix: str) -> RuleVerdict:
    """The shared shape of the rules: the sum of ``need`` (seconds) must not exceed ``limit_s`` (seconds).

    The message shows each term and, with more than one, their sum: ``a 5 s + b 120 s = 125 s <= limit 300 s``
    when the rule holds, ``... exceeds limit 100 s: WHY`` when it does not (then ``fix`` is returned with it).
    """
    needed = math.fsum(seconds for _, seconds in need)
    text = " + ".join(shown for shown, _ in need) + (f" = {needed:g} s" if len(need) > 1 else "")
    limit = f"{limit_name} {limit_s:g} s"
    if needed <= limit_s:
        return RuleVerdict(True, f"{text} <= {limit}")
    return RuleVerdict(False, f"{text} exceeds {limit}: {why}", fix)


def budget_verdict(wait_budget_s: float, caller_timeout_s: float, *, prefix: str = "") -> RuleVerdict:
    """The budget rule: the drain's wait budget (seconds) must not exceed the callers' timeout (seconds).

    ``prefix`` goes before each field name, as the caller's input spells it (``drain.`` in a rollout plan).

    Example::

        budget_verdict(400, 300).message
        # 'wait_budget_s 400 s exceeds caller_timeout_s 300 s: the callers give up before the drain does'
    """
    return within([part(f"{prefix}wait_budget_s", wait_budget_s)], f"{prefix}caller_timeout_s", caller_timeout_s,
                  why="the callers give up before the drain does",
                  fix=f"lower {prefix}wait_budget_s to at most {caller_timeout_s:g}")


def update_window_verdict(batches: int, unregister_settle_s: float, wait_budget_s: float,
                          overlap_window_s: float) -> RuleVerdict:
    """The update-window rule: ``batches`` drained in series, each settling ``unregister_settle_s`` then waiting
    up to ``wait_budget_s``, must end within ``overlap_window_s``, how long the previous version is kept
    (seconds)."""
    window = batches * (unregister_settle_s + wait_budget_s)
    shown = (f"update window {window:g} s = {batches} batches x (unregister_settle_s {unregister_settle_s:g} s + "
             f"wait_budget_s {wait_budget_s:g} s)")
    return within([(shown, window)], "overlap_window_s", overlap_window_s,
                  why="the previous version would be gone before the update can end or roll back",
                  fix=f"raise overlap_window_s to at least {window:g}, or lower wait_budget_s or batches")


def grace_verdict(unregister_settle_s: float, wait_budget_s: float, exit_margin_s: float,
                  termination_grace_period_s: float) -> RuleVerdict:
    """The grace rule: the settle, the budget and the processes' exit (seconds) must fit in Kubernetes'
    ``terminationGracePeriodSeconds`` (seconds)."""
    need = [part("unregister_settle_s", unregister_settle_s), part("wait_budget_s", wait_budget_s),
            part("exit_margin_s", exit_margin_s)]
    total = math.fsum(seconds for _, seconds in need)
    return within(need, "termination_grace_period_s", termination_grace_period_s,
                  why="Kubernetes kills the pod before its drain and exit end",
                  fix=f"raise termination_grace_period_s to at least {math.ceil(total):g}, or lower wait_budget_s")


def overlap_verdict(need: Sequence[Part], max_overlap_window_s: float, *, fix: str,
                    limit_name: str = "max_overlap_window_s") -> RuleVerdict:
    """The overlap rule: the longest both versions serve, the sum of ``need`` (seconds; its parts depend on how
    the update runs), must not exceed ``max_overlap_window_s`` (seconds). ``fix`` says what to change, in the
    caller's terms (its flags or fields)."""
    return within(need, limit_name, max_overlap_window_s,
                  why="the versions could overlap longer than allowed", fix=fix)
