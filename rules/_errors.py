"""Errors of the rule generator."""

from __future__ import annotations

import reprlib

from llmslo.telemetry import ConfigurationError, LlmsloError

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 4, 4, 60, 60


def short_repr(value: object) -> str:
    """``repr(value)`` cut to a few dozen characters: a huge or deeply nested value would flood a message."""
    return _SHORT.repr(value)


class SpecError(ConfigurationError):
    """An SLO spec is invalid; ``path`` names the field (``objectives[1].threshold``)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


class PromtoolError(LlmsloError):
    """promtool is missing, or it rejected a file; the message says which and how to fix it."""
