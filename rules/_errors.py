"""Errors of the rule generator."""

from __future__ import annotations

from llmslo.telemetry import ConfigurationError, LlmsloError


class SpecError(ConfigurationError):
    """An SLO spec is invalid; ``path`` names the field (``objectives[1].threshold``)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


class PromtoolError(LlmsloError):
    """promtool is missing, or it rejected a file; the message says which and how to fix it."""
